//! `capacity`: adaptive rate control against a hidden capacity that steps (1000/s, 400/s,
//! 1000/s), beside a fixed rate: goodput, 429 share and settling time per phase.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};
use highwater::engine::StopHandle;
use highwater::job::{RetryPolicy, RunOptions};
use highwater::progress::RunSummary;
use highwater::throttle::{Rate, ThrottleOptions};

use crate::args::Args;
use crate::in_process::http_job;
use crate::machine::{machine_facts, Baseline};
use crate::numbers::{fmt_rate, median, mib, thousands};
use crate::scratch::{finish_temp, temp_dir, write_input};
use crate::trace::{limit_at, rate_trace_between};

/// The capacity steps, one phase each.
const CAPACITY_PHASES: [f64; 3] = [1000.0, 400.0, 1000.0];
/// The rate ceiling of both runs (above every capacity).
const CAPACITY_CEILING: f64 = 2000.0;
/// Sampling interval of the server's counters.
const BIN: Duration = Duration::from_millis(100);
/// Bins in the rolling window that judges settling (1 s).
const WINDOW_BINS: usize = 10;
/// Targets.
const TARGET_GOODPUT: f64 = 0.9;
const TARGET_429: f64 = 0.05;
const TARGET_SETTLE: Duration = Duration::from_secs(10);

/// The server's counters at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    accepted: u64,
    rejected: u64,
}

struct CapacityRun {
    adaptive: bool,
    /// `samples[0]` is the start of the run; phase `i` ends at sample `(i+1) * bins`.
    samples: Vec<Sample>,
    /// The controller's rate changes (adaptive only).
    trace: Vec<(Instant, f64)>,
    summary: RunSummary,
    stop_wait: Duration,
    calls: u64,
}

/// Counts over samples `a..b` (indices).
#[derive(Debug, Clone, Copy)]
struct Span {
    accepted: u64,
    rejected: u64,
    secs: f64,
}

impl Span {
    fn of(s: &[Sample], a: usize, b: usize) -> Span {
        Span {
            accepted: s[b].accepted - s[a].accepted,
            rejected: s[b].rejected - s[a].rejected,
            secs: (s[b].at - s[a].at).as_secs_f64(),
        }
    }

    fn goodput(&self) -> f64 {
        self.accepted as f64 / self.secs.max(1e-9)
    }

    fn attempts(&self) -> f64 {
        (self.accepted + self.rejected) as f64 / self.secs.max(1e-9)
    }

    fn share_429(&self) -> f64 {
        let all = self.accepted + self.rejected;
        if all == 0 {
            0.0
        } else {
            self.rejected as f64 / all as f64
        }
    }
}

struct PhaseStats {
    capacity: f64,
    whole: Span,
    /// Time from the step to the start of the stable suffix, and the figures after it.
    settled: Option<(Duration, Span)>,
    /// Time-averaged controller limit over the phase and over its settled part.
    mean_limit: f64,
    mean_limit_settled: Option<f64>,
    /// 1-s windows failing a target (of all 1-s windows in the phase).
    bad_windows: usize,
    windows: usize,
    /// The last window off target: its start after the step and its figures.
    last_bad: Option<(Duration, Span)>,
}

impl PhaseStats {
    fn meets_targets(&self) -> bool {
        match self.settled {
            Some((t, s)) => {
                t < TARGET_SETTLE
                    && s.goodput() >= TARGET_GOODPUT * self.capacity
                    && s.share_429() <= TARGET_429
            }
            None => false,
        }
    }
}

fn window_good(s: &[Sample], a: usize, capacity: f64) -> bool {
    let w = Span::of(s, a, a + WINDOW_BINS);
    w.share_429() <= TARGET_429 && w.goodput() >= TARGET_GOODPUT * capacity
}

