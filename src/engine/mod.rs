//! Engine: running a job's buckets to the end, crash-safely.
//!
//! Four kinds of task share a run:
//!
//! - the **planner** (a blocking thread) reads the input from the stored position, cuts
//!   buckets ([`crate::plan`]), writes them ahead of their work with [`Store::plan`] and makes
//!   them durable with [`Store::sync`], then hands them over (at most two batches ahead);
//! - the **dispatcher** takes the buckets the run's source hands it (for the job's log: first
//!   the buckets that have an offset record but no commit record, calling only their IDs that
//!   have no final result, then the planner's) and queues their items (a bounded queue,
//!   `queue`), so workers never wait at a bucket boundary and buckets may commit out of
//!   order;
//! - the **workers**, a fixed pool of `concurrency` tasks, each takes an item, calls the API
//!   under the throttle (rate limit, adaptive concurrency limit, retries) and hands the final
//!   result to the writer; an attempt holds one of `concurrency` permits, and an item waiting
//!   for a retry holds none (its worker takes the next item meanwhile);
//! - the **writer** receives final results and writes them in groups. By default
//!   ([`Durability::Sync`](crate::spec::Durability::Sync)) it makes each group durable with one sync (group commit) before
//!   taking the next, and only then writes the commit records of the buckets whose last
//!   result was in the group. With `--async-progress` ([`Durability::Async`](crate::spec::Durability::Async)) it writes
//!   results as they come and a background sync every checkpoint interval makes them
//!   durable; the commit records of the buckets completed before that sync started are
//!   written once it returns (and are durable at the next one). Either way a bucket of one
//!   row costs no sync of its own.
//!
//! Invariants (the crash tests check them):
//!
//! 1. A bucket's offset record is durable before any of its items is dispatched.
//! 2. A bucket's commit record is written only after all its results are durable.
//! 3. Buckets are a pure function of the input and the bucket size (see [`crate::plan`]).
//! 4. Results are keyed by ID: a replayed item overwrites its own record, never adds one.
//! 5. A replay calls only items without a durable final result: after a kill -9 the repeated
//!    calls are the items that were in flight, that is, at most
//!    [`max_unsynced_items`]`(concurrency)` of them in sync mode
//!    ([`max_unsynced_items_over_network`] for a database server); in async mode, those plus
//!    the results finished since the last completed background sync started (about one
//!    checkpoint interval of work).
//!
//! The unit tests run the engine over a store that logs every write and sync and check 1
//! and 2 on the log, in both durability modes; one runs a fleet's 36-hour job against the
//! fake API in simulated time (a paused tokio clock and a [`crate::clock::SimulatedClock`]):
//! hourly tokens, daily and 7-hour quota windows across midnight UTC, an outage, a wall
//! clock that jumps, a lease lost by a paused worker, every ID once (`long_run_tests`).
//!
//! # Where buckets come from
//!
//! A run has one `source` of buckets, chosen by `run_log` before it starts, from the
//! store's type ([`Leases::Fleet`]: a fleet's store, or one with one holder at a time) and
//! the log; the run itself (`wiring::run_source`) wires the same throttle, writer, workers
//! and dispatcher to any of them, with no branch on the mode:
//!
//! - the job's own log, run alone: replay, then plan (`source::job`);
//! - a rerun's log, run alone: the rerun's open buckets, written ahead when the rerun was
//!   created; each item carries the record it replaces, and the writer commits to the
//!   rerun's commit log (`source::rerun`);
//! - either log, run by a worker of a fleet sharing the store: buckets leased one by one
//!   (`source::leased`).
//!
//! A run alone holds the job's lease, which every commit carries. A worker of a fleet holds
//! a lease per bucket, and its item workers ask the fleet, through one handle
//! (`member`), whether an item's lease is still held before they call it.
//!
//! The parts, one file each: `wiring` (the run itself), `source` (one file per mode),
//! `planner` (the planner thread, and planning in a fleet), `dispatcher`, `queue` (the
//! work queue), `item` (what is queued), `worker` (the item workers and the throttle's
//! controller task), `member` (the workers' handle on a fleet), `writer` (group commit),
//! `stop` (the stop pair, and a run halting itself), `error`.
//!
//! Stopping: on a stop request no new item is dispatched, items waiting for a retry are
//! abandoned (they stay pending), items in flight get `shutdown_timeout` to finish, then the
//! writer makes everything it received durable and the run returns.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;

