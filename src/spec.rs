//! Spec: what a job is and how a run of it goes, the types below the engine.
//!
//! A [`JobSpec`] is the part of a run that is stored at creation and read back on resume: the
//! input, its fingerprint, the bucket size, the work to do for each ID (a request, a command
//! or a library handler's name) and the retry policy. Fields that change what the job means
//! ([`JobSpec::meaning_changes`]) may never change on resume; the others (headers, retry,
//! timeouts) may, and the stored spec is updated; changes are kept in its history
//! ([`SpecChange`]). [`RunOptions`] are per-run knobs that are never stored (concurrency,
//! durability, the throttle's options and the like).
//!
//! These types sit below both the engine (which runs a spec with options) and
//! [`crate::job`] (which creates, checks and resumes jobs, and runs them through the
//! engine), so the arrows point one way. Templates are stored as written (`${API_TOKEN}` and
//! all): secrets are expanded from the environment only when a handler is built.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::answer::AnswerSpec;
use crate::credential::CredentialSpec;
use crate::input::{Cursor, Fingerprint, InputError, InputFile, InputReader, InputSpec};
use crate::serde_millis;
use crate::setting::Setting;
use crate::store::{StoreError, StoredJob};

pub use crate::handler::exec::ExecSpec;
pub use crate::handler::http::RequestSpec;
pub use crate::handler::paginate::PaginateSpec;
pub(crate) use work::WorkFields;
pub use work::{Work, WorkConflict};

mod work;

/// How failed attempts are retried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts per item, the first included (at least 1).
    pub max_attempts: u32,
    /// First backoff interval; doubles per attempt, with jitter.
    #[serde(with = "serde_millis")]
    pub initial: Duration,
    /// Largest backoff interval.
    #[serde(with = "serde_millis")]
    pub max_interval: Duration,
    /// Give up on an item once this much time has passed since its first attempt.
    #[serde(with = "serde_millis")]
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial: Duration::from_millis(500),
            max_interval: Duration::from_secs(30),
            max_elapsed: Duration::from_secs(15 * 60),
        }
    }
}

/// Everything stored about a job at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "JobSpecWire", into = "JobSpecWire")]
pub struct JobSpec {
    /// Stable job id (random at creation, kept across restarts).
    pub job_id: String,
    /// Where the IDs come from; fixed at creation.
    pub input: InputSpec,
    /// Fingerprint of the input file when the job was created (of a folder input, of its
    /// files: their total length and a hash of each one's name, length and hash), or when
    /// it last grew.
    pub fingerprint: Fingerprint,
    /// A folder input's files, in name order, as planned: read as one input, each checked on
    /// resume (none for a file input, and in specs stored before).
    pub input_files: Vec<InputFile>,
    /// Rows per bucket.
    pub bucket_size: u64,
    /// The work to do for each ID: a request (one ID each, or a batch), a command, or a
    /// library handler's name. Stored in the flat layout specs have always had.
    pub work: Work,
    /// The input columns kept of each row, for the templates' `{column}` slots and the
    /// export: fixed at creation (none in specs stored before).
    pub columns: Vec<String>,
    /// What is checked of each 2xx answer and kept of it (none in specs stored before).
    pub answer: AnswerSpec,
    /// The credentials the request or command uses, as defined (never a value; none in
    /// specs stored before).
    pub credentials: Vec<CredentialSpec>,
    /// How failed attempts are retried.
    pub retry: RetryPolicy,
    /// The calls the API allows per window, every one kept (none in specs stored before);
    /// their usage is stored with the job ([`crate::quota`]).
    pub quotas: Vec<crate::quota::Quota>,
    /// What calls cost: the prices of a token read and of one written (none: not priced;
    /// none in specs stored before).
    pub prices: Option<crate::meter::Prices>,
    /// The most the job may spend by its prices, every run and worker together (none: no
    /// budget; none in specs stored before).
    pub budget: Option<crate::meter::Money>,
    /// Unix time (ms) of creation.
    pub created_at_ms: u64,
    /// Changes of the spec since creation, oldest first.
    pub history: Vec<SpecChange>,
}

