//! Pages of paginated IDs through a power cut ([`LazyFs`]): the sled store in a state
//! directory on the lazy file system, cut and opened again. Pages synced survive, those not
//! synced are lost whole; a record that counts pages finds them after a cut even when the
//! results log holding it was made durable by something other than a sync (its own sync when
//! many positions wait, the kernel's write-back: here, an fdatasync of the file from outside);
//! and the whole conformance suite holds when its crash is a power cut.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use highwater::conformance::{run_all, Backend};
use highwater::handler::paginate::NextRequest;
use highwater::input::{Cursor, Fingerprint};
use highwater::store::sled_store::{OpenMode, DEFAULT_CACHE_BYTES};
use highwater::store::{
    ItemRecord, ItemStatus, OffsetRecord, PageMark, PageRecord, PlannedBucket, PlannerState,
    SledStore, Store, StoreError,
};

use crate::lazyfs::LazyFs;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn open(state: &Path, mode: OpenMode) -> SledStore {
    SledStore::open(state, mode, DEFAULT_CACHE_BYTES).unwrap()
}

/// The power cut: everything not synced is dropped, the store closed (what its close
/// writes and syncs is thrown away), and the state directory opened again.
fn cut(fs: &mut LazyFs, store: SledStore, state: &Path) -> SledStore {
    fs.cut();
    drop(store);
    fs.remount();
    open(state, OpenMode::Existing)
}

/// One bucket holding `ids` at rows 0, 1, ...
fn bucket(ids: &[&str]) -> PlannedBucket {
    let n = ids.len() as u64;
    let at = |row: u64| Cursor {
        byte: row * 2,
        line: row + 1,
        row,
    };
    PlannedBucket {
        offset: OffsetRecord {
            bucket: 0,
            start: at(0),
            end: at(n),
            items: n,
            duplicates: 0,
            bad_lines: 0,
            input: Fingerprint {
                len: n * 2,
                xxh3: 7,
            },
            planned_at_ms: 0,
        },
        items: ids
            .iter()
            .enumerate()
            .map(|(r, id)| (r as u64, id.to_string()))
            .collect(),
        values: Vec::new(),
        bad_lines: Vec::new(),
    }
}

/// Page `page` of the ID at `row`, two items, a next request unless `last`.
fn page(row: u64, page: u32, last: bool) -> PageRecord {
    let items = serde_json::json!([{"row": row, "page": page, "i": 0}, {"i": 1}]);
    PageRecord {
        row,
        bucket: 0,
        generation: 0,
        mark: PageMark {
            page,
            count: 2,
            items_before: u64::from(page) * 2,
            next: (!last).then(|| NextRequest::Query(vec![("page".into(), page.to_string())])),
            attempts: page + 1,
            usage: None,
            first_attempt_ms: None,
        },
        items: serde_json::value::to_raw_value(&items).unwrap(),
    }
}

fn pages_of(id: &str, row: u64, pages: std::ops::Range<u32>) -> Vec<(String, PageRecord)> {
    let last = pages.end - 1;
    pages
        .map(|p| (id.to_string(), page(row, p, p == last)))
        .collect()
}

/// The final record of a paginated ID: its result is its `pages` pages.
fn paged_record(row: u64, pages: u32) -> ItemRecord {
    let mut r = ItemRecord::pending(row, 0);
    r.status = ItemStatus::Ok;
    r.attempts = pages;
    r.pages = Some(pages);
    r
}

fn is_corrupt(e: &StoreError) -> bool {
    matches!(e.root(), StoreError::Corrupt { .. })
}

#[test]
fn a_record_that_counts_pages_finds_them_after_a_cut_whatever_made_it_durable() {
    let rt = runtime();
    let mut fs = LazyFs::mount();
    let state = fs.path().join("state");
    let s = open(&state, OpenMode::CreateIfMissing);
    rt.block_on(async {
        s.plan(&[bucket(&["a", "b"])], &PlannerState::default())
            .await
            .unwrap();
        s.sync().await.unwrap();
        s.record_pages(&pages_of("a", 0, 0..3)).await.unwrap();
        s.record(&[("a".into(), paged_record(0, 3))]).await.unwrap();
    });
    // No sync of the store: the results log is made durable from outside, as the kernel's
    // write-back or the log's own sync could.
    std::fs::File::open(state.join("results.log"))
        .unwrap()
        .sync_data()
        .unwrap();
    let s = cut(&mut fs, s, &state);
    rt.block_on(async {
        let a = s
            .item("a")
            .await
            .unwrap()
            .expect("a's record was made durable");
        assert_eq!(a.pages, Some(3));
        let pages = s.pages(0, "a", 0, 0, 3).await.unwrap();
        let numbers: Vec<u32> = pages.iter().map(|p| p.mark.page).collect();
        assert_eq!(
            numbers,
            [0, 1, 2],
            "the pages the record counts are all there"
        );
    });
}

