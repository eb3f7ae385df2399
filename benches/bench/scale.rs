//! `scale`: one job of N IDs (100 million by default; 10 million on PostgreSQL) end to end.
//! The real binary runs it against the fast fake API in this process (`ApiConfig::fast()`,
//! its calls counted a byte per ID: [`ApiConfig::numbered_ids`]) with `--extract` keeping
//! one number of each answer, the job in a state directory or, with `--store pg`, in a
//! throwaway PostgreSQL cluster (`fsync` on).
//!
//! In order:
//!
//! 1. the free disk of every file system the run writes to, against a bound of what it will
//!    write there: the input (its exact size), the state ([`home`]: 400 bytes per ID for a
//!    state directory, 1,000 per ID and 3 GiB for PostgreSQL, each bound's reasons on its
//!    constant) and the export (64 bytes per ID, [`EXPORT_BYTES_PER_ID`]); a run that would
//!    not fit is refused before anything is written;
//! 2. the run, watched tenth by tenth ([`watch`]): items/s and VmRSS per tenth, how far the
//!    planner is ahead of the calls (its progress events, [`progress`]), the state's size;
//!    a kill -9 at `--kill-at` (90% of the IDs by default), then the resumed run's time to
//!    its first request, and the IDs the API saw more than once;
//! 3. the finished job: its size part by part, `status` and `export --format parquet`
//!    timed, with their peak RSS (wait4);
//! 4. a Markdown table of every figure, with the targets beside theirs.
//!
//! The temporary directory (input, state, logs, export) is deleted at the end unless
//! `--keep`; a PostgreSQL cluster is always removed.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};

use crate::args::Args;
use crate::child::{binary, Exit, Proc};
use crate::machine::{machine_facts, Baseline};
use crate::numbers::{kib_mib, rate, size, thousands};
use crate::scratch::{finish_temp, input_len, temp_dir, write_input};

mod disk;
mod home;
mod progress;
mod watch;

use disk::{check, Need, Room};
use home::{Home, Part};
use watch::{watch, Job, Watched, EXTRACT};

/// A Parquet export of an ID and one small number takes at most this many bytes per ID (the
/// ID's 12 bytes and the number, a few bytes each after encoding, and the row groups'
/// statistics).
pub const EXPORT_BYTES_PER_ID: u64 = 64;

/// The targets: the last tenth's items/s against the first's, at least.
const RATIO_TARGET: f64 = 0.9;
/// The peak RSS, at most (150 MB).
const PEAK_RSS_TARGET: u64 = 150_000_000;
/// The resumed run's first request after its start, within.
const RESUME_TARGET: Duration = Duration::from_secs(1);

/// A command of the binary on the finished job, timed.
struct Timed {
    elapsed: Duration,
    exit: Exit,
}