/// A [`JobSpec`] as it is stored: its work in the flat fields specs have always had, so
/// that a spec written by one version is read by another.
#[derive(Serialize, Deserialize)]
struct JobSpecWire {
    /// Stable job id (random at creation, kept across restarts).
    job_id: String,
    /// Where the IDs come from; fixed at creation.
    input: InputSpec,
    /// Fingerprint of the input file when the job was created (of a folder input, of its
    /// files: their total length and a hash of each one's name, length and hash), or when
    /// it last grew.
    fingerprint: Fingerprint,
    /// A folder input's files, in name order, as planned: read as one input, each checked on
    /// resume (none for a file input, and in specs stored before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    input_files: Vec<InputFile>,
    /// Rows per bucket.
    bucket_size: u64,
    /// The request made for each ID (for an exec job, only its `timeout` is used; unused by
    /// a job of a library handler).
    request: RequestSpec,
    /// The command run for each ID instead of a request: an exec job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exec: Option<ExecSpec>,
    /// The name a library program gave its own handler (a job built with
    /// [`Job`](crate::job::Job)), which does the work instead of a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    handler: Option<String>,
    /// The batch endpoint the request calls: several IDs per request (none in specs stored
    /// before, and for a job of one ID per request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    batch: Option<crate::handler::batch::BatchSpec>,
    /// How the pages of each ID's answer are followed (none in specs stored before, and for
    /// a job of one answer per ID). A spec with it is stored in encoding version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    paginate: Option<crate::handler::paginate::PaginateSpec>,
    /// The input columns kept of each row, for the templates' `{column}` slots and the
    /// export: fixed at creation (none in specs stored before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    columns: Vec<String>,
    /// What is checked of each 2xx answer and kept of it (none in specs stored before).
    #[serde(default, skip_serializing_if = "AnswerSpec::is_plain")]
    answer: AnswerSpec,
    /// The credentials the request or command uses, as defined (never a value; none in
    /// specs stored before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    credentials: Vec<CredentialSpec>,
    /// How failed attempts are retried.
    retry: RetryPolicy,
    /// The calls the API allows per window, every one kept (none in specs stored before);
    /// their usage is stored with the job ([`crate::quota`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    quotas: Vec<crate::quota::Quota>,
    /// What calls cost (none: not priced; none in specs stored before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prices: Option<crate::meter::Prices>,
    /// The most the job may spend (none: no budget; none in specs stored before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<crate::meter::Money>,
    /// Unix time (ms) of creation.
    created_at_ms: u64,
    /// Changes of the spec since creation, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    history: Vec<SpecChange>,
}

impl TryFrom<JobSpecWire> for JobSpec {
    type Error = WorkConflict;

    fn try_from(w: JobSpecWire) -> Result<JobSpec, WorkConflict> {
        Ok(JobSpec {
            job_id: w.job_id,
            input: w.input,
            fingerprint: w.fingerprint,
            input_files: w.input_files,
            bucket_size: w.bucket_size,
            work: Work::from_fields(WorkFields {
                request: w.request,
                exec: w.exec,
                handler: w.handler,
                batch: w.batch,
                paginate: w.paginate,
            })?,
            columns: w.columns,
            answer: w.answer,
            credentials: w.credentials,
            retry: w.retry,
            quotas: w.quotas,
            prices: w.prices,
            budget: w.budget,
            created_at_ms: w.created_at_ms,
            history: w.history,
        })
    }
}

impl From<JobSpec> for JobSpecWire {
    fn from(s: JobSpec) -> JobSpecWire {
        let WorkFields {
            request,
            exec,
            handler,
            batch,
            paginate,
        } = s.work.to_fields();
        JobSpecWire {
            job_id: s.job_id,
            input: s.input,
            fingerprint: s.fingerprint,
            input_files: s.input_files,
            bucket_size: s.bucket_size,
            request,
            exec,
            handler,
            batch,
            paginate,
            columns: s.columns,
            answer: s.answer,
            credentials: s.credentials,
            retry: s.retry,
            quotas: s.quotas,
            prices: s.prices,
            budget: s.budget,
            created_at_ms: s.created_at_ms,
            history: s.history,
        }
    }
}

/// One change of a job's spec after its creation: a changed request (with
/// `--allow-spec-change`) or a grown input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecChange {
    /// When the change was made (ms since the Unix epoch).
    pub at_ms: u64,
    /// The command that made it (`run`, `rerun`).
    pub command: String,
    /// What changed, one human line each.
    pub changes: Vec<String>,
    /// The input's fingerprint before it grew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_input: Option<Fingerprint>,
}

