//! Series: a job's history as the columns a chart draws, downsampled to a bounded number of
//! points however many samples the history holds.
//!
//! Rates (items, requests, answers by class per second) are taken between consecutive
//! samples of the same run, and from a run's start for its first sample; counters never
//! cross a restart. Downsampling merges consecutive samples: a merged point's rates are
//! its samples' totals over its time (a time-weighted mean), its p50 the mean and its p90
//! and p99 the highest of its samples (a peak stays visible), its figures the last.

use std::collections::HashMap;

use serde::Serialize;

use super::record::{RateCause, Record, Sample};

/// One point of every series.
#[derive(Debug, Clone, Copy, Default)]
struct Point {
    /// Which run wrote it (an index in the order runs first appear).
    run: usize,
    /// Unix seconds.
    t: f64,
    /// Seconds covered.
    dt: f64,
    items: f64,
    ok: f64,
    failed: f64,
    retries: f64,
    requests: f64,
    s2xx: f64,
    s3xx: f64,
    s4xx: f64,
    s5xx: f64,
    transport: f64,
    rate: Option<f64>,
    cause: RateCause,
    p50: Option<f64>,
    p90: Option<f64>,
    p99: Option<f64>,
    in_flight: f64,
    done: f64,
    buckets_committed: f64,
}

/// A run's start, as the charts mark it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RunMark {
    /// Unix seconds.
    pub(crate) t: f64,
    /// The run's id.
    pub(crate) run_id: String,
    /// The run's process id.
    pub(crate) pid: u32,
    /// The worker, for a shared job's run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) worker: Option<String>,
}

/// The history's columns, all of the same length (uPlot's layout).
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct HistorySeries {
    /// Samples in the whole history.
    pub(crate) samples: usize,
    /// Unix seconds of each point.
    pub(crate) t: Vec<f64>,
    /// Items finished (ok or failed) per second.
    pub(crate) items_per_s: Vec<f64>,
    /// Items finished ok per second.
    pub(crate) ok_per_s: Vec<f64>,
    /// Items finished failed per second.
    pub(crate) failed_per_s: Vec<f64>,
    /// Retries per second.
    pub(crate) retries_per_s: Vec<f64>,
    /// Attempts per second.
    pub(crate) requests_per_s: Vec<f64>,
    /// Answers 2xx per second.
    pub(crate) answers_2xx_per_s: Vec<f64>,
    /// Answers 3xx per second.
    pub(crate) answers_3xx_per_s: Vec<f64>,
    /// Answers 4xx per second.
    pub(crate) answers_4xx_per_s: Vec<f64>,
    /// Answers 5xx per second.
    pub(crate) answers_5xx_per_s: Vec<f64>,
    /// Attempts without an HTTP status per second.
    pub(crate) transport_per_s: Vec<f64>,
    /// The rate limit in force (none: no limit) and what set it.
    pub(crate) rate_limit: Vec<Option<f64>>,
    /// What set `rate_limit`.
    pub(crate) rate_cause: Vec<RateCause>,
    /// Median attempt latency (ms); the mean of merged samples; none without attempts.
    pub(crate) p50_ms: Vec<Option<f64>>,
    /// 90th percentile latency (ms); the highest of merged samples.
    pub(crate) p90_ms: Vec<Option<f64>>,
    /// 99th percentile latency (ms); the highest of merged samples.
    pub(crate) p99_ms: Vec<Option<f64>>,
    /// API calls under way (summed over concurrent runs).
    pub(crate) in_flight: Vec<f64>,
    /// Job-wide items settled (ok + failed).
    pub(crate) done: Vec<f64>,
    /// Job-wide buckets committed.
    pub(crate) buckets_committed: Vec<f64>,
    /// Every run's start (the first one is the job's first run): restarts are the others.
    pub(crate) runs: Vec<RunMark>,
}

/// The history `records` as at most `points` points (at least 2).
///
/// Runs one after the other (restarts) are merged sample by sample. Runs at the same time
/// (the workers of a PostgreSQL job each write their own samples) are merged by time slot,
/// where their counts, rates and calls in flight add up.
pub(crate) fn downsample(records: &[Record], points: usize) -> HistorySeries {
    let points = points.max(2);
    let mut runs = Vec::new();
    let mut raw: Vec<Point> = Vec::new();
    let mut prev: HashMap<&str, &Sample> = HashMap::new();
    let mut starts: HashMap<&str, u64> = HashMap::new();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut last_run: Option<&str> = None;
    let mut switches = 0;
    for record in records {
        match record {
            Record::Run(r) => {
                runs.push(RunMark {
                    t: r.started_ms as f64 / 1e3,
                    run_id: r.run_id.clone(),
                    pid: r.pid,
                    worker: r.worker.clone(),
                });
                starts.insert(&r.run_id, r.started_ms);
            }
            Record::Sample(s) => {
                let before = prev.get(s.run_id.as_str()).copied();
                let n = ids.len();
                let run = *ids.entry(&s.run_id).or_insert(n);
                raw.push(Point {
                    run,
                    ..point(s, before, starts.get(s.run_id.as_str()).copied())
                });
                prev.insert(&s.run_id, s);
                if last_run != Some(s.run_id.as_str()) {
                    switches += 1;
                    last_run = Some(&s.run_id);
                }
            }
        }
    }
    let mut out = HistorySeries {
        samples: raw.len(),
        runs,
        ..HistorySeries::default()
    };
    // More switches between runs than runs: some ran at the same time.
    if switches > ids.len() {
        raw.sort_by(|a, b| a.t.total_cmp(&b.t));
        for (width, slot) in slots(&raw, points) {
            push(&mut out, &merge_concurrent(slot, width));
        }
        return out;
    }
    let group = raw.len().div_ceil(points).max(1);
    for chunk in raw.chunks(group) {
        push(&mut out, &merge(chunk));
    }
    out
}

