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
//!   result to the writer;
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
//! Stopping: on a stop request no new item is dispatched, items waiting for a retry are
//! abandoned (they stay pending), items in flight get `shutdown_timeout` to finish, then the
//! writer makes everything it received durable and the run returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinSet;

use crate::failure::Failure;
use crate::handler::{millis, Handler};
use crate::input::InputReader;
use crate::job::{now_ms, Durability, FailureLimit, JobSpec, RunOptions};
use crate::plan::{PlanError, Planner};
use crate::progress::{Counters, RunSummary};
use crate::retry::{self, Charge, ItemOutcome};
use crate::store::{
    CommitRecord, ItemRecord, ItemStatus, JobView, Lease, LeaseScope, Leases, Log, PlannedBucket,
    Store, StoreError, Tally,
};
use crate::throttle::{ItemHistory, Observed, Throttle};

mod fleet;
mod queue;
use queue::WorkQueue;

/// Rows the planner reads per store write: several small buckets share one durable write.
pub const PLAN_BATCH_ROWS: u64 = 1000;

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

/// The capacity of the queue of results waiting to be made durable.
///
/// While one group of results is being flushed the next one queues here, so this is also
/// the largest group a flush covers: large enough that the flush's fixed cost is spread over
/// hundreds of results at full speed, small enough that a kill -9 repeats few calls.
fn writer_queue(concurrency: usize) -> usize {
    (4 * concurrency).max(256)
}

/// How long the writer gathers results before one flush makes them durable, unless a
/// group's worth ([`group_target`]) is queued sooner.
pub const GROUP_COMMIT_DELAY: Duration = Duration::from_millis(5);

/// The most items whose API call may be repeated after a kill -9: those in flight, plus
/// those whose results were queued or being written but not yet durable.
pub fn max_unsynced_items(concurrency: usize) -> usize {
    concurrency + 2 * writer_queue(concurrency)
}

/// Asks a run to stop. Cloneable; `stop` is idempotent.
#[derive(Clone)]
pub struct StopHandle(Arc<watch::Sender<bool>>);

/// A run's view of stop requests.
#[derive(Clone)]
pub struct Stop(watch::Receiver<bool>);

/// A connected pair: the handle asks, the run listens.
pub fn stop_pair() -> (StopHandle, Stop) {
    let (tx, rx) = watch::channel(false);
    (StopHandle(Arc::new(tx)), Stop(rx))
}

