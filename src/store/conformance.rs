//! The conformance suite: what every backend must do, asserted once.
//!
//! [`run_all`] takes a [`Backend`] (a factory that creates a store, "crashes" it and opens it
//! again, and damages it) and checks the contract written on [`super::backend`]: plans are
//! durable once synced (the offset record is there before any item is dispatched), results
//! replace by ID and a replay finds only pending IDs, commits are final and fenced by their
//! lease, reruns move the job's counts once, a grown input plans on without calling old IDs
//! again, damage is refused and never read as less data, and the real engine over the
//! backend runs, stops, resumes and ends with every ID exactly once, every write and sync
//! it made logged by [`Audit`], which checks the engine's invariants 1 (an offset record is
//! durable before its items are called) and 2 (a commit only after its results are durable). The sled backend and
//! [`super::mem::MemStore`] run it in `cargo test`; a new backend adds one test that calls
//! [`run_all`] with its factory.

use std::collections::HashMap;
use std::sync::Arc;

use super::mem::MemStore;
use super::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};
use super::*;
use crate::input::{Cursor, Fingerprint};

/// A backend under test.
pub(crate) trait Backend {
    type S: Store + Leases;
    /// A new, empty store.
    fn create(&mut self) -> Arc<Self::S>;
    /// Close `store` (the caller holds its only reference) as abruptly as the backend can be
    /// closed in a test, and open it again: everything synced must be there.
    fn crash(&mut self, store: Arc<Self::S>) -> Arc<Self::S>;
    /// Damage the durable result of `id` in `store` (closed) and open it again: the error the
    /// open gave, or the store.
    fn damage_result(&mut self, store: Arc<Self::S>, id: &str) -> Result<Arc<Self::S>, StoreError>;
}

/// Run every check against `backend`.
pub(crate) async fn run_all<B: Backend>(backend: &mut B) {
    plans_are_durable_once_synced(backend).await;
    results_replace_by_id_and_a_replay_finds_only_pending_ids(backend).await;
    commits_are_final_and_fenced_by_their_lease(backend).await;
    a_rerun_moves_the_job_counts_once(backend).await;
    a_grown_input_plans_on_and_old_ids_stay_duplicates(backend).await;
    damage_is_refused_never_read_as_less(backend).await;
    the_engine_stops_and_resumes_every_id_exactly_once(backend).await;
}

fn cursor(row: u64) -> Cursor {
    Cursor {
        row,
        line: row + 1,
        byte: row * 3,
    }
}

/// Bucket `bucket` holding `ids` at consecutive rows from `first_row`.
fn planned(bucket: u64, first_row: u64, ids: &[&str]) -> PlannedBucket {
    let end = first_row + ids.len() as u64;
    PlannedBucket {
        offset: OffsetRecord {
            bucket,
            start: cursor(first_row),
            end: cursor(end),
            items: ids.len() as u64,
            duplicates: 0,
            bad_lines: 0,
            input: Fingerprint { len: 99, xxh3: 7 },
            planned_at_ms: 1,
        },
        items: ids
            .iter()
            .enumerate()
            .map(|(i, id)| (first_row + i as u64, id.to_string()))
            .collect(),
        bad_lines: vec![],
    }
}

fn planner_at(next_bucket: u64, row: u64, exhausted: bool) -> PlannerState {
    PlannerState {
        next_bucket,
        cursor: cursor(row),
        exhausted,
    }
}

fn result(row: u64, bucket: u64, ok: bool) -> ItemRecord {
    let mut r = ItemRecord::pending(row, bucket);
    r.attempts = 1;
    if ok {
        r.status = ItemStatus::Ok;
        r.body = Some(serde_json::value::to_raw_value(&row).unwrap());
    } else {
        r.status = ItemStatus::Failed;
        r.error = Some("HTTP 404".into());
    }
    r
}

fn commit_of(bucket: u64, records: &[&ItemRecord]) -> CommitRecord {
    let mut tally = Tally::default();
    for r in records {
        tally.add(r);
    }
    CommitRecord::new(bucket, tally)
}