/// Time-ordered points cut into at most `points` slots of one width: the span over
/// `points`, or the runs' usual time between samples if that is longer (so a slot holds a
/// sample of every run). Empty slots are left out.
fn slots(raw: &[Point], points: usize) -> Vec<(f64, &[Point])> {
    let (Some(first), Some(last)) = (raw.first(), raw.last()) else {
        return Vec::new();
    };
    let mut gaps: Vec<f64> = raw.iter().map(|p| p.dt).filter(|dt| *dt > 0.0).collect();
    gaps.sort_by(f64::total_cmp);
    let usual = gaps.get(gaps.len() / 2).copied().unwrap_or(1.0);
    let width = ((last.t - first.t) / points as f64).max(usual).max(1e-3);
    let mut out = Vec::new();
    let mut from = 0;
    while from < raw.len() {
        let slot = ((raw[from].t - first.t) / width).floor();
        let end = slot * width + first.t + width;
        let to = from + raw[from..].iter().take_while(|p| p.t < end).count().max(1);
        out.push((width, &raw[from..to]));
        from = to;
    }
    out
}

/// The points of one time slot of runs at the same time: counts over the slot's width; the
/// rate limit and the calls in flight of each run's last point, added up.
fn merge_concurrent(slot: &[Point], width: f64) -> Point {
    let mut merged = merge(slot);
    merged.dt = width;
    let mut last: HashMap<usize, &Point> = HashMap::new();
    for p in slot {
        last.insert(p.run, p);
    }
    merged.in_flight = last.values().map(|p| p.in_flight).sum();
    let rates: Vec<f64> = last.values().filter_map(|p| p.rate).collect();
    merged.rate = (!rates.is_empty()).then(|| rates.iter().sum());
    merged.done = slot.iter().map(|p| p.done).fold(0.0, f64::max);
    merged
}

/// A sample's point: its counts since `before` (the run's previous sample), or since the
/// run's start.
fn point(s: &Sample, before: Option<&Sample>, run_start: Option<u64>) -> Point {
    let zero = Sample {
        at_ms: run_start.unwrap_or(s.at_ms).min(s.at_ms),
        ok: 0,
        failed: 0,
        retries: 0,
        attempts: 0,
        throttled: 0,
        answers: Default::default(),
        ..s.clone()
    };
    let b = before.unwrap_or(&zero);
    let d = |now: u64, then: u64| now.saturating_sub(then) as f64;
    Point {
        run: 0,
        t: s.at_ms as f64 / 1e3,
        dt: d(s.at_ms, b.at_ms) / 1e3,
        items: d(s.ok + s.failed, b.ok + b.failed),
        ok: d(s.ok, b.ok),
        failed: d(s.failed, b.failed),
        retries: d(s.retries, b.retries),
        requests: d(s.attempts, b.attempts),
        s2xx: d(s.answers.s2xx, b.answers.s2xx),
        s3xx: d(s.answers.s3xx, b.answers.s3xx),
        s4xx: d(s.answers.s4xx, b.answers.s4xx),
        s5xx: d(s.answers.s5xx, b.answers.s5xx),
        transport: d(s.answers.transport, b.answers.transport),
        rate: s.rate,
        cause: s.rate_cause,
        p50: s.p50_ms,
        p90: s.p90_ms,
        p99: s.p99_ms,
        in_flight: s.in_flight as f64,
        done: (s.job_ok + s.job_failed) as f64,
        buckets_committed: s.buckets_committed as f64,
    }
}

fn merge(chunk: &[Point]) -> Point {
    let last = *chunk.last().expect("chunks are not empty");
    let sum = |f: fn(&Point) -> f64| chunk.iter().map(f).sum::<f64>();
    let present = |f: fn(&Point) -> Option<f64>| chunk.iter().filter_map(f).collect::<Vec<_>>();
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let max = |v: Vec<f64>| v.into_iter().reduce(f64::max);
    Point {
        dt: sum(|p| p.dt),
        items: sum(|p| p.items),
        ok: sum(|p| p.ok),
        failed: sum(|p| p.failed),
        retries: sum(|p| p.retries),
        requests: sum(|p| p.requests),
        s2xx: sum(|p| p.s2xx),
        s3xx: sum(|p| p.s3xx),
        s4xx: sum(|p| p.s4xx),
        s5xx: sum(|p| p.s5xx),
        transport: sum(|p| p.transport),
        rate: mean(present(|p| p.rate)),
        p50: mean(present(|p| p.p50)),
        p90: max(present(|p| p.p90)),
        p99: max(present(|p| p.p99)),
        in_flight: sum(|p| p.in_flight) / chunk.len() as f64,
        ..last
    }
}

