//! Engine: running a job's buckets to the end, crash-safely.
//!
//! Four kinds of task share a run:
//!
//! - the **planner** (a blocking thread) reads the input from the stored position, cuts
//!   buckets ([`crate::plan`]), writes them ahead of their work with [`Store::plan`] and makes
//!   them durable with [`Store::sync`], then hands them over (at most two batches ahead);
//! - the **dispatcher** first replays the buckets that have an offset record but no commit
//!   record, calling only their IDs that have no final result, then dispatches new buckets:
//!   it queues their items (a bounded queue, [`queue`]), so workers never wait at a bucket
//!   boundary and buckets may commit out of order;
//! - the **workers**, a fixed pool of `concurrency` tasks, each takes an item, calls the API
//!   under the throttle (rate limit, adaptive concurrency limit, retries) and hands the final
//!   result to the writer; an attempt holds one of `concurrency` permits, and an item waiting
//!   for a retry holds none (its worker takes the next item meanwhile);
//! - the **writer** receives final results and writes them in groups. By default
//!   ([`Durability::Sync`]) it makes each group durable with one sync (group commit) before
//!   taking the next, and only then writes the commit records of the buckets whose last
//!   result was in the group. With `--async-progress` ([`Durability::Async`]) it writes
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
//!    [`max_unsynced_items`]`(concurrency)` of them in sync mode; in async mode, those plus
//!    the results finished since the last completed background sync started (about one
//!    checkpoint interval of work).
//!
//! The unit tests run the engine over a store that logs every write and sync and check 1
//! and 2 on the log, in both modes.
//!
//! The same dispatcher and writer run a rerun ([`run_log`] with [`Log::Rerun`]): its work
//! is the rerun's open buckets (written ahead when the rerun was created, read one at a time
//! as they are dispatched), each item carries the record it replaces (whose history the new
//! record keeps), and the writer commits to the rerun's commit log instead of the job's.
//!
//! The parts, one file each: [`stop`] (the stop pair, and a run halting itself),
//! [`dispatcher`] (the planner thread and the dispatcher), [`queue`] (the work queue),
//! [`worker`] (the item workers and the throttle's controller task), [`writer`] (group
//! commit), [`fleet`] (leased dispatch over a shared store); this file ties them together.
//!
//! Stopping: on a stop request no new item is dispatched, items waiting for a retry are
//! abandoned (they stay pending), items in flight get `shutdown_timeout` to finish, then the
//! writer makes everything it received durable and the run returns.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;

use crate::handler::{millis, Handler};
use crate::input::InputReader;
use crate::plan::{PlanError, Planner};
use crate::progress::{Counters, RunSummary};
use crate::spec::{Durability, JobSpec, RunOptions};
use crate::store::{JobView, LeaseScope, Leases, Log, PlannedBucket, Store, StoreError};
use crate::throttle::Throttle;

#[cfg(test)]
pub(crate) mod audit;
mod dispatcher;
mod fleet;
mod queue;
mod stop;
#[cfg(test)]
mod tests;
mod worker;
mod writer;

use dispatcher::{job_work, plan_ahead, rerun_work, work_queue, Dispatcher, Item, Replay, Track};
use queue::WorkQueue;
pub use stop::{stop_pair, Stop, StopHandle};
use stop::{Halt, HaltOnPanic, StopOnDrop};
use worker::{control, work, ItemTask, Parked};
pub use writer::max_unsynced_items;
use writer::{writer_queue, Writer, WriterMsg};

/// Errors that stop a run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

