//! The end-of-run summary, and what made a run stop itself.

use std::time::Duration;

use serde::Serialize;

use crate::store::StoreStats;

use super::snapshot::{per_second, CounterSnapshot};

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
        let pages = match self.run.pages {
            0 => String::new(),
            n => format!(", {n} pages"),
        };
        format!(
            "job {state}: {} ok, {} failed, {} pending, {} duplicates, {} bad lines; {} of {} buckets committed\n\
             this run: {} items ({} ok, {} failed) in {:.1}s, {:.1} items/s, {} attempts ({} retries){pages}",
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
