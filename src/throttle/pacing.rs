//! The [`Throttle`] of a run: ties the rate limiter, the adaptive controller, refusals
//! bound to IDs and the outage gate together, and holds a fleet's worker to its share.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::controller::{
    AdaptiveConcurrency, ControlSettings, PushbackFilter, RateController, TickSignals,
};
use super::options::ThrottleOptions;
use super::outage::{
    ItemHistory, Observed, Outage, Verdict, FIRST_PROBE_AFTER, MAX_PROBE_INTERVAL,
    OUTAGE_AFTER_FAILURES, PROVISIONAL_WAIT,
};
use super::rate::{Rate, RateLimiter, UNLIMITED};
use super::repeats::{self, RepeatRefusals, TickRefusals};
use crate::quota::pacer::JOIN_SETTLE;

/// How fast the adaptive rate climbs while the API keeps up: 10% per second.
pub(crate) const INCREASE_PER_SECOND: f64 = 0.10;

/// Relative change of the adaptive rate below which the limiter is not told: none, so the
/// achieved rate follows the controller's (a change costs a lock and a wake-up).
pub(crate) const SWAP_THRESHOLD: f64 = 0.0;

struct TickCounters {
    attempts: AtomicU64,
    pushback: AtomicU64,
    /// Pushback other than 429 (503, 529, timeouts).
    refused: AtomicU64,
    /// Attempts of IDs whose last attempt was refused, and those refused again.
    repeats: AtomicU64,
    repeats_refused: AtomicU64,
    /// The lowest latency of a success over the tick (`u64::MAX`: none).
    min_latency_us: AtomicU64,
    /// [`Throttle::throttled`] at the last tick: the tick's 429s are the difference.
    throttled_at_tick: AtomicU64,
}

impl Default for TickCounters {
    fn default() -> Self {
        TickCounters {
            attempts: AtomicU64::new(0),
            pushback: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            repeats: AtomicU64::new(0),
            repeats_refused: AtomicU64::new(0),
            min_latency_us: AtomicU64::new(u64::MAX),
            throttled_at_tick: AtomicU64::new(0),
        }
    }
}

/// Paces attempts for a whole run: the rate limit, the adaptive controller, and the outage
/// gate that holds every attempt back while the API is out, letting one probe through at
/// growing intervals.
pub(crate) struct Throttle {
    options: ThrottleOptions,
    limiter: Option<RateLimiter>,
    pub(super) controller: Mutex<Option<RateController>>,
    concurrency: Option<AdaptiveConcurrency>,
    tick: TickCounters,
    /// Which ticks' pushback says the API is overloaded (only the control task locks it).
    pub(super) pushback_filter: Mutex<PushbackFilter>,
    /// Which refusals are bound to IDs rather than the rate (only the control task locks it).
    repeat_refusals: Mutex<RepeatRefusals>,
    /// Whether the last tick found the API overloaded: pushback acted on.
    overloaded: std::sync::atomic::AtomicBool,
    /// The share of fresh attempts refused for their IDs, as of the last tick (f64 bits).
    bound_share: AtomicU64,
    failures_in_a_row: AtomicU64,
    /// Attempts that got an answer (any status), over the run.
    answers: AtomicU64,
    /// Failures waiting for a verdict, and their wake-up.
    provisional: AtomicU64,
    answered: tokio::sync::Notify,
    /// Possible-outage failures that waited for evidence, over the run.
    pub(super) evidence_waits: AtomicU64,
    /// Possible-outage failures of IDs shown failing alone, counted at once, over the run.
    own_failures: AtomicU64,
    pub(super) outage: Mutex<Outage>,
    outage_changed: tokio::sync::Notify,
    /// The fleet's hold on this worker (see [`Throttle::follow_fleet`]).
    pub(super) fleet: Mutex<FleetHold>,
    fleet_changed: tokio::sync::Notify,
    /// Attempts answered 429 over the run, for reports and for the pushback filter, which
    /// never learns a 429 as the API's weather.
    pub(crate) throttled: AtomicU64,
    /// Attempts answered "overloaded" (503, 529) over the run, for reports.
    pub(crate) unavailable: AtomicU64,
    /// Refusals (503, 529, timeouts) taken as their IDs', not the rate's, over the run
    /// (see `repeats`).
    pub(crate) refused_ids: AtomicU64,
    /// The live workers of this worker's fleet, itself among them (0: alone, or not
    /// counted yet).
    fleet_workers: AtomicU64,
}

