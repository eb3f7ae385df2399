//! Quota windows the fake API enforces like a real API ([`ApiWindow`], in
//! [`super::ApiConfig::windows`]), and how it announces them in headers ([`Announce`]).
//!
//! Each window is fixed and aligned to the Unix epoch, as servers count "on the hour":
//! window `k` of a definition covers `[k * length, (k + 1) * length)` of the wall clock
//! since 1970, counted in milliseconds (so tests can shorten a day to seconds). A request
//! reaching the item routes counts in every window at its arrival; one that finds any window
//! at its limit answers 429 `{"error":"quota exceeded"}` with a `Retry-After` of the whole
//! seconds until that window resets (rounded up, at least 1; of the window resetting last
//! when several are full) and counts in none.
//!
//! These windows are apart from the hidden capacity (`capacity`: a token bucket, 429
//! `rate limited`), which comes after them: a request the windows let through counts in
//! them even when the capacity then refuses it, as a real API counts every request it
//! receives.
//!
//! Announcing ([`Announce`]) puts headers on every answer the item routes make (2xx, 4xx,
//! 5xx and 429 alike), computed when the answer leaves: `w` and `t` in whole seconds rounded
//! up, and epoch resets rounded up too, so a client reading them never waits too little.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

/// One quota window: at most `limit` requests in each fixed window of `length`, aligned to
/// the Unix epoch. A `length` under a millisecond counts as one millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiWindow {
    /// Requests allowed per window.
    pub limit: u64,
    /// The window's length.
    pub length: Duration,
}

/// How the fake API announces its windows in the headers of its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Announce {
    /// No rate-limit headers.
    #[default]
    None,
    /// The IETF draft's `RateLimit-Policy` naming every window (`"w0";q=50;w=2, "w1";...`,
    /// named by position) and `RateLimit` with each one's remaining and seconds to reset
    /// (`"w0";r=49;t=2, ...`).
    Ietf,
    /// GitHub's `X-RateLimit-Limit`, `-Remaining`, `-Used` and `-Reset` (Unix epoch seconds)
    /// for the window with the least remaining (of those, the one resetting last).
    XRateLimit,
}

/// Refusals timestamped at most ([`Windows::refusal_times`]).
const MAX_REFUSAL_TIMES: usize = 100_000;

/// The windows' counts (in `Shared`): one lock over all of them, so a request is counted in
/// every window or in none.
pub(super) struct Windows {
    /// Whether any window is defined: lets the default path skip the lock.
    active: AtomicBool,
    state: Mutex<State>,
    /// Requests the windows refused.
    refusals: AtomicU64,
    /// When the first [`MAX_REFUSAL_TIMES`] refusals were made.
    refused_at: Mutex<Vec<std::time::Instant>>,
}

struct State {
    announce: Announce,
    windows: Vec<Counting>,
}

/// One window definition and the count of its current window.
struct Counting {
    limit: u64,
    /// The length in milliseconds, at least 1.
    length_ms: u64,
    /// The index `k` of the window `count` belongs to.
    index: u64,
    /// Requests accepted in window `index`.
    count: u64,
    /// The largest count any window of this definition reached.
    peak: u64,
}

impl Counting {
    fn new(window: &ApiWindow) -> Self {
        Counting {
            limit: window.limit,
            length_ms: u64::try_from(window.length.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            index: 0,
            count: 0,
            peak: 0,
        }
    }

    /// Moves to the window holding `now_ms`, empty if it is a new one.
    fn roll(&mut self, now_ms: u64) {
        let index = now_ms / self.length_ms;
        if index != self.index {
            self.index = index;
            self.count = 0;
        }
    }

    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.count)
    }

    /// When the current window ends, in milliseconds since the epoch.
    fn end_ms(&self) -> u128 {
        (u128::from(self.index) + 1) * u128::from(self.length_ms)
    }

    /// Milliseconds from `now_ms` (in the current window) to its end: at least 1.
    fn reset_ms(&self, now_ms: u64) -> u128 {
        self.end_ms().saturating_sub(u128::from(now_ms)).max(1)
    }
}

