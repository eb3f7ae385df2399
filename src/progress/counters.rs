//! The run's live counters: what this run has done so far, shared lock-free by the
//! engine's tasks, and the guard that counts a call in flight.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::quota::pacer::{AnnouncedLimits, PolicyState};
use crate::quota::QuotaState;
use crate::throttle::Throttle;

use super::http_stats::HttpStats;
use super::snapshot::CounterSnapshot;
use crate::meter::Usage;

/// What this run has done so far. Every field only grows except `in_flight`, a gauge.
#[derive(Debug, Default)]
pub struct Counters {
    /// HTTP attempts made (first tries and retries).
    pub attempts: AtomicU64,
    /// Attempts after an item's first.
    pub retries: AtomicU64,
    /// Items whose final result was written to the store, by outcome: counted when written,
    /// durable at the next sync (sync mode) or the next checkpoint (`--async-progress`).
    pub ok: AtomicU64,
    /// Items whose final result is a failure (see `ok`).
    pub failed: AtomicU64,
    /// Buckets committed by this run.
    pub buckets_committed: AtomicU64,
    /// Buckets the planner wrote ahead in this run.
    pub buckets_planned: AtomicU64,
    /// Items left pending because the run stopped.
    pub abandoned: AtomicU64,
    /// Pages of paginated IDs answered (each a call of its own).
    pub pages: AtomicU64,
    /// Input rows the planner read and wrote ahead in this run (bad and duplicate rows
    /// included), and the unique IDs among them.
    pub rows_planned: AtomicU64,
    /// Unique IDs among `rows_planned`.
    pub ids_planned: AtomicU64,
    /// API calls under way now (a gauge: goes up and down).
    pub in_flight: AtomicU64,
    /// Times a finished item found the writer's queue full and had to wait (the store
    /// was behind).
    pub writer_backpressure: AtomicU64,
    /// Background flushes finished (`--async-progress`).
    pub checkpoints: AtomicU64,
    /// Time spent, in nanoseconds summed over tasks: writing offset records (the planner's
    /// `Store::plan`) and making them durable, calling the API (summed over concurrent
    /// calls), writing results, making them durable, writing commit records.
    pub plan_write_ns: AtomicU64,
    /// Making offset records durable (ns).
    pub plan_sync_ns: AtomicU64,
    /// Calling the API, summed over concurrent calls (ns).
    pub api_ns: AtomicU64,
    /// Writing results (ns).
    pub record_write_ns: AtomicU64,
    /// Making results durable (ns).
    pub result_sync_ns: AtomicU64,
    /// Writing commit records (ns).
    pub commit_write_ns: AtomicU64,
    /// Store syncs (planner and writer).
    pub store_syncs: AtomicU64,
    /// Input units (a language model's tokens) the answers of items finished ok said their
    /// calls cost.
    pub usage_input: AtomicU64,
    /// Output units, as `usage_input`.
    pub usage_output: AtomicU64,
    /// Every attempt's answer by HTTP status and error class, and its latency.
    pub http: HttpStats,
    /// The run's throttle, once the engine made it: the effective rate for reports.
    throttle: OnceLock<AttachedThrottle>,
    /// Where the job's quotas stand, once the engine made its quota gate.
    quotas: OnceLock<Arc<std::sync::Mutex<Vec<QuotaState>>>>,
    /// The limits the API announces, when the run's handler reads them.
    announced: OnceLock<Arc<AnnouncedLimits>>,
}

/// The run's throttle as [`Counters`] holds it.
struct AttachedThrottle(Arc<Throttle>);

impl std::fmt::Debug for AttachedThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Throttle")
    }
}

impl Counters {
    /// Read every counter (each load relaxed: the copy is not one atomic moment) and the throttle's answer counts.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            attempts: self.attempts.load(Relaxed),
            retries: self.retries.load(Relaxed),
            pages: self.pages.load(Relaxed),
            ok: self.ok.load(Relaxed),
            failed: self.failed.load(Relaxed),
            buckets_committed: self.buckets_committed.load(Relaxed),
            abandoned: self.abandoned.load(Relaxed),
            buckets_planned: self.buckets_planned.load(Relaxed),
            rows_planned: self.rows_planned.load(Relaxed),
            ids_planned: self.ids_planned.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            writer_backpressure: self.writer_backpressure.load(Relaxed),
            throttled: self.throttle().map_or(0, |t| t.throttled.load(Relaxed)),
            unavailable: self.throttle().map_or(0, |t| t.unavailable.load(Relaxed)),
            refused_ids: self.throttle().map_or(0, |t| t.refused_ids.load(Relaxed)),
            plan_write_ns: self.plan_write_ns.load(Relaxed),
            plan_sync_ns: self.plan_sync_ns.load(Relaxed),
            api_ns: self.api_ns.load(Relaxed),
            record_write_ns: self.record_write_ns.load(Relaxed),
            result_sync_ns: self.result_sync_ns.load(Relaxed),
            commit_write_ns: self.commit_write_ns.load(Relaxed),
            store_syncs: self.store_syncs.load(Relaxed),
            checkpoints: self.checkpoints.load(Relaxed),
            usage: Usage {
                input: self.usage_input.load(Relaxed),
                output: self.usage_output.load(Relaxed),
            },
        }
    }

    /// Add `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Add the time since `start` to a nanosecond counter.
    pub fn add_elapsed(counter: &AtomicU64, start: Instant) {
        counter.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
    }

    /// Called by the engine once it made the run's throttle.
    pub(crate) fn attach_throttle(&self, throttle: Arc<Throttle>) {
        let _ = self.throttle.set(AttachedThrottle(throttle));
    }

    /// Called by the engine once it made the run's quota gate: where its quotas stand.
    pub(crate) fn attach_quotas(&self, states: Arc<std::sync::Mutex<Vec<QuotaState>>>) {
        let _ = self.quotas.set(states);
    }

    /// Where the job's quotas stand (none without quotas, or before the run started).
    pub fn quota_states(&self) -> Vec<QuotaState> {
        self.quotas.get().map_or_else(Vec::new, |q| {
            q.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        })
    }

    /// Called by the engine when the run's handler reads the limits the API announces.
    pub(crate) fn attach_announced(&self, limits: Arc<AnnouncedLimits>) {
        let _ = self.announced.set(limits);
    }

    /// Where the limits the API announced stand (none before any answer announced one).
    pub fn announced_states(&self) -> Vec<PolicyState> {
        self.announced.get().map_or_else(Vec::new, |a| a.states())
    }

    /// The run's throttle, once the run started.
    pub(crate) fn throttle(&self) -> Option<&Arc<Throttle>> {
        self.throttle.get().map(|t| &t.0)
    }

    /// Count one API call in flight until the guard is dropped (also when the call's task
    /// is aborted).
    pub fn in_flight_guard(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight(&self.in_flight)
    }

    /// The rate limit in force (requests/s), if any.
    pub fn effective_rate(&self) -> Option<f64> {
        self.throttle().and_then(|t| t.rate())
    }
}

/// One API call counted in [`Counters::in_flight`] while it lives.
#[must_use = "the call is counted in flight only while the guard lives"]
pub struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}
