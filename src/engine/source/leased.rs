//! [`Leased`]: a run of a worker of a fleet, where several workers (processes, machines)
//! work on one job through a store they share. Either log, the job's or a rerun's.
//!
//! Nothing is dispatched from the planner directly: planned buckets are written ahead into
//! the store, open to every worker, and each worker leases what it works on
//! ([`Fleet::acquire_next`]: open buckets, and those of workers whose session expired),
//! a few at a time, the next few while it queues the items of those before them (so its
//! workers never wait for the database's round trips between buckets, and no worker
//! hoards more than that). A leased
//! bucket is read back and only its items without a final result are called (invariant 5
//! holds across workers: a takeover repeats at most what the dead worker had in flight or
//! unflushed). Its items carry its lease, and one whose lease is lost by the time a worker
//! takes it from the queue (the session expired, paused or cut off, and was registered
//! anew) is not called ([`Fleet::holds`]): its results would be fenced out. Its commit
//! carries the lease too; a lease lost meanwhile drops the bucket (the writer's commit).
//! The run ends once the log is planned to its end and every bucket is committed, by this
//! worker or another; with nothing to lease until then it polls, backing off to
//! [`POLL_MAX`].
//!
//! Planning: a worker whose input is here (unchanged) plans the job's log under the job's
//! planner lease ([`plan_fleet`]); a worker without the input never plans: it leases what
//! others planned and, while nobody plans, waits (polling, backed off) with the job
//! unfinished, as `status` says.
//!
//! A stop drains the worker: it says so to the store at once ([`Fleet::drain`]: no new
//! bucket, its rate share back to the others), then finishes or abandons what it holds;
//! the writer releases the leases of the buckets left unfinished as the run ends, and the
//! dispatcher those it leased ahead and never queued (a worker killed holds them until its
//! session expires, as it holds the others; then they are anyone's). The
//! worker's throttle follows its share of the fleet's rate ([`FleetMember`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{planned, Source};
use crate::engine::dispatcher::Dispatcher;
use crate::engine::error::EngineError;
use crate::engine::item::{job_work, rerun_work, with_marks, Item};
use crate::engine::member::{FleetMember, Member};
use crate::engine::planner::plan_fleet;
use crate::engine::stop::Stop;
use crate::engine::writer::Track;
use crate::plan::PlanError;
use crate::progress::Counters;
use crate::spec::{JobSpec, RunOptions};
use crate::store::{Fleet, Lease, LeaseScope, LeasedBucket, Log, PlannerState, Tally};
use crate::throttle::Throttle;

/// A worker's run in a fleet (see the module doc).
pub(in crate::engine) struct Leased<S> {
    store: Arc<S>,
    log: Log,
    spec: Arc<JobSpec>,
    skip_bad_lines: bool,
    /// What the buckets this worker plans are stamped with.
    clock: crate::clock::Clock,
    /// Whether the log is still to be planned (only the job's ever is).
    to_plan: bool,
    /// Where planning stood at the open (the job's log only): the planner's first look.
    position: Option<PlannerState>,
    planner: Option<JoinHandle<Result<(), PlanError>>>,
    /// The task that keeps the throttle on this worker's share.
    follower: Option<JoinHandle<()>>,
    /// This worker as a member of the fleet: told at once when it leases after holding none.
    fleet_member: Option<Arc<FleetMember<S>>>,
    /// Notified by this worker's planner as each batch is in the store.
    planned: Arc<Notify>,
}

impl<S: Fleet> Leased<S> {
    /// Make `--rate` the job's total (every worker's share is carved from it) and see
    /// whether the log is still to be planned.
    pub(in crate::engine) async fn open(
        store: Arc<S>,
        spec: Arc<JobSpec>,
        opts: &RunOptions,
        log: Log,
    ) -> Result<Leased<S>, EngineError> {
        if let Some(rate) = opts.throttle.rate {
            store
                .set_fleet_rate(rate.per_second(), opts.throttle.burst)
                .await?;
        }
        let position = match log {
            Log::Job => Some(store.planner().await?),
            // A rerun plans nothing: its buckets were all written ahead at its creation.
            Log::Rerun(_) => None,
        };
        let to_plan = position.is_some_and(|p| !p.exhausted);
        Ok(Leased {
            store,
            log,
            spec,
            skip_bad_lines: opts.skip_bad_lines,
            clock: opts.clock.clone(),
            to_plan,
            position,
            planner: None,
            follower: None,
            fleet_member: None,
            planned: Arc::new(Notify::new()),
        })
    }
}

