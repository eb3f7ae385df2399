//! The windows learnt from refusals as kept with the job ([`KeptLimit`]): a resume starts
//! pacing from them, and a fleet's workers share them, through the store
//! (`Store::keep_learned_limits`).
//!
//! - A kept limit is the fleet's: a worker's own learnt limit times the workers sharing the
//!   API when it was kept (a worker alone: its own). Each worker paces its part of it.
//! - Its phase is the Unix time its window then current ends; read later, it is rolled
//!   forward by whole windows ([`KeptLimit::reset_after`]).
//! - Lists merge by window length ([`merge`]): of two limits whose lengths are the same
//!   (within [`SAME_BOUNDARY`]), the one changed last wins, since each change (learnt,
//!   lowered after a refusal, relaxed after windows used whole) is news to the others.

use serde::{Deserialize, Serialize};

use super::learned::SAME_BOUNDARY;

/// A window learnt from the API's refusals, as the job keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptLimit {
    /// Calls the window allows the whole fleet.
    pub limit: u64,
    /// The window's length (ms).
    pub length_ms: u64,
    /// When (Unix ms) the window current when it was kept ends.
    pub reset_unix_ms: u64,
    /// The refusals it was learnt (and confirmed) from: the evidence.
    pub refusals: u64,
    /// When (Unix ms) it was learnt, lowered or relaxed last.
    pub changed_unix_ms: u64,
}

impl KeptLimit {
    /// When (Unix ms) its window current at `now_unix_ms` ends.
    pub fn reset_after(&self, now_unix_ms: u64) -> u64 {
        let length = self.length_ms.max(1);
        if self.reset_unix_ms > now_unix_ms {
            return self.reset_unix_ms;
        }
        let behind = now_unix_ms - self.reset_unix_ms;
        self.reset_unix_ms + (behind / length + 1) * length
    }

    /// Whether `other` is the same window (its length within `SAME_BOUNDARY`).
    pub fn same_window(&self, other: &KeptLimit) -> bool {
        self.length_ms.abs_diff(other.length_ms) <= SAME_BOUNDARY
    }

    /// The words `status` and the dashboard give it.
    pub fn render(&self) -> String {
        format!(
            "{} calls per {:.1}s, learnt from {} refusals",
            self.limit,
            self.length_ms as f64 / 1000.0,
            self.refusals
        )
    }
}

/// The most windows a job keeps: past it, those changed longest ago are dropped.
pub(super) const MAX_KEPT: usize = 8;

/// `kept` with `news` merged in: per window, the limit changed last; windows of `kept` first,
/// in their order, then new ones; at most `MAX_KEPT` (eight).
pub fn merge(kept: &[KeptLimit], news: &[KeptLimit]) -> Vec<KeptLimit> {
    let mut out = kept.to_vec();
    for n in news {
        match out.iter_mut().find(|k| k.same_window(n)) {
            Some(k) if n.changed_unix_ms > k.changed_unix_ms => *k = *n,
            Some(_) => {}
            None => out.push(*n),
        }
    }
    while out.len() > MAX_KEPT {
        let oldest = (0..out.len()).min_by_key(|&i| out[i].changed_unix_ms);
        out.remove(oldest.unwrap_or(0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(limit: u64, length_ms: u64, changed: u64) -> KeptLimit {
        KeptLimit {
            limit,
            length_ms,
            reset_unix_ms: 10_000,
            refusals: 2,
            changed_unix_ms: changed,
        }
    }

    #[test]
    fn a_kept_window_read_later_is_rolled_forward_by_whole_windows() {
        let k = kept(50, 2000, 0);
        assert_eq!(k.reset_after(9_000), 10_000);
        assert_eq!(k.reset_after(10_000), 12_000);
        assert_eq!(k.reset_after(15_500), 16_000);
    }

    #[test]
    fn lists_merge_per_window_the_limit_changed_last_winning() {
        let stored = [kept(50, 2000, 5), kept(200, 10_000, 5)];
        // Another worker lowered the 2 s window later, and learnt an hourly one.
        let news = [
            kept(45, 2100, 9),
            kept(1000, 3_600_000, 9),
            kept(300, 10_000, 1),
        ];
        let merged = merge(&stored, &news);
        assert_eq!(
            merged,
            vec![
                kept(45, 2100, 9),
                kept(200, 10_000, 5),
                kept(1000, 3_600_000, 9)
            ]
        );
        // Merging again changes nothing.
        assert_eq!(merge(&merged, &news), merged);
        assert_eq!(merge(&merged, &stored), merged);
    }

    #[test]
    fn a_kept_limit_says_its_evidence() {
        assert_eq!(
            kept(50, 2000, 0).render(),
            "50 calls per 2.0s, learnt from 2 refusals"
        );
    }
}
