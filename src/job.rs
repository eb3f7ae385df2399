//! The job: what a run means, validated once and stored with the state.
//!
//! A [`JobSpec`] is the part of a run that is stored at creation and read back on resume: the
//! input, its fingerprint, the bucket size, the request to make for each ID and the retry
//! policy. Fields that change what the job means ([`JobSpec::meaning_changes`]) may never change
//! on resume; the others (headers, retry, timeouts) may, and the stored spec is updated.
//! [`RunOptions`] are per-run knobs that are never stored (concurrency and the like).
//!
//! A changed URL, method or body is accepted only with `--allow-spec-change`, and an input
//! that grew by appending (its old content an unchanged prefix) is accepted: its new rows
//! are planned as new buckets. Both are recorded in the job's spec history
//! ([`SpecChange`]).
//!
//! Templates are stored as written (`${API_TOKEN}` and all): secrets are expanded from the
//! environment only when the request handler is built, never stored.

use std::time::Duration;

use crate::answer::{AnswerError, AnswerSpec};
use crate::handler::exec::DEFAULT_RETRY_EXIT_CODES;
use crate::input::{Fingerprint, InputFile, InputSpec};
use crate::setting::Setting;
use crate::store::{JobView, Store, StoreError};

pub use crate::handler::exec::ExecSpec;
pub use crate::handler::http::RequestSpec;

pub use crate::spec::{Durability, FailureLimit, JobSpec, RetryPolicy, RunOptions, SpecChange};

pub use crate::store::now_ms;

/// What a resume may change, for [`JobError::MeaningChanged`].
fn what_may_change() -> String {
    use Setting::*;
    format!(
        "operational settings such as {} may change; {}, {}, {}, {} and the answer checks ({}, {}, {}, {}, {}) may change with {}; start a new state directory for a different job",
        Concurrency, Url, Exec, Method, Body, ExpectJson, FailIf, RetryIf, Extract, KeepBody, AllowSpecChange
    )
}

