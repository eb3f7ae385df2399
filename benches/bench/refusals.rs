//! `refusals`: an API that refuses some IDs every time. The fake API answers 200 after 20 ms,
//! 2% of IDs 404 and 3% (then 10%) of IDs 503 on every attempt, both at once (a gateway's
//! refusals), with and without `Retry-After: 1`. Each such run is set beside the same job
//! over the same input less the refused IDs, against the API without 503s: ok items/s until
//! the last ok answer (the whole run also waits out the refused IDs' last retries), their
//! ratio, the IDs failed with 503 against the refused ones, and the lowest rate limit the
//! progress lines showed (with `--rate`).

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use highwater::demo::api::{ApiConfig, FakeApi, Fault};

use super::{binary, finish_temp, id_of, loadavg, logged_run_args, median, temp_dir, Args, Proc};

/// The cases: per-mille of IDs refused, and the `Retry-After` of their 503s.
const CASES: [(u32, Option<u64>); 4] = [(30, None), (30, Some(1)), (100, None), (100, Some(1))];

fn config(unavailable_per_mille: u32, retry_after: Option<u64>) -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(20),
        latency_max: Duration::from_millis(20),
        not_found_per_mille: 20,
        unavailable_per_mille,
        transient_attempts: u32::MAX,
        seed: 31,
        unavailable_retry_after_secs: retry_after,
        refusals_at_once: true,
        ..ApiConfig::fast()
    }
}

/// One run of the binary.
struct Run {
    /// Answered 200.
    ok: u64,
    /// From the start to the last 200.
    to_last_ok: Duration,
    elapsed: Duration,
    /// IDs exported as failed with a 503.
    failed_503: u64,
    /// The lowest rate limit a progress line showed.
    lowest_rate: Option<f64>,
}

impl Run {
    fn ok_per_sec(&self) -> f64 {
        self.ok as f64 / self.to_last_ok.as_secs_f64().max(1e-9)
    }
}

pub fn refusals(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let bin = binary(args)?;
    let (guard, tmp) = temp_dir(args.keep)?;
    println!("# refusals: {command}");
    println!(
        "# {} IDs, --concurrency {}{}; API: 200 after 20 ms, 2% of IDs 404 and the refused ones 503 at once; load {}",
        args.ids,
        args.concurrency,
        args.job_rate
            .map(|r| format!(" --rate {r}"))
            .unwrap_or_default(),
        loadavg()
    );
    let mut rows = String::new();
    for (per_mille, retry_after) in CASES {
        let refusing = config(per_mille, retry_after);
        let ids: Vec<String> = (0..args.ids).map(id_of).collect();
        let refused = ids
            .iter()
            .filter(|id| refusing.fault(id) == Fault::Unavailable)
            .count() as u64;
        let kept: Vec<&String> = ids
            .iter()
            .filter(|id| refusing.fault(id) != Fault::Unavailable)
            .collect();
        let all_input = tmp.join(format!("all-{per_mille}.txt"));
        let kept_input = tmp.join(format!("kept-{per_mille}.txt"));
        std::fs::write(&all_input, ids.join("\n") + "\n")?;
        let kept_text: Vec<&str> = kept.iter().map(|s| s.as_str()).collect();
        std::fs::write(&kept_input, kept_text.join("\n") + "\n")?;
        let mut ratios = Vec::new();
        let mut text = Vec::new();
        let bins: Vec<(&str, &Path)> = std::iter::once(("after", bin.as_path()))
            .chain(args.before.as_deref().map(|b| ("before", b)))
            .collect();
        for (label, bin) in bins {
            for round in 0..args.repeat {
                let name = format!("{per_mille}-{}-{label}-{round}", retry_after.is_some());
                let with = run(
                    rt,
                    bin,
                    args,
                    refusing.clone(),
                    &all_input,
                    &tmp.join(&name),
                )?;
                let without = run(
                    rt,
                    bin,
                    args,
                    config(0, None),
                    &kept_input,
                    &tmp.join(format!("{name}-baseline")),
                )?;
                if with.failed_503 != refused {
                    bail!(
                        "{label}: {} IDs failed with 503, {refused} are refused (see {})",
                        with.failed_503,
                        tmp.display()
                    );
                }
                let ratio = with.ok_per_sec() / without.ok_per_sec();
                if label == "after" {
                    ratios.push(ratio);
                }
                text.push(format!(
                    "{label}: {:.0} ok/s ({:.1} s to the last ok, run {:.1} s) vs {:.0} ok/s without: {:.3}; lowest rate limit {}",
                    with.ok_per_sec(),
                    with.to_last_ok.as_secs_f64(),
                    with.elapsed.as_secs_f64(),
                    without.ok_per_sec(),
                    ratio,
                    with.lowest_rate
                        .map_or("-".to_string(), |r| format!("{r:.1}/s")),
                ));
                eprintln!(
                    "{:.1}% refused, Retry-After {:?}, {}",
                    per_mille as f64 / 10.0,
                    retry_after,
                    text.last().expect("just pushed")
                );
            }
        }
        let _ = writeln!(
            rows,
            "| {:.0}% | {} | {refused} | **{:.3}** | {} |",
            per_mille as f64 / 10.0,
            retry_after.map_or("none".to_string(), |s| format!("{s} s")),
            median(&ratios),
            text.join("<br>")
        );
    }
    println!();
    println!("| IDs refused every time | Retry-After | failed with 503 (all of them) | ok items/s ÷ without (median) | runs |");
    println!("|---|---|---|---|---|");
    print!("{rows}");
    finish_temp(guard, &tmp);
    Ok(())
}

/// Runs the binary over `input` against a fresh fake API of `config` to its end.
fn run(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    args: &Args,
    config: ApiConfig,
    input: &Path,
    state: &Path,
) -> Result<Run> {
    let api = rt
        .block_on(FakeApi::start(config))
        .context("starting the fake API")?;
    let mut cmd = logged_run_args(input, &api.url_template(), state, args.concurrency);
    if let Some(r) = args.job_rate {
        cmd.extend(["--rate".to_string(), r.to_string()]);
    }
    let log = state.with_extension("log");
    let mut proc = Proc::spawn(bin, &cmd, &log)?;
    let (mut ok, mut last_ok) = (0, proc.started);
    let exit = loop {
        if let Some(e) = proc.reap(false)? {
            break e;
        }
        let now = api.accepted();
        if now > ok {
            ok = now;
            last_ok = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if api.accepted() > ok {
        ok = api.accepted();
        last_ok = exit.at;
    }
    // Exit 0, or the code of a run that ended with failed IDs.
    if exit.code.is_none() || exit.code == Some(2) {
        bail!(
            "{} {}: {}",
            bin.display(),
            exit.describe(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let lowest_rate = stderr
        .lines()
        .filter_map(|l| l.split(", rate limit ").nth(1))
        .filter_map(|r| r.split('/').next()?.parse::<f64>().ok())
        .reduce(f64::min);
    let export = std::process::Command::new(bin)
        .args(["export", "--state", &state.display().to_string()])
        .output()
        .context("running export")?;
    let failed_503 = String::from_utf8_lossy(&export.stdout)
        .lines()
        .filter(|l| l.contains("\"status\":\"failed\"") && l.contains("\"http_status\":503"))
        .count() as u64;
    rt.block_on(api.shutdown());
    Ok(Run {
        ok,
        to_last_ok: last_ok - proc.started,
        elapsed: exit.at - proc.started,
        failed_503,
        lowest_rate,
    })
}
