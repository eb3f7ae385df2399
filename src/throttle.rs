//! Throttle: how fast requests may start, and how that speed follows the API's pushback.
//!
//! Owns the request rate limit ([`RateLimiter`], GCRA from `governor`, with jittered waits),
//! the parsing of `--rate` values ([`Rate`]), and the control law that moves the effective
//! rate between a floor and a ceiling from what the API says ([`RateController`]).
//!
//! governor fixes a quota when a limiter is built, so a rate change builds a new limiter and
//! swaps it in. A fresh GCRA limiter would grant its whole burst at once; the swap first
//! spends that burst, so the first request after a change waits one new interval: no burst
//! at the swap.
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
//! pushback (p > 0) or the tick's lowest latency above 3x its baseline and 10 ms above it:
//!     error      = rate - accepted
//!     historical = p * rate
//!     d_error    = (error - last_error) / tick
//!     new_rate   = rate - kp*error - ki*historical - kd*d_error
//!     new_rate   = max(new_rate, (1 - ki) * accepted)   (never far below what was accepted)
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

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Jitter, Quota};

use crate::retry::{AttemptError, ErrorClass, Success};

/// A rate in requests per second, parsed from `50`, `50/s`, `3000/min`, `0.5/s`, `100/h`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(f64);

impl Rate {
    pub fn per_second(self) -> f64 {
        self.0
    }

    pub fn new(per_second: f64) -> Option<Rate> {
        (per_second.is_finite() && per_second > 0.0).then_some(Rate(per_second))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.0)
    }
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(s: &str) -> Result<Rate, String> {
        let (number, unit) = s.trim().split_once('/').unwrap_or((s.trim(), "s"));
        let n: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a rate (write e.g. 50, 50/s, 3000/min, 0.5/s)"))?;
        let seconds = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            other => return Err(format!("unknown rate unit {other:?} (use /s, /min or /h)")),
        };
        Rate::new(n / seconds).ok_or_else(|| format!("{s:?}: a rate must be above zero"))
    }
}

/// A request rate limit whose rate can change while requests wait on it.
pub struct RateLimiter {
    current: RwLock<(f64, Arc<DefaultDirectRateLimiter>)>,
    burst: NonZeroU32,
    changed: tokio::sync::Notify,
}

impl RateLimiter {
    /// A limiter at `rate` requests per second allowing bursts of `burst`.
    pub fn new(rate: Rate, burst: u32) -> RateLimiter {
        let burst = NonZeroU32::new(burst.max(1)).expect("at least 1");
        let limiter = Arc::new(DefaultDirectRateLimiter::direct(quota(rate.0, burst)));
        RateLimiter {
            current: RwLock::new((rate.0, limiter)),
            burst,
            changed: tokio::sync::Notify::new(),
        }
    }

    /// The rate in force.
    pub fn rate(&self) -> f64 {
        self.current.read().expect("never poisoned").0
    }

    /// Change the rate. The new limiter starts with its burst spent: no burst at the swap.
    pub fn set_rate(&self, rate: Rate) {
        let limiter = DefaultDirectRateLimiter::direct(quota(rate.0, self.burst));
        let _ = limiter.check_n(granted_burst(rate.0, self.burst));
        *self.current.write().expect("never poisoned") = (rate.0, Arc::new(limiter));
        self.changed.notify_waiters();
    }

    /// Wait until one request may start. Waits are jittered by up to a tenth of the interval
    /// (at most 10 ms) so waiting workers do not wake in lockstep.
    pub async fn until_ready(&self) {
        loop {
            // Registered before the limiter is read: a swap after this wakes us.
            let changed = self.changed.notified();
            let (rate, limiter) = {
                let guard = self.current.read().expect("never poisoned");
                (guard.0, guard.1.clone())
            };
            if rate >= UNLIMITED || limiter.check().is_ok() {
                return;
            }
            let jitter = Duration::from_secs_f64((0.1 / rate).min(0.010));
            // A waiter on a retired limiter would keep drawing permits at the old rate,
            // beside the new limiter: on a swap, wait again on the new one.
            tokio::select! {
                _ = limiter.until_ready_with_jitter(Jitter::up_to(jitter)) => return,
                _ = changed => {}
            }
        }
    }
}

/// How much of `--burst` the limiter grants at once: the burst less what [`SEND_JITTER`]
/// at `rate` could add. The API counts arrivals, not grants: requests granted `T` apart can
/// arrive closer together when the first is delayed on its way (scheduling, the connection
/// pool), so in any window the API could see `R·SEND_JITTER` more than were granted in it.
/// Holding that much of the burst back keeps what the API sees within `R·t + burst`.
fn granted_burst(rate: f64, burst: NonZeroU32) -> NonZeroU32 {
    let jitter = (rate * SEND_JITTER.as_secs_f64()).ceil() as u32;
    NonZeroU32::new(burst.get().saturating_sub(jitter)).unwrap_or(NonZeroU32::MIN)
}

