//! The planner: cuts the input into buckets ([`crate::plan`]), writes them ahead of their
//! work with [`Store::plan`] and makes them durable with [`Store::sync`], then hands them
//! over, at most two batches ahead ([`plan_ahead`], a blocking thread). A fleet's planner
//! writes larger batches as it goes ([`PlanRows`]), so it stays ahead of every worker.
//!
//! A run that holds the whole job plans from the stored position and dispatches what it
//! planned. A worker of a fleet plans under the job's planner lease, whenever it is free
//! ([`plan_fleet`]): while another live worker holds it, it waits and tries again every
//! [`PLANNER_POLL`]; once that worker's session ends or expires, it takes the lease over and
//! plans on from the stored position. Its buckets go to the store, open to every worker,
//! and nobody reads them from the planner. A worker without the input never plans.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::stop::Stop;
use crate::clock::Clock;
use crate::plan::{PlanError, Planner};
use crate::progress::Counters;
use crate::spec::JobSpec;
use crate::store::{Fleet, PlannedBucket, PlannerState, Store, StoreError};

/// Rows the planner reads per store write: several small buckets share one durable write.
const PLAN_BATCH_ROWS: u64 = 1000;

/// How many rows the planner reads per store write: `first` at first, then twice as many
/// after each write, up to `most`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PlanRows {
    first: u64,
    most: u64,
}

/// A run alone: [`PLAN_BATCH_ROWS`] each time (its dispatcher takes each batch as written).
pub(super) const ALONE: PlanRows = PlanRows {
    first: PLAN_BATCH_ROWS,
    most: PLAN_BATCH_ROWS,
};

/// A fleet's planner writes for every worker, and each write costs it round trips to the
/// database (the planned IDs looked up, the batch written): the first batch as soon as a
/// lone run's, then larger ones, so it runs ahead of every worker even when the database is
/// far away.
const FLEET: PlanRows = PlanRows {
    first: PLAN_BATCH_ROWS,
    most: 16 * PLAN_BATCH_ROWS,
};

/// The planner thread: cut, write ahead, sync, hand over; until the input ends or nobody
/// listens any more.
pub(super) fn plan_ahead<S: Store>(
    mut planner: Planner,
    store: Arc<S>,
    out: mpsc::Sender<Vec<PlannedBucket>>,
    stop: Stop,
    counters: Arc<Counters>,
    batch_rows: PlanRows,
) -> impl FnOnce() -> Result<(), PlanError> {
    move || {
        let runtime = tokio::runtime::Handle::current();
        let mut rows = batch_rows.first;
        while !stop.is_stopping() {
            let before = planner.state();
            let batch = runtime.block_on(planner.next_batch(&*store, rows))?;
            rows = (rows * 2).min(batch_rows.most);
            if batch.is_empty() && planner.state() == before {
                return Ok(());
            }
            // Store I/O is timed in real time, paused tokio clock or not.
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

/// How often a worker with the input tries to take over planning while another plans.
pub(super) const PLANNER_POLL: Duration = Duration::from_secs(1);

/// Plan the job's input whenever this worker of a fleet may: under the job's planner lease,
/// taken over once the worker that held it is gone (see the module doc); until the input is
/// planned to its end or a stop. Without the input here, plan nothing. `planned` is
/// notified as each batch is in the store, so this worker leases it without waiting for its
/// next poll. `known`: where planning stood as the run began, if it was just read (the first
/// look is then not asked of the store again).
#[allow(clippy::too_many_arguments)]
pub(super) async fn plan_fleet<S: Fleet>(
    store: Arc<S>,
    spec: Arc<JobSpec>,
    skip_bad_lines: bool,
    clock: Clock,
    stop: Stop,
    counters: Arc<Counters>,
    planned: Arc<tokio::sync::Notify>,
    mut known: Option<PlannerState>,
) -> Result<(), PlanError> {
    let mut waiting = false;
    while !stop.is_stopping() {
        let position = match known.take() {
            Some(position) => position,
            None => store.planner().await?,
        };
        if position.exhausted {
            return Ok(());
        }
        let reader = match spec.input_reader(position.cursor) {
            Ok(reader) => reader,
            Err(e) => {
                tracing::info!("not planning: the input cannot be read here ({e})");
                return Ok(());
            }
        };
        if let Some(position) = store.take_planner().await? {
            // From where the last planner left off, as read with the lease.
            if position.exhausted {
                return Ok(());
            }
            if waiting {
                tracing::info!(
                    bucket = position.next_bucket,
                    "taking over planning from a planner that is gone"
                );
            }
            let reader = if position.cursor == reader.cursor() {
                reader
            } else {
                spec.input_reader(position.cursor)?
            };
            let planner = Planner::new(
                reader,
                position,
                spec.bucket_size,
                skip_bad_lines,
                spec.fingerprint,
            )
            .stamped_by(clock.clone());
            // Planned buckets go to the store, open to every worker: nobody reads them here,
            // but this worker's dispatcher hears that there is something to lease.
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<PlannedBucket>>(1);
            let heard = planned.clone();
            let drain = tokio::spawn(async move {
                while rx.recv().await.is_some() {
                    heard.notify_one();
                }
            });
            let planned = tokio::task::spawn_blocking(plan_ahead(
                planner,
                store.clone(),
                tx,
                stop.clone(),
                counters.clone(),
                FLEET,
            ))
            .await;
            drain.abort();
            match planned {
                Ok(Ok(())) => return Ok(()),
                // Another worker took the lease over (this session expired): wait again.
                Ok(Err(PlanError::Store(e)))
                    if matches!(e.root(), StoreError::LeaseLost { .. }) =>
                {
                    tracing::info!("planning stopped: {e}");
                }
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(StoreError::backend(format!("planner: {e}")).into()),
            }
        } else if !waiting {
            tracing::info!(
                "another worker plans the input: this one waits to take over if it goes"
            );
        }
        waiting = true;
        tokio::select! {
            _ = tokio::time::sleep(PLANNER_POLL) => {}
            _ = stop.stopping() => {}
        }
    }
    Ok(())
}
