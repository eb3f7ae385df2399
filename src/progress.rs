//! Progress: the live counters of a run and the lines that report them.
//!
//! Owns [`Counters`] (shared, lock-free, updated by the engine's tasks) and the progress and
//! summary reports made from them. The store's figures ([`StoreStats`]) say where the job
//! stands; the counters say what this run did.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::failure::{ErrorClass, Failure};
use crate::handler::Answered;
use crate::quota::pacer::{AnnouncedLimits, PolicyState};
use crate::quota::QuotaState;
use crate::setting::Setting;
use crate::store::StoreStats;
use crate::throttle::Throttle;

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

/// Upper bounds (seconds) of the request latency histogram's buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Attempts by outcome and their latencies, lock-free (one atomic per status code).
#[derive(Debug)]
pub struct HttpStats {
    /// Answers by HTTP status, index = status - 100 (100..=599).
    by_status: Vec<AtomicU64>,
    /// Failed attempts without an HTTP status, by [`ErrorClass::ALL`] index.
    by_class: [AtomicU64; ErrorClass::ALL.len()],
    /// Attempts per latency bucket: one count per [`LATENCY_BUCKETS`] bound (each bucket
    /// on its own, not cumulative; [`HttpStats::latency`] sums them), then the overflow.
    latency: [AtomicU64; 13],
    latency_sum_us: AtomicU64,
}

impl Default for HttpStats {
    fn default() -> Self {
        HttpStats {
            by_status: (100..600).map(|_| AtomicU64::new(0)).collect(),
            by_class: Default::default(),
            latency: Default::default(),
            latency_sum_us: AtomicU64::new(0),
        }
    }
}

impl HttpStats {
    /// Count one attempt that took `elapsed`.
    ///
    /// An attempt with an HTTP status counts under its status; a failure without one under
    /// its class; a success without one (an exec or closure handler's) only in the latencies.
    pub fn observe<T: Answered>(&self, result: &Result<T, Failure>, elapsed: Duration) {
        let status = match result {
            Ok(o) => o.status(),
            Err(e) => e.status,
        };
        match (status, result) {
            (Some(s), _) if (100..600).contains(&s) => {
                self.by_status[usize::from(s - 100)].fetch_add(1, Relaxed);
            }
            (_, Err(e)) => {
                let i = ErrorClass::ALL.iter().position(|c| *c == e.class);
                self.by_class[i.unwrap_or(0)].fetch_add(1, Relaxed);
            }
            (_, Ok(_)) => {}
        }
        let secs = elapsed.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.latency[i].fetch_add(1, Relaxed);
        self.latency_sum_us
            .fetch_add(elapsed.as_micros() as u64, Relaxed);
    }

