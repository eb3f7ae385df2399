//! A quota a job keeps: at most so many calls (or tokens) per window ([`Quota`]), its text
//! (`50/2s`, `10000/h`, `15000/day`, `600/10min,rolling`, `1000000/job`, `90000tokens/min`),
//! and the windows' arithmetic: which slot a moment falls in, which slots still count, when
//! a window resets.
//!
//! A quota counts in a [`Unit`]: calls by default, or a language model's tokens (all of
//! them, or only those read or written: `tokens`, `input-tokens`, `output-tokens` after the
//! number), or money (a job's budget, built from its prices, never written as a quota's
//! text). A quota of tokens takes a call's estimated cost before the call and is settled by
//! the cost its answer reports (`engine::quotas`).
//!
//! A **fixed** window is aligned on the Unix epoch, as APIs count: an hour on the hour, a
//! day at UTC midnight, two seconds on even seconds. A **rolling** window is the last
//! `length` at any moment; its usage is kept in [`ROLLING_SLOTS`] slots, and a slot counts
//! until all of it has left the window, so the count is never below the truth (never
//! above the limit) at the cost of up to a slot's worth of calls waiting a little longer. The
//! **job** window never resets: a budget for the whole job.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::meter::Unit;

/// How many slots a rolling window's usage is kept in.
pub const ROLLING_SLOTS: u64 = 20;

/// The shortest window: shorter ones are a rate (`--rate`), not a quota.
pub const MIN_WINDOW: Duration = Duration::from_millis(100);

/// At most `limit` calls (or units of another [`Unit`]) per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Calls (units) allowed per window.
    pub limit: u64,
    /// What the calls are counted over.
    pub window: Window,
    /// What is counted: calls, tokens, or money (pico-units of the job's currency).
    pub unit: Unit,
}

impl Quota {
    /// A quota of `limit` calls per `window`.
    pub fn calls(limit: u64, window: Window) -> Quota {
        Quota {
            limit,
            window,
            unit: Unit::Calls,
        }
    }

    /// The quota without its limit, naming its usage in the store: a changed limit keeps
    /// the usage counted so far. A quota of calls is named by its window alone (`2s`,
    /// `1h,rolling`, `job`), as ledgers have always named it; one of another unit by the
    /// unit and the window (`tokens:1min`, `money:job`).
    pub fn key(&self) -> String {
        match self.unit.quota_word() {
            None => self.window.key(),
            Some(word) => format!("{word}:{}", self.window.key()),
        }
    }
}

/// The window a quota counts calls over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    /// Consecutive windows of `length`, aligned on the Unix epoch.
    Fixed {
        /// The window's length (at least [`MIN_WINDOW`]).
        length: Duration,
    },
    /// The last `length`, at any moment.
    Rolling {
        /// The window's length (at least [`MIN_WINDOW`]).
        length: Duration,
    },
    /// The whole job: a budget that never resets.
    Job,
}

impl Window {
    /// The slot `now_ms` (Unix time, ms) falls in: its start and its length, in ms. The job
    /// window has one slot, starting at 0 and never ending.
    pub fn slot(&self, now_ms: u64) -> (u64, u64) {
        match *self {
            Window::Fixed { length } => {
                let len = millis(length);
                (now_ms - now_ms % len, len)
            }
            Window::Rolling { length } => {
                let len = (millis(length) / ROLLING_SLOTS).max(1);
                (now_ms - now_ms % len, len)
            }
            Window::Job => (0, u64::MAX),
        }
    }

    /// Whether the slot starting at `start_ms` still counts at `now_ms`.
    pub fn counts(&self, start_ms: u64, now_ms: u64) -> bool {
        match *self {
            Window::Fixed { .. } | Window::Job => self.slot(now_ms).0 == start_ms,
            Window::Rolling { length } => {
                let (_, slot_len) = self.slot(now_ms);
                // Any part of the slot inside the last `length`.
                start_ms + slot_len + millis(length) > now_ms
            }
        }
    }

