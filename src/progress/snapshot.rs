//! A copy of the run's counters at one moment, and the rate made from two of them.

use std::time::Duration;

use serde::Serialize;

/// A copy of the run's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CounterSnapshot {
    /// HTTP attempts made (first tries and retries).
    pub attempts: u64,
    /// Attempts after an item's first.
    pub retries: u64,
    /// Pages of paginated IDs answered (each a call of its own).
    pub pages: u64,
    /// Items whose final result was written to the store, by outcome: counted when written,
    /// durable at the next sync (sync mode) or the next checkpoint (`--async-progress`).
    pub ok: u64,
    /// Items whose final result is a failure (see `ok`).
    pub failed: u64,
    /// Buckets committed by this run.
    pub buckets_committed: u64,
    /// Items left pending because the run stopped.
    pub abandoned: u64,
    /// Buckets the planner wrote ahead in this run.
    pub buckets_planned: u64,
    /// Input rows the planner read and wrote ahead in this run (bad and duplicate rows
    /// included), and the unique IDs among them.
    pub rows_planned: u64,
    /// Unique IDs among `rows_planned`.
    pub ids_planned: u64,
    /// API calls under way now (a gauge: goes up and down).
    pub in_flight: u64,
    /// Times a finished item found the writer's queue full and had to wait (the store
    /// was behind).
    pub writer_backpressure: u64,
    /// Answers 429 (from the throttle's count).
    pub throttled: u64,
    /// Answers 503 (from the throttle's count).
    pub unavailable: u64,
    /// Refusals taken as their IDs' rather than the rate's (from the throttle's count).
    pub refused_ids: u64,
    /// Time spent, in nanoseconds summed over tasks: writing offset records (the planner's
    /// `Store::plan`) and making them durable, calling the API (summed over concurrent
    /// calls), writing results, making them durable, writing commit records.
    pub plan_write_ns: u64,
    /// Making offset records durable (ns).
    pub plan_sync_ns: u64,
    /// Calling the API, summed over concurrent calls (ns).
    pub api_ns: u64,
    /// Writing results (ns).
    pub record_write_ns: u64,
    /// Making results durable (ns).
    pub result_sync_ns: u64,
    /// Writing commit records (ns).
    pub commit_write_ns: u64,
    /// Store syncs (planner and writer).
    pub store_syncs: u64,
    /// Background flushes finished (`--async-progress`).
    pub checkpoints: u64,
    /// Units the answers of items finished ok said their calls cost: input units (a
    /// language model's tokens) and output units.
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
