//! Progress: the live counters of a run and the lines that report them.
//!
//! Owns [`Counters`] (shared, lock-free, updated by the engine's tasks) and the progress and
//! summary reports made from them. The store's figures ([`StoreStats`]) say where the job
//! stands; the counters say what this run did.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::Serialize;

use crate::store::StoreStats;

/// What this run has done so far. All fields only grow.
#[derive(Debug, Default)]
pub struct Counters {
    /// HTTP attempts made (first tries and retries).
    pub attempts: AtomicU64,
    /// Attempts after an item's first.
    pub retries: AtomicU64,
    /// Items whose final result is durable, by outcome.
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    /// Buckets committed by this run.
    pub buckets_committed: AtomicU64,
    /// Items left pending because the run stopped.
    pub abandoned: AtomicU64,
    /// Results that waited for room in the writer's queue (the store was behind).
    pub writer_full: AtomicU64,
    /// Background flushes finished (`--async-progress`).
    pub checkpoints: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CounterSnapshot {
    pub attempts: u64,
    pub retries: u64,
    pub ok: u64,
    pub failed: u64,
    pub buckets_committed: u64,
    pub abandoned: u64,
    pub writer_full: u64,
    pub checkpoints: u64,
}

impl Counters {
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            attempts: self.attempts.load(Relaxed),
            retries: self.retries.load(Relaxed),
            ok: self.ok.load(Relaxed),
            failed: self.failed.load(Relaxed),
            buckets_committed: self.buckets_committed.load(Relaxed),
            abandoned: self.abandoned.load(Relaxed),
            writer_full: self.writer_full.load(Relaxed),
            checkpoints: self.checkpoints.load(Relaxed),
        }
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
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

/// One progress line for logs.
pub fn progress_line(
    now: &CounterSnapshot,
    last: &CounterSnapshot,
    interval: Duration,
    elapsed: Duration,
) -> String {
    format!(
        "progress: {} done this run ({} ok, {} failed), {} retries, {} buckets committed, {:.1} items/s now, {:.1} items/s overall{}",
        now.done(),
        now.ok,
        now.failed,
        now.retries,
        now.buckets_committed,
        per_second(now.done() - last.done(), interval),
        per_second(now.done(), elapsed),
        if now.writer_full > last.writer_full {
            format!(
                ", the store was behind {} times",
                now.writer_full - last.writer_full
            )
        } else {
            String::new()
        },
    )
}

/// The end-of-run summary, job-wide figures first, then this run's.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub job: StoreStats,
    pub run: CounterSnapshot,
    pub elapsed_ms: u64,
    /// The run stopped on a signal before the job finished.
    pub interrupted: bool,
    /// The run stopped itself (API out too long, too many failures): why.
    pub halted: Option<String>,
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
