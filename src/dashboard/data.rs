//! The dashboard's data: what each endpoint answers, as JSON, from one [`Reading`].
//!
//! Owns the summary (figures, a smoothed ETA, a paginated job's pages, the runner, the spec
//! and its history), the history's chart columns, the bucket map (at most a given number of
//! cells, whose counts always add up to the job's buckets), the failures table and the
//! workers. Everything is computed here, on the server: the page only draws.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::source::Reading;
use crate::history::{self, Record, Sample};
use crate::live::Runner;

/// The span the summary's ETA is smoothed over.
pub(crate) const ETA_WINDOW_MS: u64 = 10 * 60 * 1000;

/// Points of each history series at most, unless asked otherwise.
pub(crate) const DEFAULT_POINTS: usize = 2000;

/// Cells of the bucket map at most, unless asked otherwise.
pub(crate) const DEFAULT_CELLS: usize = 2000;

/// What a page says of the parts a running job's lock keeps from it.
pub(crate) const LOCKED_NOTE: &str =
    "a run holds this state directory: the bucket map, the failures \
     and the error classes are read from the store, which only one process may open, and \
     are shown once no run holds it (or live, by a run that serves its own dashboard); figures, charts and the spec come from what the run \
     publishes (live.json, history.log)";

/// `GET /api/summary`.
pub(crate) fn summary(r: &Reading) -> Value {
    let stats = r.stats.clone().unwrap_or_default();
    let input_rows = input_rows(r);
    let eta = smoothed_rate(&r.history, settled).map(|rate| {
        let left = input_rows.map(|total| stats.pending + total.saturating_sub(stats.rows_read));
        let eta = left
            .filter(|_| rate > 0.0)
            .map(|l| (l as f64 / rate).round() as u64);
        (rate, eta)
    });
    let runs: Vec<Value> = r
        .history
        .iter()
        .filter_map(|rec| match rec {
            Record::Run(run) => Some(json!({
                "run_id": run.run_id,
                "started_ms": run.started_ms,
                "pid": run.pid,
                "worker": run.worker,
            })),
            Record::Sample(_) => None,
        })
        .collect();
    let spec_history = r
        .spec
        .as_ref()
        .and_then(|s| s.get("history").cloned())
        .unwrap_or(Value::Array(Vec::new()));
    json!({
        "source": r.shown,
        "job_id": r.spec.as_ref().and_then(|s| s.get("job_id").cloned()),
        "generated_ms": crate::store::now_ms(),
        "store_read": r.store_read,
        "note": (!r.store_read && r.workers.is_none()).then_some(LOCKED_NOTE),
        "runner": r.runner.map(runner_name).unwrap_or("none"),
        "running": matches!(r.runner, Some(Runner::Live | Runner::Stale)),
        "stats": stats,
        "finished": stats.finished(),
        "input_rows": input_rows,
        "bucket_size": r.bucket_size,
        "failed_by_class": r.failed_by_class,
        "live": r.live,
        // Items per second over the last ten minutes of the history, and the time left at
        // that speed; the live snapshot's (last minute) beside it.
        "items_per_second": eta.map(|(rate, _)| (rate * 100.0).round() / 100.0),
        "eta_seconds": eta.and_then(|(_, eta)| eta).or(r.live.as_ref().and_then(|l| l.eta_seconds)),
        "pages": pages(r),
        "runs": runs,
        "limits": limits(r),
        "spend": spend(r, &stats, input_rows),
        "spec": r.spec,
        "spec_history": spec_history,
    })
}

/// What a priced job spent (by the prices its spec keeps), projected over the input's rows.
fn spend(
    r: &Reading,
    stats: &crate::store::StoreStats,
    input_rows: Option<u64>,
) -> Option<crate::meter::Spend> {
    let spec = r.spec.as_ref()?;
    let prices: crate::meter::Prices = serde_json::from_value(spec.get("prices")?.clone()).ok()?;
    let budget = spec
        .get("budget")
        .and_then(|b| serde_json::from_value::<crate::meter::Money>(b.clone()).ok());
    Some(crate::meter::Spend::new(
        prices,
        stats.usage,
        stats.rows_read.saturating_sub(stats.pending),
        input_rows,
        budget,
    ))
}

