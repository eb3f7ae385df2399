//! Pacing by the limits a server announces ([`AnnouncedLimits`]): what remains of each
//! announced window is spread until its reset, instead of being spent at once and met
//! with 429s; a remaining of 0 holds every attempt until the reset.
//!
//! Every answer's announcements ([`super::announced::read_announced`]) update the policies
//! they name ([`AnnouncedLimits::observe`]); every attempt waits for each known policy
//! ([`AnnouncedLimits::wait`]), which takes one of its remaining calls and spaces starts
//! `time to reset / remaining` apart. A worker of a fleet takes its part of what remains
//! (the API counts every worker's calls): `remaining / live workers`, spaced `time to reset
//! / its part` apart ([`AnnouncedLimits::wait_for`]); a worker joining a fleet already
//! calling holds its calls for [`JOIN_SETTLE`], until the others count it (and takes
//! nothing before its own first grant has counted them: the engine waits for the fleet's
//! gate first). The adaptive
//! controller and `--rate` apply beside it, each as its own wait: the stricter wins, and a
//! 429 is still pushback.
//!
//! What the API allows is unknown until it answers: a fleet worker's first call goes alone,
//! and so does any run's first after a window ended whose next one nobody described (a burst
//! sent blind at the boundary would spend another window the headers do not show, or the
//! fleet's). A run alone starts at once: an API may take seconds to answer.
//!
//! Answers arrive out of order, so an announcement is trusted only as far as it is
//! consistent with what this run knows:
//! - within a window, the remaining is the lower of the server's word and the run's own
//!   count (the run counts a call when it starts; the server when it arrives), and the reset
//!   the earliest announced (servers round `t` and epoch resets up, so the earliest is the
//!   closest);
//! - a reset announced clearly later than the known one (by more than
//!   [`NEW_WINDOW_AFTER`]) is a new window: its remaining replaces the count;
//! - a window whose reset passed is whole again when the server announced its quota and
//!   length (less the calls still in flight, which the server may count in the new window);
//!   otherwise it no longer holds anything back until the next answer says more.
//!
//! Windows nobody announces are learnt from the API's refusals ([`super::learned`]): every
//! answer tells the learner whether its call was accepted or refused for the rate
//! ([`AnnouncedLimits::accepted`], [`AnnouncedLimits::refused`]), and a window it learns is
//! paced here as an announced one with its quota and length known (a policy named
//! `learned-N`). A refusal's `Retry-After` also holds every attempt of the run until then:
//! the API said the client's rate is spent, not the ID's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::announced::Announced;
use super::kept::KeptLimit;
use super::learned::{
    lowered, relaxed, Known, LearnedWindow, Learner, Lesson, RELAX_AFTER, SAME_BOUNDARY,
};
use crate::clock::Clock;
use crate::meter::{Unit, Usage};

/// A reset this much later than the known one starts a new window (servers round resets
/// to whole seconds).
pub(crate) const NEW_WINDOW_AFTER: Duration = Duration::from_millis(1100);

/// The longest wait an announcement can impose (a reset further away is read as this).
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The limits the API announced (or the run learnt from its refusals), and the pacing they
/// impose.
#[derive(Debug)]
pub struct AnnouncedLimits {
    inner: Mutex<Inner>,
    in_flight: Arc<InFlight>,
    /// The learner's clock starts here.
    origin: Instant,
    /// The wall clock a kept window's times are read in.
    clock: Clock,
}

/// The calls paced here that have not ended, and whether the API has answered one yet.
#[derive(Debug, Default)]
struct InFlight {
    calls: AtomicU64,
    /// An answer was read: the API's announcements (or their absence) are known.
    answered: AtomicBool,
    /// A call ended (for attempts waiting for the first call's answer).
    ended: Notify,
}

