//! [`Records`]: a job's records in memory, and the operations of the [`Store`] contract on
//! them, for both in-memory backends (one holder, and a fleet's). Which copy of the records
//! an operation sees, and under which lease, is the backend's.
//!
//! [`Store`]: crate::store::Store

use std::collections::{BTreeMap, HashMap};

use crate::store::{
    BadLine, BucketState, Commit, CommitRecord, ItemRecord, OffsetRecord, PageMark, PageRecord,
    PlannedBucket, PlannerState, RerunBucket, RerunBucketState, RerunOffset, RerunRecord,
    StoreError, StoredJob,
};

/// A bucket's offset record and its IDs with their rows.
type Planned<O> = (O, Vec<(u64, String)>);

/// A job's records, as one state.
#[derive(Debug, Clone, Default)]
pub(super) struct Records {
    pub(super) job: Option<StoredJob>,
    pub(super) planner: PlannerState,
    /// ID → the row it was first noted at.
    pub(super) first_rows: HashMap<String, u64>,
    /// Bucket → its offset record and its IDs with their rows.
    pub(super) buckets: BTreeMap<u64, Planned<OffsetRecord>>,
    pub(super) commits: BTreeMap<u64, CommitRecord>,
    pub(super) results: HashMap<String, ItemRecord>,
    /// ID → its input row's kept columns, when the job keeps any.
    values: HashMap<String, Box<str>>,
    bad: BTreeMap<u64, BadLine>,
    reruns: BTreeMap<u32, RerunRecord>,
    pub(super) rerun_buckets: BTreeMap<(u32, u64), Planned<RerunOffset>>,
    pub(super) rerun_commits: BTreeMap<(u32, u64), CommitRecord>,
    /// The job's quota usage (durable at once: a reservation is never buffered).
    pub(super) quotas: crate::quota::QuotaLedger,
    /// The windows the job learnt from refusals (kept at once, as the quotas).
    pub(super) learned: Vec<crate::quota::KeptLimit>,
    /// The pages of paginated IDs, by ID, generation and number.
    pages: BTreeMap<(String, u32, u32), PageRecord>,
}

impl Records {
    /// Say for each `(row, id)` whether it repeats an earlier row, noting first occurrences.
    pub(super) fn first_rows(&mut self, rows: &[(u64, &str)]) -> Vec<Option<u64>> {
        rows.iter()
            .map(|&(row, id)| {
                let first = *self.first_rows.entry(id.to_owned()).or_insert(row);
                (first < row).then_some(first)
            })
            .collect()
    }

    pub(super) fn plan(&mut self, buckets: &[PlannedBucket], planner: &PlannerState) {
        for b in buckets {
            for (row, id) in &b.items {
                self.first_rows.entry(id.clone()).or_insert(*row);
            }
            for ((_, id), values) in b.items.iter().zip(&b.values) {
                self.values.insert(id.clone(), values.as_str().into());
            }
            for line in &b.bad_lines {
                self.bad.insert(line.row, line.clone());
            }
            self.buckets
                .insert(b.offset.bucket, (b.offset.clone(), b.items.clone()));
        }
        self.planner = *planner;
    }

    pub(super) fn record(&mut self, results: &[(String, ItemRecord)]) {
        for (id, record) in results {
            self.results.insert(id.clone(), record.clone());
        }
    }

    pub(super) fn record_pages(&mut self, pages: &[(String, PageRecord)]) {
        for (id, page) in pages {
            let key = (id.clone(), page.generation, page.mark.page);
            self.pages.insert(key, page.clone());
        }
    }

    /// The mark of each ID's last page in `generation`.
    pub(super) fn page_marks(&self, generation: u32, ids: &[(u64, &str)]) -> Vec<Option<PageMark>> {
        ids.iter()
            .map(|&(_, id)| {
                let from = (id.to_string(), generation, 0);
                let to = (id.to_string(), generation, u32::MAX);
                let last = self.pages.range(from..=to).next_back();
                last.map(|(_, page)| page.mark.clone())
            })
            .collect()
    }