#[test]
fn pages_synced_survive_a_cut_and_later_ones_are_lost_whole() {
    let rt = runtime();
    let mut fs = LazyFs::mount();
    let state = fs.path().join("state");
    let s = open(&state, OpenMode::CreateIfMissing);
    rt.block_on(async {
        s.plan(&[bucket(&["a", "b"])], &PlannerState::default())
            .await
            .unwrap();
        s.sync().await.unwrap();
    });
    assert!(
        !state.join("pages.log").exists(),
        "no pages log before the first page"
    );
    let dir_synced = fs.syncs().of("state").fsyncdir;
    rt.block_on(async {
        s.record_pages(&pages_of("b", 1, 0..2)).await.unwrap();
        s.sync().await.unwrap();
        s.record_pages(&pages_of("b", 1, 2..4)).await.unwrap();
        s.record_pages(&pages_of("a", 0, 0..1)).await.unwrap();
    });
    let syncs = fs.syncs();
    let of = |file: &str| syncs.of(Path::new("state").join(file));
    assert!(of("pages.log").fdatasync > 0, "{syncs:?}");
    assert!(
        of("page_heads").fsync + of("page_heads").fdatasync > 0,
        "{syncs:?}"
    );
    assert!(
        syncs.of("state").fsyncdir > dir_synced,
        "the new files' directory is synced: {syncs:?}"
    );
    let s = cut(&mut fs, s, &state);
    rt.block_on(async {
        let marks = s.page_marks(0, &[(0, "a"), (1, "b")]).await.unwrap();
        assert_eq!(marks[0], None, "a's page was never synced");
        assert_eq!(marks[1].as_ref().map(|m| m.page), Some(1));
        assert_eq!(s.pages(1, "b", 0, 0, 2).await.unwrap().len(), 2);
        assert!(is_corrupt(&s.pages(1, "b", 0, 0, 3).await.unwrap_err()));
        // The ID goes on from where its pages stand.
        s.record_pages(&pages_of("b", 1, 2..3)).await.unwrap();
        s.sync().await.unwrap();
    });
    let s = cut(&mut fs, s, &state);
    rt.block_on(async {
        assert_eq!(s.pages(1, "b", 0, 0, 3).await.unwrap().len(), 3);
    });
}

/// The sled store on a [`LazyFs`]: each store a new state directory on one mount, a crash a
/// power cut.
struct LazyFsBackend {
    fs: LazyFs,
    stores: usize,
}

impl LazyFsBackend {
    fn path(&self) -> PathBuf {
        self.fs.path().join(format!("state-{}", self.stores))
    }

    fn open(&self) -> Result<Arc<SledStore>, StoreError> {
        SledStore::open(&self.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).map(Arc::new)
    }
}

impl Backend for LazyFsBackend {
    type S = SledStore;

    fn create(&mut self) -> Arc<SledStore> {
        self.stores += 1;
        Arc::new(open(&self.path(), OpenMode::CreateIfMissing))
    }

    fn crash(&mut self, store: Arc<SledStore>) -> Arc<SledStore> {
        self.fs.cut();
        drop(Arc::into_inner(store).expect("the only reference"));
        self.fs.remount();
        self.open().unwrap()
    }

    /// Cut the results log to half its length (closed as usual first: synced).
    fn damage_result(
        &mut self,
        store: Arc<SledStore>,
        _id: &str,
    ) -> Result<Arc<SledStore>, StoreError> {
        drop(Arc::into_inner(store).expect("the only reference"));
        let log = self.path().join("results.log");
        let file = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        let len = file.metadata().unwrap().len();
        file.set_len(len / 2).unwrap();
        file.sync_all().unwrap();
        self.open()
    }
}

#[test]
fn the_conformance_suite_holds_when_a_crash_is_a_power_cut() {
    let mut backend = LazyFsBackend {
        fs: LazyFs::mount(),
        stores: 0,
    };
    runtime().block_on(run_all(&mut backend)).unwrap();
}
