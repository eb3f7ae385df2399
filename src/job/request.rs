//! [`JobRequest`]: what a caller asks for (a new job, or a resume with changed operational
//! settings), before it is checked against the stored job; and the defaults of a new job.

use std::time::Duration;

use crate::answer::AnswerSpec;
use crate::handler::exec::{ExecSpec, DEFAULT_RETRY_EXIT_CODES};
use crate::input::{Fingerprint, InputSpec};
use crate::setting::Setting;
use crate::spec::{JobSpec, Work, DEFAULT_BUCKET_SIZE};

use super::error::JobError;

/// Retry settings asked for on the command line; unset fields keep the stored (or default) ones.
#[derive(Debug, Clone, Default)]
pub struct RetryOverrides {
    /// Attempts per item, the first included.
    pub max_attempts: Option<u32>,
    /// First backoff interval.
    pub initial: Option<Duration>,
    /// Largest backoff interval.
    pub max_interval: Option<Duration>,
    /// Give up on an item this long after its first attempt.
    pub max_elapsed: Option<Duration>,
}

/// What a `run` asks for: a new job, or a resume with possibly changed operational settings.
/// Unset fields keep the stored values (resume) or take the defaults (creation).
#[derive(Debug, Clone, Default)]
pub struct JobRequest {
    /// Where the IDs come from; fixed at creation, a resume may only point at the same input.
    pub input: Option<InputSpec>,
    /// Rows per bucket; fixed at creation.
    pub bucket_size: Option<u64>,
    /// HTTP method, any case (stored upper case; default GET).
    pub method: Option<String>,
    /// URL template of an HTTP job (see [`RequestSpec::url`](crate::handler::http::RequestSpec::url)).
    pub url: Option<String>,
    /// The command of an exec job (in place of `url`).
    pub exec: Option<String>,
    /// Exit codes of an exec job's command that are retried.
    pub retry_exit_codes: Option<Vec<i32>>,
    /// A library handler's name, in place of `url` (see [`Work::Library`]).
    pub handler: Option<String>,
    /// Header templates, `Name: value`; given, they replace the stored ones.
    pub headers: Option<Vec<String>>,
    /// Body template (`{id}` JSON-escaped); given, it replaces the stored one.
    pub body: Option<String>,
    /// The credentials the request or command uses (`None` keeps the stored ones).
    pub credentials: Option<Vec<crate::credential::CredentialSpec>>,
    /// Input columns to keep of each row beside those the templates name (for the export):
    /// fixed at creation.
    pub keep_columns: Option<Vec<String>>,
    /// The batch endpoint to call instead of one request per ID (`None` keeps the stored
    /// one, or none).
    pub batch: Option<crate::handler::batch::BatchSpec>,
    /// How the pages of each ID's answer are followed (`None` keeps the stored way, or
    /// none).
    pub paginate: Option<crate::handler::paginate::PaginateSpec>,
    /// TCP connect timeout.
    pub connect_timeout: Option<Duration>,
    /// Whole-request timeout (an exec job's: the process's).
    pub timeout: Option<Duration>,
    /// Retry settings asked for.
    pub retry: RetryOverrides,
    /// Answer checks asked for; unset fields keep the stored ones.
    pub answer: AnswerRequest,
    /// The quotas to keep, replacing the stored ones (a change is recorded in the spec
    /// history); `None` keeps the stored ones.
    pub quotas: Option<Vec<crate::quota::Quota>>,
    /// The price of a token read, replacing the stored one (`None` keeps it).
    pub price_input: Option<crate::meter::Price>,
    /// The price of a token written, replacing the stored one (`None` keeps it).
    pub price_output: Option<crate::meter::Price>,
    /// The job's budget in money: `Some(None)` removes it, `None` keeps the stored one.
    pub budget: Option<Option<crate::meter::Money>>,
    /// Accept a changed URL, command, method, body or answer check (recorded in the spec history).
    pub allow_spec_change: bool,
    /// The command asking ("run", "rerun"), for the spec history.
    pub command: String,
}

/// Answer checks asked for on the command line: `None` keeps the stored (or no) check, an
/// empty program removes it.
#[derive(Debug, Clone, Default)]
pub struct AnswerRequest {
    /// A body that is not JSON is a retryable failure.
    pub expect_json: Option<bool>,
    /// jq program: true fails the ID for good.
    pub fail_if: Option<String>,
    /// jq program: true retries the attempt.
    pub retry_if: Option<String>,
    /// jq program: its output is stored instead of the body.
    pub extract: Option<String>,
    /// With `extract`: store the raw body beside its output.
    pub keep_body: Option<bool>,
    /// jq program: what a call cost, read from its answer.
    pub usage: Option<String>,
    /// jq program: what a call will cost, from its request's body.
    pub estimate: Option<String>,
}

