//! [`JobLog`]: the job's own log, run by the only worker (it holds the job's lease). First
//! the buckets written ahead but never committed are replayed, only their items without a
//! final result; then the planner ([`crate::engine::planner::plan_ahead`]) reads the input
//! on from the stored position and what it plans is dispatched as it comes.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{job_lease, planned, Source};
use crate::engine::dispatcher::Dispatcher;
use crate::engine::error::EngineError;
use crate::engine::item::{job_work, with_marks, Item};
use crate::engine::member::{Alone, Member};
use crate::engine::planner::{plan_ahead, ALONE};
use crate::engine::writer::Track;
use crate::plan::{PlanError, Planner};
use crate::progress::Counters;
use crate::spec::{JobSpec, RunOptions};
use crate::store::{JobView, Lease, Leases, Log, PlannedBucket, Store, Tally};
use crate::throttle::Throttle;

/// The job's own log (see the module doc).
pub(in crate::engine) struct JobLog<S> {
    store: Arc<S>,
    lease: Lease,
    /// The buckets to replay: each with its results already final and its items to call.
    replay: Vec<(u64, Tally, Vec<Item>)>,
    /// The input from the stored position on (none: planned to its end).
    planner: Option<Planner>,
    running: Option<JoinHandle<Result<(), PlanError>>>,
}

impl<S: Store + Leases> JobLog<S> {
    /// Take the job's lease, read what is left to replay and open the input where the
    /// planner stands: everything that can fail before the run starts a task.
    pub(in crate::engine) async fn open(
        store: Arc<S>,
        spec: &JobSpec,
        opts: &RunOptions,
    ) -> Result<JobLog<S>, EngineError> {
        let lease = job_lease(&*store).await?;
        let mut replay = Vec::new();
        let paged = spec.work.paginate().is_some();
        for offset in store.open_buckets().await? {
            let (done, mut todo) = job_work(offset.bucket, store.bucket_items(&offset).await?);
            with_marks(&*store, paged, 0, &mut todo).await?;
            replay.push((offset.bucket, done, todo));
        }
        let position = store.planner().await?;
        let planner = if position.exhausted {
            None
        } else {
            let reader = spec
                .input_reader(position.cursor)
                .map_err(PlanError::from)?;
            Some(
                Planner::new(
                    reader,
                    position,
                    spec.bucket_size,
                    opts.skip_bad_lines,
                    spec.fingerprint,
                )
                .stamped_by(opts.clock.clone()),
            )
        };
        Ok(JobLog {
            store,
            lease,
            replay,
            planner,
            running: None,
        })
    }

    /// Replay buckets written ahead but never committed: only their unfinished items.
    async fn replay(&mut self, dispatcher: &mut Dispatcher) -> Result<(), EngineError> {
        let open = std::mem::take(&mut self.replay);
        if !open.is_empty() {
            tracing::info!(
                buckets = open.len(),
                "replaying buckets that were not committed"
            );
        }
        let (tracks, work) = open
            .into_iter()
            .map(|(bucket, done, todo)| {
                let track = Track {
                    key: bucket,
                    bucket,
                    remaining: todo.len() as u64,
                    done,
                    lease: self.lease.clone(),
                };
                (track, todo)
            })
            .unzip();
        dispatcher.dispatch(tracks, work).await
    }

    /// Dispatch a batch the planner wrote ahead: every item of its buckets.
    async fn dispatch_planned(
        &self,
        dispatcher: &mut Dispatcher,
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
                    lease: self.lease.clone(),
                };
                let mut values = b.values.into_iter();
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
                        values: values.next().map(String::into_boxed_str),
                        resume: None,
                    })
                    .collect();
                (track, items)
            })
            .unzip();
        dispatcher.dispatch(tracks, work).await
    }
}

impl<S: Store + Leases> Source for JobLog<S> {
    fn log(&self) -> Log {
        Log::Job
    }

    fn member(&mut self, _throttle: &Arc<Throttle>) -> Arc<dyn Member> {
        Arc::new(Alone)
    }

    async fn feed(
        &mut self,
        dispatcher: &mut Dispatcher,
        counters: &Arc<Counters>,
    ) -> Result<(), EngineError> {
        let (plan_tx, mut plan_rx) = mpsc::channel::<Vec<PlannedBucket>>(1);
        self.running = self.planner.take().map(|planner| {
            tokio::task::spawn_blocking(plan_ahead(
                planner,
                self.store.clone(),
                plan_tx,
                dispatcher.stop.clone(),
                counters.clone(),
                ALONE,
            ))
        });
        self.replay(dispatcher).await?;
        // Until the planner ends (the input is planned to its end) or a stop; dropping the
        // receiver ends a planner that is still reading.
        while let Some(batch) = plan_rx.recv().await {
            self.dispatch_planned(dispatcher, batch).await?;
            if dispatcher.stop.is_stopping() {
                break;
            }
        }
        Ok(())
    }

    async fn close(self) -> Result<(), EngineError> {
        let planned = planned(self.running).await;
        let released = self.store.release(&self.lease).await;
        planned?;
        Ok(released?)
    }
}
