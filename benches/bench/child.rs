//! The `highwater` binary as a child process: its command line, and a child reaped by hand
//! (`wait4`) so that its CPU time and peak RSS are its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::args::Args;
use crate::machine::tv;

/// A child process reaped by hand (wait4), so its rusage is ours; killed on drop.
pub struct Proc {
    pub pid: libc::pid_t,
    pub started: Instant,
    done: Option<Exit>,
}

#[derive(Debug, Clone, Copy)]
pub struct Exit {
    /// Exit code, or None if killed by a signal.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub max_rss_kib: u64,
    /// User + system CPU time of the child.
    pub cpu: Duration,
    /// System CPU time of the child (part of `cpu`).
    pub sys: Duration,
    pub at: Instant,
}

impl Exit {
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "unknown exit".into(),
        }
    }
}

impl Proc {
    /// Starts `bin` with standard output and error into `log`.
    pub fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Proc> {
        Proc::spawn_with_env(bin, args, &[], log)
    }

    /// [`Proc::spawn`] with `env` added to the child's environment.
    pub fn spawn_with_env(
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<Proc> {
        let log =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let started = Instant::now();
        let mut command = Command::new(bin);
        // If this benchmark dies (Ctrl-C), take the child with it instead of leaving it
        // retrying against a server that is gone.
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .args(args)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(
                log.try_clone().context("duplicating the log file")?,
            ))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        // std's Child neither waits nor kills on drop: we reap it ourselves with wait4.
        Ok(Proc {
            pid: child.id() as libc::pid_t,
            started,
            done: None,
        })
    }

    pub fn reap(&mut self, block: bool) -> Result<Option<Exit>> {
        if let Some(e) = self.done {
            return Ok(Some(e));
        }
        let mut status = 0;
        // SAFETY: plain syscall on our own child with valid out-pointers.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let flags = if block { 0 } else { libc::WNOHANG };
        let r = unsafe { libc::wait4(self.pid, &mut status, flags, &mut usage) };
        if r == 0 {
            return Ok(None);
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(None);
            }
            return Err(anyhow!("wait4({}): {e}", self.pid));
        }
        let exit = Exit {
            code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
            signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
            max_rss_kib: usage.ru_maxrss.max(0) as u64,
            cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
            sys: tv(usage.ru_stime),
            at: Instant::now(),
        };
        self.done = Some(exit);
        Ok(Some(exit))
    }

    /// Waits for the process to end.
    pub fn wait(&mut self) -> Result<Exit> {
        loop {
            if let Some(e) = self.reap(true)? {
                return Ok(e);
            }
        }
    }

    pub fn kill(&mut self) -> Result<Exit> {
        if self.done.is_none() {
            // SAFETY: our own child, not yet reaped, so the pid cannot have been reused.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        self.wait()
    }

    /// The time from this process's start to the first call that `calls` counts above
    /// `before`, polled every millisecond; an error quoting the process's `log` if it ends
    /// first.
    pub fn first_call(
        &mut self,
        calls: &dyn Fn() -> u64,
        before: u64,
        log: &Path,
    ) -> Result<Duration> {
        loop {
            if calls() > before {
                return Ok(self.started.elapsed());
            }
            if let Some(e) = self.reap(false)? {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                bail!(
                    "the binary ended ({}) before making any request:\n{log}",
                    e.describe()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// (VmRSS, VmHWM) in KiB, while the process is alive.
    pub fn memory(&self) -> Option<(u64, u64)> {
        let [rss, hwm] = self.status_kib(["VmRSS:", "VmHWM:"])?;
        Some((rss, hwm))
    }

    /// Fields of /proc/PID/status in KiB (e.g. `RssAnon:`), while the process is alive.
    pub fn status_kib<const N: usize>(&self, names: [&str; N]) -> Option<[u64; N]> {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let field = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        };
        let mut values = [0; N];
        for (value, name) in values.iter_mut().zip(names) {
            *value = field(name)?;
        }
        Some(values)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.done.is_none() {
            let _ = self.kill();
        }
    }
}

/// The `highwater` binary: `--bin`, else the one `cargo bench` built beside this bench.
pub fn binary(args: &Args) -> Result<PathBuf> {
    let bin = args
        .bin
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_highwater")));
    if !bin.is_file() {
        bail!(
            "the highwater binary is not at {}; build it with `cargo build --release` (or pass --bin PATH)",
            bin.display()
        );
    }
    Ok(bin)
}

/// Where a worker keeps its job: a state directory, or a job of a PostgreSQL database.
#[derive(Debug, Clone, Copy)]
pub enum State<'a> {
    Dir(&'a Path),
    Pg { url: &'a str, job: &'a str },
}

/// `run --input FILE --url URL --state DIR --concurrency C --progress-interval 1s`: a run
/// whose log keeps its progress lines (for the modes that read them back).
pub fn logged_run_args(input: &Path, url: &str, state: &Path, c: usize) -> Vec<String> {
    [
        "run",
        "--input",
        &input.display().to_string(),
        "--url",
        url,
        "--state",
        &state.display().to_string(),
        "--concurrency",
        &c.to_string(),
        "--progress-interval",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `run --input FILE --url URL --state DIR --concurrency C --progress-interval 0 -q`;
/// without `input`, a resume (no `--input`, no `--url`).
pub fn run_args(input: Option<&Path>, url: &str, state: &Path, c: usize) -> Vec<String> {
    worker_args(input, url, State::Dir(state), c)
}

/// [`run_args`] for any [`State`]: a PostgreSQL job adds `--job NAME`.
pub fn worker_args(input: Option<&Path>, url: &str, state: State, c: usize) -> Vec<String> {
    let mut a = vec!["run".to_string()];
    if let Some(i) = input {
        a.extend(["--input".into(), i.display().to_string()]);
        a.extend(["--url".into(), url.to_string()]);
    }
    match state {
        State::Dir(dir) => a.extend(["--state".into(), dir.display().to_string()]),
        State::Pg { url, job } => a.extend([
            "--state".into(),
            url.to_string(),
            "--job".into(),
            job.to_string(),
        ]),
    }
    a.extend([
        "--concurrency".into(),
        c.to_string(),
        "--progress-interval".into(),
        "0".into(),
        "-q".into(),
    ]);
    a
}
