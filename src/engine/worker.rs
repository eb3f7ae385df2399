//! The workers: a fixed pool of tasks, each taking an item from the queue and calling the
//! handler for it under the throttle (rate limit, adaptive concurrency, retries, outages),
//! then handing the final record to the writer ([`ItemTask`]); and the controller task that
//! adapts the throttle at every tick.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify, Semaphore};

use super::item::Item;
use super::member::Member;
use super::queue::WorkQueue;
use super::stop::{Halt, HaltOnPanic, Stop};
use super::writer::{group_target, WriterMsg};
use crate::handler::Handler;
use crate::progress::Counters;
use crate::retry::{self, Charge, ItemOutcome};
use crate::spec::JobSpec;
use crate::store::now_ms;
use crate::store::{ItemRecord, ItemStatus};
use crate::throttle::{ItemHistory, Observed, Throttle};

/// A worker: take items from the queue and process them, one at a time, each under a
/// permit of the run's (adaptive) concurrency limit, until the queue is closed and empty or
/// a stop is asked for.
pub(super) async fn work<H: Handler>(
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
        while !task.fleet.alive() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = task.stop.stopping() => return,
            }
        }
        // A lease lost meanwhile (the session expired and was registered anew): its bucket
        // is another worker's, and a result of this one would be fenced out. Not called; its
        // track never completes here, and the lease is not committed.
        if let Some(lease) = item.lease.as_ref().filter(|l| !task.fleet.holds(l)) {
            tracing::debug!(id = item.id, ?lease.scope, "not called: its bucket's lease is lost");
            continue;
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
pub(super) struct Abandon<'a>(pub(super) Option<&'a Counters>);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(counters) = self.0 {
            Counters::add(&counters.abandoned, 1);
        }
    }
}

pub(super) struct ItemTask<H> {
    pub(super) throttle: Arc<Throttle>,
    pub(super) spec: Arc<JobSpec>,
    pub(super) handler: Arc<H>,
    pub(super) counters: Arc<Counters>,
    pub(super) stop: Stop,
    pub(super) writer: mpsc::Sender<WriterMsg>,
    pub(super) writer_full: Arc<Notify>,
    pub(super) rerun: Option<u32>,
    /// The run's fleet, if any: are its leases held, pause it on `Retry-After`.
    pub(super) fleet: Arc<dyn Member>,
}

impl<H: Handler> ItemTask<H> {
    async fn process(&self, item: Item) {
        let handler = &*self.handler;
        let counters = &self.counters;
        let throttle = &*self.throttle;
        let stop = &self.stop;
        let fleet = &*self.fleet;
        let id = item.id.as_str();
        // When the first and the last attempt started, and how long the last one took (µs).
        let (first_at, last_at) = (&AtomicU64::new(0), &AtomicU64::new(0));
        // What the throttle learnt of this ID's failures (is it failing alone?).
        let history = &ItemHistory::default();
        let last_latency = &AtomicU64::new(0);
        // The futures awaited below are boxed. A worker is one task for the whole run, and a
        // task's future is as large as its largest state, all of it written sooner or later:
        // inline, the handler's call (5 KB for the HTTP handler), the throttle's waits and the
        // retry loop around them made each worker 22.8 KB, 87 MiB at --concurrency 4000
        // (README, Performance). Boxed, a call's state exists only while it is in flight.
        let outcome = retry::run(
            &self.spec.retry,
            |attempt| async move {
                // Waiting for the rate limit or for the API to come back is given up on a
                // stop; a request already sent is let finish.
                let probe = tokio::select! {
                    probe = Box::pin(throttle.before_attempt()) => probe,
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
                let result = Box::pin(handler.call(id)).await;
                drop(in_flight);
                let latency = start.elapsed();
                last_latency.store(latency.as_micros() as u64, Relaxed);
                Counters::add_elapsed(&counters.api_ns, start);
                counters.http.observe(&result, latency);
                let observed = Observed::of(&result, latency);
                if let Err(e) = &result {
                    if let Some(Some(after)) = e.next.retry_after() {
                        fleet.pause(after);
                    }
                }
                let status = result.as_ref().err().and_then(|f| f.status);
                match status {
                    Some(429) => Counters::add(&throttle.throttled, 1),
                    Some(503) => Counters::add(&throttle.unavailable, 1),
                    _ => {}
                }
                let counts = Box::pin(throttle.charge(observed, probe, history)).await;
                let charge = match status {
                    _ if !counts => Charge::Free,
                    // "Too many requests" is about the client's rate, never the ID: the
                    // throttle slows down, and the item waits without losing an attempt.
                    Some(429) => Charge::Refused,
                    _ => Charge::Counted,
                };
                Some((result, charge))
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
                let _ = Box::pin(self.writer.send(msg)).await;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

/// The controller task: adapt at every tick; halt the run when the API is out too long.
pub(super) async fn control(throttle: Arc<Throttle>, halt: Arc<Halt>) {
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
                    "the API has been unreachable for {} ({} {}); every result so far is durable",
                    humantime::format_duration(Duration::from_secs(out.as_secs())),
                    crate::setting::Setting::MaxOutage,
                    humantime::format_duration(throttle.max_outage()),
                ));
                return;
            }
        }
    }
}
