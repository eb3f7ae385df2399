//! The quota usage stored with a job ([`QuotaLedger`]) and the one way it changes: a
//! reservation ([`QuotaLedger::reserve`]), which every store applies atomically and durably.
//!
//! Usage is kept per quota (by [`Quota::key`]: its unit and window, so a changed limit keeps
//! the count), as the calls (units) reserved in each slot that still counts. Calls are reserved *before* they are made,
//! a few at a time ([`chunk`]): a run killed at any moment has made at most what the ledger
//! holds, so a resume (or another worker of a fleet, which reserves from the same ledger)
//! never exceeds a window. What a killed run reserved and did not use stays counted until
//! its slot stops counting: at most a chunk per window per worker.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::spec::{Quota, Window};
use super::state::QuotaState;

/// The job's quota usage: per window key, the slots that count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaLedger {
    /// Per window key, the slots in use (oldest first).
    pub windows: BTreeMap<String, Vec<SlotUse>>,
}

/// Calls reserved in one slot of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotUse {
    /// The slot's start (Unix ms; 0 for the job window).
    pub start_ms: u64,
    /// Calls reserved in the slot.
    pub used: u64,
}

/// What a reservation asks of one quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaWant {
    /// The quota.
    pub quota: Quota,
    /// Calls wanted in its current slot.
    pub calls: u64,
    /// Calls (units) given back first: reserved before in the slot starting at its
    /// `start_ms` and not spent (a run ending with calls in hand, calls that cost less than
    /// they held). Never more than the slot holds; nothing once the slot stopped counting.
    pub give_back: Option<SlotUse>,
}

impl QuotaWant {
    /// `calls` of `quota`, nothing given back.
    pub fn new(quota: Quota, calls: u64) -> QuotaWant {
        QuotaWant {
            quota,
            calls,
            give_back: None,
        }
    }
}

/// What a reservation got of one quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaGrant {
    /// Calls reserved (at most those wanted).
    pub calls: u64,
    /// Calls counted in the window after the reservation, by every run and worker.
    pub used: u64,
    /// The slot reserved in (Unix ms).
    pub slot_ms: u64,
    /// When (Unix ms) the window frees calls next, if it ever does: the earliest counted
    /// slot's end.
    pub frees_at_ms: Option<u64>,
}

/// How many calls a worker reserves at a time: a fiftieth of the limit, between 1 and
/// 1000, so a kill wastes at most 2% of a window and a busy run writes its ledger rarely.
pub fn chunk(quota: &Quota) -> u64 {
    (quota.limit / 50).clamp(1, 1000)
}

impl QuotaLedger {
    /// Calls (units) counted against `quota`'s window at `now_ms`.
    pub fn used(&self, quota: &Quota, now_ms: u64) -> u64 {
        self.windows.get(&quota.key()).map_or(0, |slots| {
            counted(slots, &quota.window, now_ms).map(|s| s.used).sum()
        })
    }

    /// Where `quota` stands at `now_ms`, as stored.
    pub fn state(&self, quota: &Quota, now_ms: u64) -> QuotaState {
        let window = quota.window;
        let slots = self.windows.get(&quota.key());
        let first = slots
            .into_iter()
            .flatten()
            .filter(|s| window.counts(s.start_ms, now_ms))
            .map(|s| s.start_ms)
            .min();
        let used = self.used(quota, now_ms);
        QuotaState {
            quota: quota.to_string(),
            limit: quota.limit,
            used,
            frees_at_ms: first.and_then(|start| window.frees_at(start)),
            window_ms: window.length().map(|l| l.as_millis() as u64),
            exhausted: used >= quota.limit,
            unit: quota.unit,
        }
    }

    /// Reserve, for each want, as many of its calls as its limit leaves in its window at
    /// `now_ms`, in the current slot; drop the slots that stopped counting.
    pub fn reserve(&mut self, wants: &[QuotaWant], now_ms: u64) -> Vec<QuotaGrant> {
        wants
            .iter()
            .map(|want| {
                let window = want.quota.window;
                let slots = self.windows.entry(want.quota.key()).or_default();
                slots.retain(|s| window.counts(s.start_ms, now_ms));
                if let Some(back) = want.give_back {
                    if let Some(s) = slots.iter_mut().find(|s| s.start_ms == back.start_ms) {
                        s.used = s.used.saturating_sub(back.used);
                    }
                    slots.retain(|s| s.used > 0);
                }
                let used: u64 = slots.iter().map(|s| s.used).sum();
                let calls = want.calls.min(want.quota.limit.saturating_sub(used));
                let (slot_ms, _) = window.slot(now_ms);
                match slots.iter_mut().find(|s| s.start_ms == slot_ms) {
                    Some(s) => s.used += calls,
                    None if calls > 0 => slots.push(SlotUse {
                        start_ms: slot_ms,
                        used: calls,
                    }),
                    None => {}
                }
                let frees_at_ms = slots.iter().map(|s| s.start_ms).min().unwrap_or(slot_ms);
                QuotaGrant {
                    calls,
                    used: used + calls,
                    slot_ms,
                    frees_at_ms: window.frees_at(frees_at_ms),
                }
            })
            .collect()
    }
}