impl StopHandle {
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

impl Stop {
    pub fn is_stopping(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once a stop was asked for.
    pub async fn stopping(&self) {
        let mut rx = self.0.clone();
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

struct Item {
    id: String,
    row: u64,
    /// The job bucket the ID belongs to.
    bucket: u64,
    /// The bucket whose commit waits for this item: the job bucket, or a rerun bucket.
    track: u64,
    /// In a rerun: the record the result replaces.
    prior: Option<Box<ItemRecord>>,
}

/// A bucket to replay: its number, results already final, and the items to call.
type Replay = (u64, Tally, Vec<Item>);

/// A bucket about to be dispatched: `remaining` items to wait for, `done` already counted,
/// and the lease its commit carries.
struct Track {
    /// What the bucket's items carry as their `track`: the bucket itself, or in a shared
    /// store a key of this lease's own (a bucket leased again gets a new track, and the
    /// results of its earlier lease's items never count towards it).
    key: u64,
    bucket: u64,
    remaining: u64,
    done: Tally,
    lease: Lease,
}

enum WriterMsg {
    /// Buckets about to be dispatched (one message per planner batch: with one-row buckets,
    /// one message per bucket would double the writer's traffic).
    Track(Vec<Track>),
    Done {
        id: String,
        track: u64,
        record: ItemRecord,
    },
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
            pause: shared.then(|| fleet::pauser(store.clone(), throttle.clone())),
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

/// What is left of a job bucket: results already final, and the items to call.
fn job_work(bucket: u64, items: Vec<(String, ItemRecord)>) -> (Tally, Vec<Item>) {
    let (mut done, mut todo) = (Tally::default(), Vec::new());
    for (id, record) in items {
        match record.status {
            ItemStatus::Ok | ItemStatus::Failed => done.add(&record),
            ItemStatus::Pending => todo.push(Item {
                id,
                row: record.row,
                bucket,
                track: bucket,
                prior: None,
            }),
        }
    }
    (done, todo)
}

/// What is left of a rerun bucket: results this rerun already made durable, and the items
/// to call (each with the history of the record it replaces, not its body).
fn rerun_work(rerun: u32, bucket: u64, items: Vec<(String, ItemRecord)>) -> (Tally, Vec<Item>) {
    let (mut done, mut todo) = (Tally::default(), Vec::new());
    for (id, record) in items {
        match (record.rerun == Some(rerun), record.status) {
            (true, ItemStatus::Ok | ItemStatus::Failed) => done.add(&record),
            _ => todo.push(Item {
                id,
                row: record.row,
                bucket: record.bucket,
                track: bucket,
                prior: Some(Box::new(ItemRecord {
                    body: None,
                    ..record
                })),
            }),
        }
    }
    (done, todo)
}

/// The planner thread: cut, write ahead, sync, hand over; until the input ends or nobody
/// listens any more.
fn plan_ahead<S: Store>(
    mut planner: Planner,
    store: Arc<S>,
    out: mpsc::Sender<Vec<PlannedBucket>>,
    stop: Stop,
    counters: Arc<Counters>,
) -> impl FnOnce() -> Result<(), PlanError> {
    move || {
        let runtime = tokio::runtime::Handle::current();
        while !stop.is_stopping() {
            let before = planner.state();
            let batch = runtime.block_on(planner.next_batch(&*store, PLAN_BATCH_ROWS))?;
            if batch.is_empty() && planner.state() == before {
                return Ok(());
            }
            let start = Instant::now();
            runtime.block_on(store.plan(&batch, &planner.state()))?;
            Counters::add_elapsed(&counters.plan_write_ns, start);
            let start = Instant::now();
            runtime.block_on(store.sync())?;
            Counters::add_elapsed(&counters.plan_sync_ns, start);
            Counters::add(&counters.store_syncs, 1);
            Counters::add(&counters.buckets_planned, batch.len() as u64);
            for b in &batch {
                Counters::add(
                    &counters.rows_planned,
                    b.offset.end.row - b.offset.start.row,
                );
                Counters::add(&counters.ids_planned, b.offset.items);
            }
            if batch.is_empty() || out.blocking_send(batch).is_err() {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// The most items queued for the workers: enough that none waits for the dispatcher, which
/// is woken to refill it only once it has drained to half.
fn work_queue(workers: usize) -> usize {
    (4 * workers).max(64)
}

struct Dispatcher {
    stop: Stop,
    queue: Arc<WorkQueue<Item>>,
    /// `concurrency` workers, each calling the API for one item at a time.
    workers: JoinSet<()>,
    writer: mpsc::Sender<WriterMsg>,
    /// Whether replayed buckets are the job's own (logged as such), not a rerun's.
    replaying: bool,
    /// The run's lease on the whole job (none: a shared store's run, which leases buckets).
    lease: Option<Lease>,
}

impl Dispatcher {
    /// The job's lease, which the buckets of a run that holds it are committed under.
    fn job_lease(&self) -> Lease {
        self.lease
            .clone()
            .expect("only a run holding the job's lease replays and plans by itself")
    }

    /// Replay buckets written ahead but never committed: only their unfinished items.
    async fn replay(&mut self, open: Vec<Replay>) -> Result<(), EngineError> {
        if !open.is_empty() && self.replaying {
            tracing::info!(
                buckets = open.len(),
                "replaying buckets that were not committed"
            );
        }
        let (tracks, work) = open
            .into_iter()
            .map(|(bucket, done, todo)| {
                let remaining = todo.len() as u64;
                let track = Track {
                    key: bucket,
                    bucket,
                    remaining,
                    done,
                    lease: self.job_lease(),
                };
                (track, todo)
            })
            .unzip();
        self.dispatch(tracks, work).await
    }

    async fn dispatch_planned(&mut self, batch: Vec<PlannedBucket>) -> Result<(), EngineError> {
        let (tracks, work) = batch
            .into_iter()
            .map(|b| {
                let bucket = b.offset.bucket;
                let track = Track {
                    key: bucket,
                    bucket,
                    remaining: b.items.len() as u64,
                    done: Tally::default(),
                    lease: self.job_lease(),
                };
                let items = b
                    .items
                    .into_iter()
                    .map(|(row, id)| Item {
                        id,
                        row,
                        bucket,
                        track: bucket,
                        prior: None,
                    })
                    .collect();
                (track, items)
            })
            .unzip();
        self.dispatch(tracks, work).await
    }

    /// Have the writer track the buckets, then queue their items for the workers, bucket
    /// after bucket, until done or asked to stop.
    async fn dispatch(
        &mut self,
        tracks: Vec<Track>,
        work: Vec<Vec<Item>>,
    ) -> Result<(), EngineError> {
        self.writer
            .send(WriterMsg::Track(tracks))
            .await
            .map_err(|_| writer_gone())?;
        for items in work {
            if self.writer.is_closed() {
                return Err(writer_gone());
            }
            if !self.queue.push_all(items, &self.stop).await {
                break;
            }
        }
        Ok(())
    }

    /// Let the workers finish what is queued and in flight; after a stop request, wait for
    /// the items in flight for at most `timeout`, then abandon them (they stay pending and
    /// are replayed). A worker that panicked fails the run.
    async fn finish(&mut self, timeout: Duration) -> Result<(), EngineError> {
        self.queue.close();
        let mut panicked = None;
        let mut note = |done: Result<(), tokio::task::JoinError>| {
            if let Err(e) = done {
                if e.is_panic() {
                    tracing::error!("item worker failed: {e}");
                    panicked.get_or_insert(e.to_string());
                }
            }
        };
        let workers = &mut self.workers;
        let all_done = async {
            while let Some(done) = workers.join_next().await {
                note(done);
            }
        };
        if self.stop.is_stopping() {
            let _ = tokio::time::timeout(timeout, all_done).await;
        } else {
            tokio::select! {
                _ = all_done => {}
                _ = async { self.stop.stopping().await; tokio::time::sleep(timeout).await } => {}
            }
        }
        // Workers still running are busy with an item (idle ones end at the stop, unless the
        // timeout was too short for them to see it); aborting one mid-item counts its item
        // abandoned.
        let left = self.workers.len() as u64;
        if left > 0 {
            tracing::warn!(
                workers = left,
                "stopping with workers still busy; their items stay pending and are replayed"
            );
            self.workers.abort_all();
            // Joined one by one, not `shutdown`, so a panic on the way out is still reported.
            while let Some(done) = self.workers.join_next().await {
                note(done);
            }
        }
        match panicked {
            Some(e) => Err(EngineError::Internal(format!("item worker: {e}"))),
            None => Ok(()),
        }
    }
}

/// A worker: take items from the queue and process them, one at a time, each under a
/// permit of the run's (adaptive) concurrency limit, until the queue is closed and empty or
/// a stop is asked for.
async fn work<H: Handler>(
    task: ItemTask<H>,
    queue: Arc<WorkQueue<Item>>,
    permits: Arc<Semaphore>,
    halt: Arc<Halt>,
) {
    // A panic in a worker stops the run (finish reports it) instead of leaving its share of
    // the queue to the others unnoticed.
    let _halt_on_panic = HaltOnPanic(&halt);
    while let Some(item) = queue.pop(&task.stop).await {
        let permit = tokio::select! {
            permit = permits.acquire() => permit.expect("the semaphore is never closed"),
            // Not started: the item stays pending, like the rest of the queue.
            _ = task.stop.stopping() => return,
        };
        // A permit and a stop at once: the stop wins.
        if task.stop.is_stopping() {
            return;
        }
        // Leases that may have lapsed: no call starts until they are surely held again.
        while !(task.alive)() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = task.stop.stopping() => return,
            }
        }
        let mut started = Abandon(Some(&task.counters));
        task.process(item).await;
        started.0 = None;
        drop(permit);
        if let Some(c) = task.throttle.concurrency() {
            c.settle();
        }
    }
}

/// Counts an item abandoned if dropped while it holds the counters: its worker was aborted
/// mid-item.
struct Abandon<'a>(Option<&'a Counters>);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(counters) = self.0 {
            Counters::add(&counters.abandoned, 1);
        }
    }
}

/// Stops the run if dropped while it holds the stop handle.
struct StopOnDrop<'a>(Option<&'a StopHandle>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(stop) = self.0 {
            stop.stop();
        }
    }
}

struct HaltOnPanic<'a>(&'a Halt);

impl Drop for HaltOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .halt("internal error: an item worker panicked".into());
        }
    }
}

