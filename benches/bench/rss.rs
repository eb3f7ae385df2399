//! `rss`: the real binary over a large input (peak RSS, elapsed, state size), then runs
//! killed with SIGKILL and resumed (time to the first request, repeated calls).

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};
use highwater::engine;

use crate::args::Args;
use crate::child::{binary, run_args, Exit, Proc};
use crate::machine::{machine_facts, process_cpu, us_per, Baseline};
use crate::numbers::{kib_mib, mib, rate, thousands};
use crate::scratch::{dir_size, finish_temp, temp_dir, write_input};

struct FullRun {
    elapsed: Duration,
    exit: Exit,
    hwm_kib: u64,
    max_rss_sampled_kib: u64,
    milestones: Vec<(u64, Duration, u64)>,
    calls: u64,
    distinct: usize,
    server_cpu: Duration,
    state: (u64, u64),
    log: String,
}

pub fn rss(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let bin = binary(args)?;
    let n = args.ids;
    let c = args.concurrency;
    let (guard, tmp) = temp_dir(args.keep)?;
    let input = tmp.join("ids.txt");
    let t = Instant::now();
    let input_bytes = write_input(&input, n)?;
    eprintln!(
        "wrote {} IDs to {} ({}) in {:.1} s; binary {}",
        thousands(n),
        input.display(),
        mib(input_bytes),
        t.elapsed().as_secs_f64(),
        bin.display()
    );

    let full = if args.skip_full {
        None
    } else {
        Some(full_run(rt, &bin, &input, &tmp, n, c)?)
    };
    let resume = resume_runs(rt, &bin, &input, &tmp, n, c, args.kill_after)?;

    let mut out = String::new();
    writeln!(
        out,
        "\n## highwater memory and resume latency (real binary)\n"
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- input: {} distinct IDs (`id-000000000`...), {}; binary `{}`",
        thousands(n),
        mib(input_bytes),
        bin.display()
    )?;
    writeln!(
        out,
        "- binary run as `highwater run --input FILE --url http://127.0.0.1:PORT/items/{{id}} \
         --state DIR --concurrency {c} --progress-interval 0 -q` against the fake API \
         (`ApiConfig::fast()`) in this process; both share the {} CPUs",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    )?;
    let mut failed = Vec::new();
    if let Some(f) = &full {
        let all = f.calls == n && f.distinct as u64 == n;
        writeln!(out, "\n### full run\n")?;
        writeln!(out, "| metric | value |")?;
        writeln!(out, "|---|---:|")?;
        writeln!(out, "| IDs | {} |", thousands(n))?;
        writeln!(out, "| elapsed | {:.1} s |", f.elapsed.as_secs_f64())?;
        writeln!(
            out,
            "| throughput | {} items/s |",
            thousands(rate(n, f.elapsed) as u64)
        )?;
        writeln!(
            out,
            "| peak RSS (VmHWM, last sample) | {} |",
            kib_mib(f.hwm_kib)
        )?;
        writeln!(
            out,
            "| peak RSS (wait4 ru_maxrss) | {} |",
            kib_mib(f.exit.max_rss_kib)
        )?;
        writeln!(
            out,
            "| largest sampled VmRSS (every 200 ms) | {} |",
            kib_mib(f.max_rss_sampled_kib)
        )?;
        writeln!(
            out,
            "| CPU time of the binary (user + sys) | {:.1} s ({:.1} µs per ID) |",
            f.exit.cpu.as_secs_f64(),
            us_per(f.exit.cpu, n)
        )?;
        writeln!(
            out,
            "| CPU time of the fake API (this process) | {:.1} s ({:.1} µs per ID) |",
            f.server_cpu.as_secs_f64(),
            us_per(f.server_cpu, n)
        )?;
        writeln!(out, "| exit | {} |", f.exit.describe())?;
        writeln!(
            out,
            "| state dir on disk (allocated / apparent) | {} / {} ({:.0} bytes per ID) |",
            mib(f.state.1),
            mib(f.state.0),
            f.state.1 as f64 / n as f64
        )?;
        writeln!(
            out,
            "| server: calls / distinct IDs | {} / {} ({}) |",
            thousands(f.calls),
            thousands(f.distinct as u64),
            if all {
                "one call per ID: ok"
            } else {
                "**MISMATCH**"
            }
        )?;
        if !f.milestones.is_empty() {
            writeln!(out, "\nRSS as the run progresses (sampled):\n")?;
            writeln!(out, "| calls made | elapsed | VmRSS |")?;
            writeln!(out, "|---:|---:|---:|")?;
            for (calls, at, rss) in &f.milestones {
                writeln!(
                    out,
                    "| {} | {:.1} s | {} |",
                    thousands(*calls),
                    at.as_secs_f64(),
                    kib_mib(*rss)
                )?;
            }
        }
        if !f.log.trim().is_empty() {
            writeln!(
                out,
                "\nbinary's stderr:\n\n```text\n{}\n```",
                f.log.trim_end()
            )?;
        }
        if f.exit.code != Some(0) {
            failed.push(format!("the full run ended with {}", f.exit.describe()));
        }
        if !all {
            failed.push("the full run's call count is not one per ID".into());
        }
    }

    writeln!(out, "\n### time to first request after kill -9 (resume)\n")?;
    writeln!(
        out,
        "A fresh state dir; each run is SIGKILLed once the server has seen {} more calls, then \
         `highwater run --state DIR --concurrency {c} --progress-interval 0 -q` is started; \
         the time is from spawn to the server's first new call (polled every 1 ms). It \
         includes process start, opening sled (log recovery), re-hashing the input to check \
         its fingerprint, and finding the open buckets. Repeated calls are the calls made \
         again for IDs that had been called before (items in flight at the kill); the \
         engine's bound is `max_unsynced_items({c})` = {} per kill.\n",
        thousands(resume.kill_after),
        engine::max_unsynced_items(c)
    )?;
    writeln!(
        out,
        "| start | server calls before this start | time to first request | calls before the kill | repeated calls (from the previous kill) |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    for r in &resume.rows {
        writeln!(
            out,
            "| {} | {} | {:.1} ms | {} | {} |",
            r.label,
            thousands(r.calls_before),
            r.first_request.as_secs_f64() * 1000.0,
            match r.killed_after {
                Some(k) => thousands(k),
                None => "(finished before the kill)".into(),
            },
            r.repeats.map(thousands).unwrap_or_else(|| "n/a".into())
        )?;
    }
    let bound = engine::max_unsynced_items(c) as u64;
    for r in &resume.rows {
        if let Some(rep) = r.repeats {
            if rep > bound {
                failed.push(format!(
                    "{}: {rep} repeated calls, more than the bound {bound}",
                    r.label
                ));
            }
        }
    }
    if let Some(note) = &resume.note {
        writeln!(out, "\n{note}")?;
    }
    print!("{out}");
    finish_temp(guard, &tmp);
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

fn full_run(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    input: &Path,
    tmp: &Path,
    n: u64,
    c: usize,
) -> Result<FullRun> {
    let api = rt
        .block_on(FakeApi::start(ApiConfig::fast()))
        .context("starting the fake API")?;
    let state = tmp.join("state-full");
    let log_path = tmp.join("full-run.stderr");
    let args = run_args(Some(input), &api.url_template(), &state, c);
    eprintln!("full run: {} {}", bin.display(), args.join(" "));
    let cpu = process_cpu();
    let mut proc = Proc::spawn(bin, &args, &log_path)?;
    let mut hwm = 0;
    let mut max_rss = 0;
    let mut cur_rss = 0;
    let mut last_sample = None;
    let mut milestones = Vec::new();
    let mut next_milestone = 1u64;
    let mut last_report = Instant::now();
    let mut last_calls = 0;
    let exit = loop {
        if let Some(e) = proc.reap(false)? {
            break e;
        }
        if let Some((rss, h)) = proc.memory() {
            hwm = hwm.max(h);
            max_rss = max_rss.max(rss);
            cur_rss = rss;
            let calls = api.total_calls();
            last_sample = Some((calls, proc.started.elapsed(), rss));
            // One sample per 10% of the input.
            while next_milestone <= 10 && calls >= n * next_milestone / 10 {
                milestones.push((calls, proc.started.elapsed(), rss));
                next_milestone += 1;
            }
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            let calls = api.total_calls();
            eprintln!(
                "  {:>6.0} s: {} calls ({:.1}%), {:.0} calls/s lately, VmRSS {}",
                proc.started.elapsed().as_secs_f64(),
                thousands(calls),
                100.0 * calls as f64 / n as f64,
                rate(calls - last_calls, last_report.elapsed()),
                kib_mib(cur_rss)
            );
            last_report = Instant::now();
            last_calls = calls;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let elapsed = exit.at - proc.started;
    // The last sample before the exit, unless it already is the last row.
    if let Some(last) = last_sample {
        if milestones.last().map(|m: &(u64, Duration, u64)| m.0) != Some(last.0) {
            milestones.push(last);
        }
    }
    let server_cpu = process_cpu().saturating_sub(cpu);
    let calls = api.total_calls();
    let distinct = api.distinct_ids();
    eprintln!(
        "full run: {} after {:.1} s, {} calls",
        exit.describe(),
        elapsed.as_secs_f64(),
        thousands(calls)
    );
    rt.block_on(api.shutdown());

    let state_size = dir_size(&state);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    Ok(FullRun {
        elapsed,
        exit,
        hwm_kib: hwm,
        max_rss_sampled_kib: max_rss,
        milestones,
        calls,
        distinct,
        server_cpu,
        state: state_size,
        log,
    })
}

struct ResumeRow {
    label: String,
    calls_before: u64,
    first_request: Duration,
    killed_after: Option<u64>,
    /// Calls repeated because of the previous kill (observed during this start).
    repeats: Option<u64>,
}

struct Resume {
    kill_after: u64,
    rows: Vec<ResumeRow>,
    note: Option<String>,
}

const RESUMES: usize = 3;

fn resume_runs(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    input: &Path,
    tmp: &Path,
    n: u64,
    c: usize,
    kill_after: Option<u64>,
) -> Result<Resume> {
    // A separate server: its counters then say exactly which calls were repeated.
    let api = rt
        .block_on(FakeApi::start(ApiConfig::fast()))
        .context("starting the fake API")?;
    let kill_after = kill_after.unwrap_or((n / (RESUMES as u64 + 2)).clamp(1, 200_000));
    let state = tmp.join("state-resume");
    let url = api.url_template();
    let mut rows = Vec::new();
    let mut note = None;
    let mut repeats_seen = 0u64;
    for round in 0..=RESUMES {
        let (label, args) = if round == 0 {
            (
                "fresh run (creates the job)".to_string(),
                run_args(Some(input), &url, &state, c),
            )
        } else {
            (
                format!("resume {round} after kill -9"),
                run_args(None, &url, &state, c),
            )
        };
        eprintln!("{label}: {} {}", bin.display(), args.join(" "));
        let calls_before = api.total_calls();
        let log = tmp.join(format!("resume-{round}.stderr"));
        let mut proc = Proc::spawn(bin, &args, &log)?;
        let first_request = proc
            .first_call(&|| api.total_calls(), calls_before, &log)
            .with_context(|| label.clone())?;
        eprintln!(
            "  first request after {:.1} ms",
            first_request.as_secs_f64() * 1000.0
        );
        // Let it work until `kill_after` more calls, then kill -9.
        let target = calls_before + kill_after;
        let mut last_report = Instant::now();
        let finished = loop {
            if api.total_calls() >= target {
                break false;
            }
            if let Some(e) = proc.reap(false)? {
                note = Some(format!(
                    "The run of \"{label}\" ended on its own ({}) before {} calls; \
                     use a larger --ids for more resume measurements.",
                    e.describe(),
                    thousands(kill_after)
                ));
                break true;
            }
            if last_report.elapsed() >= Duration::from_secs(10) {
                eprintln!(
                    "  {} calls since start",
                    thousands(api.total_calls() - calls_before)
                );
                last_report = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let killed_after = if finished {
            None
        } else {
            proc.kill()?;
            Some(api.total_calls() - calls_before)
        };
        // Calls made again for IDs already called: all caused by the previous kill, since
        // a resume replays the open buckets before anything new.
        let repeated_total = api.total_calls() - api.distinct_ids() as u64;
        let repeats = (round > 0).then(|| repeated_total - repeats_seen);
        repeats_seen = repeated_total;
        rows.push(ResumeRow {
            label,
            calls_before,
            first_request,
            killed_after,
            repeats,
        });
        if finished {
            break;
        }
    }
    rt.block_on(api.shutdown());
    Ok(Resume {
        kill_after,
        rows,
        note,
    })
}
