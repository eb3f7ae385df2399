//! Turning a run's live counters into [`Sample`]s ([`Sampler`]), every
//! [`DEFAULT_INTERVAL`] unless told otherwise, with latency percentiles per interval
//! ([`percentile_ms`]).

use super::record::{Answers, RateCause, Sample};
use crate::failure::ErrorClass;
use crate::progress::{CounterSnapshot, Counters, JobFigures, LATENCY_BUCKETS};

/// The default time between two samples.
pub(crate) const DEFAULT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Turns a run's live counters into [`Sample`]s; remembers the latency histogram of the
/// previous sample, so each sample's percentiles cover only its interval.
#[derive(Debug)]
pub(crate) struct Sampler {
    run_id: String,
    worker: Option<String>,
    configured_rate: Option<f64>,
    latency: Vec<u64>,
}

impl Sampler {
    /// A sampler for run `run_id` (of `worker`, in a shared job), whose rate is `configured_rate` when not lowered.
    pub(crate) fn new(
        run_id: String,
        worker: Option<String>,
        configured_rate: Option<f64>,
    ) -> Sampler {
        Sampler {
            run_id,
            worker,
            configured_rate,
            latency: vec![0; LATENCY_BUCKETS.len() + 1],
        }
    }

    /// The sample now: `run` is a copy of `counters`, `job` the job-wide figures from it.
    pub(crate) fn sample(
        &mut self,
        counters: &Counters,
        run: &CounterSnapshot,
        job: &JobFigures,
        input_rows: Option<u64>,
        at_ms: u64,
    ) -> Sample {
        let (cumulative, total, _) = counters.http.latency();
        let mut now: Vec<u64> = cumulative;
        now.push(total);
        let interval: Vec<u64> = now
            .iter()
            .zip(&self.latency)
            .map(|(n, before)| n.saturating_sub(*before))
            .collect();
        self.latency = now;
        let rate = counters.effective_rate();
        Sample {
            at_ms,
            run_id: self.run_id.clone(),
            worker: self.worker.clone(),
            ok: run.ok,
            failed: run.failed,
            retries: run.retries,
            attempts: run.attempts,
            pages: run.pages,
            throttled: run.throttled,
            answers: answers(counters),
            p50_ms: percentile_ms(&interval, 0.50),
            p90_ms: percentile_ms(&interval, 0.90),
            p99_ms: percentile_ms(&interval, 0.99),
            rate,
            rate_cause: self.cause(counters, rate),
            in_flight: run.in_flight,
            job_ok: job.ok,
            job_failed: job.failed,
            job_pending: job.pending,
            buckets_committed: job.buckets_committed,
            buckets_planned: job.buckets_planned,
            rows_read: job.rows_read,
            input_rows,
        }
    }

    fn cause(&self, counters: &Counters, rate: Option<f64>) -> RateCause {
        if counters.quota_states().iter().any(|q| q.exhausted) {
            return RateCause::Quota;
        }
        if counters.announced_states().iter().any(|p| p.remaining == 0) {
            return RateCause::Announced;
        }
        if counters.throttle().is_some_and(|t| t.outage().is_some()) {
            return RateCause::Outage;
        }
        match (rate, self.configured_rate) {
            (None, _) => RateCause::None,
            (Some(r), Some(c)) if r >= c * 0.999 => RateCause::Configured,
            (Some(_), _) => RateCause::Adaptive,
        }
    }
}

/// Answers by class from the live counters.
fn answers(counters: &Counters) -> Answers {
    let mut a = Answers::default();
    for (status, n) in counters.http.statuses() {
        match status / 100 {
            2 => a.s2xx += n,
            3 => a.s3xx += n,
            4 => a.s4xx += n,
            5 => a.s5xx += n,
            _ => a.transport += n,
        }
    }
    a.transport += counters
        .http
        .classes()
        .into_iter()
        .filter(|(c, _)| *c != ErrorClass::Http)
        .map(|(_, n)| n)
        .sum::<u64>();
    a
}

/// The `q` quantile (0..1), in milliseconds, of a latency histogram given as cumulative
/// counts per [`LATENCY_BUCKETS`] bound followed by the total; linear within a bucket, the
/// last bound for the overflow. None for an empty histogram.
pub(crate) fn percentile_ms(cumulative: &[u64], q: f64) -> Option<f64> {
    let total = *cumulative.last()?;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    let mut lower = 0.0;
    for (i, upper) in LATENCY_BUCKETS.iter().enumerate() {
        let n = cumulative[i];
        if n as f64 >= rank {
            let inside = (n - below) as f64;
            let share = if inside > 0.0 {
                (rank - below as f64) / inside
            } else {
                1.0
            };
            let secs = lower + (upper - lower) * share.clamp(0.0, 1.0);
            return Some((secs * 1e5).round() / 100.0);
        }
        below = n;
        lower = *upper;
    }
    Some(LATENCY_BUCKETS[LATENCY_BUCKETS.len() - 1] * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_within_the_histograms_buckets() {
        // 100 attempts: 50 up to 5 ms, 40 in (5, 10], 10 in (10, 25] ms.
        let mut cumulative = vec![50, 90];
        cumulative.extend(std::iter::repeat_n(100, LATENCY_BUCKETS.len() - 2));
        cumulative.push(100);
        assert_eq!(percentile_ms(&cumulative, 0.5), Some(5.0));
        assert_eq!(percentile_ms(&cumulative, 0.9), Some(10.0));
        let p99 = percentile_ms(&cumulative, 0.99).unwrap();
        assert!(p99 > 10.0 && p99 <= 25.0, "{p99}");
        assert_eq!(percentile_ms(&[0; 13], 0.5), None);
        // Everything beyond the last bound: the last bound.
        let mut over = vec![0; LATENCY_BUCKETS.len()];
        over.push(5);
        assert_eq!(percentile_ms(&over, 0.5), Some(30_000.0));
    }

    #[test]
    fn a_sample_counts_answers_by_class_and_its_intervals_latencies_only() {
        use crate::failure::Failure;
        let counters = Counters::default();
        let mut output = crate::handler::Output::json(&1).unwrap();
        output.status = Some(200);
        let ok = Ok(output);
        counters
            .http
            .observe(&ok, std::time::Duration::from_millis(3));
        let mut sampler = Sampler::new("r".into(), None, None);
        let run = counters.snapshot();
        let job = JobFigures::new(&Default::default(), &run);
        let first = sampler.sample(&counters, &run, &job, None, 1);
        assert_eq!(first.answers.s2xx, 1);
        assert!(first.p50_ms.unwrap() <= 5.0);
        let timeout: Result<crate::handler::Output, Failure> =
            Err(Failure::retry("timed out").class(ErrorClass::Timeout));
        counters
            .http
            .observe(&timeout, std::time::Duration::from_secs(2));
        let second = sampler.sample(&counters, &run, &job, None, 2);
        assert_eq!((second.answers.s2xx, second.answers.transport), (1, 1));
        // Only the second interval's attempt: about 2 s.
        assert!(second.p50_ms.unwrap() > 1000.0, "{:?}", second.p50_ms);
        assert_eq!(second.rate_cause, RateCause::None);
    }
}