pub fn scale(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let bin = binary(args)?;
    let (n, c) = (args.ids, args.concurrency);
    let (guard, tmp) = temp_dir(args.keep)?;
    let home = Home::new(args.store, &tmp);
    let input = tmp.join("ids.txt");
    let export = tmp.join("export.parquet");

    let (state_dir, state_bound) = home.bound(n, &tmp);
    let needs = [
        Need {
            what: "input".into(),
            path: tmp.clone(),
            bytes: input_len(n),
        },
        Need {
            what: format!("state ({})", home.bound_rule()),
            path: state_dir,
            bytes: state_bound,
        },
        Need {
            what: format!("export ({EXPORT_BYTES_PER_ID} bytes per ID)"),
            path: tmp.clone(),
            bytes: n * EXPORT_BYTES_PER_ID,
        },
    ];
    let rooms = check(&needs)?;
    for room in &rooms {
        eprintln!("scale: {}", room_line(room));
    }

    let t = Instant::now();
    let input_bytes = write_input(&input, n)?;
    let input_time = t.elapsed();
    eprintln!(
        "scale: wrote {} IDs to {} ({}) in {:.1} s; the job in {}",
        thousands(n),
        input.display(),
        size(input_bytes),
        input_time.as_secs_f64(),
        home.describe()
    );
    let api = rt
        .block_on(FakeApi::start(ApiConfig {
            numbered_ids: n,
            ..ApiConfig::fast()
        }))
        .context("starting the fake API")?;
    let watched = watch(&Job {
        bin: &bin,
        api: &api,
        home: &home,
        input: &input,
        tmp: &tmp,
        n,
        concurrency: c,
        kill_at: args.kill_at,
    })?;
    rt.block_on(api.shutdown());

    let parts = home.parts()?;
    let status = timed(&bin, &home.command("status"), &tmp.join("status.out"))?;
    eprintln!(
        "scale: `status` took {:.2} s, peak RSS {}",
        status.elapsed.as_secs_f64(),
        kib_mib(status.exit.max_rss_kib)
    );
    let mut export_args = home.command("export");
    export_args.extend(["--format".into(), "parquet".into(), "--output".into()]);
    export_args.push(export.display().to_string());
    let exported = timed(&bin, &export_args, &tmp.join("export.stderr"))?;
    let export_bytes = std::fs::metadata(&export)
        .with_context(|| format!("reading {}", export.display()))?
        .len();
    eprintln!(
        "scale: `export --format parquet` took {:.1} s, peak RSS {}, {}",
        exported.elapsed.as_secs_f64(),
        kib_mib(exported.exit.max_rss_kib),
        size(export_bytes)
    );

    let mut out = String::new();
    writeln!(
        out,
        "\n## highwater: one job of {} IDs end to end (real binary)\n",
        thousands(n)
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- the job: `highwater run --input ids.txt --url http://127.0.0.1:PORT/items/{{id}} \
         --concurrency {c} --extract '{EXTRACT}' --progress-interval 1s --log-format json` \
         against the fake API in this process (`ApiConfig::fast()`: no latency, no faults; \
         both share the machine's CPUs); the job in {}",
        home.describe()
    )?;
    for room in &rooms {
        writeln!(out, "- {}", room_line(room))?;
    }
    let failed = report(
        &mut out,
        &Figures {
            n,
            c,
            home: &home,
            input_bytes,
            input_time,
            watched: &watched,
            parts: &parts,
            status: &status,
            exported: &exported,
            export_bytes,
        },
    )?;
    print!("{out}");
    drop(home);
    finish_temp(guard, &tmp);
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// The free disk of one file system against what the run needs there.
fn room_line(room: &Room) -> String {
    format!(
        "free disk: {} on the file system of {}, the run needs at most {} there ({}; bounds, \
         not measurements)",
        size(room.free),
        room.mount.display(),
        size(room.need),
        room.parts.join(" + ")
    )
}

/// Runs `bin ARGS` to its end, its output in `log`; an error unless it exits 0.
fn timed(bin: &Path, args: &[String], log: &Path) -> Result<Timed> {
    let mut proc = Proc::spawn(bin, args, log)?;
    let exit = proc.wait()?;
    if exit.code != Some(0) {
        bail!(
            "`highwater {}` ended with {}:\n{}",
            args.join(" "),
            exit.describe(),
            std::fs::read_to_string(log).unwrap_or_default().trim()
        );
    }
    Ok(Timed {
        elapsed: exit.at.duration_since(proc.started),
        exit,
    })
}

/// Everything the report shows.
struct Figures<'a> {
    n: u64,
    c: usize,
    home: &'a Home,
    input_bytes: u64,
    input_time: Duration,
    watched: &'a Watched,
    parts: &'a [Part],
    status: &'a Timed,
    exported: &'a Timed,
    export_bytes: u64,
}

/// "met" or "**missed**".
fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

/// The Markdown tables; returns what failed (not the targets: those are only reported).
fn report(out: &mut String, f: &Figures) -> Result<Vec<String>> {
    let (n, w) = (f.n, f.watched);
    let mut failed = Vec::new();
    let first = w.tenths.first().map_or(0.0, |t| t.rate);
    let last = w.tenths.last().map_or(0.0, |t| t.rate);
    let ratio = last / first.max(1e-9);
    let peak_kib = w.killed.max_rss_kib.max(w.resumed.max_rss_kib);
    let job_bytes: u64 = f.parts.iter().filter(|p| p.job).map(|p| p.bytes).sum();
    let extra_calls = w.calls.saturating_sub(w.distinct);
    let bound = f.home.repeat_bound(f.c);
    let planner = Duration::from_secs_f64(w.planner_ms / 1e3);
    let pending: Vec<u64> = w.tenths.iter().filter_map(|t| t.pending).collect();

    writeln!(out, "\n| figure | value | target |")?;
    writeln!(out, "|---|---:|---|")?;
    let mut row = |figure: &str, value: String, target: &str| {
        writeln!(out, "| {figure} | {value} | {target} |")
    };
    row(
        "IDs; input",
        format!(
            "{}; {} written in {:.1} s",
            thousands(n),
            size(f.input_bytes),
            f.input_time.as_secs_f64()
        ),
        "",
    )?;
    row(
        "fresh run: start to first request (job created, first buckets planned)",
        format!("{:.1} ms", w.fresh_first_call.as_secs_f64() * 1e3),
        "",
    )?;
    row(
        "planning: the planner's store time (offset writes + syncs, from the progress events)",
        format!(
            "{:.1} s for {} rows: {:.2} µs per ID, {} IDs/s{}",
            planner.as_secs_f64(),
            thousands(w.rows_planned),
            planner.as_secs_f64() * 1e6 / w.rows_planned.max(1) as f64,
            thousands(rate(w.rows_planned, planner) as u64),
            if w.planner_whole {
                ""
            } else {
                " (the resumed run's last event missing: a part only)"
            }
        ),
        "",
    )?;
    row(
        "planning: IDs planned and not finished, at the tenths",
        match (pending.iter().min(), pending.iter().max()) {
            (Some(lo), Some(hi)) => format!("{} to {}", thousands(*lo), thousands(*hi)),
            _ => "no progress event read".into(),
        },
        "",
    )?;
    row(
        "items/s: first tenth, last tenth, last ÷ first",
        format!(
            "{}, {}, **{ratio:.3}**",
            thousands(first as u64),
            thousands(last as u64)
        ),
        &format!("≥ {RATIO_TARGET}: {}", verdict(ratio >= RATIO_TARGET)),
    )?;
    row(
        "the job: fresh run's start to the resumed run's exit",
        format!(
            "{:.1} s ({} items/s)",
            w.job_time.as_secs_f64(),
            thousands(rate(n, w.job_time) as u64)
        ),
        "",
    )?;
    row(
        "peak RSS (VmHWM at exit, wait4): fresh run, resumed run",
        format!(
            "{}, {}: **{}**",
            kib_mib(w.killed.max_rss_kib),
            kib_mib(w.resumed.max_rss_kib),
            kib_mib(peak_kib)
        ),
        &format!(
            "≤ 150 MB ({}): {}",
            kib_mib(PEAK_RSS_TARGET / 1024),
            verdict(peak_kib * 1024 <= PEAK_RSS_TARGET)
        ),
    )?;
    row(
        "largest VmRSS sampled (every 10 ms)",
        kib_mib(w.max_rss_sampled_kib),
        "",
    )?;
    row(
        "kill -9",
        format!(
            "at {} calls ({:.1}% of the IDs), {:.1} s after the first request",
            thousands(w.kill_calls),
            100.0 * w.kill_calls as f64 / n as f64,
            w.kill_time.as_secs_f64()
        ),
        "",
    )?;
    row(
        "resume: the resumed run's start to its first request",
        format!("**{:.1} ms**", w.resume_first_call.as_secs_f64() * 1e3),
        &format!(
            "< {} s: {}",
            RESUME_TARGET.as_secs(),
            verdict(w.resume_first_call < RESUME_TARGET)
        ),
    )?;
    row(
        "resume: the kill to the resumed run's first request",
        format!("{:.2} s", w.down.as_secs_f64()),
        "",
    )?;
    row(
        "calls repeated: IDs the API saw more than once; calls beyond one per ID",
        format!(
            "{}; {} (the engine's bound {})",
            thousands(w.repeated_ids),
            thousands(extra_calls),
            thousands(bound)
        ),
        "",
    )?;
    row(
        "IDs the API saw; API calls",
        format!("{}; {}", thousands(w.distinct), thousands(w.calls)),
        "every ID",
    )?;
    row(
        "the job's state at the end (parts below)",
        format!(
            "{} ({:.1} bytes per ID)",
            size(job_bytes),
            job_bytes as f64 / n as f64
        ),
        "",
    )?;
    row(
        "`status` on the finished job: wall time, peak RSS",
        format!(
            "{:.2} s, {}",
            f.status.elapsed.as_secs_f64(),
            kib_mib(f.status.exit.max_rss_kib)
        ),
        "",
    )?;
    row(
        "`export --format parquet`: wall time, peak RSS, file",
        format!(
            "{:.1} s, {}, {} ({:.1} bytes per ID)",
            f.exported.elapsed.as_secs_f64(),
            kib_mib(f.exported.exit.max_rss_kib),
            size(f.export_bytes),
            f.export_bytes as f64 / n as f64
        ),
        "",
    )?;

    if let Some(note) = f.home.resume_note() {
        writeln!(out, "\n{note}")?;
    }
    writeln!(
        out,
        "\nBy tenth (a tenth ends when the API has counted that many calls, the last when the \
         resumed run exits; its items/s leave out the time from the kill to the resumed run's \
         first request):\n"
    )?;
    writeln!(
        out,
        "| tenth | calls at its end | at (from the first request) | items/s | VmRSS | of it anonymous, files | planned ahead | state | per ID called |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for (k, t) in w.tenths.iter().enumerate() {
        writeln!(
            out,
            "| {}{} | {} | {:.1} s | {} | {} | {}, {} | {} | {} | {:.0} B |",
            k + 1,
            if t.down.is_zero() { "" } else { " (resumed)" },
            thousands(t.calls),
            t.at.as_secs_f64(),
            thousands(t.rate as u64),
            kib_mib(t.memory.rss),
            kib_mib(t.memory.anon),
            kib_mib(t.memory.file),
            t.pending.map_or("-".into(), thousands),
            size(t.state_bytes),
            t.state_bytes as f64 / t.calls.min(n).max(1) as f64
        )?;
    }

    writeln!(
        out,
        "\nThe state at the end, part by part (allocated bytes):\n"
    )?;
    writeln!(out, "| part | size | per ID |")?;
    writeln!(out, "|---|---:|---:|")?;
    for p in f.parts {
        writeln!(
            out,
            "| {} | {} | {:.1} B |",
            p.name,
            size(p.bytes),
            p.bytes as f64 / n as f64
        )?;
    }

    if w.distinct != n {
        failed.push(format!(
            "the API saw {} distinct IDs of {}",
            thousands(w.distinct),
            thousands(n)
        ));
    }
    if extra_calls > bound {
        failed.push(format!(
            "{} calls repeated after the kill, more than the bound {}",
            thousands(extra_calls),
            thousands(bound)
        ));
    }
    Ok(failed)
}