    /// When (Unix ms) the slot starting at `start_ms` stops counting: calls it holds are
    /// free again. `None` for the job window.
    pub fn frees_at(&self, start_ms: u64) -> Option<u64> {
        match *self {
            Window::Fixed { length } => Some(start_ms + millis(length)),
            Window::Rolling { length } => {
                let (_, slot_len) = self.slot(start_ms);
                Some(start_ms + slot_len + millis(length))
            }
            Window::Job => None,
        }
    }

    /// The window without its limit, naming its usage in the store: a changed limit keeps
    /// the usage counted so far (`2s`, `1h,rolling`, `job`).
    pub fn key(&self) -> String {
        match *self {
            Window::Fixed { length } => length_text(length),
            Window::Rolling { length } => format!("{},rolling", length_text(length)),
            Window::Job => "job".into(),
        }
    }

    /// The window's length (none for the job's).
    pub fn length(&self) -> Option<Duration> {
        match *self {
            Window::Fixed { length } | Window::Rolling { length } => Some(length),
            Window::Job => None,
        }
    }
}

fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// A window length as written back: the largest unit that divides it (`2s`, `1h`, `1day`,
/// `1500ms`).
fn length_text(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    for (unit, name) in [
        (86_400_000, "day"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1000, "s"),
    ] {
        if ms % unit == 0 {
            return format!("{}{name}", ms / unit);
        }
    }
    format!("{ms}ms")
}

/// Why a quota's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?}: {reason} (write e.g. 10000/h, 50/2s, 15000/day, 600/10min,rolling, 1000000/job \
     or 90000tokens/min)"
)]
pub struct QuotaParseError {
    text: String,
    reason: String,
}

impl FromStr for Quota {
    type Err = QuotaParseError;

    fn from_str(s: &str) -> Result<Quota, QuotaParseError> {
        let err = |reason: &str| QuotaParseError {
            text: s.to_string(),
            reason: reason.to_string(),
        };
        let (limit, window) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| err("no window: a quota is CALLS/WINDOW"))?;
        let limit = limit.trim();
        let digits = limit
            .find(|c: char| !c.is_ascii_digit() && c != '_')
            .unwrap_or(limit.len());
        let (limit, unit) = limit.split_at(digits);
        let unit = match unit.trim() {
            "" | "calls" => Unit::Calls,
            word => Unit::from_quota_word(word).ok_or_else(|| {
                err(&format!(
                    "unknown unit {word:?} (calls, tokens, input-tokens or output-tokens)"
                ))
            })?,
        };
        let limit: u64 = limit
            .replace('_', "")
            .parse()
            .map_err(|_| err("the number of calls is not a whole number"))?;
        if limit == 0 {
            return Err(err(&format!("a quota of 0 {} allows nothing", unit.name())));
        }
        let (window, rolling) = match window.trim().split_once(',') {
            Some((w, "rolling")) => (w.trim(), true),
            Some((_, other)) => {
                return Err(err(&format!(
                    "unknown option {other:?} (the only one is ,rolling)"
                )))
            }
            None => (window.trim(), false),
        };
        if window == "job" {
            if rolling {
                return Err(err("the job's budget cannot be rolling"));
            }
            return Ok(Quota {
                limit,
                window: Window::Job,
                unit,
            });
        }
        let length = window_length(window).ok_or_else(|| err("unknown window"))?;
        if length < MIN_WINDOW {
            return Err(err("a window shorter than 100ms is a rate: use --rate"));
        }
        Ok(Quota {
            limit,
            window: if rolling {
                Window::Rolling { length }
            } else {
                Window::Fixed { length }
            },
            unit,
        })
    }
}

