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
pub(crate) struct Counters {
    /// See [`CounterSnapshot::attempts`].
    pub(crate) attempts: AtomicU64,
    /// See [`CounterSnapshot::retries`].
    pub(crate) retries: AtomicU64,
    /// See [`CounterSnapshot::ok`].
    pub(crate) ok: AtomicU64,
    /// See [`CounterSnapshot::failed`].
    pub(crate) failed: AtomicU64,
    /// See [`CounterSnapshot::buckets_committed`].
    pub(crate) buckets_committed: AtomicU64,
    /// See [`CounterSnapshot::buckets_planned`].
    pub(crate) buckets_planned: AtomicU64,
    /// See [`CounterSnapshot::abandoned`].
    pub(crate) abandoned: AtomicU64,
    /// See [`CounterSnapshot::pages`].
    pub(crate) pages: AtomicU64,
    /// See [`CounterSnapshot::rows_planned`].
    pub(crate) rows_planned: AtomicU64,
    /// See [`CounterSnapshot::ids_planned`].
    pub(crate) ids_planned: AtomicU64,
    /// See [`CounterSnapshot::in_flight`] (a gauge: goes up and down).
    pub(crate) in_flight: AtomicU64,
    /// See [`CounterSnapshot::writer_backpressure`].
    pub(crate) writer_backpressure: AtomicU64,
    /// See [`CounterSnapshot::checkpoints`].
    pub(crate) checkpoints: AtomicU64,
    /// See [`CounterSnapshot::plan_write_ns`].
    pub(crate) plan_write_ns: AtomicU64,
    /// See [`CounterSnapshot::plan_sync_ns`].
    pub(crate) plan_sync_ns: AtomicU64,
    /// See [`CounterSnapshot::api_ns`].
    pub(crate) api_ns: AtomicU64,
    /// See [`CounterSnapshot::record_write_ns`].
    pub(crate) record_write_ns: AtomicU64,
    /// See [`CounterSnapshot::result_sync_ns`].
    pub(crate) result_sync_ns: AtomicU64,
    /// See [`CounterSnapshot::commit_write_ns`].
    pub(crate) commit_write_ns: AtomicU64,
    /// See [`CounterSnapshot::store_syncs`].
    pub(crate) store_syncs: AtomicU64,
    /// Input units (a language model's tokens) the answers of items finished ok said their
    /// calls cost.
    pub(crate) usage_input: AtomicU64,
    /// Output units, as `usage_input`.
    pub(crate) usage_output: AtomicU64,
    /// Every attempt's answer by HTTP status and error class, and its latency.
    pub(crate) http: HttpStats,
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
    pub(crate) fn snapshot(&self) -> CounterSnapshot {
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
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Add the time since `start` to a nanosecond counter.
    pub(crate) fn add_elapsed(counter: &AtomicU64, start: Instant) {
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
    pub(crate) fn quota_states(&self) -> Vec<QuotaState> {
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
    pub(crate) fn announced_states(&self) -> Vec<PolicyState> {
        self.announced.get().map_or_else(Vec::new, |a| a.states())
    }

    /// The run's throttle, once the run started.
    pub(crate) fn throttle(&self) -> Option<&Arc<Throttle>> {
        self.throttle.get().map(|t| &t.0)
    }

    /// Count one API call in flight until the guard is dropped (also when the call's task
    /// is aborted).
    pub(crate) fn in_flight_guard(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight(&self.in_flight)
    }

    /// The rate limit in force (requests/s), if any.
    pub(crate) fn effective_rate(&self) -> Option<f64> {
        self.throttle().and_then(|t| t.rate())
    }
}

/// One API call counted in [`Counters::in_flight`] while it lives.
#[must_use = "the call is counted in flight only while the guard lives"]
pub(crate) struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}