/// The limits pacing the job, a line each, as progress lines and `status` word them: while a
/// run goes, its quotas and the API's announced or learnt limits as it knows them; then the
/// limits the job keeps from its refusals (a finished job's too).
fn limits(r: &Reading) -> Vec<String> {
    let mut lines = Vec::new();
    let running = matches!(r.runner, Some(Runner::Live | Runner::Stale));
    if let Some(live) = r.live.as_ref().filter(|_| running) {
        lines.extend(live.quotas.iter().map(|q| q.render()));
        lines.extend(live.announced.iter().map(|a| a.render()));
    }
    lines.extend(
        r.learned
            .iter()
            .map(|l| format!("kept with the job: API limit {}", l.render())),
    );
    lines
}

fn runner_name(r: Runner) -> &'static str {
    match r {
        Runner::Live => "live",
        Runner::Stale => "stale",
        Runner::Died => "died",
        Runner::Finished => "finished",
    }
}

/// Rows in the whole input, if known: the store read it to the end, or a run counted it.
fn input_rows(r: &Reading) -> Option<u64> {
    if let Some(s) = &r.stats {
        if s.input_exhausted {
            return Some(s.rows_read);
        }
    }
    r.live.as_ref().and_then(|l| l.input_rows).or_else(|| {
        r.history.iter().rev().find_map(|rec| match rec {
            Record::Sample(s) => s.input_rows,
            Record::Run(_) => None,
        })
    })
}

/// Items settled (ok or failed) by a sample's run: what the summary's speed and ETA count.
///
/// An ID of a paginated job settles after its last page, so its items per second already
/// take in the calls of all its pages, and the ETA (the IDs left at that speed) is right
/// for it without knowing how many pages an ID has, which no one knows before its last.
fn settled(s: &Sample) -> u64 {
    s.ok + s.failed
}

/// Pages of paginated IDs, for the summary: answered job-wide (each run's newest count in
/// the history, or in the live snapshot when that is newer, summed over the runs), by the
/// run going on (while one does), and per second over the same window as the items; none
/// for a job that has answered no page.
fn pages(r: &Reading) -> Option<Value> {
    let mut by_run: HashMap<(&str, Option<&str>), u64> = HashMap::new();
    for rec in &r.history {
        if let Record::Sample(s) = rec {
            let n = by_run.entry((&s.run_id, s.worker.as_deref())).or_default();
            *n = (*n).max(s.pages);
        }
    }
    let running = matches!(r.runner, Some(Runner::Live | Runner::Stale));
    if let Some(live) = &r.live {
        let n = by_run.entry((&live.run_id, None)).or_default();
        *n = (*n).max(live.pages);
    }
    let answered: u64 = by_run.values().sum();
    (answered > 0).then(|| {
        json!({
            "answered": answered,
            "this_run": r.live.as_ref().filter(|_| running).map(|l| l.pages),
            "per_second": smoothed_rate(&r.history, |s| s.pages)
                .map(|rate| (rate * 100.0).round() / 100.0),
        })
    })
}

/// What `count` counts per second over the last [`ETA_WINDOW_MS`] of the newest run: from
/// its oldest sample (or its start) in the window, or from the newest before the window when
/// the window holds none.
fn smoothed_rate(history: &[Record], count: impl Fn(&Sample) -> u64) -> Option<f64> {
    let mut older = history
        .iter()
        .rev()
        .skip_while(|r| matches!(r, Record::Run(_)));
    let Some(Record::Sample(newest)) = older.next() else {
        return None;
    };
    let in_window = |at_ms: u64| newest.at_ms.saturating_sub(at_ms) <= ETA_WINDOW_MS;
    // The oldest point of the run in the window; the newest before it if there is none.
    let mut from: Option<(u64, u64)> = None;
    for r in older {
        let point = match r {
            Record::Sample(s) if s.run_id == newest.run_id => (s.at_ms, count(s)),
            Record::Run(run) if run.run_id == newest.run_id => (run.started_ms, 0),
            _ => break,
        };
        if in_window(point.0) || from.is_none() {
            from = Some(point);
        }
        if !in_window(point.0) || matches!(r, Record::Run(_)) {
            break;
        }
    }
    let (at_ms, done) = from?;
    let dt = newest.at_ms.saturating_sub(at_ms) as f64 / 1e3;
    let counted = count(newest).saturating_sub(done);
    (dt > 0.0).then(|| counted as f64 / dt)
}

/// `GET /api/history?points=N`.
pub(crate) fn history(r: &Reading, points: usize) -> Value {
    serde_json::to_value(history::downsample(&r.history, points)).unwrap_or_default()
}

