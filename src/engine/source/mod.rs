//! Where a run's buckets come from: one [`Source`] per mode, chosen before the run starts
//! (see [`super::run_log`]); the run wires the same throttle, writer and workers to each.
//!
//! - [`job::JobLog`], the job's own log, run by the only worker: it holds the job's lease,
//!   replays the buckets written ahead but never committed (only their items without a
//!   final result), then plans the rest of the input and dispatches what it planned.
//! - [`rerun::RerunLog`], a rerun's log, run by the only worker: it holds the job's lease
//!   and dispatches the rerun's open buckets (written ahead when the rerun was created),
//!   reading them one at a time, so its memory does not grow with the rerun's size.
//! - [`leased::Leased`], either log, run by a worker of a fleet: it leases buckets one by
//!   one from the store, which several workers share.

use std::future::Future;
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::dispatcher::Dispatcher;
use super::error::EngineError;
use super::member::Member;
use crate::plan::PlanError;
use crate::progress::Counters;
use crate::store::{Lease, LeaseScope, Leases, Log, StoreError};
use crate::throttle::Throttle;

pub(super) mod job;
pub(super) mod leased;
pub(super) mod rerun;

/// Where a run's buckets come from (see the module doc).
pub(super) trait Source: Send {
    /// The log the run writes to: the job's or a rerun's.
    fn log(&self) -> Log;

    /// The workers' handle on the run's fleet, taken once, before any worker starts.
    fn member(&mut self, throttle: &Arc<Throttle>) -> Arc<dyn Member>;

    /// Hand `dispatcher` the buckets to work on (the writer tracks each, then its items are
    /// queued), until every one is dispatched, an error, or a stop.
    fn feed(
        &mut self,
        dispatcher: &mut Dispatcher,
        counters: &Arc<Counters>,
    ) -> impl Future<Output = Result<(), EngineError>> + Send;

    /// Once the workers and the writer are done: wait for what the source started (its
    /// planner) and give back what it holds (the job's lease).
    fn close(self) -> impl Future<Output = Result<(), EngineError>> + Send;
}

/// Take the lease on the whole job, which every commit of a run alone carries.
async fn job_lease<S: Leases>(store: &S) -> Result<Lease, EngineError> {
    Ok(store
        .acquire(LeaseScope::Job)
        .await?
        .ok_or_else(|| StoreError::backend("another worker holds the job's lease"))?)
}

/// What the planner task, if any, ended with: aborted (a fleet's, once nothing is left to
/// plan) counts as done.
async fn planned(planner: Option<JoinHandle<Result<(), PlanError>>>) -> Result<(), EngineError> {
    match planner {
        Some(p) => match p.await {
            Ok(planned) => Ok(planned?),
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => Err(EngineError::Internal(format!("planner: {e}"))),
        },
        None => Ok(()),
    }
}