/// What the fleet of a shared job allows this worker (see [`Throttle::follow_fleet`]).
#[derive(Debug, Default)]
pub(super) struct FleetHold {
    /// The share in force: `None` while the worker follows no fleet rate.
    share: Option<f64>,
    /// This worker's part of the job's burst, if the job has one.
    burst: Option<u32>,
    /// No attempt starts before this.
    paused_until: Option<tokio::time::Instant>,
    /// Nothing of what the API announces is taken before this: the worker came back from
    /// idle, and the others count it again only by then ([`Throttle::follow_rejoin`]).
    rejoin_until: Option<tokio::time::Instant>,
    /// The return from idle that set `rejoin_until`.
    rejoined: Option<tokio::time::Instant>,
}

/// A pause extended by less than this is not worth telling the fleet again.
const PAUSE_MARGIN: Duration = Duration::from_millis(500);

impl Throttle {
    /// A throttle for a run whose item concurrency is bounded by `permits` (holding
    /// `max_concurrency` permits).
    pub(crate) fn new(
        options: ThrottleOptions,
        permits: Arc<tokio::sync::Semaphore>,
        max_concurrency: usize,
    ) -> Throttle {
        // Without --rate but adaptive, the ceiling is "unlimited": the limiter only starts to
        // bind once the API pushes back and the controller brings the rate down.
        let ceiling = match (options.rate, options.adaptive) {
            (Some(r), _) => Some(r.0),
            (None, true) => Some(UNLIMITED),
            (None, false) => None,
        };
        let limiter = ceiling.map(|ceiling| {
            let initial = options
                .initial_rate
                .map(|r| r.0.min(ceiling))
                .unwrap_or(ceiling);
            RateLimiter::new(Rate(initial), options.burst)
        });
        let controller = match (ceiling, options.adaptive) {
            (Some(ceiling), true) => {
                let default_floor = if ceiling >= UNLIMITED {
                    1.0
                } else {
                    (ceiling / 100.0).max(0.1)
                };
                let floor = options
                    .min_rate
                    .map(|r| r.0)
                    .unwrap_or(default_floor)
                    .min(ceiling);
                let mut settings = ControlSettings::new(floor, ceiling);
                settings.kp = options.kp;
                settings.ki = options.ki;
                settings.kd = options.kd;
                settings.increase =
                    (1.0 + INCREASE_PER_SECOND).powf(options.tick.as_secs_f64()) - 1.0;
                let initial = options.initial_rate.map(|r| r.0).unwrap_or(ceiling);
                Some(RateController::new(settings, initial))
            }
            _ => None,
        };
        let concurrency =
            (options.rate.is_none() && options.adaptive).then(|| AdaptiveConcurrency {
                permits,
                limit: AtomicU64::new(max_concurrency as u64),
                max: max_concurrency as u64,
                owed: AtomicU64::new(0),
            });
        let now = tokio::time::Instant::now();
        Throttle {
            options,
            limiter,
            controller: Mutex::new(controller),
            concurrency,
            tick: TickCounters::default(),
            pushback_filter: Mutex::new(PushbackFilter::default()),
            repeat_refusals: Mutex::new(RepeatRefusals::default()),
            overloaded: std::sync::atomic::AtomicBool::new(false),
            bound_share: AtomicU64::new(0),
            failures_in_a_row: AtomicU64::new(0),
            answers: AtomicU64::new(0),
            provisional: AtomicU64::new(0),
            answered: tokio::sync::Notify::new(),
            evidence_waits: AtomicU64::new(0),
            own_failures: AtomicU64::new(0),
            outage: Mutex::new(Outage {
                since: None,
                next_probe: now,
                probe_interval: FIRST_PROBE_AFTER,
                probing: false,
            }),
            outage_changed: tokio::sync::Notify::new(),
            fleet: Mutex::new(FleetHold::default()),
            fleet_changed: tokio::sync::Notify::new(),
            throttled: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
            refused_ids: AtomicU64::new(0),
            fleet_workers: AtomicU64::new(0),
        }
    }

    /// Note the live workers of this worker's fleet (itself among them), as its store last
    /// counted them.
    pub(crate) fn count_fleet(&self, workers: u32) {
        self.fleet_workers.store(u64::from(workers), Relaxed);
    }

    /// The live workers of this worker's fleet, itself among them: 1 when alone (or not
    /// counted yet).
    pub(crate) fn fleet_workers(&self) -> u64 {
        self.fleet_workers.load(Relaxed).max(1)
    }