/// The buckets the job will have: all planned ones once the input is read to the end, else
/// as many as the input's rows make (once counted), never fewer than planned.
fn total_buckets(r: &Reading, planned: u64) -> u64 {
    let stats = r.stats.clone().unwrap_or_default();
    if stats.input_exhausted {
        return planned;
    }
    let estimate = match (input_rows(r), r.bucket_size) {
        (Some(rows), Some(size)) if size > 0 => rows.div_ceil(size),
        _ => 0,
    };
    estimate.max(planned)
}

/// `GET /api/buckets?cells=N`: the bucket map. Each cell is a run of consecutive buckets
/// (one bucket a cell when they are few) with its buckets by state: committed without
/// failures, committed with failures, planned but not committed (in flight, or left open
/// by a stopped run), not planned yet. The cells' counts add up to the job's buckets.
pub(crate) fn buckets(r: &Reading, cells: usize) -> Value {
    let stats = r.stats.clone().unwrap_or_default();
    let Some(all) = &r.buckets else {
        let total = total_buckets(r, stats.buckets_planned);
        return json!({
            "available": false,
            "note": LOCKED_NOTE,
            "total": total,
            "committed": stats.buckets_committed,
            "open": stats.buckets_planned.saturating_sub(stats.buckets_committed),
            "pending": total.saturating_sub(stats.buckets_planned),
        });
    };
    let planned = all
        .last()
        .map_or(0, |b| b.offset.bucket + 1)
        .max(all.len() as u64);
    let total = total_buckets(r, planned);
    let n = (cells.max(1) as u64).min(total).max(1);
    let cell_of = |b: u64| {
        (b.min(total.saturating_sub(1)) as u128 * n as u128 / total.max(1) as u128) as usize
    };
    let first = |c: u64| (c as u128 * total as u128).div_ceil(n as u128) as u64;
    let mut ok = vec![0u64; n as usize];
    let mut failed = vec![0u64; n as usize];
    let mut open = vec![0u64; n as usize];
    for b in all {
        let c = cell_of(b.offset.bucket);
        match &b.commit {
            Some(commit) if commit.failed > 0 => failed[c] += 1,
            Some(_) => ok[c] += 1,
            None => open[c] += 1,
        }
    }
    let firsts: Vec<u64> = (0..n).map(first).collect();
    let lasts: Vec<u64> = (0..n)
        .map(|c| first(c + 1).saturating_sub(1).min(total.saturating_sub(1)))
        .collect();
    let pending: Vec<u64> = (0..n as usize)
        .map(|c| {
            let size = if total == 0 {
                0
            } else {
                lasts[c] + 1 - firsts[c]
            };
            size.saturating_sub(ok[c] + failed[c] + open[c])
        })
        .collect();
    let sum = |v: &[u64]| v.iter().sum::<u64>();
    json!({
        "available": true,
        "total": total,
        "committed": sum(&ok),
        "with_failures": sum(&failed),
        "open": sum(&open),
        "pending": sum(&pending),
        "buckets_per_cell": if total == 0 { 0.0 } else { total as f64 / n as f64 },
        "cells": {
            "first": if total == 0 { Vec::new() } else { firsts },
            "last": if total == 0 { Vec::new() } else { lasts },
            "committed": if total == 0 { Vec::new() } else { ok },
            "with_failures": if total == 0 { Vec::new() } else { failed },
            "open": if total == 0 { Vec::new() } else { open },
            "pending": if total == 0 { Vec::new() } else { pending },
        },
    })
}

/// `GET /api/failures?class=&bucket=&limit=`.
pub(crate) fn failures(r: &Reading) -> Value {
    match &r.failures {
        Some(f) => json!({
            "available": true,
            "matched": f.matched,
            "rows": f.rows,
            "by_class": r.failed_by_class,
            "classes": crate::failure::ErrorClass::ALL.map(|c| c.name()),
        }),
        None => json!({
            "available": false,
            "note": LOCKED_NOTE,
            "classes": crate::failure::ErrorClass::ALL.map(|c| c.name()),
        }),
    }
}

