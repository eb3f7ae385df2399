//! History: a job's figures over time, kept beside it so that a dashboard or a report can
//! chart the whole job across its runs.
//!
//! Owns the two kinds of record of a job's history, written by the run's monitor: a
//! [`RunStart`] when a run begins (its id, pid, worker and the job's spec, whose secrets are
//! only ever `${VAR}` references) and a [`Sample`] every `--history-interval` (10 s by
//! default) and at the run's end. Counters in a sample are cumulative over its run, so a
//! restart is explicit (a new run id) and a lost sample loses nothing but resolution.
//! `Sampler` turns the live counters into samples; `file` keeps them in the state
//! directory; `series` turns them into the downsampled columns a chart draws.

pub(crate) mod file;
mod record;
mod sampler;
#[cfg(feature = "dashboard")]
pub(crate) mod series;

pub(crate) use file::HistoryFile;
pub use file::HistoryReadError;
pub use record::{Answers, RateCause, Record, RunStart, Sample};
pub(crate) use sampler::{Sampler, DEFAULT_INTERVAL};
#[cfg(feature = "dashboard")]
pub(crate) use series::downsample;
