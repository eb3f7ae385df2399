//! Engine: running a job's buckets to the end, crash-safely.
//!
//! Three kinds of task share a run:
//!
//! - the **planner** (a blocking thread) reads the input from the stored position, cuts
//!   buckets ([`crate::plan`]), writes them ahead of their work with [`Store::plan`] and makes
//!   them durable with [`Store::sync`], then hands them over (at most two batches ahead);
//! - the **dispatcher** first replays the buckets that have an offset record but no commit
//!   record, calling only their IDs that have no final result, then dispatches new buckets;
//!   it starts one task per item, at most `concurrency` at once, so workers never wait at a
//!   bucket boundary and buckets may commit out of order;
//! - the **writer** receives final results, writes them in groups, makes each group durable
//!   with one sync (group commit), and only then writes the commit records of the buckets
//!   whose last result was in the group.
//!
//! Invariants (the crash tests check them):
//!
//! 1. A bucket's offset record is durable before any of its items is dispatched.
//! 2. A bucket's commit record is written only after all its results are durable.
//! 3. Buckets are a pure function of the input and the bucket size (see [`crate::plan`]).
//! 4. Results are keyed by ID: a replayed item overwrites its own record, never adds one.
//! 5. A replay calls only items without a durable final result: after a kill -9 the repeated
//!    calls are the items that were in flight, that is, at most
//!    [`max_unsynced_items`]`(concurrency)` of them.
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

use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use crate::handler::{millis, Handler};
use crate::input::InputReader;
use crate::job::{now_ms, FailureLimit, JobSpec, RunOptions};
use crate::plan::{PendingIds, PlanError, Planner};
use crate::progress::{progress_line, Counters, RunSummary};
use crate::retry::{self, AttemptError, Charge, ErrorClass, ItemOutcome, Success};
use crate::store::{
    CommitRecord, ItemRecord, ItemStatus, Log, PlannedBucket, Store, StoreError, Tally,
};
use crate::throttle::{Observed, Throttle};

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

/// How long the writer gathers results before one flush makes them durable.
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

enum WriterMsg {
    /// A bucket about to be dispatched: `remaining` items to wait for.
    Track {
        bucket: u64,
        remaining: u64,
        done: Tally,
    },
    Done {
        id: String,
        track: u64,
        record: ItemRecord,
    },
}

/// Run the job in `store` until every bucket is committed or a stop is asked for.
///
/// The job spec must be the stored one, its input verified against the fingerprint.
pub async fn run<S: Store>(
    store: Arc<S>,
    spec: Arc<JobSpec>,
    handler: Arc<Handler>,
    opts: &RunOptions,
    counters: Arc<Counters>,
    stop: Stop,
) -> Result<RunSummary, EngineError> {
    run_log(store, spec, handler, opts, counters, stop, Log::Job).await
}

