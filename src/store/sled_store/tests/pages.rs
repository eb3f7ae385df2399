//! The pages of paginated IDs: written, read back and reopened; a page written again; a
//! directory without a pages log; the pages log's torn tail, damage and replay.

use super::*;
use crate::handler::paginate::NextRequest;
use pages_log::{NewPage, HEADS_FILE, LOG_FILE};
use results_log::Durable;
use std::os::unix::fs::FileExt;

/// Page `page` of the ID at `row` (in bucket `row`) in `generation`: three items naming it
/// and `tag`, with a next request unless `last`.
fn page(row: u64, generation: u32, page: u32, tag: &str, last: bool) -> PageRecord {
    let items: Vec<_> = (0..3)
        .map(|i| serde_json::json!({"row": row, "g": generation, "p": page, "i": i, "t": tag}))
        .collect();
    PageRecord {
        row,
        bucket: row,
        generation,
        mark: PageMark {
            page,
            count: 3,
            items_before: u64::from(page) * 3,
            next: (!last).then(|| NextRequest::Url(format!("https://api/x?after={page}"))),
            attempts: page + 1,
            usage: Some(crate::meter::Usage {
                input: 10,
                output: u64::from(page),
            }),
            first_attempt_ms: Some(1_765_000_000_000),
        },
        items: serde_json::value::to_raw_value(&items).unwrap(),
    }
}

/// `pages`, as what can be compared.
fn seen(pages: &[PageRecord]) -> Vec<(u64, u64, u32, PageMark, String)> {
    pages
        .iter()
        .map(|p| {
            let items = p.items.get().to_string();
            (p.row, p.bucket, p.generation, p.mark.clone(), items)
        })
        .collect()
}

fn with_id(id: &str, pages: impl IntoIterator<Item = PageRecord>) -> Vec<(String, PageRecord)> {
    pages.into_iter().map(|p| (id.to_string(), p)).collect()
}

fn is_corrupt(e: &StoreError) -> bool {
    matches!(e.root(), StoreError::Corrupt { .. })
}

/// What [`pages_round_trip_through_a_reopen`] wrote, read back.
async fn read_back(s: &SledStore, id0: &[PageRecord], id2: &[PageRecord]) {
    let got = s.pages(0, "id0", 0, 0, 5).await.unwrap();
    assert_eq!(seen(&got), seen(id0));
    let got = s.pages(0, "id0", 0, 3, 2).await.unwrap();
    assert_eq!(seen(&got), seen(&id0[3..]));
    assert_eq!(
        seen(&s.pages(2, "id2", 0, 0, 2).await.unwrap()),
        seen(&id2[..2])
    );
    assert_eq!(
        seen(&s.pages(2, "id2", 1, 0, 2).await.unwrap()),
        seen(&id2[2..])
    );
    let ids = [(0, "id0"), (1, "id1"), (2, "id2")];
    let marks = s.page_marks(0, &ids).await.unwrap();
    let want = [&id0[4], &page(1, 0, 0, "a", true), &id2[1]];
    assert_eq!(marks, want.map(|p| Some(p.mark.clone())).to_vec());
    let marks = s.page_marks(1, &ids).await.unwrap();
    assert_eq!(marks, vec![None, None, Some(id2[3].mark.clone())]);
    assert_eq!(s.page_marks(2, &ids).await.unwrap(), vec![None, None, None]);
}

