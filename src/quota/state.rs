//! Where each quota stands ([`QuotaState`]), for progress lines, `live.json` and `status`,
//! and how long the quotas make the calls a job has left take at the least ([`least_wait`]).

use serde::{Deserialize, Serialize};

use crate::meter::{Money, Unit};

/// Where one quota stands, for progress lines, `live.json` and `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaState {
    /// The quota as written back (`10000/1h`).
    pub quota: String,
    /// Calls the window allows.
    pub limit: u64,
    /// Calls counted in its window now, by every run and worker (as of the last
    /// reservation).
    pub used: u64,
    /// When (Unix ms) the window frees calls next; none for the job's budget.
    pub frees_at_ms: Option<u64>,
    /// The window's length (ms); none for the job's budget.
    pub window_ms: Option<u64>,
    /// Whether attempts are waiting for this window.
    pub exhausted: bool,
    /// What the quota counts (calls in states written before quotas had a unit).
    #[serde(default, skip_serializing_if = "is_calls")]
    pub unit: Unit,
}

fn is_calls(unit: &Unit) -> bool {
    *unit == Unit::Calls
}

impl QuotaState {
    /// The line a progress report adds for this quota.
    pub fn render(&self) -> String {
        let mut s = match self.unit {
            Unit::Money(_) => format!(
                "budget {}: {} spent or held for calls in flight",
                Money(self.limit),
                Money(self.used)
            ),
            _ => format!("quota {}: {} of {} used", self.quota, self.used, self.limit),
        };
        if self.exhausted {
            match self.frees_at_ms {
                Some(at) => s.push_str(&format!(
                    ", spent until {} (calls wait for it)",
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + std::time::Duration::from_millis(at)
                    )
                )),
                None => s.push_str(", spent (the job stops; raise the budget to go on)"),
            }
        }
        s
    }
}

/// How long (seconds from `now_ms`) the quotas of calls make `calls` more calls take at the
/// least: the waits for their windows to free calls. `None` when a budget does not cover
/// them. (What calls will cost in tokens or money is not known ahead.)
pub fn least_wait(states: &[QuotaState], calls: u64, now_ms: u64) -> Option<u64> {
    let mut wait = 0u64;
    for s in states.iter().filter(|s| s.unit == Unit::Calls) {
        let left = s.limit.saturating_sub(s.used);
        if calls <= left {
            continue;
        }
        let window = s.window_ms?;
        let windows = (calls - left).div_ceil(s.limit.max(1));
        let first = s.frees_at_ms.unwrap_or(now_ms).saturating_sub(now_ms);
        let ms = first + (windows - 1) * window;
        wait = wait.max(ms.div_ceil(1000));
    }
    Some(wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    fn state(quota: &str, used: u64, frees_in_ms: u64, window_ms: Option<u64>) -> QuotaState {
        let q: Quota = quota.parse().unwrap();
        QuotaState {
            quota: q.to_string(),
            limit: q.limit,
            used,
            frees_at_ms: window_ms.map(|_| 1_000_000 + frees_in_ms),
            window_ms,
            exhausted: used >= q.limit,
            unit: q.unit,
        }
    }

    #[test]
    fn the_least_wait_counts_whole_windows_after_the_current_one() {
        let now = 1_000_000;
        let hourly = state("100/h", 100, 600_000, Some(3_600_000));
        // 250 calls: the current hour is spent; 10 min, then two more hours.
        assert_eq!(
            least_wait(std::slice::from_ref(&hourly), 250, now),
            Some(600 + 7200)
        );
        assert_eq!(least_wait(std::slice::from_ref(&hourly), 0, now), Some(0));
        let budget = state("1000/job", 900, 0, None);
        assert_eq!(least_wait(std::slice::from_ref(&budget), 100, now), Some(0));
        assert_eq!(least_wait(&[hourly, budget], 101, now), None);
        assert!(state("5/2s", 5, 1500, Some(2000))
            .render()
            .contains("spent until"));
    }
}
