//! The request rate: parsing `--rate` values ([`Rate`]) and the limiter that paces request
//! starts ([`RateLimiter`]: a GCRA virtual clock, [`Schedule`], that absorbs late wake-ups,
//! with a default burst derived from the rate, and rate changes that keep the schedule).

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The ceiling of an adaptive rate when no `--rate` is given: no limit in practice.
pub(crate) const UNLIMITED: f64 = 1e9;

/// A rate in requests per second, parsed from `50`, `50/s`, `3000/min`, `0.5/s`, `100/h`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(pub(super) f64);

impl Rate {
    /// The rate in requests per second.
    pub fn per_second(self) -> f64 {
        self.0
    }

    /// A rate of `per_second`; none unless finite and above 0.
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
///
/// A virtual clock ([`Schedule`], GCRA): grant `k` is due at `t0 + k/R`, and a grant may go
/// up to a tolerance of `burst − 1` intervals early. A waiter that wakes late (timers fire
/// on a 1 ms tick, a loaded machine schedules late) does not move the schedule: the grants
/// it missed are still due, and the next waiters take them at once, within the tolerance.
/// So lateness shorter than the tolerance costs no rate, and since every grant is checked
/// against the clock when it is taken, no window ever sees more than `R·t + burst` grants.
///
/// A request that finds a grant due takes it at once. The others line up (FIFO): only the
/// first sleeps on the clock, and hands over to the next when it is granted. Workers never
/// wake in lockstep to race for one permit (what a jitter on every wait used to prevent, at
/// the cost of the rate), and one timer is armed at a time however many workers wait.
pub(crate) struct RateLimiter {
    /// The rate in force (f64 bits): read without a lock when it is [`UNLIMITED`].
    rate: AtomicU64,
    schedule: Mutex<Schedule>,
    /// `--burst` (or a fleet worker's part of the job's), if given; 0: derived from the rate
    /// ([`default_grants`]).
    burst: AtomicU32,
    /// Held by the waiter that sleeps on the clock; the others queue for it in order.
    turn: tokio::sync::Mutex<()>,
    changed: tokio::sync::Notify,
}

impl RateLimiter {
    /// A limiter at `rate` requests per second; `burst`: `--burst` (None: derived from R).
    pub(super) fn new(rate: Rate, burst: Option<u32>) -> RateLimiter {
        let burst = burst.map(|b| NonZeroU32::new(b.max(1)).expect("at least 1"));
        RateLimiter {
            rate: AtomicU64::new(rate.0.to_bits()),
            schedule: Mutex::new(Schedule::new(
                rate.0,
                grants_at_once(rate.0, burst),
                tokio::time::Instant::now(),
            )),
            burst: AtomicU32::new(burst.map_or(0, NonZeroU32::get)),
            turn: tokio::sync::Mutex::new(()),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// The rate in force.
    pub(super) fn rate(&self) -> f64 {
        f64::from_bits(self.rate.load(Relaxed))
    }

    /// Change the rate. The schedule keeps its place ([`Schedule::set_rate`]), so a change
    /// lets no burst through and the new rate holds from the next grant.
    pub(super) fn set_rate(&self, rate: Rate) {
        let burst = NonZeroU32::new(self.burst.load(Relaxed));
        self.schedule
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_rate(
                rate.0,
                grants_at_once(rate.0, burst),
                tokio::time::Instant::now(),
            );
        self.rate.store(rate.0.to_bits(), Relaxed);
        self.changed.notify_waiters();
    }

    /// Change the burst (a fleet worker's part of the job's `--burst`); it holds from the
    /// next [`RateLimiter::set_rate`].
    pub(super) fn set_burst(&self, burst: u32) {
        self.burst.store(burst.max(1), Relaxed);
    }

    /// Wait until one request may start.
    pub(super) async fn until_ready(&self) {
        if self.rate() >= UNLIMITED || self.try_grant().is_none() {
            return;
        }
        let _turn = self.turn.lock().await;
        loop {
            // Registered before the clock is read: a rate change after this wakes us.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let Some(due) = self.try_grant() else {
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = changed => {}
            }
        }
    }

    /// Take a grant if one is due now (None), or say when the next one is.
    fn try_grant(&self) -> Option<tokio::time::Instant> {
        let mut s = self.schedule.lock().unwrap_or_else(PoisonError::into_inner);
        if s.rate >= UNLIMITED {
            return None;
        }
        s.grant(tokio::time::Instant::now()).err()
    }
}

/// The limiter's virtual clock: GCRA, in the time of [`tokio::time::Instant`] (so tests can
/// run it on a paused clock).
#[derive(Debug, Clone)]
pub(super) struct Schedule {
    rate: f64,
    interval: Duration,
    /// How early a grant may be taken: `grants at once − 1` intervals.
    tolerance: Duration,
    /// When the next grant is due (GCRA's theoretical arrival time).
    due: tokio::time::Instant,
}

impl Schedule {
    /// A schedule whose first grant is due at `now`. It starts with no grant banked: the
    /// first request goes at once, the next one interval later, no burst at the start.
    pub(super) fn new(rate: f64, at_once: NonZeroU32, now: tokio::time::Instant) -> Schedule {
        let mut s = Schedule {
            rate,
            interval: Duration::ZERO,
            tolerance: Duration::ZERO,
            due: now,
        };
        s.set_rate(rate, at_once, now);
        s
    }