#[tokio::test]
async fn pages_round_trip_through_a_reopen() {
    let (dir, s) = store_of_one_row_buckets(3).await;
    let id0: Vec<_> = (0..5).map(|p| page(0, 0, p, "a", p == 4)).collect();
    // id0's pages in two appends, id1's between them, id2's in two generations.
    s.record_pages(&with_id("id0", id0[..2].iter().cloned()))
        .await
        .unwrap();
    s.record_pages(&with_id("id1", [page(1, 0, 0, "a", true)]))
        .await
        .unwrap();
    s.record_pages(&with_id("id0", id0[2..].iter().cloned()))
        .await
        .unwrap();
    let id2 = [
        page(2, 0, 0, "a", false),
        page(2, 0, 1, "a", true),
        page(2, 1, 0, "b", false),
        page(2, 1, 1, "b", true),
    ];
    s.record_pages(&with_id("id2", id2.iter().cloned()))
        .await
        .unwrap();
    read_back(&s, &id0, &id2).await;
    s.sync().await.unwrap();
    drop(s);
    let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    read_back(&s, &id0, &id2).await;

    // Asked for with another ID, a row's pages are damage, not someone else's.
    let err = s.pages(0, "id1", 0, 0, 1).await.unwrap_err();
    assert!(
        is_corrupt(&err) && err.to_string().contains("check"),
        "{err}"
    );

    // A page written again replaces itself, and the pages after it in its generation leave
    // the chain: they followed from the earlier answer.
    let again = page(0, 0, 2, "again", false);
    s.record_pages(&with_id("id0", [again.clone()]))
        .await
        .unwrap();
    let got = s.pages(0, "id0", 0, 0, 3).await.unwrap();
    assert_eq!(seen(&got[2..]), seen(std::slice::from_ref(&again)));
    assert_eq!(seen(&got[..2]), seen(&id0[..2]));
    let marks = s.page_marks(0, &[(0, "id0")]).await.unwrap();
    assert_eq!(marks, vec![Some(again.mark.clone())]);
    assert!(is_corrupt(&s.pages(0, "id0", 0, 0, 4).await.unwrap_err()));

    // The first page of a generation written again keeps the generations before it.
    s.record_pages(&with_id("id2", [page(2, 1, 0, "c", true)]))
        .await
        .unwrap();
    assert_eq!(
        seen(&s.pages(2, "id2", 0, 0, 2).await.unwrap()),
        seen(&id2[..2])
    );
    assert_eq!(
        s.page_marks(1, &[(2, "id2")]).await.unwrap(),
        vec![Some(page(2, 1, 0, "c", true).mark)]
    );

    // A page of an older generation than the row's last is refused, and nothing is written.
    let err = s
        .record_pages(&with_id("id2", [page(2, 0, 2, "late", true)]))
        .await
        .unwrap_err();
    assert!(matches!(err.root(), StoreError::Backend { .. }), "{err}");
    assert!(is_corrupt(&s.pages(2, "id2", 0, 2, 1).await.unwrap_err()));
}

#[tokio::test]
async fn a_directory_without_pages_opens_and_creates_them_with_the_first_page() {
    let (dir, s) = store_of_one_row_buckets(2).await;
    s.record(&[("id0".into(), done(0, 0, true))]).await.unwrap();
    s.sync().await.unwrap();
    drop(s);
    let log = dir.path().join(LOG_FILE);
    assert!(!log.exists() && !dir.path().join(HEADS_FILE).exists());
    let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    assert!(s.keeps_pages());
    let marks = s.page_marks(0, &[(0, "id0"), (1, "id1")]).await.unwrap();
    assert_eq!(marks, vec![None, None]);
    let err = s.pages(1, "id1", 0, 0, 1).await.unwrap_err();
    assert!(is_corrupt(&err), "{err}");
    assert!(s.pages(1, "id1", 0, 0, 0).await.unwrap().is_empty());
    assert!(!log.exists(), "reading creates nothing");
    s.record_pages(&with_id("id1", [page(1, 0, 0, "a", true)]))
        .await
        .unwrap();
    assert!(log.exists() && dir.path().join(HEADS_FILE).exists());
    let mut record = done(1, 1, true);
    (record.body, record.pages) = (None, Some(1));
    s.record(&[("id1".into(), record)]).await.unwrap();
    s.sync().await.unwrap();
    drop(s);
    let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    assert_eq!(s.pages(1, "id1", 0, 0, 1).await.unwrap().len(), 1);
    assert_eq!(s.item("id1").await.unwrap().unwrap().pages, Some(1));
    drop(s);
    // A pages log the store recorded as durable, gone: damage.
    fs::remove_file(&log).unwrap();
    let err = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES)
        .err()
        .unwrap();
    assert!(
        is_corrupt(&err) && err.to_string().contains("missing"),
        "{err}"
    );
}

