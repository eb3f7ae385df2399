//! `storage`: what a finished job keeps on disk per ID, on realistic answers. The real binary
//! (and a baseline build, `--before`, in the same rounds) runs N IDs against the fake API
//! answering company profiles (`ApiConfig::profiles`, about 1.9 KB of nested JSON each):
//! once keeping whole answers, once with `--extract` keeping one number (what is left is the
//! fixed cost per ID); then the first state is exported with `export --format parquet
//! --compression zstd` (by this build, which reads both formats), and the state is set
//! against that file. CPU per item is the binary's own (wait4) in the whole-answer run.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use highwater::demo::api::{profile_body, ApiConfig, FakeApi};

use crate::args::Args;
use crate::child::{binary, run_args, Exit, Proc};
use crate::machine::{machine_facts, us_per, Baseline};
use crate::numbers::{median, mib, thousands};
use crate::scratch::{dir_size, files_of, finish_temp, id_of, temp_dir, write_input};

/// The `--extract` of the fixed-cost run: one number of each answer.
const EXTRACT: &str = ".metrics.employees";

/// One binary's figures in one round.
struct Round {
    /// Allocated bytes of the state with whole answers.
    whole: u64,
    /// Allocated bytes of the state with one number kept.
    extracted: u64,
    /// The zstd Parquet export of the whole-answer state.
    parquet: u64,
    cpu: Duration,
    elapsed: Duration,
    /// The files of the whole-answer state: (name, allocated bytes).
    files: Vec<(String, u64)>,
    /// The files of the `--extract` state.
    extracted_files: Vec<(String, u64)>,
}