    /// Pages `from..from + count` of `id` in `generation`, each of them.
    pub(super) fn pages(
        &self,
        id: &str,
        generation: u32,
        from: u32,
        count: u32,
    ) -> Result<Vec<PageRecord>, StoreError> {
        (from..from.saturating_add(count))
            .map(|page| {
                self.pages
                    .get(&(id.to_string(), generation, page))
                    .cloned()
                    .ok_or_else(|| StoreError::Corrupt {
                        reason: format!(
                            "page {page} of {id:?} (generation {generation}) is missing"
                        ),
                    })
            })
            .collect()
    }

    pub(super) fn buckets(&self, from: u64, limit: usize) -> Vec<BucketState> {
        self.buckets
            .range(from..)
            .take(limit)
            .map(|(b, (offset, _))| BucketState {
                offset: offset.clone(),
                commit: self.commits.get(b).cloned(),
            })
            .collect()
    }

    pub(super) fn bucket_items(
        &self,
        bucket: &OffsetRecord,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let (_, ids) = self.buckets.get(&bucket.bucket).ok_or_else(|| {
            StoreError::corrupt(format!("bucket {} has no offset record", bucket.bucket))
        })?;
        Ok(ids
            .iter()
            .map(|(row, id)| {
                let record = self
                    .results
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| ItemRecord::pending(*row, bucket.bucket));
                (id.clone(), self.with_values(id, record))
            })
            .collect())
    }

    pub(super) fn bad_lines(&self, limit: usize) -> Vec<BadLine> {
        self.bad.values().take(limit).cloned().collect()
    }

    pub(super) fn reruns(&self) -> Vec<RerunRecord> {
        self.reruns.values().cloned().collect()
    }

    pub(super) fn create_rerun(&mut self, rerun: &RerunRecord, buckets: &[RerunBucket]) {
        self.reruns.insert(rerun.number, rerun.clone());
        for b in buckets {
            self.rerun_buckets.insert(
                (b.offset.rerun, b.offset.bucket),
                (b.offset.clone(), b.items.clone()),
            );
        }
    }

    pub(super) fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Vec<RerunBucketState> {
        self.rerun_buckets
            .range((rerun, from)..=(rerun, u64::MAX))
            .take(limit)
            .map(|(key, (offset, _))| RerunBucketState {
                offset: offset.clone(),
                commit: self.rerun_commits.get(key).cloned(),
            })
            .collect()
    }

    pub(super) fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let (_, ids) = self
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
            let record = self.results.get(id).cloned().ok_or_else(|| {
                StoreError::corrupt(format!(
                    "the IDs of bucket {} of rerun {} include {id:?} (row {row}), which has no record",
                    offset.bucket, offset.rerun
                ))
            })?;
            out.push((id.clone(), self.with_values(id, record)));
        }
        Ok(out)
    }

    /// `record` with the kept columns of `id`'s row.
    fn with_values(&self, id: &str, record: ItemRecord) -> ItemRecord {
        ItemRecord {
            values: self.values.get(id).cloned(),
            ..record
        }
    }

    /// Write a commit's records (the lease was checked by the caller). A bucket committed
    /// before keeps its record.
    pub(super) fn commit(&mut self, commit: Commit<'_>) {
        match commit {
            Commit::Job(commits) => {
                for c in commits {
                    self.commits.entry(c.bucket).or_insert_with(|| c.clone());
                }
            }
            Commit::Rerun {
                rerun,
                buckets,
                moved,
            } => {
                for c in buckets {
                    self.rerun_commits.insert((rerun, c.bucket), c.clone());
                }
                for c in moved {
                    if let Some(held) = self.commits.get_mut(&c.bucket) {
                        *held = c.clone();
                    }
                }
            }
        }
    }
}