async fn lease<S: Leases>(store: &S) -> Lease {
    store
        .acquire(LeaseScope::Job)
        .await
        .unwrap()
        .expect("a lease on a job nobody works on")
}

async fn finals<S: Store>(store: &S) -> Result<Vec<(String, ItemStatus)>, ExportError> {
    let mut out = Vec::new();
    store
        .for_each_final(&mut |id, r| {
            out.push((id.to_string(), r.status));
            Ok(())
        })
        .await?;
    Ok(out)
}

async fn plans_are_durable_once_synced<B: Backend>(b: &mut B) {
    let s = b.create();
    assert!(s.job().await.unwrap().is_none());
    let job = StoredJob {
        id: "j1".into(),
        version: 3,
        spec: b"opaque \x00 bytes".to_vec(),
    };
    s.put_job(&job).await.unwrap();
    let rows = [(0, "a"), (1, "b"), (2, "a"), (3, "c")];
    assert_eq!(
        s.first_rows(&rows).await.unwrap(),
        vec![None, None, Some(0), None],
        "a repeat within the batch is judged too"
    );
    let plan = [planned(0, 0, &["a", "b"]), planned(1, 3, &["c"])];
    s.plan(&plan, &planner_at(2, 4, false)).await.unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    assert_eq!(
        s.job().await.unwrap(),
        Some(job),
        "the job is kept as it was given"
    );
    assert_eq!(s.planner().await.unwrap(), planner_at(2, 4, false));
    let buckets = s.buckets(0, 10).await.unwrap();
    let offsets: Vec<_> = buckets.iter().map(|b| b.offset.clone()).collect();
    assert_eq!(
        offsets,
        vec![plan[0].offset.clone(), plan[1].offset.clone()]
    );
    assert!(buckets.iter().all(|b| b.commit.is_none()));
    assert_eq!(
        s.buckets(1, 10).await.unwrap().len(),
        1,
        "a page from bucket 1"
    );
    assert_eq!(s.buckets(0, 1).await.unwrap().len(), 1, "at most `limit`");
    let items = s.bucket_items(&plan[0].offset).await.unwrap();
    assert_eq!(
        items
            .iter()
            .map(|(id, r)| (id.as_str(), r.row, r.status))
            .collect::<Vec<_>>(),
        vec![("a", 0, ItemStatus::Pending), ("b", 1, ItemStatus::Pending)]
    );
    // Planned IDs are noted with their first rows: read again later, they are repeats; the
    // same row read again (planning again after a crash) is not.
    assert_eq!(
        s.first_rows(&[(9, "b"), (3, "c"), (10, "new")])
            .await
            .unwrap(),
        vec![Some(1), None, None]
    );
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (
            stats.buckets_planned,
            stats.ids_planned,
            stats.pending,
            stats.rows_read
        ),
        (2, 3, 3, 4)
    );
    assert!(!stats.finished());
}

async fn results_replace_by_id_and_a_replay_finds_only_pending_ids<B: Backend>(b: &mut B) {
    let s = b.create();
    let plan = [planned(0, 0, &["a", "b"]), planned(1, 2, &["c", "d"])];
    s.plan(&plan, &planner_at(2, 4, true)).await.unwrap();
    s.sync().await.unwrap();
    // Results are written under a lease (a fleet's backend drops the others).
    let _lease = lease(&*s).await;
    s.record(&[("a".into(), result(0, 0, false))])
        .await
        .unwrap();
    // The same ID again: its record is replaced, never added.
    s.record(&[
        ("a".into(), result(0, 0, true)),
        ("c".into(), result(2, 1, true)),
    ])
    .await
    .unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    let open: Vec<u64> = s
        .open_buckets()
        .await
        .unwrap()
        .iter()
        .map(|o| o.bucket)
        .collect();
    assert_eq!(open, vec![0, 1], "nothing is committed");
    let pending: Vec<String> = {
        let mut out = Vec::new();
        for o in s.open_buckets().await.unwrap() {
            for (id, r) in s.bucket_items(&o).await.unwrap() {
                if !r.is_final() {
                    out.push(id);
                }
            }
        }
        out
    };
    assert_eq!(pending, ["b", "d"], "a replay calls only these");
    assert_eq!(
        s.item("a").await.unwrap().map(|r| r.status),
        Some(ItemStatus::Ok)
    );
    assert!(s.item("b").await.unwrap().is_none_or(|r| !r.is_final()));
    assert_eq!(
        finals(&*s).await.unwrap(),
        vec![("a".into(), ItemStatus::Ok), ("c".into(), ItemStatus::Ok)]
    );
}