impl Default for AnnouncedLimits {
    fn default() -> Self {
        AnnouncedLimits {
            inner: Mutex::default(),
            in_flight: Arc::default(),
            origin: Instant::now(),
            clock: Clock::system(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    policies: HashMap<String, Policy>,
    /// The serial of the next window a policy starts.
    next_serial: u64,
    /// The outputs of the last answers that said what they cost, oldest first.
    outputs: std::collections::VecDeque<u64>,
    learner: Learner,
    /// The key of the next window learnt.
    next_key: u64,
    /// No attempt starts before this (a refusal's `Retry-After`, a join's settling).
    hold_until: Option<Instant>,
    /// The fleet's workers as the last attempt counted them (0: no attempt yet).
    workers: u64,
}

/// How long a worker joining a fleet whose other workers already make calls holds its own:
/// they take what the API announces it has left as if it were not there until their next
/// heartbeat counts it (a fleet's heartbeats are at most a second apart), and a newcomer
/// spending its part meanwhile would overspend the window they share.
pub(crate) const JOIN_SETTLE: Duration = Duration::from_secs(2);

/// The most windows learnt at once; past it, the one with the fewest refusals is dropped.
const MAX_LEARNED: usize = 4;

/// A learnt policy's name.
fn learned_name(key: u64) -> String {
    format!("learned-{key}")
}

/// What a learnt policy carries beside its pacing.
#[derive(Debug, Clone, Copy)]
struct Learnt {
    key: u64,
    /// Refusals it was learnt and confirmed from.
    refusals: u64,
    /// Windows in a row the run used whole with no refusal of it.
    whole_in_a_row: u32,
    /// When (Unix ms) it was learnt, lowered or relaxed last (or, adopted, by whom).
    changed_unix_ms: u64,
}

#[derive(Debug, Clone)]
struct Policy {
    /// What the limit counts: calls, or tokens.
    unit: Unit,
    /// Which window the policy is in: changes whenever a new one starts (a reservation
    /// settles only in the window it was taken from).
    window_serial: u64,
    /// Calls (or tokens) this run may still spend before `reset_at`.
    remaining: u64,
    /// Times the API's word lowered `remaining` below the run's own count: a word counts the
    /// calls it answered at what they spent, so a reservation taken before it is settled
    /// by it.
    words: u64,
    reset_at: Instant,
    limit: Option<u64>,
    window: Option<Duration>,
    /// The earliest the next call may start (pacing).
    next_start: Instant,
    /// Learnt from refusals, not announced.
    learnt: Option<Learnt>,
}

/// Where one announced policy stands, for progress lines, `live.json` and `status`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicyState {
    /// The policy's name as the API announced it.
    pub(crate) policy: String,
    /// Calls this run may still start before the reset.
    pub(crate) remaining: u64,
    /// Calls the window allows, if the API said.
    pub(crate) limit: Option<u64>,
    /// Time until its window resets.
    #[serde(rename = "reset_in_ms", with = "crate::serde_millis")]
    pub(crate) reset_in: Duration,
    /// The window's length (ms), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) window_ms: Option<u64>,
    /// For a window the API did not announce: the refusals it was learnt from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) learned_from: Option<u64>,
}

impl PolicyState {
    /// The words a progress line or `status` gives it.
    pub(crate) fn render(&self) -> String {
        let of = self.limit.map(|l| format!(" of {l}")).unwrap_or_default();
        let left = format!(
            "{}{of} left, resets in {:.1}s",
            self.remaining,
            self.reset_in.as_secs_f64()
        );
        match (self.learned_from, self.limit, self.window_ms) {
            (Some(refusals), Some(limit), Some(window)) => format!(
                "API limit learnt from {refusals} refusals: {limit} per {:.1}s, {left}",
                window as f64 / 1000.0
            ),
            _ => format!("API limit {}: {left}", self.policy),
        }
    }
}

/// A call started under the announced limits, in flight until dropped, with what it took of
/// the limits that count tokens (settled by [`AnnouncedLimits::settle`] once the call's cost
/// is known).
pub(crate) struct PacedCall {
    in_flight: Option<Arc<InFlight>>,
    reserved: Vec<Reserved>,
}

/// What a call took of one token-counting policy.
#[derive(Debug, Clone)]
struct Reserved {
    policy: String,
    window_serial: u64,
    /// The policy's [`Policy::words`] when it was taken.
    words: u64,
    /// Per worker: the window's count was lowered by `amount × workers`.
    amount: u64,
    workers: u64,
}

impl PacedCall {
    fn free() -> PacedCall {
        PacedCall {
            in_flight: None,
            reserved: Vec::new(),
        }
    }
}

impl Drop for PacedCall {
    fn drop(&mut self) {
        if let Some(n) = &self.in_flight {
            n.calls.fetch_sub(1, Relaxed);
            n.ended.notify_waiters();
        }
    }
}

/// What a call in flight is expected to write: the most the last answers wrote, or
/// [`DEFAULT_OUTPUT_ESTIMATE`] before any said.
fn expected_output(outputs: &std::collections::VecDeque<u64>) -> u64 {
    outputs
        .iter()
        .copied()
        .max()
        .unwrap_or(DEFAULT_OUTPUT_ESTIMATE)
}

/// Outputs remembered for the estimate of the next call's ([`AnnouncedLimits::output_estimate`]).
const OUTPUTS_KEPT: usize = 64;

/// A call's output estimated before any answer said what outputs cost, and no request said
/// its most.
pub(crate) const DEFAULT_OUTPUT_ESTIMATE: u64 = 256;

impl AnnouncedLimits {
    /// Limits with no policy known yet, whose kept windows are in `clock`'s time.
    pub(crate) fn new(clock: Clock) -> AnnouncedLimits {
        AnnouncedLimits {
            clock,
            ..AnnouncedLimits::default()
        }
    }

    /// Learn from one answer's announcements.
    pub(crate) fn observe(&self, announced: &[Announced]) {
        self.in_flight.answered.store(true, Relaxed);
        if announced.is_empty() {
            return;
        }
        let now = Instant::now();
        // The calls in flight but the one answered: the API has not counted what they write.
        let others = self.in_flight.calls.load(Relaxed).saturating_sub(1);
        let mut inner = self.lock();
        let inner = &mut *inner;
        let writing = expected_output(&inner.outputs);
        let policies = &mut inner.policies;
        for a in announced {
            let reset_at = now + a.reset.min(MAX_WAIT);
            // A limit counting what calls write has that much less left than the API says.
            let unwritten = match a.unit {
                Unit::Tokens | Unit::OutputTokens => others.saturating_mul(writing),
                // An API announces no money.
                Unit::Calls | Unit::InputTokens | Unit::Money(_) => 0,
            };
            let a = &Announced {
                remaining: a.remaining.saturating_sub(unwritten),
                ..a.clone()
            };
            match policies.get_mut(&a.policy) {
                Some(p) if reset_at < p.reset_at + NEW_WINDOW_AFTER && now < p.reset_at => {
                    if a.remaining < p.remaining {
                        p.words += 1;
                    }
                    p.remaining = p.remaining.min(a.remaining);
                    p.reset_at = p.reset_at.min(reset_at);
                    p.limit = a.limit.or(p.limit);
                    p.window = a.window.or(p.window);
                }
                Some(p) => {
                    p.remaining = a.remaining;
                    p.reset_at = reset_at;
                    p.limit = a.limit.or(p.limit);
                    p.window = a.window.or(p.window);
                    p.unit = a.unit;
                    p.window_serial = inner.next_serial;
                    inner.next_serial += 1;
                }
                None => {
                    let window_serial = inner.next_serial;
                    inner.next_serial += 1;
                    policies.insert(
                        a.policy.clone(),
                        Policy {
                            unit: a.unit,
                            window_serial,
                            words: 0,
                            remaining: a.remaining,
                            reset_at,
                            limit: a.limit,
                            window: a.window,
                            next_start: now,
                            learnt: None,
                        },
                    );
                }
            }
        }
    }

    #[cfg(test)]
    /// Wait until every announced policy allows a call, and take one from each.
    pub(crate) async fn wait(&self) -> PacedCall {
        self.wait_among(1).await
    }

    /// [`Self::wait_for`] a call of unknown cost.
    #[cfg(test)]
    pub(crate) async fn wait_among(&self, workers: u64) -> PacedCall {
        self.wait_for(|| workers, None).await
    }

    /// [`Self::wait`] for one of `workers()` live workers of a fleet sharing the API's
    /// limits, for a call estimated to cost `cost`: what an announced window has left
    /// (counted by the API for all of them) is divided among them, each pacing its part until
    /// the reset,
    /// and a part under what the call takes waits for the reset. A call takes one of a
    /// limit that counts calls, and its estimated tokens of one that counts tokens (none when
    /// its cost is unknown: such a limit then holds it only once spent); what it took is
    /// settled once its cost is known ([`Self::settle`]). Learnt windows are this worker's
    /// own (learnt from its own calls). The workers are counted again each time the call
    /// wakes, never once for all its wait: a call that began waiting while this worker was
    /// alone, and took what remains as if it still were once workers joined, spent the part
    /// of the windows they were pacing too.
    pub(crate) async fn wait_for(
        &self,
        workers: impl Fn() -> u64,
        cost: Option<Usage>,
    ) -> PacedCall {
        {
            let workers = workers().max(1);
            let mut inner = self.lock();
            if inner.workers == 0 {
                if workers > 1 {
                    // This worker's first call, in a fleet already calling.
                    let settled = Instant::now() + JOIN_SETTLE;
                    inner.hold_until = inner.hold_until.max(Some(settled));
                } else {
                    // Alone, its first calls spend no one else's window: they need not wait
                    // for a first answer (of an API that may take seconds to give one).
                    self.in_flight.answered.store(true, Relaxed);
                }
            }
            inner.workers = workers;
        }
        loop {
            // Registered before the checks, so a call ending meanwhile is not missed.
            let ended = self.in_flight.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let until = {
                let now = Instant::now();
                let in_flight = self.in_flight.calls.load(Relaxed);
                let workers = workers().max(1);
                let mut inner = self.lock();
                inner.workers = workers;
                let hold = inner.hold_until.filter(|&h| h > now);
                let answered = self.in_flight.answered.load(Relaxed);
                if inner.policies.is_empty() && hold.is_none() && answered {
                    return PacedCall::free();
                }
                let known = inner.policies.len();
                let writing = expected_output(&inner.outputs);
                let policies = &mut inner.policies;
                let now_unix_ms = self.clock.now_ms();
                policies.retain(|_, p| p.roll(now, now_unix_ms, in_flight, writing));
                if policies.len() < known {
                    // A window whose next one nobody described ended: what the API allows
                    // now is unknown again, so the next call probes it alone.
                    self.in_flight.answered.store(false, Relaxed);
                }
                let until = policies
                    .values()
                    .filter_map(|p| p.free_at(now, workers, p.takes(cost, workers)))
                    .chain(hold)
                    .max();
                match until {
                    // Until the API has answered (or after such a window), one call at a
                    // time: a burst sent blind could spend a window the fleet's other
                    // workers are pacing, or that a killed run spent.
                    None if !self.in_flight.answered.load(Relaxed) && in_flight > 0 => None,
                    None => {
                        let mut reserved = Vec::new();
                        for (name, p) in policies.iter_mut() {
                            let amount = p.takes(cost, workers);
                            p.take(now, workers, amount);
                            if p.unit != Unit::Calls && amount > 0 {
                                reserved.push(Reserved {
                                    policy: name.clone(),
                                    window_serial: p.window_serial,
                                    words: p.words,
                                    amount,
                                    workers,
                                });
                            }
                        }
                        self.in_flight.calls.fetch_add(1, Relaxed);
                        return PacedCall {
                            in_flight: Some(self.in_flight.clone()),
                            reserved,
                        };
                    }
                    Some(until) => Some(until),
                }
            };
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => ended.await,
            }
        }
    }

    /// Settle what `call` took of the limits that count tokens by what it cost, `actual`
    /// (its answer's usage): the difference goes back to (or comes off) the window it was
    /// taken from, if that window still runs and no word of the API lowered the count since
    /// (the API's count holds what its answers cost). A call whose cost is unknown keeps
    /// what it took. The output is remembered for the estimate of the next calls'.
    pub(crate) fn settle(&self, call: &mut PacedCall, actual: Option<Usage>) {
        let Some(actual) = actual else { return };
        let mut inner = self.lock();
        if inner.outputs.len() == OUTPUTS_KEPT {
            inner.outputs.pop_front();
        }
        inner.outputs.push_back(actual.output);
        for r in call.reserved.drain(..) {
            let Some(p) = inner.policies.get_mut(&r.policy) else {
                continue;
            };
            // Another window's, or the API's word came since: it settled the call already.
            if p.window_serial != r.window_serial || p.words != r.words {
                continue;
            }
            let spent = p.unit.of(Some(actual));
            if spent < r.amount {
                let back = (r.amount - spent).saturating_mul(r.workers);
                p.remaining = p.remaining.saturating_add(back);
                if let Some(limit) = p.limit {
                    p.remaining = p.remaining.min(limit);
                }
            } else {
                let more = (spent - r.amount).saturating_mul(r.workers);
                p.remaining = p.remaining.saturating_sub(more);
            }
        }
    }

    /// Whether a window is known (announced or learnt): something a fleet's workers divide.
    pub(crate) fn knows_a_window(&self) -> bool {
        !self.lock().policies.is_empty()
    }

    /// Whether a limit known counts tokens: calls are then estimated before they start.
    pub(crate) fn counts_tokens(&self) -> bool {
        self.lock().policies.values().any(|p| p.unit != Unit::Calls)
    }

    /// The output tokens to expect of the next call, whose request says it writes at most
    /// `most` (a `max_tokens`): the most any of the last answers wrote (a call writes what
    /// its like wrote), within `most`; before any answer said, `most`, or
    /// [`DEFAULT_OUTPUT_ESTIMATE`].
    pub(crate) fn output_estimate(&self, most: Option<u64>) -> u64 {
        let seen = self.lock().outputs.iter().copied().max();
        match (seen, most) {
            (Some(seen), Some(most)) => seen.min(most),
            (Some(seen), None) => seen,
            (None, Some(most)) => most,
            (None, None) => DEFAULT_OUTPUT_ESTIMATE,
        }
    }

    /// Where each announced policy stands.
    pub(crate) fn states(&self) -> Vec<PolicyState> {
        let now = Instant::now();
        let inner = self.lock();
        let mut states: Vec<PolicyState> = inner
            .policies
            .iter()
            .map(|(name, p)| PolicyState {
                policy: name.clone(),
                remaining: p.remaining,
                limit: p.limit,
                reset_in: p.reset_at.saturating_duration_since(now),
                window_ms: p.window.map(|w| w.as_millis() as u64),
                learned_from: p.learnt.map(|l| l.refusals),
            })
            .collect();
        states.sort_by(|a, b| a.policy.cmp(&b.policy));
        states
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Milliseconds on the learner's clock.
    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_millis() as u64
    }

    /// A call sent at `sent` was answered, and not refused for the rate: the API counted it.
    pub(crate) fn accepted(&self, sent: Instant) {
        self.in_flight.answered.store(true, Relaxed);
        let at = self.ms(sent);
        self.lock().learner.accepted(at);
    }

    /// A call sent at `sent` was refused for the rate (429), the API saying to try again
    /// after `retry_after` (from now): every attempt holds until then, and the learner reads
    /// the refusal.
    pub(crate) fn refused(&self, sent: Instant, retry_after: Duration) {
        self.in_flight.answered.store(true, Relaxed);
        let now = Instant::now();
        let reset_at = now + retry_after.min(MAX_WAIT);
        let in_flight = self.in_flight.calls.load(Relaxed);
        let mut inner = self.lock();
        inner.hold_until = inner.hold_until.max(Some(reset_at));
        let writing = expected_output(&inner.outputs);
        let now_unix_ms = self.clock.now_ms();
        inner
            .policies
            .retain(|_, p| p.roll(now, now_unix_ms, in_flight, writing));
        // The learner counts this worker's calls: it is told, and tells, this worker's part
        // of a limit, which the fleet's is `workers` times.
        let workers = inner.workers.max(1);
        let known: Vec<Known> = inner
            .policies
            .values()
            .map(|p| Known {
                learned: p.learnt.map(|l| l.key),
                reset_ms: self.ms(p.reset_at),
                length_ms: p.window.map(|w| w.as_millis() as u64),
                limit: p.limit.map(|l| l / workers),
            })
            .collect();
        let (at, reset) = (self.ms(sent), self.ms(reset_at));
        let Some(lesson) = inner.learner.refused(at, reset, &known) else {
            return;
        };
        match lesson {
            Lesson::Window { replaces, window } => {
                if let Some(key) = replaces {
                    inner.policies.remove(&learned_name(key));
                }
                let key = inner.next_key;
                inner.next_key += 1;
                let window = LearnedWindow {
                    limit: window.limit.saturating_mul(workers),
                    ..window
                };
                self.learn(&mut inner, key, window, now);
            }
            Lesson::Spent { key, accepted } => {
                if let Some(p) = inner.policies.get_mut(&learned_name(key)) {
                    let own = p.limit.map(|l| l / workers);
                    if let Some(own) = own.filter(|&l| accepted < l) {
                        let limit = lowered(own, accepted).saturating_mul(workers);
                        tracing::debug!(
                            policy = learned_name(key),
                            limit,
                            "a learnt API limit lowered: the API refused before it"
                        );
                        p.limit = Some(limit);
                    }
                    // Spent until the API's word, which its next window starts from.
                    p.remaining = 0;
                    p.reset_at = reset_at;
                    if let Some(l) = &mut p.learnt {
                        l.refusals += 1;
                        l.whole_in_a_row = 0;
                        l.changed_unix_ms = self.clock.now_ms();
                    }
                }
            }
        }
    }

    /// Pace by `window`, learnt from refusals, as by an announced one: spent until its reset.
    fn learn(&self, inner: &mut Inner, key: u64, window: LearnedWindow, now: Instant) {
        tracing::info!(
            limit = window.limit,
            window_ms = window.length_ms,
            refusals = window.refusals,
            "learnt an API limit nobody announced: {} calls per {:.1}s, from {} refusals",
            window.limit,
            window.length_ms as f64 / 1000.0,
            window.refusals
        );
        let learnt: Vec<(String, u64)> = inner
            .policies
            .iter()
            .filter_map(|(n, p)| p.learnt.map(|l| (n.clone(), l.refusals)))
            .collect();
        if learnt.len() >= MAX_LEARNED {
            if let Some((name, _)) = learnt.iter().min_by_key(|(_, r)| *r) {
                inner.policies.remove(name);
            }
        }
        let reset_at = (self.origin + Duration::from_millis(window.reset_ms)).max(now);
        let window_serial = inner.next_serial;
        inner.next_serial += 1;
        inner.policies.insert(
            learned_name(key),
            Policy {
                unit: Unit::Calls,
                window_serial,
                words: 0,
                remaining: 0,
                reset_at,
                limit: Some(window.limit),
                window: Some(Duration::from_millis(window.length_ms)),
                next_start: now,
                learnt: Some(Learnt {
                    key,
                    refusals: window.refusals,
                    whole_in_a_row: 0,
                    changed_unix_ms: self.clock.now_ms(),
                }),
            },
        );
    }

    #[cfg(test)]
    /// The windows learnt from refusals, as they stand (to keep with the job).
    pub(crate) fn learned(&self) -> Vec<LearnedWindow> {
        let now = Instant::now();
        let inner = self.lock();
        let mut found: Vec<(u64, LearnedWindow)> = inner
            .policies
            .values()
            .filter_map(|p| {
                let l = p.learnt?;
                Some((
                    l.key,
                    LearnedWindow {
                        limit: p.limit?,
                        length_ms: p.window?.as_millis() as u64,
                        reset_ms: self.ms(p.reset_at.max(now)),
                        refusals: l.refusals,
                    },
                ))
            })
            .collect();
        found.sort_by_key(|(k, _)| *k);
        found.into_iter().map(|(_, w)| w).collect()
    }

    /// The windows learnt from refusals as the job keeps them (their limits the fleet's).
    pub(crate) fn kept(&self) -> Vec<KeptLimit> {
        let now = Instant::now();
        let now_unix = self.clock.now_ms();
        let inner = self.lock();
        let mut found: Vec<(u64, KeptLimit)> = inner
            .policies
            .values()
            .filter_map(|p| {
                let l = p.learnt?;
                let in_ms = p.reset_at.saturating_duration_since(now).as_millis();
                Some((
                    l.key,
                    KeptLimit {
                        limit: p.limit?,
                        length_ms: u64::try_from(p.window?.as_millis()).ok()?,
                        reset_unix_ms: now_unix.saturating_add(u64::try_from(in_ms).ok()?),
                        refusals: l.refusals,
                        changed_unix_ms: l.changed_unix_ms,
                    },
                ))
            })
            .collect();
        found.sort_by_key(|(k, _)| *k);
        found.into_iter().map(|(_, k)| k).collect()
    }

    /// Pace by windows kept with the job (by an earlier run, or by another worker of the
    /// fleet): each kept limit not known here is learnt, one known whose kept form changed
    /// later replaces the limit known. A window adopted is spent until its current window
    /// ends, as one just learnt is: the run that kept it (or the fleet) may have used it
    /// whole, and a learnt phase is only as exact as the API's whole-second `Retry-After`
    /// (late, never early: so the wait ends in a window the API counts afresh). Returns how
    /// many windows changed.
    pub(crate) fn adopt(&self, kept: &[KeptLimit]) -> usize {
        let now = Instant::now();
        let now_unix = self.clock.now_ms();
        let mut inner = self.lock();
        let mut changed = 0;
        for k in kept {
            let Some(length) = Some(k.length_ms)
                .filter(|&l| l > 0)
                .map(Duration::from_millis)
            else {
                continue;
            };
            let part = k.limit.max(1);
            let learnt = inner
                .policies
                .values()
                .filter(|p| p.learnt.is_some())
                .count();
            let same = inner.policies.values_mut().find(|p| {
                p.learnt.is_some()
                    && p.window.is_some_and(|w| {
                        (w.as_millis() as u64).abs_diff(k.length_ms) <= SAME_BOUNDARY
                    })
            });
            match same {
                Some(p) => {
                    let Some(l) = &mut p.learnt else { continue };
                    if k.changed_unix_ms > l.changed_unix_ms {
                        l.changed_unix_ms = k.changed_unix_ms;
                        l.refusals = l.refusals.max(k.refusals);
                        l.whole_in_a_row = 0;
                        p.remaining = p.remaining.min(part);
                        p.limit = Some(part);
                        changed += 1;
                    }
                }
                None if learnt >= MAX_LEARNED => {}
                None => {
                    let left = k.reset_after(now_unix) - now_unix;
                    let reset_at = now + Duration::from_millis(left);
                    let key = inner.next_key;
                    inner.next_key += 1;
                    let window_serial = inner.next_serial;
                    inner.next_serial += 1;
                    inner.policies.insert(
                        learned_name(key),
                        Policy {
                            unit: Unit::Calls,
                            window_serial,
                            words: 0,
                            remaining: 0,
                            reset_at,
                            limit: Some(part),
                            window: Some(length),
                            next_start: now,
                            learnt: Some(Learnt {
                                key,
                                refusals: k.refusals,
                                whole_in_a_row: 0,
                                changed_unix_ms: k.changed_unix_ms,
                            }),
                        },
                    );
                    changed += 1;
                }
            }
        }
        changed
    }
}

impl Policy {
    /// Bring the window up to `now`: whole again once its reset passed, when its quota and
    /// length are known, less what the `in_flight` calls (each expected to write `writing`
    /// tokens) may still spend in it: their calls, which the API may count in the new
    /// window, or the tokens they write, which it counts when it answers. Returns whether
    /// the policy still holds anything back. `now_unix_ms`: the wall clock now, what a
    /// relaxed learnt limit is stamped with.
    fn roll(&mut self, now: Instant, now_unix_ms: u64, in_flight: u64, writing: u64) -> bool {
        if now < self.reset_at {
            return true;
        }
        match (self.limit, self.window.filter(|w| !w.is_zero())) {
            (Some(limit), Some(window)) => {
                while self.reset_at <= now {
                    self.reset_at += window;
                }
                // A window of its own: serials of announced windows are even, rolled ones
                // odd, so that none is taken for another.
                self.window_serial = self.window_serial.wrapping_add(1 << 32) | 1;
                let mut limit = limit;
                if let Some(l) = &mut self.learnt {
                    // Used whole again with no refusal: the API may allow more.
                    l.whole_in_a_row = if self.remaining == 0 {
                        l.whole_in_a_row + 1
                    } else {
                        0
                    };
                    if l.whole_in_a_row >= RELAX_AFTER {
                        l.whole_in_a_row = 0;
                        limit = relaxed(limit);
                        self.limit = Some(limit);
                        l.changed_unix_ms = now_unix_ms;
                        tracing::debug!(limit, "a learnt API limit relaxed");
                    }
                }
                let carried = match self.unit {
                    Unit::Calls => in_flight,
                    // A prompt is counted when it arrives: in the window that ended.
                    Unit::InputTokens => 0,
                    Unit::Tokens | Unit::OutputTokens => in_flight.saturating_mul(writing),
                    // No API announces or refuses money.
                    Unit::Money(_) => 0,
                };
                self.remaining = limit.saturating_sub(carried);
                true
            }
            // Nothing known of the next window: free until an answer says more.
            _ => false,
        }
    }