fn phase_stats(run: &CapacityRun, phase: usize, bins: usize) -> PhaseStats {
    let s = &run.samples;
    let capacity = CAPACITY_PHASES[phase];
    let (first, last) = (phase * bins, (phase + 1) * bins);
    // Windows [a, a + 1 s) inside the phase; the stable suffix is the longest run of good
    // windows that ends with the phase's last window.
    let last_start = last - WINDOW_BINS;
    let mut a = last_start + 1;
    while a > first && window_good(s, a - 1, capacity) {
        a -= 1;
    }
    let settled = (a <= last_start).then(|| (s[a].at - s[first].at, Span::of(s, a, last)));
    let bad: Vec<usize> = (first..=last_start)
        .filter(|&w| !window_good(s, w, capacity))
        .collect();
    let bad_windows = bad.len();
    let last_bad = bad
        .last()
        .map(|&w| (s[w].at - s[first].at, Span::of(s, w, w + WINDOW_BINS)));
    let initial = CAPACITY_CEILING;
    let limit = |i: usize| {
        if run.adaptive {
            // The limit in force during bin i (ending at sample i): at its middle.
            let mid = s[i - 1].at + (s[i].at - s[i - 1].at) / 2;
            limit_at(&run.trace, mid, initial)
        } else {
            CAPACITY_CEILING
        }
    };
    let mean = |from: usize| {
        let v: Vec<f64> = (from + 1..=last).map(limit).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    PhaseStats {
        capacity,
        whole: Span::of(s, first, last),
        settled,
        mean_limit: mean(first),
        mean_limit_settled: (a <= last_start && a < last).then(|| mean(a)),
        bad_windows,
        windows: last_start + 1 - first,
        last_bad,
    }
}

pub async fn capacity(args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let (guard, tmp) = temp_dir(args.keep)?;
    let n = args.ids;
    let c = args.concurrency;
    let bins = (args.phase_secs as usize)
        * (Duration::from_secs(1).as_millis() / BIN.as_millis()) as usize;
    let input = tmp.join("ids.txt");
    let input_bytes = write_input(&input, n)?;
    eprintln!(
        "{} IDs in {} ({}); phases {:?}/s of {} s each; concurrency {c}",
        thousands(n),
        input.display(),
        mib(input_bytes),
        CAPACITY_PHASES,
        args.phase_secs
    );
    let mut runs = Vec::new();
    for adaptive in [true, false] {
        let run = capacity_run(
            &input,
            &tmp.join(format!(
                "state-{}",
                if adaptive { "adaptive" } else { "fixed" }
            )),
            adaptive,
            bins,
            c,
            args.burst,
        )
        .await?;
        runs.push(run);
    }

    let mut out = String::new();
    writeln!(
        out,
        "\n## highwater adaptive rate control against a hidden capacity\n"
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- per run: a fresh fake API (`ApiConfig {{ latency_min: 2ms, latency_max: 2ms, \
         ..fast() }}`) whose hidden capacity (`set_capacity`: token bucket, burst C/10, \
         429 at once beyond it, no Retry-After) steps {} at {} s phases, measured from the \
         start of `Job::run`; {} IDs (never finished), concurrency {c}, retries: 10 \
         attempts, backoff 200 ms doubling to 5 s (±50% jitter); after the last phase the run \
         is stopped with its `StopHandle`",
        CAPACITY_PHASES
            .iter()
            .map(|c| fmt_rate(*c))
            .collect::<Vec<_>>()
            .join(" → "),
        args.phase_secs,
        thousands(n)
    )?;
    writeln!(
        out,
        "- adaptive: `ThrottleOptions {{ rate: Some({0}), adaptive: true, burst: {1}, .. }}` \
         (ceiling above every C; controller tick 200 ms); fixed: `rate: Some({0}), adaptive: \
         false, burst: {1}`",
        fmt_rate(CAPACITY_CEILING),
        match args.burst {
            Some(b) => format!("Some({b})"),
            None => "None".into(),
        }
    )?;
    writeln!(
        out,
        "- the server's `accepted()` (200s) and `rejected_429()` are sampled every 100 ms; \
         the step to the next capacity is made right after a sample, so phases are whole \
         bins. Goodput = accepted/s; 429 share = 429s / (200s + 429s)"
    )?;
    writeln!(
        out,
        "- settling: the earliest moment T after the step such that every 1-s window \
         `[t, t+1 s)` with T ≤ t and t+1 s ≤ the end of the phase has 429 share ≤ {:.0}% and \
         goodput ≥ {:.1}·C (\"never\" if the phase's last window fails); \"settled\" figures \
         are over [T, end of phase]\n",
        TARGET_429 * 100.0,
        TARGET_GOODPUT
    )?;
    writeln!(
        out,
        "**Targets:** goodput ≥ {:.1}·C, ≤ {:.0}% 429s once settled, settling < {} s.\n",
        TARGET_GOODPUT,
        TARGET_429 * 100.0,
        TARGET_SETTLE.as_secs()
    )?;
    writeln!(
        out,
        "| run | phase | C | time to settle (< {} s) | goodput settled (≥ {:.1}·C) | 429 share settled (≤ {:.0}%) | goodput whole phase | 429 share whole phase | attempts/s whole phase (÷ mean limit) | 1-s windows off target | last one off target: start, 429 share, goodput | mean rate limit (whole / settled) | targets met |",
        TARGET_SETTLE.as_secs(),
        TARGET_GOODPUT,
        TARGET_429 * 100.0
    )?;
    writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"
    )?;
    let mut missed = Vec::new();
    for run in &runs {
        let label = if run.adaptive { "adaptive" } else { "fixed" };
        for phase in 0..CAPACITY_PHASES.len() {
            let p = phase_stats(run, phase, bins);
            let (settle, sg, s429) = match p.settled {
                Some((t, s)) => (
                    format!("{:.1} s", t.as_secs_f64()),
                    format!("{:.0}/s = {:.3}·C", s.goodput(), s.goodput() / p.capacity),
                    format!("{:.2}%", s.share_429() * 100.0),
                ),
                None => ("never".into(), "n/a".into(), "n/a".into()),
            };
            let met = p.meets_targets();
            if run.adaptive && !met {
                missed.push(format!(
                    "adaptive phase {} (C = {})",
                    phase + 1,
                    fmt_rate(p.capacity)
                ));
            }
            writeln!(
                out,
                "| {label} | {} | {} | {settle} | {sg} | {s429} | {:.0}/s = {:.3}·C | {:.2}% | {:.0}/s ({:.2}) | {} of {} | {} | {} / {} | {} |",
                phase + 1,
                fmt_rate(p.capacity),
                p.whole.goodput(),
                p.whole.goodput() / p.capacity,
                p.whole.share_429() * 100.0,
                p.whole.attempts(),
                p.whole.attempts() / p.mean_limit,
                p.bad_windows,
                p.windows,
                match p.last_bad {
                    Some((t, w)) => format!(
                        "{:.1} s: {:.1}%, {:.2}·C",
                        t.as_secs_f64(),
                        w.share_429() * 100.0,
                        w.goodput() / p.capacity
                    ),
                    None => "none".into(),
                },
                fmt_rate(p.mean_limit),
                p.mean_limit_settled
                    .map(fmt_rate)
                    .unwrap_or_else(|| "n/a".into()),
                if met { "yes" } else { "**no**" }
            )?;
        }
    }
    if let Some(run) = runs.iter().find(|r| r.adaptive) {
        out.push_str(&limit_tracking(run)?);
    }
    writeln!(out, "\nRuns:\n")?;
    writeln!(
        out,
        "| run | server calls | 200s | capacity 429s | items ok | items failed | items left pending at the stop | client attempts (retries) | stop → run returned | controller rate changes |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for run in &runs {
        let last = run.samples.last().expect("at least one sample");
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {:.2} s | {} |",
            if run.adaptive { "adaptive" } else { "fixed" },
            thousands(run.calls),
            thousands(last.accepted),
            thousands(last.rejected),
            thousands(run.summary.run.ok),
            thousands(run.summary.run.failed),
            thousands(run.summary.job.pending),
            thousands(run.summary.run.attempts),
            thousands(run.summary.run.retries),
            run.stop_wait.as_secs_f64(),
            if run.adaptive {
                run.trace.len().to_string()
            } else {
                "n/a".into()
            }
        )?;
        if let Some(h) = &run.summary.halted {
            writeln!(
                out,
                "\n(the {} run halted itself: {h})",
                if run.adaptive { "adaptive" } else { "fixed" }
            )?;
        }
    }

    writeln!(
        out,
        "\nTimeline, per second (rates from the server's counters; \"limit\" is the adaptive \
         controller's rate at the end of the second, min–max within it):\n"
    )?;
    writeln!(
        out,
        "| t (s) | C | adaptive: limit | adaptive: attempts/s | adaptive: 200s/s | adaptive: 429 share | fixed: attempts/s | fixed: 200s/s | fixed: 429 share |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let per_sec = (Duration::from_secs(1).as_millis() / BIN.as_millis()) as usize;
    let seconds = bins * CAPACITY_PHASES.len() / per_sec;
    let adaptive = runs.iter().find(|r| r.adaptive);
    let fixed = runs.iter().find(|r| !r.adaptive);
    for sec in 0..seconds {
        let (a, b) = (sec * per_sec, (sec + 1) * per_sec);
        let cap = CAPACITY_PHASES[(a / bins).min(CAPACITY_PHASES.len() - 1)];
        let mut line = format!("| {} | {} |", sec + 1, cap);
        if let Some(r) = adaptive {
            let w = Span::of(&r.samples, a, b);
            let limits: Vec<f64> = (a + 1..=b)
                .map(|i| limit_at(&r.trace, r.samples[i].at, CAPACITY_CEILING))
                .chain(
                    r.trace
                        .iter()
                        .filter(|(t, _)| *t > r.samples[a].at && *t <= r.samples[b].at)
                        .map(|(_, v)| *v),
                )
                .collect();
            let lo = limits.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = limits.iter().copied().fold(0.0, f64::max);
            let end = limit_at(&r.trace, r.samples[b].at, CAPACITY_CEILING);
            let _ = write!(
                line,
                " {:.0} ({:.0}–{:.0}) | {:.0} | {:.0} | {:.1}% |",
                end,
                lo,
                hi,
                w.attempts(),
                w.goodput(),
                w.share_429() * 100.0
            );
        } else {
            line.push_str(" | | | |");
        }
        if let Some(r) = fixed {
            let w = Span::of(&r.samples, a, b);
            let _ = write!(
                line,
                " {:.0} | {:.0} | {:.1}% |",
                w.attempts(),
                w.goodput(),
                w.share_429() * 100.0
            );
        } else {
            line.push_str(" | | |");
        }
        writeln!(out, "{line}")?;
    }
    if missed.is_empty() {
        writeln!(out, "\nThe adaptive run met every target in every phase.")?;
    } else {
        writeln!(
            out,
            "\nThe adaptive run missed a target in: {}.",
            missed.join(", ")
        )?;
    }
    print!("{out}");
    finish_temp(guard, &tmp);
    Ok(())
}

