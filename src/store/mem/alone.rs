//! [`MemStore`]: a job in memory, worked on by one holder at a time (it forms no fleet):
//! the reference backend.
//!
//! Everything lives in maps behind one lock, twice: what reads see now, and what a
//! [`Store::sync`] made durable. [`MemStore::crash`] throws away what was not synced, as a
//! kill -9 would, so tests (and the conformance suite every backend runs) can check the
//! engine's ordering against a store that really forgets. Nothing is written anywhere; a
//! [`MemStore`] lives as long as the process. Its leases behave like the sled backend's: one
//! holder at a time, a newer acquisition superseding the older.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::records::Records;
use crate::quota::{QuotaGrant, QuotaLedger, QuotaWant};
use crate::store::{
    BadLine, BucketState, Commit, ItemRecord, Lease, LeaseScope, LeaseToken, Leases, NoFleet,
    OffsetRecord, PageMark, PageRecord, PlannedBucket, PlannerState, RerunBucket, RerunBucketState,
    RerunOffset, RerunRecord, Store, StoreError, StoredJob,
};

#[derive(Debug, Default)]
struct State {
    live: Records,
    durable: Records,
    /// The last lease token granted, and the one held (0: none).
    tokens: u64,
    lease: u64,
}

/// An in-memory store (see the module doc).
#[derive(Debug, Default)]
pub struct MemStore {
    state: Mutex<State>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// A panicking user of the store leaves the maps as they were between two operations
    /// (every operation changes them under the lock, without unwinding half way), so a
    /// poisoned lock is taken as it is.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forget everything not synced, and every lease, as a crash and a new open would.
    pub fn crash(&self) {
        let mut s = self.state();
        s.live = s.durable.clone();
        s.lease = 0;
    }

    /// Damage: lose the durable result of `id` (what a damaged results file does). Returns
    /// whether it had one.
    pub fn lose_result(&self, id: &str) -> bool {
        let mut s = self.state();
        let had = s.durable.results.remove(id).is_some();
        s.live = s.durable.clone();
        had
    }

    /// A broken store, for the test that the conformance suite can fail: a crash that also
    /// loses every commit record.
    #[cfg(test)]
    pub(crate) fn forget_commits(&self) {
        let mut s = self.state();
        s.durable.commits.clear();
        s.live = s.durable.clone();
        s.lease = 0;
    }
}

impl Store for MemStore {
    async fn job(&self) -> Result<Option<StoredJob>, StoreError> {
        Ok(self.state().live.job.clone())
    }

    async fn reserve_quota(
        &self,
        wants: &[QuotaWant],
        now_ms: u64,
    ) -> Result<Vec<QuotaGrant>, StoreError> {
        let mut s = self.state();
        let grants = s.durable.quotas.reserve(wants, now_ms);
        s.live.quotas = s.durable.quotas.clone();
        Ok(grants)
    }

    async fn quota_ledger(&self) -> Result<QuotaLedger, StoreError> {
        Ok(self.state().durable.quotas.clone())
    }

    async fn learned_limits(&self) -> Result<Vec<crate::quota::KeptLimit>, StoreError> {
        Ok(self.state().live.learned.clone())
    }

    async fn keep_learned_limits(
        &self,
        limits: &[crate::quota::KeptLimit],
    ) -> Result<(), StoreError> {
        let mut s = self.state();
        s.durable.learned = limits.to_vec();
        s.live.learned = limits.to_vec();
        Ok(())
    }

    async fn put_job(&self, job: &StoredJob) -> Result<(), StoreError> {
        let mut s = self.state();
        s.live.job = Some(job.clone());
        s.durable.job = Some(job.clone());
        Ok(())
    }

    async fn planner(&self) -> Result<PlannerState, StoreError> {
        Ok(self.state().live.planner)
    }

    async fn first_rows(&self, rows: &[(u64, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        Ok(self.state().live.first_rows(rows))
    }

    async fn plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> Result<(), StoreError> {
        self.state().live.plan(buckets, planner);
        Ok(())
    }

    async fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        self.state().live.record(results);
        Ok(())
    }

    async fn sync(&self) -> Result<(), StoreError> {
        let mut s = self.state();
        s.durable = s.live.clone();
        Ok(())
    }

    fn keeps_pages(&self) -> bool {
        true
    }

    async fn record_pages(&self, pages: &[(String, PageRecord)]) -> Result<(), StoreError> {
        self.state().live.record_pages(pages);
        Ok(())
    }

    async fn page_marks(
        &self,
        generation: u32,
        ids: &[(u64, &str)],
    ) -> Result<Vec<Option<PageMark>>, StoreError> {
        Ok(self.state().live.page_marks(generation, ids))
    }

    async fn pages(
        &self,
        _row: u64,
        id: &str,
        generation: u32,
        from: u32,
        count: u32,
    ) -> Result<Vec<PageRecord>, StoreError> {
        self.state().live.pages(id, generation, from, count)
    }

    async fn buckets(&self, from: u64, limit: usize) -> Result<Vec<BucketState>, StoreError> {
        Ok(self.state().live.buckets(from, limit))
    }

    async fn bucket_items(
        &self,
        bucket: &OffsetRecord,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.state().live.bucket_items(bucket)
    }

    async fn item(&self, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        Ok(self.state().live.results.get(id).cloned())
    }

    async fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError> {
        Ok(self.state().live.bad_lines(limit))
    }

    async fn reruns(&self) -> Result<Vec<RerunRecord>, StoreError> {
        Ok(self.state().live.reruns())
    }

    async fn create_rerun(
        &self,
        rerun: &RerunRecord,
        buckets: &[RerunBucket],
    ) -> Result<(), StoreError> {
        self.state().live.create_rerun(rerun, buckets);
        Ok(())
    }

    async fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        Ok(self.state().live.rerun_buckets(rerun, from, limit))
    }

    async fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.state().live.rerun_bucket_items(offset)
    }
}

impl Leases for MemStore {
    type Fleet = NoFleet;

    async fn acquire(&self, scope: LeaseScope) -> Result<Option<Lease>, StoreError> {
        let mut s = self.state();
        s.tokens += 1;
        s.lease = s.tokens;
        Ok(Some(Lease {
            scope,
            token: LeaseToken(s.tokens),
        }))
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        check(&self.state(), lease)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut s = self.state();
        if s.lease == lease.token.0 {
            s.lease = 0;
        }
        Ok(())
    }

    async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), StoreError> {
        let mut s = self.state();
        check(&s, lease)?;
        s.live.commit(commit);
        Ok(())
    }
}

fn check(s: &State, lease: &Lease) -> Result<(), StoreError> {
    if s.lease == lease.token.0 {
        return Ok(());
    }
    Err(StoreError::LeaseLost {
        scope: format!("{:?}", lease.scope),
        token: lease.token.0,
    })
}