    /// The calls this worker, one of `workers`, may still start before the reset: what
    /// remains of the window (counted for the whole fleet) divided among them.
    fn part(&self, workers: u64) -> u64 {
        self.remaining / workers
    }

    /// How much of this policy a call of `cost` takes (one call; or its tokens, at most this
    /// worker's part of a whole window, so that a call larger than a window still goes once
    /// the window is whole).
    fn takes(&self, cost: Option<Usage>, workers: u64) -> u64 {
        let amount = self.unit.of(cost);
        match self.limit {
            Some(limit) if self.unit != Unit::Calls => amount.min((limit / workers).max(1)),
            _ => amount,
        }
    }

    /// When a call taking `amount` may start, if not now: at the reset when less than it
    /// remains (of this worker's part; a call of unknown tokens waits only for a spent
    /// window), else at its paced start.
    fn free_at(&self, now: Instant, workers: u64, amount: u64) -> Option<Instant> {
        let part = self.part(workers);
        if part == 0 || part < amount {
            return Some(self.reset_at);
        }
        (self.next_start > now).then_some(self.next_start)
    }

    /// Take `amount` (one call, or a call's tokens), and space the next: this worker's part
    /// spread until the reset, each call spaced by the share of it it takes.
    fn take(&mut self, now: Instant, workers: u64, amount: u64) {
        if amount == 0 {
            return;
        }
        let part = self.part(workers).max(1);
        let left = self.reset_at.saturating_duration_since(now);
        let share = (amount as f64 / part as f64).min(1.0);
        let interval = left.mul_f64(share);
        // Each worker of the fleet is taken to start a call as this one does (the API's next
        // word only lowers the count within a window): so this worker's part is its share
        // of what remained, never calls the others made and the API has not counted yet.
        self.remaining = self
            .remaining
            .saturating_sub(amount.saturating_mul(workers));
        self.next_start = self.next_start.max(now) + interval;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announced(
        policy: &str,
        remaining: u64,
        reset_ms: u64,
        quota: Option<(u64, u64)>,
    ) -> Announced {
        Announced {
            policy: policy.into(),
            limit: quota.map(|q| q.0),
            window: quota.map(|q| Duration::from_millis(q.1)),
            remaining,
            reset: Duration::from_millis(reset_ms),
            unit: Unit::Calls,
        }
    }

    fn tokens(policy: &str, remaining: u64, reset_ms: u64, quota: (u64, u64)) -> Announced {
        Announced {
            unit: Unit::Tokens,
            ..announced(policy, remaining, reset_ms, Some(quota))
        }
    }

    fn cost(input: u64, output: u64) -> Option<Usage> {
        Some(Usage { input, output })
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_window_spaces_calls_by_what_they_take_and_settles_what_they_spent() {
        let l = AnnouncedLimits::new(Clock::system());
        l.observe(&[tokens("tokens", 1000, 1000, (1000, 1000))]);
        assert!(l.counts_tokens());
        let start = Instant::now();
        // Calls of 100 tokens: ten in the window, spread over it; the eleventh waits for
        // the next window.
        let mut calls = Vec::new();
        for _ in 0..10 {
            calls.push(l.wait_for(|| 1, cost(60, 40)).await);
        }
        assert!(
            start.elapsed() < Duration::from_millis(1000),
            "{:?}",
            start.elapsed()
        );
        assert!(
            start.elapsed() >= Duration::from_millis(850),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(l.states()[0].remaining, 0);
        // Nine cost half their estimate: what they did not spend is back in the window. The
        // tenth spent more than it took: the rest comes off.
        for call in &mut calls[..9] {
            l.settle(call, cost(30, 20));
        }
        assert_eq!(l.states()[0].remaining, 450);
        l.settle(&mut calls[9], cost(150, 50));
        assert_eq!(l.states()[0].remaining, 350);
        // Settled again: nothing moves.
        l.settle(&mut calls[9], cost(0, 0));
        assert_eq!(l.states()[0].remaining, 350);
        assert!(start.elapsed() < Duration::from_millis(1000));
        drop(calls);
        // The window's calls are spaced to its end: the next call starts in the next one, and
        // what it spent is settled there; a call taken in it settles nothing in another.
        let mut next = l.wait_for(|| 1, cost(200, 100)).await;
        assert!(
            start.elapsed() >= Duration::from_millis(1000),
            "the next window"
        );
        assert_eq!(l.states()[0].remaining, 700);
        l.settle(&mut next, cost(100, 0));
        assert_eq!(l.states()[0].remaining, 900);
        tokio::time::advance(Duration::from_millis(1000)).await;
        // The call still in flight writes in the new window what the last answers wrote at
        // most (50): that much is kept for it.
        let mut late = l.wait_for(|| 1, cost(100, 0)).await;
        assert_eq!(l.states()[0].remaining, 1000 - 50 - 100);
        l.settle(&mut next, cost(0, 0));
        assert_eq!(l.states()[0].remaining, 850);
        l.settle(&mut late, cost(100, 50));
        assert_eq!(l.states()[0].remaining, 800);
        assert_eq!(l.output_estimate(Some(500)), 50, "the most an answer wrote");
    }

    #[tokio::test(start_paused = true)]
    async fn the_apis_word_on_tokens_keeps_back_what_the_calls_in_flight_will_write() {
        let l = AnnouncedLimits::new(Clock::system());
        l.observe(&[tokens("tokens", 10_000, 5000, (10_000, 5000))]);
        let mut calls = Vec::new();
        for _ in 0..3 {
            calls.push(l.wait_for(|| 1, cost(100, 100)).await);
        }
        // One answered, writing 80: the API's word counts it, not the two still writing.
        l.settle(&mut calls[0], cost(100, 80));
        l.observe(&[tokens("tokens", 9_000, 4000, (10_000, 5000))]);
        assert_eq!(l.states()[0].remaining, 9_000 - 2 * 80);
        // A call-counting limit keeps back nothing.
        l.observe(&[announced("requests", 50, 4000, None)]);
        let requests = l.states().into_iter().find(|s| s.policy == "requests");
        assert_eq!(requests.map(|s| s.remaining), Some(50));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_larger_than_a_window_goes_once_it_is_whole_and_unknown_costs_wait_only_for_a_spent_one(
    ) {
        let l = AnnouncedLimits::new(Clock::system());
        l.observe(&[tokens("tokens", 100, 1000, (1000, 1000))]);
        let start = Instant::now();
        drop(l.wait_for(|| 1, cost(5000, 0)).await);
        assert!(start.elapsed() >= Duration::from_millis(1000));
        assert!(start.elapsed() < Duration::from_millis(2000));
        // The window is spent by it: a call of unknown cost waits for the next one.
        assert_eq!(l.states()[0].remaining, 0);
        let at = Instant::now();
        drop(l.wait_for(|| 1, None).await);
        assert!(at.elapsed() > Duration::ZERO);
        // In a whole window, calls of unknown cost are not held.
        let at = Instant::now();
        for _ in 0..5 {
            drop(l.wait_for(|| 1, None).await);
        }
        assert_eq!(at.elapsed(), Duration::ZERO);
        assert_eq!(l.output_estimate(None), DEFAULT_OUTPUT_ESTIMATE);
        assert_eq!(l.output_estimate(Some(64)), 64);
    }

    #[tokio::test(start_paused = true)]
    async fn what_remains_is_spread_until_the_reset() {
        let l = AnnouncedLimits::new(Clock::system());
        l.observe(&[announced("w", 10, 1000, None)]);
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..10 {
            drop(l.wait().await);
            at.push(start.elapsed());
        }
        // Ten calls spread over the second: about 100 ms apart, the last before the reset.
        assert!(
            at[9] >= Duration::from_millis(850) && at[9] < Duration::from_millis(1000),
            "{at:?}"
        );
        assert!(
            at.windows(2)
                .all(|w| w[1] - w[0] >= Duration::from_millis(95)),
            "{at:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_remaining_waits_for_the_reset_and_a_known_window_is_whole_again() {
        let l = AnnouncedLimits::new(Clock::system());
        l.observe(&[announced("w", 0, 2000, Some((4, 2000)))]);
        let start = Instant::now();
        drop(l.wait().await);
        assert!(start.elapsed() >= Duration::from_millis(2000));
        assert_eq!(l.states()[0].remaining, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_answers_never_raise_the_count_and_a_later_reset_is_a_new_window() {
        let l = AnnouncedLimits::new(Clock::system());
        l.observe(&[announced("w", 5, 2000, None)]);
        drop(l.wait().await);
        // An answer to an older call says more remain: the run's own count stands.
        l.observe(&[announced("w", 5, 2000, None)]);
        assert_eq!(l.states()[0].remaining, 4);
        // The server counted fewer: its word.
        l.observe(&[announced("w", 2, 1900, None)]);
        assert_eq!(l.states()[0].remaining, 2);
        assert!(l.states()[0].reset_in <= Duration::from_millis(1900));
        // A reset 2 s later: the next window.
        l.observe(&[announced("w", 9, 3900, None)]);
        assert_eq!(l.states()[0].remaining, 9);
    }

    #[tokio::test(start_paused = true)]
    async fn the_strictest_policy_paces_and_an_unknown_next_window_holds_nothing() {
        let l = AnnouncedLimits::new(Clock::system());
        l.observe(&[
            announced("a", 100, 1000, None),
            announced("b", 0, 500, None),
        ]);
        let start = Instant::now();
        drop(l.wait().await);
        // b had nothing left: its reset. Its next window is unknown: it no longer holds.
        assert!(start.elapsed() >= Duration::from_millis(500));
        assert_eq!(l.states().len(), 1);
        assert!(l.states()[0]
            .render()
            .starts_with("API limit a: 99 left, resets in"));
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_at_one_boundary_teach_a_window_paced_like_an_announced_one() {
        let l = AnnouncedLimits::new(Clock::system());
        let step = Duration::from_millis(10);
        for _ in 0..50 {
            let sent = Instant::now();
            drop(l.wait().await);
            l.accepted(sent);
            tokio::time::advance(step).await;
        }
        // Refused until the window's end, 1.5 s on: every attempt holds until then.
        let start = Instant::now();
        l.refused(start, Duration::from_millis(1500));
        assert!(l.states().is_empty(), "one refusal teaches nothing");
        l.refused(start, Duration::from_millis(1490));
        let states = l.states();
        assert_eq!(states.len(), 1);
        assert_eq!(states[0].learned_from, Some(2));
        assert_eq!(states[0].limit, Some(50));
        assert_eq!(states[0].remaining, 0);
        assert!(states[0]
            .render()
            .starts_with("API limit learnt from 2 refusals: 50 per 2.0s"));
        drop(l.wait().await);
        assert!(start.elapsed() >= Duration::from_millis(1490));
        // The next window: its 50 calls spread over its 2 s.
        let window = Instant::now();
        for _ in 0..49 {
            drop(l.wait().await);
        }
        assert!(
            window.elapsed() >= Duration::from_millis(1800),
            "{:?}",
            window.elapsed()
        );
        assert_eq!(l.learned().len(), 1);
    }

    /// Limits that learnt a window of 20 calls: 20 accepted 10 ms apart, then two refusals
    /// pointing 800 ms on.
    async fn learnt_20_per_window() -> AnnouncedLimits {
        let l = AnnouncedLimits::new(Clock::system());
        for _ in 0..20 {
            l.accepted(Instant::now());
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        let now = Instant::now();
        l.refused(now, Duration::from_millis(800));
        l.refused(now, Duration::from_millis(800));
        l
    }

    #[tokio::test(start_paused = true)]
    async fn a_learnt_window_used_whole_without_refusals_is_relaxed() {
        let l = learnt_20_per_window().await;
        assert_eq!(l.learned()[0].limit, 20);
        // Windows used whole, one after another: the limit grows by a tenth.
        for _ in 0..(20 * (RELAX_AFTER as usize + 1)) {
            drop(l.wait().await);
        }
        assert!(l.learned()[0].limit > 20, "{:?}", l.learned());
    }

    #[tokio::test(start_paused = true)]
    async fn a_learnt_window_kept_paces_another_run_and_a_later_change_wins() {
        let l = learnt_20_per_window().await;
        let kept = l.kept();
        assert_eq!(kept.len(), 1);
        assert_eq!((kept[0].limit, kept[0].refusals), (20, 2));
        // A resume paces by it from its first call: its current window as spent, the next
        // ones whole.
        let resumed = AnnouncedLimits::new(Clock::system());
        assert_eq!(resumed.adopt(&kept), 1);
        assert_eq!(resumed.adopt(&kept), 0, "adopting again is no news");
        let states = resumed.states();
        assert_eq!(states[0].limit, Some(20));
        assert_eq!(states[0].learned_from, Some(2));
        assert_eq!(states[0].remaining, 0, "{states:?}");
        // A worker of the fleet lowered it later: the lower limit paces here too.
        let lowered = KeptLimit {
            limit: 16,
            refusals: 3,
            changed_unix_ms: kept[0].changed_unix_ms + 1,
            ..kept[0]
        };
        assert_eq!(resumed.adopt(&[lowered]), 1);
        assert_eq!(resumed.states()[0].limit, Some(16));
        assert_eq!(resumed.kept()[0].refusals, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_holds_every_attempt_until_its_retry_after() {
        let l = AnnouncedLimits::new(Clock::system());
        let start = Instant::now();
        l.refused(start, Duration::from_secs(2));
        drop(l.wait().await);
        assert!(start.elapsed() >= Duration::from_secs(2));
        // After it, nothing holds.
        let after = Instant::now();
        drop(l.wait().await);
        assert_eq!(after.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn until_the_api_answers_once_a_fleet_worker_sends_one_call_at_a_time() {
        let l = Arc::new(AnnouncedLimits::new(Clock::system()));
        let first = l.wait_among(2).await;
        let second = tokio::spawn({
            let l = l.clone();
            async move { drop(l.wait_among(2).await) }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            !second.is_finished(),
            "a second call went before any answer"
        );
        // The first call failed without an answer: the next one may probe.
        drop(first);
        second.await.unwrap();
        let probe = l.wait_among(2).await;
        l.observe(&[]);
        // Answered (announcing nothing): calls go together.
        let calls = [l.wait_among(2).await, l.wait_among(2).await];
        drop((probe, calls));
        // A run alone starts its calls together.
        let alone = AnnouncedLimits::new(Clock::system());
        let calls = [alone.wait().await, alone.wait().await, alone.wait().await];
        drop(calls);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_ending_with_its_next_one_unknown_is_probed_by_one_call() {
        let l = Arc::new(AnnouncedLimits::new(Clock::system()));
        l.observe(&[announced("w", 5, 1000, None)]);
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = l.wait().await;
        let second = tokio::spawn({
            let l = l.clone();
            async move { drop(l.wait().await) }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!second.is_finished(), "a call went beside the probe");
        l.observe(&[announced("w", 40, 2000, None)]);
        drop(probe);
        second.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_joining_a_fleet_already_calling_holds_until_it_is_counted() {
        let l = AnnouncedLimits::new(Clock::system());
        l.observe(&[]);
        let start = Instant::now();
        drop(l.wait_among(3).await);
        assert!(start.elapsed() >= JOIN_SETTLE);
        // The first worker, counting others joining later, does not hold.
        let first = AnnouncedLimits::new(Clock::system());
        first.observe(&[]);
        drop(first.wait_among(1).await);
        let later = Instant::now();
        drop(first.wait_among(2).await);
        assert_eq!(later.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn workers_of_a_fleet_each_take_their_part_of_what_remains() {
        let l = AnnouncedLimits::new(Clock::system());
        // Its first call alone (a fleet of one so far: no join to settle).
        drop(l.wait().await);
        l.observe(&[announced("w", 10, 1000, None)]);
        let start = Instant::now();
        // One of two workers: its half, 5 calls, spread over the second.
        for _ in 0..5 {
            drop(l.wait_among(2).await);
        }
        assert!(
            start.elapsed() >= Duration::from_millis(790),
            "{:?}",
            start.elapsed()
        );
        assert!(start.elapsed() < Duration::from_millis(1000));
        // Its half is spent: the API counting 1 left changes nothing until the reset.
        l.observe(&[announced("w", 1, 200, None)]);
        let before = Instant::now();
        drop(l.wait_among(2).await);
        assert!(before.elapsed() >= Duration::from_millis(190));
    }

    /// A call that began waiting while its worker was alone takes its part among the workers
    /// counted when it goes, not when it began to wait: counted once, it took of the window
    /// as a worker alone would, what the workers that joined meanwhile were pacing too.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_call_counts_the_workers_that_joined_while_it_waited() {
        let l = Arc::new(AnnouncedLimits::new(Clock::system()));
        let workers = Arc::new(AtomicU64::new(1));
        drop(l.wait_for(|| workers.load(Relaxed), None).await);
        l.observe(&[announced("w", 30, 3000, Some((30, 3000)))]);
        // Alone: a call every 100 ms. The first goes at once, the second waits.
        drop(l.wait_for(|| workers.load(Relaxed), None).await);
        let waiting = tokio::spawn({
            let (l, workers) = (l.clone(), workers.clone());
            async move { drop(l.wait_for(|| workers.load(Relaxed), None).await) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the second call did not wait");
        // Two workers join while it waits: it takes for three, as each of them does.
        workers.store(3, Relaxed);
        waiting.await.unwrap();
        let remaining = l.states()[0].remaining;
        assert_eq!(remaining, 29 - 3, "what the window has left for the fleet");
    }
}