/// The target: "after a change, the achieved rate follows the new value within 2% within
/// one second". The controller changes the limit at every tick (200 ms), so every 1-s window
/// starts within a tick of a change: per window, the calls the API saw (every attempt is
/// granted by the limiter; 429s included) against what the limits in force allowed (the
/// integral of the limit over the window). The first second is left out (the run starts).
fn limit_tracking(run: &CapacityRun) -> Result<String> {
    let s = &run.samples;
    let per_sec = (Duration::from_secs(1).as_millis() / BIN.as_millis()) as usize;
    let ratios: Vec<f64> = (per_sec..s.len().saturating_sub(per_sec))
        .map(|a| {
            let b = a + per_sec;
            let w = Span::of(s, a, b);
            let allowed = limit_integral(&run.trace, s[a].at, s[b].at, CAPACITY_CEILING);
            (w.accepted + w.rejected) as f64 / allowed.max(1e-9)
        })
        .collect();
    let within = ratios.iter().filter(|r| (*r - 1.0).abs() <= 0.02).count();
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(0.0, f64::max);
    let mut out = String::new();
    writeln!(
        out,
        "\nThe adaptive limit followed: over every 1-s window starting on a \
         100 ms sample after the first second ({} windows, the limit changed {} times, \
         every 200 ms tick), calls at the API ÷ the integral of the limit over the window: \
         median **{:.4}**, min {:.4}, max {:.4}; **{} of {}** within ±2%.",
        ratios.len(),
        run.trace.len(),
        median(&ratios),
        lo,
        hi,
        within,
        ratios.len()
    )?;
    Ok(out)
}

