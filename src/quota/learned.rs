//! Quota windows nobody announces, learnt from the API's refusals ([`Learner`]).
//!
//! Most APIs publish their quota on a web page, not in headers. Such a window shows itself
//! only when it refuses: a 429 whose `Retry-After` points at the window's end. The learner
//! reads the refusals and the calls the API accepted (pure functions over millisecond
//! timestamps; the pacer, [`super::pacer`], keeps the clock and paces by what was learnt as
//! by an announced window):
//!
//! - Refusals whose resets (the answer's time plus its `Retry-After`) lie within
//!   [`SAME_BOUNDARY`] of each other form an *episode*: the API says the same window is spent
//!   until a common boundary `B` (the earliest of their resets: `Retry-After` is rounded up).
//! - An episode a window the run knows accounts for (its reset within [`SAME_BOUNDARY`] of `B`,
//!   and at least half its limit accepted since it began) is *explained*: a learnt window
//!   whose calls accepted are fewer than its limit is lowered ([`lowered`]), and starts its
//!   next window where the refusal says.
//! - Otherwise a window not known yet is spent. Its *candidate* runs from the last boundary of
//!   such an episode (or the run's first call) `S` to `B`: `calls accepted in [S, first
//!   refusal)` per `B - S`. A candidate is learnt once two refusals back it, never on one:
//!   the episode's second refusal, or a later episode alone whose candidate has the same
//!   length (within [`SAME_BOUNDARY`]). A learnt window of the same length as one known is
//!   that one, seen at another phase: it replaces it.
//!
//! What is learnt is relaxed again when the API accepts more: the pacer raises a learnt
//! window's limit by a tenth ([`relaxed`]) after [`RELAX_AFTER`] windows in a row that the run
//! used whole without a refusal; a refusal explained by it lowers it back.
//!
//! The accepted calls are kept for [`KEEP_MS`] (at most [`KEEP_CALLS`] of them): a window
//! longer than that is learnt from the calls kept, so its limit reads low (a safe error,
//! relaxed later).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Resets this close are the same boundary (`Retry-After` is whole seconds, rounded up).
pub(crate) const SAME_BOUNDARY: u64 = 1100;

/// The shortest window learnt (ms): a shorter one is the API's burst, the throttle's matter.
pub(crate) const MIN_LENGTH: u64 = 500;

/// How long accepted calls are kept for counting (ms).
pub(crate) const KEEP_MS: u64 = 3_600_000;

/// How many accepted calls are kept at most.
pub(crate) const KEEP_CALLS: usize = 1 << 18;

/// Windows used whole in a row, with no refusal, after which a learnt limit is raised.
pub(crate) const RELAX_AFTER: u32 = 3;

/// A window learnt from refusals: `limit` calls per `length_ms`, its current window ending at
/// `reset_ms`, and how many refusals it was learnt or confirmed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LearnedWindow {
    /// Calls the window allows.
    pub(crate) limit: u64,
    /// The window's length (ms).
    pub(crate) length_ms: u64,
    /// When its current window ends (ms, on the learner's clock).
    pub(crate) reset_ms: u64,
    /// The refusals it was learnt (and confirmed) from.
    pub(crate) refusals: u64,
}

/// A window the run knows as the learner is asked about a refusal: a learnt one (`key`) or an
/// announced one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Known {
    /// The learnt window's key; none for an announced one.
    pub(crate) learned: Option<u64>,
    /// When its current window ends (ms).
    pub(crate) reset_ms: u64,
    /// Its length (ms), if known.
    pub(crate) length_ms: Option<u64>,
    /// Its limit, if known.
    pub(crate) limit: Option<u64>,
}

/// What a refusal taught.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lesson {
    /// A window not known yet; it replaces the learnt window `replaces` (the same length at
    /// another phase), if any.
    Window {
        /// The learnt window it replaces.
        replaces: Option<u64>,
        /// The window.
        window: LearnedWindow,
    },
    /// The refusal is the learnt window `key`'s, spent with `accepted` calls: its limit is
    /// at most that (lowered if it was more).
    Spent {
        /// The learnt window.
        key: u64,
        /// Calls it accepted before the refusal.
        accepted: u64,
    },
}

