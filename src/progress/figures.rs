//! Job-wide figures during a run: the store's at the start plus what this run did since.

use serde::Serialize;

use crate::store::StoreStats;

use super::snapshot::CounterSnapshot;

/// Job-wide figures during a run: the store's at the start plus what this run did since,
/// so that nothing walks the store while the run goes on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct JobFigures {
    /// Items with a final ok result, job-wide.
    pub(crate) ok: u64,
    /// Items with a final failed result, job-wide.
    pub(crate) failed: u64,
    /// Planned IDs without a final result yet (the input's unread rest not included).
    pub(crate) pending: u64,
    /// Unique IDs planned, job-wide.
    pub(crate) ids_planned: u64,
    /// Buckets planned, job-wide.
    pub(crate) buckets_planned: u64,
    /// Buckets committed, job-wide.
    pub(crate) buckets_committed: u64,
    /// Rows read from the input (bad and duplicate rows included).
    pub(crate) rows_read: u64,
    /// Rows settled: read, and their ID done (or a duplicate, or a bad line).
    pub(crate) rows_done: u64,
    /// What the calls cost, job-wide, as their answers said.
    pub(crate) usage: crate::meter::Usage,
}

impl JobFigures {
    /// The store's figures at the run's start plus this run's counters.
    pub(crate) fn new(start: &StoreStats, run: &CounterSnapshot) -> JobFigures {
        let ok = start.ok + run.ok;
        let failed = start.failed + run.failed;
        let ids_planned = start.ids_planned + run.ids_planned;
        let pending = ids_planned.saturating_sub(ok + failed);
        let rows_read = start.rows_read + run.rows_planned;
        JobFigures {
            ok,
            failed,
            pending,
            ids_planned,
            buckets_planned: start.buckets_planned + run.buckets_planned,
            buckets_committed: start.buckets_committed + run.buckets_committed,
            rows_read,
            rows_done: rows_read.saturating_sub(pending),
            usage: start.usage + run.usage,
        }
    }

    /// Seconds until every row of a `total`-row input is settled, at `rows_per_second`.
    ///
    /// A paginated job needs nothing more: an ID settles after its last page, so the rows
    /// settled per second already take in the calls of all their pages (how many pages an
    /// ID has is known only at its last).
    pub(crate) fn eta(&self, total: Option<u64>, rows_per_second: f64) -> Option<u64> {
        let left = total?.saturating_sub(self.rows_done);
        if left == 0 {
            return Some(0);
        }
        (rows_per_second > 0.0).then(|| (left as f64 / rows_per_second).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn job_figures_add_the_runs_work_to_the_stores_and_give_an_eta() {
        let start = StoreStats {
            ok: 100,
            failed: 10,
            ids_planned: 150,
            rows_read: 160,
            buckets_planned: 2,
            buckets_committed: 1,
            ..StoreStats::default()
        };
        let run = CounterSnapshot {
            ok: 40,
            failed: 5,
            ids_planned: 50,
            rows_planned: 50,
            buckets_planned: 1,
            buckets_committed: 2,
            ..CounterSnapshot::default()
        };
        let f = JobFigures::new(&start, &run);
        assert_eq!((f.ok, f.failed, f.pending), (140, 15, 45));
        assert_eq!((f.rows_read, f.rows_done), (210, 165));
        assert_eq!((f.buckets_planned, f.buckets_committed), (3, 3));
        assert_eq!(f.eta(Some(265), 10.0), Some(10));
        assert_eq!(f.eta(None, 10.0), None);
        assert_eq!(f.eta(Some(265), 0.0), None);
        assert_eq!(f.eta(Some(165), 0.0), Some(0));
    }
}