pub fn storage(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let bin = binary(args)?;
    let n = args.ids;
    let c = args.concurrency;
    let (guard, tmp) = temp_dir(args.keep)?;
    let input = tmp.join("ids.txt");
    write_input(&input, n)?;
    // What the answers and the kept numbers weigh, computed as the fake API makes them.
    let (mut raw, mut kept) = (0u64, 0u64);
    for i in 0..n {
        let body = profile_body(&id_of(i));
        raw += serde_json::to_vec(&body)?.len() as u64;
        kept += body["metrics"]["employees"].to_string().len() as u64;
    }
    let mut builds: Vec<(&str, &Path)> = Vec::new();
    if let Some(before) = &args.before {
        builds.push(("before", before));
    }
    builds.push(("this build", &bin));
    let mut rounds: Vec<Vec<Round>> = builds.iter().map(|_| Vec::new()).collect();
    for round in 0..args.repeat {
        for (b, (name, path)) in builds.iter().enumerate() {
            let dir = tmp.join(format!("r{round}-{b}"));
            std::fs::create_dir_all(&dir)?;
            eprintln!("round {}: {name}", round + 1);
            rounds[b].push(measure(rt, path, &bin, &input, &dir, n, c)?);
        }
    }

    let mut out = String::new();
    writeln!(
        out,
        "\n## Storage per ID on realistic answers (real binary)\n"
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- {} IDs against the fake API answering company profiles (`ApiConfig::profiles`): \
         {:.0} bytes of JSON per answer on average; `--extract '{EXTRACT}'` keeps {:.1} \
         bytes per ID; `--concurrency {c}`; sizes are allocated bytes (`du`), medians of {} \
         round(s)\n",
        thousands(n),
        raw as f64 / n as f64,
        kept as f64 / n as f64,
        args.repeat
    )?;
    writeln!(
        out,
        "| build | state, whole answers | per ID | fixed cost per ID (`--extract`) | zstd Parquet export | state ÷ Parquet | CPU per item | elapsed |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    let mut summary = Vec::new();
    for ((name, _), rs) in builds.iter().zip(&rounds) {
        let med = |f: &dyn Fn(&Round) -> f64| median(&rs.iter().map(f).collect::<Vec<_>>());
        let whole = med(&|r| r.whole as f64);
        let fixed = med(&|r| (r.extracted as f64 - kept as f64) / n as f64);
        let parquet = med(&|r| r.parquet as f64);
        let cpu = med(&|r| us_per(r.cpu, n));
        writeln!(
            out,
            "| {name} | {} | {:.0} B | {:.0} B | {} | {:.2} | {:.1} µs | {:.1} s |",
            mib(whole as u64),
            whole / n as f64,
            fixed,
            mib(parquet as u64),
            whole / parquet,
            cpu,
            med(&|r| r.elapsed.as_secs_f64()),
        )?;
        summary.push((whole / n as f64, fixed, cpu));
    }
    if let [(b_whole, b_fixed, b_cpu), (a_whole, a_fixed, a_cpu)] = summary[..] {
        writeln!(
            out,
            "\nthis build ÷ before: state {:.3}, fixed cost {:.3}, CPU per item {:.3}",
            a_whole / b_whole,
            a_fixed / b_fixed,
            a_cpu / b_cpu
        )?;
    }
    for ((name, _), rs) in builds.iter().zip(&rounds) {
        for (what, files) in [
            ("whole answers", &rs[0].files),
            ("`--extract`", &rs[0].extracted_files),
        ] {
            let files: Vec<String> = files
                .iter()
                .map(|(f, bytes)| format!("{f} {:.1} B", *bytes as f64 / n as f64))
                .collect();
            writeln!(
                out,
                "\n{name}, {what}, per ID by file (round 1): {}",
                files.join(", ")
            )?;
        }
    }
    println!("{out}");
    finish_temp(guard, &tmp);
    Ok(())
}

/// One round of `bin`: the whole-answer run, the `--extract` run and the export (by `this`).
fn measure(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    this: &Path,
    input: &Path,
    dir: &Path,
    n: u64,
    c: usize,
) -> Result<Round> {
    let whole = dir.join("whole");
    let (exit, elapsed) = run(rt, bin, input, &whole, &[], dir, n, c)?;
    let extracted = dir.join("extracted");
    run(
        rt,
        bin,
        input,
        &extracted,
        &["--extract", EXTRACT],
        dir,
        n,
        c,
    )?;
    let parquet = dir.join("results.parquet");
    let done = std::process::Command::new(this)
        .args([
            "export",
            "--format",
            "parquet",
            "--compression",
            "zstd",
            "--state",
        ])
        .arg(&whole)
        .arg("--output")
        .arg(&parquet)
        .output()
        .context("running export")?;
    if !done.status.success() {
        bail!("export failed: {}", String::from_utf8_lossy(&done.stderr));
    }
    Ok(Round {
        whole: dir_size(&whole).1,
        extracted: dir_size(&extracted).1,
        parquet: std::fs::metadata(&parquet)?.len(),
        cpu: exit.cpu,
        elapsed,
        files: files_of(&whole)?,
        extracted_files: files_of(&extracted)?,
    })
}

/// One run of `bin` to the end against a fresh fake API answering profiles.
#[allow(clippy::too_many_arguments)]
fn run(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    input: &Path,
    state: &Path,
    extra: &[&str],
    dir: &Path,
    n: u64,
    c: usize,
) -> Result<(Exit, Duration)> {
    let api = rt
        .block_on(FakeApi::start(ApiConfig {
            profiles: true,
            ..ApiConfig::fast()
        }))
        .context("starting the fake API")?;
    let mut args = run_args(Some(input), &api.url_template(), state, c);
    args.extend(extra.iter().map(|s| s.to_string()));
    let log = dir.join(format!(
        "{}.stderr",
        state.file_name().unwrap_or_default().to_string_lossy()
    ));
    let mut proc = Proc::spawn(bin, &args, &log)?;
    let exit = loop {
        if let Some(e) = proc.reap(true)? {
            break e;
        }
    };
    let calls = api.total_calls();
    rt.block_on(api.shutdown());
    if exit.code != Some(0) || calls != n {
        bail!(
            "{} ended with {} after {calls} calls for {n} IDs (log: {})",
            bin.display(),
            exit.describe(),
            log.display()
        );
    }
    Ok((exit, exit.at - proc.started))
}