#[tokio::test]
async fn a_record_that_counts_pages_makes_them_durable_first() {
    let (dir, s) = store_of_one_row_buckets(1).await;
    s.record_pages(&with_id("id0", [page(0, 0, 0, "a", true)]))
        .await
        .unwrap();
    let log = s.pages.get().unwrap();
    let len = log.len();
    assert!(log.synced_len() < len);
    // A record without pages leaves the pages log as it is.
    s.record(&[("id0".into(), done(0, 0, false))])
        .await
        .unwrap();
    assert!(log.synced_len() < len);
    let mut record = done(0, 0, true);
    (record.body, record.pages) = (None, Some(1));
    s.record(&[("id0".into(), record)]).await.unwrap();
    assert_eq!(
        log.synced_len(),
        len,
        "durable before the record was appended"
    );
    drop((log, s, dir));
}

/// Append pages `pages` of each row of `rows` (IDs `id{row}`, generation 0) to `log`, their
/// bytes naming them.
fn append(log: &PagesLog, rows: std::ops::Range<u64>, pages: std::ops::Range<u32>) {
    let ids: Vec<(u64, u32, String, Vec<u8>)> = rows
        .flat_map(|row| pages.clone().map(move |p| (row, p)))
        .map(|(row, p)| {
            (
                row,
                p,
                format!("id{row}"),
                format!("r{row}p{p}").into_bytes(),
            )
        })
        .collect();
    let new: Vec<NewPage<'_>> = ids
        .iter()
        .map(|(row, page, id, bytes)| NewPage {
            row: *row,
            id,
            generation: 0,
            page: *page,
            bytes,
        })
        .collect();
    log.append(&new).unwrap();
}

/// Each row of `rows` has pages `pages`, read back with their bytes.
fn check(log: &PagesLog, rows: std::ops::Range<u64>, pages: std::ops::Range<u32>) {
    for row in rows {
        let count = pages.end - pages.start;
        let got = log
            .pages(row, &format!("id{row}"), 0, pages.start, count)
            .unwrap_or_else(|e| panic!("row {row}: {e}"));
        let want: Vec<Vec<u8>> = pages
            .clone()
            .map(|p| format!("r{row}p{p}").into_bytes())
            .collect();
        assert_eq!(got, want, "row {row}");
    }
}

fn open(dir: &Path, durable: Durable) -> Result<PagesLog, results_log::LogError> {
    PagesLog::open(dir, durable, false).map(|log| log.expect("a pages log"))
}

#[test]
fn a_torn_tail_is_cut_and_damage_before_the_durable_mark_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = PagesLog::open(dir.path(), Durable::default(), true)
        .unwrap()
        .unwrap();
    append(&log, 0..10, 0..2);
    let durable = log.sync(true).unwrap();
    assert_eq!(durable.covers, durable.synced);
    // Written after the last sync: in the page cache, as after a kill -9.
    append(&log, 10..20, 0..3);
    let len = log.len();
    drop(log);
    // A torn entry at the end: half a header and payload.
    let path = dir.path().join(LOG_FILE);
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[9, 0, 0, 0xc0, 1, 2, 3], len).unwrap();
    let log = open(dir.path(), durable).unwrap();
    assert_eq!(log.len(), len, "the torn tail is cut off");
    assert_eq!(fs::metadata(&path).unwrap().len(), len);
    check(&log, 0..10, 0..2);
    check(&log, 10..20, 0..3);
    drop(log);
    // A whole group past the durable mark that fails its checksum goes with the tail.
    f.write_all_at(b"#", len - 1).unwrap();
    let log = open(dir.path(), durable).unwrap();
    assert_eq!(log.len(), durable.synced, "the damaged group was cut");
    check(&log, 0..10, 0..2);
    let err = log.pages(15, "id15", 0, 0, 1).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    drop(log);
    // Inside the durable part the same damage is an error, on a read and on a replay.
    f.write_all_at(b"#", durable.synced - 1).unwrap();
    let log = open(dir.path(), durable).unwrap();
    let err = log.pages(9, "id9", 0, 0, 2).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    drop(log);
    let replay_all = Durable {
        covers: 0,
        ..durable
    };
    let err = open(dir.path(), replay_all).err().unwrap();
    assert!(err.to_string().contains("damaged"), "{err}");
    // A log shorter than what was durable is refused.
    f.set_len(durable.synced - 1).unwrap();
    let err = open(dir.path(), durable).err().unwrap();
    assert!(err.to_string().contains("durable"), "{err}");
}

