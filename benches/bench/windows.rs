//! `windows`: an API's quota windows over a run. The fake API allows 50 calls per 2 s and
//! 200 per 10 s (fixed windows on the epoch, 429 above either), answers after 20 ms, and
//! announces its windows in IETF `RateLimit` headers, in GitHub-style `X-RateLimit-*`
//! headers, or not at all (then the run is also made with the windows as `--quota` flags).
//! Per case: goodput (calls answered 200 per second, first call to last) against the 20/s
//! the windows allow, and the share of answers that were 429.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use highwater::demo::api::{Announce, ApiConfig, ApiWindow, FakeApi};

use super::{binary, finish_temp, id_of, loadavg, logged_run_args, median, temp_dir, Args, Proc};

/// What the windows allow over a long run: the stricter of 50/2 s and 200/10 s.
const ALLOWED_PER_SEC: f64 = 20.0;

/// The cases: how the API announces its windows, and the run's extra flags.
const CASES: [(&str, Announce, &[&str]); 4] = [
    ("RateLimit headers", Announce::Ietf, &[]),
    ("X-RateLimit headers", Announce::XRateLimit, &[]),
    ("no headers, no flags", Announce::None, &[]),
    (
        "no headers, --quota 50/2s --quota 200/10s",
        Announce::None,
        &["--quota", "50/2s", "--quota", "200/10s"],
    ),
];

fn config(announce: Announce) -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(20),
        latency_max: Duration::from_millis(20),
        windows: vec![
            ApiWindow {
                limit: 50,
                length: Duration::from_secs(2),
            },
            ApiWindow {
                limit: 200,
                length: Duration::from_secs(10),
            },
        ],
        announce,
        ..ApiConfig::fast()
    }
}

/// One run: goodput against what the windows allow, and the 429 share.
struct Run {
    goodput: f64,
    share_429: f64,
    calls: u64,
}

pub fn windows(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let bin = binary(args)?;
    let (guard, tmp) = temp_dir(args.keep)?;
    println!("# windows: {command}");
    println!(
        "# {} IDs, --concurrency {}; API: 200 after 20 ms, 50 calls per 2 s and 200 per 10 s \
         (429 above either; {ALLOWED_PER_SEC}/s over a long run); load {}",
        args.ids,
        args.concurrency,
        loadavg()
    );
    let ids: Vec<String> = (0..args.ids).map(id_of).collect();
    let input = tmp.join("ids.txt");
    std::fs::write(&input, ids.join("\n") + "\n")?;
    let bins: Vec<(&str, &Path)> = std::iter::once(("after", bin.as_path()))
        .chain(args.before.as_deref().map(|b| ("before", b)))
        .collect();
    let mut rows = String::new();
    for (name, announce, flags) in CASES {
        let mut cells = Vec::new();
        for (label, bin) in &bins {
            if *label == "before" && !flags.is_empty() {
                cells.push("-".to_string());
                continue;
            }
            let mut goodputs = Vec::new();
            let mut shares = Vec::new();
            for round in 0..args.repeat {
                let state = tmp.join(format!("{}-{label}-{round}", name.len()));
                let r = run(rt, bin, args, config(announce), flags, &input, &state)?;
                eprintln!(
                    "{name}, {label}: goodput {:.3} of {ALLOWED_PER_SEC}/s, {:.2}% answers 429 ({} calls)",
                    r.goodput,
                    100.0 * r.share_429,
                    r.calls
                );
                goodputs.push(r.goodput);
                shares.push(r.share_429);
            }
            cells.push(format!(
                "**{:.3}**, {:.2}% 429",
                median(&goodputs),
                100.0 * median(&shares)
            ));
        }
        let _ = writeln!(rows, "| {name} | {} |", cells.join(" | "));
    }
    println!();
    let header: Vec<String> = bins
        .iter()
        .map(|(label, _)| format!("{label}: goodput ÷ allowed, answers 429 (median)"))
        .collect();
    println!("| the API's windows | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(bins.len()));
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
    flags: &[&str],
    input: &Path,
    state: &Path,
) -> Result<Run> {
    let api = rt
        .block_on(FakeApi::start(config))
        .context("starting the fake API")?;
    let mut cmd = logged_run_args(input, &api.url_template(), state, args.concurrency);
    cmd.extend(flags.iter().map(|s| s.to_string()));
    let log = state.with_extension("log");
    let mut proc = Proc::spawn(bin, &cmd, &log)?;
    let exit = loop {
        if let Some(e) = proc.reap(false)? {
            break e;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if exit.code != Some(0) {
        bail!(
            "{} {}: {}",
            bin.display(),
            exit.describe(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let times = api.call_times();
    let span = match (times.first(), times.last()) {
        (Some(a), Some(b)) if b > a => (*b - *a).as_secs_f64(),
        _ => bail!("no calls to time"),
    };
    let calls = api.total_calls();
    Ok(Run {
        goodput: (api.accepted().saturating_sub(1)) as f64 / span / ALLOWED_PER_SEC,
        share_429: api.window_refusals() as f64 / calls.max(1) as f64,
        calls,
    })
}
