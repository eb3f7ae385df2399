//! Counting calls: per-ID call counts and call timestamps, sharded by ID hash so concurrent
//! connections rarely contend; numbered IDs counted apart, a byte each (`numbered`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use xxhash_rust::xxh3::xxh3_64;

use super::lock::lock;
use super::numbered::Numbered;

/// Number of independently locked shards of the call counter.
pub(super) const SHARDS: usize = 32;

/// At most this many call timestamps are kept (those of the first `MAX_CALL_TIMES`
/// counted calls; later calls are still counted but not timestamped). Each costs 16
/// bytes, so the cap bounds that memory to 80 MB.
pub const MAX_CALL_TIMES: usize = 5_000_000;

/// Per-ID call counts and call timestamps, sharded by ID hash so concurrent connections
/// rarely contend.
pub(super) struct CallCounter {
    shards: Box<[Mutex<Shard>]>,
    /// The calls of the numbered IDs ([`super::ApiConfig::numbered_ids`]), which the
    /// shards' maps then leave out.
    numbered: Numbered,
    total: AtomicU64,
    /// Timestamps are nanoseconds since this instant.
    base: Instant,
    /// Only the first `time_cap` calls are timestamped ([`MAX_CALL_TIMES`]).
    time_cap: u64,
}

#[derive(Default)]
pub(super) struct Shard {
    /// Calls per ID (but the numbered ones).
    counts: HashMap<String, u64>,
    /// Calls per ID rejected by the hidden capacity; empty unless one was.
    rejected: HashMap<String, u64>,
    /// (ID hash, nanoseconds since `base`) of the calls of this shard's IDs, unsorted.
    times: Vec<(u64, u64)>,
}

impl CallCounter {
    /// A counter whose IDs numbered below `numbered_ids` are counted a byte each.
    pub(super) fn new(numbered_ids: u64) -> Self {
        Self::with_time_cap(MAX_CALL_TIMES, numbered_ids)
    }

    pub(super) fn with_time_cap(time_cap: usize, numbered_ids: u64) -> Self {
        CallCounter {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            numbered: Numbered::new(numbered_ids),
            total: AtomicU64::new(0),
            base: Instant::now(),
            time_cap: time_cap as u64,
        }
    }

    pub(super) fn shard(&self, id_hash: u64) -> MutexGuard<'_, Shard> {
        lock(&self.shards[(id_hash % SHARDS as u64) as usize])
    }

    /// Counts one call made at `at` (`admitted` = it passed the hidden capacity) and
    /// returns its attempt number: the number of admitted calls for the ID so far,
    /// including this one if admitted (1 for the first call when there is no capacity).
    pub(super) fn record(&self, id: &str, id_hash: u64, admitted: bool, at: Instant) -> u64 {
        let index = self.total.fetch_add(1, Ordering::Relaxed);
        let nanos = duration_nanos(at.saturating_duration_since(self.base));
        let mut shard = self.shard(id_hash);
        if index < self.time_cap {
            shard.times.push((id_hash, nanos));
        }
        let count = match self.numbered.index(id) {
            Some(number) => self.numbered.record(number),
            None => match shard.counts.get_mut(id) {
                Some(count) => {
                    *count += 1;
                    *count
                }
                None => {
                    shard.counts.insert(id.to_owned(), 1);
                    1
                }
            },
        };
        if !admitted {
            *shard.rejected.entry(id.to_owned()).or_insert(0) += 1;
        }
        if shard.rejected.is_empty() {
            count
        } else {
            count.saturating_sub(shard.rejected.get(id).copied().unwrap_or(0))
        }
    }

    pub(super) fn get(&self, id: &str) -> u64 {
        if let Some(number) = self.numbered.index(id) {
            return self.numbered.get(number);
        }
        let shard = self.shard(xxh3_64(id.as_bytes()));
        shard.counts.get(id).copied().unwrap_or(0)
    }

    /// Calls for `id` not refused ([`CallCounter::record`]'s `admitted`).
    pub(super) fn admitted(&self, id: &str) -> u64 {
        let calls = self.get(id);
        let shard = self.shard(xxh3_64(id.as_bytes()));
        calls.saturating_sub(shard.rejected.get(id).copied().unwrap_or(0))
    }

    pub(super) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub(super) fn distinct(&self) -> usize {
        self.numbered.called_at_least(1)
            + self
                .shards
                .iter()
                .map(|s| lock(s).counts.len())
                .sum::<usize>()
    }

    /// IDs called more than once.
    pub(super) fn repeated(&self) -> usize {
        self.numbered.called_at_least(2)
            + self
                .shards
                .iter()
                .map(|s| lock(s).counts.values().filter(|&&c| c > 1).count())
                .sum::<usize>()
    }

    pub(super) fn snapshot(&self) -> HashMap<String, u64> {
        let mut all = HashMap::with_capacity(self.distinct());
        all.extend(self.numbered.called());
        for shard in self.shards.iter() {
            all.extend(lock(shard).counts.iter().map(|(k, v)| (k.clone(), *v)));
        }
        all
    }

    /// Every recorded timestamp (nanoseconds since `base`), unsorted.
    pub(super) fn all_times(&self) -> Vec<u64> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            all.reserve(shard.times.len());
            all.extend(shard.times.iter().map(|&(_, t)| t));
        }
        all
    }

    /// The recorded timestamps of the ID with this hash, unsorted.
    pub(super) fn id_times(&self, id_hash: u64) -> Vec<u64> {
        let shard = self.shard(id_hash);
        shard
            .times
            .iter()
            .filter(|&&(h, _)| h == id_hash)
            .map(|&(_, t)| t)
            .collect()
    }

    /// `nanos` since the base as instants (tokio's time, as std's type).
    pub(super) fn to_instants(&self, nanos: Vec<u64>) -> Vec<std::time::Instant> {
        nanos
            .into_iter()
            .map(|n| (self.base + Duration::from_nanos(n)).into_std())
            .collect()
    }
}

/// The largest number of `sorted` values within one half-open window `[t, t + window)`.
pub(super) fn max_in_window(sorted: &[u64], window: u64) -> usize {
    let mut best = 0;
    let mut start = 0;
    for (end, &t) in sorted.iter().enumerate() {
        while t - sorted[start] >= window && start < end {
            start += 1;
        }
        if t - sorted[start] < window {
            best = best.max(end + 1 - start);
        }
    }
    best
}

/// `d` in nanoseconds, saturating (at 584 years).
pub(super) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
