//! A `scale` job watched as it runs: the fresh run until the API has seen `--kill-at` of
//! the IDs, a kill -9, then the resumed run to the end. A line on standard error at each
//! tenth of the IDs ([`Tenth`]: items/s, VmRSS and its anonymous and file parts, how far
//! planning is ahead, the state's size), so a long run can be followed with `tail`.
//!
//! A tenth ends when the API has counted that many calls (the last one when the resumed run
//! exits), polled every 10 ms. Its items/s are its calls over its time, timed from the fresh
//! run's first request, without the time from the kill to the resumed run's first request
//! (reported apart): the pace of a process working, not of the restart.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use highwater::demo::api::FakeApi;

use super::home::Home;
use super::progress::ProgressLog;
use crate::child::{worker_args, Exit, Proc};
use crate::numbers::{kib_mib, rate, size, thousands};

/// What the job keeps of each answer: one number.
pub const EXTRACT: &str = ".score";

/// How often the API's call count and the process's memory are sampled.
const POLL: Duration = Duration::from_millis(10);

/// The job to run.
pub struct Job<'a> {
    pub bin: &'a Path,
    pub api: &'a FakeApi,
    pub home: &'a Home,
    pub input: &'a Path,
    pub tmp: &'a Path,
    pub n: u64,
    pub concurrency: usize,
    /// Kill -9 once the API has seen this percentage of the IDs.
    pub kill_at: u64,
}

/// One tenth of the job.
pub struct Tenth {
    /// API calls counted at its end.
    pub calls: u64,
    /// Its end, from the fresh run's first request.
    pub at: Duration,
    /// Its calls per second, the restart's gap left out.
    pub rate: f64,
    /// The restart's gap within it, if the kill fell in it.
    pub down: Duration,
    /// The memory of the process working at its end (the last sample before the exit, for
    /// the last tenth).
    pub memory: Memory,
    /// IDs planned and not finished at the last progress event before its end (none for
    /// the last tenth, which ends with the job).
    pub pending: Option<u64>,
    /// The job's bytes on disk at its end.
    pub state_bytes: u64,
}

/// What the watch measured.
pub struct Watched {
    /// From the fresh run's start to its first request (the job created, the first
    /// buckets planned).
    pub fresh_first_call: Duration,
    pub tenths: Vec<Tenth>,
    /// API calls counted when the fresh run was killed (and reaped).
    pub kill_calls: u64,
    /// The kill, from the fresh run's first request.
    pub kill_time: Duration,
    /// The fresh run's end: its peak RSS from wait4.
    pub killed: Exit,
    /// From the resumed run's start to its first request.
    pub resume_first_call: Duration,
    /// From the kill to the resumed run's first request.
    pub down: Duration,
    pub resumed: Exit,
    /// From the fresh run's start to the resumed run's exit.
    pub job_time: Duration,
    /// The largest VmRSS sampled in either run.
    pub max_rss_sampled_kib: u64,
    /// Milliseconds the planner spent writing and syncing buckets, both runs (the fresh
    /// run's up to its last progress event before the kill).
    pub planner_ms: f64,
    /// Whether the resumed run's last progress event (the whole run's) was read, so that
    /// `planner_ms` has all of the resumed run's.
    pub planner_whole: bool,
    /// Rows the planner had read at the resumed run's last progress event.
    pub rows_planned: u64,
    pub calls: u64,
    pub distinct: u64,
    pub repeated_ids: u64,
}

/// A process's resident memory, in KiB: VmRSS, and its anonymous and file-backed parts
/// (the latter, pages of mapped files such as the ID index, the kernel can reclaim).
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    pub rss: u64,
    pub anon: u64,
    pub file: u64,
}

impl Memory {
    fn of(proc: &Proc) -> Option<Memory> {
        let [rss, anon, file] = proc.status_kib(["VmRSS:", "RssAnon:", "RssFile:"])?;
        Some(Memory { rss, anon, file })
    }

    pub fn describe(&self) -> String {
        format!(
            "{} (anonymous {}, files {})",
            kib_mib(self.rss),
            kib_mib(self.anon),
            kib_mib(self.file)
        )
    }
}

/// Counts the tenths as the calls pass them.
struct Tenths {
    n: u64,
    /// The fresh run's first request.
    t0: Instant,
    /// The end of the last tenth: (calls, instant).
    last: (u64, Instant),
    /// The restart's gap in the open tenth.
    down: Duration,
    done: Vec<Tenth>,
}

impl Tenths {
    /// Closes every tenth that `calls` completes (the tenth `last` too: the job's end).
    fn pass(&mut self, calls: u64, memory: Memory, log: &mut ProgressLog, home: &Home, last: bool) {
        let mut read = false;
        while self.done.len() < 10 {
            let k = self.done.len() as u64 + 1;
            let end = k == 10 && last;
            if !end && (k == 10 || calls * 10 < k * self.n) {
                return;
            }
            if !read {
                log.read();
                read = true;
            }
            let now = Instant::now();
            let span = now.duration_since(self.last.1).saturating_sub(self.down);
            let tenth = Tenth {
                calls,
                at: now.duration_since(self.t0),
                rate: rate(calls - self.last.0, span),
                down: self.down,
                memory,
                // At the job's end nothing is pending: no figure of planning.
                pending: log.latest.filter(|_| !end).map(|e| e.pending),
                state_bytes: home.size(),
            };
            eprintln!("scale: {}", tenth.line(k, self.n));
            self.done.push(tenth);
            self.last = (calls, now);
            self.down = Duration::ZERO;
        }
    }
}

