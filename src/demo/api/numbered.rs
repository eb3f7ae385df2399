//! Call counts of numbered IDs ([`ApiConfig::numbered_ids`](super::ApiConfig::numbered_ids)):
//! one byte per ID, indexed by its number, for jobs too large to count by name. The IDs are
//! those the bench and the tests write, `id-` and the number zero-padded to nine digits
//! (`id-000000042`); 100 million of them take 100 MB here, where a map of their names takes
//! about 10 GB. A count stops at 255.

use std::sync::atomic::{AtomicU8, Ordering};

/// The prefix of a numbered ID.
const PREFIX: &str = "id-";

/// The digits of a numbered ID's number, at least (zero-padded below 10^9).
const DIGITS: usize = 9;

/// One saturating byte per numbered ID.
pub(super) struct Numbered {
    counts: Box<[AtomicU8]>,
}

impl Numbered {
    /// Counters for the IDs numbered 0 to `ids - 1` (none for 0).
    pub(super) fn new(ids: u64) -> Numbered {
        let ids = usize::try_from(ids).expect("numbered_ids fits in memory");
        Numbered {
            counts: (0..ids).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// `id`'s number, if it is a numbered ID written as the bench writes them and has a
    /// counter here.
    pub(super) fn index(&self, id: &str) -> Option<usize> {
        if self.counts.is_empty() {
            return None;
        }
        let digits = id.strip_prefix(PREFIX)?;
        // One spelling per number: `id-0000000042` is another ID than `id-000000042`.
        let canonical =
            digits.len() == DIGITS || (digits.len() > DIGITS && !digits.starts_with('0'));
        if !canonical || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let number: usize = digits.parse().ok()?;
        (number < self.counts.len()).then_some(number)
    }

    /// Counts one call of the ID numbered `index`; returns its calls so far (at most 255).
    pub(super) fn record(&self, index: usize) -> u64 {
        let counter = &self.counts[index];
        let before = counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1))
            .unwrap_or(u8::MAX);
        u64::from(before.saturating_add(1))
    }

    /// The calls of the ID numbered `index` (at most 255).
    pub(super) fn get(&self, index: usize) -> u64 {
        u64::from(self.counts[index].load(Ordering::Relaxed))
    }

    /// The numbered IDs called at least `calls` times.
    pub(super) fn called_at_least(&self, calls: u8) -> usize {
        self.counts
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) >= calls)
            .count()
    }

    /// Every numbered ID called, with its calls.
    pub(super) fn called(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        self.counts.iter().enumerate().filter_map(|(i, c)| {
            let calls = c.load(Ordering::Relaxed);
            (calls > 0).then(|| (format!("{PREFIX}{i:0DIGITS$}"), u64::from(calls)))
        })
    }
}
