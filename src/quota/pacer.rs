//! Pacing by the limits a server announces ([`AnnouncedLimits`]): what remains of each
//! announced window is spread until its reset, instead of being spent at once and met
//! with 429s; a remaining of 0 holds every attempt until the reset.
//!
//! Every answer's announcements ([`super::announced::read_announced`]) update the policies
//! they name ([`AnnouncedLimits::observe`]); every attempt waits for each known policy
//! ([`AnnouncedLimits::wait`]), which takes one of its remaining calls and spaces starts
//! `time to reset / remaining` apart. A worker of a fleet takes its part of what remains
//! (the API counts every worker's calls): `remaining / live workers`, spaced `time to reset
//! / its part` apart ([`AnnouncedLimits::wait_among`]). The adaptive controller and `--rate` apply beside it,
//! each as its own wait: the stricter wins, and a 429 is still pushback.
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
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::announced::Announced;
use super::learned::{lowered, relaxed, Known, LearnedWindow, Learner, Lesson, RELAX_AFTER};

/// A reset this much later than the known one starts a new window (servers round resets
/// to whole seconds).
pub const NEW_WINDOW_AFTER: Duration = Duration::from_millis(1100);

/// The longest wait an announcement can impose (a reset further away is read as this).
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The limits the API announced (or the run learnt from its refusals), and the pacing they
/// impose.
#[derive(Debug)]
pub struct AnnouncedLimits {
    inner: Mutex<Inner>,
    in_flight: Arc<AtomicU64>,
    /// The learner's clock starts here.
    origin: Instant,
}