#[test]
fn heads_not_durable_are_rebuilt_by_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let log = PagesLog::open(dir.path(), Durable::default(), true)
        .unwrap()
        .unwrap();
    append(&log, 0..5, 0..2);
    let first = log.sync(false).unwrap();
    // covers moves at most every second: this sync leaves it behind.
    append(&log, 5..10, 0..2);
    let second = log.sync(false).unwrap();
    assert_eq!(second.covers, first.covers);
    // Appended and never synced (a crash without a sync): their heads only in memory.
    append(&log, 10..12, 0..2);
    append(&log, 3..4, 2..4);
    drop(log);
    // The heads written after `covers` never became durable: lost in the crash.
    let heads = fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(HEADS_FILE))
        .unwrap();
    heads.set_len(5 * 8).unwrap();
    let log = open(dir.path(), second).unwrap();
    check(&log, 0..3, 0..2);
    check(&log, 3..4, 0..4);
    check(&log, 4..12, 0..2);
}

#[test]
fn a_head_pointing_at_another_rows_page_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let log = PagesLog::open(dir.path(), Durable::default(), true)
        .unwrap()
        .unwrap();
    append(&log, 0..4, 0..1);
    log.sync(true).unwrap();
    let heads = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join(HEADS_FILE))
        .unwrap();
    let mut head = [0; 8];
    heads.read_exact_at(&mut head, 8).unwrap();
    heads.write_all_at(&head, 3 * 8).unwrap();
    let err = log.pages(3, "id3", 0, 0, 1).unwrap_err();
    assert!(err.to_string().contains("holds row 1"), "{err}");
    check(&log, 0..3, 0..1);
}

/// Bytes `pages.log` holds beyond the items and next requests of `pages` pages written
/// `per_write` at a time by IDs `id0..` of `ids` rows, each page's items `[1]` (kept raw).
async fn overhead(ids: u64, pages: u32, per_write: usize) -> f64 {
    let (dir, s) = store_of_one_row_buckets(ids).await;
    let mut written = Vec::new();
    for p in 0..pages {
        for row in 0..ids {
            let next = NextRequest::Query(vec![("page".into(), (p + 1).to_string())]);
            let mut page = page(row, 0, p, "", false);
            page.mark.next = Some(next);
            page.mark.usage = None;
            page.items = serde_json::value::to_raw_value(&[1]).unwrap();
            written.push((format!("id{row}"), page));
        }
    }
    for chunk in written.chunks(per_write) {
        s.record_pages(chunk).await.unwrap();
    }
    s.sync().await.unwrap();
    let payload: usize = written
        .iter()
        .map(|(_, p)| p.items.get().len() + serde_json::to_vec(&p.mark.next).unwrap().len())
        .sum();
    let len = fs::metadata(dir.path().join(LOG_FILE)).unwrap().len();
    (len as f64 - payload as f64) / written.len() as f64
}

#[tokio::test]
async fn a_page_costs_about_25_bytes_beyond_its_items_and_next_request() {
    // 100 IDs' pages written together (a group of many pages), and one ID's pages written
    // one at a time (a group each: its 8-byte header).
    let together = overhead(100, 10, 100).await;
    let alone = overhead(1, 200, 1).await;
    eprintln!("bytes a page costs beyond its items and next request: {together:.1} written together, {alone:.1} alone");
    assert!(together < 28.0, "{together}");
    assert!(alone < 36.0, "{alone}");
}
