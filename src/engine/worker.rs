//! The workers: a fixed pool of tasks, each taking an item from the queue and calling the
//! handler for it under the throttle (rate limit, adaptive concurrency, retries, outages),
//! then handing the final record to the writer ([`ItemTask`]); an item waiting for a retry
//! is parked, holding no permit, while its worker takes the next ([`work`]); and the
//! controller task that adapts the throttle at every tick.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, Notify, Semaphore, SemaphorePermit};

use super::item::Item;
use super::member::Member;
use super::queue::WorkQueue;
use super::quotas::{Cost, QuotaGate, QuotaStop, Spent};
use super::stop::{Halt, HaltOnPanic, Stop};
use super::writer::{group_target, WriterMsg};
use crate::clock::Clock;
use crate::failure::Failure;
use crate::failure::Next;
use crate::handler::{Answered, Handler};
use crate::meter::Usage;
use crate::progress::{Counters, HaltKind};
use crate::quota::pacer::AnnouncedLimits;
use crate::retry::{self, Charge, ItemOutcome};
use crate::spec::JobSpec;
use crate::store::{ItemRecord, ItemStatus};
use crate::throttle::{ItemHistory, Observed, Throttle};

/// A worker: take items from the queue and process them until the queue is closed and
/// empty or a stop is asked for.
///
/// A worker attempts one item at a time, but an item waiting for its retry is parked: it
/// holds no permit, and its worker takes the next item meanwhile, unless the API refused the
/// rate (429, or overload as the throttle judges it: then waiting is the point). Items that fail again and
/// again (a few IDs the API refuses every time) would otherwise hold the run's concurrency
/// through their backoff waits: at `--concurrency 8`, 3% of IDs refused for good took a
/// job against a 20 ms API from 400 to 32 items/s. The run's concurrency bounds requests in
/// flight (each attempt holds a permit of `permits`); parked items are bounded by
/// [`Parked`], past which a worker waits for its own items as if they were not parked.
pub(super) async fn work<H: Handler>(
    task: ItemTask<H>,
    queue: Arc<WorkQueue<Item>>,
    permits: Arc<Semaphore>,
    halt: Arc<Halt>,
) {
    // A panic in a worker stops the run (finish reports it) instead of leaving its share of
    // the queue to the others unnoticed.
    let _halt_on_panic = HaltOnPanic(&halt);
    let slots = Slots {
        permits: &permits,
        active: AtomicUsize::new(0),
        parked: &task.parked,
        changed: Notify::new(),
    };
    let mut items = FuturesUnordered::new();
    let mut closed = false;
    loop {
        let may_take = !closed && slots.active.load(Relaxed) == 0 && task.parked.has_room();
        tokio::select! {
            biased;
            Some(()) = items.next(), if !items.is_empty() => {}
            popped = queue.pop(&task.stop), if may_take => match popped {
                Some(item) => {
                    let mut unit = vec![item];
                    if task.batch_size > 1 {
                        // A batch: the items queued behind it of the same bucket, at once.
                        let track = unit[0].track;
                        unit.extend(queue.pop_more(task.batch_size - 1, |i| i.track == track));
                    }
                    slots.active.fetch_add(1, Relaxed);
                    items.push(task.unit(unit, &slots));
                }
                None => closed = true,
            },
            // An item parked (or the run's parked items went below the bound): take another.
            _ = slots.changed.notified(), if !may_take && !closed => {}
        }
        if closed && items.is_empty() {
            return;
        }
    }
}

/// The items of a run waiting for a retry, bounded (see [`work`]).
pub(super) struct Parked {
    now: AtomicUsize,
    max: usize,
}

impl Parked {
    /// The bound for a run of `concurrency`: a parked item costs a few KB of its future.
    pub(super) fn for_concurrency(concurrency: usize) -> Parked {
        Parked {
            now: AtomicUsize::new(0),
            max: (4 * concurrency).max(1024),
        }
    }

    fn has_room(&self) -> bool {
        self.now.load(Relaxed) < self.max
    }
}

/// One worker's hold on the run's concurrency: the permits every attempt takes, how many of
/// its items are active (not parked), and the wake-up when one parks.
pub(super) struct Slots<'a> {
    permits: &'a Semaphore,
    active: AtomicUsize,
    parked: &'a Parked,
    changed: Notify,
}