fn push(out: &mut HistorySeries, p: &Point) {
    let per_s = |n: f64| {
        if p.dt > 0.0 {
            (n / p.dt * 1000.0).round() / 1000.0
        } else {
            0.0
        }
    };
    out.t.push(p.t);
    out.items_per_s.push(per_s(p.items));
    out.ok_per_s.push(per_s(p.ok));
    out.failed_per_s.push(per_s(p.failed));
    out.retries_per_s.push(per_s(p.retries));
    out.requests_per_s.push(per_s(p.requests));
    out.answers_2xx_per_s.push(per_s(p.s2xx));
    out.answers_3xx_per_s.push(per_s(p.s3xx));
    out.answers_4xx_per_s.push(per_s(p.s4xx));
    out.answers_5xx_per_s.push(per_s(p.s5xx));
    out.transport_per_s.push(per_s(p.transport));
    out.rate_limit.push(p.rate);
    out.rate_cause.push(p.cause);
    out.p50_ms.push(p.p50);
    out.p90_ms.push(p.p90);
    out.p99_ms.push(p.p99);
    out.in_flight.push(p.in_flight);
    out.done.push(p.done);
    out.buckets_committed.push(p.buckets_committed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::RunStart;

    fn run(id: &str, started_ms: u64) -> Record {
        Record::Run(RunStart {
            run_id: id.into(),
            started_ms,
            pid: 7,
            worker: None,
            spec: serde_json::Value::Null,
        })
    }

    fn sample(run: &str, at_ms: u64, ok: u64, job_ok: u64) -> Record {
        Record::Sample(Sample {
            at_ms,
            run_id: run.into(),
            worker: None,
            ok,
            failed: 0,
            retries: 0,
            attempts: ok,
            pages: 0,
            throttled: 0,
            answers: crate::history::Answers {
                s2xx: ok,
                ..Default::default()
            },
            p50_ms: Some(at_ms as f64),
            p90_ms: Some(at_ms as f64),
            p99_ms: Some(at_ms as f64),
            rate: Some(10.0),
            rate_cause: RateCause::Configured,
            in_flight: 1,
            job_ok,
            job_failed: 0,
            job_pending: 0,
            buckets_committed: 0,
            buckets_planned: 0,
            rows_read: 0,
            input_rows: None,
        })
    }

    #[test]
    fn rates_restart_with_each_run_and_never_cross_a_restart() {
        let records = vec![
            run("a", 0),
            sample("a", 10_000, 100, 100),
            sample("a", 20_000, 300, 300),
            run("b", 30_000),
            // The new run's counters start at 0: its first rate is from its start.
            sample("b", 40_000, 50, 350),
        ];
        let s = downsample(&records, 100);
        assert_eq!(s.items_per_s, vec![10.0, 20.0, 5.0]);
        assert_eq!(s.answers_2xx_per_s, vec![10.0, 20.0, 5.0]);
        assert_eq!(s.done, vec![100.0, 300.0, 350.0]);
        assert_eq!(s.runs.len(), 2);
        assert_eq!(s.runs[1].t, 30.0);
    }

    #[test]
    fn the_rates_of_workers_running_at_the_same_time_add_up() {
        // Two workers, each 10 items/s, sampled every 10 s, interleaved.
        let mut records = vec![run("a", 0), run("b", 0)];
        for i in 1..=30u64 {
            records.push(sample("a", i * 10_000, i * 100, 0));
            records.push(sample("b", i * 10_000 + 500, i * 100, 0));
        }
        let s = downsample(&records, 2000);
        assert!(s.t.len() <= 31, "{}", s.t.len());
        // Every slot after the first holds one sample of each: 20 items/s.
        for r in &s.items_per_s[1..] {
            assert!((r - 20.0).abs() < 0.01, "{:?}", s.items_per_s);
        }
        assert_eq!(s.rate_limit[5], Some(20.0));
        assert_eq!(s.in_flight[5], 2.0);
    }

    #[test]
    fn many_samples_are_merged_into_at_most_the_points_asked_for_keeping_totals_and_peaks() {
        let mut records = vec![run("a", 0)];
        for i in 1..=100_000u64 {
            records.push(sample("a", i * 1000, i * 2, i * 2));
        }
        let s = downsample(&records, 2000);
        assert_eq!(s.samples, 100_000);
        assert!(s.t.len() <= 2000, "{}", s.t.len());
        assert!(s.items_per_s.iter().all(|r| (*r - 2.0).abs() < 1e-9));
        assert_eq!(*s.done.last().unwrap(), 200_000.0);
        // The highest p99 of all is the last sample's, and it survives the merge.
        assert_eq!(*s.p99_ms.last().unwrap(), Some(100_000_000.0));
    }
}
