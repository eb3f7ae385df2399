//! The engine's invariants over a backend: the real engine runs, stops, resumes and ends
//! with every ID exactly once, and [`Audit`], a store that logs every write and sync, checks
//! invariants 1 (an offset record is durable before its items are called) and 2 (a commit
//! only after its results are durable) on that log.

use std::collections::HashMap;

use super::*;

pub(super) async fn the_engine_stops_and_resumes_every_id_exactly_once<B: Backend>(b: &mut B) {
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
