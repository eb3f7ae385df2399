//! A copy of the run's counters at one moment, and the rate made from two of them.

use std::time::Duration;

use serde::Serialize;

/// A copy of [`Counters`](super::Counters) at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CounterSnapshot {
    /// See [`Counters::attempts`](super::Counters::attempts).
    pub attempts: u64,
    /// See [`Counters::retries`](super::Counters::retries).
    pub retries: u64,
    /// See [`Counters::pages`](super::Counters::pages).
    pub pages: u64,
    /// See [`Counters::ok`](super::Counters::ok).
    pub ok: u64,
    /// See [`Counters::failed`](super::Counters::failed).
    pub failed: u64,
    /// See [`Counters::buckets_committed`](super::Counters::buckets_committed).
    pub buckets_committed: u64,
    /// See [`Counters::abandoned`](super::Counters::abandoned).
    pub abandoned: u64,
    /// See [`Counters::buckets_planned`](super::Counters::buckets_planned).
    pub buckets_planned: u64,
    /// See [`Counters::rows_planned`](super::Counters::rows_planned).
    pub rows_planned: u64,
    /// See [`Counters::ids_planned`](super::Counters::ids_planned).
    pub ids_planned: u64,
    /// See [`Counters::in_flight`](super::Counters::in_flight) (a gauge).
    pub in_flight: u64,
    /// See [`Counters::writer_backpressure`](super::Counters::writer_backpressure).
    pub writer_backpressure: u64,
    /// Answers 429 (from the throttle's count).
    pub throttled: u64,
    /// Answers 503 (from the throttle's count).
    pub unavailable: u64,
    /// Refusals taken as their IDs' rather than the rate's (from the throttle's count).
    pub refused_ids: u64,
    /// See [`Counters::plan_write_ns`](super::Counters::plan_write_ns).
    pub plan_write_ns: u64,
    /// See [`Counters::plan_sync_ns`](super::Counters::plan_sync_ns).
    pub plan_sync_ns: u64,
    /// See [`Counters::api_ns`](super::Counters::api_ns).
    pub api_ns: u64,
    /// See [`Counters::record_write_ns`](super::Counters::record_write_ns).
    pub record_write_ns: u64,
    /// See [`Counters::result_sync_ns`](super::Counters::result_sync_ns).
    pub result_sync_ns: u64,
    /// See [`Counters::commit_write_ns`](super::Counters::commit_write_ns).
    pub commit_write_ns: u64,
    /// See [`Counters::store_syncs`](super::Counters::store_syncs).
    pub store_syncs: u64,
    /// See [`Counters::checkpoints`](super::Counters::checkpoints).
    pub checkpoints: u64,
    /// See [`Counters::usage_input`](super::Counters::usage_input) and
    /// [`Counters::usage_output`](super::Counters::usage_output).
    pub usage: crate::meter::Usage,
}

impl CounterSnapshot {
    /// Items finished by this run.
    pub fn done(&self) -> u64 {
        self.ok + self.failed
    }
}

/// Items per second, 0 for an empty interval.
pub(crate) fn per_second(n: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        n as f64 / secs
    }
}