impl<S: Fleet> Source for Leased<S> {
    fn log(&self) -> Log {
        self.log
    }

    fn member(&mut self, throttle: &Arc<Throttle>) -> Arc<dyn Member> {
        let (member, follower) = FleetMember::join(self.store.clone(), throttle.clone());
        self.follower = Some(follower);
        self.fleet_member = Some(member.clone());
        member
    }

    async fn feed(
        &mut self,
        dispatcher: &mut Dispatcher,
        counters: &Arc<Counters>,
    ) -> Result<(), EngineError> {
        let stop = dispatcher.stop.clone();
        if self.to_plan {
            self.planner = Some(tokio::spawn(plan_fleet(
                self.store.clone(),
                self.spec.clone(),
                self.skip_bad_lines,
                self.clock.clone(),
                stop.clone(),
                counters.clone(),
                self.planned.clone(),
                self.position.take(),
            )));
        }
        let paged = self.spec.work.paginate().is_some();
        let dispatched = dispatch_leased(
            &*self.store,
            self.fleet_member.as_deref(),
            dispatcher,
            self.log,
            paged,
            &stop,
            &self.planned,
        )
        .await;
        if let (Some(p), false) = (&self.planner, stop.is_stopping()) {
            // Finished (planned to its end) or failed: nothing is left to plan.
            p.abort();
        }
        dispatched
    }

    async fn close(self) -> Result<(), EngineError> {
        if let Some(f) = self.follower {
            f.abort();
        }
        planned(self.planner).await
    }
}

/// Buckets leased per acquisition: a worker takes a little at a time, and leases the next
/// ones while it dispatches these (so it holds at most twice this many undispatched).
const BUCKETS_PER_ACQUIRE: u32 = 2;

/// The first wait when there is nothing to lease, doubled up to [`POLL_MAX`].
const POLL_MIN: Duration = Duration::from_millis(50);
pub(in crate::engine) const POLL_MAX: Duration = Duration::from_secs(1);

/// Lease buckets of `log` and dispatch their unfinished items until every bucket of the log
/// is committed or a stop is asked for. With nothing to lease, it polls, and tries again at
/// once when `planned` says this worker's planner wrote more; when this worker's writer
/// commits, it asks again whether the log is finished (the log's last buckets are often its
/// own: the run ends as they are in).
async fn dispatch_leased<S: Fleet>(
    store: &S,
    member: Option<&FleetMember<S>>,
    dispatcher: &mut Dispatcher,
    log: Log,
    paged: bool,
    stop: &Stop,
    planned: &Notify,
) -> Result<(), EngineError> {
    let dispatched = lease_and_dispatch(store, member, dispatcher, log, paged, stop, planned).await;
    if stop.is_stopping() {
        // Draining: seen in `status` while what is held is finished or abandoned.
        if let Err(e) = store.drain().await {
            tracing::warn!("could not mark the worker draining: {e}");
        }
    }
    dispatched
}