use crate::handler::Handler;
use crate::progress::{Counters, RunSummary};
use crate::spec::{JobSpec, RunOptions};
use crate::store::{Fleet, FleetKind, FleetVisitor, Leases, Log, Store};

#[cfg(any(test, feature = "conformance"))]
pub(crate) mod audit;
mod batch;
mod dispatcher;
mod error;
#[cfg(test)]
mod fleet_tests;
mod item;
mod kept_limits;
#[cfg(all(test, feature = "demo"))]
mod long_run_tests;
mod member;
mod pages;
#[cfg(test)]
mod pages_tests;
mod planner;
mod queue;
mod quotas;
mod source;
mod stop;
#[cfg(test)]
mod tests;
mod wiring;
mod worker;
mod writer;

pub use error::EngineError;
use kept_limits::Keeper;
use source::{job::JobLog, leased::Leased, rerun::RerunLog};
pub use stop::StopHandle;
pub(crate) use stop::{stop_pair, Stop};
use wiring::{run_source, Run};
pub use writer::{max_unsynced_items, max_unsynced_items_of, max_unsynced_items_over_network};

/// Run the job in `store` until every bucket is committed or a stop is asked for.
///
/// The job spec must be the stored one, its input verified against the fingerprint.
#[cfg(any(test, feature = "conformance"))]
pub(crate) async fn run<S: Store + Leases, H: Handler>(
    store: Arc<S>,
    spec: Arc<JobSpec>,
    handler: Arc<H>,
    opts: &RunOptions,
    counters: Arc<Counters>,
    stop: Stop,
) -> Result<RunSummary, EngineError> {
    run_log(store, spec, handler, opts, counters, stop, Log::Job).await
}

/// [`run`] for either log: the job's own (buckets from the input) or a rerun's (its open
/// buckets, planned when the rerun was created).
///
/// The run's source of buckets is chosen here, by the store's type ([`Leases::Fleet`]): a
/// fleet's store has its buckets leased one by one, whatever the log; a store with one
/// holder at a time has the job's log replayed and planned, or the rerun's read.
pub(crate) async fn run_log<S: Store + Leases, H: Handler>(
    store: Arc<S>,
    spec: Arc<JobSpec>,
    handler: Arc<H>,
    opts: &RunOptions,
    counters: Arc<Counters>,
    stop: Stop,
    log: Log,
) -> Result<RunSummary, EngineError> {
    let run = Run {
        spec,
        handler,
        opts,
        counters,
        stop,
        started: Instant::now(),
        limits_restored: false,
    };
    S::Fleet::visit(store, ChooseSource { run, log }).await
}

/// Opens the source of a run's buckets for its store and log, then runs it.
struct ChooseSource<'a, H> {
    run: Run<'a, H>,
    log: Log,
}

/// A run under way, whatever its source.
type Running<'a> = Pin<Box<dyn Future<Output = Result<RunSummary, EngineError>> + Send + 'a>>;

impl<'a, S: Store + Leases, H: Handler> FleetVisitor<S> for ChooseSource<'a, H> {
    type Output = Running<'a>;

    fn alone(self, store: Arc<S>) -> Running<'a> {
        let ChooseSource { run, log } = self;
        Box::pin(async move {
            match log {
                Log::Job => {
                    let source = JobLog::open(store.clone(), &run.spec, run.opts).await?;
                    run_source(store, source, run).await
                }
                Log::Rerun(k) => {
                    let source =
                        RerunLog::open(store.clone(), k, run.spec.work.paginate().is_some())
                            .await?;
                    run_source(store, source, run).await
                }
            }
        })
    }

    fn fleet(self, store: Arc<S>) -> Running<'a>
    where
        S: Fleet,
    {
        let ChooseSource { mut run, log } = self;
        Box::pin(async move {
            // Each a round trip to a store across a network: taken together.
            let restore = async {
                if let Some(limits) = run.handler.announced_limits() {
                    Keeper::new(store.clone(), limits).restore().await;
                }
            };
            let (source, ()) = tokio::join!(
                Leased::open(store.clone(), run.spec.clone(), run.opts, log),
                restore
            );
            run.limits_restored = true;
            run_source(store, source?, run).await
        })
    }
}
