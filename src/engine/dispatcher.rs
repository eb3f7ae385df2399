//! The dispatcher: what each bucket still needs called (replayed buckets, planned ones, a
//! rerun's), the planner thread that writes buckets ahead of their work, and the
//! [`Dispatcher`] that has the writer track each bucket and then queues its items for the
//! workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{EngineError, Stop, WorkQueue, WriterMsg};
use crate::plan::{PlanError, Planner};
use crate::progress::Counters;
use crate::store::{ItemRecord, ItemStatus, Lease, PlannedBucket, Store, Tally};

/// Rows the planner reads per store write: several small buckets share one durable write.
pub(crate) const PLAN_BATCH_ROWS: u64 = 1000;

pub(super) struct Item {
    pub(super) id: String,
    pub(super) row: u64,
    /// The job bucket the ID belongs to.
    pub(super) bucket: u64,
    /// The bucket whose commit waits for this item: the job bucket, or a rerun bucket.
    pub(super) track: u64,
    /// In a rerun: the record the result replaces.
    pub(super) prior: Option<Box<ItemRecord>>,
    /// In a shared store: the lease of the item's bucket, checked before the item is called
    /// (none: the run holds the whole job).
    pub(super) lease: Option<Lease>,
}

/// A bucket to replay: its number, results already final, and the items to call.
pub(super) type Replay = (u64, Tally, Vec<Item>);

/// A bucket about to be dispatched: `remaining` items to wait for, `done` already counted,
/// and the lease its commit carries.
pub(super) struct Track {
    /// What the bucket's items carry as their `track`: the bucket itself, or in a shared
    /// store a key of this lease's own (a bucket leased again gets a new track, and the
    /// results of its earlier lease's items never count towards it).
    pub(super) key: u64,
    pub(super) bucket: u64,
    pub(super) remaining: u64,
    pub(super) done: Tally,
    pub(super) lease: Lease,
}

/// What is left of a job bucket: results already final, and the items to call.
pub(super) fn job_work(bucket: u64, items: Vec<(String, ItemRecord)>) -> (Tally, Vec<Item>) {
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
                lease: None,
            }),
        }
    }
    (done, todo)
}

/// What is left of a rerun bucket: results this rerun already made durable, and the items
/// to call (each with the history of the record it replaces, not its body).
pub(super) fn rerun_work(
    rerun: u32,
    bucket: u64,
    items: Vec<(String, ItemRecord)>,
) -> (Tally, Vec<Item>) {
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
                lease: None,
            }),
        }
    }
    (done, todo)
}

/// The planner thread: cut, write ahead, sync, hand over; until the input ends or nobody
/// listens any more.
pub(super) fn plan_ahead<S: Store>(
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
pub(super) fn work_queue(workers: usize) -> usize {
    (4 * workers).max(64)
}

pub(super) struct Dispatcher {
    pub(super) stop: Stop,
    pub(super) queue: Arc<WorkQueue<Item>>,
    /// `concurrency` workers, each calling the API for one item at a time.
    pub(super) workers: JoinSet<()>,
    pub(super) writer: mpsc::Sender<WriterMsg>,
    /// Whether replayed buckets are the job's own (logged as such), not a rerun's.
    pub(super) replaying: bool,
    /// The run's lease on the whole job (none: a shared store's run, which leases buckets).
    pub(super) lease: Option<Lease>,
}

impl Dispatcher {
    /// The job's lease, which the buckets of a run that holds it are committed under.
    pub(super) fn job_lease(&self) -> Lease {
        self.lease
            .clone()
            .expect("only a run holding the job's lease replays and plans by itself")
    }

    /// Replay buckets written ahead but never committed: only their unfinished items.
    pub(super) async fn replay(&mut self, open: Vec<Replay>) -> Result<(), EngineError> {
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

    pub(super) async fn dispatch_planned(
        &mut self,
        batch: Vec<PlannedBucket>,
    ) -> Result<(), EngineError> {
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
                        lease: None,
                    })
                    .collect();
                (track, items)
            })
            .unzip();
        self.dispatch(tracks, work).await
    }

    /// Have the writer track the buckets, then queue their items for the workers, bucket
    /// after bucket, until done or asked to stop.
    pub(super) async fn dispatch(
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
    pub(super) async fn finish(&mut self, timeout: Duration) -> Result<(), EngineError> {
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

fn writer_gone() -> EngineError {
    EngineError::Internal("the result writer stopped".into())
}