/// The spread of the delay between a grant and the request reaching the API that the
/// limiter leaves room for (see [`granted_burst`]).
pub const SEND_JITTER: Duration = Duration::from_millis(5);

fn quota(rate: f64, burst: NonZeroU32) -> Quota {
    let period = Duration::from_secs_f64(1.0 / rate).max(Duration::from_nanos(1));
    Quota::with_period(period)
        .expect("period is above zero")
        .allow_burst(granted_burst(rate, burst))
}

/// Constants of the control law (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControlSettings {
    pub kp: f64,
    pub ki: f64,
    pub kd: f64,
    /// Relative increase per tick while the API keeps up.
    pub increase: f64,
    /// Latency above this multiple of its baseline counts as pushback...
    pub latency_factor: f64,
    /// ...when it is also at least this much above the baseline: on a fast API (a loopback
    /// server answers in 0.2 ms) three times the baseline is scheduling noise of the client's
    /// own machine, not the API slowing down.
    pub latency_min_rise: Duration,
    pub min_rate: f64,
    pub ceiling: f64,
}

impl ControlSettings {
    pub fn new(min_rate: f64, ceiling: f64) -> ControlSettings {
        ControlSettings {
            kp: 1.0,
            ki: 0.2,
            kd: 0.0,
            increase: 0.05,
            latency_factor: 3.0,
            latency_min_rise: Duration::from_millis(10),
            min_rate,
            ceiling,
        }
    }
}

/// What the API said during one tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TickSignals {
    pub elapsed: Duration,
    /// Attempts that got an answer or failed.
    pub attempts: u64,
    /// 429s, 503s and timeouts.
    pub pushback: u64,
    /// The lowest latency of a successful attempt over the tick, if any. The lowest, not
    /// the mean: an attempt's latency is measured inside our own runtime, so it includes
    /// the time a ready task waits for a busy machine to run it. That delay strikes some
    /// attempts and not others, while an API that queues requests slows every one of them;
    /// the minimum over a tick sees the second and not the first (delay-based congestion
    /// control, TCP Vegas and BBR, filters round-trip times by their minimum likewise).
    pub min_latency: Option<Duration>,
}

/// The rate controller: one update per tick.
#[derive(Debug, Clone)]
pub struct RateController {
    settings: ControlSettings,
    rate: f64,
    last_error: Option<f64>,
    baseline_latency: Option<Duration>,
    /// How long the API has kept up since the last pushback.
    calm: Duration,
}