    /// The rate limit in force, if any (none while an adaptive limit is still unlimited).
    pub(crate) fn rate(&self) -> Option<f64> {
        self.limiter
            .as_ref()
            .map(RateLimiter::rate)
            .filter(|r| *r < UNLIMITED)
    }

    /// The adaptive concurrency limit, when concurrency is what adapts.
    pub(crate) fn concurrency(&self) -> Option<&AdaptiveConcurrency> {
        self.concurrency.as_ref()
    }

    /// Follow this worker's share of a fleet's rate: the share is the ceiling (the adaptive
    /// controller runs inside it), and a share of 0 holds every attempt until a share is
    /// granted. `None`: the fleet has no rate limit, the run's own applies. A throttle
    /// without a rate limiter (not adaptive, no rate) cannot follow a share.
    pub(crate) fn follow_fleet(
        &self,
        share: Option<f64>,
        burst: Option<u32>,
        paused_until: Option<tokio::time::Instant>,
    ) {
        let share = share.map(|s| if s.is_finite() { s.max(0.0) } else { 0.0 });
        let changed = {
            let mut f = self.fleet.lock().unwrap_or_else(PoisonError::into_inner);
            let changed_share = f.share != share || f.burst != burst;
            f.share = share;
            f.burst = burst;
            let extended = paused_until.is_some_and(|u| f.paused_until.is_none_or(|p| u > p));
            if extended {
                f.paused_until = paused_until;
            }
            changed_share || extended
        };
        if !changed {
            return;
        }
        if let (Some(share), Some(l)) = (share.filter(|s| *s > 0.0), &self.limiter) {
            let rate = match self
                .controller
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut()
            {
                Some(c) => c.set_ceiling(share),
                None => share,
            };
            tracing::debug!(share, rate, ?burst, "fleet share applied");
            if let Some(b) = burst {
                l.set_burst(b);
            }
            l.set_rate(Rate(rate));
        }
        self.fleet_changed.notify_waiters();
    }

    /// Hold every attempt for `pause` from now (the API said `Retry-After`). Returns
    /// whether this extends the pause in force by more than a little (worth telling the
    /// other workers).
    pub(crate) fn pause_for(&self, pause: Duration) -> bool {
        let until = tokio::time::Instant::now() + pause;
        let extended = {
            let mut f = self.fleet.lock().unwrap_or_else(PoisonError::into_inner);
            let extended = f.paused_until.is_none_or(|p| until > p + PAUSE_MARGIN);
            if f.paused_until.is_none_or(|p| until > p) {
                f.paused_until = Some(until);
            }
            extended
        };
        self.fleet_changed.notify_waiters();
        extended
    }

    /// Follow this worker's last return from idle ([`crate::store::FleetRate::rejoined`]):
    /// with other workers in the fleet, what the API announces it has left is taken
    /// nothing of for [`JOIN_SETTLE`] after it ([`Self::rejoin_gate`]), as a newcomer's
    /// first calls are held, since the others divided it among themselves while this worker
    /// held no bucket.
    pub(crate) fn follow_rejoin(&self, rejoined: Option<tokio::time::Instant>) {
        let Some(at) = rejoined else {
            return;
        };
        let others = self.fleet_workers() > 1;
        {
            let mut f = self.fleet.lock().unwrap_or_else(PoisonError::into_inner);
            if f.rejoined == Some(at) {
                return;
            }
            f.rejoined = Some(at);
            if others {
                f.rejoin_until = Some(at + JOIN_SETTLE);
            }
        }
        self.fleet_changed.notify_waiters();
    }