/// The integral of the controller's limit (requests) over `[from, to)`.
fn limit_integral(trace: &[(Instant, f64)], from: Instant, to: Instant, initial: f64) -> f64 {
    let mut at = from;
    let mut rate = limit_at(trace, from, initial);
    let mut total = 0.0;
    for &(t, r) in trace.iter().filter(|(t, _)| *t > from && *t < to) {
        total += rate * (t - at).as_secs_f64();
        (at, rate) = (t, r);
    }
    total + rate * (to - at).as_secs_f64()
}

async fn capacity_run(
    input: &Path,
    state: &Path,
    adaptive: bool,
    bins: usize,
    concurrency: usize,
    burst: Option<u32>,
) -> Result<CapacityRun> {
    let label = if adaptive { "adaptive" } else { "fixed" };
    let api = FakeApi::start(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(2),
        ..ApiConfig::fast()
    })
    .await
    .context("starting the fake API")?;
    api.set_capacity(Some(CAPACITY_PHASES[0]));
    let retry = RetryPolicy {
        max_attempts: 10,
        initial: Duration::from_millis(200),
        max_interval: Duration::from_secs(5),
        ..RetryPolicy::default()
    };
    let job = http_job(&api, input, state)?
        .retry(retry)
        .options(RunOptions {
            concurrency,
            progress_interval: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(5),
            throttle: ThrottleOptions {
                rate: Rate::new(CAPACITY_CEILING),
                adaptive,
                burst,
                ..Default::default()
            },
            ..Default::default()
        });
    let stop_handle = job.stop_handle();
    let t0 = Instant::now();
    let sampler = tokio::spawn(sample_and_step(api.clone(), stop_handle, bins, t0));
    let summary = job
        .run()
        .await
        .with_context(|| format!("the {label} run"))?;
    let returned = Instant::now();
    let (samples, stopped_at) = sampler.await.map_err(|e| anyhow!("sampler task: {e}"))?;
    let stop_wait = returned.saturating_duration_since(stopped_at);
    let trace = rate_trace_between(t0, returned);
    let calls = api.total_calls();
    api.shutdown().await;
    let last = samples.last().expect("at least one sample");
    eprintln!(
        "{label}: {} accepted, {} answered 429 in {:.1} s; run returned {:.2} s after the stop; {} rate changes",
        thousands(last.accepted),
        thousands(last.rejected),
        (last.at - t0).as_secs_f64(),
        stop_wait.as_secs_f64(),
        trace.len()
    );
    if samples.len() != bins * CAPACITY_PHASES.len() + 1 {
        bail!(
            "the {label} run ended before its phases did ({} of {} samples):\n{}",
            samples.len() - 1,
            bins * CAPACITY_PHASES.len(),
            summary.render()
        );
    }
    Ok(CapacityRun {
        adaptive,
        samples,
        trace,
        summary,
        stop_wait,
        calls,
    })
}

