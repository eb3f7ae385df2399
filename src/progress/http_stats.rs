//! Every attempt's answer by HTTP status or error class, and its latency histogram.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::failure::{ErrorClass, Failure};
use crate::handler::Answered;

/// Upper bounds (seconds) of the request latency histogram's buckets.
pub(crate) const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Attempts by outcome and their latencies, lock-free (one atomic per status code).
#[derive(Debug)]
pub(crate) struct HttpStats {
    /// Answers by HTTP status, index = status - 100 (100..=599).
    by_status: Vec<AtomicU64>,
    /// Failed attempts without an HTTP status, by [`ErrorClass::ALL`] index.
    by_class: [AtomicU64; ErrorClass::ALL.len()],
    /// Attempts per latency bucket: one count per [`LATENCY_BUCKETS`] bound (each bucket
    /// on its own, not cumulative; [`HttpStats::latency`] sums them), then the overflow.
    latency: [AtomicU64; 13],
    latency_sum_us: AtomicU64,
}

impl Default for HttpStats {
    fn default() -> Self {
        HttpStats {
            by_status: (100..600).map(|_| AtomicU64::new(0)).collect(),
            by_class: Default::default(),
            latency: Default::default(),
            latency_sum_us: AtomicU64::new(0),
        }
    }
}

impl HttpStats {
    /// Count one attempt that took `elapsed`.
    ///
    /// An attempt with an HTTP status counts under its status; a failure without one under
    /// its class; a success without one (an exec or closure handler's) only in the latencies.
    pub(crate) fn observe<T: Answered>(&self, result: &Result<T, Failure>, elapsed: Duration) {
        let status = match result {
            Ok(o) => o.status(),
            Err(e) => e.status,
        };
        match (status, result) {
            (Some(s), _) if (100..600).contains(&s) => {
                self.by_status[usize::from(s - 100)].fetch_add(1, Relaxed);
            }
            (_, Err(e)) => {
                let i = ErrorClass::ALL.iter().position(|c| *c == e.class);
                self.by_class[i.unwrap_or(0)].fetch_add(1, Relaxed);
            }
            (_, Ok(_)) => {}
        }
        let secs = elapsed.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.latency[i].fetch_add(1, Relaxed);
        self.latency_sum_us
            .fetch_add(elapsed.as_micros() as u64, Relaxed);
    }

    /// (status, count) for every status seen.
    pub(crate) fn statuses(&self) -> Vec<(u16, u64)> {
        self.by_status
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u16 + 100, n.load(Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// (class, count) of attempts without a usable HTTP status.
    pub(crate) fn classes(&self) -> Vec<(ErrorClass, u64)> {
        ErrorClass::ALL
            .iter()
            .zip(&self.by_class)
            .map(|(c, n)| (*c, n.load(Relaxed)))
            .collect()
    }

    /// Cumulative counts per `LATENCY_BUCKETS` bound, then the total; and the sum in
    /// seconds.
    pub(crate) fn latency(&self) -> (Vec<u64>, u64, f64) {
        let mut cumulative = Vec::with_capacity(LATENCY_BUCKETS.len());
        let mut total = 0;
        for (i, n) in self.latency.iter().enumerate() {
            total += n.load(Relaxed);
            if i < LATENCY_BUCKETS.len() {
                cumulative.push(total);
            }
        }
        let sum = self.latency_sum_us.load(Relaxed) as f64 / 1e6;
        (cumulative, total, sum)
    }
}