    /// Wait until the others count this worker again after its return from idle
    /// ([`Self::follow_rejoin`]): only a call that takes of a window the API announced (or
    /// one learnt) waits, since there is nothing else the others divided.
    pub(crate) async fn rejoin_gate(&self) {
        loop {
            let notified = self.fleet_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let until = self
                .fleet
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .rejoin_until
                .filter(|&u| u > tokio::time::Instant::now());
            let Some(until) = until else {
                return;
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// Wait while the fleet holds this worker: a pause, or a share of 0 (a newcomer's before
    /// its first grant, which also counts the fleet's workers: [`Self::fleet_workers`]).
    pub(crate) async fn fleet_gate(&self) {
        loop {
            let notified = self.fleet_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let until = {
                let f = self.fleet.lock().unwrap_or_else(PoisonError::into_inner);
                match f.paused_until {
                    Some(u) if u > tokio::time::Instant::now() => Some(u),
                    _ if f.share == Some(0.0) => None,
                    _ => return,
                }
            };
            match until {
                Some(u) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(u) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Wait until an attempt may start: the fleet's hold, the outage gate (one probe at a time while the API
    /// is out), then the rate limit. Returns whether this attempt is a probe.
    pub(crate) async fn before_attempt(&self) -> bool {
        self.fleet_gate().await;
        let probe = loop {
            let notified = self.outage_changed.notified();
            let wait = {
                let mut o = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
                match o.since {
                    None => break false,
                    Some(_) if !o.probing && tokio::time::Instant::now() >= o.next_probe => {
                        o.probing = true;
                        break true;
                    }
                    Some(_) => o
                        .next_probe
                        .saturating_duration_since(tokio::time::Instant::now()),
                }
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(wait.max(Duration::from_millis(5))) => {}
            }
        };
        if let Some(l) = &self.limiter {
            l.until_ready().await;
        }
        probe
    }

    /// One controller tick: read and reset the tick's signals, adapt rate or concurrency.
    pub(crate) fn on_tick(&self, elapsed: Duration) {
        let attempts = self.tick.attempts.swap(0, Relaxed);
        let pushback = self.tick.pushback.swap(0, Relaxed);
        let refusals = TickRefusals {
            attempts,
            refused: self.tick.refused.swap(0, Relaxed),
            repeats: self.tick.repeats.swap(0, Relaxed),
            repeats_refused: self.tick.repeats_refused.swap(0, Relaxed),
        };
        let min_latency_us = self.tick.min_latency_us.swap(u64::MAX, Relaxed);
        let throttled = self.throttled.load(Relaxed);
        let too_many =
            throttled.saturating_sub(self.tick.throttled_at_tick.swap(throttled, Relaxed));
        if self
            .outage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .since
            .is_some()
        {
            return;
        }
        // Refusals bound to IDs are no pushback: only the rate's reach the filter.
        let (of_the_rate, bound_share) = {
            let mut r = self
                .repeat_refusals
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            (r.of_the_rate(elapsed, refusals), r.bound_share())
        };
        let of_the_rate = of_the_rate.min(refusals.refused);
        self.refused_ids
            .fetch_add(refusals.refused - of_the_rate, Relaxed);
        self.bound_share.store(bound_share.to_bits(), Relaxed);
        let pushback = (pushback.saturating_sub(refusals.refused) + of_the_rate).min(pushback);
        let pushback = self
            .pushback_filter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .filter_with_429s(elapsed, attempts, pushback, too_many);
        self.overloaded.store(pushback > 0, Relaxed);
        let signals = TickSignals {
            elapsed,
            attempts,
            pushback,
            min_latency: (min_latency_us < u64::MAX).then(|| Duration::from_micros(min_latency_us)),
        };
        if let (Some(l), Some(c)) = (
            &self.limiter,
            self.controller
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut(),
        ) {
            let after = c.update(&signals);
            // A change keeps the limiter's schedule (RateLimiter::set_rate): follow every one.
            let current = l.rate();
            if (after - current).abs() > current * SWAP_THRESHOLD {
                tracing::debug!(
                    rate = after,
                    pushback,
                    attempts,
                    refused = refusals.refused,
                    repeats = refusals.repeats,
                    repeats_refused = refusals.repeats_refused,
                    of_the_rate,
                    bound_share,
                    "rate adjusted"
                );
                l.set_rate(Rate(after));
            }
        }
        if let Some(c) = &self.concurrency {
            if attempts == 0 {
                return;
            }
            let limit = c.limit();
            if pushback > 0 {
                c.set(((limit as f64) * 0.7).floor() as u64);
            } else {
                c.set(limit + 1);
            }
        }
    }

    /// Whether an attempt answered `observed` was refused for the client's rate: a 429 always;
    /// a 503, 529 or timeout while the API is judged overloaded (pushback acted on at the
    /// last tick), or, before any refusal was shown to be an ID's (see `repeats`), while
    /// more than `repeats::UNPROVEN_ALLOWANCE` of this tick's fresh attempts so far were
    /// refused. Repeats refused again are no sign of overload by themselves: they are what
    /// IDs refused every time look like (at the end of a job, when only their retries are
    /// left, a tick can be nothing else), and an overload refuses fresh attempts too.
    /// Such a refusal's `Retry-After` is the API's word to the whole client, and its item's
    /// worker waits with it; any other refusal is its ID's, and holds that ID only.
    pub(crate) fn refused_for_the_rate(&self, observed: Observed) -> bool {
        match observed {
            Observed::TooMany => true,
            Observed::Pushback | Observed::Timeout => {
                self.overloaded.load(Relaxed)
                    || (self.refused_ids_share() == 0.0 && {
                        let t = &self.tick;
                        let fresh = t
                            .attempts
                            .load(Relaxed)
                            .saturating_sub(t.repeats.load(Relaxed));
                        let fresh_refused = t
                            .refused
                            .load(Relaxed)
                            .saturating_sub(t.repeats_refused.load(Relaxed));
                        fresh >= 20
                            && fresh_refused as f64 > repeats::UNPROVEN_ALLOWANCE * fresh as f64
                    })
            }
            _ => false,
        }
    }

    /// The share of fresh attempts refused for their IDs (not the rate), as of the last tick.
    pub(crate) fn refused_ids_share(&self) -> f64 {
        f64::from_bits(self.bound_share.load(Relaxed))
    }

    /// The controller tick interval.
    pub(crate) fn tick_interval(&self) -> Duration {
        self.options.tick
    }

    /// The longest outage tolerated.
    pub(crate) fn max_outage(&self) -> Duration {
        self.options.max_outage
    }
}

impl Throttle {
    /// How long the API has been out, if it is.
    pub(crate) fn outage(&self) -> Option<Duration> {
        self.outage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .since
            .map(|s| s.elapsed())
    }

    /// Record what an attempt of an item (its `history`) saw, and decide whether it counts
    /// against the item.
    ///
    /// An answer (any status) counts. A failure that may be the API going down (refused or
    /// dropped connection, a 5xx other than 503, timeout) is free while an outage is
    /// declared; otherwise its verdict waits (at most `PROVISIONAL_WAIT`) for evidence:
    /// another answer from the API (it counts: the API is up, this ID failed) or an outage
    /// being declared (it is free). With neither, it counts if the ID may be the cause
    /// (and the failures in a row start again), and is free if it cannot be (a refused
    /// connection, 502, 504). So no item runs out of attempts while an outage is being
    /// detected.
    ///
    /// Once an ID's failure was found to be its own (the API answered others after it, or
    /// the wait ended with no outage declared), its later failures that reached the API
    /// (dropped connection, timeout, 5xx) are no evidence of an outage: they count at once,
    /// without waiting for evidence, without adding to the failures in a row that declare
    /// an outage, and, as an outage's probe, without holding the next probe back. So IDs
    /// that always fail use up their attempts and fail, however many retries in a row,
    /// instead of reading as the API being out. A connection that cannot be made at all
    /// (refused) is never the ID's doing: it is outage evidence whatever the ID's history.
    ///
    /// An attempt of an ID whose last attempt was refused (503, 529, timeout) is counted as a
    /// repeat, so the throttle can tell refusals bound to IDs from refusals of the rate (see
    /// [`crate::throttle`]).
    pub(crate) async fn charge(
        &self,
        observed: Observed,
        probe: bool,
        history: &ItemHistory,
    ) -> bool {
        let refused = observed.may_repeat();
        self.tick.refused.fetch_add(u64::from(refused), Relaxed);
        if history.refused.swap(refused, Relaxed) {
            self.tick.repeats.fetch_add(1, Relaxed);
            self.tick
                .repeats_refused
                .fetch_add(u64::from(refused), Relaxed);
        }
        match observed {
            Observed::TooMany => {
                self.throttled.fetch_add(1, Relaxed);
            }
            Observed::Pushback => {
                self.unavailable.fetch_add(1, Relaxed);
            }
            _ => {}
        }
        match self.record(observed, probe, history.fails_alone()) {
            Verdict::Counted => true,
            Verdict::Free => false,
            Verdict::Provisional(seen) => {
                let (counts, shown) = self.settle(seen, observed.may_be_the_ids()).await;
                if shown {
                    history.fails_alone.store(true, Relaxed);
                }
                counts
            }
        }
    }

    /// `fails_alone`: the item's earlier failure was shown to be its own.
    pub(super) fn record(&self, observed: Observed, probe: bool, fails_alone: bool) -> Verdict {
        self.tick.attempts.fetch_add(1, Relaxed);
        if let Observed::Success(latency) = observed {
            self.tick
                .min_latency_us
                .fetch_min(latency.as_micros() as u64, Relaxed);
        }
        if observed.is_pushback() {
            self.tick.pushback.fetch_add(1, Relaxed);
        }
        if observed.may_be_the_ids() && fails_alone {
            self.own_failures.fetch_add(1, Relaxed);
            tracing::debug!(
                "a failure of an ID that failed while the API answered others: counts at once"
            );
            if probe {
                // It tells nothing about the API: the next probe goes at once.
                let mut o = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
                o.probing = false;
                drop(o);
                self.outage_changed.notify_waiters();
            }
            return Verdict::Counted;
        }
        if observed.may_be_down() {
            let in_a_row = self.failures_in_a_row.fetch_add(1, Relaxed) + 1;
            let seen = self.answers.load(Acquire);
            let mut o = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
            if probe {
                o.probing = false;
                o.probe_interval = (o.probe_interval * 2).min(MAX_PROBE_INTERVAL);
                o.next_probe = tokio::time::Instant::now() + o.probe_interval;
            }
            if o.since.is_none() && in_a_row >= OUTAGE_AFTER_FAILURES {
                tracing::warn!("the API looks down ({in_a_row} failures in a row): pausing, probing with one request at growing intervals");
                o.since = Some(tokio::time::Instant::now());
                o.probe_interval = FIRST_PROBE_AFTER;
                o.next_probe = tokio::time::Instant::now() + FIRST_PROBE_AFTER;
                o.probing = false;
                drop(o);
                // Provisional verdicts are waiting for exactly this.
                self.answered.notify_waiters();
                return Verdict::Free;
            }
            return if o.since.is_some() {
                Verdict::Free
            } else {
                Verdict::Provisional(seen)
            };
        }
        self.failures_in_a_row.store(0, Relaxed);
        self.answers.fetch_add(1, Release);
        if self.provisional.load(Acquire) > 0 {
            self.answered.notify_waiters();
        }
        let mut o = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(since) = o.since.take() {
            tracing::warn!(
                "the API answers again after {:.1}s: resuming at a low rate",
                since.elapsed().as_secs_f64()
            );
            o.probing = false;
            drop(o);
            self.restart_low();
            self.outage_changed.notify_waiters();
        } else if probe {
            o.probing = false;
        }
        Verdict::Counted
    }

    /// Wait for evidence about a failure that may be an outage starting (see [`Self::charge`]):
    /// whether it counts, and whether it is taken as the ID's own. A failure whose wait ends
    /// with neither an answer nor an outage counts if it may be the ID's doing (and the
    /// failures in a row start again), and is free if it cannot be (refused, 502, 504).
    /// `the_ids`: the failure may be the ID's doing ([`Observed::may_be_the_ids`]).
    async fn settle(&self, seen: u64, the_ids: bool) -> (bool, bool) {
        let deadline = tokio::time::Instant::now() + PROVISIONAL_WAIT;
        self.evidence_waits.fetch_add(1, Relaxed);
        tracing::debug!("a failure that may be the API going down waits for evidence");
        self.provisional.fetch_add(1, AcqRel);
        let verdict = loop {
            let notified = self.answered.notified();
            if self
                .outage
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .since
                .is_some()
            {
                break (false, false);
            }
            if self.answers.load(Acquire) > seen {
                break (true, true);
            }
            if tokio::time::Instant::now() >= deadline {
                // Neither an answer nor an outage: too little traffic to tell (the tail of
                // a run, or fewer requests in flight than an outage takes to show).
                if the_ids {
                    // It counts, and the ID's later failures are taken as its own; failures
                    // that may be the IDs' no longer add up to an outage with the next
                    // ones: the failures in a row start again.
                    self.failures_in_a_row.store(0, Relaxed);
                    break (true, true);
                }
                // A refused connection (or a gateway's 502, 504) is not the ID's doing: it
                // costs the item nothing, and keeps adding up to an outage.
                break (false, false);
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        };
        self.provisional.fetch_sub(1, AcqRel);
        verdict
    }

    /// After an outage, start again gently: the rate floor (or a quarter of the concurrency).
    fn restart_low(&self) {
        if let (Some(l), Some(c)) = (
            &self.limiter,
            self.controller
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut(),
        ) {
            let low = (c.rate / 10.0).max(c.settings.min_rate);
            c.rate = low;
            l.set_rate(Rate(low));
        }
        if let Some(c) = &self.concurrency {
            c.set((c.max / 4).max(1));
        }
    }
}