/// One cluster of refusals pointing at a common boundary.
#[derive(Debug, Clone, Copy)]
struct Episode {
    reset_ms: u64,
    refusals: u32,
    /// Whether a window was learnt (or the refusals explained) already.
    settled: bool,
}

/// Reads refusals and accepted calls; says what they teach ([`Lesson`]).
#[derive(Debug, Default)]
pub(crate) struct Learner {
    /// When accepted calls started (ms), in order.
    accepted: VecDeque<u64>,
    first_call: Option<u64>,
    episode: Option<Episode>,
    /// The boundary of the last episode no known window explained.
    last_unexplained: Option<u64>,
    /// A candidate backed by one refusal, waiting for a second.
    pending: Option<LearnedWindow>,
}

impl Learner {
    #[cfg(test)]
    /// A learner that has seen nothing.
    pub(crate) fn new() -> Learner {
        Learner::default()
    }

    /// A call started at `at_ms` was accepted (answered, not refused for the rate).
    pub(crate) fn accepted(&mut self, at_ms: u64) {
        self.first_call = Some(self.first_call.map_or(at_ms, |f| f.min(at_ms)));
        let pos = self.accepted.partition_point(|&t| t <= at_ms);
        self.accepted.insert(pos, at_ms);
        let newest = self.accepted.back().copied().unwrap_or(at_ms);
        while self.accepted.len() > KEEP_CALLS
            || self.accepted.front().is_some_and(|&t| t + KEEP_MS < newest)
        {
            self.accepted.pop_front();
        }
    }

    /// Calls accepted in `[from_ms, to_ms)`.
    fn count(&self, from_ms: u64, to_ms: u64) -> u64 {
        let a = self.accepted.partition_point(|&t| t < from_ms);
        let b = self.accepted.partition_point(|&t| t < to_ms);
        b.saturating_sub(a) as u64
    }

    /// A call started at `at_ms` was refused for the rate, the API saying it may try again at
    /// `reset_ms`; `known` are the windows the run knows, as they stand. Returns what it
    /// teaches, if anything.
    pub(crate) fn refused(&mut self, at_ms: u64, reset_ms: u64, known: &[Known]) -> Option<Lesson> {
        self.first_call = Some(self.first_call.map_or(at_ms, |f| f.min(at_ms)));
        match &mut self.episode {
            Some(e) if e.reset_ms.abs_diff(reset_ms) <= SAME_BOUNDARY => {
                e.refusals += 1;
                e.reset_ms = e.reset_ms.min(reset_ms);
                if e.settled {
                    return None;
                }
                // The episode's second refusal backs its candidate.
                e.settled = true;
                let mut window = self.pending.take()?;
                window.refusals = u64::from(e.refusals);
                return Some(self.lesson(window, known));
            }
            _ => {}
        }
        self.episode = Some(Episode {
            reset_ms,
            refusals: 1,
            settled: false,
        });
        if let Some(lesson) = self.explained(at_ms, reset_ms, known) {
            self.settle();
            return lesson;
        }
        // A window not known yet: its candidate since the last such boundary.
        let since = match (self.last_unexplained, self.first_call) {
            (Some(b), Some(f)) => b.max(f),
            (b, f) => b.or(f).unwrap_or(at_ms),
        };
        self.last_unexplained = Some(reset_ms);
        let length_ms = reset_ms.saturating_sub(since);
        let limit = self.count(since, at_ms);
        if length_ms < MIN_LENGTH || limit == 0 {
            self.pending = None;
            return None;
        }
        let candidate = LearnedWindow {
            limit,
            length_ms,
            reset_ms,
            refusals: 1,
        };
        match self.pending.replace(candidate) {
            // A second episode alone finds a window of the same length: two refusals back it.
            Some(earlier) if earlier.length_ms.abs_diff(length_ms) <= SAME_BOUNDARY => {
                self.pending = None;
                self.settle();
                let window = LearnedWindow {
                    refusals: earlier.refusals + 1,
                    ..candidate
                };
                Some(self.lesson(window, known))
            }
            _ => None,
        }
    }

