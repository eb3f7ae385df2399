//! Falling behind the rate: what limited a run over an interval, why it went slower than
//! asked, and the warning for a sustained shortfall only.

use crate::setting::Setting;

use super::durations::Durations;

/// What limited a run over an interval.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IntervalLoad {
    /// The interval's length in seconds.
    pub seconds: f64,
    /// Attempts started over the interval.
    pub attempts: u64,
    /// API calls under way at its end.
    pub in_flight: u64,
    /// Answers 429 over the interval.
    pub throttled: u64,
    /// Answers 503 over the interval.
    pub unavailable: u64,
    /// Refusals (503, 529, timeouts) over the interval taken as their IDs', not the rate's.
    pub refused_ids: u64,
    /// Time per step over the interval.
    pub durations: Durations,
    /// Times the result writer's queue was full over the interval.
    pub backpressure: u64,
    /// The run's concurrency cap (API calls at once).
    pub concurrency: usize,
    /// The API is out (the outage gate holds attempts back).
    pub outage: bool,
}

/// Why a run went slower than `configured` requests per second over an interval, if it
/// did (below 80% of it). The first cause that fits wins: the API out, 429s, the adaptive
/// rate down, latency against the concurrency cap, the store.
pub(crate) fn behind(
    configured: f64,
    effective: Option<f64>,
    load: &IntervalLoad,
) -> Option<String> {
    if load.seconds <= 0.0 {
        return None;
    }
    let achieved = load.attempts as f64 / load.seconds;
    if achieved >= 0.8 * configured {
        return None;
    }
    let head = format!(
        "falling behind: {achieved:.1} requests/s over the last {:.0}s, {} is {configured:.1}/s",
        load.seconds,
        Setting::Rate
    );
    let latency_ms = if load.attempts > 0 {
        load.durations.api_ms / load.attempts as f64
    } else {
        0.0
    };
    let store_s = load.durations.store_ms() / 1e3;
    let cause = if load.outage {
        "the API is out (attempts wait for a probe to get through)".to_string()
    } else if load.throttled == 0
        && load.unavailable > 0
        && 2 * load.refused_ids >= load.unavailable
    {
        format!(
            "a few IDs refused every time: the API answered 503 {} times, {} of them refusals of the same IDs again while others succeed (not overload: the rate is not lowered for them, but their retries use part of it); the adaptive rate is {}",
            load.unavailable,
            load.refused_ids.min(load.unavailable),
            effective.map_or("unlimited".into(), |r| format!("{r:.1}/s"))
        )
    } else if load.throttled > 0 || load.unavailable > 0 {
        let answers: Vec<String> = [(503, load.unavailable), (429, load.throttled)]
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(status, n)| format!("{status} {n} times"))
            .collect();
        format!(
            "API pushback (the API overloaded): the API answered {}; the adaptive rate is {}",
            answers.join(" and "),
            effective.map_or("unlimited".into(), |r| format!("{r:.1}/s"))
        )
    } else if let Some(rate) = effective.filter(|r| *r < 0.8 * configured) {
        format!("the adaptive rate is down to {rate:.1}/s after API pushback (429 or 503 answers, timeouts or rising latency)")
    } else if latency_ms > 0.0 && configured * latency_ms / 1e3 > 0.8 * load.concurrency as f64 {
        format!(
            "API latency: {latency_ms:.0} ms per call with {} {} allows about {:.1}/s",
            Setting::Concurrency,
            load.concurrency,
            load.concurrency as f64 * 1e3 / latency_ms
        )
    } else if load.backpressure > 0 || store_s > 0.5 * load.seconds {
        format!(
            "store writes: {store_s:.1}s spent writing and syncing, the result queue was full {} times",
            load.backpressure
        )
    } else {
        "the input: the planner hands over fewer items than the rate allows".to_string()
    };
    Some(format!("{head}: {cause}"))
}

/// The falling-behind warning for a sustained shortfall only: two intervals in a row below
/// the rate. An idle interval (no attempt made, none in flight, the API not out: the run
/// starting up, or nothing to do) is neither behind nor on time and resets the count; so
/// does the tail of a job, where too few items are left to keep the rate.
#[derive(Debug, Default)]
pub(crate) struct Sustained {
    /// Intervals in a row below the rate.
    behind: u32,
}