impl AnswerRequest {
    pub(super) fn apply(&self, spec: &mut AnswerSpec) {
        let program = |asked: &Option<String>, stored: &mut Option<String>| {
            if let Some(p) = asked {
                *stored = Some(p.clone()).filter(|p| !p.trim().is_empty());
            }
        };
        if let Some(json) = self.expect_json {
            spec.expect_json = json;
        }
        program(&self.fail_if, &mut spec.fail_if);
        program(&self.retry_if, &mut spec.retry_if);
        program(&self.extract, &mut spec.extract);
        program(&self.usage, &mut spec.usage);
        program(&self.estimate, &mut spec.estimate);
        if let Some(keep) = self.keep_body {
            spec.keep_body = keep;
        }
    }
}

impl JobRequest {
    pub(super) fn apply_operational(&self, spec: &mut JobSpec) {
        match &mut spec.work {
            Work::Request(request) | Work::Batch { request, .. } | Work::Paged { request, .. } => {
                if let Some(h) = &self.headers {
                    request.headers = h.clone();
                }
                if let Some(t) = self.connect_timeout {
                    request.connect_timeout = t;
                }
                if let Some(t) = self.timeout {
                    request.timeout = t;
                }
            }
            Work::Exec {
                exec,
                timeout,
                connect_timeout,
            } => {
                if let Some(t) = self.connect_timeout {
                    *connect_timeout = t;
                }
                if let Some(t) = self.timeout {
                    *timeout = t;
                }
                if let Some(codes) = &self.retry_exit_codes {
                    exec.retry_exit_codes = codes.clone();
                }
            }
            Work::Library { .. } => {}
        }
        if let Some(q) = &self.quotas {
            spec.quotas = q.clone();
        }
        spec.prices = self.prices(spec.prices);
        if let Some(budget) = self.budget {
            spec.budget = budget;
        }
        let r = &self.retry;
        spec.retry.max_attempts = r.max_attempts.unwrap_or(spec.retry.max_attempts);
        spec.retry.initial = r.initial.unwrap_or(spec.retry.initial);
        spec.retry.max_interval = r.max_interval.unwrap_or(spec.retry.max_interval);
        spec.retry.max_elapsed = r.max_elapsed.unwrap_or(spec.retry.max_elapsed);
    }

    /// The prices the request asks for over `stored` (a price not given keeps its stored
    /// value, or none).
    pub(super) fn prices(
        &self,
        stored: Option<crate::meter::Prices>,
    ) -> Option<crate::meter::Prices> {
        if self.price_input.is_none() && self.price_output.is_none() {
            return stored;
        }
        let stored = stored.unwrap_or_default();
        Some(crate::meter::Prices {
            input: self.price_input.unwrap_or(stored.input),
            output: self.price_output.unwrap_or(stored.output),
        })
    }

    /// Prices asked for a job that has none: both, or neither (one alone would leave the
    /// other kind of token free without a word; a free kind is given as 0).
    pub(super) fn check_prices(
        &self,
        stored: Option<crate::meter::Prices>,
    ) -> Result<(), JobError> {
        if stored.is_none() && self.price_input.is_some() != self.price_output.is_some() {
            return Err(JobError::Usage(format!(
                "give both {} and {} (0 for a kind of token that is free)",
                Setting::PriceInput,
                Setting::PriceOutput
            )));
        }
        Ok(())
    }

    /// Whether the request says what to do for each ID (needed to create a job).
    pub(super) fn has_work(&self) -> bool {
        self.url.is_some() || self.exec.is_some() || self.handler.is_some()
    }

    /// The spec of a new job of `input`; a command asked with a batch endpoint is refused.
    pub(super) fn new_spec(
        &self,
        input: &InputSpec,
        fingerprint: Fingerprint,
    ) -> Result<JobSpec, JobError> {
        self.check_prices(None)?;
        let mut spec = JobSpec::new(input.clone(), fingerprint);
        spec.bucket_size = self.bucket_size.unwrap_or(DEFAULT_BUCKET_SIZE);
        let mut work = spec.work.to_fields();
        if let Some(method) = &self.method {
            work.request.method = method.to_ascii_uppercase();
        }
        work.request.url = self.url.clone().unwrap_or_default();
        work.request.body = self.body.clone();
        work.exec = self.exec.as_ref().map(|command| ExecSpec {
            command: command.clone(),
            retry_exit_codes: DEFAULT_RETRY_EXIT_CODES.to_vec(),
        });
        work.handler = self.handler.clone();
        work.batch = self.batch.clone();
        work.paginate = self.paginate.clone();
        spec.work = Work::from_fields(work).map_err(|e| JobError::Usage(e.to_string()))?;
        spec.credentials = self.credentials.clone().unwrap_or_default();
        self.answer.apply(&mut spec.answer);
        self.apply_operational(&mut spec);
        spec.columns = spec.columns_used();
        for c in self.keep_columns.iter().flatten() {
            if !spec.columns.contains(c) {
                spec.columns.push(c.clone());
            }
        }
        Ok(spec)
    }
}
