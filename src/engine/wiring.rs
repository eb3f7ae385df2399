//! The run itself: one throttle, one writer, a pool of workers and a dispatcher, wired to the
//! [`Source`] of the run's buckets ([`run_source`]). Every mode runs through it alike: what
//! differs between them is the source's.

use std::collections::HashMap;
use std::sync::Arc;
use tokio::time::Instant;

use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;

use super::dispatcher::{work_queue, Dispatcher};
use super::error::EngineError;
use super::kept_limits::Keeper;
use super::queue::WorkQueue;
use super::quotas::QuotaGate;
use super::source::Source;
use super::stop::{stop_pair, Halt, Stop, StopOnDrop};
use super::worker::{control, work, ItemTask, Parked};
use super::writer::{writer_queue, Writer};
use crate::handler::{millis, Handler};
use crate::progress::{Counters, RunSummary};
use crate::spec::{Durability, JobSpec, RunOptions};
use crate::store::{JobView, Leases, Store};
use crate::throttle::Throttle;

/// What a run is given, whatever its source.
pub(super) struct Run<'a, H> {
    pub(super) spec: Arc<JobSpec>,
    pub(super) handler: Arc<H>,
    pub(super) opts: &'a RunOptions,
    pub(super) counters: Arc<Counters>,
    pub(super) stop: Stop,
    /// When the run began (its source was opened since).
    pub(super) started: Instant,
    /// The API limits the job keeps were restored already, while the source opened.
    pub(super) limits_restored: bool,
}

/// Run the buckets `source` hands over until it has no more and every result is written,
/// or a stop is asked for (from outside, or by the run itself: a halt).
pub(super) async fn run_source<S, H, Src>(
    store: Arc<S>,
    mut source: Src,
    run: Run<'_, H>,
) -> Result<RunSummary, EngineError>
where
    S: Store + Leases,
    H: Handler,
    Src: Source,
{
    let Run {
        spec,
        handler,
        opts,
        counters,
        stop,
        started,
        limits_restored,
    } = run;
    // The run's own stop: asked for from outside, or by the run itself (a halt).
    let (own_stop, stop_inner) = stop_pair();
    let halt = Arc::new(Halt::new(own_stop.clone()));
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
    if let Some(announced) = handler.announced_limits() {
        counters.attach_announced(announced);
    }
    let kept = spec.kept_quotas();
    let quotas = (!kept.is_empty()).then(|| {
        let gate = QuotaGate::new(kept, store.clone(), opts.clock.clone());
        counters.attach_quotas(gate.states());
        Arc::new(gate)
    });
    let controller = tokio::spawn(control(throttle.clone(), halt.clone()));
    let member = source.member(&throttle);
    // The API limits learnt from refusals: those the job keeps pace the first call.
    let keeper = match handler.announced_limits() {
        Some(limits) => {
            let mut keeper = Keeper::new(store.clone(), limits);
            if !limits_restored {
                keeper.restore().await;
            }
            Some(keeper.spawn())
        }
        None => None,
    };

    let (writer_tx, writer_rx) =
        mpsc::channel(writer_queue(opts.concurrency, store.over_network()));
    // Rung by a worker once the writer's queue holds a group (see `group_target`) or is
    // full: the writer, gathering a group, is not woken by each result sent, only by this or
    // its group's deadline.
    let writer_full = Arc::new(Notify::new());
    let committed = Arc::new(Notify::new());
    let durability = opts.durability;
    let writer = Writer {
        store: store.clone(),
        counters: counters.clone(),
        max_failures: opts.max_failures,
        halt: halt.clone(),
        open: HashMap::new(),
        log: source.log(),
        leases: HashMap::new(),
        completed: HashMap::new(),
        full: writer_full.clone(),
        pages: Vec::new(),
        clock: opts.clock.clone(),
        committed: committed.clone(),
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

    let workers = opts.concurrency.max(1);
    // A batch job's workers each take up to a batch of items at once.
    let batch_size = spec.work.ids_per_call();
    let queue = Arc::new(WorkQueue::new(work_queue(workers * batch_size)));
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
            rerun: source.log().rerun(),
            fleet: member.clone(),
            parked: parked.clone(),
            quotas: quotas.clone(),
            announced: handler.announced_limits(),
            halt: halt.clone(),
            batch_size,
            keeps_pages: store.keeps_pages(),
            clock: opts.clock.clone(),
        };
        pool.spawn(work(task, queue.clone(), permits.clone(), halt.clone()));
    }
    let mut dispatcher = Dispatcher {
        stop: stop.clone(),
        queue,
        workers: pool,
        writer: writer_tx,
        committed,
    };
    let fed = source.feed(&mut dispatcher, &counters).await;
    let finished = dispatcher.finish(opts.shutdown_timeout).await;
    drop(dispatcher);
    let written = writer
        .await
        .map_err(|e| EngineError::Internal(format!("result writer: {e}")))?;
    if let Some(gate) = &quotas {
        // The calls are done: what the run holds of its quotas and did not spend is the
        // job's again (a failure leaves it counted, never lost).
        if let Err(e) = gate.give_back().await {
            tracing::warn!("cannot give back the quota this run did not spend: {e}");
        }
    }
    if let (Some(keeper), Some(limits)) = (keeper, handler.announced_limits()) {
        keeper.abort();
        // What the run learnt last, kept before its store closes.
        Keeper::new(store.clone(), limits).sync().await;
    }
    controller.abort();
    forward.abort();
    let closed = source.close().await;
    finished?;
    written?;
    fed?;
    closed?;
    Ok(RunSummary {
        job: store.stats().await?,
        run: counters.snapshot(),
        elapsed_ms: millis(started.elapsed()),
        interrupted: stop.is_stopping(),
        halted: halt.reason(),
    })
}