fn counted<'a>(
    slots: &'a [SlotUse],
    window: &'a Window,
    now_ms: u64,
) -> impl Iterator<Item = &'a SlotUse> + 'a {
    slots
        .iter()
        .filter(move |s| window.counts(s.start_ms, now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(q: &str, calls: u64) -> QuotaWant {
        QuotaWant::new(q.parse().unwrap(), calls)
    }

    #[test]
    fn calls_given_back_free_their_slot_never_below_nothing() {
        let mut l = QuotaLedger::default();
        let budget = want("100/job", 60);
        l.reserve(&[budget], 5);
        let back = |used| QuotaWant {
            give_back: Some(SlotUse { start_ms: 0, used }),
            ..want("100/job", 0)
        };
        let g = l.reserve(&[back(25)], 6);
        assert_eq!((g[0].calls, g[0].used), (0, 35));
        // More than the slot holds: it is emptied, never below.
        assert_eq!(l.reserve(&[back(500)], 7)[0].used, 0);
        // A slot that stopped counting takes nothing back.
        l.reserve(&[want("5/2s", 5)], 1_000_000);
        let late = QuotaWant {
            give_back: Some(SlotUse {
                start_ms: 1_000_000,
                used: 5,
            }),
            ..want("5/2s", 1)
        };
        let g = l.reserve(&[late], 1_002_000);
        assert_eq!((g[0].calls, g[0].used), (1, 1));
    }

    #[test]
    fn a_fixed_window_grants_up_to_its_limit_then_resets_on_its_boundary() {
        let mut l = QuotaLedger::default();
        let t = 1_000_000;
        let g = l.reserve(&[want("5/2s", 3)], t);
        assert_eq!((g[0].calls, g[0].used, g[0].slot_ms), (3, 3, 1_000_000));
        let g = l.reserve(&[want("5/2s", 3)], t + 1999);
        assert_eq!((g[0].calls, g[0].used), (2, 5));
        assert_eq!(g[0].frees_at_ms, Some(1_002_000));
        assert_eq!(l.reserve(&[want("5/2s", 3)], t + 1999)[0].calls, 0);
        let g = l.reserve(&[want("5/2s", 3)], t + 2000);
        assert_eq!((g[0].calls, g[0].used), (3, 3));
        // The old slot was dropped.
        assert_eq!(l.windows["2s"].len(), 1);
        assert_eq!(l.used(&want("5/2s", 0).quota, t + 2000), 3);
        // Tokens over the same window are counted apart.
        l.reserve(&[want("100tokens/2s", 40)], t + 2000);
        assert_eq!(l.used(&want("5/2s", 0).quota, t + 2000), 3);
        assert_eq!(l.used(&want("100tokens/2s", 0).quota, t + 2000), 40);
    }

    #[test]
    fn a_changed_limit_keeps_the_count_and_the_job_window_never_resets() {
        let mut l = QuotaLedger::default();
        assert_eq!(l.reserve(&[want("10/job", 10)], 5)[0].calls, 10);
        assert_eq!(l.reserve(&[want("10/job", 1)], u64::MAX / 2)[0].calls, 0);
        let g = l.reserve(&[want("15/job", 10)], u64::MAX / 2);
        assert_eq!((g[0].calls, g[0].used, g[0].frees_at_ms), (5, 15, None));
    }

    #[test]
    fn a_rolling_window_frees_its_oldest_slot_first() {
        let mut l = QuotaLedger::default();
        // Slots of 500 ms; 4 calls at 0.2 s, 6 at 3.1 s.
        l.reserve(&[want("10/10s,rolling", 4)], 200);
        let g = l.reserve(&[want("10/10s,rolling", 8)], 3_100);
        assert_eq!((g[0].calls, g[0].used), (6, 10));
        assert_eq!(g[0].frees_at_ms, Some(10_500));
        assert_eq!(l.reserve(&[want("10/10s,rolling", 1)], 10_499)[0].calls, 0);
        let g = l.reserve(&[want("10/10s,rolling", 8)], 10_500);
        assert_eq!((g[0].calls, g[0].used), (4, 10));
    }

    #[test]
    fn the_ledger_round_trips_through_json() {
        let mut l = QuotaLedger::default();
        l.reserve(&[want("5/2s", 3), want("100/job", 3)], 1_000_000);
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<QuotaLedger>(&json).unwrap(), l);
    }

    #[test]
    fn chunks_are_a_fiftieth_between_1_and_1000() {
        assert_eq!(chunk(&"50/2s".parse().unwrap()), 1);
        assert_eq!(chunk(&"10000/h".parse().unwrap()), 200);
        assert_eq!(chunk(&"100000000/day".parse().unwrap()), 1000);
    }
}
