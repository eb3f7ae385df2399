//! Throttle: how fast requests may start, and how that speed follows the API's pushback.
//!
//! Owns the request rate limit (`RateLimiter`: a GCRA virtual clock that absorbs late
//! wake-ups, with a default burst derived from the rate, and rate changes that keep the
//! schedule), the parsing of `--rate` values ([`Rate`]), and the control law that moves the
//! effective rate between a floor and a ceiling from what the API says (`RateController`).
//!
//! ## The control law
//!
//! Spark's PID rate estimator (proportional 1.0, integral 0.2, derivative 0.0) adjusts the
//! rate from the batch processing rate. Here the "processing rate" is what the API accepted,
//! and the integral term is driven by the API's pushback instead of scheduling delay. Every
//! tick (200 ms), with `rate` the current limit, `accepted` the answers per second that
//! were not pushback, and `p` the share of attempts that were pushback (429, 503, timeouts):
//!
//! ```text
//! pushback (p > 0, and more of it over the last second than a steady few percent: see
//! [`PushbackFilter`]):
//!     error      = rate - accepted
//!     historical = p * rate
//!     d_error    = (error - last_error) / tick
//!     new_rate   = rate - kp*error - ki*historical - kd*d_error
//!     new_rate   = max(new_rate, (1 - ki) * accepted)   (never far below what was accepted)
//! no pushback, but the tick's lowest latency above 3x its baseline and 10 ms above it:
//!     new_rate   = rate * (1 - ki/10)           (gently: latency is no measure of unused rate)
//! otherwise (the API keeps up):
//!     new_rate   = rate * (1 + increase * boost)     (10% per second, compounded per tick;
//!                                                    boost doubles per calm second, max 5)
//! new_rate is clamped to [min_rate, ceiling]
//! ```
//!
//! Against an API that accepts C requests/s and refuses the rest, a rate R > C drops in one
//! tick to about `max(C - ki*(R - C), (1 - ki)*C)`, just under capacity, then climbs 10% per
//! second until the next refusal: the rate saw-tooths just below C, refusals stay a few
//! percent of attempts. Without `--rate` the ceiling is unlimited: the limiter binds only
//! once the API pushes back; concurrency also adapts (x0.7 on pushback, +1 per calm tick).
//!
//! Refusals that repeat on the same IDs while other IDs succeed (a shard down for some keys)
//! are no overload and reach neither filter nor controller: see `repeats`.
//!
//! The parts, one file each: `rate` (the `--rate` value and the limiter), `controller`
//! (the control law, its pushback filter, adaptive concurrency), `repeats` (refusals bound
//! to IDs), `outage` (what an attempt tells the throttle, outage detection and probes);
//! this file holds the [`Throttle`] that
//! ties them together for a run, with its options and the fleet's hold on a worker.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

mod controller;
mod outage;
mod rate;
mod repeats;
#[cfg(test)]
mod tests;

pub use controller::AdaptiveConcurrency;
pub(crate) use controller::PushbackFilter;
use controller::{ControlSettings, RateController, TickSignals};
pub use outage::{ItemHistory, Observed};
use outage::{Outage, FIRST_PROBE_AFTER};
pub use rate::Rate;
use rate::RateLimiter;
use repeats::{RepeatRefusals, TickRefusals};

/// What the throttle is asked to do for a run.
#[derive(Debug, Clone)]
pub struct ThrottleOptions {
    /// Requests per second at most (the ceiling when adaptive). `None`: no rate limit.
    pub rate: Option<Rate>,
    /// Requests that may start at once above the rate (`--burst`); `None`: derived from the
    /// rate (`default_grants`).
    pub burst: Option<u32>,
    /// Follow the API's pushback (rate when `rate` is set, concurrency otherwise).
    pub adaptive: bool,
    /// Floor of the adaptive rate (default: a hundredth of the ceiling, at least 0.1/s).
    pub min_rate: Option<Rate>,
    /// Starting rate (default: the ceiling).
    pub initial_rate: Option<Rate>,
    /// Control-law constants.
    pub kp: f64,
    pub ki: f64,
    pub kd: f64,
    /// Controller tick.
    pub tick: Duration,
    /// How long the API may be out before the run stops.
    pub max_outage: Duration,
}

