//! Time spent per store and API step over an interval.

use serde::Serialize;

use super::snapshot::CounterSnapshot;

/// Time spent per store and API step over an interval, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Durations {
    /// Writing offset records (with their IDs) ahead of the work.
    pub(crate) offset_write_ms: f64,
    /// Making them durable (a sync each batch).
    pub(crate) offset_sync_ms: f64,
    /// Calling the API, summed over concurrent calls (may exceed the interval).
    pub(crate) api_ms: f64,
    /// Writing results.
    pub(crate) result_write_ms: f64,
    /// Making results durable (group commit syncs).
    pub(crate) result_sync_ms: f64,
    /// Writing commit records.
    pub(crate) commit_write_ms: f64,
}

impl Durations {
    /// Time spent per step between two snapshots (`last` taken first), in milliseconds.
    pub(crate) fn between(now: &CounterSnapshot, last: &CounterSnapshot) -> Durations {
        let ms = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1e6;
        Durations {
            offset_write_ms: ms(now.plan_write_ns, last.plan_write_ns),
            offset_sync_ms: ms(now.plan_sync_ns, last.plan_sync_ns),
            api_ms: ms(now.api_ns, last.api_ns),
            result_write_ms: ms(now.record_write_ns, last.record_write_ns),
            result_sync_ms: ms(now.result_sync_ns, last.result_sync_ns),
            commit_write_ms: ms(now.commit_write_ns, last.commit_write_ns),
        }
    }

    /// Time spent on the store (every write and sync), in milliseconds.
    pub(crate) fn store_ms(&self) -> f64 {
        self.offset_write_ms
            + self.offset_sync_ms
            + self.result_write_ms
            + self.result_sync_ms
            + self.commit_write_ms
    }
}