async fn commits_are_final_and_fenced_by_their_lease<B: Backend>(b: &mut B) {
    let s = b.create();
    let plan = [
        planned(0, 0, &["a"]),
        planned(1, 1, &["b"]),
        planned(2, 2, &["c"]),
    ];
    s.plan(&plan, &planner_at(3, 3, true)).await.unwrap();
    let old = lease(&*s).await;
    let (ra, rb, rc) = (result(0, 0, true), result(1, 1, false), result(2, 2, true));
    s.record(&[
        ("a".into(), ra.clone()),
        ("b".into(), rb.clone()),
        ("c".into(), rc.clone()),
    ])
    .await
    .unwrap();
    s.sync().await.unwrap();
    let new = lease(&*s).await;
    assert!(
        new.token > old.token,
        "a later lease carries a larger token"
    );
    let c0 = commit_of(0, &[&ra]);
    let refused = s.commit(&old, Commit::Job(std::slice::from_ref(&c0))).await;
    assert!(
        matches!(
            refused.as_ref().map_err(StoreError::root),
            Err(StoreError::LeaseLost { .. })
        ),
        "a superseded lease commits nothing: {refused:?}"
    );
    assert!(s.commit_record(0).await.unwrap().is_none());
    s.renew(&new).await.unwrap();
    assert!(s.renew(&old).await.is_err());
    s.commit(&new, Commit::Job(&[c0.clone(), commit_of(1, &[&rb])]))
        .await
        .unwrap();
    // A bucket is committed once: a second commit of it changes nothing.
    let again = CommitRecord {
        ok: 5,
        ..c0.clone()
    };
    s.commit(&new, Commit::Job(&[again, commit_of(2, &[&rc])]))
        .await
        .unwrap();
    s.sync().await.unwrap();
    s.release(&new).await.unwrap();
    let late = s.commit(&new, Commit::Job(&[])).await;
    assert!(late.is_err(), "a released lease commits nothing");
    let s = b.crash(s);
    assert_eq!(s.commit_record(0).await.unwrap(), Some(c0));
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (
            stats.buckets_committed,
            stats.ok,
            stats.failed,
            stats.pending
        ),
        (3, 2, 1, 0)
    );
    assert!(stats.finished());
    let failed: Vec<u64> = s
        .failed_buckets()
        .await
        .unwrap()
        .iter()
        .map(|c| c.bucket)
        .collect();
    assert_eq!(failed, vec![1]);
    let mut failures = Vec::new();
    s.for_each_failure(None, &mut |id, _| {
        failures.push(id.to_string());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(failures, ["b"]);
}

async fn a_rerun_moves_the_job_counts_once<B: Backend>(b: &mut B) {
    let s = b.create();
    let plan = [planned(0, 0, &["a", "b"]), planned(1, 2, &["c", "d"])];
    s.plan(&plan, &planner_at(2, 4, true)).await.unwrap();
    let first = [
        ("a".to_string(), result(0, 0, true)),
        ("b".to_string(), result(1, 0, false)),
        ("c".to_string(), result(2, 1, false)),
        ("d".to_string(), result(3, 1, false)),
    ];
    let l = lease(&*s).await;
    s.record(&first).await.unwrap();
    s.sync().await.unwrap();
    let commits = [
        commit_of(0, &[&first[0].1, &first[1].1]),
        commit_of(1, &[&first[2].1, &first[3].1]),
    ];
    s.commit(&l, Commit::Job(&commits)).await.unwrap();
    s.sync().await.unwrap();
    // Rerun 1 of b and c, in one rerun bucket.
    let share = |bucket| JobBucketShare {
        bucket,
        ok: 0,
        failed: 1,
        failed_by_class: [("unknown".to_string(), 1)].into(),
    };
    let rerun = RerunRecord {
        number: 1,
        selection: RerunSelection::Failed,
        buckets: 1,
        ids: 2,
        created_at_ms: 0,
    };
    let bucket = RerunBucket {
        offset: RerunOffset {
            rerun: 1,
            bucket: 0,
            items: 2,
            before: vec![share(0), share(1)],
            planned_at_ms: 0,
        },
        items: vec![(1, "b".into()), (2, "c".into())],
    };
    s.create_rerun(&rerun, std::slice::from_ref(&bucket))
        .await
        .unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    assert_eq!(s.reruns().await.unwrap(), vec![rerun]);
    assert_eq!(
        s.rerun_open_buckets(1).await.unwrap(),
        vec![bucket.offset.clone()]
    );
    assert!(!s.rerun_stats(1).await.unwrap().finished());
    // b heals, c fails again.
    let l = lease(&*s).await;
    let mut healed = result(1, 0, true);
    healed.rerun = Some(1);
    let mut again = result(2, 1, false);
    again.rerun = Some(1);
    s.record(&[("b".into(), healed.clone()), ("c".into(), again.clone())])
        .await
        .unwrap();
    s.sync().await.unwrap();
    let rc = commit_of(0, &[&healed, &again]);
    view::commit(&*s, &l, Log::Rerun(1), std::slice::from_ref(&rc))
        .await
        .unwrap();
    view::commit(&*s, &l, Log::Rerun(1), &[rc]).await.unwrap(); // a repeat moves nothing
    s.sync().await.unwrap();
    let s = b.crash(s);
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.ok, stats.failed), (2, 2));
    let c0 = s.commit_record(0).await.unwrap().unwrap();
    assert_eq!((c0.ok, c0.failed, c0.failed_by_class.len()), (2, 0, 0));
    let c1 = s.commit_record(1).await.unwrap().unwrap();
    assert_eq!((c1.ok, c1.failed), (0, 2));
    assert!(c0.classes_complete() && c1.classes_complete());
    let r = s.rerun_stats(1).await.unwrap();
    assert!(r.finished());
    assert_eq!((r.ok, r.failed, r.pending), (1, 1, 0));
    assert!(s.rerun_open_buckets(1).await.unwrap().is_empty());
    let items = s.rerun_bucket_items(&bucket.offset).await.unwrap();
    assert_eq!(items.len(), 2);
}

