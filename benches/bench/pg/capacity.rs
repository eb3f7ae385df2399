//! `pg --only capacity`: the fleet against a hidden capacity. Three workers (`--workers`) on
//! one job, against a fake API of its own that answers 429 (no `Retry-After`) above C
//! requests/s (`FakeApi::set_capacity`: a token bucket, burst C/10): the job's `--rate` at
//! 2·C, and no `--rate` at all (each worker's adaptive concurrency alone); every other flag
//! at its default. The aim: goodput >= 0.9·C with <= 5% of the answers 429. Goodput
//! and the 429 share are the API's own counts over the middle of the run (20% to 80% of the
//! IDs answered 200), sampled every 100 ms.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};

use super::{Bench, JOB};
use crate::child::{worker_args, Exit, Proc, State};
use crate::numbers::thousands;
use crate::scratch::write_input;

/// The hidden capacity, requests per second.
const C: f64 = 300.0;
/// IDs per run: about 100 s at C, 30 buckets at the default bucket size (10 a worker), as a
/// long job has many per worker. With 6,000 (6 buckets, 2 a worker) the middle of the run
/// measured which worker was left holding the last buckets: one its controller had pushed
/// to a low rate ran them alone for seconds.
const IDS: u64 = 30_000;
/// The API's latencies: a fast one, and one slow enough that a loaded machine's scheduling
/// delays are small beside it.
const LATENCIES_MS: [u64; 2] = [2, 100];

/// One run's figures.
struct CapacityRun {
    latency_ms: u64,
    rate: Option<f64>,
    goodput: f64,
    share_429_middle: f64,
    share_429_all: f64,
    middle: Duration,
    elapsed: Duration,
    failed: String,
    exits: Vec<Exit>,
}

/// The API's counters at one moment.
struct Sample {
    at: Instant,
    accepted: u64,
    rejected: u64,
}

