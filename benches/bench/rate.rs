//! `rate`: whether `--rate R` at defaults is what the API sees: achieved rate and the most
//! calls in any 1 s and 100 ms window, per R, each a fresh in-process run.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};
use highwater::job::RunOptions;
use highwater::throttle::{Rate, ThrottleOptions};

use crate::args::Args;
use crate::in_process::http_job;
use crate::machine::{machine_facts, Baseline};
use crate::numbers::{fmt_rate, thousands};
use crate::scratch::{finish_temp, temp_dir, write_input};
use crate::trace::rate_trace_between;

struct RateCase {
    rate: f64,
    ids: u64,
    calls: u64,
    /// From the start of the run (`Job::run`: the store opened, the job created) to the
    /// first call, at the server.
    first_after: Duration,
    /// From the start of the run to the last call, at the server.
    last_after: Duration,
    max_1s: usize,
    max_100ms: usize,
    /// (min, max) of the adaptive controller's rate during the run.
    limit_range: Option<(f64, f64)>,
    limit_changes: usize,
    ok: u64,
}

impl RateCase {
    /// The most calls allowed in any 1 s window: the target's `1.01 R + 2`.
    fn bound_1s(&self) -> f64 {
        1.01 * self.rate + 2.0
    }

    /// The most calls allowed in any 100 ms window: `0.1 R + max(2, 0.01 R) + 1`.
    fn bound_100ms(&self) -> f64 {
        0.1 * self.rate + (0.01 * self.rate).max(2.0) + 1.0
    }

    fn within(&self) -> bool {
        self.max_1s as f64 <= self.bound_1s() + 1e-9
            && self.max_100ms as f64 <= self.bound_100ms() + 1e-9
    }

    /// Calls per second from the start of the run, start-up included: `n` calls from the
    /// start to one interval after the last (a perfect limiter whose first call goes out at
    /// once reads exactly R).
    fn achieved(&self) -> f64 {
        self.calls as f64 / (self.last_after.as_secs_f64() + 1.0 / self.rate)
    }
}