impl std::fmt::Display for SpecChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + Duration::from_millis(self.at_ms),
        );
        write!(f, "{at} by {}: {}", self.command, self.changes.join("; "))
    }
}

/// Default bucket size (rows per bucket).
pub const DEFAULT_BUCKET_SIZE: u64 = 1000;
/// Default whole-request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl JobSpec {
    /// A new job of `input` (fingerprinted as `fingerprint`) with every setting at its
    /// default and no work yet: a GET of an empty URL template, no command, no checks,
    /// [`DEFAULT_BUCKET_SIZE`] rows per bucket, a fresh random [`JobSpec::job_id`].
    pub fn new(input: InputSpec, fingerprint: Fingerprint) -> JobSpec {
        JobSpec {
            job_id: format!("{:016x}", rand::random::<u64>()),
            input,
            fingerprint,
            input_files: Vec::new(),
            bucket_size: DEFAULT_BUCKET_SIZE,
            work: Work::Request(work::no_request(DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT)),
            columns: Vec::new(),
            answer: AnswerSpec::default(),
            credentials: Vec::new(),
            retry: RetryPolicy::default(),
            quotas: Vec::new(),
            prices: None,
            budget: None,
            created_at_ms: crate::store::now_ms(),
            history: Vec::new(),
        }
    }

    /// Every quota the job keeps: its quotas and its budget in money (a quota of money over
    /// the whole job, valued by its prices).
    pub fn kept_quotas(&self) -> Vec<crate::quota::Quota> {
        let mut quotas = self.quotas.clone();
        if let (Some(budget), Some(prices)) = (self.budget, self.prices) {
            quotas.push(crate::quota::Quota {
                limit: budget.0,
                window: crate::quota::Window::Job,
                unit: crate::meter::Unit::Money(prices),
            });
        }
        quotas
    }

    /// What `usage` cost by the job's prices (none when it has none).
    pub fn spend(&self, usage: crate::meter::Usage) -> Option<crate::meter::Money> {
        self.prices.map(|p| p.cost(usage))
    }

    /// The columns the request or command names (`{column}`), which [`JobSpec::columns`]
    /// must hold.
    pub fn columns_used(&self) -> Vec<String> {
        match &self.work {
            Work::Library { .. } => Vec::new(),
            Work::Exec { exec, .. } => {
                let fields = self.work.to_fields();
                crate::handler::columns_used(&fields.request, Some(exec))
            }
            Work::Request(request) | Work::Batch { request, .. } | Work::Paged { request, .. } => {
                crate::handler::columns_used(request, None)
            }
        }
    }

    /// The newest encoding [`JobSpec::to_stored`] writes: this struct as JSON, version 2 for
    /// a job that pages ([`Work::Paged`]) or has a budget in money, so that a build that
    /// knows neither refuses it instead of making one request per ID or spending past the
    /// budget it would not see; version 1 for every other job, which such a build still
    /// reads.
    pub const STORED_VERSION: u32 = 2;

    /// The spec as a store keeps it (opaque to the store).
    pub fn to_stored(&self) -> StoredJob {
        let version = if self.work.paginate().is_some() || self.budget.is_some() {
            2
        } else {
            1
        };
        StoredJob {
            id: self.job_id.clone(),
            version,
            spec: serde_json::to_vec(self).expect("a job spec serializes"),
        }
    }

    /// Decode what [`JobSpec::to_stored`] wrote (version 1 or 2).
    pub fn from_stored(stored: &StoredJob) -> Result<JobSpec, StoreError> {
        if !(1..=Self::STORED_VERSION).contains(&stored.version) {
            return Err(StoreError::corrupt(format!(
                "the job's spec is stored in encoding version {}; this highwater reads version {}",
                stored.version,
                Self::STORED_VERSION
            )));
        }
        serde_json::from_slice(&stored.spec)
            .map_err(|e| StoreError::corrupt(format!("undecodable job record: {e}")))
    }

    /// A reader of the job's input from `cursor` on, reading only what the job's fingerprint
    /// covers (of a folder, the files planned), and the kept columns beside each ID.
    pub(crate) fn input_reader(&self, cursor: Cursor) -> Result<InputReader, InputError> {
        let mut reader = InputReader::open_planned(
            &self.input,
            &self.input_files,
            cursor,
            self.fingerprint.len,
        )?;
        reader.keep_columns(&self.columns)?;
        Ok(reader)
    }

    /// The fingerprint of the job's input as it is now, to compare with [`JobSpec::fingerprint`]:
    /// of a folder, of the files planned (files added since are not looked at).
    pub(crate) fn input_fingerprint_now(&self) -> Result<Fingerprint, InputError> {
        if self.input_files.is_empty() {
            Fingerprint::of_file(&self.input.path)
        } else {
            crate::input::folder_fingerprint_planned(&self.input.path, &self.input_files)
        }
    }

    /// The differences between `self` (stored) and `other` (asked for) that change what the job
    /// means, one human line each. Empty when `other` may resume this job. The input's path
    /// is not among them: a moved input is accepted when its content is unchanged (the caller
    /// checks the fingerprint).
    pub fn meaning_changes(&self, other: &JobSpec) -> Vec<String> {
        let mut out = self.fixed_changes(other);
        out.extend(self.request_changes(other));
        out.extend(self.answer.changes(&other.answer));
        out
    }

    /// Meaning changes that are never allowed (they would cut the input differently).
    pub fn fixed_changes(&self, other: &JobSpec) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |what: &dyn std::fmt::Display, a: String, b: String| {
            if a != b {
                out.push(format!("{what}: stored {a}, given {b}"));
            }
        };
        cmp(
            &"input format",
            self.input.format.to_string(),
            other.input.format.to_string(),
        );
        cmp(
            &Setting::BucketSize,
            self.bucket_size.to_string(),
            other.bucket_size.to_string(),
        );
        out
    }

    /// Changes of the request (URL, method, body): allowed with `--allow-spec-change`.
    pub fn request_changes(&self, other: &JobSpec) -> Vec<String> {
        // An exec job stores no URL: a change between the two is said once, as --exec.
        let mut out = Vec::new();
        let mut cmp = |what: &dyn std::fmt::Display, a: String, b: String| {
            if a != b {
                out.push(format!("{what}: stored {a}, given {b}"));
            }
        };
        let (a, b) = (self.work.to_fields(), other.work.to_fields());
        let command = |w: &WorkFields| {
            w.exec
                .as_ref()
                .map_or("none".into(), |e| format!("{:?}", e.command))
        };
        cmp(&Setting::Exec, command(&a), command(&b));
        let handler = |w: &WorkFields| {
            w.handler
                .as_ref()
                .map_or("none".into(), |h| format!("{h:?}"))
        };
        cmp(&"handler", handler(&a), handler(&b));
        if a.handler.is_some() && b.handler.is_some() {
            return out;
        }
        cmp(&Setting::Url, a.request.url.clone(), b.request.url.clone());
        cmp(
            &Setting::Method,
            a.request.method.clone(),
            b.request.method.clone(),
        );
        cmp(
            &Setting::Body,
            format!("{:?}", a.request.body),
            format!("{:?}", b.request.body),
        );
        let credentials = |s: &JobSpec| {
            if s.credentials.is_empty() {
                return "none".to_string();
            }
            let list: Vec<String> = s.credentials.iter().map(|c| c.to_string()).collect();
            list.join("; ")
        };
        cmp(&"credentials", credentials(self), credentials(other));
        let batch = |w: &WorkFields| {
            w.batch.as_ref().map_or("none".into(), |b| {
                format!(
                    "{} IDs per request, split {:?}, separator {:?}",
                    b.size, b.split, b.separator
                )
            })
        };
        cmp(&Setting::BatchSize, batch(&a), batch(&b));
        let paginate = |w: &WorkFields, what: fn(&PaginateSpec) -> String| {
            w.paginate.as_ref().map_or("none".into(), what)
        };
        cmp(
            &Setting::Paginate,
            paginate(&a, |p| p.style.to_string()),
            paginate(&b, |p| p.style.to_string()),
        );
        cmp(
            &Setting::Items,
            paginate(&a, |p| format!("{:?}", p.items)),
            paginate(&b, |p| format!("{:?}", p.items)),
        );
        cmp(
            &Setting::MaxPages,
            paginate(&a, |p| p.max_pages.to_string()),
            paginate(&b, |p| p.max_pages.to_string()),
        );
        out
    }
}