/// Samples the server's counters every [`BIN`] from `t0`, steps the capacity after each
/// phase's last sample, and stops the run after the last phase. Returns the samples and
/// when the stop was asked for.
async fn sample_and_step(
    api: FakeApi,
    stop: StopHandle,
    bins: usize,
    t0: Instant,
) -> (Vec<Sample>, Instant) {
    let sample = |api: &FakeApi| Sample {
        at: Instant::now(),
        accepted: api.accepted(),
        rejected: api.rejected_429(),
    };
    let total = bins * CAPACITY_PHASES.len();
    let mut samples = Vec::with_capacity(total + 1);
    samples.push(Sample {
        at: t0,
        ..sample(&api)
    });
    let start = tokio::time::Instant::from_std(t0);
    let mut ticker = tokio::time::interval_at(start + BIN, BIN);
    for k in 1..=total {
        ticker.tick().await;
        samples.push(sample(&api));
        if k % bins == 0 {
            let phase = k / bins;
            if let Some(&c) = CAPACITY_PHASES.get(phase) {
                api.set_capacity(Some(c));
                eprintln!(
                    "  {:.1} s: capacity now {}",
                    (Instant::now() - t0).as_secs_f64(),
                    fmt_rate(c)
                );
            }
        }
    }
    let stopped = Instant::now();
    stop.stop();
    (samples, stopped)
}
