//! An in-memory store: the reference backend.
//!
//! Everything lives in maps behind one lock, twice: what reads see now, and what a
//! [`Store::sync`] made durable. [`MemStore::crash`] throws away what was not synced, as a
//! kill -9 would, so tests (and the conformance suite every backend runs) can check the
//! engine's ordering against a store that really forgets. Nothing is written anywhere; a
//! [`MemStore`] lives as long as the process. Its leases behave like the sled backend's: one
//! holder at a time, a newer acquisition superseding the older.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{
    BadLine, BucketState, Commit, CommitRecord, ItemRecord, Lease, LeaseScope, LeaseToken, Leases,
    NoFleet, OffsetRecord, PlannedBucket, PlannerState, RerunBucket, RerunBucketState, RerunOffset,
    RerunRecord, Store, StoreError, StoredJob,
};

/// A bucket's offset record and its IDs with their rows.
type Planned<O> = (O, Vec<(u64, String)>);

/// A job's records, as one state.
#[derive(Debug, Clone, Default)]
struct Records {
    job: Option<StoredJob>,
    planner: PlannerState,
    /// ID → the row it was first noted at.
    first_rows: HashMap<String, u64>,
    /// Bucket → its offset record and its IDs with their rows.
    buckets: BTreeMap<u64, Planned<OffsetRecord>>,
    commits: BTreeMap<u64, CommitRecord>,
    results: HashMap<String, ItemRecord>,
    bad: BTreeMap<u64, BadLine>,
    reruns: BTreeMap<u32, RerunRecord>,
    rerun_buckets: BTreeMap<(u32, u64), Planned<RerunOffset>>,
    rerun_commits: BTreeMap<(u32, u64), CommitRecord>,
}

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

fn items(
    ids: &[(u64, String)],
    results: &HashMap<String, ItemRecord>,
    bucket: u64,
) -> Vec<(String, ItemRecord)> {
    ids.iter()
        .map(|(row, id)| {
            let record = results
                .get(id)
                .cloned()
                .unwrap_or_else(|| ItemRecord::pending(*row, bucket));
            (id.clone(), record)
        })
        .collect()
}

impl Store for MemStore {
    async fn job(&self) -> Result<Option<StoredJob>, StoreError> {
        Ok(self.state().live.job.clone())
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
        let mut s = self.state();
        Ok(rows
            .iter()
            .map(|&(row, id)| {
                let first = *s.live.first_rows.entry(id.to_owned()).or_insert(row);
                (first < row).then_some(first)
            })
            .collect())
    }

    async fn plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> Result<(), StoreError> {
        let mut s = self.state();
        for b in buckets {
            for (row, id) in &b.items {
                s.live.first_rows.entry(id.clone()).or_insert(*row);
            }
            for line in &b.bad_lines {
                s.live.bad.insert(line.row, line.clone());
            }
            s.live
                .buckets
                .insert(b.offset.bucket, (b.offset.clone(), b.items.clone()));
        }
        s.live.planner = *planner;
        Ok(())
    }

    async fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        let mut s = self.state();
        for (id, record) in results {
            s.live.results.insert(id.clone(), record.clone());
        }
        Ok(())
    }

    async fn sync(&self) -> Result<(), StoreError> {
        let mut s = self.state();
        s.durable = s.live.clone();
        Ok(())
    }

    async fn buckets(&self, from: u64, limit: usize) -> Result<Vec<BucketState>, StoreError> {
        let s = self.state();
        Ok(s.live
            .buckets
            .range(from..)
            .take(limit)
            .map(|(b, (offset, _))| BucketState {
                offset: offset.clone(),
                commit: s.live.commits.get(b).cloned(),
            })
            .collect())
    }

    async fn bucket_items(
        &self,
        bucket: &OffsetRecord,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let s = self.state();
        let (_, ids) = s.live.buckets.get(&bucket.bucket).ok_or_else(|| {
            StoreError::corrupt(format!("bucket {} has no offset record", bucket.bucket))
        })?;
        Ok(items(ids, &s.live.results, bucket.bucket))
    }

    async fn item(&self, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        Ok(self.state().live.results.get(id).cloned())
    }

    async fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError> {
        Ok(self
            .state()
            .live
            .bad
            .values()
            .take(limit)
            .cloned()
            .collect())
    }

    async fn reruns(&self) -> Result<Vec<RerunRecord>, StoreError> {
        Ok(self.state().live.reruns.values().cloned().collect())
    }

    async fn create_rerun(
        &self,
        rerun: &RerunRecord,
        buckets: &[RerunBucket],
    ) -> Result<(), StoreError> {
        let mut s = self.state();
        s.live.reruns.insert(rerun.number, rerun.clone());
        for b in buckets {
            s.live.rerun_buckets.insert(
                (b.offset.rerun, b.offset.bucket),
                (b.offset.clone(), b.items.clone()),
            );
        }
        Ok(())
    }

    async fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        let s = self.state();
        Ok(s.live
            .rerun_buckets
            .range((rerun, from)..=(rerun, u64::MAX))
            .take(limit)
            .map(|(key, (offset, _))| RerunBucketState {
                offset: offset.clone(),
                commit: s.live.rerun_commits.get(key).cloned(),
            })
            .collect())
    }

    async fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let s = self.state();
        let (_, ids) = s
            .live
            .rerun_buckets
            .get(&(offset.rerun, offset.bucket))
            .ok_or_else(|| {
                StoreError::corrupt(format!(
                    "bucket {} of rerun {} has no offset record",
                    offset.bucket, offset.rerun
                ))
            })?;
        let mut out = Vec::with_capacity(ids.len());
        for (row, id) in ids {
            let record = s.live.results.get(id).cloned().ok_or_else(|| {
                StoreError::corrupt(format!(
                    "the IDs of bucket {} of rerun {} include {id:?} (row {row}), which has no record",
                    offset.bucket, offset.rerun
                ))
            })?;
            out.push((id.clone(), record));
        }
        Ok(out)
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
        match commit {
            Commit::Job(commits) => {
                for c in commits {
                    s.live.commits.entry(c.bucket).or_insert_with(|| c.clone());
                }
            }
            Commit::Rerun {
                rerun,
                buckets,
                moved,
            } => {
                for c in buckets {
                    s.live.rerun_commits.insert((rerun, c.bucket), c.clone());
                }
                for c in moved {
                    if let Some(held) = s.live.commits.get_mut(&c.bucket) {
                        *held = c.clone();
                    }
                }
            }
        }
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