async fn a_grown_input_plans_on_and_old_ids_stay_duplicates<B: Backend>(b: &mut B) {
    let s = b.create();
    let rows = [(0, "a"), (1, "b")];
    assert_eq!(s.first_rows(&rows).await.unwrap(), vec![None, None]);
    s.plan(&[planned(0, 0, &["a", "b"])], &planner_at(1, 2, true))
        .await
        .unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    // The input grew: the planner goes on from where it stopped.
    s.set_planner(&planner_at(1, 2, false)).await.unwrap();
    let grown = [(2, "c"), (3, "a")];
    assert_eq!(
        s.first_rows(&grown).await.unwrap(),
        vec![None, Some(0)],
        "an old ID in the new rows is a duplicate"
    );
    let mut next = planned(1, 2, &["c"]);
    next.offset.end = cursor(4);
    next.offset.duplicates = 1;
    s.plan(&[next], &planner_at(2, 4, true)).await.unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (
            stats.buckets_planned,
            stats.ids_planned,
            stats.duplicates,
            stats.rows_read
        ),
        (2, 3, 1, 4)
    );
    assert!(stats.input_exhausted);
}

async fn damage_is_refused_never_read_as_less<B: Backend>(b: &mut B) {
    let s = b.create();
    let plan = [planned(0, 0, &["a", "b"])];
    s.plan(&plan, &planner_at(1, 2, true)).await.unwrap();
    let l = lease(&*s).await;
    let (ra, rb) = (result(0, 0, true), result(1, 0, true));
    s.record(&[("a".into(), ra.clone()), ("b".into(), rb.clone())])
        .await
        .unwrap();
    s.sync().await.unwrap();
    s.commit(&l, Commit::Job(&[commit_of(0, &[&ra, &rb])]))
        .await
        .unwrap();
    s.sync().await.unwrap();
    match b.damage_result(s, "b") {
        Err(e) => assert!(matches!(e.root(), StoreError::Corrupt { .. }), "{e}"),
        Ok(s) => {
            let export = finals(&*s).await;
            assert!(
                matches!(&export, Err(ExportError::Store(e)) if matches!(e.root(), StoreError::Corrupt { .. })),
                "a committed bucket that lost a result is refused, not exported short: {export:?}"
            );
        }
    }
}

