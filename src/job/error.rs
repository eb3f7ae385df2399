//! [`JobError`]: why a job could not be created or resumed, naming no command-line flag
//! ([`Setting`] names the setting; the command line says which flag that is).

use crate::answer::AnswerError;
use crate::input::Fingerprint;
use crate::setting::Setting;
use crate::store::StoreError;

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
    /// The request contradicts itself or a rule (e.g. a URL and a command together, a bucket size of 0).
    #[error("{0}")]
    Usage(String),
    /// The stored job differs in what it means (input, work, bucket size): one line per difference.
    #[error("the state directory holds a job that this run may not change:\n  {}\n({})", .0.join("\n  "), what_may_change())]
    MeaningChanged(Vec<String>),
    /// The input file is not the one the job was created from (only appended rows are accepted).
    #[error("input {path} has changed since the job was created: {what} (then {then}, now {now}); only appending rows is accepted; refusing to resume against it")]
    InputChanged {
        /// The input file.
        path: std::path::PathBuf,
        /// What differs.
        what: String,
        /// Its fingerprint when the job was created.
        then: Fingerprint,
        /// Its fingerprint now.
        now: Fingerprint,
    },
    /// A folder input whose planned files are not all there, in the same order, any more.
    #[error("input folder changed since the job was created: {path}: {what}; refusing to resume against it")]
    FolderChanged {
        /// The folder.
        path: std::path::PathBuf,
        /// What differs.
        what: String,
    },
    /// There is no job here to resume, and the request cannot create one (no input, or
    /// nothing to do for each ID).
    #[error(
        "no job here yet: give {} and {} (or {}) to create one",
        Setting::Input,
        Setting::Url,
        Setting::Exec
    )]
    NoJob,
    /// The job's work is a library program's own handler (named): there is no handler to
    /// build from its spec; the program runs it.
    #[error("the job is run by a library program (its handler {0:?}): its spec describes no work to build")]
    LibraryHandler(String),
    /// The input holds no ID to plan.
    #[error("input {0} holds no IDs (it is empty or only blank lines)")]
    EmptyInput(std::path::PathBuf),
    /// The job's work is not valid (a request template, a credential, an exec command).
    #[error(transparent)]
    Request(#[from] crate::handler::HandlerError),
    /// A malformed answer check (a jq program that does not parse).
    #[error(transparent)]
    Answer(#[from] AnswerError),
    /// The input cannot be opened or read.
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
