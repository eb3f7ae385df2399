//! Pacing by the limits a server announces ([`AnnouncedLimits`]): what remains of each
//! announced window is spread until its reset, instead of being spent at once and met
//! with 429s; a remaining of 0 holds every attempt until the reset.
//!
//! Every answer's announcements ([`super::announced::read_announced`]) update the policies
//! they name ([`AnnouncedLimits::observe`]); every attempt waits for each known policy
//! ([`AnnouncedLimits::wait`]), which takes one of its remaining calls and spaces starts
//! `time to reset / remaining` apart. The adaptive controller and `--rate` apply beside it,
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::announced::Announced;

/// A reset this much later than the known one starts a new window (servers round resets
/// to whole seconds).
pub const NEW_WINDOW_AFTER: Duration = Duration::from_millis(1100);

/// The longest wait an announcement can impose (a reset further away is read as this).
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The limits the API announced, and the pacing they impose.
#[derive(Debug, Default)]
pub struct AnnouncedLimits {
    policies: Mutex<HashMap<String, Policy>>,
    in_flight: Arc<AtomicU64>,
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
}

impl PolicyState {
    /// The words a progress line or `status` gives it.
    pub fn render(&self) -> String {
        let of = self.limit.map(|l| format!(" of {l}")).unwrap_or_default();
        format!(
            "API limit {}: {}{of} left, resets in {:.1}s",
            self.policy,
            self.remaining,
            self.reset_in.as_secs_f64()
        )
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
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
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
                        },
                    );
                }
            }
        }
    }

    /// Wait until every announced policy allows a call, and take one from each.
    pub async fn wait(&self) -> PacedCall {
        loop {
            let until = {
                let now = Instant::now();
                let in_flight = self.in_flight.load(Relaxed);
                let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
                if policies.is_empty() {
                    return PacedCall(None);
                }
                policies.retain(|_, p| p.roll(now, in_flight));
                let until = policies.values().filter_map(|p| p.free_at(now)).max();
                if until.is_none() {
                    for p in policies.values_mut() {
                        p.take(now);
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
        let policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        let mut states: Vec<PolicyState> = policies
            .iter()
            .map(|(name, p)| PolicyState {
                policy: name.clone(),
                remaining: p.remaining,
                limit: p.limit,
                reset_in: p.reset_at.saturating_duration_since(now),
            })
            .collect();
        states.sort_by(|a, b| a.policy.cmp(&b.policy));
        states
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
                self.remaining = limit.saturating_sub(in_flight);
                true
            }
            // Nothing known of the next window: free until an answer says more.
            _ => false,
        }
    }

    /// When the next call may start, if not now: at the reset when nothing remains, else
    /// at its paced start.
    fn free_at(&self, now: Instant) -> Option<Instant> {
        if self.remaining == 0 {
            return Some(self.reset_at);
        }
        (self.next_start > now).then_some(self.next_start)
    }

    /// Take one call, and space the next: what remains spread until the reset.
    fn take(&mut self, now: Instant) {
        let interval = self.reset_at.saturating_duration_since(now) / self.remaining as u32;
        self.remaining -= 1;
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
}