/// `GET /api/workers`: a PostgreSQL job's workers (host, heartbeat, share, figures); for a
/// state directory, its one runner.
pub(crate) fn workers(r: &Reading) -> Value {
    match &r.workers {
        Some(w) => json!({"fleet": true, "workers": w}),
        None => json!({
            "fleet": false,
            "workers": r.live.iter().filter(|_| matches!(r.runner, Some(Runner::Live | Runner::Stale))).map(|l| json!({
                "worker": l.run_id,
                "pid": l.pid,
                "host": "this machine",
                "started_ms": l.started_ms,
                "heartbeat_ms": l.updated_ms,
                "items_per_second": l.items_per_second,
                "state": "alive",
            })).collect::<Vec<_>>(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BucketState, CommitRecord, OffsetRecord, StoreStats};

    fn bucket(n: u64, commit: Option<u64>) -> BucketState {
        let offset = OffsetRecord {
            bucket: n,
            start: crate::input::Cursor::default(),
            end: crate::input::Cursor::default(),
            items: 1,
            duplicates: 0,
            bad_lines: 0,
            input: crate::input::Fingerprint { len: 0, xxh3: 0 },
            planned_at_ms: 0,
        };
        BucketState {
            offset,
            commit: commit.map(|failed| CommitRecord {
                bucket: n,
                ok: 1 - failed.min(1),
                failed,
                committed_at_ms: 0,
                failed_by_class: Default::default(),
                usage: Default::default(),
            }),
        }
    }

    #[test]
    fn the_bucket_maps_cells_add_up_to_the_jobs_buckets_however_many_cells() {
        // 1,000 rows of buckets of 1: 10 committed (2 with failures), 5 open, 985 unplanned.
        let mut all: Vec<BucketState> =
            (0..10).map(|n| bucket(n, Some(u64::from(n < 2)))).collect();
        all.extend((10..15).map(|n| bucket(n, None)));
        let reading = Reading {
            buckets: Some(all),
            stats: Some(StoreStats {
                buckets_planned: 15,
                buckets_committed: 10,
                rows_read: 15,
                ..StoreStats::default()
            }),
            bucket_size: Some(1),
            ..Reading::default()
        };
        for cells in [1, 7, 15, 2000] {
            // The input's size, as a run counted it.
            let map = buckets(&with_rows(reading.clone(), 1000), cells);
            let sum = |k: &str| -> u64 {
                map["cells"][k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .sum()
            };
            let all = sum("committed") + sum("with_failures") + sum("open") + sum("pending");
            assert_eq!(all, 1000, "cells {cells}: {map}");
            assert_eq!(map["total"], 1000);
            assert_eq!(
                (sum("committed"), sum("with_failures"), sum("open")),
                (8, 2, 5)
            );
            assert!(map["cells"]["first"].as_array().unwrap().len() <= cells);
        }
    }

    #[test]
    fn the_eta_is_smoothed_over_the_newest_runs_last_ten_minutes_and_never_crosses_a_restart() {
        let run = |id: &str, at: u64| {
            Record::Run(crate::history::RunStart {
                run_id: id.into(),
                started_ms: at,
                pid: 1,
                worker: None,
                spec: json!({"bucket_size": 10}),
            })
        };
        let sample = |id: &str, at: u64, done: u64| {
            let Record::Sample(mut s) = with_rows(Reading::default(), 10_000).history.remove(0)
            else {
                unreachable!()
            };
            s.run_id = id.into();
            s.at_ms = at;
            s.ok = done;
            Record::Sample(s)
        };
        // An old run at 100/s, then the newest at 10/s: from its start (one sample yet).
        let mut history = vec![run("a", 0), sample("a", 60_000, 6000), run("b", 100_000)];
        history.push(sample("b", 110_000, 100));
        let reading = Reading {
            stats: Some(StoreStats {
                rows_read: 10_000,
                pending: 1000,
                input_exhausted: true,
                ..StoreStats::default()
            }),
            history,
            ..Reading::default()
        };
        let s = summary(&reading);
        assert_eq!(s["items_per_second"], 10.0);
        assert_eq!(s["eta_seconds"], 100);
        // Later samples: from the oldest within ten minutes (or, with none, the newest
        // before).
        let mut later = reading.clone();
        later.history.push(sample("b", 800_000, 20_000));
        let s = summary(&later);
        let expected = (20_000.0 - 100.0) / 690.0;
        assert!(
            (s["items_per_second"].as_f64().unwrap() - expected).abs() < 0.01,
            "{s}"
        );
        later.history.push(sample("b", 900_000, 21_000));
        later.history.push(sample("b", 1_000_000, 23_000));
        let s = summary(&later);
        let expected = (23_000.0 - 20_000.0) / 200.0;
        assert!(
            (s["items_per_second"].as_f64().unwrap() - expected).abs() < 0.01,
            "{s}"
        );
        assert_eq!(s["runs"].as_array().unwrap().len(), 2);
    }

    /// A sample of `run` at `at_ms`: `ok` IDs and `pages` pages answered since its start.
    fn paged_sample(run: &str, at_ms: u64, ok: u64, pages: u64) -> Record {
        let Record::Sample(mut s) = with_rows(Reading::default(), 110).history.remove(0) else {
            unreachable!()
        };
        (s.run_id, s.at_ms, s.ok, s.pages) = (run.into(), at_ms, ok, pages);
        Record::Sample(s)
    }

    fn run_start(id: &str, at: u64) -> Record {
        Record::Run(crate::history::RunStart {
            run_id: id.into(),
            started_ms: at,
            pid: 1,
            worker: None,
            spec: json!({"bucket_size": 10}),
        })
    }

    #[test]
    fn a_paginated_jobs_eta_counts_the_ids_left_at_the_ids_speed_whatever_their_pages() {
        // 10 IDs settled in 10 s: 1 ID/s, of 40 or 400 pages each; 100 IDs left.
        for pages_each in [40, 400] {
            let reading = Reading {
                stats: Some(StoreStats {
                    rows_read: 110,
                    ok: 10,
                    input_exhausted: true,
                    pending: 100,
                    buckets_planned: 11,
                    buckets_committed: 1,
                    ..StoreStats::default()
                }),
                history: vec![
                    run_start("a", 0),
                    paged_sample("a", 10_000, 10, 10 * pages_each),
                ],
                ..Reading::default()
            };
            let s = summary(&reading);
            assert_eq!(s["items_per_second"], 1.0, "{s}");
            assert_eq!(s["eta_seconds"], 100, "{pages_each} pages an ID: {s}");
            assert_eq!(s["pages"]["per_second"], pages_each as f64, "{s}");
        }
    }

    #[test]
    fn the_pages_answered_add_up_each_runs_newest_count_and_a_job_without_pages_has_none() {
        let live: crate::live::LiveSnapshot = serde_json::from_value(json!({
            "pid": 1, "job_id": "j", "run_id": "b", "started_ms": 100_000,
            "updated_ms": 121_000, "finished": false, "items_per_second": 1.0,
            "effective_rate": null, "eta_seconds": null, "ok": 0, "failed": 0, "pending": 0,
            "buckets_committed": 0, "buckets_planned": 0, "rows_read": 0, "input_rows": null,
            "run_ok": 0, "run_failed": 0, "retries": 0, "pages": 450, "throttled": 0,
            "in_flight": 0,
        }))
        .unwrap();
        // Run a (killed) answered 400 pages; run b 400 at its last sample, 450 since.
        let mut reading = Reading {
            history: vec![
                run_start("a", 0),
                paged_sample("a", 10_000, 5, 100),
                paged_sample("a", 20_000, 10, 400),
                run_start("b", 100_000),
                paged_sample("b", 110_000, 10, 400),
            ],
            live: Some(live),
            runner: Some(Runner::Live),
            ..Reading::default()
        };
        let s = summary(&reading);
        assert_eq!(s["pages"]["answered"], 850, "{s}");
        assert_eq!(s["pages"]["this_run"], 450, "{s}");
        assert_eq!(
            s["pages"]["per_second"], 40.0,
            "run b's, from its start: {s}"
        );
        // Once the run ended, its pages are the job's, no run's.
        reading.runner = Some(Runner::Finished);
        let s = summary(&reading);
        assert_eq!(s["pages"]["answered"], 850, "{s}");
        assert!(s["pages"]["this_run"].is_null(), "{s}");
        // A job that does not paginate shows no pages at all.
        let s = summary(&with_rows(Reading::default(), 10));
        assert!(s["pages"].is_null(), "{s}");
    }

    fn with_rows(mut r: Reading, rows: u64) -> Reading {
        r.history = vec![Record::Sample(
            serde_json::from_value(json!({
                "at_ms": 1, "run_id": "r", "ok": 0, "failed": 0, "retries": 0,
                "attempts": 0, "throttled": 0, "answers": {"2xx":0,"3xx":0,"4xx":0,"5xx":0,"transport":0},
                "rate_cause": "none", "in_flight": 0, "job_ok": 0, "job_failed": 0,
                "job_pending": 0, "buckets_committed": 0, "buckets_planned": 0, "rows_read": 0,
                "input_rows": rows,
            }))
            .unwrap(),
        )];
        r
    }
}