/// An item's place in its worker's [`Slots`]: active from its start until it parks to wait
/// for a retry, active again when the retry starts; neither once dropped.
pub(super) struct Slot<'a> {
    slots: &'a Slots<'a>,
    parked: std::sync::atomic::AtomicBool,
}

impl<'a> Slot<'a> {
    /// An item's (or a batch's) place in `slots`, active from now.
    pub(super) fn new(slots: &'a Slots<'a>) -> Slot<'a> {
        Slot {
            slots,
            parked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The run's permits, which every attempt takes.
    pub(super) fn permits(&self) -> &'a tokio::sync::Semaphore {
        self.slots.permits
    }

    fn park(&self) {
        if !self.parked.swap(true, Relaxed) {
            self.slots.parked.now.fetch_add(1, Relaxed);
            self.slots.active.fetch_sub(1, Relaxed);
            self.slots.changed.notify_one();
        }
    }

    fn unpark(&self) {
        if self.parked.swap(false, Relaxed) {
            self.slots.parked.now.fetch_sub(1, Relaxed);
            self.slots.active.fetch_add(1, Relaxed);
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.parked.load(Relaxed) {
            self.slots.parked.now.fetch_sub(1, Relaxed);
        } else {
            self.slots.active.fetch_sub(1, Relaxed);
        }
        self.slots.changed.notify_one();
    }
}

/// Counts its items abandoned if dropped while it holds the counters: its worker was aborted
/// mid-item.
pub(super) struct Abandon<'a>(pub(super) Option<&'a Counters>, pub(super) u64);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(counters) = self.0 {
            Counters::add(&counters.abandoned, self.1);
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
    /// The run's items waiting for a retry (shared by its workers).
    pub(super) parked: Arc<Parked>,
    /// The job's quotas, if it has any: every attempt takes a call from each.
    pub(super) quotas: Option<Arc<QuotaGate>>,
    /// The limits the API announces, if the handler reads them: every attempt waits for
    /// them.
    pub(super) announced: Option<Arc<AnnouncedLimits>>,
    /// The run stopping itself: a spent budget, a rejected credential.
    pub(super) halt: Arc<Halt>,
    /// IDs per request: a batch job's batch size, else 1.
    pub(super) batch_size: usize,
    /// The store keeps the pages of paginated IDs: each page is written as it comes.
    pub(super) keeps_pages: bool,
    /// The run's wall clock: what records are stamped with.
    pub(super) clock: Clock,
}