impl RateController {
    pub fn new(settings: ControlSettings, initial: f64) -> RateController {
        RateController {
            settings,
            rate: initial.clamp(settings.min_rate, settings.ceiling),
            last_error: None,
            baseline_latency: None,
            calm: Duration::ZERO,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Apply one tick's signals; returns the new rate.
    pub fn update(&mut self, s: &TickSignals) -> f64 {
        let secs = s.elapsed.as_secs_f64();
        if secs <= 0.0 || s.attempts == 0 {
            return self.rate;
        }
        let c = &self.settings;
        let slow = match (s.min_latency, self.baseline_latency) {
            (Some(now), Some(base)) => {
                now.as_secs_f64() > base.as_secs_f64() * c.latency_factor
                    && now.saturating_sub(base) >= c.latency_min_rise
            }
            _ => false,
        };
        if let Some(now) = s.min_latency {
            // The baseline is the lowest latency seen, drifting up slowly so a permanently
            // slower API becomes the new normal instead of a permanent brake.
            self.baseline_latency = Some(match self.baseline_latency {
                None => now,
                Some(base) if now < base => now,
                Some(base) => base.mul_f64(1.01).min(now),
            });
        }
        let p = s.pushback as f64 / s.attempts as f64;
        let new_rate = if s.pushback > 0 || slow {
            self.calm = Duration::ZERO;
            let accepted = (s.attempts - s.pushback) as f64 / secs;
            let error = self.rate - accepted;
            let historical = if slow { self.rate * 0.1 } else { p * self.rate };
            let d_error = self
                .last_error
                .map(|last| (error - last) / secs)
                .unwrap_or(0.0);
            self.last_error = Some(error);
            let pid = self.rate - c.kp * error.max(0.0) - c.ki * historical - c.kd * d_error;
            // What the API just accepted is a demonstrated capacity: never fall far below it,
            // however large the step that caused the pushback.
            pid.max(accepted * (1.0 - c.ki))
        } else {
            self.last_error = None;
            // Climb faster the longer the API keeps up (doubling each calm second, up to
            // 5x the base step), back to the base step at the first pushback.
            self.calm += s.elapsed;
            let boost = 2f64.powf(self.calm.as_secs_f64().floor()).min(5.0);
            self.rate * (1.0 + c.increase * boost)
        };
        self.rate = new_rate.clamp(c.min_rate, c.ceiling);
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!("50".parse::<Rate>().unwrap().per_second(), 50.0);
        assert_eq!("50/s".parse::<Rate>().unwrap().per_second(), 50.0);
        assert_eq!("3000/min".parse::<Rate>().unwrap().per_second(), 50.0);
        assert_eq!("0.5/s".parse::<Rate>().unwrap().per_second(), 0.5);
        assert_eq!("7200/h".parse::<Rate>().unwrap().per_second(), 2.0);
        for bad in ["", "0", "-1", "x/s", "5/fortnight", "inf", "NaN"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
    }

    /// A simulated API that accepts `capacity` requests per second and refuses the rest.
    fn tick(rate: f64, capacity: f64) -> TickSignals {
        let attempts = rate.round() as u64;
        let refused = (rate - capacity).max(0.0).round() as u64;
        TickSignals {
            elapsed: Duration::from_secs(1),
            attempts,
            pushback: refused.min(attempts),
            min_latency: Some(Duration::from_millis(10)),
        }
    }

    #[test]
    fn the_rate_settles_just_under_capacity_and_follows_steps() {
        let mut c = RateController::new(ControlSettings::new(1.0, 2000.0), 2000.0);
        for (capacity, label) in [(500.0, "down"), (1500.0, "up"), (200.0, "down again")] {
            let mut accepted = 0.0;
            let mut attempted = 0.0;
            for t in 0..60 {
                let s = tick(c.rate(), capacity);
                if t >= 20 {
                    attempted += s.attempts as f64;
                    accepted += (s.attempts - s.pushback) as f64;
                }
                c.update(&s);
            }
            let goodput = accepted / 40.0 / capacity;
            let refused = 1.0 - accepted / attempted;
            assert!(goodput >= 0.9, "{label}: goodput {goodput:.3} of capacity");
            assert!(refused <= 0.05, "{label}: {:.1}% refused", refused * 100.0);
        }
    }

    #[test]
    fn rising_latency_brakes_and_the_floor_holds() {
        let mut c = RateController::new(ControlSettings::new(5.0, 100.0), 100.0);
        let fast = TickSignals {
            elapsed: Duration::from_secs(1),
            attempts: 100,
            pushback: 0,
            min_latency: Some(Duration::from_millis(10)),
        };
        c.update(&fast);
        let slow = TickSignals {
            min_latency: Some(Duration::from_millis(100)),
            ..fast
        };
        let before = c.rate();
        assert!(c.update(&slow) < before);
        // Jitter far below a millisecond on a fast API is not the API slowing down.
        let mut c = RateController::new(ControlSettings::new(5.0, 200.0), 100.0);
        let quick = |us| TickSignals {
            min_latency: Some(Duration::from_micros(us)),
            ..fast
        };
        c.update(&quick(200));
        let before = c.rate();
        assert!(
            c.update(&quick(2_000)) > before,
            "2 ms after 0.2 ms still climbs"
        );
        let before = c.rate();
        assert!(
            c.update(&quick(20_000)) < before,
            "20 ms after 0.2 ms brakes"
        );
        for _ in 0..200 {
            c.update(&TickSignals {
                pushback: 100,
                ..fast
            });
        }
        assert_eq!(c.rate(), 5.0);
    }

    #[test]
    fn the_granted_burst_keeps_room_for_arrival_jitter() {
        let g = |rate: f64, burst: u32| granted_burst(rate, NonZeroU32::new(burst).unwrap()).get();
        assert_eq!(g(2000.0, 20), 10, "5 ms at 2000/s is 10 requests");
        assert_eq!(g(200.0, 20), 19);
        assert_eq!(g(100.0, 1), 1, "never below one");
        assert_eq!(g(2000.0, 5), 1);
        assert_eq!(g(10.0, 3), 2);
    }

    const PLAIN: Ticket = Ticket { probe: false, n: 0 };

    fn run_throttle(ceiling: f64, initial: f64) -> Throttle {
        let options = ThrottleOptions {
            rate: Rate::new(ceiling),
            initial_rate: Rate::new(initial),
            ..ThrottleOptions::default()
        };
        Throttle::new(options, Arc::new(tokio::sync::Semaphore::new(64)), 64)
    }

    fn failure(class: ErrorClass, status: Option<u16>) -> Result<Success, AttemptError> {
        Err(AttemptError {
            class,
            http_status: status,
            message: String::new(),
            retry_after: None,
        })
    }

    fn success(latency: Duration) -> Result<Success, AttemptError> {
        Ok(Success {
            http_status: 200,
            body: serde_json::value::RawValue::from_string("1".into()).unwrap(),
            latency,
        })
    }

    #[test]
    fn a_503_is_pushback_from_an_api_that_answers() {
        use ErrorClass::*;
        let with_retry_after = Err(AttemptError {
            retry_after: Some(Duration::from_secs(1)),
            ..failure(Http, Some(503)).unwrap_err()
        });
        for (result, observed) in [
            (failure(Http, Some(503)), Observed::Pushback),
            (with_retry_after, Observed::Pushback),
            (failure(Http, Some(429)), Observed::Pushback),
            (failure(Timeout, None), Observed::Timeout),
            (failure(Connect, None), Observed::Down),
            (failure(Connection, None), Observed::Down),
            (failure(Http, Some(502)), Observed::Down),
            (failure(Http, Some(404)), Observed::Answered),
            (
                success(Duration::from_millis(1)),
                Observed::Success(Duration::from_millis(1)),
            ),
        ] {
            assert_eq!(Observed::of(&result), observed, "{result:?}");
        }
        // nginx's limit_req at a tenth of the rate: a third of the attempts answered 503.
        let t = run_throttle(2000.0, 2000.0);
        for _ in 0..10 {
            for i in 0..300 {
                let result = if i % 3 == 0 {
                    failure(Http, Some(503))
                } else {
                    success(Duration::from_micros(300))
                };
                let verdict = t.record(Observed::of(&result), PLAIN, None);
                assert!(matches!(verdict, Verdict::Counted), "an answer counts");
            }
            t.on_tick(Duration::from_millis(200));
        }
        assert!(t.rate().unwrap() < 1000.0, "slowed down: {:?}", t.rate());
        // However many in a row, 503s are answers: the API is not out.
        for _ in 0..10 * OUTAGE_AFTER_FAILURES {
            t.record(Observed::of(&failure(Http, Some(503))), PLAIN, None);
        }
        assert_eq!(t.outage(), None);
    }

    #[test]
    fn client_side_delay_of_some_attempts_is_not_pushback() {
        let t = run_throttle(200.0, 100.0);
        let tick = |latencies: &[(u64, usize)]| {
            for &(us, n) in latencies {
                for _ in 0..n {
                    t.record(
                        Observed::of(&success(Duration::from_micros(us))),
                        PLAIN,
                        None,
                    );
                }
            }
            t.on_tick(Duration::from_millis(200));
            t.rate().unwrap()
        };
        let start = tick(&[(300, 20)]);
        // A busy machine: a quarter of the attempts waited 60 ms for our own runtime to run
        // them (a mean of 15 ms), the others took the API's 0.3 ms.
        let busy = tick(&[(300, 15), (60_000, 5)]);
        assert!(busy > start, "the rate keeps climbing: {start} -> {busy}");
        // An API that queues: every attempt is slower.
        let queueing = tick(&[(30_000, 20)]);
        assert!(queueing < busy, "the rate brakes: {busy} -> {queueing}");
    }

    #[tokio::test]
    async fn a_failure_is_decided_by_a_probe_with_an_id_known_to_work() {
        let t = run_throttle(1000.0, 1000.0);
        let probed = Mutex::new(Vec::new());
        let answer = Mutex::new(Observed::Success(Duration::from_millis(1)));
        let probe = |id: String| {
            probed.lock().unwrap().push(id);
            let observed = *answer.lock().unwrap();
            async move { observed }
        };
        let ticket = t.before_attempt(&probe).await;
        assert!(
            t.charge(
                Observed::Success(Duration::from_millis(1)),
                ticket,
                "good",
                &probe
            )
            .await
        );
        // No other request under way (the tail of a job): a probe brings the evidence at
        // once, instead of a wait; the API answers it, so the failure is the item's.
        for _ in 0..OUTAGE_AFTER_FAILURES + 5 {
            let ticket = t.before_attempt(&probe).await;
            assert!(
                t.charge(Observed::Down, ticket, "poisoned", &probe).await,
                "counts: the API answered an ID known to work"
            );
        }
        assert!(t.outage().is_none());
        let probes = probed.lock().unwrap().clone();
        assert!(
            !probes.is_empty() && probes.iter().all(|id| id == "good"),
            "{probes:?}"
        );
        // The API goes out: the probe gets no answer either, so the failure is free.
        *answer.lock().unwrap() = Observed::Down;
        let ticket = t.before_attempt(&probe).await;
        assert!(!t.charge(Observed::Down, ticket, "good-too", &probe).await);
    }

    #[tokio::test]
    async fn the_limiter_holds_its_rate_and_swaps_without_a_burst() {
        let limiter = RateLimiter::new(Rate::new(200.0).unwrap(), 1);
        let start = std::time::Instant::now();
        for _ in 0..21 {
            limiter.until_ready().await;
        }
        // 21 permits at 200/s: the first is free, the other 20 take at least 100 ms.
        assert!(
            start.elapsed() >= Duration::from_millis(95),
            "{:?}",
            start.elapsed()
        );
        limiter.set_rate(Rate::new(20.0).unwrap());
        assert_eq!(limiter.rate(), 20.0);
        let swapped = std::time::Instant::now();
        limiter.until_ready().await;
        assert!(
            swapped.elapsed() >= Duration::from_millis(45),
            "no free permit right after a swap"
        );
    }
}

/// What the throttle is asked to do for a run.
#[derive(Debug, Clone)]
pub struct ThrottleOptions {
    /// Requests per second at most (the ceiling when adaptive). `None`: no rate limit.
    pub rate: Option<Rate>,
    pub burst: u32,
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
            burst: 1,
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
pub const UNLIMITED: f64 = 1e9;
/// How fast the adaptive rate climbs while the API keeps up: 10% per second.
pub const INCREASE_PER_SECOND: f64 = 0.10;

/// Relative change of the adaptive rate below which the limiter is not swapped.
pub const SWAP_THRESHOLD: f64 = 0.03;

/// Failures in a row, with no answer in between, after which the API may be out: attempts
/// are held back until a probe tells.
pub const OUTAGE_AFTER_FAILURES: u64 = 20;
/// How long a possible-outage failure waits for evidence from other attempts before a
/// probe is sent to get it.
pub const PROBE_AFTER: Duration = Duration::from_millis(100);
/// How long a possible-outage failure waits for evidence before it counts anyway, when no
/// ID is known to work (nothing succeeded yet) to probe with.
pub const PROVISIONAL_WAIT: Duration = Duration::from_secs(2);

/// Whether an attempt counts, as first recorded.
enum Verdict {
    Counted,
    Free,
    /// Decided by what happens next; the attempts sent before it failed.
    Provisional(u64),
}

/// An attempt's place in the order of attempts sent, from [`Throttle::before_attempt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The attempt is the outage probe itself (no ID known to work to probe with).
    pub probe: bool,
    n: u64,
}

/// Undoes a "waiting" mark when dropped, also when the waiting future is (a stop).
enum Waiting<'a> {
    Count(&'a AtomicU64),
    Flag(&'a std::sync::atomic::AtomicBool),
}

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicU64) -> Waiting<'a> {
        count.fetch_add(1, AcqRel);
        Waiting::Count(count)
    }

    fn flag(flag: &'a std::sync::atomic::AtomicBool) -> Waiting<'a> {
        Waiting::Flag(flag)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        match self {
            Waiting::Count(c) => {
                c.fetch_sub(1, AcqRel);
            }
            Waiting::Flag(f) => f.store(false, Release),
        }
    }
}
/// The first probe's delay after an outage starts; doubles up to [`MAX_PROBE_INTERVAL`].
pub const FIRST_PROBE_AFTER: Duration = Duration::from_millis(500);
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// What an attempt's outcome tells the throttle: the one place that maps an outcome to
/// API pushback (for the adaptive controller) and to possible-outage evidence (for the
/// outage gate). See [`Observed::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// A 2xx answer, with its latency.
    Success(Duration),
    /// An answer that says "slow down": 429, or 503 with or without `Retry-After` (rate
    /// limiters such as nginx's `limit_req` answer 503 by default, object stores say
    /// "503 Slow Down"). Pushback; the API is up.
    Pushback,
    /// No answer within the timeout: pushback (an overloaded API stops answering in time),
    /// and no answer at all, so possibly the API being out.
    Timeout,
    /// No answer at all (refused or dropped connection), or a 5xx other than 503 (a
    /// gateway saying the API behind it failed): the API may be out.
    Down,
    /// Any other answer: the API works, the item does not.
    Answered,
}

impl Observed {
    /// What an attempt's result tells the throttle:
    ///
    /// | result | pushback | possible outage |
    /// |---|---|---|
    /// | 2xx | no (its latency is a signal) | no |
    /// | 429, 503 | yes | no: an answer |
    /// | timeout | yes | yes |
    /// | refused, dropped connection, other 5xx | no | yes |
    /// | any other failure (4xx, unreadable body, bad request) | no | no |
    pub fn of(result: &Result<Success, AttemptError>) -> Observed {
        match result {
            Ok(s) => Observed::Success(s.latency),
            Err(e) => match (e.class, e.http_status) {
                (ErrorClass::Http, Some(429 | 503)) => Observed::Pushback,
                (ErrorClass::Http, Some(s)) if s >= 500 => Observed::Down,
                (ErrorClass::Timeout, _) => Observed::Timeout,
                (ErrorClass::Connect | ErrorClass::Connection, _) => Observed::Down,
                _ => Observed::Answered,
            },
        }
    }

