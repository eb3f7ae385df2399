//! Progress: the live counters of a run and the lines that report them.
//!
//! Owns `Counters` (shared, lock-free, updated by the engine's tasks) and the progress and
//! summary reports made from them. The store's figures ([`StoreStats`]) say where the job
//! stands; the counters say what this run did.
//!
//! One concept per file: `Counters` and the `HttpStats` they hold; a
//! [`CounterSnapshot`] of them; the `JobFigures` a run adds to the store's; the
//! `Durations` of each step; a `ProgressEvent` and its line; falling `behind` the
//! rate; the [`RunSummary`] and what [`Halted`] a run.
//!
//! [`StoreStats`]: crate::store::StoreStats

mod behind;
mod counters;
mod durations;
mod event;
mod figures;
mod http_stats;
mod snapshot;
mod summary;

pub(crate) use behind::{IntervalLoad, Sustained};
pub(crate) use counters::Counters;
pub(crate) use durations::Durations;
pub(crate) use event::ProgressEvent;
pub(crate) use figures::JobFigures;
pub(crate) use http_stats::LATENCY_BUCKETS;
pub(crate) use snapshot::per_second;
pub use snapshot::CounterSnapshot;
pub use summary::{HaltKind, Halted, RunSummary};