impl<H: Handler> ItemTask<H> {
    /// A unit of work (one item, or a batch job's items of one bucket), from its first
    /// permit to each record handed to the writer.
    async fn unit(&self, mut items: Vec<Item>, slots: &Slots<'_>) {
        let slot = Slot::new(slots);
        let permit = tokio::select! {
            permit = slots.permits.acquire() => permit.expect("the semaphore is never closed"),
            // Not started: the item stays pending, like the rest of the queue.
            _ = self.stop.stopping() => return,
        };
        // A permit and a stop at once: the stop wins.
        if self.stop.is_stopping() {
            return;
        }
        // Leases that may have lapsed: no call starts until they are surely held again.
        while !self.fleet.alive() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = self.stop.stopping() => return,
            }
        }
        // A lease lost meanwhile (the session expired and was registered anew): its bucket
        // is another worker's, and a result of this one would be fenced out. Not called; its
        // track never completes here, and the lease is not committed.
        items.retain(|item| match item.lease.as_ref().filter(|l| !self.fleet.holds(l)) {
            Some(lease) => {
                tracing::debug!(id = item.id, ?lease.scope, "not called: its bucket's lease is lost");
                false
            }
            None => true,
        });
        let mut started = Abandon(Some(&self.counters), items.len() as u64);
        match items.len() {
            0 => {}
            1 => {
                self.process(items.pop().expect("one item"), &slot, permit)
                    .await
            }
            _ => self.batch(items, &slot, Some(permit)).await,
        }
        started.0 = None;
    }

    /// The item's attempts, each under a permit (the first one given), parking `slot` while
    /// it waits for a retry.
    pub(super) async fn process(&self, item: Item, slot: &Slot<'_>, first: SemaphorePermit<'_>) {
        let first = &std::sync::Mutex::new(Some(first));
        let permits = slot.slots.permits;
        let handler = &*self.handler;
        let id = item.id.as_str();
        let row = item.values.as_deref();
        // When the first and the last attempt started, and how long the last one took (µs).
        let (first_at, last_at) = (&AtomicU64::new(0), &AtomicU64::new(0));
        // What the throttle learnt of this ID's failures (is it failing alone?).
        let history = &ItemHistory::default();
        let last_latency = &AtomicU64::new(0);
        // The futures awaited below are boxed. A worker is one task for the whole run, and a
        // task's future is as large as its largest state, all of it written sooner or later:
        // inline, the handler's call (5 KB for the HTTP handler), the throttle's waits and the
        // retry loop around them made each worker 22.8 KB, 87 MiB at --concurrency 4000
        // (benches/README.md). Boxed, a call's state exists only while it is in flight.
        let state = AttemptState {
            slot,
            first,
            permits,
            history,
            first_at,
            last_at,
            last_latency,
            estimate: &|| handler.estimate(id, row),
            most: &|| handler.most(id, row),
        };
        let state = &state;
        let (outcome, stored) = match self.spec.work.paginate() {
            // Each page one request with its retries (`pages.rs`).
            Some(paginate) => Box::pin(self.pages(state, &item, paginate)).await,
            None => {
                let outcome = retry::run(
                    &self.spec.retry,
                    |attempt| self.attempt(state, attempt, || handler.call_row(id, row)),
                    self.stop.stopping(),
                )
                .await;
                (outcome, None)
            }
        };
        let times = Times {
            first_ms: first_at.load(Relaxed),
            last_ms: last_at.load(Relaxed),
            latency_us: last_latency.load(Relaxed),
        };
        self.finish_paged(item, outcome, times, stored).await;
    }

    /// Make `item`'s final record of `outcome` and hand it to the writer (an abandoned item
    /// stays pending: counted, nothing written).
    pub(super) async fn finish(&self, item: Item, outcome: ItemOutcome, times: Times) {
        self.finish_paged(item, outcome, times, None).await
    }

    /// [`ItemTask::finish`], for an ID whose result is `stored` pages of the store's, not a
    /// body.
    pub(super) async fn finish_paged(
        &self,
        item: Item,
        outcome: ItemOutcome,
        times: Times,
        stored: Option<StoredPages>,
    ) {
        let counters = &self.counters;
        let id = item.id.as_str();
        let mut record = ItemRecord::pending(item.row, item.bucket);
        record.finished_at_ms = Some(self.clock.now_ms());
        record.first_attempt_ms = Some(times.first_ms).filter(|&t| t > 0);
        record.last_attempt_ms = Some(times.last_ms).filter(|&t| t > 0);
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
                if let Some(u) = output.usage {
                    Counters::add(&counters.usage_input, u.input);
                    Counters::add(&counters.usage_output, u.output);
                }
                record.usage = output.usage;
                record.latency_ms = Some(times.latency_us / 1000);
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
        if let Some(stored) = stored {
            record.first_attempt_ms = stored.first_attempt_ms.or(record.first_attempt_ms);
            if record.status == ItemStatus::Ok {
                record.body = None;
                record.pages = Some(stored.pages);
            }
        }
        if let Some(prior) = &item.prior {
            record.continue_from(prior);
        }
        record.rerun = self.rerun;
        // A closed writer means the run is failing; the item stays pending and is replayed.
        self.to_writer(WriterMsg::Done {
            id: item.id,
            track: item.track,
            record,
        })
        .await;
    }

    /// Hand `msg` to the writer, waiting for room when its queue is full.
    pub(super) async fn to_writer(&self, msg: WriterMsg) {
        let counters = &self.counters;
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

    /// One attempt, from its gates (a permit, the rate limit, the API's announced limits,
    /// the quotas; the item's slot active while it waits for them) through `call` to what
    /// follows the answer: the counters, the throttle's verdict and charge, a fleet's pause,
    /// the slot parked for a retry. `None` when the run stops or halts before an answer.
    pub(super) async fn attempt<
        T: Answered,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    >(
        &self,
        state: &AttemptState<'_, '_>,
        attempt: u32,
        call: impl FnOnce() -> Fut,
    ) -> Option<(Result<T, Failure>, Charge, Duration)> {
        let AttemptState {
            slot,
            first,
            permits,
            history,
            first_at,
            last_at,
            last_latency,
            estimate,
            most,
        } = *state;
        let counters = &self.counters;
        let throttle = &*self.throttle;
        let stop = &self.stop;
        let fleet = &*self.fleet;
        let quotas = self.quotas.as_deref();
        let announced = self.announced.as_deref();
        let halt = &*self.halt;
        slot.unpark();
        let taken = first.lock().unwrap_or_else(PoisonError::into_inner).take();
        let permit = match taken {
            Some(permit) => permit,
            None => tokio::select! {
                permit = permits.acquire() => permit.expect("the semaphore is never closed"),
                _ = stop.stopping() => return None,
            },
        };
        // Paced by what the API announced it has left (a wait, never an attempt), of which
        // this worker takes its part among the fleet's live workers. Before the rate limit:
        // attempts released together here (the API's first answer, a reset) then pass it
        // one by one, instead of spending at once the starts it let through while they
        // waited.
        let mut paced_call = match announced {
            None => None,
            Some(a) => {
                // Not before the fleet lets this worker call (its first grant, a pause): until
                // its grant comes, a newcomer does not know how many workers share the API's
                // windows, and would take them whole, as a worker alone does.
                tokio::select! {
                    () = throttle.fleet_gate() => {}
                    _ = stop.stopping() => return None,
                }
                // Back from idle, not counted by the others yet: they divided the windows
                // among themselves meanwhile (nothing to wait for when none is known).
                if a.knows_a_window() {
                    tokio::select! {
                        () = throttle.rejoin_gate() => {}
                        _ = stop.stopping() => return None,
                    }
                }
                // A limit that counts tokens takes what the call is expected to cost.
                let cost = if a.counts_tokens() { estimate() } else { None };
                tokio::select! {
                    call = Box::pin(a.wait_for(|| throttle.fleet_workers(), cost)) => Some(call),
                    _ = stop.stopping() => return None,
                }
            }
        };
        // Waiting for the rate limit or for the API to come back is given up on a
        // stop; a request already sent is let finish.
        let probe = tokio::select! {
            probe = Box::pin(throttle.before_attempt()) => probe,
            _ = stop.stopping() => return None,
        };
        // A call of every quota (its cost, of a quota of tokens or money), held until the
        // answer: waiting for a spent window uses none of the item's attempts; a spent budget
        // leaves the item pending.
        let quota_call = match quotas {
            None => None,
            Some(q) => {
                let cost = Cost {
                    expected: if q.metered() { estimate() } else { None },
                    most: if q.priced() { most() } else { None },
                };
                tokio::select! {
                    taken = Box::pin(q.acquire(cost)) => match taken {
                        Ok(call) => Some(call),
                        Err(e) => {
                            let kind = match e {
                                QuotaStop::Spent(..) => HaltKind::BudgetSpent,
                                QuotaStop::TooCostly { .. } | QuotaStop::Store(_) => {
                                    HaltKind::Internal
                                }
                            };
                            halt.halt(kind, e.to_string());
                            return None;
                        }
                    },
                    _ = stop.stopping() => return None,
                }
            }
        };
        let at = self.clock.now_ms();
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
        let result = Box::pin(call()).await;
        drop(in_flight);
        if let Some(call) = quota_call {
            call.settle(match &result {
                Ok(answer) => answer.usage().map_or(Spent::Unknown, Spent::Reported),
                // A refusal the API answered with (4xx but a timeout) is not billed; an
                // answer refused by its checks was, and a server error or a call with no
                // answer may have been (a gateway's 504 after the model wrote).
                Err(f)
                    if f.status
                        .is_some_and(|s| (400..500).contains(&s) && s != 408) =>
                {
                    Spent::Nothing
                }
                Err(_) => Spent::Unknown,
            });
        }
        if let (Some(a), Some(call)) = (announced, paced_call.as_mut()) {
            a.settle(call, result.as_ref().ok().and_then(Answered::usage));
        }
        drop(paced_call);
        let latency = start.elapsed();
        last_latency.store(latency.as_micros() as u64, Relaxed);
        Counters::add(&counters.api_ns, latency.as_nanos() as u64);
        counters.http.observe(&result, latency);
        drop(permit);
        if let Some(c) = throttle.concurrency() {
            c.settle();
        }
        let next = result.as_ref().err().map(|f| f.next);
        if let (Err(f), Some(Next::CredentialRejected)) = (&result, next) {
            // Not the ID's doing: it stays pending, and the run stops for the user
            // to fix the credential and resume.
            halt.halt(HaltKind::CredentialRejected, f.message.clone());
            return None;
        }
        if let (Err(f), Some(Next::OutOfCredit)) = (&result, next) {
            // Neither the ID's doing nor the rate's, and waiting does not help: the
            // ID stays pending, and the run stops for credit to be added.
            let reason = format!(
                "the API says the account is out of credit ({}): add credit, then resume",
                f.message
            );
            halt.halt(HaltKind::OutOfCredit, reason);
            return None;
        }
        let observed = Observed::of(&result, latency);
        if let Some(Some(after)) = next.and_then(Next::retry_after) {
            // A Retry-After about the ID it refused holds that ID only.
            if throttle.refused_for_the_rate(observed) {
                fleet.pause(after);
            }
        }
        let counts = Box::pin(throttle.charge(observed, probe, history)).await;
        let charge = match next {
            _ if !counts => Charge::Free,
            // "Too many requests" is about the client's rate, never the ID: the
            // throttle slows down, and the item waits without losing an attempt.
            Some(Next::TooMany { .. }) => Charge::Refused,
            _ => Charge::Counted,
        };
        // It may wait for a retry: its worker takes another item meanwhile, unless
        // the API refused the rate. Then the worker waits with it: new items would
        // only meet the same refusals (against nginx's limit_req at ten times its
        // rate, refusals went from 3% to 11-14% of attempts when workers went on).
        let the_rates = throttle.refused_for_the_rate(observed);
        if next.and_then(Next::retry_after).is_some() && !the_rates {
            slot.park();
        }
        // The item's retry time is its calls' (and their verdicts'), not the waits
        // at the gates above: a spent quota window or the rate limit are the run's.
        Some((result, charge, start.elapsed()))
    }
}