    /// The API is pushing back.
    fn is_pushback(self) -> bool {
        matches!(self, Observed::Pushback | Observed::Timeout)
    }

    /// No usable answer: the API may be out.
    fn may_be_down(self) -> bool {
        matches!(self, Observed::Timeout | Observed::Down)
    }
}

struct TickCounters {
    attempts: AtomicU64,
    pushback: AtomicU64,
    /// The lowest latency of a success over the tick (`u64::MAX`: none).
    min_latency_us: AtomicU64,
}

impl Default for TickCounters {
    fn default() -> Self {
        TickCounters {
            attempts: AtomicU64::new(0),
            pushback: AtomicU64::new(0),
            min_latency_us: AtomicU64::new(u64::MAX),
        }
    }
}

struct Outage {
    /// When the current outage began (`None`: the API is up), suspected (failures in a row)
    /// or confirmed (a probe got no answer either).
    since: Option<std::time::Instant>,
    /// A probe got no answer during this outage: it is not just failing IDs.
    confirmed: bool,
    /// When the next probe may go.
    next_probe: std::time::Instant,
    probe_interval: Duration,
    /// A probe is in flight.
    probing: bool,
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
    failures_in_a_row: AtomicU64,
    /// Attempts sent, over the run: an attempt's [`Ticket`] is its place in this order.
    sent: AtomicU64,
    /// The latest ticket that got an answer (any status).
    answered_after: AtomicU64,
    /// The latest ticket of a probe that got no answer.
    down_after: AtomicU64,
    /// An ID that got a success (in this run, or before it in a replayed bucket): what
    /// probes call, so that a probe tells the API being out from IDs that fail.
    known_good: std::sync::OnceLock<String>,
    /// A probe for waiting failures is under way.
    probing_for_provisional: std::sync::atomic::AtomicBool,
    /// Failures waiting for a verdict, and their wake-up.
    provisional: AtomicU64,
    answered: tokio::sync::Notify,
    outage: Mutex<Outage>,
    outage_changed: tokio::sync::Notify,
    /// Attempts answered 429 over the run, for reports.
    pub throttled: AtomicU64,
    /// Attempts answered 503 over the run, for reports.
    pub unavailable: AtomicU64,
}

/// A concurrency limit that can shrink and grow: permits of the engine's semaphore.
pub struct AdaptiveConcurrency {
    permits: Arc<tokio::sync::Semaphore>,
    limit: AtomicU64,
    max: u64,
    /// Permits to take away as they come back.
    owed: AtomicU64,
}

impl AdaptiveConcurrency {
    pub fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    fn set(&self, new: u64) {
        let new = new.clamp(1, self.max);
        let old = self.limit.swap(new, Relaxed);
        if new > old {
            let mut grow = new - old;
            // Cancel owed shrinkage first.
            while grow > 0 {
                let owed = self.owed.load(Relaxed);
                if owed == 0 {
                    break;
                }
                let take = owed.min(grow);
                if self
                    .owed
                    .compare_exchange(owed, owed - take, Relaxed, Relaxed)
                    .is_ok()
                {
                    grow -= take;
                }
            }
            self.permits.add_permits(grow as usize);
        } else if new < old {
            let mut shrink = old - new;
            while shrink > 0 {
                match self.permits.try_acquire() {
                    Ok(p) => {
                        p.forget();
                        shrink -= 1;
                    }
                    Err(_) => break,
                }
            }
            self.owed.fetch_add(shrink, Relaxed);
        }
    }