async fn the_engine_stops_and_resumes_every_id_exactly_once<B: Backend>(b: &mut B) {
    use crate::demo::api::{ApiConfig, FakeApi};
    use crate::engine;
    use crate::handler::http::HttpHandler;
    use crate::input::{InputFormat, InputSpec};
    use crate::job::{open_job, JobRequest, RunOptions};
    use crate::progress::Counters;
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..1500).map(|i| format!("c-{i}")).collect();
    let input = dir.path().join("ids.txt");
    // Some IDs twice: duplicates are not called.
    let mut rows = ids.clone();
    rows.extend(ids[..100].iter().cloned());
    std::fs::write(&input, rows.join("\n")).unwrap();
    let config = ApiConfig {
        latency_min: std::time::Duration::from_micros(200),
        latency_max: std::time::Duration::from_millis(1),
        not_found_per_mille: 30,
        ..ApiConfig::fast()
    };
    let api = FakeApi::start(config).await.unwrap();
    let s = b.create();
    let request = JobRequest {
        input: Some(InputSpec {
            path: input,
            format: InputFormat::Text,
        }),
        url: Some(api.url_template()),
        bucket_size: Some(7),
        ..JobRequest::default()
    };
    let spec = Arc::new(open_job(&*s, &request).await.unwrap());
    let handler = Arc::new(HttpHandler::new(&spec.request).unwrap());
    let opts = RunOptions {
        concurrency: 8,
        progress_interval: std::time::Duration::ZERO,
        durability: crate::job::Durability::Async {
            interval: std::time::Duration::from_millis(20),
        },
        ..RunOptions::default()
    };
    let (stop_handle, stop) = engine::stop_pair();
    let watcher = tokio::spawn({
        let api = api.clone();
        async move {
            while api.total_calls() < 600 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            stop_handle.stop();
        }
    });
    // The write-ahead and commit order (engine invariants 1 and 2) checked on the log of
    // every write and sync the store saw.
    let audit = Arc::new(Audit::new(s.clone(), false));
    let first = engine::run(
        audit.clone(),
        spec.clone(),
        handler.clone(),
        &opts,
        Arc::new(Counters::default()),
        stop,
    )
    .await
    .unwrap();
    watcher.await.unwrap();
    let (commits, _) = audit.check();
    assert!(commits > 0, "the stopped run committed buckets");
    drop(audit);
    assert!(
        first.interrupted && !first.job.finished(),
        "{:?}",
        first.job
    );
    assert_eq!(
        first.job.ok + first.job.failed,
        first.run.ok + first.run.failed
    );
    let s = b.crash(s);
    // The resume in the other durability mode (a log only checks the runs that planned).
    let sync_progress = RunOptions {
        durability: crate::job::Durability::Sync,
        ..opts
    };
    let second = engine::run(
        s.clone(),
        spec,
        handler,
        &sync_progress,
        Arc::new(Counters::default()),
        engine::stop_pair().1,
    )
    .await
    .unwrap();
    assert!(second.job.finished(), "{:?}", second.job);
    assert_eq!(second.job.ok + second.job.failed, 1500);
    assert_eq!(second.job.duplicates, 100);
    assert_eq!(api.distinct_ids(), 1500);
    let bound = 1500 + engine::max_unsynced_items(8) as u64;
    assert!(api.total_calls() <= bound, "{} calls", api.total_calls());
    let exported = finals(&*s).await.unwrap();
    let mut seen: Vec<&str> = exported.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(seen.len(), 1500, "every ID once, in input order");
    assert!(seen.iter().zip(&ids).all(|(a, b)| a == b));
    seen.dedup();
    assert_eq!(seen.len(), 1500);
}