/// Per-run settings, never stored.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Items in flight at most (requests plus their retry waits).
    pub concurrency: usize,
    /// Skip (and record) input lines that hold no usable ID instead of stopping.
    pub skip_bad_lines: bool,
    /// After a stop signal, how long in-flight items may take to finish.
    pub shutdown_timeout: Duration,
    /// How often a progress line is logged (zero: never).
    pub progress_interval: Duration,
    /// How often a sample goes to the job's history (zero: never).
    pub history_interval: Duration,
    /// Rate limit, adaptive control and outage handling.
    pub throttle: crate::throttle::ThrottleOptions,
    /// Stop the run once more IDs than this failed permanently in it.
    pub max_failures: Option<FailureLimit>,
    /// When results and commit records are made durable.
    pub durability: Durability,
    /// The wall clock the run reads (quota windows, record timestamps): the system's by
    /// default; a test gives a [`crate::clock::SimulatedClock`]'s, and the same clock to
    /// whatever else of the run reads the date (an [`crate::handler::http::HttpHandler`]).
    pub clock: crate::clock::Clock,
}

/// When a run makes its results and commit records durable. Offset records are made durable
/// before their items are dispatched in both modes (the planner thread does it ahead of the
/// work, one flush per batch of buckets). Nothing of it is stored: a job may switch between
/// runs, and a run in one mode resumes what a crashed run in the other left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Group commit: each group of results is flushed before the next is taken, and a
    /// bucket's commit record follows the flush that covered its last result. A kill -9
    /// repeats at most [`crate::engine::max_unsynced_items`] calls
    /// ([`crate::engine::max_unsynced_items_over_network`] with a database server).
    #[default]
    Sync,
    /// `--async-progress`: results are written as they come and flushed in the background
    /// every `interval`; a bucket's commit record is written after the flush that covered its
    /// last result and is durable at the next one. A kill -9 repeats the calls of the results
    /// finished since the start of the last completed flush (about one interval) plus those
    /// in flight.
    Async {
        /// Time between background flushes.
        interval: Duration,
    },
}