    /// Called when a permit is released: keep it if shrinkage is owed.
    pub fn settle(&self) {
        while self.owed.load(Relaxed) > 0 {
            let Ok(p) = self.permits.try_acquire() else {
                return;
            };
            let owed = self.owed.load(Relaxed);
            if owed > 0
                && self
                    .owed
                    .compare_exchange(owed, owed - 1, Relaxed, Relaxed)
                    .is_ok()
            {
                p.forget();
            } else {
                drop(p);
                return;
            }
        }
    }
}

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
            failures_in_a_row: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            answered_after: AtomicU64::new(0),
            down_after: AtomicU64::new(0),
            known_good: std::sync::OnceLock::new(),
            probing_for_provisional: std::sync::atomic::AtomicBool::new(false),
            provisional: AtomicU64::new(0),
            answered: tokio::sync::Notify::new(),
            outage: Mutex::new(Outage {
                since: None,
                confirmed: false,
                next_probe: now,
                probe_interval: FIRST_PROBE_AFTER,
                probing: false,
            }),
            outage_changed: tokio::sync::Notify::new(),
            throttled: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
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

    /// How long the API has been out, if it is.
    pub fn outage(&self) -> Option<Duration> {
        self.outage
            .lock()
            .expect("never poisoned")
            .since
            .map(|s| s.elapsed())
    }

