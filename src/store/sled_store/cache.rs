//! The read cache: the last segment, segment ID lists and commit run read, kept for the next
//! call (replays, failure summaries and reruns look at buckets one at a time in bucket order),
//! and the generation that keeps a commit run rewritten by a rerun from being served stale.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;

/// Marks a rewrite of existing commit runs: the generation moves when it starts (to odd) and
/// again when it ends (to even). Readers use and fill the run cache only at an even generation
/// that did not move while they read, so no run read before or during a rewrite is served
/// after it.
pub(super) struct Rewriting<'a>(&'a AtomicU64);

impl<'a> Rewriting<'a> {
    pub(super) fn start(generation: &'a AtomicU64) -> Self {
        generation.fetch_add(1, Ordering::AcqRel);
        Rewriting(generation)
    }
}

impl Drop for Rewriting<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// A commit run's records, shared with the read cache.
pub(super) type Run = Arc<Vec<CommitRecord>>;

/// A segment's IDs with their rows (and kept values), one list per bucket.
pub(super) type SegmentIds = Vec<Vec<super::codec::Listed>>;

/// What the store read last, kept for the next call: replays, failure summaries and reruns
/// look at buckets one at a time in bucket order, and one segment (up to 1,000 buckets) or
/// commit run (up to 256) serves many such calls instead of being decoded for each.
#[derive(Default)]
pub(super) struct ReadCache {
    pub(super) segment: Option<Arc<Segment>>,
    /// The IDs of the segment starting at this bucket.
    pub(super) ids: Option<(u64, Arc<SegmentIds>)>,
    /// A commit run: the generation it was read at, its first bucket, its records.
    pub(super) run: Option<(u64, u64, Run)>,
}

impl SledStore {
    /// The segment holding `bucket`, if it was planned.
    pub(super) fn segment_of(&self, bucket: u64) -> Result<Option<Arc<Segment>>, StoreError> {
        if let Some(s) = &self.cache().segment {
            if s.contains(bucket) {
                return Ok(Some(s.clone()));
            }
        }
        let Some(entry) = self.t()?.offsets.range(..=bucket.to_be_bytes()).next_back() else {
            return Ok(None);
        };
        let (key, value) = entry.map_err(|e| self.err(e))?;
        let segment = Arc::new(self.segment(&key, &value)?);
        if !segment.contains(bucket) {
            return Ok(None);
        }
        // Segments are written once (the planner never plans a bucket twice).
        self.cache().segment = Some(segment.clone());
        Ok(Some(segment))
    }

    pub(super) fn cache(&self) -> std::sync::MutexGuard<'_, ReadCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The commit log run holding `bucket`, if it is committed.
    pub(super) fn commit_run_of(&self, bucket: u64) -> Result<Option<(u64, Run)>, StoreError> {
        let t = self.t()?;
        // An odd generation: a rerun is rewriting runs right now, so neither trust nor fill
        // the cache (what is read now may be replaced any moment).
        let generation = self.runs_rewritten.load(Ordering::Acquire);
        let steady = generation % 2 == 0;
        if let Some((g, first, run)) = &self.cache().run {
            if steady && *g == generation && (*first..*first + run.len() as u64).contains(&bucket) {
                return Ok(Some((*first, run.clone())));
            }
        }
        let Some(entry) = t.commits.range(..=bucket.to_be_bytes()).next_back() else {
            return Ok(None);
        };
        let (key, value) = entry.map_err(|e| self.err(e))?;
        // The run found may be the cached one even when it does not hold `bucket` (a bucket
        // not committed yet, just after it): then it need not be decoded again.
        let cached = match &self.cache().run {
            Some((g, first, run)) if steady && *g == generation && key == first.to_be_bytes() => {
                Some((*first, run.clone()))
            }
            _ => None,
        };
        let (first, run) = match cached {
            Some(hit) => hit,
            None => {
                let (first, run) = self.commit_run(&key, &value)?;
                let run = Arc::new(run);
                // New commits only add runs; a run changes only when a rerun rewrites it,
                // which bumps the generation: a run read across such a rewrite is not kept.
                if steady && self.runs_rewritten.load(Ordering::Acquire) == generation {
                    self.cache().run = Some((generation, first, run.clone()));
                }
                (first, run)
            }
        };
        Ok((bucket < first + run.len() as u64).then_some((first, run)))
    }

    /// A segment's unique IDs with their rows, bucket by bucket, in input order.
    pub(super) fn segment_ids(&self, segment: &Segment) -> Result<Arc<SegmentIds>, StoreError> {
        if let Some((first, ids)) = &self.cache().ids {
            if *first == segment.first {
                return Ok(ids.clone());
            }
        }
        let ids = Arc::new(self.read_segment_ids(segment)?);
        self.cache().ids = Some((segment.first, ids.clone()));
        Ok(ids)
    }
}
