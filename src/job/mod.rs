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

mod builder;
mod checks;
mod error;
mod folder_input;
mod grown;
mod handler;
mod open;
mod place;
mod reporters;
mod request;
mod results;
#[cfg(test)]
mod tests;

pub use crate::handler::exec::ExecSpec;
pub use crate::handler::http::RequestSpec;
pub use crate::spec::{
    Durability, FailureLimit, JobSpec, RetryPolicy, RunOptions, SpecChange, DEFAULT_BUCKET_SIZE,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT,
};
pub use crate::store::now_ms;

pub use builder::{Job, JobInput, Opened, RunError};
pub use error::JobError;
pub use handler::{job_handler, JobHandler};
pub use open::open_job;
pub use open::stored_job;
pub use place::open_at;
#[cfg(feature = "cli")]
pub(crate) use place::open_made;
pub use place::RunningPlace;
#[cfg(feature = "postgres")]
pub use place::{Crew, PgPlace};
pub use place::{HistoryError, JobPlace, Look, OpenedStore, PlaceNames, StateDirPlace};
pub use reporters::SecondSignal;
pub use request::{AnswerRequest, JobRequest, RetryOverrides};
pub use results::{Record, Results};