pub async fn rate_accuracy(args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let (guard, tmp) = temp_dir(args.keep)?;
    let c = args.concurrency;
    let default_rates = [5.0, 50.0, 300.0, 2000.0, 8000.0, 20000.0];
    let rates = args.rates.as_deref().unwrap_or(&default_rates);
    let mut rows = Vec::new();
    for &r in rates {
        let adaptive = true;
        let row = rate_case(&tmp, r, adaptive, args, c).await?;
        eprintln!(
            "rate {}: {} calls, first after {:.1} ms, last after {:.2} s: {:.4} of R; max {} in 1 s, {} in 100 ms",
            fmt_rate(r),
            row.calls,
            row.first_after.as_secs_f64() * 1e3,
            row.last_after.as_secs_f64(),
            row.achieved() / r,
            row.max_1s,
            row.max_100ms
        );
        rows.push(row);
    }

    let mut out = String::new();
    writeln!(
        out,
        "\n## highwater rate accuracy (`--rate R` at defaults)\n"
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- per row: a fresh fake API (`ApiConfig::fast()`: no latency, no faults), a fresh \
         sled state dir, {}·R distinct IDs, a `Job` run in this process with concurrency \
         {c}, `ThrottleOptions {{ rate: Some(R), ..Default::default() }}` (adaptive on, \
         default burst{})",
        args.secs,
        match args.burst {
            Some(b) => format!(": here --burst {b}"),
            None => String::new(),
        }
    )?;
    writeln!(
        out,
        "- the server timestamps every call when it is routed; achieved = calls / (last call \
         − start of the run + 1/R), start-up included (a perfect limiter whose first call \
         goes out at once reads 1.000); windows are half-open `[t, t+w)` over every start t; \
         bounds (the target): `1.01 R + 2` in 1 s, `0.1 R + max(2, 0.01 R) + 1` in 100 ms\n"
    )?;
    writeln!(
        out,
        "| --rate | achieved / R | most in any 1 s (bound) | most in any 100 ms (bound) | first call after | calls | controller limit | within bounds |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|:---:|")?;
    let mut failed = Vec::new();
    for r in &rows {
        writeln!(
            out,
            "| {} | {:.3} | {} ({:.0}) | {} ({:.0}) | {:.1} ms | {} | {} | {} |",
            fmt_rate(r.rate),
            r.achieved() / r.rate,
            thousands(r.max_1s as u64),
            r.bound_1s().floor(),
            thousands(r.max_100ms as u64),
            r.bound_100ms().floor(),
            r.first_after.as_secs_f64() * 1e3,
            thousands(r.calls),
            match r.limit_range {
                None => "fixed".to_string(),
                Some((lo, hi)) if r.limit_changes == 0 => {
                    format!("{} throughout", fmt_rate(hi.max(lo)))
                }
                Some((lo, hi)) => format!(
                    "{} – {} ({} changes)",
                    fmt_rate(lo),
                    fmt_rate(hi),
                    r.limit_changes
                ),
            },
            if r.within() { "yes" } else { "**NO**" }
        )?;
        if !r.within() {
            failed.push(format!(
                "{}: window counts above the bound",
                fmt_rate(r.rate)
            ));
        }
        if r.ok != r.ids || r.calls != r.ids {
            failed.push(format!(
                "{}: {} ok and {} calls for {} IDs",
                fmt_rate(r.rate),
                r.ok,
                r.calls,
                r.ids
            ));
        }
    }
    let short: Vec<String> = rows
        .iter()
        .filter(|r| r.achieved() < 0.99 * r.rate)
        .map(|r| format!("{} ({:.3})", fmt_rate(r.rate), r.achieved() / r.rate))
        .collect();
    if !short.is_empty() {
        writeln!(
            out,
            "\nAchieved below 0.99·R (the target; not a bound violation): {}.",
            short.join(", ")
        )?;
    }
    print!("{out}");
    finish_temp(guard, &tmp);
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

async fn rate_case(
    tmp: &Path,
    r: f64,
    adaptive: bool,
    args: &Args,
    concurrency: usize,
) -> Result<RateCase> {
    let (secs, keep) = (args.secs, args.keep);
    let n = ((secs as f64 * r).round() as u64).max(2);
    let dir = tmp.join(format!(
        "rate-{r}-{}",
        if adaptive { "adaptive" } else { "fixed" }
    ));
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("ids.txt");
    write_input(&input, n)?;
    let api = FakeApi::start(ApiConfig::fast())
        .await
        .context("starting the fake API")?;
    let job = http_job(&api, &input, &dir.join("state"))?.options(RunOptions {
        concurrency,
        progress_interval: Duration::ZERO,
        throttle: ThrottleOptions {
            rate: Some(Rate::new(r).ok_or_else(|| anyhow!("bad rate {r}"))?),
            adaptive,
            burst: args.burst,
            ..Default::default()
        },
        ..Default::default()
    });
    let started = Instant::now();
    let summary = job.run().await.context("highwater run")?;
    let trace = rate_trace_between(started, Instant::now());
    let times = api.call_times();
    let after = |t: Option<&Instant>| t.map(|t| *t - started).unwrap_or_default();
    let row = RateCase {
        rate: r,
        ids: n,
        calls: api.total_calls(),
        first_after: after(times.first()),
        last_after: after(times.last()),
        max_1s: api.max_calls_in_window(Duration::from_secs(1)),
        max_100ms: api.max_calls_in_window(Duration::from_millis(100)),
        limit_range: adaptive.then(|| {
            trace
                .iter()
                .fold((r, r), |(lo, hi), &(_, v)| (lo.min(v), hi.max(v)))
        }),
        limit_changes: trace.len(),
        ok: summary.job.ok,
    };
    if !summary.job.finished() {
        bail!(
            "the run at {} did not finish:\n{}",
            fmt_rate(r),
            summary.render()
        );
    }
    api.shutdown().await;
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(row)
}