/// [`run`] for either log: the job's own (buckets from the input) or a rerun's (its open
/// buckets, planned when the rerun was created).
pub async fn run_log<S: Store>(
    store: Arc<S>,
    spec: Arc<JobSpec>,
    handler: Arc<Handler>,
    opts: &RunOptions,
    counters: Arc<Counters>,
    stop: Stop,
    log: Log,
) -> Result<RunSummary, EngineError> {
    let started = Instant::now();
    // Everything that can fail comes before any task is spawned.
    let pending = Arc::new(PendingIds::default());
    let mut replay: Vec<Replay> = Vec::new();
    let mut rerun_buckets = Vec::new();
    match log {
        Log::Job => {
            for offset in store.open_buckets()? {
                let (mut done, mut todo) = (Tally::default(), Vec::new());
                for (id, record) in store.bucket_items(&offset)? {
                    match record.status {
                        ItemStatus::Ok | ItemStatus::Failed => done.add(&record),
                        ItemStatus::Pending => {
                            pending.insert(&id);
                            todo.push(Item {
                                id,
                                row: record.row,
                                bucket: offset.bucket,
                                track: offset.bucket,
                                prior: None,
                            });
                        }
                    }
                }
                replay.push((offset.bucket, done, todo));
            }
        }
        // A rerun's buckets are read one at a time as they are dispatched (below), so its
        // memory does not grow with its size.
        Log::Rerun(k) => rerun_buckets = store.rerun_open_buckets(k)?,
    }
    let planner_state = match log {
        Log::Job => store.planner()?,
        // A rerun plans nothing: its buckets were all written ahead at its creation.
        Log::Rerun(_) => crate::store::PlannerState {
            exhausted: true,
            ..Default::default()
        },
    };
    let mut reader = if planner_state.exhausted {
        None
    } else {
        Some(InputReader::open(&spec.input, planner_state.cursor).map_err(PlanError::from)?)
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
    let controller = tokio::spawn(control(throttle.clone(), halt.clone()));

    let (writer_tx, writer_rx) = mpsc::channel(writer_queue(opts.concurrency));
    let writer = tokio::spawn(write_results(
        store.clone(),
        writer_rx,
        counters.clone(),
        opts.max_failures,
        halt.clone(),
        pending.clone(),
        log,
    ));

    let (plan_tx, mut plan_rx) = mpsc::channel::<Vec<PlannedBucket>>(1);
    let planner = if planner_state.exhausted {
        None
    } else {
        let reader = reader.take().expect("opened above when not exhausted");
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
            pending.clone(),
            plan_tx,
            stop.clone(),
        )))
    };

    let reporter = tokio::spawn(report_progress(
        counters.clone(),
        throttle.clone(),
        opts.progress_interval,
        started,
    ));

    let mut dispatcher = Dispatcher {
        spec: spec.clone(),
        handler,
        counters: counters.clone(),
        stop: stop.clone(),
        permits,
        throttle: throttle.clone(),
        tasks: JoinSet::new(),
        writer: writer_tx,
        rerun: match log {
            Log::Job => None,
            Log::Rerun(k) => Some(k),
        },
    };
    let mut result = dispatcher.replay(replay).await;
    if let Log::Rerun(k) = log {
        for offset in rerun_buckets {
            if result.is_err() || stop.is_stopping() {
                break;
            }
            result = match store.rerun_bucket_items(&offset) {
                Ok(items) => {
                    let (done, todo) = rerun_work(k, offset.bucket, items);
                    dispatcher.dispatch_bucket(offset.bucket, done, todo).await
                }
                Err(e) => Err(e.into()),
            };
        }
    }
    if result.is_ok() && planner.is_some() {
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
    dispatcher.finish(opts.shutdown_timeout).await;
    drop(dispatcher);
    let written = writer
        .await
        .map_err(|e| EngineError::Internal(format!("result writer: {e}")))?;
    reporter.abort();
    controller.abort();
    forward.abort();
    let planned = match planner {
        Some(p) => p
            .await
            .map_err(|e| EngineError::Internal(format!("planner: {e}")))?,
        None => Ok(()),
    };
    written?;
    result?;
    planned?;
    Ok(RunSummary {
        job: store.stats()?,
        run: counters.snapshot(),
        elapsed_ms: millis(started.elapsed()),
        interrupted: stop.is_stopping(),
        halted: halt.reason(),
    })
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
    pending: Arc<PendingIds>,
    out: mpsc::Sender<Vec<PlannedBucket>>,
    stop: Stop,
) -> impl FnOnce() -> Result<(), PlanError> {
    move || {
        let runtime = tokio::runtime::Handle::current();
        while !stop.is_stopping() {
            let before = planner.state();
            let batch = planner.next_batch(&*store, &pending, PLAN_BATCH_ROWS)?;
            if batch.is_empty() && planner.state() == before {
                return Ok(());
            }
            store.plan(&batch, &planner.state())?;
            runtime.block_on(store.sync())?;
            if batch.is_empty() || out.blocking_send(batch).is_err() {
                return Ok(());
            }
        }
        Ok(())
    }
}

struct Dispatcher {
    spec: Arc<JobSpec>,
    handler: Arc<Handler>,
    counters: Arc<Counters>,
    stop: Stop,
    permits: Arc<Semaphore>,
    throttle: Arc<Throttle>,
    tasks: JoinSet<()>,
    writer: mpsc::Sender<WriterMsg>,
    /// The rerun being run, if any: its number is stamped on each new record.
    rerun: Option<u32>,
}

impl Dispatcher {
    /// Replay buckets written ahead but never committed: only their unfinished items.
    async fn replay(&mut self, open: Vec<Replay>) -> Result<(), EngineError> {
        if !open.is_empty() && self.rerun.is_none() {
            tracing::info!(
                buckets = open.len(),
                "replaying buckets that were not committed"
            );
        }
        for (bucket, done, todo) in open {
            self.dispatch_bucket(bucket, done, todo).await?;
            if self.stop.is_stopping() {
                break;
            }
        }
        Ok(())
    }

    async fn dispatch_planned(&mut self, batch: Vec<PlannedBucket>) -> Result<(), EngineError> {
        for b in batch {
            let bucket = b.offset.bucket;
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
            self.dispatch_bucket(bucket, Tally::default(), items)
                .await?;
            if self.stop.is_stopping() {
                break;
            }
        }
        Ok(())
    }