/// A store that logs the order of writes and syncs, to check the engine's invariants.
pub(crate) struct Audit<S> {
    inner: Arc<S>,
    log: std::sync::Mutex<Vec<Event>>,
    syncs: std::sync::atomic::AtomicU64,
    /// Every write of results fails (a disk gone bad).
    fail_records: bool,
}

#[derive(Debug, Clone)]
enum Event {
    Plan(Vec<(u64, Vec<String>)>),
    Record(Vec<String>),
    /// A sync began: it covers every write before it.
    SyncStart(u64),
    SyncEnd(u64),
    Commit(Vec<u64>),
}

impl<S: Store + Leases> Audit<S> {
    /// Audit `inner`; with `fail_records`, every write of results fails.
    pub(crate) fn new(inner: Arc<S>, fail_records: bool) -> Audit<S> {
        Audit {
            inner,
            log: Default::default(),
            syncs: Default::default(),
            fail_records,
        }
    }

    fn push(&self, e: Event) {
        self.log.lock().unwrap().push(e);
    }

    /// Check invariants 1 and 2 over the log: results are only recorded for planned
    /// buckets whose offset records a finished sync covered, and a commit record only
    /// follows a finished sync that covered every result of its bucket.
    pub(crate) fn check(&self) -> (usize, usize) {
        let log = self.log.lock().unwrap().clone();
        let mut members: HashMap<u64, Vec<String>> = HashMap::new();
        // Writes in order; a finished sync makes a prefix of them durable (syncs may
        // overlap: the planner's and the writer's).
        let (mut planned, mut recorded) = (Vec::new(), Vec::new());
        let mut started: HashMap<u64, (usize, usize)> = HashMap::new();
        let (mut durable_planned, mut durable_recorded) = (0, 0);
        let mut durable = std::collections::HashSet::new();
        let mut bucket_of: HashMap<String, u64> = HashMap::new();
        let (mut commits, mut syncs) = (0, 0);
        for e in log {
            match e {
                Event::Plan(buckets) => {
                    for (b, ids) in buckets {
                        for id in &ids {
                            bucket_of.insert(id.clone(), b);
                        }
                        members.insert(b, ids);
                        planned.push(b);
                    }
                }
                Event::Record(ids) => {
                    for id in ids {
                        let b = bucket_of[&id];
                        assert!(
                            planned[..durable_planned].contains(&b),
                            "{id} was called before bucket {b}'s offset record was durable"
                        );
                        recorded.push(id);
                    }
                }
                Event::SyncStart(n) => {
                    started.insert(n, (planned.len(), recorded.len()));
                }
                Event::SyncEnd(n) => {
                    syncs += 1;
                    let (p, r) = started[&n];
                    durable_planned = durable_planned.max(p);
                    if r > durable_recorded {
                        durable.extend(recorded[durable_recorded..r].iter().cloned());
                        durable_recorded = r;
                    }
                }
                Event::Commit(buckets) => {
                    for b in buckets {
                        commits += 1;
                        for id in &members[&b] {
                            assert!(
                                durable.contains(id),
                                "bucket {b} committed before the result of {id} was durable"
                            );
                        }
                    }
                }
            }
        }
        (commits, syncs)
    }
}

