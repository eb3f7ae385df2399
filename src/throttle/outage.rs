//! Outage detection: what an attempt's outcome tells the throttle ([`Observed`]), what it
//! knows of one item's earlier failures ([`ItemHistory`]), and the outage gate: failures in
//! a row declare the API out, every attempt is then held back but one probe at growing
//! intervals, and a failure that may be an outage starting waits for evidence before it
//! counts against its item ([`Throttle::charge`]).

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::PoisonError;
use std::time::Duration;

use super::{Rate, Throttle};
use crate::failure::{ErrorClass, Failure, Next};

/// Failures in a row, with no answer in between, that mean the API is out rather than
/// failing some items.
pub(crate) const OUTAGE_AFTER_FAILURES: u64 = 20;
/// How long a possible-outage failure waits for evidence before it is decided without
/// (see [`Throttle::charge`]).
pub(crate) const PROVISIONAL_WAIT: Duration = Duration::from_secs(2);

/// Whether an attempt counts, as first recorded.
pub(super) enum Verdict {
    Counted,
    Free,
    /// Decided by what happens next; the number of answers seen so far.
    Provisional(u64),
}
/// The first probe's delay after an outage starts; doubles up to [`MAX_PROBE_INTERVAL`].
pub(crate) const FIRST_PROBE_AFTER: Duration = Duration::from_millis(500);
pub(crate) const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// What an attempt's outcome tells the throttle: the one place that maps an outcome to
/// API pushback (for the adaptive controller) and to possible-outage evidence (for the
/// outage gate). See [`Observed::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// A 2xx answer, with its latency.
    Success(Duration),
    /// An answer that says "overloaded": 503 or 529, with or without `Retry-After` (rate
    /// limiters such as nginx's `limit_req` answer 503 by default, object stores say
    /// "503 Slow Down"). Pushback, unless it repeats on the same IDs while others succeed
    /// (see [`crate::throttle`]); the API is up.
    Pushback,
    /// An answer that refuses the client's rate: 429. Always pushback; the API is up.
    TooMany,
    /// No answer within the timeout: pushback (an overloaded API stops answering in time),
    /// and no answer at all, so possibly the API being out.
    Timeout,
    /// No connection to the API could be made (refused), or a gateway in front of it could
    /// get no answer from it (502, 504): the API may be out, and the ID is not the cause.
    Unreachable,
    /// No answer to a request sent (dropped connection), or a 5xx other than 503 (a gateway
    /// saying the API behind it failed): the API may be out, or this request breaks it.
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
    /// | 429 | yes | no: an answer |
    /// | 503, 529 | yes, unless it repeats on the same IDs | no: an answer |
    /// | timeout | yes | yes, unless the ID fails alone |
    /// | refused connection, 502, 504 | no | yes, whatever the ID |
    /// | dropped connection, other 5xx | no | yes, unless the ID fails alone |
    /// | any other failure (4xx, unreadable body, bad request) | no | no |
    pub fn of<T>(result: &Result<T, Failure>, latency: Duration) -> Observed {
        match result {
            Ok(_) => Observed::Success(latency),
            // The handler decided what happens next; whether the request reached the other
            // side (so whether the ID may be the cause) is read from what failed.
            Err(f) => match f.next {
                Next::Pushback { .. } => Observed::Pushback,
                Next::TooMany { .. } => Observed::TooMany,
                Next::TimedOut => Observed::Timeout,
                Next::Unreachable { .. } => match (f.class, f.status) {
                    (_, Some(502 | 504)) | (ErrorClass::Connect, _) => Observed::Unreachable,
                    _ => Observed::Down,
                },
                // An answer, even a refusal or one its checks refused: no pushback, no outage.
                Next::Permanent | Next::Retry { .. } | Next::Renewed | Next::CredentialRejected => {
                    Observed::Answered
                }
            },
        }
    }

    /// The API is pushing back.
    fn is_pushback(self) -> bool {
        matches!(
            self,
            Observed::Pushback | Observed::TooMany | Observed::Timeout
        )
    }

    /// Pushback that may be the ID's rather than the rate's, if it repeats on the same ID:
    /// all but 429 (see [`crate::throttle`]).
    fn may_repeat(self) -> bool {
        matches!(self, Observed::Pushback | Observed::Timeout)
    }

    /// No usable answer: the API may be out.
    fn may_be_down(self) -> bool {
        matches!(
            self,
            Observed::Timeout | Observed::Unreachable | Observed::Down
        )
    }

    /// No usable answer, and the request reached the API: the ID may be the cause.
    fn may_be_the_ids(self) -> bool {
        matches!(self, Observed::Timeout | Observed::Down)
    }
}

/// What the throttle knows of one item's earlier attempts, kept by the item while it is
/// attempted (see [`Throttle::charge`]).
#[derive(Debug, Default)]
pub struct ItemHistory {
    /// A possible-outage failure of this ID was found to be its own: the API answered
    /// another request after it failed, or no outage showed while it waited for evidence.
    fails_alone: std::sync::atomic::AtomicBool,
    /// This ID's last attempt was pushback other than 429 (503, 529, a timeout): its next
    /// one is a repeat that tells whether such refusals are the ID's (see [`crate::throttle`]).
    refused: std::sync::atomic::AtomicBool,
}

impl ItemHistory {
    pub(super) fn fails_alone(&self) -> bool {
        self.fails_alone.load(Relaxed)
    }
}

pub(super) struct Outage {
    /// When the current outage began (`None`: the API is up).
    pub(super) since: Option<std::time::Instant>,
    /// When the next probe may go.
    pub(super) next_probe: std::time::Instant,
    pub(super) probe_interval: Duration,
    /// A probe is in flight.
    pub(super) probing: bool,
}

impl Throttle {
    /// How long the API has been out, if it is.
    pub fn outage(&self) -> Option<Duration> {
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
    pub async fn charge(&self, observed: Observed, probe: bool, history: &ItemHistory) -> bool {
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
                o.next_probe = std::time::Instant::now() + o.probe_interval;
            }
            if o.since.is_none() && in_a_row >= OUTAGE_AFTER_FAILURES {
                tracing::warn!("the API looks down ({in_a_row} failures in a row): pausing, probing with one request at growing intervals");
                o.since = Some(std::time::Instant::now());
                o.probe_interval = FIRST_PROBE_AFTER;
                o.next_probe = std::time::Instant::now() + FIRST_PROBE_AFTER;
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