/// `--max-failures`: a count, or a share of the IDs finished in the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailureLimit {
    /// At most this many IDs may fail permanently.
    Count(u64),
    /// Percent (0-100) of finished IDs, judged once at least [`FailureLimit::MIN_SAMPLE`] finished.
    Percent(f64),
}

impl FailureLimit {
    /// Finished IDs needed before a percentage is judged.
    pub const MIN_SAMPLE: u64 = 100;

    /// Whether `failed` of `finished` is past the limit.
    pub fn exceeded(&self, failed: u64, finished: u64) -> bool {
        match *self {
            FailureLimit::Count(n) => failed > n,
            FailureLimit::Percent(p) => {
                finished >= Self::MIN_SAMPLE && failed as f64 > p / 100.0 * finished as f64
            }
        }
    }
}

impl std::str::FromStr for FailureLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(p) = s.strip_suffix('%') {
            let p: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a percentage"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!("{s:?}: a percentage is between 0% and 100%"));
            }
            Ok(FailureLimit::Percent(p))
        } else {
            s.parse()
                .map(FailureLimit::Count)
                .map_err(|_| format!("{s:?} is not a count or a percentage (write 100 or 5%)"))
        }
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            concurrency: 16,
            skip_bad_lines: false,
            shutdown_timeout: Duration::from_secs(30),
            progress_interval: Duration::from_secs(30),
            history_interval: crate::history::DEFAULT_INTERVAL,
            throttle: crate::throttle::ThrottleOptions::default(),
            max_failures: None,
            durability: Durability::Sync,
            clock: crate::clock::Clock::system(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::InputFormat;

    /// A spec as versions before [`Work`] stored it: an exec job, its request beside its
    /// command.
    const STORED_EXEC_JOB: &str = r#"{"job_id":"00000000000000aa","input":{"path":"ids.txt","format":{"kind":"text"}},"fingerprint":{"len":12,"xxh3":34},"bucket_size":1000,"request":{"method":"GET","url":"","headers":[],"body":null,"connect_timeout":10000,"timeout":5000},"exec":{"command":"echo {id}","retry_exit_codes":[75]},"retry":{"max_attempts":5,"initial":500,"max_interval":30000,"max_elapsed":900000},"created_at_ms":1}"#;

    #[test]
    fn a_spec_is_stored_in_the_flat_layout_older_versions_read() {
        let spec: JobSpec = serde_json::from_str(STORED_EXEC_JOB).unwrap();
        assert_eq!(spec.work.exec().unwrap().command, "echo {id}");
        assert!(
            matches!(spec.work, Work::Exec { timeout, .. } if timeout == Duration::from_secs(5))
        );
        let again: serde_json::Value = serde_json::to_value(&spec).unwrap();
        let before: serde_json::Value = serde_json::from_str(STORED_EXEC_JOB).unwrap();
        assert_eq!(again, before, "written back as it was read");
    }

    #[test]
    fn every_kind_of_work_survives_the_store() {
        let mut spec = JobSpec::new(
            InputSpec {
                path: "ids.txt".into(),
                format: InputFormat::Text,
            },
            Fingerprint { len: 1, xxh3: 2 },
        );
        spec.work = Work::Library {
            name: "double".into(),
        };
        assert_eq!(JobSpec::from_stored(&spec.to_stored()).unwrap(), spec);
        let mut stored = spec.to_stored();
        let mut json: serde_json::Value = serde_json::from_slice(&stored.spec).unwrap();
        assert_eq!(json["handler"], "double");
        assert_eq!(
            json["request"]["method"], "GET",
            "a request is always stored"
        );
        json["handler"] = serde_json::Value::Null;
        json["exec"] = serde_json::json!({"command": "true", "retry_exit_codes": [75]});
        json["batch"] = serde_json::json!({"size": 2, "separator": ",", "split": ".[]"});
        stored.spec = serde_json::to_vec(&json).unwrap();
        let refused = JobSpec::from_stored(&stored).unwrap_err();
        assert!(refused.to_string().contains("goes with a URL"), "{refused}");
    }

    #[test]
    fn a_paged_spec_is_stored_in_version_2_and_others_stay_in_version_1() {
        let mut spec = JobSpec::new(
            InputSpec {
                path: "ids.txt".into(),
                format: InputFormat::Text,
            },
            Fingerprint { len: 1, xxh3: 2 },
        );
        assert_eq!(
            spec.to_stored().version,
            1,
            "a build that does not page reads it"
        );
        let mut budgeted = spec.clone();
        budgeted.prices = Some(crate::meter::Prices::default());
        assert_eq!(
            budgeted.to_stored().version,
            1,
            "prices alone: nothing to overspend"
        );
        budgeted.budget = Some(crate::meter::Money(5));
        let stored = budgeted.to_stored();
        assert_eq!(stored.version, 2, "a build that knows no budget refuses it");
        assert_eq!(JobSpec::from_stored(&stored).unwrap(), budgeted);
        let request = spec.work.request().unwrap().clone();
        let paginate = PaginateSpec {
            style: crate::handler::paginate::PageStyle::Link,
            items: ".[]".into(),
            max_pages: 500,
        };
        spec.work = Work::Paged {
            request,
            paginate: paginate.clone(),
        };
        let stored = spec.to_stored();
        assert_eq!(stored.version, 2);
        assert_eq!(JobSpec::from_stored(&stored).unwrap(), spec);
        let json: serde_json::Value = serde_json::from_slice(&stored.spec).unwrap();
        assert_eq!(json["paginate"]["style"]["kind"], "link");
        assert_eq!(json["paginate"]["max_pages"], 500);
        assert!(json["request"].is_object(), "the first request, as always");
        let mut later = stored.clone();
        later.version = 3;
        let refused = JobSpec::from_stored(&later).unwrap_err();
        assert!(
            refused.to_string().contains("encoding version 3"),
            "{refused}"
        );
        let mut changed = spec.clone();
        if let Work::Paged { paginate, .. } = &mut changed.work {
            paginate.max_pages = 10;
            paginate.items = ".data[]".into();
        }
        let lines = spec.meaning_changes(&changed);
        assert_eq!(
            lines,
            vec![
                "items: stored \".[]\", given \".data[]\"".to_string(),
                "max_pages: stored 500, given 10".to_string()
            ]
        );
        let mut plain = spec.clone();
        plain.work = Work::Request(plain.work.request().unwrap().clone());
        assert!(spec
            .meaning_changes(&plain)
            .contains(&"paginate: stored link, given none".to_string()));
    }
}