impl Default for AnnouncedLimits {
    fn default() -> Self {
        AnnouncedLimits {
            inner: Mutex::default(),
            in_flight: Arc::default(),
            origin: Instant::now(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    policies: HashMap<String, Policy>,
    learner: Learner,
    /// The key of the next window learnt.
    next_key: u64,
    /// No attempt starts before this (a refusal's `Retry-After`).
    hold_until: Option<Instant>,
}

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
}

#[derive(Debug, Clone)]
struct Policy {
    /// Calls this run may still start before `reset_at`.
    remaining: u64,
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
    pub policy: String,
    /// Calls this run may still start before the reset.
    pub remaining: u64,
    /// Calls the window allows, if the API said.
    pub limit: Option<u64>,
    /// Time until its window resets.
    #[serde(rename = "reset_in_ms", with = "crate::serde_millis")]
    pub reset_in: Duration,
    /// The window's length (ms), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// For a window the API did not announce: the refusals it was learnt from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_from: Option<u64>,
}

impl PolicyState {
    /// The words a progress line or `status` gives it.
    pub fn render(&self) -> String {
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

/// A call started under the announced limits, in flight until dropped.
pub struct PacedCall(Option<Arc<AtomicU64>>);

impl Drop for PacedCall {
    fn drop(&mut self) {
        if let Some(n) = &self.0 {
            n.fetch_sub(1, Relaxed);
        }
    }
}

impl AnnouncedLimits {
    /// Limits with no policy known yet.
    pub fn new() -> AnnouncedLimits {
        AnnouncedLimits::default()
    }

    /// Learn from one answer's announcements.
    pub fn observe(&self, announced: &[Announced]) {
        if announced.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        let policies = &mut inner.policies;
        for a in announced {
            let reset_at = now + a.reset.min(MAX_WAIT);
            match policies.get_mut(&a.policy) {
                Some(p) if reset_at < p.reset_at + NEW_WINDOW_AFTER && now < p.reset_at => {
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
                }
                None => {
                    policies.insert(
                        a.policy.clone(),
                        Policy {
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

    /// Wait until every announced policy allows a call, and take one from each.
    pub async fn wait(&self) -> PacedCall {
        self.wait_among(1).await
    }

    /// [`Self::wait`] for one of `workers` live workers of a fleet sharing the API's limits:
    /// what an announced window has left (counted by the API for all of them) is divided
    /// among them, each pacing its part until the reset, and a part under one call waits
    /// for the reset. Learnt windows are this worker's own (learnt from its own calls).
    pub async fn wait_among(&self, workers: u64) -> PacedCall {
        let workers = workers.max(1);
        loop {
            let until = {
                let now = Instant::now();
                let in_flight = self.in_flight.load(Relaxed);
                let mut inner = self.lock();
                let hold = inner.hold_until.filter(|&h| h > now);
                let policies = &mut inner.policies;
                if policies.is_empty() && hold.is_none() {
                    return PacedCall(None);
                }
                policies.retain(|_, p| p.roll(now, in_flight));
                let until = policies
                    .values()
                    .filter_map(|p| p.free_at(now, workers))
                    .chain(hold)
                    .max();
                if until.is_none() {
                    for p in policies.values_mut() {
                        p.take(now, workers);
                    }
                    self.in_flight.fetch_add(1, Relaxed);
                    return PacedCall(Some(self.in_flight.clone()));
                }
                until
            };
            if let Some(until) = until {
                tokio::time::sleep_until(until).await;
            }
        }
    }

    /// Where each announced policy stands.
    pub fn states(&self) -> Vec<PolicyState> {
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
    pub fn accepted(&self, sent: Instant) {
        let at = self.ms(sent);
        self.lock().learner.accepted(at);
    }

    /// A call sent at `sent` was refused for the rate (429), the API saying to try again
    /// after `retry_after` (from now): every attempt holds until then, and the learner reads
    /// the refusal.
    pub fn refused(&self, sent: Instant, retry_after: Duration) {
        let now = Instant::now();
        let reset_at = now + retry_after.min(MAX_WAIT);
        let in_flight = self.in_flight.load(Relaxed);
        let mut inner = self.lock();
        inner.hold_until = inner.hold_until.max(Some(reset_at));
        inner.policies.retain(|_, p| p.roll(now, in_flight));
        let known: Vec<Known> = inner
            .policies
            .values()
            .map(|p| Known {
                learned: p.learnt.map(|l| l.key),
                reset_ms: self.ms(p.reset_at),
                length_ms: p.window.map(|w| w.as_millis() as u64),
                limit: p.limit,
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
                self.learn(&mut inner, key, window, now);
            }
            Lesson::Spent { key, accepted } => {
                if let Some(p) = inner.policies.get_mut(&learned_name(key)) {
                    if let Some(limit) = p.limit.filter(|&l| accepted < l) {
                        let limit = lowered(limit, accepted);
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
        inner.policies.insert(
            learned_name(key),
            Policy {
                remaining: 0,
                reset_at,
                limit: Some(window.limit),
                window: Some(Duration::from_millis(window.length_ms)),
                next_start: now,
                learnt: Some(Learnt {
                    key,
                    refusals: window.refusals,
                    whole_in_a_row: 0,
                }),
            },
        );
    }

    /// The windows learnt from refusals, as they stand (to keep with the job).
    pub fn learned(&self) -> Vec<LearnedWindow> {
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
}

impl Policy {
    /// Bring the window up to `now`: whole again once its reset passed, when its quota and
    /// length are known. Returns whether the policy still holds anything back.
    fn roll(&mut self, now: Instant, in_flight: u64) -> bool {
        if now < self.reset_at {
            return true;
        }
        match (self.limit, self.window.filter(|w| !w.is_zero())) {
            (Some(limit), Some(window)) => {
                while self.reset_at <= now {
                    self.reset_at += window;
                }
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
                        tracing::debug!(limit, "a learnt API limit relaxed");
                    }
                }
                self.remaining = limit.saturating_sub(in_flight);
                true
            }
            // Nothing known of the next window: free until an answer says more.
            _ => false,
        }
    }

    /// The calls this worker, one of `workers`, may still start before the reset: what
    /// remains of an announced window divided among them; all of a learnt one.
    fn part(&self, workers: u64) -> u64 {
        match self.learnt {
            Some(_) => self.remaining,
            None => self.remaining / workers,
        }
    }

    /// When the next call may start, if not now: at the reset when nothing remains (of this
    /// worker's part), else at its paced start.
    fn free_at(&self, now: Instant, workers: u64) -> Option<Instant> {
        if self.part(workers) == 0 {
            return Some(self.reset_at);
        }
        (self.next_start > now).then_some(self.next_start)
    }

    /// Take one call, and space the next: this worker's part spread until the reset.
    fn take(&mut self, now: Instant, workers: u64) {
        let part = u32::try_from(self.part(workers).max(1)).unwrap_or(u32::MAX);
        let interval = self.reset_at.saturating_duration_since(now) / part;
        // Of an announced window, each worker of the fleet is taken to start a call as this
        // one does (the API's next word only lowers the count within a window): so this
        // worker's part is its share of what remained, never calls the others made and the
        // API has not counted yet.
        let step = if self.learnt.is_some() { 1 } else { workers };
        self.remaining = self.remaining.saturating_sub(step);
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
        }
    }

    #[tokio::test(start_paused = true)]
    async fn what_remains_is_spread_until_the_reset() {
        let l = AnnouncedLimits::new();
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
        let l = AnnouncedLimits::new();
        l.observe(&[announced("w", 0, 2000, Some((4, 2000)))]);
        let start = Instant::now();
        drop(l.wait().await);
        assert!(start.elapsed() >= Duration::from_millis(2000));
        assert_eq!(l.states()[0].remaining, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_answers_never_raise_the_count_and_a_later_reset_is_a_new_window() {
        let l = AnnouncedLimits::new();
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
        let l = AnnouncedLimits::new();
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
        let l = AnnouncedLimits::new();
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

    #[tokio::test(start_paused = true)]
    async fn a_learnt_window_used_whole_without_refusals_is_relaxed() {
        let l = AnnouncedLimits::new();
        for _ in 0..20 {
            l.accepted(Instant::now());
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        let now = Instant::now();
        l.refused(now, Duration::from_millis(800));
        l.refused(now, Duration::from_millis(800));
        assert_eq!(l.learned()[0].limit, 20);
        // Windows used whole, one after another: the limit grows by a tenth.
        for _ in 0..(20 * (RELAX_AFTER as usize + 1)) {
            drop(l.wait().await);
        }
        assert!(l.learned()[0].limit > 20, "{:?}", l.learned());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_holds_every_attempt_until_its_retry_after() {
        let l = AnnouncedLimits::new();
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
    async fn workers_of_a_fleet_each_take_their_part_of_what_remains() {
        let l = AnnouncedLimits::new();
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
}