/// Errors while creating or resuming a job.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("{0}")]
    Usage(String),
    #[error("the state directory holds a job that this run may not change:\n  {}\n({})", .0.join("\n  "), what_may_change())]
    MeaningChanged(Vec<String>),
    #[error("input {path} has changed since the job was created: {what} (then {then}, now {now}); only appending rows is accepted; refusing to resume against it")]
    InputChanged {
        path: std::path::PathBuf,
        what: String,
        then: Fingerprint,
        now: Fingerprint,
    },
    /// A folder input whose planned files are not all there, in the same order, any more.
    #[error("input folder changed since the job was created: {path}: {what}; refusing to resume against it")]
    FolderChanged {
        path: std::path::PathBuf,
        what: String,
    },
    #[error("input {0} holds no IDs (it is empty or only blank lines)")]
    EmptyInput(std::path::PathBuf),
    #[error(transparent)]
    Request(#[from] crate::handler::HandlerError),
    /// A malformed answer check (a jq program that does not parse).
    #[error(transparent)]
    Answer(#[from] AnswerError),
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Retry settings asked for on the command line; unset fields keep the stored (or default) ones.
#[derive(Debug, Clone, Default)]
pub struct RetryOverrides {
    pub max_attempts: Option<u32>,
    pub initial: Option<Duration>,
    pub max_interval: Option<Duration>,
    pub max_elapsed: Option<Duration>,
}

/// What a `run` asks for: a new job, or a resume with possibly changed operational settings.
/// Unset fields keep the stored values (resume) or take the defaults (creation).
#[derive(Debug, Clone, Default)]
pub struct JobRequest {
    pub input: Option<InputSpec>,
    pub bucket_size: Option<u64>,
    pub method: Option<String>,
    pub url: Option<String>,
    /// The command of an exec job (in place of `url`).
    pub exec: Option<String>,
    /// Exit codes of an exec job's command that are retried.
    pub retry_exit_codes: Option<Vec<i32>>,
    /// A library handler's name, in place of `url` (see [`JobSpec::handler`]).
    pub handler: Option<String>,
    pub headers: Option<Vec<String>>,
    pub body: Option<String>,
    /// The credentials the request or command uses (`None` keeps the stored ones).
    pub credentials: Option<Vec<crate::credential::CredentialSpec>>,
    /// Input columns to keep of each row beside those the templates name (for the export):
    /// fixed at creation.
    pub keep_columns: Option<Vec<String>>,
    /// The batch endpoint to call instead of one request per ID (`None` keeps the stored
    /// one, or none).
    pub batch: Option<crate::handler::batch::BatchSpec>,
    pub connect_timeout: Option<Duration>,
    pub timeout: Option<Duration>,
    pub retry: RetryOverrides,
    /// Answer checks asked for; unset fields keep the stored ones.
    pub answer: AnswerRequest,
    /// The quotas to keep, replacing the stored ones (a change is recorded in the spec
    /// history); `None` keeps the stored ones.
    pub quotas: Option<Vec<crate::quota::Quota>>,
    /// Accept a changed URL, command, method, body or answer check (recorded in the spec history).
    pub allow_spec_change: bool,
    /// The command asking ("run", "rerun"), for the spec history.
    pub command: String,
}

/// Answer checks asked for on the command line: `None` keeps the stored (or no) check, an
/// empty program removes it.
#[derive(Debug, Clone, Default)]
pub struct AnswerRequest {
    pub expect_json: Option<bool>,
    pub fail_if: Option<String>,
    pub retry_if: Option<String>,
    pub extract: Option<String>,
    pub keep_body: Option<bool>,
}

impl AnswerRequest {
    fn apply(&self, spec: &mut AnswerSpec) {
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
        if let Some(keep) = self.keep_body {
            spec.keep_body = keep;
        }
    }
}

/// Default bucket size (rows per bucket).
pub const DEFAULT_BUCKET_SIZE: u64 = 1000;
/// Default whole-request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl JobRequest {
    fn apply_operational(&self, spec: &mut JobSpec) {
        if let Some(h) = &self.headers {
            spec.request.headers = h.clone();
        }
        if let Some(t) = self.connect_timeout {
            spec.request.connect_timeout = t;
        }
        if let Some(t) = self.timeout {
            spec.request.timeout = t;
        }
        if let (Some(codes), Some(exec)) = (&self.retry_exit_codes, &mut spec.exec) {
            exec.retry_exit_codes = codes.clone();
        }
        if let Some(q) = &self.quotas {
            spec.quotas = q.clone();
        }
        let r = &self.retry;
        spec.retry.max_attempts = r.max_attempts.unwrap_or(spec.retry.max_attempts);
        spec.retry.initial = r.initial.unwrap_or(spec.retry.initial);
        spec.retry.max_interval = r.max_interval.unwrap_or(spec.retry.max_interval);
        spec.retry.max_elapsed = r.max_elapsed.unwrap_or(spec.retry.max_elapsed);
    }

    /// Whether the request says what to do for each ID (needed to create a job).
    fn has_work(&self) -> bool {
        self.url.is_some() || self.exec.is_some() || self.handler.is_some()
    }

    fn new_spec(&self, input: &InputSpec, fingerprint: Fingerprint) -> JobSpec {
        let mut spec = JobSpec {
            job_id: new_job_id(),
            input: input.clone(),
            fingerprint,
            input_files: Vec::new(),
            bucket_size: self.bucket_size.unwrap_or(DEFAULT_BUCKET_SIZE),
            request: RequestSpec {
                method: self
                    .method
                    .clone()
                    .unwrap_or_else(|| "GET".into())
                    .to_ascii_uppercase(),
                url: self.url.clone().unwrap_or_default(),
                headers: Vec::new(),
                body: self.body.clone(),
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                timeout: DEFAULT_TIMEOUT,
            },
            exec: self.exec.as_ref().map(|command| ExecSpec {
                command: command.clone(),
                retry_exit_codes: DEFAULT_RETRY_EXIT_CODES.to_vec(),
            }),
            handler: self.handler.clone(),
            answer: AnswerSpec::default(),
            credentials: self.credentials.clone().unwrap_or_default(),
            columns: Vec::new(),
            batch: self.batch.clone(),
            retry: RetryPolicy::default(),
            quotas: Vec::new(),
            created_at_ms: now_ms(),
            history: Vec::new(),
        };
        self.answer.apply(&mut spec.answer);
        self.apply_operational(&mut spec);
        spec.columns = spec.columns_used();
        for c in self.keep_columns.iter().flatten() {
            if !spec.columns.contains(c) {
                spec.columns.push(c.clone());
            }
        }
        spec
    }
}

/// The quotas `request` changes, as a line of the spec history.
fn quota_change(stored: &JobSpec, request: &JobRequest) -> Option<String> {
    let asked = request.quotas.as_ref().filter(|q| **q != stored.quotas)?;
    let list = |q: &[crate::quota::Quota]| {
        if q.is_empty() {
            "none".to_string()
        } else {
            q.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    Some(format!(
        "quotas changed from {} to {} (usage counted so far is kept)",
        list(&stored.quotas),
        list(asked)
    ))
}

/// What is wrong with the request whatever the job: a bucket size of 0, both a URL and a
/// command, two quotas over one window.
fn check_request(request: &JobRequest) -> Result<(), JobError> {
    if let Some(quotas) = &request.quotas {
        for (i, a) in quotas.iter().enumerate() {
            if let Some(b) = quotas[..i]
                .iter()
                .find(|b| b.window.key() == a.window.key())
            {
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
fn check_retry_exit_codes(request: &JobRequest, spec: &JobSpec) -> Result<(), JobError> {
    if request.retry_exit_codes.is_some() && spec.exec.is_none() {
        return Err(JobError::Usage(format!(
            "{} applies to a job that runs a command ({}); this job calls a URL",
            Setting::RetryExitCodes,
            Setting::Exec
        )));
    }
    Ok(())
}

/// Check the spec's request templates or command (their syntax, without the environment).
fn check_work(spec: &JobSpec) -> Result<(), JobError> {
    if spec.handler.is_some() {
        // A library program's own handler: nothing stored to check.
        return Ok(());
    }
    check_credential_names(spec)?;
    let names: Vec<&str> = spec.credentials.iter().map(|c| c.name.as_str()).collect();
    match (&spec.exec, &spec.batch) {
        (Some(_), Some(_)) => {
            return Err(JobError::Usage(format!(
                "{} goes with a URL: a command is run once per ID",
                Setting::BatchSize
            )))
        }
        (Some(exec), None) => crate::handler::exec::check_command(exec, &names)?,
        (None, Some(batch)) => crate::handler::http::check_batch(&spec.request, batch, &names)?,
        (None, None) => crate::handler::http::check_templates(&spec.request, &names)?,
    }
    Ok(())
}

/// Credential names that templates can use (`${NAME}`: letters, digits, `_`), each once.
fn check_credential_names(spec: &JobSpec) -> Result<(), JobError> {
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
/// answer checks and bucket size, and that its input can be opened. [`open_job`] checks the
/// same.
pub fn check_new_job(request: &JobRequest) -> Result<(), JobError> {
    check_request(request)?;
    let (Some(input), true) = (&request.input, request.has_work()) else {
        return Ok(());
    };
    let probe = request.new_spec(input, Fingerprint { len: 0, xxh3: 0 });
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

/// The job `store` holds, decoded.
pub async fn stored_job<S: Store>(store: &S) -> Result<Option<JobSpec>, StoreError> {
    store
        .job()
        .await?
        .map(|j| JobSpec::from_stored(&j))
        .transpose()
}

/// Build the handler a new job's run would build, with the process environment: a
/// `${VAR}` missing from it (a misspelt name) or a program not found is refused before the
/// job is stored with it.
pub fn check_new_job_environment(request: &JobRequest) -> Result<(), JobError> {
    let (Some(input), true) = (&request.input, request.has_work()) else {
        return Ok(());
    };
    let probe = request.new_spec(input, Fingerprint { len: 0, xxh3: 0 });
    job_handler(&probe)?;
    Ok(())
}

/// Create the job in `store`, or resume the one it holds, and check the input.
///
/// Creation needs `--input` and `--url` or `--exec`; it fingerprints the input and refuses an empty one.
/// Resume refuses meaning-changing flags that differ from the stored ones and an input whose
/// fingerprint changed; changed operational settings are stored.
pub async fn open_job<S: Store>(store: &S, request: &JobRequest) -> Result<JobSpec, JobError> {
    use crate::input::Cursor;
    check_request(request)?;
    match stored_job(store).await? {
        None => {
            let (Some(input), true) = (&request.input, request.has_work()) else {
                return Err(JobError::Usage(format!(
                    "this state directory holds no job yet: give {} and {} (or {}) to create one",
                    Setting::Input,
                    Setting::Url,
                    Setting::Exec
                )));
            };
            check_new_job(request)?;
            let probe = request.new_spec(input, Fingerprint { len: 0, xxh3: 0 });
            let (input_files, fingerprint) = if crate::input::is_folder_input(&input.path) {
                folder_input::plan(&input.path)?
            } else {
                (Vec::new(), Fingerprint::of_file(&input.path)?)
            };
            let spec = JobSpec {
                fingerprint,
                input_files,
                ..probe
            };
            if spec.input_reader(Cursor::default())?.next_row()?.is_none() {
                return Err(JobError::EmptyInput(input.path.clone()));
            }
            store.put_job(&spec.to_stored()).await?;
            Ok(spec)
        }
        Some(stored) => {
            let mut asked = resumed_spec(&stored, request)?;
            // The input may have moved (a new --input path) or grown by appending, but
            // what was planned from it never changes.
            let moved = asked.input.path != stored.input.path;
            let grown = grown_input(&stored, &asked).map_err(|e| match e {
                JobError::InputChanged {
                    path,
                    what,
                    then,
                    now,
                } if moved => JobError::InputChanged {
                    what: format!(
                        "{what}; the job was created from {}, not from this file",
                        stored.input.path.display()
                    ),
                    path,
                    then,
                    now,
                },
                e => e,
            })?;
            if let Some(grown) = grown {
                let mut planner = store.planner().await?;
                if planner.cursor.byte == stored.fingerprint.len {
                    // The old last line had no newline: the appended newline still ends it.
                    planner.cursor.byte += grown.skip;
                }
                planner.exhausted = false;
                store.set_planner(&planner).await?;
                asked.history.push(SpecChange {
                    at_ms: now_ms(),
                    command: request.command.clone(),
                    changes: vec![format!(
                        "{} (new rows become new buckets from bucket {})",
                        grown.change, planner.next_bucket
                    )],
                    previous_input: Some(stored.fingerprint),
                });
                asked.fingerprint = grown.fingerprint;
                asked.input_files = grown.files;
            }
            if moved {
                // The same content (or the same with rows appended) at a new place: the job is
                // the same; say so, and keep it in the job's history.
                let change = format!(
                    "input moved from {} to {} (its content checked against the job's \
                     fingerprint)",
                    stored.input.path.display(),
                    asked.input.path.display()
                );
                tracing::warn!("{change}");
                asked.history.push(SpecChange {
                    at_ms: now_ms(),
                    command: request.command.clone(),
                    changes: vec![change],
                    previous_input: None,
                });
            }
            if let Some(change) = quota_change(&asked, request) {
                asked.history.push(SpecChange {
                    at_ms: now_ms(),
                    command: request.command.clone(),
                    changes: vec![change],
                    previous_input: None,
                });
            }
            request.apply_operational(&mut asked);
            check_work(&asked)?;
            if asked != stored {
                store.put_job(&asked.to_stored()).await?;
            }
            Ok(asked)
        }
    }
}

/// The stored job as a resume (or a joining worker) asks for it: meaning-changing flags that
/// differ from the stored ones refused ([`JobError::MeaningChanged`]; with
/// `allow_spec_change`, accepted and recorded), the input not looked at. Operational flags
/// are applied by the caller.
fn resumed_spec(stored: &JobSpec, request: &JobRequest) -> Result<JobSpec, JobError> {
    let mut asked = stored.clone();
    if let Some(input) = &request.input {
        asked.input = input.clone();
    }
    if let Some(b) = request.bucket_size {
        asked.bucket_size = b;
    }
    if let Some(m) = &request.method {
        asked.request.method = m.to_ascii_uppercase();
    }
    if let Some(u) = &request.url {
        asked.request.url = u.clone();
        asked.exec = None;
    }
    if let Some(command) = &request.exec {
        let retry_exit_codes = asked
            .exec
            .take()
            .map_or_else(|| DEFAULT_RETRY_EXIT_CODES.to_vec(), |e| e.retry_exit_codes);
        asked.exec = Some(ExecSpec {
            command: command.clone(),
            retry_exit_codes,
        });
        asked.request.url = String::new();
    }
    check_retry_exit_codes(request, &asked)?;
    if request.handler.is_some() || request.url.is_some() || request.exec.is_some() {
        asked.handler = request.handler.clone();
    }
    if request.body.is_some() {
        asked.request.body = request.body.clone();
    }
    if let Some(credentials) = &request.credentials {
        asked.credentials = credentials.clone();
    }
    if request.batch.is_some() {
        asked.batch = request.batch.clone();
    }
    request.answer.apply(&mut asked.answer);
    crate::answer::Answer::compile(&asked.answer)?;
    check_columns(stored, &asked, request)?;
    let fixed = stored.fixed_changes(&asked);
    let changes = stored.meaning_changes(&asked);
    if !fixed.is_empty() || (!changes.is_empty() && !request.allow_spec_change) {
        return Err(JobError::MeaningChanged(changes));
    }
    if !changes.is_empty() {
        asked.history.push(SpecChange {
            at_ms: now_ms(),
            command: request.command.clone(),
            changes,
            previous_input: None,
        });
    }
    Ok(asked)
}

/// The columns a resume's templates name or asks to keep must be ones the job keeps: its
/// planned rows kept those only.
fn check_columns(stored: &JobSpec, asked: &JobSpec, request: &JobRequest) -> Result<(), JobError> {
    let mut wanted = asked.columns_used();
    wanted.extend(request.keep_columns.iter().flatten().cloned());
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|c| !stored.columns.contains(c))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let kept = if stored.columns.is_empty() {
        "none".to_string()
    } else {
        stored.columns.join(", ")
    };
    Err(JobError::Usage(format!(
        "this job keeps the input columns {kept} of each row, fixed when it was created; \
         {} cannot be used ({} or {{column}} in a template): start a new state directory for a \
         job that uses {}",
        missing.join(", "),
        Setting::KeepColumns,
        if missing.len() == 1 { "it" } else { "them" }
    )))
}

/// Join a job a shared store holds as one more worker, without its input: the same checks
/// of the flags as a resume ([`open_job`]), the operational ones stored, but no input to
/// check (a joining worker plans only if the stored input is here, unchanged).
pub async fn join_job<S: Store>(
    store: &S,
    request: &JobRequest,
) -> Result<Option<JobSpec>, JobError> {
    check_request(request)?;
    let Some(stored) = stored_job(store).await? else {
        return Ok(None);
    };
    let mut asked = resumed_spec(&stored, request)?;
    request.apply_operational(&mut asked);
    check_work(&asked)?;
    if asked != stored {
        store.put_job(&asked.to_stored()).await?;
    }
    Ok(Some(asked))
}

/// An input that grew since it was planned: a file by appending rows, a folder by new files
/// after the planned ones (and rows appended to the last).
struct GrownInput {
    /// A folder's files now to read, in name order: the planned ones (the last maybe longer)
    /// and the new ones; none for a file.
    files: Vec<InputFile>,
    /// The input's fingerprint now.
    fingerprint: Fingerprint,
    /// Bytes of newline that start the last planned file's appended part and end its old
    /// last line, to step over (see [`appended`]).
    skip: u64,
    /// What grew, for the job's history.
    change: String,
}

/// How the input `asked` names grew since `stored` was planned: `None` when unchanged;
/// refused when changed otherwise than by growing.
fn grown_input(stored: &JobSpec, asked: &JobSpec) -> Result<Option<GrownInput>, JobError> {
    let was_folder = !stored.input_files.is_empty();
    if was_folder != crate::input::is_folder_input(&asked.input.path) {
        let (was, is) = if was_folder {
            ("folder", "not a folder")
        } else {
            ("file", "a folder")
        };
        return Err(JobError::Usage(format!(
            "the job's input is a {was} ({}); {} is {is}",
            stored.input.path.display(),
            asked.input.path.display()
        )));
    }
    if was_folder {
        return folder_input::judge(&asked.input, &stored.input_files);
    }
    let now = Fingerprint::of_file(&asked.input.path)?;
    if now == stored.fingerprint {
        return Ok(None);
    }
    let skip = appended(&asked.input, &stored.fingerprint, now)?;
    Ok(Some(GrownInput {
        files: Vec::new(),
        fingerprint: now,
        skip,
        change: format!(
            "input grew from {} to {} bytes",
            stored.fingerprint.len, now.len
        ),
    }))
}

/// Check that `spec.path` (now `now`) is the input fingerprinted as `then` with rows
/// appended. Returns how many bytes of newline the appended part starts with that end the
/// old last line (when the old content did not end with a newline), to step over.
fn appended(spec: &InputSpec, then: &Fingerprint, now: Fingerprint) -> Result<u64, JobError> {
    let path = &spec.path;
    let changed = |what: String| JobError::InputChanged {
        path: path.clone(),
        what,
        then: *then,
        now,
    };
    if matches!(spec.format, crate::input::InputFormat::Parquet { .. }) {
        return Err(changed(
            "a Parquet file is written whole (its footer last), so it cannot have grown by \
             appending rows; a changed Parquet input is a different input (start a new job for it)"
                .into(),
        ));
    }
    if now.len < then.len {
        return Err(changed(format!(
            "it is shorter than at creation ({} bytes, then {})",
            now.len, then.len
        )));
    }
    if now.len == then.len {
        return Err(changed(format!(
            "its content differs at the same length ({} bytes)",
            now.len
        )));
    }
    if Fingerprint::of_prefix(path, then.len)? != *then {
        return Err(changed(format!(
            "its first {} bytes (the part already planned) changed",
            then.len
        )));
    }
    let read_err = |source| crate::input::InputError::Read {
        path: path.clone(),
        source,
    };
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    file.seek(SeekFrom::Start(then.len - 1)).map_err(read_err)?;
    let mut edge = [0u8; 3];
    let n = file.read(&mut edge).map_err(read_err)?;
    let edge = &edge[..n];
    if edge.first() == Some(&b'\n') {
        return Ok(0);
    }
    let skip = match &edge[1..] {
        [b'\n', ..] => 1,
        [b'\r', b'\n', ..] => 2,
        _ => {
            return Err(changed(format!(
                "its old last line (ending at byte {}) had no newline and the appended text continues it, changing its ID; add a newline before the appended rows",
                then.len
            )))
        }
    };
    if matches!(spec.format, crate::input::InputFormat::Csv { .. }) {
        return Err(changed(
            "the old CSV content ended without a newline; appending to it is not supported".into(),
        ));
    }
    Ok(skip)
}

fn new_job_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

mod builder;
mod folder_input;
mod handler;
mod reporters;
mod results;

pub use builder::{Job, JobInput, Opened, RunError};
pub use handler::{job_handler, JobHandler};
pub use reporters::SecondSignal;
pub(crate) use reporters::{run_reported, Reporters};
pub use results::{Record, Results};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::InputFormat;
    use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};

    fn setup() -> (tempfile::TempDir, SledStore, JobRequest) {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("ids.txt");
        std::fs::write(&input, "a\nb\n").unwrap();
        let store = SledStore::open(
            &dir.path().join("state"),
            OpenMode::CreateIfMissing,
            DEFAULT_CACHE_BYTES,
        )
        .unwrap();
        let request = JobRequest {
            input: Some(InputSpec {
                path: input,
                format: InputFormat::Text,
            }),
            url: Some("http://127.0.0.1:9/{id}?k=${TOKEN}".into()),
            headers: Some(vec!["Authorization: Bearer ${TOKEN}".into()]),
            ..JobRequest::default()
        };
        (dir, store, request)
    }

    #[tokio::test]
    async fn create_then_resume_keeps_templates_and_applies_operational_changes() {
        let (_d, store, request) = setup();
        let created = open_job(&store, &request).await.unwrap();
        assert_eq!(created.bucket_size, DEFAULT_BUCKET_SIZE);
        assert_eq!(
            created.request.headers,
            vec!["Authorization: Bearer ${TOKEN}".to_string()]
        );
        let resume = JobRequest {
            timeout: Some(Duration::from_secs(3)),
            retry: RetryOverrides {
                max_attempts: Some(9),
                ..RetryOverrides::default()
            },
            ..JobRequest::default()
        };
        let resumed = open_job(&store, &resume).await.unwrap();
        assert_eq!(resumed.job_id, created.job_id);
        assert_eq!(resumed.request.timeout, Duration::from_secs(3));
        assert_eq!(resumed.retry.max_attempts, 9);
        assert_eq!(stored_job(&store).await.unwrap().unwrap(), resumed);
    }

    #[tokio::test]
    async fn meaning_changes_are_refused_and_named() {
        let (_d, store, request) = setup();
        open_job(&store, &request).await.unwrap();
        for (req, flag) in [
            (
                JobRequest {
                    url: Some("http://other/{id}".into()),
                    ..JobRequest::default()
                },
                Setting::Url,
            ),
            (
                JobRequest {
                    bucket_size: Some(7),
                    ..JobRequest::default()
                },
                Setting::BucketSize,
            ),
            (
                JobRequest {
                    method: Some("post".into()),
                    ..JobRequest::default()
                },
                Setting::Method,
            ),
            (
                JobRequest {
                    body: Some("{}".into()),
                    ..JobRequest::default()
                },
                Setting::Body,
            ),
        ] {
            let err = open_job(&store, &req).await.unwrap_err().to_string();
            assert!(err.contains(&flag.to_string()), "{err}");
        }
        // The same values given again are fine.
        open_job(&store, &request).await.unwrap();
    }

    #[tokio::test]
    async fn moved_input_is_accepted_changed_input_is_not() {
        let (dir, store, request) = setup();
        open_job(&store, &request).await.unwrap();
        let moved = dir.path().join("moved.txt");
        std::fs::rename(&request.input.as_ref().unwrap().path, &moved).unwrap();
        let req = JobRequest {
            input: Some(InputSpec {
                path: moved.clone(),
                format: InputFormat::Text,
            }),
            ..JobRequest::default()
        };
        assert_eq!(open_job(&store, &req).await.unwrap().input.path, moved);
        std::fs::write(&moved, "a\nc\n").unwrap();
        let err = open_job(&store, &JobRequest::default()).await.unwrap_err();
        assert!(matches!(err, JobError::InputChanged { .. }), "{err}");
    }

    #[tokio::test]
    async fn empty_input_and_missing_flags_are_refused() {
        let (_d, store, mut request) = setup();
        std::fs::write(&request.input.as_ref().unwrap().path, "\n  \n").unwrap();
        assert!(matches!(
            open_job(&store, &request).await,
            Err(JobError::EmptyInput(_))
        ));
        request.url = None;
        assert!(matches!(
            open_job(&store, &request).await,
            Err(JobError::Usage(_))
        ));
    }

    #[tokio::test]
    async fn request_changes_need_allow_spec_change_and_are_recorded() {
        let (_d, store, request) = setup();
        open_job(&store, &request).await.unwrap();
        let change = JobRequest {
            url: Some("http://127.0.0.1:9/v2/{id}".into()),
            command: "rerun".into(),
            ..JobRequest::default()
        };
        assert!(matches!(
            open_job(&store, &change).await,
            Err(JobError::MeaningChanged(_))
        ));
        let allowed = JobRequest {
            allow_spec_change: true,
            ..change.clone()
        };
        let spec = open_job(&store, &allowed).await.unwrap();
        assert_eq!(spec.request.url, "http://127.0.0.1:9/v2/{id}");
        assert_eq!(spec.history.len(), 1);
        assert_eq!(spec.history[0].command, "rerun");
        assert!(
            spec.history[0].changes[0].contains(&Setting::Url.to_string()),
            "{:?}",
            spec.history
        );
        assert_eq!(stored_job(&store).await.unwrap().unwrap(), spec);
        // A bucket size change stays refused, allowed or not.
        let bucket = JobRequest {
            bucket_size: Some(3),
            allow_spec_change: true,
            ..JobRequest::default()
        };
        let err = open_job(&store, &bucket).await.unwrap_err().to_string();
        assert!(err.contains(&Setting::BucketSize.to_string()), "{err}");
    }

    #[tokio::test]
    async fn a_grown_input_reopens_the_planner_and_keeps_the_old_fingerprint() {
        let (_d, store, request) = setup();
        let created = open_job(&store, &request).await.unwrap();
        let exhausted = crate::store::PlannerState {
            next_bucket: 1,
            cursor: crate::input::Cursor {
                byte: 4,
                line: 3,
                row: 2,
            },
            exhausted: true,
        };
        store.set_planner(&exhausted).await.unwrap();
        let path = &request.input.as_ref().unwrap().path;
        std::fs::write(path, "a\nb\nc\n").unwrap();
        let spec = open_job(&store, &JobRequest::default()).await.unwrap();
        assert_eq!(spec.fingerprint, Fingerprint::of_file(path).unwrap());
        assert_eq!(spec.history[0].previous_input, Some(created.fingerprint));
        let planner = store.planner().await.unwrap();
        assert!(!planner.exhausted);
        assert_eq!(planner.cursor, exhausted.cursor);
    }

    #[test]
    fn growth_edges_are_judged_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        let spec = InputSpec {
            path: path.clone(),
            format: InputFormat::Text,
        };
        let check = |old: &str, new: &str| {
            std::fs::write(&path, old).unwrap();
            let then = Fingerprint::of_file(&path).unwrap();
            std::fs::write(&path, new).unwrap();
            let now = Fingerprint::of_file(&path).unwrap();
            appended(&spec, &then, now).map_err(|e| e.to_string())
        };
        assert_eq!(check("a\nb\n", "a\nb\nc\n"), Ok(0));
        assert_eq!(check("a\nb", "a\nb\nc\n"), Ok(1));
        assert_eq!(check("a\r\nb", "a\r\nb\r\nc\r\n"), Ok(2));
        let err = check("a\nb", "a\nbc\n").unwrap_err();
        assert!(err.contains("had no newline"), "{err}");
        let err = check("a\nb\n", "a\nx\nc\n").unwrap_err();
        assert!(err.contains("first 4 bytes"), "{err}");
        let err = check("a\nb\n", "a\n").unwrap_err();
        assert!(err.contains("shorter"), "{err}");
        let err = check("a\nb\n", "a\nc\n").unwrap_err();
        assert!(err.contains("same length"), "{err}");
    }

    #[test]
    fn a_changed_parquet_input_is_never_a_grown_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.parquet");
        let spec = InputSpec {
            path: path.clone(),
            format: InputFormat::Parquet {
                column: "id".into(),
            },
        };
        crate::input::parquet_test_file::ids(&path, &[vec![Some("a"), Some("b")]], 10);
        let then = Fingerprint::of_file(&path).unwrap();
        crate::input::parquet_test_file::ids(
            &path,
            &[vec![Some("a"), Some("b")], vec![Some("c")]],
            10,
        );
        let now = Fingerprint::of_file(&path).unwrap();
        assert!(now.len > then.len);
        let err = appended(&spec, &then, now).unwrap_err().to_string();
        assert!(err.contains("cannot have grown by appending rows"), "{err}");
        assert!(err.contains("in.parquet"), "{err}");
    }

    #[tokio::test]
    async fn answer_checks_are_part_of_the_meaning() {
        let (_d, store, mut request) = setup();
        request.answer.fail_if = Some(".error != null".into());
        let created = open_job(&store, &request).await.unwrap();
        assert_eq!(created.answer.fail_if.as_deref(), Some(".error != null"));
        // Not given again: kept.
        assert_eq!(
            open_job(&store, &JobRequest::default()).await.unwrap(),
            created
        );
        let change = JobRequest {
            answer: AnswerRequest {
                fail_if: Some(".error".into()),
                expect_json: Some(true),
                ..AnswerRequest::default()
            },
            ..JobRequest::default()
        };
        let err = open_job(&store, &change).await.unwrap_err().to_string();
        assert!(
            err.contains(&Setting::FailIf.to_string())
                && err.contains(&Setting::ExpectJson.to_string()),
            "{err}"
        );
        let spec = open_job(
            &store,
            &JobRequest {
                allow_spec_change: true,
                ..change
            },
        )
        .await
        .unwrap();
        assert_eq!(spec.answer.fail_if.as_deref(), Some(".error"));
        assert!(spec.answer.expect_json);
        assert!(spec.history[0]
            .changes
            .iter()
            .any(|c| c.contains(&Setting::FailIf.to_string())));
        // An empty program removes the check; a malformed one is refused, nothing stored.
        let bad = JobRequest {
            answer: AnswerRequest {
                extract: Some("{".into()),
                ..AnswerRequest::default()
            },
            allow_spec_change: true,
            ..JobRequest::default()
        };
        assert!(matches!(
            open_job(&store, &bad).await,
            Err(JobError::Answer(_))
        ));
        assert_eq!(stored_job(&store).await.unwrap().unwrap(), spec);
        let removed = JobRequest {
            answer: AnswerRequest {
                fail_if: Some(String::new()),
                ..AnswerRequest::default()
            },
            allow_spec_change: true,
            ..JobRequest::default()
        };
        assert_eq!(
            open_job(&store, &removed).await.unwrap().answer.fail_if,
            None
        );
    }

    #[tokio::test]
    async fn an_exec_job_stores_its_command_as_written() {
        let (_d, store, mut request) = setup();
        request.url = None;
        request.headers = None;
        request.exec = Some("echo ${TOKEN} {id}".into());
        let created = open_job(&store, &request).await.unwrap();
        let exec = created.exec.clone().unwrap();
        assert_eq!(exec.command, "echo ${TOKEN} {id}");
        assert_eq!(exec.retry_exit_codes, [75]);
        // Exit codes are operational; the command is part of the meaning.
        let codes = JobRequest {
            retry_exit_codes: Some(vec![75, 69]),
            ..JobRequest::default()
        };
        let resumed = open_job(&store, &codes).await.unwrap();
        assert_eq!(resumed.exec.unwrap().retry_exit_codes, [75, 69]);
        let url = JobRequest {
            url: Some("http://127.0.0.1:9/{id}".into()),
            ..JobRequest::default()
        };
        let err = open_job(&store, &url).await.unwrap_err().to_string();
        assert!(
            err.contains(&Setting::Exec.to_string()) && err.contains(&Setting::Url.to_string()),
            "{err}"
        );
        let changed = JobRequest {
            exec: Some("printf %s {id}".into()),
            allow_spec_change: true,
            ..JobRequest::default()
        };
        let spec = open_job(&store, &changed).await.unwrap();
        assert_eq!(spec.exec.as_ref().unwrap().command, "printf %s {id}");
        assert_eq!(spec.exec.unwrap().retry_exit_codes, [75, 69], "kept");
        // Exit codes for a job that calls a URL, and both at once, are refused.
        let (_d, store, mut request) = setup();
        request.retry_exit_codes = Some(vec![1]);
        assert!(matches!(
            open_job(&store, &request).await,
            Err(JobError::Usage(_))
        ));
        request.exec = Some("echo {id}".into());
        assert!(matches!(
            open_job(&store, &request).await,
            Err(JobError::Usage(_))
        ));
    }

    #[tokio::test]
    async fn credentials_are_stored_as_written_and_change_like_the_request() {
        use crate::credential::{CredentialKind, CredentialSpec};
        let (_d, store, mut request) = setup();
        let oauth2 = |scope: Option<&str>| {
            vec![CredentialSpec {
                name: "TOKEN".into(),
                kind: CredentialKind::OAuth2 {
                    token_url: "http://127.0.0.1:9/token".into(),
                    client_id: "me".into(),
                    client_secret: "${CLIENT_SECRET}".into(),
                    scope: scope.map(Into::into),
                },
                every: None,
                renew_on_403: false,
            }]
        };
        request.credentials = Some(oauth2(None));
        let created = open_job(&store, &request).await.unwrap();
        let stored = String::from_utf8(created.to_stored().spec).unwrap();
        assert!(stored.contains("${CLIENT_SECRET}"), "{stored}");
        // Not given again: kept; given the same: accepted.
        assert_eq!(
            open_job(&store, &JobRequest::default()).await.unwrap(),
            created
        );
        assert_eq!(open_job(&store, &request).await.unwrap(), created);
        // Changed: refused, unless allowed (then recorded).
        let change = JobRequest {
            credentials: Some(oauth2(Some("read"))),
            ..JobRequest::default()
        };
        let err = open_job(&store, &change).await.unwrap_err().to_string();
        assert!(err.contains("credentials"), "{err}");
        let spec = open_job(
            &store,
            &JobRequest {
                allow_spec_change: true,
                ..change
            },
        )
        .await
        .unwrap();
        assert!(
            spec.history[0].changes[0].contains("scope"),
            "{:?}",
            spec.history
        );
        // A name templates cannot use, or one defined twice, is refused.
        let (_d, store, mut request) = setup();
        let mut bad = oauth2(None);
        bad[0].name = "MY-TOKEN".into();
        request.credentials = Some(bad);
        assert!(matches!(
            open_job(&store, &request).await,
            Err(JobError::Usage(_))
        ));
        let mut twice = oauth2(None);
        twice.extend(oauth2(None));
        request.credentials = Some(twice);
        assert!(matches!(
            open_job(&store, &request).await,
            Err(JobError::Usage(_))
        ));
    }

    #[tokio::test]
    async fn specs_stored_before_answer_checks_existed_still_load() {
        let (_d, store, request) = setup();
        let spec = open_job(&store, &request).await.unwrap();
        let value = serde_json::to_value(&spec).unwrap();
        assert!(
            value.get("answer").is_none(),
            "a plain spec is stored as before"
        );
        let old: JobSpec = serde_json::from_value(value).unwrap();
        assert!(old.answer.is_plain());
    }

    #[tokio::test]
    async fn specs_stored_before_the_history_existed_still_load() {
        let (_d, store, request) = setup();
        let spec = open_job(&store, &request).await.unwrap();
        let mut value = serde_json::to_value(&spec).unwrap();
        value.as_object_mut().unwrap().remove("history");
        let old: JobSpec = serde_json::from_value(value).unwrap();
        assert_eq!(old, spec);
    }
}