    /// Change the rate at `now`, keeping the schedule's place: a grant waited for is due
    /// after the same share of the new interval, grants banked stay banked (up to the new
    /// burst). Coming from no limit, or new: nothing banked, the next grant at once.
    pub(super) fn set_rate(&mut self, rate: f64, at_once: NonZeroU32, now: tokio::time::Instant) {
        let interval = if rate >= UNLIMITED {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(1.0 / rate).max(Duration::from_nanos(1))
        };
        let tolerance = interval * (at_once.get() - 1);
        let next = match self.due.checked_sub(self.tolerance) {
            Some(earliest) if !self.interval.is_zero() => {
                let old = self.interval.as_secs_f64();
                if earliest > now {
                    now + interval.mul_f64((earliest - now).as_secs_f64() / old)
                } else {
                    let banked =
                        ((now - earliest).as_secs_f64() / old).min(f64::from(at_once.get() - 1));
                    now.checked_sub(interval.mul_f64(banked)).unwrap_or(now)
                }
            }
            _ => now,
        };
        self.due = next + tolerance;
        self.rate = rate;
        self.interval = interval;
        self.tolerance = tolerance;
    }

    /// Take a grant at `now`, or say when one is due.
    pub(super) fn grant(&mut self, now: tokio::time::Instant) -> Result<(), tokio::time::Instant> {
        let earliest = self.due.checked_sub(self.tolerance).unwrap_or(now);
        if now < earliest {
            return Err(earliest);
        }
        // Late by more than the tolerance (the limiter was idle, or no waiter could keep
        // up): the clock restarts from now, banking at most the tolerance.
        self.due = self.due.max(now) + self.interval;
        Ok(())
    }
}

/// How many grants the limiter may give at once (GCRA's burst): from `--burst` when given
/// ([`granted_burst`]), else derived from the rate ([`default_grants`]).
fn grants_at_once(rate: f64, burst: Option<NonZeroU32>) -> NonZeroU32 {
    match burst {
        Some(b) => granted_burst(rate, b),
        None => default_grants(rate),
    }
}

/// The default burst: as many grants at once as keep the API's counts, with
/// [`SEND_JITTER`] of arrival jitter, within `1.01 R + 2` in any second and
/// `0.1 R + max(2, 0.01 R) + 1` in any 100 ms. That is about 5 ms worth at high rates (the
/// lateness the limiter absorbs without losing rate), and 2 at low ones.
///
/// In a window of length `w` the API sees the grants of a window `w + J` long (`J` the
/// arrival jitter), and GCRA grants fewer than `(w + J)·R + b` there: at most
/// `ceil((w + J)·R) + b − 1`.
pub(crate) fn default_grants(rate: f64) -> NonZeroU32 {
    if rate >= UNLIMITED {
        return NonZeroU32::MIN;
    }
    let j = SEND_JITTER.as_secs_f64();
    // (Rounded with a margin: 0.105 * 2000 must not ceil to 211.)
    let fits = |w: f64, bound: f64| (bound + 1e-6).floor() - ((w + j) * rate - 1e-6).ceil() + 1.0;
    let b = fits(1.0, 1.01 * rate + 2.0).min(fits(0.1, 0.1 * rate + (0.01 * rate).max(2.0) + 1.0));
    NonZeroU32::new(b.clamp(1.0, u32::MAX as f64) as u32).unwrap_or(NonZeroU32::MIN)
}

/// How much of `--burst` the limiter grants at once: the burst less what [`SEND_JITTER`]
/// at `rate` could add. The API counts arrivals, not grants: requests granted `T` apart can
/// arrive closer together when the first is delayed on its way (scheduling, the connection
/// pool), so in any window the API could see `R·SEND_JITTER` more than were granted in it.
/// Holding that much of the burst back keeps what the API sees within `R·t + burst`.
pub(super) fn granted_burst(rate: f64, burst: NonZeroU32) -> NonZeroU32 {
    let jitter = (rate * SEND_JITTER.as_secs_f64()).ceil() as u32;
    NonZeroU32::new(burst.get().saturating_sub(jitter)).unwrap_or(NonZeroU32::MIN)
}

/// The spread of the delay between a grant and the request reaching the API that the
/// limiter leaves room for (see [`granted_burst`]).
pub(crate) const SEND_JITTER: Duration = Duration::from_millis(5);
