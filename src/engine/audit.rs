//! [`Audit`]: a store that logs the order of every write and sync the engine makes, and
//! checks the engine's invariants 1 (an offset record is durable before its items are
//! called) and 2 (a commit only after its results are durable) on that log. The engine's
//! own tests and the conformance suite (over every backend) run the engine on it.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::store::*;

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
    /// Job buckets a fleet's store leased out: stored where every worker reads them, so
    /// their offset records are durable (a fleet's plan is durable when written: another
    /// worker may lease its buckets before the planner's next sync).
    Leased(Vec<u64>),
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
        let mut leased = std::collections::HashSet::new();
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
                Event::Leased(buckets) => leased.extend(buckets),
                Event::Record(ids) => {
                    for id in ids {
                        let b = bucket_of[&id];
                        assert!(
                            planned[..durable_planned].contains(&b) || leased.contains(&b),
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
    fn over_network(&self) -> bool {
        self.inner.over_network()
    }
    fn keeps_pages(&self) -> bool {
        self.inner.keeps_pages()
    }
    async fn record_pages(
        &self,
        pages: &[(String, crate::store::PageRecord)],
    ) -> Result<(), StoreError> {
        self.inner.record_pages(pages).await
    }
    async fn page_marks(
        &self,
        generation: u32,
        ids: &[(u64, &str)],
    ) -> Result<Vec<Option<crate::store::PageMark>>, StoreError> {
        self.inner.page_marks(generation, ids).await
    }
    async fn pages(
        &self,
        row: u64,
        id: &str,
        generation: u32,
        from: u32,
        count: u32,
    ) -> Result<Vec<crate::store::PageRecord>, StoreError> {
        self.inner.pages(row, id, generation, from, count).await
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
    async fn reserve_quota(
        &self,
        wants: &[crate::quota::QuotaWant],
        now_ms: u64,
    ) -> Result<Vec<crate::quota::QuotaGrant>, StoreError> {
        self.inner.reserve_quota(wants, now_ms).await
    }
    async fn quota_ledger(&self) -> Result<crate::quota::QuotaLedger, StoreError> {
        self.inner.quota_ledger().await
    }
    async fn learned_limits(&self) -> Result<Vec<crate::quota::KeptLimit>, StoreError> {
        self.inner.learned_limits().await
    }
    async fn keep_learned_limits(
        &self,
        limits: &[crate::quota::KeptLimit],
    ) -> Result<(), StoreError> {
        self.inner.keep_learned_limits(limits).await
    }
}

impl<S: Store + Leases> Leases for Audit<S> {
    /// An audited store is in a fleet if the store it audits is.
    type Fleet = Audited<S::Fleet>;

    async fn acquire(&self, scope: LeaseScope) -> Result<Option<Lease>, StoreError> {
        self.inner.acquire(scope).await
    }
    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.release(lease).await
    }
    async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), StoreError> {
        let buckets = match commit {
            Commit::Job(c) => c,
            Commit::Rerun { buckets, .. } => buckets,
        };
        let buckets = buckets.iter().map(|c| c.bucket).collect();
        if !self.inner.commits_write_results() {
            self.push(Event::Commit(buckets));
            return self.inner.commit(lease, commit).await;
        }
        // The results recorded so far are written with the commit, durable with it.
        let n = self.syncs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.push(Event::SyncStart(n));
        let committed = self.inner.commit(lease, commit).await;
        if committed.is_ok() {
            self.push(Event::SyncEnd(n));
            self.push(Event::Commit(buckets));
        }
        committed
    }
    async fn commit_each(
        &self,
        commits: &[(Lease, CommitRecord)],
    ) -> Result<Vec<bool>, StoreError> {
        if !self.inner.commits_write_results() {
            self.push(Event::Commit(
                commits.iter().map(|(_, c)| c.bucket).collect(),
            ));
            return self.inner.commit_each(commits).await;
        }
        let n = self.syncs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.push(Event::SyncStart(n));
        let done = self.inner.commit_each(commits).await?;
        self.push(Event::SyncEnd(n));
        let committed = commits.iter().zip(&done).filter(|(_, ok)| **ok);
        self.push(Event::Commit(
            committed.map(|((_, c), _)| c.bucket).collect(),
        ));
        Ok(done)
    }
    fn commits_write_results(&self) -> bool {
        self.inner.commits_write_results()
    }
}

/// The buckets of the job's log among `leases` (what [`Event::Leased`] records).
fn job_buckets(leases: &[Lease]) -> Vec<u64> {
    leases
        .iter()
        .filter_map(|l| match l.scope {
            LeaseScope::Bucket {
                log: Log::Job,
                bucket,
            } => Some(bucket),
            _ => None,
        })
        .collect()
}

impl<S: Fleet> Fleet for Audit<S> {
    async fn acquire_next(&self, log: Log, n: u32) -> Result<Vec<Lease>, StoreError> {
        let leases = self.inner.acquire_next(log, n).await?;
        self.push(Event::Leased(job_buckets(&leases)));
        Ok(leases)
    }
    async fn acquire_work(&self, log: Log, n: u32) -> Result<Vec<LeasedBucket>, StoreError> {
        let work = self.inner.acquire_work(log, n).await?;
        let leases: Vec<Lease> = work.iter().map(|w| w.lease.clone()).collect();
        self.push(Event::Leased(job_buckets(&leases)));
        Ok(work)
    }
    fn alive(&self) -> bool {
        self.inner.alive()
    }
    fn holds(&self, lease: &Lease) -> bool {
        self.inner.holds(lease)
    }
    fn fleet_rate(&self) -> FleetRate {
        self.inner.fleet_rate()
    }
    async fn set_fleet_rate(&self, rate: f64, burst: Option<u32>) -> Result<(), StoreError> {
        self.inner.set_fleet_rate(rate, burst).await
    }
    async fn pause_fleet(&self, pause: Duration) -> Result<Duration, StoreError> {
        self.inner.pause_fleet(pause).await
    }
    async fn drain(&self) -> Result<(), StoreError> {
        self.inner.drain().await
    }
    async fn take_planner(&self) -> Result<Option<PlannerState>, StoreError> {
        self.inner.take_planner().await
    }
    async fn log_finished(&self, log: Log) -> Result<bool, StoreError> {
        self.inner.log_finished(log).await
    }
    fn worker_label(&self) -> String {
        self.inner.worker_label()
    }
}

/// The [`Leases::Fleet`] of an [`Audit`]: the audited store's (`K`), so a run over the
/// audit runs in the mode a run over the store would.
pub(crate) struct Audited<K>(PhantomData<K>);

impl<S: Store + Leases, K: FleetKind<S>> FleetKind<Audit<S>> for Audited<K> {
    fn visit<V: FleetVisitor<Audit<S>>>(audit: Arc<Audit<S>>, visitor: V) -> V::Output {
        K::visit(audit.inner.clone(), AsAudit { audit, visitor })
    }
}

/// Visits the audited store as the audit (see [`Audited`]).
struct AsAudit<S, V> {
    audit: Arc<Audit<S>>,
    visitor: V,
}

impl<S: Store + Leases, V: FleetVisitor<Audit<S>>> FleetVisitor<S> for AsAudit<S, V> {
    type Output = V::Output;

    fn alone(self, _: Arc<S>) -> V::Output {
        self.visitor.alone(self.audit)
    }

    fn fleet(self, _: Arc<S>) -> V::Output
    where
        S: Fleet,
    {
        self.visitor.fleet(self.audit)
    }
}
