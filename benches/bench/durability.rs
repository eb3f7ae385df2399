//! `durability`: synchronous (group commit) and `--async-progress` runs at bucket sizes 1,
//! 100 and 1000, interleaved, in one process against the same fast fake API.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};
use highwater::job::{Durability, RunOptions};

use crate::args::Args;
use crate::in_process::{http_job, timed_run, HwRun};
use crate::loops::{raw_client, raw_run};
use crate::machine::{machine_facts, us_per, Baseline};
use crate::numbers::{median, mib, rate, thousands};
use crate::scratch::{finish_temp, temp_dir, write_input};

pub async fn durability(args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let n = args.ids;
    let c = args.concurrency;
    let (guard, tmp) = temp_dir(args.keep)?;
    let input = tmp.join("ids.txt");
    write_input(&input, n)?;
    let api = FakeApi::start(ApiConfig::fast())
        .await
        .context("starting the fake API")?;
    let modes = [
        ("sync", Durability::Sync),
        (
            "async",
            Durability::Async {
                interval: Duration::from_secs(1),
            },
        ),
    ];
    let sizes = [1u64, 100, 1000];
    // Warm the server's per-ID counters so every timed run meets the same server.
    let client = raw_client(c);
    raw_run(&client, &api, n, c).await?;
    // results[mode][size] = runs
    let mut results: Vec<Vec<Vec<HwRun>>> = (0..modes.len())
        .map(|_| (0..sizes.len()).map(|_| Vec::new()).collect())
        .collect();
    for rep in 1..=args.repeat {
        for (m, (name, durability)) in modes.iter().enumerate() {
            for (k, size) in sizes.iter().enumerate() {
                if args
                    .only
                    .as_ref()
                    .is_some_and(|only| *only != format!("{name}:{size}"))
                {
                    continue;
                }
                let state = tmp.join(format!("state-{name}-{size}-{rep}"));
                let job = http_job(&api, &input, &state)?
                    .bucket_size(*size)
                    .options(RunOptions {
                        concurrency: c,
                        progress_interval: Duration::ZERO,
                        durability: *durability,
                        ..RunOptions::default()
                    });
                let run = timed_run(job, &api, &state, n, args.keep).await?;
                eprintln!(
                    "rep {rep}: {name:>5} bucket size {size:>4}: {:>8.0} items/s, {:.1} us CPU/item, \
                     {} writer waits, {} checkpoints, {} calls",
                    rate(n, run.elapsed),
                    us_per(run.cpu, n),
                    run.counters.writer_backpressure,
                    run.counters.checkpoints,
                    run.calls
                );
                results[m][k].push(run);
            }
        }
    }
    let med = |runs: &[HwRun]| median(&runs.iter().map(|r| rate(n, r.elapsed)).collect::<Vec<_>>());
    if args.only.is_some() {
        api.shutdown().await;
        finish_temp(guard, &tmp);
        return Ok(());
    }
    let mut out = String::new();
    writeln!(
        out,
        "\n## sync and async progress at bucket sizes 1, 100, 1000\n"
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- {} distinct IDs per run, {c} in flight, `ApiConfig::fast()` fake API in the same \
         process; a fresh state dir per run; {} rounds of the six runs, interleaved; medians",
        thousands(n),
        args.repeat
    )?;
    writeln!(
        out,
        "- sync: group commit (a bucket's commit record after the flush covering its last \
         result); async: `--async-progress --checkpoint-interval 1s`\n"
    )?;
    writeln!(
        out,
        "| mode | bucket size | items/s (median) | vs. same mode at 1000 | CPU per item | writer waits | state dir | exactly once |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|:---:|")?;
    let mut all_once = true;
    for (m, (name, _)) in modes.iter().enumerate() {
        let at_1000 = med(&results[m][sizes.len() - 1]);
        for (k, size) in sizes.iter().enumerate() {
            let runs = &results[m][k];
            let once = runs.iter().all(|r| r.calls == n);
            all_once &= once;
            let r = med(runs);
            writeln!(
                out,
                "| {name} | {size} | {} | {:.2} | {:.1} µs | {} | {} | {} |",
                thousands(r as u64),
                r / at_1000,
                median(&runs.iter().map(|r| us_per(r.cpu, n)).collect::<Vec<_>>()),
                runs.iter()
                    .map(|r| r.counters.writer_backpressure)
                    .sum::<u64>()
                    / runs.len() as u64,
                mib(median(
                    &runs
                        .iter()
                        .map(|r| r.state_bytes as f64)
                        .collect::<Vec<_>>()
                ) as u64),
                if once { "yes" } else { "**NO**" }
            )?;
        }
    }
    let a1 = med(&results[1][0]);
    let a1000 = med(&results[1][sizes.len() - 1]);
    writeln!(
        out,
        "\nasync at bucket size 1 / async at bucket size 1000: **{:.2}** (target at least 0.8)",
        a1 / a1000
    )?;
    print!("{out}");
    api.shutdown().await;
    finish_temp(guard, &tmp);
    if !all_once {
        bail!("the exactly-once check failed");
    }
    Ok(())
}