impl<S: Store + Leases> Store for Audit<S> {
    async fn job(&self) -> Result<Option<StoredJob>, StoreError> {
        self.inner.job().await
    }
    async fn put_job(&self, job: &StoredJob) -> Result<(), StoreError> {
        self.inner.put_job(job).await
    }
    async fn planner(&self) -> Result<PlannerState, StoreError> {
        self.inner.planner().await
    }
    async fn first_rows(&self, rows: &[(u64, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        self.inner.first_rows(rows).await
    }
    async fn plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> Result<(), StoreError> {
        self.push(Event::Plan(
            buckets
                .iter()
                .map(|b| {
                    let ids = b.items.iter().map(|(_, id)| id.clone()).collect();
                    (b.offset.bucket, ids)
                })
                .collect(),
        ));
        self.inner.plan(buckets, planner).await
    }
    async fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        if self.fail_records {
            return Err(StoreError::Io(std::io::Error::other(
                "injected write failure",
            )));
        }
        self.push(Event::Record(
            results.iter().map(|(id, _)| id.clone()).collect(),
        ));
        self.inner.record(results).await
    }
    async fn sync(&self) -> Result<(), StoreError> {
        let n = self
            .syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.push(Event::SyncStart(n));
        self.inner.sync().await?;
        self.push(Event::SyncEnd(n));
        Ok(())
    }
    async fn buckets(&self, from: u64, limit: usize) -> Result<Vec<BucketState>, StoreError> {
        self.inner.buckets(from, limit).await
    }
    async fn bucket_items(
        &self,
        bucket: &OffsetRecord,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.inner.bucket_items(bucket).await
    }
    async fn item(&self, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        self.inner.item(id).await
    }
    async fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError> {
        self.inner.bad_lines(limit).await
    }
    async fn reruns(&self) -> Result<Vec<RerunRecord>, StoreError> {
        self.inner.reruns().await
    }
    async fn create_rerun(
        &self,
        rerun: &RerunRecord,
        buckets: &[RerunBucket],
    ) -> Result<(), StoreError> {
        self.inner.create_rerun(rerun, buckets).await
    }
    async fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        self.inner.rerun_buckets(rerun, from, limit).await
    }
    async fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.inner.rerun_bucket_items(offset).await
    }
}

impl<S: Store + Leases> Leases for Audit<S> {
    async fn acquire(&self, scope: LeaseScope) -> Result<Option<Lease>, StoreError> {
        self.inner.acquire(scope).await
    }
    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.release(lease).await
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    async fn acquire_next(&self, log: Log, n: u32) -> Result<Vec<Lease>, StoreError> {
        self.inner.acquire_next(log, n).await
    }
    fn alive(&self) -> bool {
        self.inner.alive()
    }
    async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), StoreError> {
        let buckets = match commit {
            Commit::Job(c) => c,
            Commit::Rerun { buckets, .. } => buckets,
        };
        self.push(Event::Commit(buckets.iter().map(|c| c.bucket).collect()));
        self.inner.commit(lease, commit).await
    }
}

/// The sled backend: a state directory in a temp dir.
pub(crate) struct SledBackend {
    dirs: Vec<tempfile::TempDir>,
}

impl SledBackend {
    pub(crate) fn new() -> SledBackend {
        SledBackend { dirs: Vec::new() }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dirs.last().expect("created").path().join("state")
    }

    fn open(&self) -> Result<Arc<SledStore>, StoreError> {
        SledStore::open(&self.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).map(Arc::new)
    }
}

impl Backend for SledBackend {
    type S = SledStore;

    fn create(&mut self) -> Arc<SledStore> {
        self.dirs.push(tempfile::tempdir().unwrap());
        let store = SledStore::open(&self.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES);
        Arc::new(store.unwrap())
    }

    /// sled cannot be killed inside a test process: the store is dropped (which flushes), so
    /// this checks what a reopen reads, and the kill -9 tests of the binary check the rest.
    fn crash(&mut self, store: Arc<SledStore>) -> Arc<SledStore> {
        drop(Arc::into_inner(store).expect("the only reference"));
        self.open().unwrap()
    }

    /// Cut the results log to its first entry's length: the second result is gone.
    fn damage_result(
        &mut self,
        store: Arc<SledStore>,
        _id: &str,
    ) -> Result<Arc<SledStore>, StoreError> {
        drop(Arc::into_inner(store).expect("the only reference"));
        let log = self.path().join(results_log::LOG_FILE);
        let len = std::fs::metadata(&log).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        file.set_len(len / 2).unwrap();
        self.open()
    }
}

/// The in-memory backend: a crash forgets what was not synced.
pub(crate) struct MemBackend;

impl Backend for MemBackend {
    type S = MemStore;

    fn create(&mut self) -> Arc<MemStore> {
        Arc::new(MemStore::new())
    }

    fn crash(&mut self, store: Arc<MemStore>) -> Arc<MemStore> {
        store.crash();
        store
    }