    fn settle(&mut self) {
        if let Some(e) = &mut self.episode {
            e.settled = true;
        }
    }

    /// Whether a known window accounts for a refusal at `at_ms` until `reset_ms`: `Some` of
    /// what it teaches then (nothing for an announced window).
    fn explained(&self, at_ms: u64, reset_ms: u64, known: &[Known]) -> Option<Option<Lesson>> {
        for k in known {
            if k.reset_ms.abs_diff(reset_ms) > SAME_BOUNDARY {
                continue;
            }
            let Some(key) = k.learned else {
                return Some(None);
            };
            let (Some(length), Some(limit)) = (k.length_ms, k.limit) else {
                continue;
            };
            let accepted = self.count(k.reset_ms.saturating_sub(length), at_ms);
            if 2 * accepted >= limit {
                return Some(Some(Lesson::Spent { key, accepted }));
            }
        }
        None
    }

    /// The lesson a backed candidate gives: a new window, or one replacing the learnt window
    /// of the same length.
    fn lesson(&self, window: LearnedWindow, known: &[Known]) -> Lesson {
        let replaces = known
            .iter()
            .filter(|k| {
                k.length_ms
                    .is_some_and(|l| l.abs_diff(window.length_ms) <= SAME_BOUNDARY)
            })
            .find_map(|k| k.learned);
        Lesson::Window { replaces, window }
    }
}

/// A learnt limit lowered after a refusal of its window with `accepted` calls accepted in
/// it: by a tenth (at least one call), never below what was accepted. (The learnt window's
/// phase is the refusals', rounded to whole seconds: what it counts is no exact count of the
/// API's window, so one refusal does not cut it to that count.)
pub(crate) fn lowered(limit: u64, accepted: u64) -> u64 {
    limit
        .saturating_sub((limit / 10).max(1))
        .max(accepted)
        .max(1)
}

