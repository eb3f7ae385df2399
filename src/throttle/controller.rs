//! The control law (see the module documentation of [`super`]): its constants
//! ([`ControlSettings`]), what a tick saw ([`TickSignals`]), which ticks' pushback counts
//! ([`PushbackFilter`]), the controller that moves the rate ([`RateController`]), and the
//! concurrency limit that adapts when no rate is set ([`AdaptiveConcurrency`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Constants of the control law (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ControlSettings {
    pub(crate) kp: f64,
    pub(crate) ki: f64,
    pub(crate) kd: f64,
    /// Relative increase per tick while the API keeps up.
    pub(crate) increase: f64,
    /// Latency above this multiple of its baseline counts as pushback...
    pub(crate) latency_factor: f64,
    /// ...when it is also at least this much above the baseline: on a fast API (a loopback
    /// server answers in 0.2 ms) three times the baseline is scheduling noise of the client's
    /// own machine, not the API slowing down.
    pub(crate) latency_min_rise: Duration,
    pub(crate) min_rate: f64,
    pub(crate) ceiling: f64,
}

impl ControlSettings {
    pub(super) fn new(min_rate: f64, ceiling: f64) -> ControlSettings {
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
pub(crate) struct TickSignals {
    pub(crate) elapsed: Duration,
    /// Attempts that got an answer or failed.
    pub(crate) attempts: u64,
    /// 429s, 503s and timeouts.
    pub(crate) pushback: u64,
    /// The lowest latency of a successful attempt over the tick, if any. The lowest, not
    /// the mean: an attempt's latency is measured inside our own runtime, so it includes
    /// the time a ready task waits for a busy machine to run it. That delay strikes some
    /// attempts and not others, while an API that queues requests slows every one of them;
    /// the minimum over a tick sees the second and not the first (delay-based congestion
    /// control, TCP Vegas and BBR, filters round-trip times by their minimum likewise).
    pub(crate) min_latency: Option<Duration>,
}

/// Share of attempts that may be pushback without the API being called overloaded: a 503 or
/// a timeout now and then is an API's own weather, not a sign of sending too fast.
pub(crate) const TOLERATED_PUSHBACK: f64 = 0.02;

/// Tells a tick's pushback that says "too fast" from pushback that any rate would get.
///
/// An API whose limit is exceeded refuses a share of attempts that grows with the rate sent
/// (nginx's `limit_req` refuses everything above its limit); an API with a flaky backend
/// refuses a steady few percent at any rate. Reacting to every refusal, the controller ground
/// a job against the second kind down to a few items/s (2% of IDs answering 503 once took
/// the demo from ~700 to ~4 items/s). So pushback counts only when its share over about the
/// last second is above the tolerated share `T` by more than chance: more than `T·n +
/// 2·sqrt(T·n)` of `n` attempts (a one-sided binomial bound, so a handful of attempts with
/// one refusal among them does not count either, and a large overload counts at once).
///
/// `T` starts at [`TOLERATED_PUSHBACK`] and is learned from what a cut does. When pushback
/// is acted on, the window's attempts and accepted attempts are noted; once the attempts
/// have fallen to [`CUT_EVIDENCE`] of that (the controller cut the rate) while pushback
/// still comes, the two kinds part: an API at its capacity accepts as much as before (the
/// refusals were the excess), while an API whose refusals do not depend on the rate accepts
/// less in proportion to what it is sent. In the second case the share it refuses at any rate
/// becomes the tolerated one (with a margin, at most [`MAX_TOLERATED_PUSHBACK`]; a share
/// too large for that margin is never learned): the
/// controller stops cutting and climbs back, and an overload on top of that share still
/// counts.
#[derive(Debug, Clone)]
pub(crate) struct PushbackFilter {
    /// Attempts and pushback over about the last second (exponentially weighted), and the
    /// seconds they cover (weighted alike: less than the window while the run is young).
    attempts: f64,
    pushback: f64,
    /// Of the pushback, the answers 429 ("too many requests").
    too_many: f64,
    seconds: f64,
    /// The share of attempts that may be pushback other than 429.
    tolerated: f64,
    /// When pushback was acted on: the window's attempts and accepted attempts per second
    /// then, and the time since.
    acted: Option<Acted>,
}

#[derive(Debug, Clone, Copy)]
struct Acted {
    attempts: f64,
    accepted: f64,
    age: Duration,
}

/// The share of attempts that, learned, may be pushback at most: an API refusing more than
/// this at any rate is slowed down anyway.
pub(crate) const MAX_TOLERATED_PUSHBACK: f64 = 0.25;

/// What the window's attempts must have fallen to, against when pushback was acted on, before
/// the accepted attempts tell the two kinds of pushback apart.
const CUT_EVIDENCE: f64 = 0.6;

impl Default for PushbackFilter {
    fn default() -> Self {
        PushbackFilter {
            attempts: 0.0,
            pushback: 0.0,
            too_many: 0.0,
            seconds: 0.0,
            tolerated: TOLERATED_PUSHBACK,
            acted: None,
        }
    }
}

impl PushbackFilter {
    /// The window's time constant.
    const WINDOW: Duration = Duration::from_secs(1);
    /// How long a noted cut waits for its evidence before it is forgotten.
    const EVIDENCE_WAIT: Duration = Duration::from_secs(30);
    /// The time constant of a learned share's drift back.
    const FORGET: Duration = Duration::from_secs(60);

    /// The share of attempts that may be pushback now.
    #[cfg(test)]
    pub(super) fn tolerated(&self) -> f64 {
        self.tolerated
    }

    /// Adds one tick's counts; returns the pushback to act on: the tick's own when the
    /// window's share says the API is overloaded, else 0. All of `pushback` may be learned
    /// as what the API refuses at any rate (see [`Self::filter_with_429s`]).
    #[cfg(test)]
    pub(crate) fn filter(&mut self, elapsed: Duration, attempts: u64, pushback: u64) -> u64 {
        self.filter_with_429s(elapsed, attempts, pushback, 0)
    }

    /// [`Self::filter`], with `too_many` of the tick's `pushback` answered 429. A 429 says
    /// the client sends too much, whatever else the API does, so it is never learned as a
    /// share refused at any rate and always counts beyond the base share. (A worker of a
    /// fleet that cuts its rate sees what it is accepted fall with what it sends, the others
    /// taking the capacity it left: learned, that read as "the API refuses 10% at any rate",
    /// and the fleet sent 11-13% 429s over a minute.)
    pub(crate) fn filter_with_429s(
        &mut self,
        elapsed: Duration,
        attempts: u64,
        pushback: u64,
        too_many: u64,
    ) -> u64 {
        let keep = (-elapsed.as_secs_f64() / Self::WINDOW.as_secs_f64()).exp();
        self.attempts = self.attempts * keep + attempts as f64;
        self.pushback = self.pushback * keep + pushback as f64;
        self.too_many = self.too_many * keep + too_many.min(pushback) as f64;
        self.seconds = self.seconds * keep + elapsed.as_secs_f64();
        let per_second = |n: f64| n / self.seconds.max(f64::MIN_POSITIVE);
        // What may be the API's weather rather than the client's rate.
        let learnable = (self.pushback - self.too_many).max(0.0);
        // A learned share drifts back (over about a minute) to what the API refuses now, so
        // an API whose flaky spell is over is watched at the base share again.
        if self.tolerated > TOLERATED_PUSHBACK && self.attempts >= 20.0 {
            let target = (1.25 * learnable / self.attempts).max(TOLERATED_PUSHBACK);
            if target < self.tolerated {
                let k = (-elapsed.as_secs_f64() / Self::FORGET.as_secs_f64()).exp();
                self.tolerated = target + (self.tolerated - target) * k;
            }
        }
        let over = |tolerated: f64, attempts: f64, pushback: f64| {
            let expected = tolerated * attempts;
            pushback > expected + 2.0 * expected.sqrt()
        };
        if let Some(acted) = self.acted.as_mut() {
            acted.age += elapsed;
            let sent = per_second(self.attempts);
            if sent <= CUT_EVIDENCE * acted.attempts {
                let accepted = per_second(self.attempts - self.pushback);
                // Pushback still comes at the lower rate, and what is accepted fell with what
                // is sent (not held at a capacity): the API refuses this share at any rate.
                // A share beyond what may ever be tolerated is not learned at all: an API
                // refusing that much is slowed down anyway, and a starved client's bursts
                // against a small burst allowance look like it (seen: 60% refused by a
                // `limit_req` at 174/s sent, its capacity 200/s, on a machine at load 17).
                let refuses_anyway = over(self.tolerated, self.attempts, learnable)
                    && learnable * 1.25 <= MAX_TOLERATED_PUSHBACK * self.attempts
                    && accepted <= 1.15 * acted.accepted * sent / acted.attempts;
                if refuses_anyway {
                    let share = learnable / self.attempts;
                    self.tolerated = (share * 1.25)
                        .clamp(self.tolerated, MAX_TOLERATED_PUSHBACK.max(self.tolerated));
                }
                self.acted = None;
            } else if acted.age > Self::EVIDENCE_WAIT {
                self.acted = None;
            }
        }
        let overloaded = over(self.tolerated, self.attempts, self.pushback)
            || over(TOLERATED_PUSHBACK, self.attempts, self.too_many);
        if pushback > 0 && overloaded {
            if self.acted.is_none() && self.attempts >= 20.0 {
                self.acted = Some(Acted {
                    attempts: per_second(self.attempts),
                    accepted: per_second(self.attempts - self.pushback),
                    age: Duration::ZERO,
                });
            }
            pushback
        } else {
            0
        }
    }
}

/// The rate controller: one update per tick.
#[derive(Debug, Clone)]
pub(crate) struct RateController {
    pub(super) settings: ControlSettings,
    /// The floor asked for; `settings.min_rate` is it kept under the ceiling.
    floor: f64,
    pub(super) rate: f64,
    last_error: Option<f64>,
    baseline_latency: Option<Duration>,
    /// How long the API has kept up since the last pushback.
    calm: Duration,
}

impl RateController {
    pub(super) fn new(settings: ControlSettings, initial: f64) -> RateController {
        RateController {
            settings,
            floor: settings.min_rate,
            rate: initial.clamp(settings.min_rate, settings.ceiling),
            last_error: None,
            baseline_latency: None,
            calm: Duration::ZERO,
        }
    }

    /// Move the ceiling (a fleet worker's share changed); returns the new rate. A rate at
    /// the old ceiling (the API kept up) moves to the new one; a rate held below it by
    /// pushback stays, under the new ceiling.
    pub(super) fn set_ceiling(&mut self, ceiling: f64) -> f64 {
        let at_ceiling = self.rate >= self.settings.ceiling * (1.0 - 1e-9);
        self.settings.ceiling = ceiling;
        self.settings.min_rate = self.floor.min(ceiling);
        self.rate = if at_ceiling {
            ceiling
        } else {
            self.rate.clamp(self.settings.min_rate, ceiling)
        };
        self.rate
    }

    /// Apply one tick's signals; returns the new rate.
    pub(super) fn update(&mut self, s: &TickSignals) -> f64 {
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
        let new_rate = if s.pushback == 0 && slow {
            // Rising latency alone brakes gently (a tenth of ki a tick, about 10% a second
            // while it lasts): it is no measure of unused rate (a run bound by its
            // concurrency accepts less when latency rises, however much rate is left), and
            // a loaded client's own scheduling delays read as latency too. Cut to what was
            // accepted, three workers of a fleet fell from 200/s to 6/s on a loaded machine.
            self.calm = Duration::ZERO;
            self.last_error = None;
            self.rate * (1.0 - c.ki * 0.1)
        } else if s.pushback > 0 {
            self.calm = Duration::ZERO;
            let accepted = (s.attempts - s.pushback) as f64 / secs;
            let error = self.rate - accepted;
            let historical = p * self.rate;
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

/// A concurrency limit that can shrink and grow: permits of the engine's semaphore.
pub(crate) struct AdaptiveConcurrency {
    pub(super) permits: Arc<tokio::sync::Semaphore>,
    pub(super) limit: AtomicU64,
    pub(super) max: u64,
    /// Permits to take away as they come back.
    pub(super) owed: AtomicU64,
}

impl AdaptiveConcurrency {
    /// Calls allowed at once now.
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    pub(super) fn set(&self, new: u64) {
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
    pub(crate) fn settle(&self) {
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
