//! The records of a job's history: a [`RunStart`] when a run begins and a [`Sample`] of
//! its figures every interval, one [`Record`] a line.

use serde::{Deserialize, Serialize};

/// One record of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A run began.
    Run(RunStart),
    /// A run's figures at one moment.
    Sample(Sample),
}

/// A run began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStart {
    /// The run's id, new each start (as in progress events).
    pub run_id: String,
    /// Unix milliseconds.
    pub started_ms: u64,
    /// The process id of the run.
    pub pid: u32,
    /// This worker among a shared job's; none for a job with one worker at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The job's spec as stored (secrets only as `${VAR}`: the stored spec holds no value).
    pub spec: serde_json::Value,
}

/// Answers by class, cumulative over the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answers {
    /// Answers 200 to 299.
    #[serde(rename = "2xx")]
    pub s2xx: u64,
    /// Answers 300 to 399.
    #[serde(rename = "3xx")]
    pub s3xx: u64,
    /// Answers 400 to 499.
    #[serde(rename = "4xx")]
    pub s4xx: u64,
    /// Answers 500 to 599.
    #[serde(rename = "5xx")]
    pub s5xx: u64,
    /// Attempts without an HTTP status (timeouts, connection errors and the like).
    pub transport: u64,
}

/// The run's figures at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// The run the sample belongs to.
    pub run_id: String,
    /// This worker among a shared job's, as in its [`RunStart`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// This run's counts, cumulative since its start.
    pub ok: u64,
    /// Items finished failed.
    pub failed: u64,
    /// Attempts after an item's first.
    pub retries: u64,
    /// Attempts, first tries and retries.
    pub attempts: u64,
    /// Pages of paginated IDs answered, each a call of its own (none in samples of older
    /// versions, or of a job that does not paginate).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pages: u64,
    /// Answers 429.
    pub throttled: u64,
    /// Attempts by answer class.
    pub answers: Answers,
    /// Latency percentiles (ms) of the attempts since the previous sample; none without
    /// attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    /// 90th percentile, as `p50_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90_ms: Option<f64>,
    /// 99th percentile, as `p50_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    /// The rate limit in force (requests/s; none: no limit) and what set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// What sets `rate`.
    pub rate_cause: RateCause,
    /// API calls under way at the sample.
    pub in_flight: u64,
    /// Job-wide figures: the store's at the run's start plus the run's.
    pub job_ok: u64,
    /// IDs failed, job-wide.
    pub job_failed: u64,
    /// Planned IDs without a final result, job-wide.
    pub job_pending: u64,
    /// Buckets committed, job-wide.
    pub buckets_committed: u64,
    /// Buckets planned, job-wide.
    pub buckets_planned: u64,
    /// Input rows read, job-wide (bad and duplicate rows included).
    pub rows_read: u64,
    /// Rows in the whole input, once counted; none before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_rows: Option<u64>,
}

/// What limits the run's rate at the moment of a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateCause {
    /// No limit in force.
    #[default]
    None,
    /// The rate the run was given (`--rate`), not lowered.
    Configured,
    /// The adaptive control lowered it after the API's pushback.
    Adaptive,
    /// A quota window is used up: attempts wait for it.
    Quota,
    /// A limit the API announced (rate-limit headers) is reached.
    Announced,
    /// The API is unreachable: the run probes it.
    Outage,
}

/// For serde: leave a count out while it is 0.
fn is_zero(n: &u64) -> bool {
    *n == 0
}