/// A learnt limit raised by a tenth (at least one call): the API accepted it whole for
/// [`RELAX_AFTER`] windows without a refusal.
pub(crate) fn relaxed(limit: u64) -> u64 {
    limit + (limit / 10).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls accepted every `every` ms in `[from, to)`.
    fn calls(l: &mut Learner, from: u64, to: u64, every: u64) {
        let mut t = from;
        while t < to {
            l.accepted(t);
            t += every;
        }
    }

    #[test]
    fn one_refusal_teaches_nothing_two_at_one_boundary_teach_a_window() {
        let mut l = Learner::new();
        // 50 calls in [0, 500), then refused until 2000 (Retry-After rounded up: 2100).
        calls(&mut l, 0, 500, 10);
        assert_eq!(l.refused(510, 2100, &[]), None);
        let lesson = l.refused(520, 2090, &[]);
        assert_eq!(
            lesson,
            Some(Lesson::Window {
                replaces: None,
                window: LearnedWindow {
                    limit: 50,
                    length_ms: 2100,
                    reset_ms: 2100,
                    refusals: 2,
                }
            })
        );
        // Further refusals of the episode teach nothing more.
        assert_eq!(l.refused(530, 2080, &[]), None);
    }

    #[test]
    fn lone_refusals_at_windows_of_one_length_teach_it() {
        let mut l = Learner::new();
        // 200 per 10 s, one refusal each time (the run holds at the first).
        calls(&mut l, 0, 8000, 40);
        assert_eq!(l.refused(8000, 10_000, &[]), None);
        calls(&mut l, 10_000, 18_000, 40);
        let lesson = l.refused(18_000, 20_000, &[]);
        let Some(Lesson::Window { window, .. }) = lesson else {
            panic!("{lesson:?}");
        };
        assert_eq!((window.limit, window.length_ms), (200, 10_000));
        assert_eq!((window.reset_ms, window.refusals), (20_000, 2));
    }

    #[test]
    fn lone_refusals_of_different_lengths_teach_nothing() {
        let mut l = Learner::new();
        calls(&mut l, 0, 3000, 40);
        assert_eq!(l.refused(3000, 4000, &[]), None);
        calls(&mut l, 4000, 10_000, 40);
        assert_eq!(l.refused(10_000, 13_000, &[]), None);
    }

    #[test]
    fn a_known_window_explains_a_refusal_and_fewer_accepted_lower_it() {
        let mut l = Learner::new();
        calls(&mut l, 2000, 3800, 40); // 45 calls
        let learnt = Known {
            learned: Some(7),
            reset_ms: 4000,
            length_ms: Some(2000),
            limit: Some(50),
        };
        assert_eq!(
            l.refused(3800, 4050, &[learnt]),
            Some(Lesson::Spent {
                key: 7,
                accepted: 45
            })
        );
        // An announced window at that boundary explains it and teaches nothing.
        let mut l = Learner::new();
        calls(&mut l, 2000, 3800, 40);
        let announced = Known {
            learned: None,
            ..learnt
        };
        assert_eq!(l.refused(3800, 4050, &[announced]), None);
        assert_eq!(l.refused(3810, 4040, &[announced]), None);
    }

    #[test]
    fn a_window_barely_used_does_not_explain_another_windows_refusal() {
        let mut l = Learner::new();
        // A learnt 50 per 2 s; the hidden 10 s window refuses right at a 2 s boundary.
        calls(&mut l, 0, 8000, 40);
        let learnt = Known {
            learned: Some(1),
            reset_ms: 10_000,
            length_ms: Some(2000),
            limit: Some(50),
        };
        assert_eq!(l.refused(8000, 10_000, &[learnt]), None);
        let lesson = l.refused(8010, 10_000, &[learnt]);
        let Some(Lesson::Window { replaces, window }) = lesson else {
            panic!("{lesson:?}");
        };
        assert_eq!(replaces, None);
        assert_eq!((window.limit, window.length_ms), (200, 10_000));
    }

    #[test]
    fn a_window_of_a_learnt_length_replaces_it() {
        let mut l = Learner::new();
        calls(&mut l, 0, 1000, 20);
        let learnt = Known {
            learned: Some(3),
            reset_ms: 9000,
            length_ms: Some(2300),
            limit: Some(60),
        };
        l.refused(1000, 2000, &[learnt]);
        let lesson = l.refused(1010, 2000, &[learnt]);
        assert!(matches!(
            lesson,
            Some(Lesson::Window {
                replaces: Some(3),
                ..
            })
        ));
    }

    #[test]
    fn nothing_accepted_or_too_short_teaches_nothing() {
        let mut l = Learner::new();
        // Refused from the first call: no count to learn.
        assert_eq!(l.refused(0, 2000, &[]), None);
        assert_eq!(l.refused(5, 2000, &[]), None);
        let mut l = Learner::new();
        calls(&mut l, 0, 100, 10);
        assert_eq!(l.refused(100, 300, &[]), None);
        assert_eq!(l.refused(110, 300, &[]), None);
    }

    #[test]
    fn old_calls_are_forgotten_and_relaxing_adds_a_tenth() {
        let mut l = Learner::new();
        calls(&mut l, 0, KEEP_MS + 10_000, 1000);
        assert!(l.accepted.front().is_some_and(|&t| t >= 9_000));
        assert_eq!(l.count(0, 5_000), 0);
        assert_eq!(relaxed(200), 220);
        assert_eq!(relaxed(5), 6);
        assert_eq!(lowered(220, 100), 198);
        assert_eq!(lowered(220, 210), 210);
        assert_eq!(lowered(1, 0), 1);
        // Out of order answers are counted in order.
        let mut l = Learner::new();
        l.accepted(30);
        l.accepted(10);
        l.accepted(20);
        assert_eq!(l.count(15, 31), 2);
    }
}
