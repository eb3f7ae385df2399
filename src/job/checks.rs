//! The checks of a request that need no stored job: what is wrong with it whatever the job,
//! and what a new job can be checked for before anything is created (its templates, answer
//! checks, input and environment).

use super::error::JobError;
use super::handler::job_handler;
use super::request::JobRequest;
use crate::input::Fingerprint;
use crate::setting::Setting;
use crate::spec::{JobSpec, Work};

/// What is wrong with the request whatever the job: a bucket size of 0, both a URL and a
/// command, two quotas of one unit over one window.
pub(super) fn check_request(request: &JobRequest) -> Result<(), JobError> {
    if let Some(quotas) = &request.quotas {
        for (i, a) in quotas.iter().enumerate() {
            if let Some(b) = quotas[..i].iter().find(|b| b.key() == a.key()) {
                return Err(JobError::Usage(format!(
                    "{} {b} and {a} count the same window: give one",
                    Setting::Quota
                )));
            }
        }
    }
    if request.bucket_size == Some(0) {
        return Err(JobError::Usage(format!(
            "{} must be at least 1",
            Setting::BucketSize
        )));
    }
    if request.url.is_some() && request.exec.is_some() {
        return Err(JobError::Usage(format!(
            "{} and {} cannot be used together: a job either calls a URL or runs a command",
            Setting::Url,
            Setting::Exec
        )));
    }
    Ok(())
}

/// Exit codes asked for a job that runs no command.
pub(super) fn check_retry_exit_codes(request: &JobRequest, spec: &JobSpec) -> Result<(), JobError> {
    if request.retry_exit_codes.is_some() && spec.work.exec().is_none() {
        return Err(retry_exit_codes_without_command());
    }
    Ok(())
}

/// Exit codes asked for a job that runs no command: the error.
pub(super) fn retry_exit_codes_without_command() -> JobError {
    JobError::Usage(format!(
        "{} applies to a job that runs a command ({}); this job calls a URL",
        Setting::RetryExitCodes,
        Setting::Exec
    ))
}

/// Check the spec's request templates or command (their syntax, without the environment).
pub(super) fn check_work(spec: &JobSpec) -> Result<(), JobError> {
    check_metered(spec)?;
    if let Work::Library { .. } = spec.work {
        // A library program's own handler: nothing stored to check.
        return Ok(());
    }
    check_credential_names(spec)?;
    let names: Vec<&str> = spec.credentials.iter().map(|c| c.name.as_str()).collect();
    match &spec.work {
        Work::Exec { exec, .. } => crate::handler::exec::check_command(exec, &names)?,
        Work::Batch { request, batch } => {
            crate::handler::http::check_batch(request, batch, &names)?
        }
        Work::Request(request) => crate::handler::http::check_templates(request, &names)?,
        Work::Paged { request, paginate } => {
            crate::handler::http::check_templates(request, &names)?;
            crate::handler::paginate::Pager::compile(paginate)
                .map_err(|e| JobError::Usage(e.to_string()))?;
        }
        Work::Library { .. } => {}
    }
    Ok(())
}

/// A budget in money has both prices to value calls by (a free kind of token given as 0),
/// and, as quotas of tokens, a job that can tell what a call may cost before it is made:
/// neither a command's (its cost is known once it ran) nor a batch request's.
fn check_metered(spec: &JobSpec) -> Result<(), JobError> {
    let tokens = spec.quotas.iter().find(|q| q.unit.is_metered());
    if spec.budget.is_some() && spec.prices.is_none_or(|p| p.is_free()) {
        return Err(JobError::Usage(format!(
            "a {} needs the prices that value the calls: give {} and {} (per million \
             tokens)",
            Setting::Budget,
            Setting::PriceInput,
            Setting::PriceOutput
        )));
    }
    let what = match (spec.budget, tokens) {
        (Some(_), _) => Setting::Budget.to_string(),
        (None, Some(q)) => format!("{} {q}", Setting::Quota),
        (None, None) => return Ok(()),
    };
    let why = match &spec.work {
        Work::Exec { .. } => "a command's cost is known only once it ran",
        Work::Batch { .. } => "a batch request's cost is not counted per call",
        Work::Request(_) | Work::Paged { .. } | Work::Library { .. } => return Ok(()),
    };
    Err(JobError::Usage(format!(
        "{what} needs what a call may cost before it is made, and {why}: keep to a quota of calls"
    )))
}

/// Credential names that templates can use (`${NAME}`: letters, digits, `_`), each once.
pub(super) fn check_credential_names(spec: &JobSpec) -> Result<(), JobError> {
    for (i, c) in spec.credentials.iter().enumerate() {
        let valid = !c.name.is_empty()
            && !c.name.starts_with(|ch: char| ch.is_ascii_digit())
            && c.name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        if !valid {
            return Err(JobError::Usage(format!(
                "{}: {:?} is not a valid name (write NAME=..., NAME of letters, digits and _)",
                Setting::Credential(c.name.clone()),
                c.name
            )));
        }
        if spec.credentials[..i].iter().any(|d| d.name == c.name) {
            return Err(JobError::Usage(format!(
                "{} is defined twice",
                Setting::Credential(c.name.clone())
            )));
        }
    }
    Ok(())
}

/// What can be checked of a new job before its state directory exists: its request templates,
/// answer checks and bucket size, and that its input can be opened. [`super::open_job`]
/// checks the same.
pub(crate) fn check_new_job(request: &JobRequest) -> Result<(), JobError> {
    check_request(request)?;
    let (Some(input), true) = (&request.input, request.has_work()) else {
        return Ok(());
    };
    let probe = request.new_spec(input, Fingerprint { len: 0, xxh3: 0 })?;
    check_retry_exit_codes(request, &probe)?;
    check_work(&probe)?;
    crate::answer::Answer::compile(&probe.answer)?;
    if !crate::input::is_folder_input(&input.path) {
        std::fs::File::open(&input.path).map_err(|source| crate::input::InputError::Open {
            path: input.path.clone(),
            source,
        })?;
    }
    // The input must hold a first row (in its format: a CSV header with the ID column and
    // the columns kept).
    let mut reader = crate::input::InputReader::open(input, crate::input::Cursor::default())?;
    reader.keep_columns(&probe.columns)?;
    if reader.next_row()?.is_none() {
        return Err(JobError::EmptyInput(input.path.clone()));
    }
    Ok(())
}

/// Build the handler a new job's run would build, with the process environment: a
/// `${VAR}` missing from it (a misspelt name) or a program not found is refused before the
/// job is stored with it.
pub(crate) fn check_new_job_environment(request: &JobRequest) -> Result<(), JobError> {
    // A library program's job does its work with its own handler: nothing to build here.
    let (Some(input), true, None) = (&request.input, request.has_work(), &request.handler) else {
        return Ok(());
    };
    let probe = request.new_spec(input, Fingerprint { len: 0, xxh3: 0 })?;
    job_handler(&probe)?;
    Ok(())
}