/// Run the job in `store` until every bucket is committed or a stop is asked for.
///
/// The job spec must be the stored one, its input verified against the fingerprint.
pub async fn run<S: Store + Leases, H: Handler>(
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
pub async fn run_log<S: Store + Leases, H: Handler>(
    store: Arc<S>,
    spec: Arc<JobSpec>,
    handler: Arc<H>,
    opts: &RunOptions,
    counters: Arc<Counters>,
    stop: Stop,
    log: Log,
) -> Result<RunSummary, EngineError> {
    let started = Instant::now();
    // Everything that can fail comes before any task is spawned. The lease first: every
    // commit of the run carries it. A shared store's run leases buckets as it goes
    // ([`fleet`]) and takes no lease on the whole job.
    let shared = store.shared();
    let lease = if shared {
        None
    } else {
        Some(
            store
                .acquire(LeaseScope::Job)
                .await?
                .ok_or_else(|| StoreError::backend("another worker holds the job's lease"))?,
        )
    };
    // `--rate` is the job's total: every worker's share is carved from it ([`fleet`]).
    if let (true, Some(rate)) = (shared, opts.throttle.rate) {
        store
            .set_fleet_rate(rate.per_second(), opts.throttle.burst)
            .await?;
    }
    let mut replay: Vec<Replay> = Vec::new();
    let mut rerun_buckets = Vec::new();
    match log {
        _ if shared => {}
        Log::Job => {
            for offset in store.open_buckets().await? {
                let (done, todo) = job_work(offset.bucket, store.bucket_items(&offset).await?);
                replay.push((offset.bucket, done, todo));
            }
        }
        // A rerun's buckets are read one at a time as they are dispatched (below), so its
        // memory does not grow with its size.
        Log::Rerun(k) => rerun_buckets = store.rerun_open_buckets(k).await?,
    }
    let planner_state = match log {
        Log::Job => store.planner().await?,
        // A rerun plans nothing: its buckets were all written ahead at its creation.
        Log::Rerun(_) => crate::store::PlannerState {
            exhausted: true,
            ..Default::default()
        },
    };
    // A worker of a shared job plans under the planner's lease, whenever it is free
    // ([`fleet::plan_fleet`]).
    let mut reader = if planner_state.exhausted || shared {
        None
    } else {
        match InputReader::open_bounded(&spec.input, planner_state.cursor, spec.fingerprint.len) {
            Ok(reader) => Some(reader),
            Err(e) => return Err(PlanError::from(e).into()),
        }
    };
    // The run's own stop: asked for from outside, or by the run itself (a halt).
    let (own_stop, stop_inner) = stop_pair();
    let halt = Arc::new(Halt {
        stop: own_stop.clone(),
        reason: std::sync::Mutex::new(None),
    });
    let forward = tokio::spawn({
        let (outer, own) = (stop.clone(), own_stop);
        async move {
            outer.stopping().await;
            own.stop();
        }
    });
    let stop = stop_inner;
    let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let throttle = Arc::new(Throttle::new(
        opts.throttle.clone(),
        permits.clone(),
        opts.concurrency.max(1),
    ));
    counters.attach_throttle(throttle.clone());
    let controller = tokio::spawn(control(throttle.clone(), halt.clone()));
    // A worker of a fleet starts nothing before its share is known.
    let follower = shared.then(|| {
        fleet::apply_rate(&*store, &throttle);
        tokio::spawn(fleet::follow_rate(store.clone(), throttle.clone()))
    });

    let (writer_tx, writer_rx) = mpsc::channel(writer_queue(opts.concurrency));
    // Rung by a worker once the writer's queue holds a group (see `group_target`) or is
    // full: the writer, gathering a group, is not woken by each result sent, only by this or
    // its group's deadline.
    let writer_full = Arc::new(Notify::new());
    let durability = opts.durability;
    let writer = Writer {
        store: store.clone(),
        counters: counters.clone(),
        max_failures: opts.max_failures,
        halt: halt.clone(),
        open: HashMap::new(),
        log,
        leases: HashMap::new(),
        completed: HashMap::new(),
        shared,
        full: writer_full.clone(),
    };
    let writer = tokio::spawn({
        let halt = halt.clone();
        async move {
            // A writer that fails (or panics) stops the run: the workers would otherwise call
            // the API for results nobody can store.
            let mut stop_unless_done = StopOnDrop(Some(&halt.stop));
            let written = match durability {
                Durability::Sync => writer.run_sync(writer_rx).await,
                Durability::Async { interval } => writer.run_async(writer_rx, interval).await,
            };
            if written.is_ok() {
                stop_unless_done.0 = None;
            }
            written
        }
    });

    let (plan_tx, plan_rx) = mpsc::channel::<Vec<PlannedBucket>>(1);
    let mut plan_rx = Some(plan_rx);
    let planner = if shared && !planner_state.exhausted {
        Some(tokio::spawn(fleet::plan_fleet(
            store.clone(),
            spec.clone(),
            opts.skip_bad_lines,
            stop.clone(),
            counters.clone(),
        )))
    } else if let Some(reader) = reader.take() {
        let planner = Planner::new(
            reader,
            planner_state,
            spec.bucket_size,
            opts.skip_bad_lines,
            spec.fingerprint,
        );
        Some(tokio::task::spawn_blocking(plan_ahead(
            planner,
            store.clone(),
            plan_tx,
            stop.clone(),
            counters.clone(),
        )))
    } else {
        None
    };
    let workers = opts.concurrency.max(1);
    let queue = Arc::new(WorkQueue::new(work_queue(workers)));
    let mut pool = JoinSet::new();
    let parked = Arc::new(Parked::for_concurrency(workers));
    for _ in 0..workers {
        let task = ItemTask {
            throttle: throttle.clone(),
            spec: spec.clone(),
            handler: handler.clone(),
            counters: counters.clone(),
            stop: stop.clone(),
            writer: writer_tx.clone(),
            writer_full: writer_full.clone(),
            rerun: match log {
                Log::Job => None,
                Log::Rerun(k) => Some(k),
            },
            alive: {
                let store = store.clone();
                Arc::new(move || store.alive())
            },
            holds: {
                let store = store.clone();
                Arc::new(move |lease| store.holds(lease))
            },
            pause: shared.then(|| fleet::pauser(store.clone(), throttle.clone())),
            parked: parked.clone(),
        };
        pool.spawn(work(task, queue.clone(), permits.clone(), halt.clone()));
    }
    let mut dispatcher = Dispatcher {
        stop: stop.clone(),
        queue,
        workers: pool,
        writer: writer_tx,
        replaying: matches!(log, Log::Job),
        lease: lease.clone(),
    };
    let mut result = dispatcher.replay(replay).await;
    if shared {
        // Planned buckets are in the store, open to every worker: this one leases them
        // like the others do.
        let mut rx = plan_rx.take().expect("taken once");
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        result = fleet::dispatch_leased(&*store, &mut dispatcher, log, &stop).await;
        drain.abort();
        if let (Some(p), false) = (&planner, stop.is_stopping()) {
            // Finished (planned to its end) or failed: nothing is left to plan.
            p.abort();
        }
    } else if let Log::Rerun(k) = log {
        for offset in rerun_buckets {
            if result.is_err() || stop.is_stopping() {
                break;
            }
            result = match store.rerun_bucket_items(&offset).await {
                Ok(items) => {
                    let (done, todo) = rerun_work(k, offset.bucket, items);
                    let track = Track {
                        key: offset.bucket,
                        bucket: offset.bucket,
                        remaining: todo.len() as u64,
                        done,
                        lease: dispatcher.job_lease(),
                    };
                    dispatcher.dispatch(vec![track], vec![todo]).await
                }
                Err(e) => Err(e.into()),
            };
        }
    }
    if let (true, Some(_), Some(plan_rx)) = (result.is_ok(), &planner, plan_rx.as_mut()) {
        while let Some(batch) = plan_rx.recv().await {
            if let Err(e) = dispatcher.dispatch_planned(batch).await {
                result = Err(e);
                break;
            }
            if stop.is_stopping() {
                break;
            }
        }
    }
    drop(plan_rx);
    let finished = dispatcher.finish(opts.shutdown_timeout).await;
    drop(dispatcher);
    let written = writer
        .await
        .map_err(|e| EngineError::Internal(format!("result writer: {e}")))?;
    controller.abort();
    if let Some(f) = follower {
        f.abort();
    }
    forward.abort();
    let planned = match planner {
        Some(p) => match p.await {
            Ok(planned) => planned,
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => return Err(EngineError::Internal(format!("planner: {e}"))),
        },
        None => Ok(()),
    };
    let released = match &lease {
        Some(lease) => store.release(lease).await,
        None => Ok(()),
    };
    finished?;
    written?;
    result?;
    planned?;
    released?;
    Ok(RunSummary {
        job: store.stats().await?,
        run: counters.snapshot(),
        elapsed_ms: millis(started.elapsed()),
        interrupted: stop.is_stopping(),
        halted: halt.reason(),
    })
}