fn writer_gone() -> EngineError {
    EngineError::Internal("the result writer stopped".into())
}

struct ItemTask<H> {
    throttle: Arc<Throttle>,
    spec: Arc<JobSpec>,
    handler: Arc<H>,
    counters: Arc<Counters>,
    stop: Stop,
    writer: mpsc::Sender<WriterMsg>,
    writer_full: Arc<Notify>,
    rerun: Option<u32>,
    /// Whether the run's leases are surely held ([`Leases::alive`]).
    alive: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Pause the whole fleet (a worker of a shared job saw `Retry-After`).
    pause: Option<fleet::Pauser>,
}

impl<H: Handler> ItemTask<H> {
    async fn process(&self, item: Item) {
        let handler = &*self.handler;
        let counters = &self.counters;
        let throttle = &*self.throttle;
        let stop = &self.stop;
        let pause = &self.pause;
        let id = item.id.as_str();
        // When the first and the last attempt started, and how long the last one took (µs).
        let (first_at, last_at) = (&AtomicU64::new(0), &AtomicU64::new(0));
        // What the throttle learnt of this ID's failures (is it failing alone?).
        let history = &ItemHistory::default();
        let last_latency = &AtomicU64::new(0);
        let outcome = retry::run(
            &self.spec.retry,
            |attempt| async move {
                // Waiting for the rate limit or for the API to come back is given up on a
                // stop; a request already sent is let finish.
                let probe = tokio::select! {
                    probe = throttle.before_attempt() => probe,
                    _ = stop.stopping() => return None,
                };
                let at = now_ms();
                let _ = first_at.compare_exchange(0, at, Relaxed, Relaxed);
                last_at.store(at, Relaxed);
                Counters::add(&counters.attempts, 1);
                if attempt > 1 {
                    Counters::add(&counters.retries, 1);
                }
                // Counted down when the call ends, or when its task is aborted mid-call
                // (a stop past --shutdown-timeout).
                let in_flight = counters.in_flight_guard();
                let start = Instant::now();
                let result = handler.call(id).await;
                drop(in_flight);
                let latency = start.elapsed();
                last_latency.store(latency.as_micros() as u64, Relaxed);
                Counters::add_elapsed(&counters.api_ns, start);
                counters.http.observe(&result, latency);
                let observed = Observed::of(&result, latency);
                if let (Err(e), Some(pause)) = (&result, pause) {
                    if let Some(Some(after)) = e.next.retry_after() {
                        pause(after);
                    }
                }
                match &result {
                    Err(Failure {
                        status: Some(429), ..
                    }) => Counters::add(&throttle.throttled, 1),
                    Err(Failure {
                        status: Some(503), ..
                    }) => Counters::add(&throttle.unavailable, 1),
                    _ => {}
                }
                let counts = throttle.charge(observed, probe, history).await;
                Some((
                    result,
                    if counts {
                        Charge::Counted
                    } else {
                        Charge::Free
                    },
                ))
            },
            self.stop.stopping(),
        )
        .await;
        let mut record = ItemRecord::pending(item.row, item.bucket);
        record.finished_at_ms = Some(now_ms());
        record.first_attempt_ms = Some(first_at.load(Relaxed)).filter(|&t| t > 0);
        record.last_attempt_ms = Some(last_at.load(Relaxed)).filter(|&t| t > 0);
        match outcome {
            ItemOutcome::Ok {
                output,
                attempts,
                errors,
            } => {
                record.attempt_errors = errors;
                record.status = ItemStatus::Ok;
                record.http_status = output.status;
                record.body = Some(output.result);
                record.latency_ms = Some(last_latency.load(Relaxed) / 1000);
                record.attempts = attempts;
            }
            ItemOutcome::Failed {
                error,
                attempts,
                errors,
            } => {
                record.attempt_errors = errors;
                tracing::debug!(id, class = %error.class, error = %error.message, "item failed");
                record.status = ItemStatus::Failed;
                record.http_status = error.status;
                record.class = Some(error.class);
                record.error = Some(error.message);
                record.attempts = attempts;
            }
            ItemOutcome::Abandoned => {
                Counters::add(&counters.abandoned, 1);
                return;
            }
        }
        if let Some(prior) = &item.prior {
            record.continue_from(prior);
        }
        record.rerun = self.rerun;
        // A closed writer means the run is failing; the item stays pending and is replayed.
        let msg = WriterMsg::Done {
            id: item.id,
            track: item.track,
            record,
        };
        match self.writer.try_send(msg) {
            Ok(()) => {
                // A group is ready: have the writer take it before the queue fills up and
                // workers have to wait.
                let queue = self.writer.max_capacity();
                if queue - self.writer.capacity() >= group_target(queue) {
                    self.writer_full.notify_one();
                }
            }
            Err(mpsc::error::TrySendError::Full(msg)) => {
                // The writer is behind: this item (and so its worker) waits for room.
                Counters::add(&counters.writer_backpressure, 1);
                self.writer_full.notify_one();
                let _ = self.writer.send(msg).await;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

/// A run stopping itself, and why.
struct Halt {
    stop: StopHandle,
    reason: std::sync::Mutex<Option<String>>,
}

impl Halt {
    fn reason(&self) -> Option<String> {
        self.reason.lock().expect("never poisoned").clone()
    }

    fn halt(&self, reason: String) {
        let mut r = self.reason.lock().expect("never poisoned");
        if r.is_none() {
            tracing::error!("{reason}");
            *r = Some(reason);
        }
        self.stop.stop();
    }
}

/// The controller task: adapt at every tick; halt the run when the API is out too long.
async fn control(throttle: Arc<Throttle>, halt: Arc<Halt>) {
    let tick = throttle.tick_interval();
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    let mut last = Instant::now();
    loop {
        ticker.tick().await;
        throttle.on_tick(last.elapsed());
        last = Instant::now();
        if let Some(out) = throttle.outage() {
            if out > throttle.max_outage() {
                halt.halt(format!(
                    "the API has been unreachable for {} (--max-outage {}); every result so far is durable",
                    humantime::format_duration(Duration::from_secs(out.as_secs())),
                    humantime::format_duration(throttle.max_outage()),
                ));
                return;
            }
        }
    }
}

struct Tracked {
    bucket: u64,
    remaining: u64,
    done: Tally,
}

/// The writer task's bookkeeping: which buckets wait for how many results, and the run's
/// failure limit.
struct Writer<S> {
    store: Arc<S>,
    counters: Arc<Counters>,
    max_failures: Option<FailureLimit>,
    halt: Arc<Halt>,
    open: HashMap<u64, Tracked>,
    /// Which commit log the buckets belong to: the job's or a rerun's.
    log: Log,
    /// The lease each track is committed under, by track key.
    leases: HashMap<u64, Lease>,
    /// The leases of completed buckets waiting for their commit, by bucket.
    completed: HashMap<u64, Lease>,
    /// A shared store: a bucket whose lease was lost is dropped, not an error.
    shared: bool,
    /// Rung when a sender finds the queue holding a group, or full.
    full: Arc<Notify>,
}

impl<S: Store + Leases> Writer<S> {
    /// Sort messages: start tracking buckets (those with nothing left to wait for go
    /// straight to `ready`), collect results with the bucket each one completes (`tracks`).
    fn sort(
        &mut self,
        msgs: &mut Vec<WriterMsg>,
        results: &mut Vec<(String, ItemRecord)>,
        tracks: &mut Vec<u64>,
        ready: &mut Vec<CommitRecord>,
    ) {
        for msg in msgs.drain(..) {
            match msg {
                WriterMsg::Track(tracks) => {
                    for Track {
                        key,
                        bucket,
                        remaining,
                        done,
                        lease,
                    } in tracks
                    {
                        if remaining == 0 {
                            self.completed.insert(bucket, lease);
                            ready.push(CommitRecord::new(bucket, done));
                        } else {
                            self.leases.insert(key, lease);
                            self.open.insert(
                                key,
                                Tracked {
                                    bucket,
                                    remaining,
                                    done,
                                },
                            );
                        }
                    }
                }
                WriterMsg::Done { id, track, record } => {
                    tracks.push(track);
                    results.push((id, record))
                }
            }
        }
    }

    /// Write results to the store (durable at the next sync) and count them; the buckets
    /// whose last result this was go to `done`. `tracks[i]` is the bucket `results[i]`
    /// completes (the job bucket, or the rerun bucket in a rerun).
    async fn record(
        &mut self,
        results: &[(String, ItemRecord)],
        tracks: &[u64],
        done: &mut Vec<CommitRecord>,
    ) -> Result<(), StoreError> {
        if results.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        self.store.record(results).await?;
        Counters::add_elapsed(&self.counters.record_write_ns, start);
        for ((_, record), &track) in results.iter().zip(tracks) {
            let ok = record.status == ItemStatus::Ok;
            Counters::add(
                if ok {
                    &self.counters.ok
                } else {
                    &self.counters.failed
                },
                1,
            );
            let Some(t) = self.open.get_mut(&track) else {
                tracing::error!(bucket = track, "a result for a bucket that is not tracked");
                continue;
            };
            t.done.add(record);
            t.remaining = t.remaining.saturating_sub(1);
            if t.remaining == 0 {
                let t = self.open.remove(&track).expect("just seen");
                if let Some(lease) = self.leases.remove(&track) {
                    self.completed.insert(t.bucket, lease);
                }
                done.push(CommitRecord::new(t.bucket, t.done));
            }
        }
        self.check_failures(results);
        Ok(())
    }

    /// Write commit records, each under its bucket's lease; callers made the buckets'
    /// results durable first. In a shared store a bucket whose lease was lost is another
    /// worker's now: it is dropped here, with a warning.
    async fn commit(&mut self, commits: &mut Vec<CommitRecord>) -> Result<(), StoreError> {
        if commits.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let mut groups: Vec<(Lease, Vec<CommitRecord>)> = Vec::new();
        for c in commits.drain(..) {
            let Some(lease) = self.completed.remove(&c.bucket) else {
                tracing::error!(bucket = c.bucket, "a bucket to commit without a lease");
                continue;
            };
            match groups.iter_mut().find(|(l, _)| *l == lease) {
                Some((_, group)) => group.push(c),
                None => groups.push((lease, vec![c])),
            }
        }
        for (lease, group) in groups {
            match crate::store::view::commit(&*self.store, &lease, self.log, &group).await {
                Ok(()) => Counters::add(&self.counters.buckets_committed, group.len() as u64),
                Err(e) if self.shared && matches!(e.root(), StoreError::LeaseLost { .. }) => {
                    let buckets: Vec<u64> = group.iter().map(|c| c.bucket).collect();
                    tracing::warn!(?buckets, "not committed here: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        Counters::add_elapsed(&self.counters.commit_write_ns, start);
        Ok(())
    }

    /// Give back the leases of buckets left unfinished (a stop), so other workers take
    /// them at once. Only a shared store's: a run's lease on the whole job is the run's.
    async fn release_unfinished(&mut self) -> Result<(), StoreError> {
        if self.shared {
            for (_, lease) in self.leases.drain() {
                self.store.release(&lease).await?;
            }
        }
        Ok(())
    }

    fn check_failures(&self, results: &[(String, ItemRecord)]) {
        let Some(limit) = self.max_failures else {
            return;
        };
        let now = self.counters.snapshot();
        if limit.exceeded(now.failed, now.done()) {
            let last = results
                .iter()
                .rev()
                .find_map(|(_, r)| r.error.clone())
                .unwrap_or_default();
            self.halt.halt(format!(
                "{} of {} IDs failed permanently in this run, past --max-failures; the last error: {last}",
                now.failed,
                now.done()
            ));
        }
    }

    /// Synchronous progress: gather a group, write it, make it durable with one sync, then
    /// write the commit records of the buckets it completed (group commit).
    async fn run_sync(mut self, mut rx: mpsc::Receiver<WriterMsg>) -> Result<(), EngineError> {
        let (mut msgs, mut results, mut ready) = (Vec::new(), Vec::new(), Vec::new());
        let mut tracks = Vec::new();
        let max_group = rx.max_capacity();
        while rx.recv_many(&mut msgs, max_group).await > 0 {
            // One flush covers the whole group. Nobody waits on it but the commit records.
            gather(&mut rx, &mut msgs, &self.full).await;
            self.sort(&mut msgs, &mut results, &mut tracks, &mut ready);
            if !results.is_empty() {
                let mut done = Vec::new();
                self.record(&results, &tracks, &mut done).await?;
                results.clear();
                tracks.clear();
                timed_sync(&*self.store, &self.counters).await?;
                ready.append(&mut done);
            }
            self.commit(&mut ready).await?;
        }
        timed_sync(&*self.store, &self.counters).await?;
        Ok(self.release_unfinished().await?)
    }

    /// Asynchronous progress: write results as they come; every `interval` a background
    /// sync makes everything written so far durable, and once it returns the commit records
    /// of the buckets completed before it started are written (durable at the next one).
    async fn run_async(
        mut self,
        mut rx: mpsc::Receiver<WriterMsg>,
        interval: Duration,
    ) -> Result<(), EngineError> {
        let (mut msgs, mut results, mut tracks) = (Vec::new(), Vec::new(), Vec::new());
        // Buckets whose results are all written but not yet covered by a finished sync.
        let mut unsynced: Vec<CommitRecord> = Vec::new();
        // The sync in progress and the buckets it covers.
        let mut syncing: Option<(Vec<CommitRecord>, tokio::task::JoinHandle<_>)> = None;
        let mut dirty = false;
        let max_group = rx.max_capacity();
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut msgs, max_group) => {
                    if n == 0 {
                        break;
                    }
                    // Fewer, larger store writes.
                    gather(&mut rx, &mut msgs, &self.full).await;
                    self.sort(&mut msgs, &mut results, &mut tracks, &mut unsynced);
                    self.record(&results, &tracks, &mut unsynced).await?;
                    dirty |= !results.is_empty() || !unsynced.is_empty();
                    results.clear();
                    tracks.clear();
                }
                _ = ticker.tick(), if syncing.is_none() && dirty => {
                    let (store, counters) = (self.store.clone(), self.counters.clone());
                    let covered = std::mem::take(&mut unsynced);
                    let sync = async move { timed_sync(&*store, &counters).await };
                    syncing = Some((covered, tokio::spawn(sync)));
                    dirty = false;
                }
                synced = async { (&mut syncing.as_mut().expect("guarded").1).await }, if syncing.is_some() => {
                    let (mut covered, _) = syncing.take().expect("guarded");
                    synced.map_err(|e| EngineError::Internal(format!("background sync: {e}")))??;
                    Counters::add(&self.counters.checkpoints, 1);
                    dirty |= !covered.is_empty();
                    self.commit(&mut covered).await?;
                }
            }
        }
        // The run is over: make everything durable, then commit what is left.
        if let Some((mut covered, handle)) = syncing.take() {
            handle
                .await
                .map_err(|e| EngineError::Internal(format!("background sync: {e}")))??;
            self.commit(&mut covered).await?;
        }
        timed_sync(&*self.store, &self.counters).await?;
        self.commit(&mut unsynced).await?;
        timed_sync(&*self.store, &self.counters).await?;
        Ok(self.release_unfinished().await?)
    }
}

/// The writer's sync, timed and counted for progress reports.
async fn timed_sync<S: Store>(store: &S, counters: &Counters) -> Result<(), StoreError> {
    let start = Instant::now();
    store.sync().await?;
    Counters::add_elapsed(&counters.result_sync_ns, start);
    Counters::add(&counters.store_syncs, 1);
    Ok(())
}

/// Add to `msgs` what arrives within [`GROUP_COMMIT_DELAY`], until it holds a group
/// ([`group_target`]) or the delay is over.
async fn gather(rx: &mut mpsc::Receiver<WriterMsg>, msgs: &mut Vec<WriterMsg>, full: &Notify) {
    // Woken by the deadline or a queue holding a group, not by every message: at tens of
    // thousands of results per second a wake-up per result cost more than writing them.
    let max_group = rx.max_capacity();
    let target = group_target(max_group);
    let deadline = tokio::time::sleep(GROUP_COMMIT_DELAY);
    tokio::pin!(deadline);
    loop {
        let open = take_queued(rx, msgs, max_group);
        if !open || msgs.len() >= target {
            return;
        }
        tokio::select! {
            biased;
            _ = full.notified() => {}
            _ = &mut deadline => {
                take_queued(rx, msgs, max_group);
                return;
            }
        }
    }
}

/// How many results the writer gathers before it writes them without waiting for the group
/// commit delay: three quarters of its queue, so the rest takes the results that come while
/// it writes and syncs, and workers seldom wait for room.
fn group_target(queue: usize) -> usize {
    queue - queue / 4
}

/// Move queued messages to `msgs` until it holds `max`; false once no sender is left.
fn take_queued(rx: &mut mpsc::Receiver<WriterMsg>, msgs: &mut Vec<WriterMsg>, max: usize) -> bool {
    while msgs.len() < max {
        match rx.try_recv() {
            Ok(msg) => msgs.push(msg),
            Err(mpsc::error::TryRecvError::Empty) => break,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::api::{ApiConfig, FakeApi, Fault};
    use crate::handler::http::HttpHandler;
    use crate::input::{InputFormat, InputSpec};
    use crate::job::{open_job, JobRequest};
    use crate::store::conformance::Audit;
    use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};

    struct Setup {
        _dir: tempfile::TempDir,
        store: Arc<SledStore>,
        spec: Arc<JobSpec>,
        api: FakeApi,
    }

    async fn setup(ids: &[String], bucket_size: u64, config: ApiConfig) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("ids.txt");
        std::fs::write(&input, ids.join("\n")).unwrap();
        let api = FakeApi::start(config).await.unwrap();
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
            url: Some(api.url_template()),
            bucket_size: Some(bucket_size),
            ..JobRequest::default()
        };
        let spec = open_job(&store, &request).await.unwrap();
        Setup {
            _dir: dir,
            store: Arc::new(store),
            spec: Arc::new(spec),
            api,
        }
    }

    async fn run_once(s: &Setup, stop: Stop) -> RunSummary {
        run_with(s.store.clone(), s, stop, Durability::Sync).await
    }

    async fn run_with<T: Store + Leases>(
        store: Arc<T>,
        s: &Setup,
        stop: Stop,
        durability: Durability,
    ) -> RunSummary {
        try_run_with(store, s, stop, durability).await.unwrap()
    }

    /// A run at concurrency 4 over `store`.
    async fn try_run_with<T: Store + Leases>(
        store: Arc<T>,
        s: &Setup,
        stop: Stop,
        durability: Durability,
    ) -> Result<RunSummary, EngineError> {
        let handler = Arc::new(HttpHandler::new(&s.spec.request).unwrap());
        let opts = RunOptions {
            concurrency: 4,
            progress_interval: Duration::ZERO,
            durability,
            ..RunOptions::default()
        };
        run(
            store,
            s.spec.clone(),
            handler,
            &opts,
            Arc::new(Counters::default()),
            stop,
        )
        .await
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("e-{i}")).collect()
    }

    /// A run stopped once the API has seen `calls` calls.
    async fn stopped_after(s: &Setup, calls: u64, durability: Durability) -> RunSummary {
        let (handle, stop) = stop_pair();
        let api = s.api.clone();
        let stopper = tokio::spawn(async move {
            while api.total_calls() < calls {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            handle.stop();
        });
        let summary = run_with(s.store.clone(), s, stop, durability).await;
        stopper.await.unwrap();
        summary
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_commits_every_bucket_and_calls_each_id_once() {
        let ids = ids(2500);
        let s = setup(&ids, 100, ApiConfig::fast()).await;
        let summary = run_once(&s, stop_pair().1).await;
        assert!(summary.job.finished());
        assert_eq!((summary.job.ok, summary.job.failed), (2500, 0));
        assert_eq!(summary.job.buckets_committed, 25);
        assert_eq!(s.api.total_calls(), 2500);
        assert_eq!(s.api.distinct_ids(), 2500);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replay_calls_only_items_without_a_final_result() {
        let ids = ids(300);
        let s = setup(&ids, 100, ApiConfig::fast()).await;
        // Plan everything ahead as a crashed run would have, and finish some items of bucket 1.
        let reader = InputReader::open(&s.spec.input, Default::default()).unwrap();
        let mut planner = Planner::new(reader, Default::default(), 100, false, s.spec.fingerprint);
        let batch = planner.next_batch(&*s.store, 1000).await.unwrap();
        s.store.plan(&batch, &planner.state()).await.unwrap();
        let mut done = Vec::new();
        for (row, id) in batch[1].items.iter().take(60) {
            let mut r = ItemRecord::pending(*row, 1);
            r.status = ItemStatus::Ok;
            r.attempts = 1;
            r.body = Some(serde_json::value::to_raw_value(&"earlier").unwrap());
            done.push((id.clone(), r));
        }
        s.store.record(&done).await.unwrap();
        s.store.sync().await.unwrap();

        let summary = run_once(&s, stop_pair().1).await;
        assert!(summary.job.finished());
        assert_eq!(summary.job.ok, 300);
        assert_eq!(
            s.api.total_calls(),
            240,
            "the 60 finished items are not called again"
        );
        for (id, _) in &done {
            assert_eq!(s.api.calls(id), 0);
        }
        let items = s.store.bucket_items(&batch[1].offset).await.unwrap();
        assert_eq!(
            items[0].1.body.as_ref().unwrap().get(),
            "\"earlier\"",
            "replays keep earlier results"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_run_leaves_a_consistent_store_that_resumes() {
        let ids = ids(3000);
        let config = ApiConfig {
            latency_min: Duration::from_millis(2),
            latency_max: Duration::from_millis(2),
            ..ApiConfig::fast()
        };
        let s = setup(&ids, 50, config).await;
        let first = stopped_after(&s, 500, Durability::Sync).await;
        assert!(first.interrupted);
        assert!(!first.job.finished());
        assert_eq!(
            first.job.ok, first.run.ok,
            "every result this run reported is in the store"
        );
        let second = run_once(&s, stop_pair().1).await;
        assert!(second.job.finished());
        assert_eq!(second.job.ok, 3000);
        assert_eq!(s.api.distinct_ids(), 3000);
        assert!(s.api.total_calls() <= 3000 + max_unsynced_items(4) as u64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closure_handler_runs_a_job_under_the_same_retries_and_store() {
        use crate::failure::{ErrorClass, Failure};
        use std::sync::Mutex;
        let ids = ids(600);
        let s = setup(&ids, 50, ApiConfig::fast()).await;
        let calls = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
        let handler = {
            let calls = calls.clone();
            move |id: String| {
                let calls = calls.clone();
                async move {
                    let n: u64 = id[2..].parse().unwrap();
                    let attempt = {
                        let mut calls = calls.lock().unwrap();
                        let c = calls.entry(id.clone()).or_default();
                        *c += 1;
                        *c
                    };
                    match n % 10 {
                        0 => Err(Failure::permanent(format!("{id} is refused"))),
                        1 if attempt < 3 => Err(Failure::retry("not yet")),
                        2 if attempt < 2 => Err(Failure::pushback("busy", None).status(429)),
                        _ => Ok(serde_json::json!({ "id": id, "double": n * 2 })),
                    }
                }
            }
        };
        let opts = RunOptions {
            concurrency: 8,
            progress_interval: Duration::ZERO,
            ..RunOptions::default()
        };
        let mut spec = (*s.spec).clone();
        spec.retry.initial = Duration::from_millis(1);
        spec.retry.max_interval = Duration::from_millis(2);
        let summary = run(
            s.store.clone(),
            Arc::new(spec),
            Arc::new(handler),
            &opts,
            Arc::new(Counters::default()),
            stop_pair().1,
        )
        .await
        .unwrap();
        assert!(summary.job.finished());
        assert_eq!((summary.job.ok, summary.job.failed), (540, 60));
        assert_eq!(s.api.total_calls(), 0, "the closure did the work");
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls["e-10"], 1, "a permanent failure is not retried");
        assert_eq!(calls["e-11"], 3);
        assert_eq!(calls["e-12"], 2);
        assert_eq!(calls["e-13"], 1);
        let offset = s.store.offset(0).await.unwrap().unwrap();
        let items: HashMap<_, _> = s
            .store
            .bucket_items(&offset)
            .await
            .unwrap()
            .into_iter()
            .collect();
        let failed = &items["e-10"];
        assert_eq!(failed.status, ItemStatus::Failed);
        assert_eq!(failed.class, Some(ErrorClass::Handler));
        assert_eq!(failed.error.as_deref(), Some("e-10 is refused"));
        let ok = &items["e-12"];
        assert_eq!(
            ok.body.as_ref().unwrap().get(),
            r#"{"double":24,"id":"e-12"}"#
        );
        assert_eq!(
            (ok.attempts, ok.attempt_errors[0].http_status),
            (2, Some(429))
        );
    }

    #[tokio::test]
    async fn a_panicking_worker_halts_the_run_and_an_aborted_one_counts_its_item_abandoned() {
        let (handle, stop) = stop_pair();
        let halt = Arc::new(Halt {
            stop: handle,
            reason: std::sync::Mutex::new(None),
        });
        let panicking = tokio::spawn({
            let halt = halt.clone();
            async move {
                let _guard = HaltOnPanic(&halt);
                panic!("a bug in an item");
            }
        });
        assert!(panicking.await.unwrap_err().is_panic());
        assert!(stop.is_stopping(), "the panic stopped the run");
        assert!(halt.reason().unwrap().contains("panicked"));
        // A worker ending normally halts nothing.
        let (handle, stop) = stop_pair();
        let calm = Halt {
            stop: handle,
            reason: std::sync::Mutex::new(None),
        };
        drop(HaltOnPanic(&calm));
        assert!(!stop.is_stopping());

        let counters = Counters::default();
        let mut finished = Abandon(Some(&counters));
        finished.0 = None;
        drop(finished);
        drop(Abandon(Some(&counters)));
        assert_eq!(counters.snapshot().abandoned, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn permanent_failures_are_recorded_and_committed() {
        let ids = ids(1000);
        let config = ApiConfig {
            not_found_per_mille: 50,
            ..ApiConfig::fast()
        };
        let s = setup(&ids, 100, config).await;
        let summary = run_once(&s, stop_pair().1).await;
        let not_found = ids
            .iter()
            .filter(|id| s.api.fault(id) == Fault::NotFound)
            .count() as u64;
        assert!(not_found > 0);
        assert_eq!(summary.job.failed, not_found);
        assert_eq!(summary.job.ok + summary.job.failed, 1000);
        assert!(summary.job.finished());
    }

    async fn audited_run(bucket_size: u64, durability: Durability) {
        let ids = ids(3000);
        let config = ApiConfig {
            latency_min: Duration::from_micros(200),
            latency_max: Duration::from_millis(2),
            not_found_per_mille: 20,
            ..ApiConfig::fast()
        };
        let s = setup(&ids, bucket_size, config).await;
        let audit = Arc::new(Audit::new(s.store.clone(), false));
        let summary = run_with(audit.clone(), &s, stop_pair().1, durability).await;
        assert!(summary.job.finished());
        assert_eq!(summary.job.ok + summary.job.failed, 3000);
        assert_eq!(s.api.total_calls(), 3000);
        let (commits, syncs) = audit.check();
        assert_eq!(commits as u64, 3000_u64.div_ceil(bucket_size));
        assert!(syncs >= 2, "{syncs} syncs");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_writer_stops_the_calls_and_fails_the_run() {
        for durability in [
            Durability::Sync,
            Durability::Async {
                interval: Duration::from_millis(50),
            },
        ] {
            // One bucket of 3000: nothing at a bucket boundary would notice the writer.
            let ids = ids(3000);
            let s = setup(&ids, 3000, ApiConfig::fast()).await;
            let audit = Arc::new(Audit::new(s.store.clone(), true));
            let result = try_run_with(audit, &s, stop_pair().1, durability).await;
            let err = result.expect_err("the run fails");
            assert!(err.to_string().contains("injected write failure"), "{err}");
            // The calls stop soon after the first failed write: at most what was in flight,
            // queued for the writer or queued for the workers by then.
            let calls = s.api.total_calls();
            let bound = (max_unsynced_items(4) + work_queue(4)) as u64;
            assert!(
                calls <= bound,
                "{durability:?}: {calls} calls after the writer failed (bound {bound})"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sync_progress_keeps_the_write_ahead_and_commit_order() {
        audited_run(1, Durability::Sync).await;
        audited_run(100, Durability::Sync).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_progress_keeps_the_write_ahead_and_commit_order() {
        let durability = Durability::Async {
            interval: Duration::from_millis(20),
        };
        audited_run(1, durability).await;
        audited_run(100, durability).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_progress_stopped_midway_resumes_in_sync_mode() {
        let ids = ids(3000);
        let config = ApiConfig {
            latency_min: Duration::from_millis(2),
            latency_max: Duration::from_millis(2),
            ..ApiConfig::fast()
        };
        let s = setup(&ids, 10, config).await;
        let durability = Durability::Async {
            interval: Duration::from_secs(3600),
        };
        let first = stopped_after(&s, 700, durability).await;
        assert!(first.interrupted && !first.job.finished());
        assert_eq!(
            first.job.ok, first.run.ok,
            "a stop makes every result durable"
        );
        assert!(
            first.job.buckets_committed >= first.run.ok / 10 - 4,
            "a stop commits the finished buckets even before the first checkpoint: {:?}",
            first.job
        );
        let second = run_once(&s, stop_pair().1).await;
        assert!(second.job.finished());
        assert_eq!(second.job.ok, 3000);
        assert_eq!(s.api.distinct_ids(), 3000);
        assert!(s.api.total_calls() <= 3000 + max_unsynced_items(4) as u64);
    }
}
