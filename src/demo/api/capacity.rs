//! The hidden capacity ([`super::FakeApi::set_capacity`]): a token bucket in front of every ID.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tokio::time::Instant;

use super::lock::lock;

/// The token bucket of [`FakeApi::set_capacity`].
pub(super) struct Limiter {
    /// Whether a capacity is set: lets the unlimited (default) path skip the lock.
    limited: AtomicBool,
    pub(super) bucket: Mutex<Bucket>,
}

pub(super) struct Bucket {
    /// Tokens per second; `None` = unlimited.
    pub(super) rate: Option<f64>,
    /// Most tokens the bucket holds: `max(1, rate / 10)`.
    pub(super) burst: f64,
    pub(super) tokens: f64,
    /// When `tokens` was last brought up to date.
    pub(super) last: Instant,
    /// `Retry-After` of the 429s this bucket causes.
    pub(super) retry_after: Option<u64>,
}

impl Limiter {
    pub(super) fn new() -> Self {
        Limiter {
            limited: AtomicBool::new(false),
            bucket: Mutex::new(Bucket::new(Instant::now())),
        }
    }

    /// `Ok` if a request arriving at `now` may go on, else `Err(retry_after)`.
    pub(super) fn try_acquire(&self, now: Instant) -> Result<(), Option<u64>> {
        if !self.limited.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut bucket = lock(&self.bucket);
        if bucket.try_take(now) {
            Ok(())
        } else {
            Err(bucket.retry_after)
        }
    }

    pub(super) fn set_capacity(&self, per_second: Option<f64>, now: Instant) {
        let mut bucket = lock(&self.bucket);
        bucket.set_rate(per_second, now);
        self.limited.store(bucket.rate.is_some(), Ordering::Relaxed);
    }
}

impl Bucket {
    pub(super) fn new(now: Instant) -> Self {
        Bucket {
            rate: None,
            burst: 1.0,
            tokens: 1.0,
            last: now,
            retry_after: None,
        }
    }

    /// Adds the tokens earned at the current rate since `last`. `now` may be a little
    /// older than `last` (taken before the lock by another request): that adds nothing.
    pub(super) fn refill(&mut self, now: Instant) {
        if let Some(rate) = self.rate {
            let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(self.burst);
        }
        self.last = self.last.max(now);
    }

    pub(super) fn try_take(&mut self, now: Instant) -> bool {
        if self.rate.is_none() {
            return true;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    pub(super) fn set_rate(&mut self, per_second: Option<f64>, now: Instant) {
        let rate = match per_second {
            Some(r) if r.is_infinite() && r > 0.0 => None,
            Some(r) if r >= 0.0 => Some(r),
            Some(_) => Some(0.0), // NaN, negative
            None => None,
        };
        let was_limited = self.rate.is_some();
        self.refill(now);
        self.rate = rate;
        if let Some(rate) = rate {
            self.burst = (rate / 10.0).max(1.0);
            self.tokens = if was_limited {
                self.tokens.min(self.burst)
            } else {
                self.burst
            };
        }
    }
}