    /// Note an ID known to work (a success before this run, in a bucket it replays).
    pub fn known_good(&self, id: &str) {
        if self.known_good.get().is_none() {
            let _ = self.known_good.set(id.to_owned());
        }
    }

    /// Wait until an attempt may start: the outage gate (one probe at a time while the API
    /// may be out), then the rate limit. Returns the attempt's ticket.
    ///
    /// A probe calls an ID known to work, through `probe` (its answer is not kept), and the
    /// attempt waits on: whether the API answers that tells the API being out from the
    /// attempts' own IDs failing. Only while no ID is known to work (nothing succeeded yet)
    /// is the attempt itself the probe ([`Ticket::probe`]).
    pub async fn before_attempt<P, F>(&self, probe: &P) -> Ticket
    where
        P: Fn(String) -> F,
        F: Future<Output = Observed>,
    {
        loop {
            let is_probe = self.gate().await;
            if is_probe {
                if let Some(good) = self.known_good.get() {
                    self.probe_with(probe, good.clone()).await;
                    continue;
                }
            }
            return self.send(is_probe).await;
        }
    }

    /// Wait for the outage gate; returns whether this attempt is the probe.
    async fn gate(&self) -> bool {
        loop {
            let notified = self.outage_changed.notified();
            let wait = {
                let mut o = self.outage.lock().expect("never poisoned");
                match o.since {
                    None => return false,
                    Some(_) if !o.probing && std::time::Instant::now() >= o.next_probe => {
                        o.probing = true;
                        return true;
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
        }
    }

    /// The rate limit, then the attempt's place in the order of attempts sent.
    async fn send(&self, probe: bool) -> Ticket {
        if let Some(l) = &self.limiter {
            l.until_ready().await;
        }
        Ticket {
            probe,
            n: self.sent.fetch_add(1, AcqRel) + 1,
        }
    }

    /// Send one probe with `id` (known to work) and record what it saw.
    async fn probe_with<P, F>(&self, probe: &P, id: String)
    where
        P: Fn(String) -> F,
        F: Future<Output = Observed>,
    {
        let ticket = self.send(true).await;
        let observed = probe(id).await;
        self.record(observed, ticket, None);
    }

    /// Record what an attempt saw, and decide whether it counts against its item.
    ///
    /// An answer (any status) counts. A failure that may be the API going down (refused or
    /// dropped connection, 5xx other than 503, timeout) waits for evidence: an answer to an
    /// attempt sent after it (the API is up: it counts) or a probe sent after it getting no
    /// answer either (the API is out: it is free). When other attempts bring no evidence
    /// within [`PROBE_AFTER`], it sends a probe itself (one at a time, with an ID known to
    /// work, through `probe`). So no item runs out of attempts during an outage, and IDs
    /// that fail while the API answers others fail, however many of them in a row.
    pub async fn charge<P, F>(
        &self,
        observed: Observed,
        ticket: Ticket,
        id: &str,
        probe: &P,
    ) -> bool
    where
        P: Fn(String) -> F,
        F: Future<Output = Observed>,
    {
        match self.record(observed, ticket, Some(id)) {
            Verdict::Counted => true,
            Verdict::Free => false,
            Verdict::Provisional(seen) => self.settle(seen, probe).await,
        }
    }

    fn record(&self, observed: Observed, ticket: Ticket, id: Option<&str>) -> Verdict {
        self.tick.attempts.fetch_add(1, Relaxed);
        if let Observed::Success(latency) = observed {
            self.tick
                .min_latency_us
                .fetch_min(latency.as_micros() as u64, Relaxed);
            if let Some(id) = id {
                self.known_good(id);
            }
        }
        if observed.is_pushback() {
            self.tick.pushback.fetch_add(1, Relaxed);
        }
        if observed.may_be_down() {
            let in_a_row = self.failures_in_a_row.fetch_add(1, Relaxed) + 1;
            let seen = self.sent.load(Acquire);
            let mut o = self.outage.lock().expect("never poisoned");
            if ticket.probe {
                self.down_after.fetch_max(ticket.n, AcqRel);
                if o.since.is_some() {
                    if !o.confirmed {
                        o.confirmed = true;
                        tracing::warn!("the API looks down ({in_a_row} failures in a row, a probe got no answer either): pausing, probing with one request at growing intervals");
                        o.probe_interval = FIRST_PROBE_AFTER;
                    } else {
                        o.probe_interval = (o.probe_interval * 2).min(MAX_PROBE_INTERVAL);
                    }
                    o.probing = false;
                    o.next_probe = std::time::Instant::now() + o.probe_interval;
                }
                drop(o);
                // Provisional verdicts are waiting for exactly this.
                self.answered.notify_waiters();
                // A probe's own failure is the evidence: it costs its item nothing.
                return Verdict::Free;
            }
            if o.since.is_none() && in_a_row >= OUTAGE_AFTER_FAILURES {
                // Hold attempts back and probe at once: are these IDs failing, or the API?
                let now = std::time::Instant::now();
                o.since = Some(now);
                o.confirmed = false;
                o.probe_interval = FIRST_PROBE_AFTER;
                o.next_probe = now;
                o.probing = false;
                drop(o);
                self.outage_changed.notify_waiters();
            }
            return Verdict::Provisional(seen);
        }
        self.failures_in_a_row.store(0, Relaxed);
        self.answered_after.fetch_max(ticket.n, AcqRel);
        if self.provisional.load(Acquire) > 0 {
            self.answered.notify_waiters();
        }
        let mut o = self.outage.lock().expect("never poisoned");
        if let Some(since) = o.since.take() {
            o.probing = false;
            let confirmed = std::mem::take(&mut o.confirmed);
            drop(o);
            if confirmed {
                tracing::warn!(
                    "the API answers again after {:.1}s: resuming at a low rate",
                    since.elapsed().as_secs_f64()
                );
                self.restart_low();
            } else {
                tracing::info!("many failures in a row, but the API answers: those IDs fail, the API is not out");
            }
            self.outage_changed.notify_waiters();
        } else if ticket.probe {
            o.probing = false;
        }
        Verdict::Counted
    }

    /// Wait for evidence about a failure that may be an outage starting (see [`Self::charge`]);
    /// `seen`: the attempts sent before it failed.
    async fn settle<P, F>(&self, seen: u64, probe: &P) -> bool
    where
        P: Fn(String) -> F,
        F: Future<Output = Observed>,
    {
        let started = tokio::time::Instant::now();
        let _waiting = Waiting::new(&self.provisional);
        loop {
            let notified = self.answered.notified();
            if self.answered_after.load(Acquire) > seen {
                return true;
            }
            if self.down_after.load(Acquire) > seen {
                return false;
            }
            let good = self.known_good.get();
            if good.is_none() && started.elapsed() >= PROVISIONAL_WAIT {
                return true;
            }
            let probe_at = started + PROBE_AFTER;
            if let Some(good) = good.filter(|_| tokio::time::Instant::now() >= probe_at) {
                if !self.probing_for_provisional.swap(true, AcqRel) {
                    let _probing = Waiting::flag(&self.probing_for_provisional);
                    self.probe_with(probe, good.clone()).await;
                    continue;
                }
            }
            let until = if good.is_some() {
                probe_at.max(tokio::time::Instant::now() + Duration::from_millis(5))
            } else {
                started + PROVISIONAL_WAIT
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// After an outage, start again gently: the rate floor (or a quarter of the concurrency).
    fn restart_low(&self) {
        if let (Some(l), Some(c)) = (
            &self.limiter,
            self.controller.lock().expect("never poisoned").as_mut(),
        ) {
            let low = (c.rate / 10.0).max(c.settings.min_rate);
            c.rate = low;
            l.set_rate(Rate(low));
        }
        if let Some(c) = &self.concurrency {
            c.set((c.max / 4).max(1));
        }
    }

    /// One controller tick: read and reset the tick's signals, adapt rate or concurrency.
    pub fn on_tick(&self, elapsed: Duration) {
        let attempts = self.tick.attempts.swap(0, Relaxed);
        let pushback = self.tick.pushback.swap(0, Relaxed);
        let min_latency_us = self.tick.min_latency_us.swap(u64::MAX, Relaxed);
        if self.outage.lock().expect("never poisoned").since.is_some() {
            return;
        }
        let signals = TickSignals {
            elapsed,
            attempts,
            pushback,
            min_latency: (min_latency_us < u64::MAX).then(|| Duration::from_micros(min_latency_us)),
        };
        if let (Some(l), Some(c)) = (
            &self.limiter,
            self.controller.lock().expect("never poisoned").as_mut(),
        ) {
            let after = c.update(&signals);
            // Every swap restarts the limiter's schedule: swap on changes that matter only.
            let current = l.rate();
            if (after - current).abs() > current * SWAP_THRESHOLD {
                tracing::debug!(rate = after, pushback, attempts, "rate adjusted");
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

    /// The controller tick interval.
    pub fn tick_interval(&self) -> Duration {
        self.options.tick
    }

    /// The longest outage tolerated.
    pub fn max_outage(&self) -> Duration {
        self.options.max_outage
    }
}