impl Tenth {
    fn line(&self, k: u64, n: u64) -> String {
        let down = if self.down.is_zero() {
            String::new()
        } else {
            format!(
                " (without the {:.2} s from the kill to the resumed run's first request)",
                self.down.as_secs_f64()
            )
        };
        format!(
            "tenth {k:>2} of 10: {} calls at {:.1} s; {} items/s in this tenth{down}; VmRSS {}; \
             planned ahead {}; state {} ({:.0} B per ID called)",
            thousands(self.calls),
            self.at.as_secs_f64(),
            thousands(self.rate as u64),
            self.memory.describe(),
            self.pending.map_or("-".into(), thousands),
            size(self.state_bytes),
            self.state_bytes as f64 / self.calls.min(n).max(1) as f64
        )
    }
}

/// `run` arguments with the progress events on standard error, as JSON, every second.
fn with_events(mut args: Vec<String>) -> Vec<String> {
    match args.iter().position(|a| a == "--progress-interval") {
        Some(i) if i + 1 < args.len() => args[i + 1] = "1s".into(),
        _ => args.extend(["--progress-interval".into(), "1s".into()]),
    }
    args.extend(["--log-format".into(), "json".into()]);
    args
}

/// Runs the job: fresh, killed at `kill_at`, resumed to the end.
pub fn watch(job: &Job) -> Result<Watched> {
    let Job {
        bin,
        api,
        home,
        tmp,
        n,
        concurrency: c,
        ..
    } = *job;
    let url = api.url_template();
    let calls = || api.total_calls();

    let mut args = with_events(worker_args(Some(job.input), &url, home.state(), c));
    args.extend(["--extract".into(), EXTRACT.into()]);
    let log = tmp.join("fresh.stderr");
    eprintln!("scale: fresh run: {} {}", bin.display(), args.join(" "));
    let mut fresh = Proc::spawn(bin, &args, &log)?;
    let fresh_first_call = fresh.first_call(&calls, 0, &log)?;
    eprintln!(
        "scale: the fresh run's first request {:.1} ms after its start",
        fresh_first_call.as_secs_f64() * 1e3
    );
    let t0 = Instant::now();
    let mut tenths = Tenths {
        n,
        t0,
        last: (calls(), t0),
        down: Duration::ZERO,
        done: Vec::new(),
    };
    let mut events = ProgressLog::new(&log);
    let kill_target = (n * job.kill_at).div_ceil(100);
    let (mut memory, mut max_rss) = (Memory::default(), 0);
    let killed = loop {
        if let Some(e) = fresh.reap(false)? {
            bail!(
                "the fresh run ended ({}) before the API saw {}% of the IDs; its log: {}",
                e.describe(),
                job.kill_at,
                log.display()
            );
        }
        if let Some(now) = Memory::of(&fresh) {
            memory = now;
            max_rss = max_rss.max(now.rss);
        }
        let now_calls = calls();
        if now_calls >= kill_target {
            // At once: a tenth's figures (the state's size) take time to read.
            let killed = fresh.kill()?;
            tenths.pass(now_calls, memory, &mut events, home, false);
            break killed;
        }
        tenths.pass(now_calls, memory, &mut events, home, false);
        std::thread::sleep(POLL);
    };
    let kill_calls = calls();
    events.read();
    eprintln!(
        "scale: kill -9 at {} calls ({:.1}% of the IDs), {:.1} s after the first request; \
         the fresh run's peak RSS {} (wait4)",
        thousands(kill_calls),
        100.0 * kill_calls as f64 / n as f64,
        killed.at.duration_since(t0).as_secs_f64(),
        kib_mib(killed.max_rss_kib)
    );

    let args = with_events(worker_args(None, &url, home.state(), c));
    let log = tmp.join("resumed.stderr");
    eprintln!("scale: resumed run: {} {}", bin.display(), args.join(" "));
    let mut resumed = Proc::spawn(bin, &args, &log)?;
    let resume_first_call = resumed.first_call(&calls, kill_calls, &log)?;
    let down = killed.at.elapsed();
    tenths.down += down;
    eprintln!(
        "scale: the resumed run's first request {:.1} ms after its start (target < 1 s), \
         {:.2} s after the kill",
        resume_first_call.as_secs_f64() * 1e3,
        down.as_secs_f64()
    );
    let planner_before = events.planner_ms;
    let mut events = ProgressLog::new(&log);
    let exit = loop {
        if let Some(e) = resumed.reap(false)? {
            break e;
        }
        if let Some(now) = Memory::of(&resumed) {
            memory = now;
            max_rss = max_rss.max(now.rss);
        }
        tenths.pass(calls(), memory, &mut events, home, false);
        std::thread::sleep(POLL);
    };
    if exit.code != Some(0) {
        bail!(
            "the resumed run ended with {}; its log: {}",
            exit.describe(),
            log.display()
        );
    }
    tenths.pass(calls(), memory, &mut events, home, true);
    eprintln!(
        "scale: the resumed run ended ({}), {:.1} s after the fresh run's start; its peak RSS {} \
         (wait4)",
        exit.describe(),
        exit.at.duration_since(fresh.started).as_secs_f64(),
        kib_mib(exit.max_rss_kib)
    );
    Ok(Watched {
        fresh_first_call,
        tenths: tenths.done,
        kill_calls,
        kill_time: killed.at.duration_since(t0),
        killed,
        resume_first_call,
        down,
        resumed: exit,
        job_time: exit.at.duration_since(fresh.started),
        max_rss_sampled_kib: max_rss,
        planner_ms: planner_before + events.planner_ms,
        planner_whole: events.ended,
        rows_planned: events.latest.map_or(0, |e| e.rows_read),
        calls: calls(),
        distinct: api.distinct_ids() as u64,
        repeated_ids: api.repeated_ids() as u64,
    })
}