impl Sustained {
    /// The warning for this interval, if the run has now been behind for two in a row.
    pub(crate) fn check(
        &mut self,
        configured: f64,
        effective: Option<f64>,
        load: &IntervalLoad,
        tail: bool,
    ) -> Option<String> {
        let idle = load.attempts == 0 && load.in_flight == 0 && !load.outage;
        let warning = (!idle && !tail)
            .then(|| behind(configured, effective, load))
            .flatten();
        match warning {
            Some(w) => {
                self.behind += 1;
                (self.behind >= 2).then_some(w)
            }
            None => {
                self.behind = 0;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(attempts: u64) -> IntervalLoad {
        IntervalLoad {
            seconds: 10.0,
            attempts,
            concurrency: 16,
            ..IntervalLoad::default()
        }
    }

    #[test]
    fn a_run_at_its_rate_is_not_behind() {
        assert_eq!(behind(100.0, Some(100.0), &load(900)), None);
    }

    #[test]
    fn falling_behind_names_the_cause() {
        let why = |l: &IntervalLoad, eff: Option<f64>| behind(100.0, eff, l).unwrap();
        let outage = IntervalLoad {
            outage: true,
            ..load(10)
        };
        assert!(why(&outage, Some(100.0)).contains("the API is out"));
        let throttled = IntervalLoad {
            throttled: 40,
            ..load(300)
        };
        let w = why(&throttled, Some(30.0));
        assert!(w.contains("429 40 times") && w.contains("30.0/s"), "{w}");
        // A rate limiter answering 503 (nginx's limit_req by default) is pushback too, named.
        let unavailable = IntervalLoad {
            unavailable: 25,
            ..load(300)
        };
        let w = why(&unavailable, Some(30.0));
        assert!(
            w.contains("pushback (the API overloaded)")
                && w.contains("503 25 times")
                && !w.contains("429"),
            "{w}"
        );
        // 503s that the throttle found to repeat on the same IDs are named as such.
        let same_ids = IntervalLoad {
            unavailable: 25,
            refused_ids: 20,
            ..load(300)
        };
        let w = why(&same_ids, Some(100.0));
        assert!(
            w.contains("a few IDs refused every time")
                && w.contains("503 25 times")
                && !w.contains("overloaded"),
            "{w}"
        );
        assert!(why(&load(300), Some(30.0)).contains("adaptive rate is down to 30.0/s"));
        // 16 in flight at 400 ms each: 40/s at most.
        let slow = IntervalLoad {
            durations: Durations {
                api_ms: 400.0 * 400.0,
                ..Durations::default()
            },
            ..load(400)
        };
        let w = why(&slow, Some(100.0));
        assert!(
            w.contains("API latency: 400 ms")
                && w.contains(&format!("{} 16", Setting::Concurrency)),
            "{w}"
        );
        let store = IntervalLoad {
            durations: Durations {
                api_ms: 400.0,
                result_sync_ms: 8000.0,
                ..Durations::default()
            },
            backpressure: 12,
            ..load(400)
        };
        let w = why(&store, Some(100.0));
        assert!(
            w.contains("store writes") && w.contains("full 12 times"),
            "{w}"
        );
        assert!(why(&load(0), Some(100.0)).contains("the input"));
    }

    #[test]
    fn only_a_sustained_shortfall_is_warned_about_and_idle_intervals_never() {
        let mut s = Sustained::default();
        let idle = load(0);
        let slow = load(100);
        let busy_idle = IntervalLoad {
            in_flight: 16,
            ..load(0)
        };
        // Start-up: nothing sent yet, over and over: never a warning.
        for _ in 0..3 {
            assert_eq!(s.check(100.0, Some(100.0), &idle, false), None);
        }
        // One slow interval is not sustained; the second in a row is.
        assert_eq!(s.check(100.0, Some(100.0), &slow, false), None);
        let w = s.check(100.0, Some(100.0), &slow, false).unwrap();
        assert!(w.contains("falling behind"), "{w}");
        assert!(s.check(100.0, Some(100.0), &slow, false).is_some());
        // An interval on time, an idle one or the tail resets the count.
        for reset in [load(900), idle] {
            assert_eq!(s.check(100.0, Some(100.0), &reset, false), None);
            assert_eq!(s.check(100.0, Some(100.0), &slow, false), None);
            assert!(s.check(100.0, Some(100.0), &slow, false).is_some());
        }
        assert_eq!(s.check(100.0, Some(100.0), &slow, true), None);
        assert_eq!(s.check(100.0, Some(100.0), &slow, false), None);
        // Calls stuck in flight with none started is not idle.
        assert_eq!(s.check(100.0, Some(100.0), &load(900), false), None);
        assert_eq!(s.check(100.0, Some(100.0), &busy_idle, false), None);
        assert!(s.check(100.0, Some(100.0), &busy_idle, false).is_some());
    }
}
