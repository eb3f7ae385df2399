//! One progress event: the figures a log reader needs to judge a run, and its human line.

use std::time::Duration;

use serde::Serialize;

use crate::quota::pacer::PolicyState;
use crate::quota::QuotaState;

use super::durations::Durations;
use crate::meter::Usage;

/// One progress event: what a log reader needs to judge a run, in the spirit of Spark's
/// `StreamingQueryProgress`. Figures named `run_*` and the rates and durations are this
/// run's (the rates and durations over the last interval); the others are job-wide.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProgressEvent {
    /// Always "progress", to tell these lines from log lines.
    pub(crate) event: &'static str,
    /// Stable across restarts.
    pub(crate) job_id: String,
    /// New each start.
    pub(crate) run_id: String,
    /// RFC 3339, UTC.
    pub(crate) timestamp: String,
    /// The last event of the run.
    pub(crate) last: bool,
    /// Seconds since the run started.
    pub(crate) elapsed_s: f64,
    /// Seconds since the previous event.
    pub(crate) interval_s: f64,
    /// Buckets committed, job-wide.
    pub(crate) buckets_committed: u64,
    /// Buckets planned, job-wide.
    pub(crate) buckets_planned: u64,
    /// Items with a final ok result, job-wide.
    pub(crate) ok: u64,
    /// Items with a final failed result, job-wide.
    pub(crate) failed: u64,
    /// Planned IDs without a final result yet, job-wide.
    pub(crate) pending: u64,
    /// Input rows read, job-wide (bad and duplicate rows included).
    pub(crate) rows_read: u64,
    /// Rows in the whole input, once counted in the background.
    pub(crate) input_rows: Option<u64>,
    /// Seconds until every input row is settled, at the last minute's speed (quota waits
    /// included); none until `input_rows` is known, or while no row settles.
    pub(crate) eta_s: Option<u64>,
    /// Items this run finished ok.
    pub(crate) run_ok: u64,
    /// Items this run finished failed.
    pub(crate) run_failed: u64,
    /// Input rows the planner read per second over the interval.
    pub(crate) input_rows_per_second: f64,
    /// Items finished (ok or failed) per second over the interval.
    pub(crate) processed_items_per_second: f64,
    /// Attempts (first tries and retries) per second over the interval.
    pub(crate) attempts_per_second: f64,
    /// The rate limit in force (requests/s); none when unlimited.
    pub(crate) effective_rate: Option<f64>,
    /// `--rate`, the ceiling.
    pub(crate) configured_rate: Option<f64>,
    /// API calls under way at the event.
    pub(crate) in_flight: u64,
    /// Retries over the run.
    pub(crate) retries: u64,
    /// Pages of paginated IDs answered over the run (none for a job that does not page).
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) pages: u64,
    /// Answers 429 over the run.
    pub(crate) throttled: u64,
    /// Answers 503 over the run.
    pub(crate) unavailable: u64,
    /// Times the result writer's queue was full over the run.
    pub(crate) writer_backpressure: u64,
    /// Store syncs over the run.
    pub(crate) store_syncs: u64,
    /// Background flushes finished over the run (`--async-progress`; 0 otherwise).
    pub(crate) checkpoints: u64,
    /// Time per step over the interval.
    pub(crate) duration_ms: Durations,
    /// Where the job's quotas stand (none without quotas).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) quotas: Vec<QuotaState>,
    /// The limits the API announced in its answers' headers (none if it announces none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) announced: Vec<PolicyState>,
    /// What the calls cost, job-wide, as their answers said (none until one said).
    #[serde(skip_serializing_if = "Usage::is_zero")]
    pub(crate) usage: Usage,
    /// What this run's calls cost.
    #[serde(skip_serializing_if = "Usage::is_zero")]
    pub(crate) run_usage: Usage,
    /// What the job spent by its prices, its projection and its budget (none if unpriced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) spend: Option<crate::meter::Spend>,
}

impl ProgressEvent {
    /// The human line.
    pub(crate) fn render(&self) -> String {
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
        if self.pages > 0 {
            line.push_str(&format!(", {} pages", self.pages));
        }
        let d = &self.duration_ms;
        line.push_str(&format!(
            "; time: API {:.0} ms, offsets {:.0}+{:.0} ms (write+sync), results {:.0}+{:.0} ms, commits {:.0} ms",
            d.api_ms, d.offset_write_ms, d.offset_sync_ms, d.result_write_ms, d.result_sync_ms, d.commit_write_ms
        ));
        if !self.usage.is_zero() {
            line.push_str(&format!(
                "; usage {} (this run {})",
                self.usage, self.run_usage
            ));
        }
        if let Some(spend) = &self.spend {
            line.push_str("; ");
            line.push_str(&spend.render());
        }
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

/// For serde: leave a count out while it is 0.
fn is_zero(n: &u64) -> bool {
    *n == 0
}