/// [`dispatch_leased`]'s loop, until finished or stopped. The next buckets are leased and
/// read while those before them are dispatched ([`lease_ahead`]), so the workers do not wait
/// for the database's round trips between two buckets; what was leased ahead and not
/// dispatched when a stop comes is released at once, for other workers to take.
async fn lease_and_dispatch<S: Fleet>(
    store: &S,
    member: Option<&FleetMember<S>>,
    dispatcher: &mut Dispatcher,
    log: Log,
    paged: bool,
    stop: &Stop,
    planned: &Notify,
) -> Result<(), EngineError> {
    let mut idle = POLL_MIN;
    let mut next_key = 1u64 << 62;
    let committed = dispatcher.committed.clone();
    let mut ahead = lease_ahead(store, log, paged).await?;
    while !stop.is_stopping() {
        if ahead.is_empty() {
            if store.log_finished(log).await? {
                return Ok(());
            }
            // Until the poll's time or a plan: each commit of this worker's own only asks
            // again whether the log is finished. It leases nothing (no bucket came of it),
            // so a worker does not go idle and busy again at each commit, which would move
            // the fleet's shares each time.
            let poll = tokio::time::Instant::now() + idle;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(poll) => idle = (idle * 2).min(POLL_MAX),
                    _ = planned.notified() => idle = POLL_MIN,
                    _ = committed.notified() => {
                        if store.log_finished(log).await? {
                            return Ok(());
                        }
                        continue;
                    }
                    _ = stop.stopping() => {}
                }
                break;
            }
            if !stop.is_stopping() {
                ahead = lease_ahead(store, log, paged).await?;
                if let (false, Some(m)) = (ahead.is_empty(), member) {
                    // Back from holding nothing: the throttle knows before the items are
                    // called, not at its next look (see `FleetRate::rejoined`).
                    m.apply_rate();
                }
            }
            continue;
        }
        idle = POLL_MIN;
        let these = std::mem::take(&mut ahead);
        let (next, dispatched) = tokio::join!(
            lease_ahead(store, log, paged),
            dispatch_all(dispatcher, these, &mut next_key)
        );
        match (next, dispatched) {
            (Ok(next), Ok(())) => ahead = next,
            (Ok(next), Err(e)) => {
                release_all(store, &next).await;
                return Err(e);
            }
            (Err(e), _) => return Err(e),
        }
    }
    release_all(store, &ahead).await;
    Ok(())
}

/// A bucket leased and read, not dispatched yet: its lease, what its items counted
/// already, and its items without a final result.
type Ahead = (Lease, Tally, Vec<Item>);

/// Lease the next buckets of `log` (up to [`BUCKETS_PER_ACQUIRE`], none while the session is
/// not surely alive) and read their unfinished items.
/// Items of a paginated job (`paged`) continue at the pages stored for them.
async fn lease_ahead<S: Fleet>(
    store: &S,
    log: Log,
    paged: bool,
) -> Result<Vec<Ahead>, EngineError> {
    if !store.alive() {
        return Ok(Vec::new());
    }
    let work = store.acquire_work(log, BUCKETS_PER_ACQUIRE).await?;
    let mut ahead = Vec::with_capacity(work.len());
    for LeasedBucket { lease, items } in work {
        let LeaseScope::Bucket { bucket, .. } = lease.scope else {
            continue;
        };
        let (done, mut todo) = match log {
            Log::Job => job_work(bucket, items),
            Log::Rerun(k) => rerun_work(k, bucket, items),
        };
        let generation = log.rerun().unwrap_or(0);
        with_marks(store, paged, generation, &mut todo).await?;
        ahead.push((lease, done, todo));
    }
    Ok(ahead)
}

/// Have the writer track each bucket, then queue its items for the workers.
async fn dispatch_all(
    dispatcher: &mut Dispatcher,
    buckets: Vec<Ahead>,
    next_key: &mut u64,
) -> Result<(), EngineError> {
    for (lease, done, mut todo) in buckets {
        let LeaseScope::Bucket { bucket, .. } = lease.scope else {
            continue;
        };
        // A key of this lease's own (see `Track`): above any bucket number.
        *next_key += 1;
        for item in &mut todo {
            item.track = *next_key;
            item.lease = Some(lease.clone());
        }
        let track = Track {
            key: *next_key,
            bucket,
            remaining: todo.len() as u64,
            done,
            lease,
        };
        dispatcher.dispatch(vec![track], vec![todo]).await?;
    }
    Ok(())
}

/// Give back the leases of buckets leased ahead and never dispatched (a stop, an error).
async fn release_all<S: Fleet>(store: &S, ahead: &[Ahead]) {
    for (lease, _, _) in ahead {
        if let Err(e) = store.release(lease).await {
            tracing::warn!("could not release a bucket leased ahead: {e}");
        }
    }
}