    /// (status, count) for every status seen.
    pub fn statuses(&self) -> Vec<(u16, u64)> {
        self.by_status
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u16 + 100, n.load(Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// (class, count) of attempts without a usable HTTP status.
    pub fn classes(&self) -> Vec<(ErrorClass, u64)> {
        ErrorClass::ALL
            .iter()
            .zip(&self.by_class)
            .map(|(c, n)| (*c, n.load(Relaxed)))
            .collect()
    }

    /// Cumulative counts per [`LATENCY_BUCKETS`] bound, then the total; and the sum in
    /// seconds.
    pub fn latency(&self) -> (Vec<u64>, u64, f64) {
        let mut cumulative = Vec::with_capacity(LATENCY_BUCKETS.len());
        let mut total = 0;
        for (i, n) in self.latency.iter().enumerate() {
            total += n.load(Relaxed);
            if i < LATENCY_BUCKETS.len() {
                cumulative.push(total);
            }
        }
        let sum = self.latency_sum_us.load(Relaxed) as f64 / 1e6;
        (cumulative, total, sum)
    }
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CounterSnapshot {
    /// See [`Counters::attempts`].
    pub attempts: u64,
    /// See [`Counters::retries`].
    pub retries: u64,
    /// See [`Counters::ok`].
    pub ok: u64,
    /// See [`Counters::failed`].
    pub failed: u64,
    /// See [`Counters::buckets_committed`].
    pub buckets_committed: u64,
    /// See [`Counters::abandoned`].
    pub abandoned: u64,
    /// See [`Counters::buckets_planned`].
    pub buckets_planned: u64,
    /// See [`Counters::rows_planned`].
    pub rows_planned: u64,
    /// See [`Counters::ids_planned`].
    pub ids_planned: u64,
    /// See [`Counters::in_flight`] (a gauge).
    pub in_flight: u64,
    /// See [`Counters::writer_backpressure`].
    pub writer_backpressure: u64,
    /// Answers 429 (from the throttle's count).
    pub throttled: u64,
    /// Answers 503 (from the throttle's count).
    pub unavailable: u64,
    /// Refusals taken as their IDs' rather than the rate's (from the throttle's count).
    pub refused_ids: u64,
    /// See [`Counters::plan_write_ns`].
    pub plan_write_ns: u64,
    /// See [`Counters::plan_sync_ns`].
    pub plan_sync_ns: u64,
    /// See [`Counters::api_ns`].
    pub api_ns: u64,
    /// See [`Counters::record_write_ns`].
    pub record_write_ns: u64,
    /// See [`Counters::result_sync_ns`].
    pub result_sync_ns: u64,
    /// See [`Counters::commit_write_ns`].
    pub commit_write_ns: u64,
    /// See [`Counters::store_syncs`].
    pub store_syncs: u64,
    /// See [`Counters::checkpoints`].
    pub checkpoints: u64,
}

impl Counters {
    /// Read every counter (each load relaxed: the copy is not one atomic moment) and the throttle's answer counts.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            attempts: self.attempts.load(Relaxed),
            retries: self.retries.load(Relaxed),
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
    pub fn attach_throttle(&self, throttle: Arc<Throttle>) {
        let _ = self.throttle.set(AttachedThrottle(throttle));
    }

    /// Called by the engine once it made the run's quota gate: where its quotas stand.
    pub fn attach_quotas(&self, states: Arc<std::sync::Mutex<Vec<QuotaState>>>) {
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
    pub fn attach_announced(&self, limits: Arc<AnnouncedLimits>) {
        let _ = self.announced.set(limits);
    }

    /// Where the limits the API announced stand (none before any answer announced one).
    pub fn announced_states(&self) -> Vec<PolicyState> {
        self.announced.get().map_or_else(Vec::new, |a| a.states())
    }

    /// The run's throttle, once the run started.
    pub fn throttle(&self) -> Option<&Arc<Throttle>> {
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

impl CounterSnapshot {
    /// Items finished by this run.
    pub fn done(&self) -> u64 {
        self.ok + self.failed
    }
}

/// Items per second, 0 for an empty interval.
pub fn per_second(n: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        n as f64 / secs
    }
}

/// Job-wide figures during a run: the store's at the start plus what this run did since,
/// so that nothing walks the store while the run goes on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct JobFigures {
    /// Items with a final ok result, job-wide.
    pub ok: u64,
    /// Items with a final failed result, job-wide.
    pub failed: u64,
    /// Planned IDs without a final result yet (the input's unread rest not included).
    pub pending: u64,
    /// Unique IDs planned, job-wide.
    pub ids_planned: u64,
    /// Buckets planned, job-wide.
    pub buckets_planned: u64,
    /// Buckets committed, job-wide.
    pub buckets_committed: u64,
    /// Rows read from the input (bad and duplicate rows included).
    pub rows_read: u64,
    /// Rows settled: read, and their ID done (or a duplicate, or a bad line).
    pub rows_done: u64,
}

impl JobFigures {
    /// The store's figures at the run's start plus this run's counters.
    pub fn new(start: &StoreStats, run: &CounterSnapshot) -> JobFigures {
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
        }
    }

    /// Seconds until every row of a `total`-row input is settled, at `rows_per_second`.
    pub fn eta(&self, total: Option<u64>, rows_per_second: f64) -> Option<u64> {
        let left = total?.saturating_sub(self.rows_done);
        if left == 0 {
            return Some(0);
        }
        (rows_per_second > 0.0).then(|| (left as f64 / rows_per_second).ceil() as u64)
    }
}

/// Time spent per store and API step over an interval, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Durations {
    /// Writing offset records (with their IDs) ahead of the work.
    pub offset_write_ms: f64,
    /// Making them durable (a sync each batch).
    pub offset_sync_ms: f64,
    /// Calling the API, summed over concurrent calls (may exceed the interval).
    pub api_ms: f64,
    /// Writing results.
    pub result_write_ms: f64,
    /// Making results durable (group commit syncs).
    pub result_sync_ms: f64,
    /// Writing commit records.
    pub commit_write_ms: f64,
}

impl Durations {
    /// Time spent per step between two snapshots (`last` taken first), in milliseconds.
    pub fn between(now: &CounterSnapshot, last: &CounterSnapshot) -> Durations {
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
    pub fn store_ms(&self) -> f64 {
        self.offset_write_ms
            + self.offset_sync_ms
            + self.result_write_ms
            + self.result_sync_ms
            + self.commit_write_ms
    }
}

/// One progress event: what a log reader needs to judge a run, in the spirit of Spark's
/// `StreamingQueryProgress`. Figures named `run_*` and the rates and durations are this
/// run's (the rates and durations over the last interval); the others are job-wide.
#[derive(Debug, Clone, Serialize)]
pub struct ProgressEvent {
    /// Always "progress", to tell these lines from log lines.
    pub event: &'static str,
    /// Stable across restarts.
    pub job_id: String,
    /// New each start.
    pub run_id: String,
    /// RFC 3339, UTC.
    pub timestamp: String,
    /// The last event of the run.
    pub last: bool,
    /// Seconds since the run started.
    pub elapsed_s: f64,
    /// Seconds since the previous event.
    pub interval_s: f64,
    /// Buckets committed, job-wide.
    pub buckets_committed: u64,
    /// Buckets planned, job-wide.
    pub buckets_planned: u64,
    /// Items with a final ok result, job-wide.
    pub ok: u64,
    /// Items with a final failed result, job-wide.
    pub failed: u64,
    /// Planned IDs without a final result yet, job-wide.
    pub pending: u64,
    /// Input rows read, job-wide (bad and duplicate rows included).
    pub rows_read: u64,
    /// Rows in the whole input, once counted in the background.
    pub input_rows: Option<u64>,
    /// Seconds until every input row is settled, at the last minute's speed (quota waits
    /// included); none until `input_rows` is known, or while no row settles.
    pub eta_s: Option<u64>,
    /// Items this run finished ok.
    pub run_ok: u64,
    /// Items this run finished failed.
    pub run_failed: u64,
    /// Input rows the planner read per second over the interval.
    pub input_rows_per_second: f64,
    /// Items finished (ok or failed) per second over the interval.
    pub processed_items_per_second: f64,
    /// Attempts (first tries and retries) per second over the interval.
    pub attempts_per_second: f64,
    /// The rate limit in force (requests/s); none when unlimited.
    pub effective_rate: Option<f64>,
    /// `--rate`, the ceiling.
    pub configured_rate: Option<f64>,
    /// API calls under way at the event.
    pub in_flight: u64,
    /// Retries over the run.
    pub retries: u64,
    /// Answers 429 over the run.
    pub throttled: u64,
    /// Answers 503 over the run.
    pub unavailable: u64,
    /// Times the result writer's queue was full over the run.
    pub writer_backpressure: u64,
    /// Store syncs over the run.
    pub store_syncs: u64,
    /// Background flushes finished over the run (`--async-progress`; 0 otherwise).
    pub checkpoints: u64,
    /// Time per step over the interval.
    pub duration_ms: Durations,
    /// Where the job's quotas stand (none without quotas).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<QuotaState>,
    /// The limits the API announced in its answers' headers (none if it announces none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub announced: Vec<PolicyState>,
}

impl ProgressEvent {
    /// The human line.
    pub fn render(&self) -> String {
        let mut line = format!(
            "progress: {} ok, {} failed, {} pending; {} of {} buckets committed; {:.1} items/s, {:.1} rows/s",
            self.ok,
            self.failed,
            self.pending,
            self.buckets_committed,
            self.buckets_planned,
            self.processed_items_per_second,
            self.input_rows_per_second,
        );
        if let Some(rate) = self.effective_rate {
            line.push_str(&format!(", rate limit {rate:.1}/s"));
        }
        match (self.input_rows, self.eta_s) {
            (Some(total), Some(eta)) => line.push_str(&format!(
                ", {} of {total} rows done, ETA {}",
                self.rows_read.saturating_sub(self.pending),
                humantime::format_duration(Duration::from_secs(eta))
            )),
            (Some(total), None) => line.push_str(&format!(", {total} rows in the input")),
            _ => {}
        }
        line.push_str(&format!(
            "; this run {} ok, {} failed, {} retries, {} answers 429, {} answers 503, {} in flight",
            self.run_ok,
            self.run_failed,
            self.retries,
            self.throttled,
            self.unavailable,
            self.in_flight
        ));
        let d = &self.duration_ms;
        line.push_str(&format!(
            "; time: API {:.0} ms, offsets {:.0}+{:.0} ms (write+sync), results {:.0}+{:.0} ms, commits {:.0} ms",
            d.api_ms, d.offset_write_ms, d.offset_sync_ms, d.result_write_ms, d.result_sync_ms, d.commit_write_ms
        ));
        for q in &self.quotas {
            line.push_str("; ");
            line.push_str(&q.render());
        }
        for a in &self.announced {
            line.push_str("; ");
            line.push_str(&a.render());
        }
        line
    }
}

/// What limited a run over an interval.
#[derive(Debug, Clone, Copy, Default)]
pub struct IntervalLoad {
    /// The interval's length in seconds.
    pub seconds: f64,
    /// Attempts started over the interval.
    pub attempts: u64,
    /// API calls under way at its end.
    pub in_flight: u64,
    /// Answers 429 over the interval.
    pub throttled: u64,
    /// Answers 503 over the interval.
    pub unavailable: u64,
    /// Refusals (503, 529, timeouts) over the interval taken as their IDs', not the rate's.
    pub refused_ids: u64,
    /// Time per step over the interval.
    pub durations: Durations,
    /// Times the result writer's queue was full over the interval.
    pub backpressure: u64,
    /// The run's concurrency cap (API calls at once).
    pub concurrency: usize,
    /// The API is out (the outage gate holds attempts back).
    pub outage: bool,
}

/// Why a run went slower than `configured` requests per second over an interval, if it
/// did (below 80% of it). The first cause that fits wins: the API out, 429s, the adaptive
/// rate down, latency against the concurrency cap, the store.
pub fn behind(configured: f64, effective: Option<f64>, load: &IntervalLoad) -> Option<String> {
    if load.seconds <= 0.0 {
        return None;
    }
    let achieved = load.attempts as f64 / load.seconds;
    if achieved >= 0.8 * configured {
        return None;
    }
    let head = format!(
        "falling behind: {achieved:.1} requests/s over the last {:.0}s, {} is {configured:.1}/s",
        load.seconds,
        Setting::Rate
    );
    let latency_ms = if load.attempts > 0 {
        load.durations.api_ms / load.attempts as f64
    } else {
        0.0
    };
    let store_s = load.durations.store_ms() / 1e3;
    let cause = if load.outage {
        "the API is out (attempts wait for a probe to get through)".to_string()
    } else if load.throttled == 0
        && load.unavailable > 0
        && 2 * load.refused_ids >= load.unavailable
    {
        format!(
            "a few IDs refused every time: the API answered 503 {} times, {} of them refusals of the same IDs again while others succeed (not overload: the rate is not lowered for them, but their retries use part of it); the adaptive rate is {}",
            load.unavailable,
            load.refused_ids.min(load.unavailable),
            effective.map_or("unlimited".into(), |r| format!("{r:.1}/s"))
        )
    } else if load.throttled > 0 || load.unavailable > 0 {
        let answers: Vec<String> = [(503, load.unavailable), (429, load.throttled)]
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(status, n)| format!("{status} {n} times"))
            .collect();
        format!(
            "API pushback (the API overloaded): the API answered {}; the adaptive rate is {}",
            answers.join(" and "),
            effective.map_or("unlimited".into(), |r| format!("{r:.1}/s"))
        )
    } else if let Some(rate) = effective.filter(|r| *r < 0.8 * configured) {
        format!("the adaptive rate is down to {rate:.1}/s after API pushback (429 or 503 answers, timeouts or rising latency)")
    } else if latency_ms > 0.0 && configured * latency_ms / 1e3 > 0.8 * load.concurrency as f64 {
        format!(
            "API latency: {latency_ms:.0} ms per call with {} {} allows about {:.1}/s",
            Setting::Concurrency,
            load.concurrency,
            load.concurrency as f64 * 1e3 / latency_ms
        )
    } else if load.backpressure > 0 || store_s > 0.5 * load.seconds {
        format!(
            "store writes: {store_s:.1}s spent writing and syncing, the result queue was full {} times",
            load.backpressure
        )
    } else {
        "the input: the planner hands over fewer items than the rate allows".to_string()
    };
    Some(format!("{head}: {cause}"))
}

/// The falling-behind warning for a sustained shortfall only: two intervals in a row below
/// the rate. An idle interval (no attempt made, none in flight, the API not out: the run
/// starting up, or nothing to do) is neither behind nor on time and resets the count; so
/// does the tail of a job, where too few items are left to keep the rate.
#[derive(Debug, Default)]
pub struct Sustained {
    /// Intervals in a row below the rate.
    behind: u32,
}

impl Sustained {
    /// The warning for this interval, if the run has now been behind for two in a row.
    pub fn check(
        &mut self,
        configured: f64,
        effective: Option<f64>,
        load: &IntervalLoad,
        tail: bool,
    ) -> Option<String> {
        let idle = load.attempts == 0 && load.in_flight == 0 && !load.outage;
        let warning = (!idle && !tail)
            .then(|| behind(configured, effective, load))
            .flatten();
        match warning {
            Some(w) => {
                self.behind += 1;
                (self.behind >= 2).then_some(w)
            }
            None => {
                self.behind = 0;
                None
            }
        }
    }
}

/// The end-of-run summary, job-wide figures first, then this run's.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Where the job stands at the end, from the store.
    pub job: StoreStats,
    /// What this run did.
    pub run: CounterSnapshot,
    /// How long this run took.
    pub elapsed_ms: u64,
    /// The run stopped on a signal before the job finished.
    pub interrupted: bool,
    /// The run stopped itself (API out too long, too many failures, a rejected
    /// credential): what kind of halt, and why.
    pub halted: Option<Halted>,
}

/// What made a run stop itself. A front end maps each kind to its outcome (the command
/// line: an exit code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HaltKind {
    /// A failure of the run itself (a worker panicked, the store failed).
    Internal,
    /// The API (or a credential's source) was out of reach for longer than allowed.
    Outage,
    /// More IDs failed permanently than allowed.
    Failures,
    /// The job's credential was rejected: it must be fixed before the job resumes.
    CredentialRejected,
    /// The job's budget (a quota over the whole job) is spent: a larger one continues it.
    BudgetSpent,
    /// The API says the account is out of credit: the job resumes once credit is added.
    OutOfCredit,
}