/// `h`, `hour`, `day`, `d`, `min`, `s`, or a length with its unit (`2s`, `15min`, `1day`).
fn window_length(w: &str) -> Option<Duration> {
    let unit = |u: &str| -> Option<u64> {
        Some(match u {
            "ms" => 1,
            "s" | "sec" | "second" => 1000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            "d" | "day" => 86_400_000,
            _ => return None,
        })
    };
    let split = w.find(|c: char| !c.is_ascii_digit()).unwrap_or(w.len());
    let (number, name) = w.split_at(split);
    let n: u64 = if number.is_empty() {
        1
    } else {
        number.parse().ok()?
    };
    let ms = n.checked_mul(unit(name.trim())?)?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.unit, self.unit.quota_word()) {
            // A budget in money is never written as a quota: it reads as one.
            (Unit::Money(_), _) => write!(f, "budget {}", crate::meter::Money(self.limit)),
            (_, None) => write!(f, "{}/{}", self.limit, self.window.key()),
            (_, Some(word)) => write!(f, "{}{word}/{}", self.limit, self.window.key()),
        }
    }
}

impl Serialize for Quota {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Quota, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quota {
        s.parse().unwrap()
    }

    #[test]
    fn quotas_read_and_write_back() {
        for (text, back) in [
            ("10000/h", "10000/1h"),
            ("50/2s", "50/2s"),
            ("15_000/day", "15000/1day"),
            ("200000/1d", "200000/1day"),
            ("600/10min,rolling", "600/10min,rolling"),
            ("350/10s", "350/10s"),
            ("1000000/job", "1000000/job"),
            ("5/1500ms", "5/1500ms"),
            ("450/15m", "450/15min"),
            ("90000tokens/min", "90000tokens/1min"),
            ("90_000 tokens/1min", "90000tokens/1min"),
            (
                "40000 input-tokens/1min,rolling",
                "40000input-tokens/1min,rolling",
            ),
            ("8000output-tokens/1min", "8000output-tokens/1min"),
            ("5000000tokens/job", "5000000tokens/job"),
            ("10calls/h", "10/1h"),
        ] {
            assert_eq!(q(text).to_string(), back, "{text}");
            assert_eq!(q(back), q(text));
        }
        for bad in [
            "10",
            "0/h",
            "x/h",
            "10/fortnight",
            "10/50ms",
            "10/h,sliding",
            "10/job,rolling",
            "-1/h",
            "10/",
            "10 bananas/h",
            "0tokens/min",
            "tokens/min",
            "10 money/job",
        ] {
            let e = bad.parse::<Quota>().unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("write e.g."), "{bad}: {e}");
        }
    }

    #[test]
    fn fixed_windows_are_aligned_on_the_epoch() {
        let hour = q("10/h").window;
        let t = 1_700_000_123_456;
        let (start, len) = hour.slot(t);
        assert_eq!(len, 3_600_000);
        assert_eq!(start % 3_600_000, 0);
        assert!(start <= t && t < start + len);
        assert!(hour.counts(start, start + len - 1));
        assert!(!hour.counts(start, start + len));
        assert_eq!(hour.frees_at(start), Some(start + len));
        // A day starts at UTC midnight.
        assert_eq!(q("1/day").window.slot(t).0 % 86_400_000, 0);
    }

    #[test]
    fn a_rolling_slot_counts_until_all_of_it_left_the_window() {
        let w = q("10/10s,rolling").window;
        let (start, len) = w.slot(1_000_250);
        assert_eq!((start, len), (1_000_000, 500));
        // The slot's last moment (1_000_499) leaves the 10 s window at 1_010_500.
        assert!(w.counts(start, 1_010_499));
        assert!(!w.counts(start, 1_010_500));
        assert_eq!(w.frees_at(start), Some(1_010_500));
    }

    #[test]
    fn the_job_window_never_resets_and_keys_ignore_limits() {
        let j = q("5/job").window;
        assert_eq!(j.slot(123), (0, u64::MAX));
        assert!(j.counts(0, u64::MAX - 1));
        assert_eq!(j.frees_at(0), None);
        assert_eq!(q("5/2s").key(), q("7/2s").key());
        assert_ne!(q("5/2s").key(), q("5/2s,rolling").key());
        // A quota of calls keeps the name ledgers always gave it; tokens count apart.
        assert_eq!(q("5/2s").key(), "2s");
        assert_eq!(q("5tokens/2s").key(), "tokens:2s");
        assert_ne!(q("5tokens/2s").key(), q("5input-tokens/2s").key());
    }
}
