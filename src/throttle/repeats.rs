//! Refusals bound to IDs: which of a tick's refusals (503, 529, timeouts) are the rate's, and
//! which are the same IDs refused every time ([`RepeatRefusals`]).
//!
//! An API behind a gateway often refuses a few IDs whatever the rate: a backend shard down
//! for those keys, an upstream that times out on particular records. Their 503s arrive at any
//! rate, on the same IDs, while every other ID answers at once; slowing down cures nothing,
//! and reacting to them ground a job from 300 to 17 items/s. Overload is the other kind: an
//! API over its capacity refuses attempts whichever ID they carry.
//!
//! The two are told apart by what the run already sees, the retries. An ID refused on its
//! last attempt is retried; if refusals are the rate's, its retry is refused about as often
//! as anyone's first attempt (less, once the rate came down); if they are the ID's, it is
//! refused again every time. Over a window (time constant [`RepeatRefusals::WINDOW`]), with
//! `P_f` the share of first-or-clean attempts refused and `P_r` the share of repeats (attempts
//! of IDs refused last time) refused again:
//!
//! ```text
//! bound = (P_r - P_f) / (1 - P_f)   the share of refused IDs that are refused every time
//!         (0 unless P_r exceeds P_f by more than two standard errors of P_r)
//! q     = P_f * bound               the share of fresh attempts refused for their ID
//! ```
//!
//! A tick's refusals that count as the rate's are then the fresh attempts' refusals beyond
//! `q` of them, and the repeats' refusals beyond the repeats expected to be of such IDs
//! (`bound` of them), each beyond chance too (two standard deviations of a Poisson count). An overload starting on top of ID-bound refusals shows at once, as
//! fresh refusals beyond `q`; `q` only grows with evidence that retries are refused more
//! often than first attempts, which an overload does not give (its refusals strike at random).
//! A 429 is never the ID's (it says "too many requests") and is not seen here.
//!
//! Until the first retries have shown which kind the refusals are (fewer than
//! [`RepeatRefusals::MIN_REPEATS`] repeats in the window), a tick's refusals count only
//! beyond [`UNPROVEN_ALLOWANCE`] of its attempts, for at most [`PROOF_WAIT`]: the retries
//! come after the backoff's first wait (500 ms by default), and cutting the rate before them
//! cut a job refusing 10% of its IDs from 300/s to 72/s in its first second, five seconds to
//! climb back. An overload refusing more than the allowance counts at once; a smaller one a
//! moment later, when its retries are seen to pass (or after `PROOF_WAIT`, when the retries
//! wait longer or there are none: `--max-attempts 1`).

use std::time::Duration;

/// The share of a tick's attempts that may be refused, before the retries tell what the
/// refusals are, without counting as the rate's (see the module doc).
pub(crate) const UNPROVEN_ALLOWANCE: f64 = 0.25;
/// How long refusals may go unproven before they count as the rate's all the same.
pub(crate) const PROOF_WAIT: Duration = Duration::from_secs(2);

/// What one tick saw of refusals other than 429.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TickRefusals {
    /// Every attempt of the tick.
    pub(crate) attempts: u64,
    /// Attempts refused (503, 529, a timeout).
    pub(crate) refused: u64,
    /// Attempts of IDs whose last attempt was refused.
    pub(crate) repeats: u64,
    /// Of the repeats, those refused again.
    pub(crate) repeats_refused: u64,
}

/// The window over which refusals are told apart (see the module doc).
#[derive(Debug, Clone, Default)]
pub(crate) struct RepeatRefusals {
    fresh: f64,
    fresh_refused: f64,
    repeats: f64,
    repeats_refused: f64,
    /// The share of refused IDs that are refused every time, as of the last tick.
    bound: f64,
    /// How long refusals have been seen without the repeats to tell their kind.
    unproven: Duration,
}

impl RepeatRefusals {
    /// The window's time constant: ID-bound refusals are a property of the input, steady over
    /// many seconds; an overload shows in the fresh attempts of a single tick.
    const WINDOW: Duration = Duration::from_secs(10);
    /// Repeats (weighted) needed before any refusal is taken as an ID's.
    const MIN_REPEATS: f64 = 8.0;

    /// Adds one tick; returns how many of its refusals count as the rate's.
    pub(super) fn of_the_rate(&mut self, elapsed: Duration, t: TickRefusals) -> u64 {
        let keep = (-elapsed.as_secs_f64() / Self::WINDOW.as_secs_f64()).exp();
        let repeats = t.repeats.min(t.attempts);
        let repeats_refused = t.repeats_refused.min(repeats).min(t.refused);
        let fresh = t.attempts - repeats;
        let fresh_refused = (t.refused - repeats_refused).min(fresh);
        self.fresh = self.fresh * keep + fresh as f64;
        self.fresh_refused = self.fresh_refused * keep + fresh_refused as f64;
        self.repeats = self.repeats * keep + repeats as f64;
        self.repeats_refused = self.repeats_refused * keep + repeats_refused as f64;
        self.bound = self.estimate();
        if self.repeats >= Self::MIN_REPEATS {
            self.unproven = Duration::ZERO;
        } else if self.fresh_refused + self.repeats_refused >= 0.5 {
            self.unproven += elapsed;
            if self.unproven <= PROOF_WAIT {
                let beyond = t.refused as f64 - UNPROVEN_ALLOWANCE * t.attempts as f64;
                return beyond.max(0.0).round() as u64;
            }
        }
        let q = self.fresh_share() * self.bound;
        // Beyond what the IDs' refusals give by chance too: a tick of few attempts (the
        // client held up by its own store) with two of them refused must not read as
        // overload.
        let beyond = |refused: u64, expected: f64| {
            (refused as f64 - expected - 2.0 * expected.sqrt()).max(0.0)
        };
        let of_the_rate = beyond(fresh_refused, q * fresh as f64)
            + beyond(repeats_refused, self.bound * repeats as f64);
        of_the_rate.round() as u64
    }

    /// The share of fresh attempts refused for their ID: what is refused whatever the rate.
    pub(super) fn bound_share(&self) -> f64 {
        self.fresh_share() * self.bound
    }

    fn fresh_share(&self) -> f64 {
        if self.fresh > 0.0 {
            self.fresh_refused / self.fresh
        } else {
            0.0
        }
    }

    /// `bound` of the module doc: 0 without enough evidence that repeats are refused more
    /// often than fresh attempts.
    fn estimate(&self) -> f64 {
        if self.repeats < Self::MIN_REPEATS || self.fresh <= 0.0 {
            return 0.0;
        }
        let p_f = self.fresh_share();
        let p_r = self.repeats_refused / self.repeats;
        if p_f >= 1.0 {
            // Every fresh attempt refused: nothing to tell the IDs apart by; the rate's.
            return 0.0;
        }
        // A binomial bound on P_r with P_f's odds: chance alone rarely goes above it.
        let margin = 2.0 * (p_f.max(0.01) * (1.0 - p_f) / self.repeats).sqrt();
        if p_r <= p_f + margin {
            return 0.0;
        }
        ((p_r - p_f) / (1.0 - p_f)).clamp(0.0, 1.0)
    }
}
