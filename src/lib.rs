//! highwater: a job runner for long, resumable batch enrichment.
//!
//! Read IDs from a file, cut them into deterministic buckets, do the work for each ID (call
//! an HTTP API, run a program, or run your own async function) under retries, and keep every
//! result exactly once in an embedded store, so that a run can be killed at any moment and
//! resumed without losing or duplicating anything.
//!
//! The modules, in the order a run meets them: [`clock`] is the wall clock a run reads; [`input`] reads IDs; [`plan`] cuts buckets;
//! [`job`] holds what a job means; [`store`] keeps the offset log, results and commit log;
//! [`engine`] runs buckets to completion; [`handler`] does the work for one ID (HTTP, exec, or
//! a closure), whose answer [`answer`] checks and whose [`failure`] says what happens next (its
//! message masked of the job's [`secrets`]);
//! `retry` runs the attempts; [`progress`] counts; [`monitor`] reports on a running job (bar, events, [`live`] snapshot, [`history`], `metrics`) through the `console`; [`rerun`] calls chosen IDs again; [`sink`] exports (its [`sink::parquet`] as Parquet); `dashboard` shows a job in a browser (feature `dashboard`); [`cli`] is the command line;
//! [`demo`] is a self-contained job against a local fake API.
//!
//! The front door is at the root: a [`Job`] runs a [`Handler`] (any async closure, or
//! [`handler::http::HttpHandler`]) over IDs, each attempt ending in an [`Output`] or a
//! [`Failure`] whose [`Next`] says what happens next; [`Results`] reads the records back.
//!
//! Cargo features: the library alone (`default-features = false`) has none of the command
//! line's crates. `cli` (default) adds [`cli`] and the binary (clap, tracing-subscriber,
//! jemalloc) and turns on the four below; `progress-bar` the terminal bar of [`monitor`]
//! (indicatif); `metrics` the Prometheus endpoint (a hyper server); `dashboard` the web
//! page of `serve` and `report` (a hyper server); `demo` the fake API; `conformance` (with
//! `cli`) the store conformance suite a library user's own store can run (`conformance`);
//! `postgres` (default) the PostgreSQL store.

// `pub` is what a library user can reach; an item of a private module says `pub(crate)`.
#![warn(unreachable_pub)]
// Every item a library user can reach says what it is for.
#![warn(missing_docs)]

pub mod answer;
#[cfg(feature = "cli")]
pub mod cli;
pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
pub(crate) mod console;
pub mod credential;
#[cfg(feature = "dashboard")]
pub mod dashboard;
#[cfg(feature = "demo")]
pub mod demo;
pub mod engine;
pub mod failure;
pub mod handler;
pub mod history;
pub mod input;
pub mod job;
// `dashboard` exports its listener; the command line binds the metrics endpoint with it too.
#[cfg(feature = "dashboard")]
mod listen;
pub mod live;
pub mod meter;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
pub mod monitor;
pub mod os;
pub mod plan;
pub mod progress;
pub mod quota;
pub mod rerun;
mod retry;
pub mod secrets;
mod serde_millis;
mod setting;
pub mod sink;
pub mod spec;
pub mod store;
pub mod throttle;
mod watchdog;

// The front door: what a library program names to define, run and read back a job.
pub use failure::{ErrorClass, Failure, Next};
pub use handler::{Handler, Output};
pub use job::{Job, JobInput, Record, Results, RunError};
pub use progress::RunSummary;
pub use setting::Setting;
pub use spec::{RetryPolicy, RunOptions};