/// The pages a store kept of a paginated ID whose result they are, and when its first
/// attempt started (in an earlier run, for an ID resumed mid-way).
#[derive(Debug, Clone, Copy)]
pub(super) struct StoredPages {
    pub(super) pages: u32,
    pub(super) first_attempt_ms: Option<u64>,
}

/// When an item's first and last attempts started (unix ms, 0: none) and how long the last
/// took (µs), for its record.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Times {
    pub(super) first_ms: u64,
    pub(super) last_ms: u64,
    pub(super) latency_us: u64,
}

/// What an item's attempts share: its slot, the permit its first attempt was given, the
/// run's permits, what the throttle learnt of its failures, when its first and last attempt
/// started and how long the last took (µs).
#[derive(Clone, Copy)]
pub(super) struct AttemptState<'a, 's> {
    pub(super) slot: &'a Slot<'s>,
    pub(super) first: &'a std::sync::Mutex<Option<SemaphorePermit<'s>>>,
    pub(super) permits: &'s Semaphore,
    pub(super) history: &'a ItemHistory,
    pub(super) first_at: &'a AtomicU64,
    pub(super) last_at: &'a AtomicU64,
    pub(super) last_latency: &'a AtomicU64,
    /// What an attempt is expected to cost, for limits that count tokens (none: unknown).
    pub(super) estimate: &'a (dyn Fn() -> Option<Usage> + Sync),
    /// What an attempt may cost at the most, for a budget in money (none: unknown).
    pub(super) most: &'a (dyn Fn() -> Option<Usage> + Sync),
}

/// The controller task: adapt at every tick; halt the run when the API is out too long.
pub(super) async fn control(throttle: Arc<Throttle>, halt: Arc<Halt>) {
    let tick = throttle.tick_interval();
    let mut ticker = tokio::time::interval_at(Instant::now() + tick, tick);
    let mut last = Instant::now();
    loop {
        ticker.tick().await;
        throttle.on_tick(last.elapsed());
        last = Instant::now();
        if let Some(out) = throttle.outage() {
            if out > throttle.max_outage() {
                let reason = format!(
                    "the API (or a credential's source) has been unreachable for {} ({} {}); \
                     every result so far is durable",
                    humantime::format_duration(Duration::from_secs(out.as_secs())),
                    crate::setting::Setting::MaxOutage,
                    humantime::format_duration(throttle.max_outage()),
                );
                halt.halt(HaltKind::Outage, reason);
                return;
            }
        }
    }
}
