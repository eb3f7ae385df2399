//! Rerun storage: a rerun's offset log and ID lists, its buckets with their commit records,
//! and a rerun commit that rewrites the job's commit runs whose counts it moved, atomically.

use std::sync::Arc;

use sled::transaction::ConflictableTransactionError;
use sled::Transactional;

use super::*;

impl SledStore {
    /// A rerun bucket's IDs with their current records (every ID of a rerun has one).
    pub(super) fn rerun_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let t = self.t()?;
        let corrupt = |reason: &str| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!(
                        "the IDs of bucket {} of rerun {} {reason}",
                        offset.bucket, offset.rerun
                    ),
                },
            )
        };
        let value = t
            .rerun_ids
            .get(rerun_key(offset.rerun, offset.bucket))
            .map_err(|e| self.err(e))?
            .ok_or_else(|| corrupt("are missing"))?;
        // In ids.log; inline in sled for a rerun created by format 3 (never 12 bytes long,
        // see `ListRef::from_bytes`).
        let blob = match ListRef::from_bytes(&value) {
            Some(list) => self.id_lists.read(list).map_err(|e| self.log_err(e))?,
            None => value.to_vec(),
        };
        let ids = decode_ids(&blob).ok_or_else(|| corrupt("are undecodable"))?;
        let mut out = Vec::with_capacity(ids.len());
        for (row, id, values) in ids {
            let record = self
                .result(row, &id)?
                .ok_or_else(|| corrupt(&format!("include {id:?}, which has no record")))?;
            out.push((id, ItemRecord { values, ..record }));
        }
        Ok(out)
    }

    /// A rerun's buckets from `from` on (see [`Store::rerun_buckets`]).
    pub(super) fn read_rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        let t = self.t()?;
        let mut out = Vec::new();
        let range = rerun_key(rerun, from)..=rerun_key(rerun, u64::MAX);
        for entry in t.rerun_offsets.range(range).take(limit) {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            let commit = self.get(&t.rerun_commits, &key, "rerun commit")?;
            out.push(RerunBucketState {
                offset: self.decode("rerun offset", &value)?,
                commit,
            });
        }
        Ok(out)
    }

    /// Write commit records of rerun buckets and the job buckets' records their counts moved
    /// (rewriting the commit log runs that hold them), atomically.
    pub(super) fn commit_rerun(
        &self,
        rerun: u32,
        buckets: &[CommitRecord],
        moved: &[CommitRecord],
    ) -> Result<(), StoreError> {
        let t = self.t()?;
        let mut batch = sled::Batch::default();
        for c in buckets {
            batch.insert(&rerun_key(rerun, c.bucket), json(c));
        }
        // The commit log runs holding the moved buckets, rewritten whole.
        let mut runs: BTreeMap<u64, Vec<CommitRecord>> = BTreeMap::new();
        for moved in moved {
            let bucket = moved.bucket;
            let held = runs
                .range(..=bucket)
                .next_back()
                .is_some_and(|(first, run)| bucket < first + run.len() as u64);
            if !held {
                if let Some((first, run)) = self.commit_run_of(bucket)? {
                    runs.insert(first, Arc::unwrap_or_clone(run));
                }
            }
            let found = runs
                .range_mut(..=bucket)
                .next_back()
                .and_then(|(first, run)| run.get_mut((bucket - first) as usize));
            if let Some(c) = found.filter(|c| c.bucket == bucket) {
                *c = moved.clone();
            }
        }
        let mut job = sled::Batch::default();
        for (first, run) in &runs {
            job.insert(&first.to_be_bytes(), json(run));
        }
        let _rewriting = (!runs.is_empty()).then(|| Rewriting::start(&self.runs_rewritten));
        (&t.rerun_commits, &t.commits)
            .transaction(|(r, c)| {
                r.apply_batch(&batch)?;
                c.apply_batch(&job)?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| self.tx_err(e, "rerun commit aborted"))
    }
}
