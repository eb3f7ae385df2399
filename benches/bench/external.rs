//! Programs the `latency` and `cpu` modes run beside the binary: `wrk` (the yardstick: the
//! most a plain HTTP/1.1 keep-alive load generator gets from the same server with as many
//! connections) and the `highwater` binary itself, both as children reaped with `wait4`, so
//! their CPU time and peak RSS are theirs alone.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::child::{run_args, Exit, Proc};

/// One `wrk` run.
pub struct WrkRun {
    pub requests_per_sec: f64,
    /// User + system CPU of wrk, per request.
    pub cpu_per_request: Duration,
    /// wrk's "Socket errors" and "Non-2xx" lines, if any.
    pub errors: Option<String>,
}

/// `wrk -t threads -c connections -d secs URL`, its output in `log`.
pub fn wrk(threads: usize, connections: usize, secs: u64, url: &str, log: &Path) -> Result<WrkRun> {
    let args: Vec<String> = vec![
        "-t".into(),
        threads.min(connections).to_string(),
        "-c".into(),
        connections.to_string(),
        "-d".into(),
        format!("{secs}s"),
        "--timeout".into(),
        "30s".into(),
        url.into(),
    ];
    let mut proc =
        Proc::spawn(Path::new("wrk"), &args, log).context("starting wrk (apt-get install wrk)")?;
    let exit = loop {
        if let Some(e) = proc.reap(true)? {
            break e;
        }
    };
    let out = std::fs::read_to_string(log).unwrap_or_default();
    if exit.code != Some(0) {
        bail!("wrk {}: {}", exit.describe(), out.trim());
    }
    let field = |prefix: &str| {
        out.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::trim)
    };
    let requests_per_sec: f64 = field("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no Requests/sec in wrk's output:\n{out}"))?;
    let requests: u64 = out
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no request count in wrk's output:\n{out}"))?;
    let errors: Vec<&str> = out
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("Socket errors") || l.starts_with("Non-2xx"))
        .collect();
    Ok(WrkRun {
        requests_per_sec,
        cpu_per_request: exit.cpu / requests.max(1) as u32,
        errors: (!errors.is_empty()).then(|| errors.join("; ")),
    })
}

/// One run of the binary over a fresh state directory.
#[derive(Debug, Clone)]
pub struct BinRun {
    pub exit: Exit,
    pub elapsed: Duration,
    /// Calls per second at the server between 10% and 90% of the IDs (when the server
    /// counts its calls): the steady rate, without start-up and tail.
    pub steady: Option<f64>,
    /// Calls the server counted during the run.
    pub calls: Option<u64>,
}

impl BinRun {
    pub fn items_per_sec(&self, n: u64) -> f64 {
        n as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs `bin run --input INPUT --url URL --state STATE --concurrency C -q` to its end.
/// `calls` reads the server's call count (None: the server does not count), sampled every
/// 10 ms for the steady rate. Fails unless the binary exits 0 (every ID succeeded).
pub fn run_binary(
    bin: &Path,
    input: &Path,
    url: &str,
    state: &Path,
    concurrency: usize,
    n: u64,
    calls: Option<&dyn Fn() -> u64>,
) -> Result<BinRun> {
    let _ = std::fs::remove_dir_all(state);
    let log = state.with_extension("log");
    let args = run_args(Some(input), url, state, concurrency);
    run_to_end(bin, &args, &[], &log, n, calls)
}

/// Runs `bin ARGS` (with `env` added) to its end, its output in `log`; as [`run_binary`].
pub fn run_to_end(
    bin: &Path,
    args: &[String],
    env: &[(&str, &str)],
    log: &Path,
    n: u64,
    calls: Option<&dyn Fn() -> u64>,
) -> Result<BinRun> {
    let before = calls.map(|c| c());
    let mut proc = Proc::spawn_with_env(bin, args, env, log)?;
    let (mut t10, mut t90) = (None, None);
    let exit = loop {
        if let Some(e) = proc.reap(false)? {
            break e;
        }
        if let (Some(calls), Some(b)) = (calls, before) {
            let done = calls() - b;
            let now = Instant::now();
            if t10.is_none() && done * 10 >= n {
                t10 = Some((now, done));
            }
            if t90.is_none() && done * 10 >= n * 9 {
                t90 = Some((now, done));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = exit.at - proc.started;
    if exit.code != Some(0) {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        bail!(
            "{} {} ended with {} after {:.1} s:\n{}",
            bin.display(),
            args.join(" "),
            exit.describe(),
            elapsed.as_secs_f64(),
            text.trim()
        );
    }
    let steady = match (t10, t90) {
        (Some((a, na)), Some((b, nb))) if b > a => Some((nb - na) as f64 / (b - a).as_secs_f64()),
        _ => None,
    };
    Ok(BinRun {
        exit,
        elapsed,
        steady,
        calls: calls.zip(before).map(|(c, b)| c() - b),
    })
}