    fn damage_result(
        &mut self,
        store: Arc<MemStore>,
        id: &str,
    ) -> Result<Arc<MemStore>, StoreError> {
        assert!(store.lose_result(id));
        Ok(store)
    }
}

/// The PostgreSQL backend: a job in a fresh database of the test cluster. A crash drops the
/// store without ending its session and lets the session expire (as a TTL passing would),
/// then opens the job again in a new session.
#[cfg(feature = "postgres")]
pub(crate) struct PgBackend {
    db: Option<postgres::test_db::Db>,
    /// A broken backend, to show the suite can fail: a crash also loses the commits.
    forget_commits: bool,
}

#[cfg(feature = "postgres")]
impl PgBackend {
    pub(crate) fn new(forget_commits: bool) -> PgBackend {
        PgBackend {
            db: None,
            forget_commits,
        }
    }

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
    }

    fn open(&self) -> Arc<postgres::PgStore> {
        let db = self.db.as_ref().expect("created");
        let open = postgres::PgOpen {
            create: true,
            ..postgres::PgOpen::new("conformance")
        };
        Arc::new(Self::block(postgres::PgStore::open(&db.target, &open)).unwrap())
    }

    /// Drop `store` as a crash would (its session expires), then run `sql` on its database.
    fn down(&self, store: Arc<postgres::PgStore>, sql: &str) {
        drop(Arc::into_inner(store).expect("the only reference"));
        let db = self.db.as_ref().expect("created");
        let sql = format!(
            "SET search_path TO {}; \
             UPDATE hw_worker SET expires_at = now() - interval '1 second'; {sql}",
            db.db.schema
        );
        db.psql(&sql);
    }
}

#[cfg(feature = "postgres")]
impl Backend for PgBackend {
    type S = postgres::PgStore;

    fn create(&mut self) -> Arc<postgres::PgStore> {
        self.db = Some(Self::block(postgres::test_db::migrated()));
        self.open()
    }

    fn crash(&mut self, store: Arc<postgres::PgStore>) -> Arc<postgres::PgStore> {
        let lose = if self.forget_commits {
            "UPDATE hw_bucket SET state = 'open', owner = NULL, committed_at = NULL \
             WHERE state = 'committed';"
        } else {
            ""
        };
        self.down(store, lose);
        self.open()
    }

    fn damage_result(
        &mut self,
        store: Arc<postgres::PgStore>,
        id: &str,
    ) -> Result<Arc<postgres::PgStore>, StoreError> {
        let lose = format!(
            "UPDATE hw_item SET status = 'pending', record = NULL, body = NULL WHERE id = '{id}';"
        );
        self.down(store, &lose);
        Ok(self.open())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_postgres_store_conforms() {
        run_all(&mut PgBackend::new(false)).await;
    }

    /// The suite can fail on PostgreSQL too: a job whose crash loses its commits is caught.
    #[cfg(feature = "postgres")]
    #[test]
    fn a_postgres_store_that_loses_commits_fails_the_suite() {
        let suite = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(run_all(&mut PgBackend::new(true)));
        });
        assert!(
            suite.join().is_err(),
            "the suite passed a PostgreSQL store that loses commits"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sled_store_conforms() {
        run_all(&mut SledBackend::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_memory_store_conforms() {
        run_all(&mut MemBackend).await;
    }

    /// The suite can fail: a store that forgets its commits on a crash is caught.
    #[test]
    fn a_store_that_loses_synced_commits_fails_the_suite() {
        struct Forgetful;
        impl Backend for Forgetful {
            type S = MemStore;
            fn create(&mut self) -> Arc<MemStore> {
                Arc::new(MemStore::new())
            }
            fn crash(&mut self, store: Arc<MemStore>) -> Arc<MemStore> {
                store.forget_commits();
                store
            }
            fn damage_result(
                &mut self,
                store: Arc<MemStore>,
                id: &str,
            ) -> Result<Arc<MemStore>, StoreError> {
                MemBackend.damage_result(store, id)
            }
        }
        let suite = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(run_all(&mut Forgetful));
        });
        assert!(
            suite.join().is_err(),
            "the suite passed a store that loses commits"
        );
    }
}