/// Whole seconds in `ms`, rounded up.
fn ceil_secs(ms: u128) -> u64 {
    u64::try_from(ms.div_ceil(1000)).unwrap_or(u64::MAX)
}

impl Windows {
    pub(super) fn new(windows: &[ApiWindow], announce: Announce) -> Self {
        Windows {
            active: AtomicBool::new(!windows.is_empty()),
            state: Mutex::new(State {
                announce,
                windows: windows.iter().map(Counting::new).collect(),
            }),
            refusals: AtomicU64::new(0),
            refused_at: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a request arriving at `now_ms` in every window, or refuses it (counting it in
    /// none) with the `Retry-After` seconds of the full window resetting last.
    pub(super) fn admit(&self, now_ms: u64) -> Result<(), u64> {
        if !self.active.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut state = self.lock();
        let mut retry_after = None;
        for window in &mut state.windows {
            window.roll(now_ms);
            if window.count >= window.limit {
                let secs = ceil_secs(window.reset_ms(now_ms)).max(1);
                retry_after = retry_after.max(Some(secs));
            }
        }
        if let Some(secs) = retry_after {
            self.refusals.fetch_add(1, Ordering::Relaxed);
            let mut at = self
                .refused_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if at.len() < MAX_REFUSAL_TIMES {
                at.push(tokio::time::Instant::now().into_std());
            }
            return Err(secs);
        }
        for window in &mut state.windows {
            window.count += 1;
            window.peak = window.peak.max(window.count);
        }
        Ok(())
    }

    /// Adds the announcing headers for the windows as they stand at `now_ms`.
    pub(super) fn announce(&self, headers: &mut HeaderMap, now_ms: u64) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.lock();
        let announce = state.announce;
        for window in &mut state.windows {
            window.roll(now_ms);
        }
        let windows = &state.windows;
        match announce {
            Announce::None => {}
            Announce::Ietf => {
                let policy = windows
                    .iter()
                    .enumerate()
                    .map(|(i, w)| {
                        let length = ceil_secs(u128::from(w.length_ms));
                        format!("\"w{i}\";q={};w={length}", w.limit)
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let limits = windows
                    .iter()
                    .enumerate()
                    .map(|(i, w)| {
                        let reset = ceil_secs(w.reset_ms(now_ms));
                        format!("\"w{i}\";r={};t={reset}", w.remaining())
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                insert(headers, "ratelimit-policy", policy);
                insert(headers, "ratelimit", limits);
            }
            Announce::XRateLimit => {
                let tightest = windows.iter().min_by(|a, b| {
                    a.remaining()
                        .cmp(&b.remaining())
                        .then(b.end_ms().cmp(&a.end_ms()))
                });
                if let Some(w) = tightest {
                    insert(headers, "x-ratelimit-limit", w.limit.to_string());
                    insert(headers, "x-ratelimit-remaining", w.remaining().to_string());
                    insert(headers, "x-ratelimit-used", w.count.to_string());
                    insert(
                        headers,
                        "x-ratelimit-reset",
                        ceil_secs(w.end_ms()).to_string(),
                    );
                }
            }
        }
    }

    /// Replaces the window definitions: counts and peaks start again from zero.
    pub(super) fn set_windows(&self, windows: &[ApiWindow]) {
        let mut state = self.lock();
        state.windows = windows.iter().map(Counting::new).collect();
        self.active.store(!windows.is_empty(), Ordering::Relaxed);
    }

    pub(super) fn set_announce(&self, announce: Announce) {
        self.lock().announce = announce;
    }

    /// The largest count any window of each definition reached, in definition order.
    pub(super) fn peaks(&self) -> Vec<u64> {
        self.lock().windows.iter().map(|w| w.peak).collect()
    }

    pub(super) fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    pub(super) fn refusal_times(&self) -> Vec<std::time::Instant> {
        self.refused_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Sets header `name` to `value` (always visible ASCII here: digits, quotes, `;=,`).
fn insert(headers: &mut HeaderMap, name: &'static str, value: String) {
    match HeaderValue::try_from(value) {
        Ok(value) => {
            headers.insert(HeaderName::from_static(name), value);
        }
        Err(e) => tracing::warn!("fake API: header {name} not set: {e}"),
    }
}