    async fn dispatch_bucket(
        &mut self,
        bucket: u64,
        done: Tally,
        items: Vec<Item>,
    ) -> Result<(), EngineError> {
        let track = WriterMsg::Track {
            bucket,
            remaining: items.len() as u64,
            done,
        };
        self.writer.send(track).await.map_err(|_| writer_gone())?;
        for item in items {
            let permit = tokio::select! {
                permit = self.permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                _ = self.stop.stopping() => return Ok(()),
            };
            if self.writer.is_closed() {
                return Err(writer_gone());
            }
            let task = ItemTask {
                throttle: self.throttle.clone(),
                spec: self.spec.clone(),
                handler: self.handler.clone(),
                counters: self.counters.clone(),
                stop: self.stop.clone(),
                writer: self.writer.clone(),
                rerun: self.rerun,
            };
            self.tasks.spawn(async move {
                let throttle = task.throttle.clone();
                task.process(item).await;
                drop(permit);
                if let Some(c) = throttle.concurrency() {
                    c.settle();
                }
            });
            while let Some(done) = self.tasks.try_join_next() {
                done.map_err(|e| EngineError::Internal(format!("item task: {e}")))?;
            }
        }
        Ok(())
    }

    /// Wait for the items in flight; after a stop request, for at most `timeout`.
    async fn finish(&mut self, timeout: Duration) {
        let all_done = async {
            while let Some(done) = self.tasks.join_next().await {
                if let Err(e) = done {
                    tracing::error!("item task failed: {e}");
                }
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
        let left = self.tasks.len() as u64;
        if left > 0 {
            tracing::warn!(
                items = left,
                "stopping with items still in flight; they stay pending and are replayed"
            );
            Counters::add(&self.counters.abandoned, left);
            self.tasks.shutdown().await;
        }
    }
}

fn writer_gone() -> EngineError {
    EngineError::Internal("the result writer stopped".into())
}

struct ItemTask {
    throttle: Arc<Throttle>,
    spec: Arc<JobSpec>,
    handler: Arc<Handler>,
    counters: Arc<Counters>,
    stop: Stop,
    writer: mpsc::Sender<WriterMsg>,
    rerun: Option<u32>,
}

impl ItemTask {
    async fn process(self, item: Item) {
        let handler = &self.handler;
        let counters = &self.counters;
        let throttle = &*self.throttle;
        let stop = &self.stop;
        let id = item.id.as_str();
        // When the first and the last attempt started.
        let (first_at, last_at) = (&AtomicU64::new(0), &AtomicU64::new(0));
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
                let result = handler.attempt(id).await;
                let observed = observe(&result);
                if let Err(AttemptError {
                    http_status: Some(429),
                    ..
                }) = &result
                {
                    Counters::add(&throttle.throttled, 1);
                }
                let counts = throttle.charge(observed, probe).await;
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
                success,
                attempts,
                errors,
            } => {
                record.attempt_errors = errors;
                record.status = ItemStatus::Ok;
                record.http_status = Some(success.http_status);
                record.body = Some(success.body);
                record.latency_ms = Some(millis(success.latency));
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
                record.http_status = error.http_status;
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
        let _ = self
            .writer
            .send(WriterMsg::Done {
                id: item.id,
                track: item.track,
                record,
            })
            .await;
    }
}

/// What an attempt's result tells the throttle.
fn observe(result: &Result<Success, AttemptError>) -> Observed {
    match result {
        Ok(s) => Observed::Success(s.latency),
        Err(e) => match (e.class, e.http_status) {
            (ErrorClass::Http, Some(429)) => Observed::Pushback,
            (ErrorClass::Http, Some(s)) if s >= 500 => Observed::Down,
            (ErrorClass::Timeout | ErrorClass::Connect | ErrorClass::Connection, _) => {
                Observed::Down
            }
            _ => Observed::Answered,
        },
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
    remaining: u64,
    done: Tally,
}

/// The writer task: group results, make them durable, then commit finished buckets.
async fn write_results<S: Store>(
    store: Arc<S>,
    mut rx: mpsc::Receiver<WriterMsg>,
    counters: Arc<Counters>,
    max_failures: Option<FailureLimit>,
    halt: Arc<Halt>,
    pending: Arc<PendingIds>,
    log: Log,
) -> Result<(), StoreError> {
    let mut open: HashMap<u64, Tracked> = HashMap::new();
    let mut msgs = Vec::new();
    let max_group = rx.max_capacity();
    while rx.recv_many(&mut msgs, max_group).await > 0 {
        // Group commit: gather what arrives within GROUP_COMMIT_DELAY (or a full group), so
        // one flush covers many results. Nobody waits on it but the commit records.
        let deadline = tokio::time::Instant::now() + GROUP_COMMIT_DELAY;
        while msgs.len() < max_group {
            let room = max_group - msgs.len();
            tokio::select! {
                n = rx.recv_many(&mut msgs, room) => if n == 0 { break },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let mut commits = Vec::new();
        let mut results = Vec::new();
        let mut tracks = Vec::new();
        for msg in msgs.drain(..) {
            match msg {
                WriterMsg::Track {
                    bucket,
                    remaining,
                    done,
                } => {
                    if remaining == 0 {
                        commits.push(CommitRecord::new(bucket, done));
                    } else {
                        open.insert(bucket, Tracked { remaining, done });
                    }
                }
                WriterMsg::Done { id, track, record } => {
                    tracks.push(track);
                    results.push((id, record))
                }
            }
        }
        if !results.is_empty() {
            store.record(&results)?;
            // Now in the store (visible, durable at the sync below): no longer pending.
            pending.remove_all(results.iter().map(|(id, _)| id.as_str()));
            store.sync().await?;
            for ((_, record), &track) in results.iter().zip(&tracks) {
                let ok = record.status == ItemStatus::Ok;
                Counters::add(if ok { &counters.ok } else { &counters.failed }, 1);
                let Some(t) = open.get_mut(&track) else {
                    tracing::error!(bucket = track, "a result for a bucket that is not tracked");
                    continue;
                };
                t.done.add(record);
                t.remaining = t.remaining.saturating_sub(1);
                if t.remaining == 0 {
                    let t = open.remove(&track).expect("just seen");
                    commits.push(CommitRecord::new(track, t.done));
                }
            }
        }
        if !commits.is_empty() {
            match log {
                Log::Job => store.commit(&commits)?,
                Log::Rerun(k) => store.commit_rerun(k, &commits)?,
            }
            Counters::add(&counters.buckets_committed, commits.len() as u64);
        }
        if let Some(limit) = max_failures {
            let now = counters.snapshot();
            if limit.exceeded(now.failed, now.done()) {
                let last = results
                    .iter()
                    .rev()
                    .find_map(|(_, r)| r.error.clone())
                    .unwrap_or_default();
                halt.halt(format!(
                    "{} of {} IDs failed permanently in this run, past --max-failures; the last error: {last}",
                    now.failed,
                    now.done()
                ));
            }
        }
    }
    store.sync().await
}

async fn report_progress(
    counters: Arc<Counters>,
    throttle: Arc<Throttle>,
    interval: Duration,
    started: Instant,
) {
    if interval.is_zero() {
        return;
    }
    let mut last = counters.snapshot();
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    loop {
        ticker.tick().await;
        let now = counters.snapshot();
        let mut line = progress_line(&now, &last, interval, started.elapsed());
        if let Some(rate) = throttle.rate() {
            line.push_str(&format!(", rate limit {rate:.1}/s"));
        }
        if let Some(c) = throttle.concurrency() {
            line.push_str(&format!(", concurrency {}", c.limit()));
        }
        let throttled = throttle
            .throttled
            .load(std::sync::atomic::Ordering::Relaxed);
        if throttled > 0 {
            line.push_str(&format!(", {throttled} answers 429"));
        }
        if let Some(out) = throttle.outage() {
            line.push_str(&format!(", API out for {:.0}s", out.as_secs_f64()));
        }
        tracing::info!("{line}");
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::api::{ApiConfig, FakeApi, Fault};
    use crate::input::{InputFormat, InputSpec};
    use crate::job::{open_job, JobRequest};
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
        let spec = open_job(&store, &request).unwrap();
        Setup {
            _dir: dir,
            store: Arc::new(store),
            spec: Arc::new(spec),
            api,
        }
    }

    async fn run_once(s: &Setup, stop: Stop) -> RunSummary {
        let handler = Arc::new(Handler::new(&s.spec.request).unwrap());
        let opts = RunOptions {
            concurrency: 4,
            progress_interval: Duration::ZERO,
            ..RunOptions::default()
        };
        run(
            s.store.clone(),
            s.spec.clone(),
            handler,
            &opts,
            Arc::new(Counters::default()),
            stop,
        )
        .await
        .unwrap()
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("e-{i}")).collect()
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
        let batch = planner
            .next_batch(&*s.store, &PendingIds::default(), 1000)
            .unwrap();
        s.store.plan(&batch, &planner.state()).unwrap();
        let mut done = Vec::new();
        for (row, id) in batch[1].items.iter().take(60) {
            let mut r = ItemRecord::pending(*row, 1);
            r.status = ItemStatus::Ok;
            r.attempts = 1;
            r.body = Some(serde_json::value::to_raw_value(&"earlier").unwrap());
            done.push((id.clone(), r));
        }
        s.store.record(&done).unwrap();
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
        let items = s.store.bucket_items(&batch[1].offset).unwrap();
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
        let (handle, stop) = stop_pair();
        let api = s.api.clone();
        let stopper = tokio::spawn(async move {
            while api.total_calls() < 500 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            handle.stop();
        });
        let first = run_once(&s, stop).await;
        stopper.await.unwrap();
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
}