pub(super) fn capacity(
    rt: &tokio::runtime::Runtime,
    bench: &Bench,
    out: &mut String,
    failed: &mut Vec<String>,
) -> Result<()> {
    let input = bench.tmp.join("capacity-ids.txt");
    write_input(&input, IDS)?;
    let mut runs = Vec::new();
    for latency_ms in LATENCIES_MS {
        for rate in [Some(2.0 * C), None] {
            let run = capacity_run(rt, bench, &input, latency_ms, rate)?;
            let label = format!("{latency_ms} ms, --rate {rate:?}");
            if run.goodput < 0.9 * C || run.share_429_middle > 0.05 {
                failed.push(format!(
                    "capacity ({label}): {:.2}·C with {:.1}% 429s",
                    run.goodput / C,
                    100.0 * run.share_429_middle
                ));
            }
            runs.push(run);
        }
    }
    writeln!(
        out,
        "\n### {} workers against a hidden capacity C = {C}/s\n",
        bench.workers
    )?;
    writeln!(
        out,
        "A fake API of its own (no faults) answers 429 without `Retry-After` above C \
         (a token bucket, burst C/10). {} workers on one job of {} IDs, `--concurrency {}` \
         each, every other flag at its default (adaptive control on). Goodput and the 429 \
         share over the middle of the run (20% to 80% of the IDs answered 200), from the \
         API's counts sampled every 100 ms; the aim is >= 0.9·C with <= 5% 429s.\n",
        bench.workers,
        thousands(IDS),
        bench.c
    )?;
    writeln!(
        out,
        "| API latency | job's `--rate` | goodput (middle) | 429s (middle) | 429s (whole run) | middle | whole run | IDs failed | exits |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
    for r in &runs {
        writeln!(
            out,
            "| {} ms | {} | {:.0}/s = {:.2}·C | {:.1}% | {:.1}% | {:.1} s | {:.1} s | {} | {} |",
            r.latency_ms,
            r.rate.map_or("none".into(), |r| format!("{r:.0}")),
            r.goodput,
            r.goodput / C,
            100.0 * r.share_429_middle,
            100.0 * r.share_429_all,
            r.middle.as_secs_f64(),
            r.elapsed.as_secs_f64(),
            r.failed,
            r.exits
                .iter()
                .map(|e| e.code.map_or("signal".into(), |c| c.to_string()))
                .collect::<Vec<_>>()
                .join(" "),
        )?;
    }
    Ok(())
}

fn capacity_run(
    rt: &tokio::runtime::Runtime,
    bench: &Bench,
    input: &std::path::Path,
    latency_ms: u64,
    rate: Option<f64>,
) -> Result<CapacityRun> {
    let latency = Duration::from_millis(latency_ms);
    let api = rt
        .block_on(FakeApi::start(ApiConfig {
            latency_min: latency,
            latency_max: latency,
            ..ApiConfig::fast()
        }))
        .context("starting the capacity API")?;
    api.set_capacity(Some(C));
    let db = bench.cluster.create_db();
    let state = || State::Pg {
        url: &db.url,
        job: JOB,
    };
    let url = api.url_template();
    let rate_args: Vec<String> = rate
        .map(|r| vec!["--rate".into(), format!("{r}")])
        .unwrap_or_default();
    let label = format!("capacity-{latency_ms}ms-{}", rate.map_or(0, |r| r as u64));
    let log = |i: usize| bench.tmp.join(format!("{label}-{i}.log"));
    let creator = [
        worker_args(Some(input), &url, state(), bench.c),
        rate_args.clone(),
    ]
    .concat();
    eprintln!("{label}: {} {}", bench.bin.display(), creator.join(" "));
    let mut procs = vec![Proc::spawn(&bench.bin, &creator, &log(0))?];
    let t0 = procs[0].started;
    while api.total_calls() == 0 {
        if let Some(e) = procs[0].reap(false)? {
            bail!(
                "{label}: the first worker ended ({}) before calling",
                e.describe()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let joiner = [worker_args(None, &url, state(), bench.c), rate_args].concat();
    for i in 1..bench.workers {
        procs.push(Proc::spawn(&bench.bin, &joiner, &log(i))?);
    }
    let mut exits: Vec<Option<Exit>> = vec![None; procs.len()];
    let mut samples = Vec::new();
    loop {
        for (p, e) in procs.iter_mut().zip(exits.iter_mut()) {
            if e.is_none() {
                *e = p.reap(false)?;
            }
        }
        samples.push(Sample {
            at: Instant::now(),
            accepted: api.accepted(),
            rejected: api.rejected_429(),
        });
        if exits.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let exits: Vec<Exit> = exits.into_iter().flatten().collect();
    let last = exits.iter().map(|e| e.at).max().unwrap_or(t0);
    for (i, e) in exits.iter().enumerate() {
        if !matches!(e.code, Some(0 | 3)) {
            let text = std::fs::read_to_string(log(i)).unwrap_or_default();
            bail!(
                "{label}: worker {i} ended with {}:\n{}",
                e.describe(),
                text.trim()
            );
        }
    }
    let at = |share: f64| {
        samples
            .iter()
            .find(|s| s.accepted as f64 >= share * IDS as f64)
            .unwrap_or(&samples[samples.len() - 1])
    };
    let (from, to) = (at(0.2), at(0.8));
    let middle = to.at - from.at;
    let (acc, rej) = (to.accepted - from.accepted, to.rejected - from.rejected);
    let calls = api.total_calls().max(1);
    let failed = bench.sql(&db, "SELECT count(*) FROM hw_item WHERE status = 'failed'");
    Ok(CapacityRun {
        latency_ms,
        rate,
        goodput: acc as f64 / middle.as_secs_f64().max(1e-9),
        share_429_middle: rej as f64 / (acc + rej).max(1) as f64,
        share_429_all: api.rejected_429() as f64 / calls as f64,
        middle,
        elapsed: last - t0,
        failed: failed.trim().to_string(),
        exits,
    })
}