/// A run's halt: its kind and the message that says why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Halted {
    /// The kind, which decides the outcome.
    pub kind: HaltKind,
    /// The message for the user.
    pub reason: String,
}

impl std::fmt::Display for Halted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl RunSummary {
    /// Human text, several lines.
    pub fn render(&self) -> String {
        let elapsed = Duration::from_millis(self.elapsed_ms);
        let j = &self.job;
        let state = if j.finished() {
            "finished"
        } else if self.halted.is_some() {
            "halted (resume with the same command once the cause is fixed)"
        } else if self.interrupted {
            "stopped (resume with the same command)"
        } else {
            "not finished"
        };
        format!(
            "job {state}: {} ok, {} failed, {} pending, {} duplicates, {} bad lines; {} of {} buckets committed\n\
             this run: {} items ({} ok, {} failed) in {:.1}s, {:.1} items/s, {} attempts ({} retries)",
            j.ok,
            j.failed,
            j.pending,
            j.duplicates,
            j.bad_lines,
            j.buckets_committed,
            j.buckets_planned,
            self.run.done(),
            self.run.ok,
            self.run.failed,
            elapsed.as_secs_f64(),
            per_second(self.run.done(), elapsed),
            self.run.attempts,
            self.run.retries,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(attempts: u64) -> IntervalLoad {
        IntervalLoad {
            seconds: 10.0,
            attempts,
            concurrency: 16,
            ..IntervalLoad::default()
        }
    }

    #[test]
    fn a_run_at_its_rate_is_not_behind() {
        assert_eq!(behind(100.0, Some(100.0), &load(900)), None);
    }

    #[test]
    fn falling_behind_names_the_cause() {
        let why = |l: &IntervalLoad, eff: Option<f64>| behind(100.0, eff, l).unwrap();
        let outage = IntervalLoad {
            outage: true,
            ..load(10)
        };
        assert!(why(&outage, Some(100.0)).contains("the API is out"));
        let throttled = IntervalLoad {
            throttled: 40,
            ..load(300)
        };
        let w = why(&throttled, Some(30.0));
        assert!(w.contains("429 40 times") && w.contains("30.0/s"), "{w}");
        // A rate limiter answering 503 (nginx's limit_req by default) is pushback too, named.
        let unavailable = IntervalLoad {
            unavailable: 25,
            ..load(300)
        };
        let w = why(&unavailable, Some(30.0));
        assert!(
            w.contains("pushback (the API overloaded)")
                && w.contains("503 25 times")
                && !w.contains("429"),
            "{w}"
        );
        // 503s that the throttle found to repeat on the same IDs are named as such.
        let same_ids = IntervalLoad {
            unavailable: 25,
            refused_ids: 20,
            ..load(300)
        };
        let w = why(&same_ids, Some(100.0));
        assert!(
            w.contains("a few IDs refused every time")
                && w.contains("503 25 times")
                && !w.contains("overloaded"),
            "{w}"
        );
        assert!(why(&load(300), Some(30.0)).contains("adaptive rate is down to 30.0/s"));
        // 16 in flight at 400 ms each: 40/s at most.
        let slow = IntervalLoad {
            durations: Durations {
                api_ms: 400.0 * 400.0,
                ..Durations::default()
            },
            ..load(400)
        };
        let w = why(&slow, Some(100.0));
        assert!(
            w.contains("API latency: 400 ms")
                && w.contains(&format!("{} 16", Setting::Concurrency)),
            "{w}"
        );
        let store = IntervalLoad {
            durations: Durations {
                api_ms: 400.0,
                result_sync_ms: 8000.0,
                ..Durations::default()
            },
            backpressure: 12,
            ..load(400)
        };
        let w = why(&store, Some(100.0));
        assert!(
            w.contains("store writes") && w.contains("full 12 times"),
            "{w}"
        );
        assert!(why(&load(0), Some(100.0)).contains("the input"));
    }

    #[test]
    fn only_a_sustained_shortfall_is_warned_about_and_idle_intervals_never() {
        let mut s = Sustained::default();
        let idle = load(0);
        let slow = load(100);
        let busy_idle = IntervalLoad {
            in_flight: 16,
            ..load(0)
        };
        // Start-up: nothing sent yet, over and over: never a warning.
        for _ in 0..3 {
            assert_eq!(s.check(100.0, Some(100.0), &idle, false), None);
        }
        // One slow interval is not sustained; the second in a row is.
        assert_eq!(s.check(100.0, Some(100.0), &slow, false), None);
        let w = s.check(100.0, Some(100.0), &slow, false).unwrap();
        assert!(w.contains("falling behind"), "{w}");
        assert!(s.check(100.0, Some(100.0), &slow, false).is_some());
        // An interval on time, an idle one or the tail resets the count.
        for reset in [load(900), idle] {
            assert_eq!(s.check(100.0, Some(100.0), &reset, false), None);
            assert_eq!(s.check(100.0, Some(100.0), &slow, false), None);
            assert!(s.check(100.0, Some(100.0), &slow, false).is_some());
        }
        assert_eq!(s.check(100.0, Some(100.0), &slow, true), None);
        assert_eq!(s.check(100.0, Some(100.0), &slow, false), None);
        // Calls stuck in flight with none started is not idle.
        assert_eq!(s.check(100.0, Some(100.0), &load(900), false), None);
        assert_eq!(s.check(100.0, Some(100.0), &busy_idle, false), None);
        assert!(s.check(100.0, Some(100.0), &busy_idle, false).is_some());
    }

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