impl Default for ThrottleOptions {
    fn default() -> Self {
        ThrottleOptions {
            rate: None,
            burst: None,
            adaptive: true,
            min_rate: None,
            initial_rate: None,
            kp: 1.0,
            ki: 0.2,
            kd: 0.0,
            tick: Duration::from_millis(200),
            max_outage: Duration::from_secs(30 * 60),
        }
    }
}

/// The ceiling of an adaptive rate when no `--rate` is given: no limit in practice.
pub(crate) const UNLIMITED: f64 = 1e9;
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
pub struct Throttle {
    options: ThrottleOptions,
    limiter: Option<RateLimiter>,
    controller: Mutex<Option<RateController>>,
    concurrency: Option<AdaptiveConcurrency>,
    tick: TickCounters,
    /// Which ticks' pushback says the API is overloaded (only the control task locks it).
    pushback_filter: Mutex<PushbackFilter>,
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
    evidence_waits: AtomicU64,
    /// Possible-outage failures of IDs shown failing alone, counted at once, over the run.
    own_failures: AtomicU64,
    outage: Mutex<Outage>,
    outage_changed: tokio::sync::Notify,
    /// The fleet's hold on this worker (see [`Throttle::follow_fleet`]).
    fleet: Mutex<FleetHold>,
    fleet_changed: tokio::sync::Notify,
    /// Attempts answered 429 over the run, for reports and for the pushback filter, which
    /// never learns a 429 as the API's weather.
    pub throttled: AtomicU64,
    /// Attempts answered "overloaded" (503, 529) over the run, for reports.
    pub unavailable: AtomicU64,
    /// Refusals (503, 529, timeouts) taken as their IDs', not the rate's, over the run
    /// (see `repeats`).
    pub refused_ids: AtomicU64,
}

/// What the fleet of a shared job allows this worker (see [`Throttle::follow_fleet`]).
#[derive(Debug, Default)]
struct FleetHold {
    /// The share in force: `None` while the worker follows no fleet rate.
    share: Option<f64>,
    /// This worker's part of the job's burst, if the job has one.
    burst: Option<u32>,
    /// No attempt starts before this.
    paused_until: Option<tokio::time::Instant>,
}

/// A pause extended by less than this is not worth telling the fleet again.
const PAUSE_MARGIN: Duration = Duration::from_millis(500);

impl Throttle {
    /// A throttle for a run whose item concurrency is bounded by `permits` (holding
    /// `max_concurrency` permits).
    pub fn new(
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
        let now = std::time::Instant::now();
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
        }
    }

    /// The rate limit in force, if any (none while an adaptive limit is still unlimited).
    pub fn rate(&self) -> Option<f64> {
        self.limiter
            .as_ref()
            .map(RateLimiter::rate)
            .filter(|r| *r < UNLIMITED)
    }

    /// The adaptive concurrency limit, when concurrency is what adapts.
    pub fn concurrency(&self) -> Option<&AdaptiveConcurrency> {
        self.concurrency.as_ref()
    }

    /// Follow this worker's share of a fleet's rate: the share is the ceiling (the adaptive
    /// controller runs inside it), and a share of 0 holds every attempt until a share is
    /// granted. `None`: the fleet has no rate limit, the run's own applies. A throttle
    /// without a rate limiter (not adaptive, no rate) cannot follow a share.
    pub fn follow_fleet(
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
    pub fn pause_for(&self, pause: Duration) -> bool {
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

    /// Wait while the fleet holds this worker: a pause, or a share of 0.
    async fn fleet_gate(&self) {
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
    pub async fn before_attempt(&self) -> bool {
        self.fleet_gate().await;
        let probe = loop {
            let notified = self.outage_changed.notified();
            let wait = {
                let mut o = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
                match o.since {
                    None => break false,
                    Some(_) if !o.probing && std::time::Instant::now() >= o.next_probe => {
                        o.probing = true;
                        break true;
                    }
                    Some(_) => o
                        .next_probe
                        .saturating_duration_since(std::time::Instant::now()),
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
    pub fn on_tick(&self, elapsed: Duration) {
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
    pub fn refused_for_the_rate(&self, observed: Observed) -> bool {
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
    pub fn refused_ids_share(&self) -> f64 {
        f64::from_bits(self.bound_share.load(Relaxed))
    }

    /// The controller tick interval.
    pub fn tick_interval(&self) -> Duration {
        self.options.tick
    }

    /// The longest outage tolerated.
    pub fn max_outage(&self) -> Duration {
        self.options.max_outage
    }
}
