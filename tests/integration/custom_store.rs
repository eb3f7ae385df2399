//! A store written outside the crate, judged by the conformance suite through the public
//! API alone: a user's store (here the in-memory store behind a count of its syncs) passes
//! every check, and one that skips its syncs fails, the check that caught it named.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use highwater::conformance::{run_all, Backend};
use highwater::quota::{QuotaGrant, QuotaLedger, QuotaWant};
use highwater::store::mem::MemStore;
use highwater::store::{
    BadLine, BucketState, Commit, CommitRecord, ItemRecord, Lease, LeaseScope, Leases, NoFleet,
    OffsetRecord, PlannedBucket, PlannerState, RerunBucket, RerunBucketState, RerunOffset,
    RerunRecord, Store, StoreError, StoreStats, StoredJob,
};

/// A user's store: the in-memory store, its syncs counted (or, to show the suite catches it,
/// skipped).
struct CountingStore {
    inner: MemStore,
    syncs: Arc<AtomicU64>,
    skip_syncs: bool,
}

impl Store for CountingStore {
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
        self.inner.plan(buckets, planner).await
    }
    async fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        self.inner.record(results).await
    }
    async fn sync(&self) -> Result<(), StoreError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if self.skip_syncs {
            return Ok(());
        }
        self.inner.sync().await
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
        wants: &[QuotaWant],
        now_ms: u64,
    ) -> Result<Vec<QuotaGrant>, StoreError> {
        self.inner.reserve_quota(wants, now_ms).await
    }
    async fn quota_ledger(&self) -> Result<QuotaLedger, StoreError> {
        self.inner.quota_ledger().await
    }
    async fn counted_stats(&self) -> Result<Option<StoreStats>, StoreError> {
        self.inner.counted_stats().await
    }
    async fn append_history(&self, records: &[serde_json::Value]) -> Result<(), StoreError> {
        self.inner.append_history(records).await
    }
    async fn history(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        self.inner.history().await
    }
    async fn learned_limits(&self) -> Result<Vec<highwater::quota::KeptLimit>, StoreError> {
        self.inner.learned_limits().await
    }
    async fn keep_learned_limits(
        &self,
        limits: &[highwater::quota::KeptLimit],
    ) -> Result<(), StoreError> {
        self.inner.keep_learned_limits(limits).await
    }
}

impl Leases for CountingStore {
    type Fleet = NoFleet;

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
        self.inner.commit(lease, commit).await
    }
    fn commits_write_results(&self) -> bool {
        self.inner.commits_write_results()
    }
    async fn commit_each(
        &self,
        commits: &[(Lease, CommitRecord)],
    ) -> Result<Vec<bool>, StoreError> {
        self.inner.commit_each(commits).await
    }
}

/// The suite's handle on the user's store: fresh ones, crashed ones (what was not synced
/// is lost), damaged ones (a durable result lost).
struct Counting {
    syncs: Arc<AtomicU64>,
    skip_syncs: bool,
}

impl Backend for Counting {
    type S = CountingStore;

    fn create(&mut self) -> Arc<CountingStore> {
        Arc::new(CountingStore {
            inner: MemStore::new(),
            syncs: self.syncs.clone(),
            skip_syncs: self.skip_syncs,
        })
    }

    fn crash(&mut self, store: Arc<CountingStore>) -> Arc<CountingStore> {
        store.inner.crash();
        store
    }

    fn damage_result(
        &mut self,
        store: Arc<CountingStore>,
        id: &str,
    ) -> Result<Arc<CountingStore>, StoreError> {
        assert!(store.inner.lose_result(id), "{id} has a result to lose");
        Ok(store)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_written_outside_the_crate_passes_the_conformance_suite() {
    let syncs = Arc::new(AtomicU64::new(0));
    let mut backend = Counting {
        syncs: syncs.clone(),
        skip_syncs: false,
    };
    run_all(&mut backend).await.unwrap();
    assert!(
        syncs.load(Ordering::Relaxed) > 0,
        "the suite ran on the user's store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_skips_its_syncs_fails_the_suite_which_names_the_check() {
    let mut backend = Counting {
        syncs: Arc::new(AtomicU64::new(0)),
        skip_syncs: true,
    };
    let failed = run_all(&mut backend)
        .await
        .expect_err("a store that loses what it synced passes no suite");
    assert_eq!(failed.check, "plans_are_durable_once_synced", "{failed}");
}
