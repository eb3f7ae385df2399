//! CLI: the command line, turned once into validated library types, and the exit codes.
//!
//! Owns the clap definitions of every subcommand, their conversion into a
//! [`JobRequest`]/[`RunOptions`], the signal handling of a run, the human and JSON rendering of
//! `status`, and the mapping of outcomes to exit codes. Nothing below this module sees clap.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::console::shell_path;
use crate::engine;
use crate::input::{format_from_extension, InputFormat, InputSpec};
use crate::job::JobHandler;
use crate::job::{
    open_job, run_reported, Durability, FailureLimit, JobRequest, JobSpec, Reporters,
    RetryOverrides, RunOptions,
};
use crate::monitor::{EventFormat, MonitorConfig};
use crate::progress::RunSummary;
use crate::rerun::{Prepared, RerunAsk, RerunError};
use crate::sink::{self, ExportFormat};
use crate::store::sled_store::{OpenMode, SledStore};
use crate::store::{ItemStatus, JobView, Log, Store, StoreStats};
use crate::throttle::{Rate, ThrottleOptions};

mod demo_command;
mod flags;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(not(feature = "postgres"))]
#[path = "cli/no_pg.rs"]
mod pg;

/// Where `--state` points: a state directory (sled), or a job of a PostgreSQL database.
enum StateArg {
    Dir,
    Pg { url: String, job: String },
}

/// Read `--state` and `--job`: a URL needs --job, a directory refuses it (exit 2, said).
fn state_arg(state: &Path, job: Option<&str>) -> Result<StateArg, u8> {
    let text = state.to_string_lossy();
    let url = text.starts_with("postgres://") || text.starts_with("postgresql://");
    match (url, job) {
        (true, Some(job)) => Ok(StateArg::Pg {
            url: text.into_owned(),
            job: job.to_string(),
        }),
        (true, None) => {
            crate::say!("error: --job NAME is required with a PostgreSQL --state (a database holds many jobs)");
            Err(exit::USAGE)
        }
        (false, Some(_)) => {
            crate::say!(
                "error: --job names a job of a PostgreSQL database (--state postgres://...); \
                 the state directory {} holds one job",
                state.display()
            );
            Err(exit::USAGE)
        }
        (false, None) => Ok(StateArg::Dir),
    }
}

/// Print a line to standard error. A closed standard error (its reader went away) is no
/// reason to fail or abandon a job, so write errors are ignored.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        $crate::console::say(&format!($($arg)*));
    }};
}

/// Exit codes, as documented in `--help` and README.
pub mod exit {
    /// Every ID succeeded.
    pub const OK: u8 = 0;
    /// The job could not proceed (input, state or store error).
    pub const ERROR: u8 = 1;
    /// Usage error (clap uses 2 as well).
    pub const USAGE: u8 = 2;
    /// The run completed but some IDs failed permanently.
    pub const FAILURES: u8 = 3;
    /// Stopped by a signal.
    pub const SIGNAL: u8 = 130;
}

const EXIT_CODES: &str = "Exit codes:
  0    every ID succeeded
  1    the job could not proceed (input, state or store error)
  2    usage error
  3    the run completed but some IDs failed permanently
  130  stopped by a signal (run the same command again to resume)";

#[derive(Debug, Parser)]
#[command(name = "highwater", version, about = "Long, resumable enrichment jobs: one API call per ID, crash-safe", after_help = EXIT_CODES)]
pub struct Cli {
    /// More log output (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Less log output (warnings and errors only).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Log lines and progress events as text, or as one JSON object per line.
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a job and run it, or resume the job stored in --state.
    /// A flag given twice takes its last value.
    #[command(after_help = EXIT_CODES, args_override_self = true)]
    Run(Box<RunArgs>),
    /// Show where a job stands.
    Status(StatusArgs),
    /// Write one record per unique ID, in input order.
    Export(ExportArgs),
    /// List the IDs that failed permanently (the error table), in input order.
    Failures(FailuresArgs),
    /// Call chosen IDs of a job again: the failed ones, those of some buckets, or a list.
    /// Crash-safe like a run: after a kill, the same command resumes it.
    #[command(after_help = EXIT_CODES, args_override_self = true)]
    Rerun(Box<RerunArgs>),
    /// Run a complete job against a local fake API with injected faults.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// State directory (created on first run, resumed after), or a PostgreSQL URL
    /// (postgres://user@host/db, ${VAR} expanded) with --job: the job's workers share it.
    #[arg(long, value_name = "DIR|URL")]
    state: PathBuf,
    /// With a PostgreSQL --state: the job's name in that database.
    #[arg(long, value_name = "NAME")]
    job: Option<String>,
    /// With a PostgreSQL --state: how long a worker's leases outlive its last heartbeat
    /// (its buckets are taken over after that when it dies).
    #[arg(long, default_value = "30s", value_parser = lease_ttl, value_name = "DURATION")]
    lease_ttl: Duration,
    /// File of IDs (needed to create the job; optional on resume).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Input format; default from the extension (.csv, .jsonl/.ndjson, else text).
    #[arg(long, value_enum)]
    input_format: Option<FormatArg>,
    /// CSV column holding the ID.
    #[arg(long, value_name = "NAME")]
    id_column: Option<String>,
    /// JSONL field holding the ID.
    #[arg(long, value_name = "NAME")]
    id_field: Option<String>,
    /// URL template: {id} is percent-encoded, ${VAR} comes from the environment.
    #[arg(long, value_name = "TEMPLATE")]
    url: Option<String>,
    /// Run a command for each ID instead of calling a URL: 'PROGRAM ARG... {id}', split
    /// like a shell would (no shell unless you write sh -c), {id} one argument, ${VAR} from
    /// the environment. Standard output is the result; exit 0 ok, a --retry-exit-codes code
    /// retried, past --timeout killed and retried, any other exit fails the ID.
    #[arg(long, value_name = "COMMAND", conflicts_with_all = ["url", "method", "headers", "body", "connect_timeout"])]
    exec: Option<String>,
    /// With --exec: exit codes that mean "try again later" [default: 75].
    #[arg(long, value_name = "CODE,...", value_delimiter = ',', value_parser = clap::value_parser!(i32).range(1..=255))]
    retry_exit_codes: Option<Vec<i32>>,
    /// HTTP method [default: GET].
    #[arg(long)]
    method: Option<String>,
    /// Request header 'Name: value' (repeatable); ${VAR} comes from the environment.
    #[arg(long = "header", short = 'H', value_name = "HEADER")]
    headers: Vec<String>,
    /// Body template: {id} is JSON-escaped, ${VAR} comes from the environment.
    #[arg(long, value_name = "TEMPLATE")]
    body: Option<String>,
    /// Rows per bucket (micro-batch) [default: 1000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    bucket_size: Option<u64>,
    /// Items in flight at most.
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    concurrency: u32,
    /// TCP connect timeout [default: 10s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    connect_timeout: Option<Duration>,
    /// Whole-request timeout; with --exec, how long a process may run [default: 30s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    timeout: Option<Duration>,
    /// Attempts per ID, the first included [default: 5].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: Option<u32>,
    /// First retry wait; doubles per attempt, with jitter [default: 500ms].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    retry_initial: Option<Duration>,
    /// Longest retry wait [default: 30s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    retry_max: Option<Duration>,
    /// Give up on an ID this long after its first attempt [default: 15m].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    max_retry_time: Option<Duration>,
    /// Skip input lines without a usable ID (counted and recorded) instead of stopping.
    #[arg(long)]
    skip_bad_lines: bool,
    /// After SIGINT/SIGTERM, how long in-flight items may take to finish.
    #[arg(long, default_value = "30s", value_parser = duration, value_name = "DURATION")]
    shutdown_timeout: Duration,
    /// How often to report progress when standard error is not a terminal, and whether to
    /// report at the end (0 = never).
    #[arg(long, default_value = "30s", value_parser = duration, value_name = "DURATION")]
    progress_interval: Duration,
    /// Make results and commit records durable in the background every
    /// --checkpoint-interval instead of before each bucket's commit (a crash then repeats
    /// up to one interval of calls). May be switched on or off between runs.
    #[arg(long)]
    async_progress: bool,
    /// With --async-progress: how often results and commits are made durable.
    #[arg(long, default_value = "1s", value_parser = positive_duration, value_name = "DURATION", requires = "async_progress")]
    checkpoint_interval: Duration,
    /// Requests per second at most, retries and probes included: 50, 50/s, 3000/min, 0.5/s.
    /// With adaptive control (the default) this is the ceiling.
    #[arg(long, value_name = "RATE")]
    rate: Option<Rate>,
    /// Requests that may start at once above the rate: the API sees at most R*t + N in any
    /// window of t seconds. Default: derived from the rate (2 at low rates, about 5 ms
    /// worth at high ones), enough to make up for late timer wake-ups without tuning.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    burst: Option<u32>,
    /// Follow the API's pushback (429, 503, timeouts, rising latency): the rate between
    /// --min-rate and --rate, or, without --rate, the concurrency up to --concurrency.
    #[arg(long, value_enum, default_value = "on")]
    adaptive: OnOff,
    /// Floor of the adaptive rate [default: --rate / 100, at least 0.1/s].
    #[arg(long, value_name = "RATE")]
    min_rate: Option<Rate>,
    /// Starting rate [default: --rate].
    #[arg(long, value_name = "RATE")]
    initial_rate: Option<Rate>,
    /// Control law, proportional gain (experts).
    #[arg(long, default_value_t = 1.0, value_name = "K")]
    kp: f64,
    /// Control law, integral gain, applied to the share of pushback (experts).
    #[arg(long, default_value_t = 0.2, value_name = "K")]
    ki: f64,
    /// Control law, derivative gain (experts).
    #[arg(long, default_value_t = 0.0, value_name = "K")]
    kd: f64,
    /// How long the API may be unreachable (everything failing) before the run stops with
    /// exit 1, progress durable.
    #[arg(long, default_value = "30m", value_parser = duration, value_name = "DURATION")]
    max_outage: Duration,
    /// Stop the run once more IDs than this failed permanently in it: a count or N%.
    #[arg(long, value_name = "N|N%")]
    max_failures: Option<FailureLimit>,
    /// sled page cache size in MiB.
    #[arg(long, default_value_t = 32, value_name = "MIB")]
    store_cache_mb: u64,
    /// Reopen the sled database after this much written (e.g. 64MiB, 512KiB; at least 1/32
    /// of the store's size), so it writes a snapshot: a restart after a crash then replays at
    /// most about this much of sled's log before the first request. Lower: faster restarts,
    /// more short pauses; 1TiB: never (least memory, but a restart replays everything since
    /// the last start).
    #[arg(long, default_value = "64MiB", value_parser = byte_size, value_name = "SIZE")]
    store_reopen_after: u64,
    /// Serve Prometheus metrics over HTTP on this address during the run, e.g. 127.0.0.1:9184.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Accept a changed --url, --method, --body or answer check (--expect, --fail-if,
    /// --retry-if, --extract, --keep-body) for an existing job (recorded in the job's spec
    /// history, shown by `status`).
    #[arg(long)]
    allow_spec_change: bool,
    /// What a 2xx answer must be: json (else a retryable failure of class body), or any
    /// [default: any].
    #[arg(long, value_enum, value_name = "KIND")]
    expect: Option<ExpectArg>,
    /// jq condition over the answer ($status, $headers bound): true fails the ID for good,
    /// class invalid. E.g. '.error != null'. '' removes it.
    #[arg(long, value_name = "EXPR")]
    fail_if: Option<String>,
    /// jq condition over the answer: true retries the attempt with backoff (counted against
    /// --max-attempts and --max-retry-time), class invalid. E.g. '.status == "pending"'.
    #[arg(long, value_name = "EXPR")]
    retry_if: Option<String>,
    /// jq program whose one output is stored as the result instead of the whole body.
    /// E.g. '{name: .data.name, score: .data.score}'. '' removes it.
    #[arg(long, value_name = "EXPR")]
    extract: Option<String>,
    /// With --extract: keep the raw body too (stored as {"extract": ..., "raw": ...}).
    #[arg(long)]
    keep_body: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExpectArg {
    /// The body must be one JSON document.
    Json,
    /// Any body (not JSON is stored as a JSON string).
    Any,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("selection").required(true).args(["failed", "buckets", "ids"])))]
struct RerunArgs {
    /// Call again every failed ID of the job.
    #[arg(long)]
    failed: bool,
    /// Call again the failed IDs of these buckets: 10,20,21.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    buckets: Vec<u64>,
    /// With --buckets: call every ID of those buckets, the ones that succeeded too.
    #[arg(long)]
    all_items: bool,
    /// Call again exactly the IDs in FILE (one per line); each must belong to the job.
    #[arg(long, value_name = "FILE")]
    ids: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Args)]
struct FailuresArgs {
    #[arg(long, value_name = "DIR|URL")]
    state: PathBuf,
    /// With a PostgreSQL --state: the job's name.
    #[arg(long, value_name = "NAME")]
    job: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    format: sink::FailuresFormat,
    /// Only the failures of this bucket.
    #[arg(long, value_name = "N")]
    bucket: Option<u64>,
    /// Only failures of this error class: http, timeout, connect, connection, body, request,
    /// invalid.
    #[arg(long, value_name = "CLASS")]
    class: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    Text,
    Csv,
    Jsonl,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[arg(long, value_name = "DIR|URL")]
    state: PathBuf,
    /// With a PostgreSQL --state: the job's name.
    #[arg(long, value_name = "NAME")]
    job: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Refresh every second until the run ends (Ctrl-C to leave).
    #[arg(long)]
    watch: bool,
}

#[derive(Debug, Args)]
struct ExportArgs {
    #[arg(long, value_name = "DIR|URL")]
    state: PathBuf,
    /// With a PostgreSQL --state: the job's name.
    #[arg(long, value_name = "NAME")]
    job: Option<String>,
    #[arg(long, value_enum, default_value = "jsonl")]
    format: ExportFormat,
    /// Write here (atomically) instead of standard output.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Only the records with this status.
    #[arg(long, value_enum)]
    status: Option<StatusArg>,
    /// With --format parquet: the top-level fields of object results become typed columns
    /// in place of body.
    #[arg(long)]
    flatten: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StatusArg {
    Ok,
    Failed,
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// Where to put the input and the state (default: a new temporary directory).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// How many IDs the demo input holds.
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    ids: u64,
}

fn duration(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 500ms, 30s, 5m)"))
}

/// A size in bytes: a number with an optional unit, B, KiB, MiB, GiB or TiB (K, M, G, T also).
fn byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        other => return Err(format!("unknown unit {other:?} (write e.g. 64MiB, 512KiB)")),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (write e.g. 64MiB, 512KiB)"))?;
    match n.checked_mul(1 << shift) {
        Some(0) => Err("must be more than 0 (write e.g. 64MiB)".into()),
        Some(bytes) => Ok(bytes),
        None => Err(format!("{s:?} is too large")),
    }
}

fn lease_ttl(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        d if d < Duration::from_secs(2) => Err("must be at least 2s (write e.g. 30s)".into()),
        d => Ok(d),
    }
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        d if d.is_zero() => Err("must be more than 0 (write e.g. 500ms, 1s)".into()),
        d => Ok(d),
    }
}

/// Parse the command line, run, and return the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    flags::install();
    init_logging(cli.verbose, cli.quiet, cli.log_format == LogFormat::Json);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            say!("error: {}", error_text(&e));
            ExitCode::from(exit::ERROR)
        }
    }
}

/// An error and its causes, joined by ": ", leaving out a cause whose text the message before
/// it already ends with (`cannot open input X: No such file or directory`, not that twice).
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn init_logging(verbose: u8, quiet: bool, json: bool) {
    crate::console::set_mode(json, quiet);
    let default = match (quiet, verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "highwater=debug,info",
        (false, _) => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file (nohup, systemd, a container) gets plain text.
    let colour = crate::console::stderr_is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| crate::console::LogWriter)
        .with_ansi(colour)
        .with_target(false);
    if json {
        fmt.json().init();
    } else {
        fmt.init();
    }
}

async fn dispatch(command: Command) -> Result<u8> {
    match command {
        Command::Run(args) => run(*args).await,
        Command::Status(args) => status(args).await,
        Command::Export(args) => export(args).await,
        Command::Failures(args) => failures(args).await,
        Command::Rerun(args) => rerun(*args).await,
        Command::Demo(args) => demo_command::run(args.dir, args.ids).await,
    }
}

impl RunArgs {
    fn input_spec(&self) -> Result<Option<InputSpec>, String> {
        let Some(path) = &self.input else {
            if self.input_format.is_some() || self.id_column.is_some() || self.id_field.is_some() {
                return Err("--input-format, --id-column and --id-field need --input".into());
            }
            return Ok(None);
        };
        let path = std::fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .map_err(|e| format!("--input {}: {e}", path.display()))?;
        let format = match self.input_format {
            Some(FormatArg::Text) => "text",
            Some(FormatArg::Csv) => "csv",
            Some(FormatArg::Jsonl) => "jsonl",
            None => format_from_extension(&path),
        };
        let format = match format {
            "csv" => InputFormat::Csv {
                column: self
                    .id_column
                    .clone()
                    .ok_or("a CSV input needs --id-column NAME")?,
            },
            "jsonl" => InputFormat::Jsonl {
                field: self
                    .id_field
                    .clone()
                    .ok_or("a JSONL input needs --id-field NAME")?,
            },
            _ => InputFormat::Text,
        };
        match (&format, &self.id_column, &self.id_field) {
            (InputFormat::Csv { .. }, _, None)
            | (InputFormat::Jsonl { .. }, None, _)
            | (InputFormat::Text, None, None) => {}
            _ => {
                return Err(format!(
                "--id-column goes with CSV input and --id-field with JSONL; this input is {format}"
            ))
            }
        }
        Ok(Some(InputSpec { path, format }))
    }

    fn request(&self) -> Result<JobRequest, String> {
        Ok(JobRequest {
            input: self.input_spec()?,
            bucket_size: self.bucket_size,
            method: self.method.clone(),
            url: self.url.clone(),
            exec: self.exec.clone(),
            retry_exit_codes: self.retry_exit_codes.clone(),
            handler: None,
            headers: if self.headers.is_empty() {
                None
            } else {
                Some(self.headers.clone())
            },
            body: self.body.clone(),
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            retry: RetryOverrides {
                max_attempts: self.max_attempts,
                initial: self.retry_initial,
                max_interval: self.retry_max,
                max_elapsed: self.max_retry_time,
            },
            answer: crate::job::AnswerRequest {
                expect_json: self.expect.map(|e| e == ExpectArg::Json),
                fail_if: self.fail_if.clone(),
                retry_if: self.retry_if.clone(),
                extract: self.extract.clone(),
                keep_body: self.keep_body.then_some(true),
            },
            allow_spec_change: self.allow_spec_change,
            command: "run".into(),
        })
    }

    fn options(&self) -> RunOptions {
        RunOptions {
            concurrency: self.concurrency as usize,
            skip_bad_lines: self.skip_bad_lines,
            shutdown_timeout: self.shutdown_timeout,
            progress_interval: self.progress_interval,
            throttle: ThrottleOptions {
                rate: self.rate,
                burst: self.burst,
                adaptive: self.adaptive == OnOff::On,
                min_rate: self.min_rate,
                initial_rate: self.initial_rate,
                kp: self.kp,
                ki: self.ki,
                kd: self.kd,
                max_outage: self.max_outage,
                ..ThrottleOptions::default()
            },
            max_failures: self.max_failures,
            durability: if self.async_progress {
                Durability::Async {
                    interval: self.checkpoint_interval,
                }
            } else {
                Durability::Sync
            },
        }
    }
}

async fn run(args: RunArgs) -> Result<u8> {
    let request = match args.request() {
        Ok(r) => r,
        Err(message) => {
            say!("error: {message}");
            return Ok(exit::USAGE);
        }
    };
    if let Some(code) = open_files(&args) {
        return Ok(code);
    }
    // Listen first: a bad --metrics-addr stops the run before anything is created.
    let metrics = match args.metrics_addr {
        Some(addr) => Some(
            crate::metrics::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("--metrics-addr {e}"))?,
        ),
        None => None,
    };
    match state_arg(&args.state, args.job.as_deref()) {
        Ok(StateArg::Dir) => {}
        Ok(StateArg::Pg { url, job }) => return pg::run(&args, request, url, job, metrics).await,
        Err(code) => return Ok(code),
    }
    // A new job needs --input and --url (or --exec): say so before creating anything.
    let fresh = std::fs::read_dir(&args.state).map_or(true, |mut d| d.next().is_none());
    if fresh && request.input.is_some() && request.url.is_none() && request.exec.is_none() {
        say!(
            "error: {} holds no job: give --input FILE and --url TEMPLATE (or --exec COMMAND) to create one",
            args.state.display()
        );
        return Ok(exit::USAGE);
    }
    // A new job's templates and input are checked before its state directory is created, so
    // a mistyped flag leaves nothing behind.
    if fresh {
        if let Err(e) = crate::job::check_new_job(&request)
            .and_then(|()| crate::job::check_new_job_environment(&request))
        {
            return refused(e);
        }
    }
    let mode = if request.input.is_some() {
        OpenMode::CreateIfMissing
    } else {
        OpenMode::Existing
    };
    let existed = args.state.exists();
    let store = SledStore::open(&args.state, mode, args.store_cache_mb << 20)?;
    store.set_reopen_after(args.store_reopen_after);
    let spec = match open_job(&store, &request).await {
        Ok(spec) => spec,
        Err(e) => {
            // Whatever the checks above could not foresee (the input changing under us, a
            // read error), a refused creation leaves nothing behind either.
            if fresh {
                drop(store);
                undo_creation(&args.state, existed);
            }
            return refused(e);
        }
    };
    if let Some(code) = library_job(&spec, &format!("the job in {}", args.state.display())) {
        return Ok(code);
    }
    if let Some(open) = crate::rerun::unfinished(&store).await? {
        say!(
            "note: rerun {} ({}) is not finished; resume it with: highwater rerun --state {} {}",
            open.number,
            open.selection,
            shell_path(&args.state),
            open.selection
        );
    }
    let done = store.stats().await?;
    if done.finished() {
        say!(
            "the job in {} is already finished: {} ok, {} failed",
            args.state.display(),
            done.ok,
            done.failed
        );
        return Ok(if done.failed > 0 {
            exit::FAILURES
        } else {
            exit::OK
        });
    }
    let handler = crate::job::job_handler(&spec)?;
    let resume = format!("highwater run --state {}", shell_path(&args.state));
    run_job(
        Arc::new(store),
        spec,
        handler,
        &args.options(),
        &args.state,
        metrics,
        &resume,
    )
    .await
}

/// A job made by a library program (its own handler) cannot be run from here: exit 2.
fn library_job(spec: &JobSpec, place: &str) -> Option<u8> {
    let name = spec.handler.as_ref()?;
    say!("error: {place} is run by a library program (its handler {name:?}): run it with that program");
    Some(exit::USAGE)
}

/// Raise the open-file limit to the hard one; a `--concurrency` that cannot have its
/// connections open is a usage error (exit 2), said before anything is created.
fn open_files(run: &RunArgs) -> Option<u8> {
    match crate::os::open_files_for(u64::from(run.concurrency)) {
        Ok(_) => None,
        Err(e) => {
            say!("error: --concurrency {}: {e}", run.concurrency);
            Some(exit::USAGE)
        }
    }
}

/// Remove what creating a job in `state` made: the directory if it did not exist, its
/// entries if it was empty. Best effort: the refusal is the error to report.
fn undo_creation(state: &Path, existed: bool) {
    if !existed {
        let _ = std::fs::remove_dir_all(state);
        return;
    }
    if let Ok(entries) = std::fs::read_dir(state) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

/// A job the command line asks for that cannot be: a usage error (2) for a wrong flag, a
/// --url, --header or --body that cannot make a request included (malformed, or naming a
/// variable missing from the environment), or a malformed answer check; 1 for a client that
/// cannot be built; anything else is the command's error.
fn refused(e: crate::job::JobError) -> Result<u8> {
    use crate::handler::HandlerError;
    use crate::job::JobError;
    let code = match &e {
        JobError::Usage(_)
        | JobError::Request(HandlerError::Invalid { .. } | HandlerError::MissingVar { .. })
        | JobError::Answer(_) => exit::USAGE,
        JobError::Request(_) => exit::ERROR,
        _ => return Err(e.into()),
    };
    say!("error: {e}");
    Ok(code)
}

/// Run a prepared job with signal handling, print the summary, and return the exit code.
/// `resume` is the command that resumes it, suggested if it stops unfinished.
pub async fn run_job<S: Store + crate::store::Leases>(
    store: Arc<S>,
    spec: JobSpec,
    handler: JobHandler,
    options: &RunOptions,
    state: &Path,
    metrics: Option<tokio::net::TcpListener>,
    resume: &str,
) -> Result<u8> {
    tracing::info!(
        job = %spec.job_id,
        input = %spec.input.path.display(),
        work = %work(&spec),
        bucket_size = spec.bucket_size,
        concurrency = options.concurrency,
        "running"
    );
    let summary = run_log(store, spec, handler, options, state, metrics, Log::Job).await?;
    say!("{}", summary.render());
    if let Some(reason) = &summary.halted {
        if !summary.job.finished() {
            say!("stopped: {reason}\nresume with: {resume}");
            return Ok(exit::ERROR);
        }
    }
    if summary.interrupted && !summary.job.finished() {
        say!("resume with: {resume}");
        return Ok(exit::SIGNAL);
    }
    Ok(if summary.job.failed > 0 {
        exit::FAILURES
    } else {
        exit::OK
    })
}

/// What a job does for each ID, for logs: its URL or its command (as written, `${VAR}`
/// unexpanded).
fn work(spec: &JobSpec) -> &str {
    spec.exec
        .as_ref()
        .map_or(spec.request.url.as_str(), |e| e.command.as_str())
}

/// Run the job's log or a rerun's with signal handling, the progress monitor and the
/// metrics endpoint, and return its summary.
async fn run_log<S: Store + crate::store::Leases>(
    store: Arc<S>,
    spec: JobSpec,
    handler: JobHandler,
    options: &RunOptions,
    state: &Path,
    metrics: Option<tokio::net::TcpListener>,
    log: Log,
) -> Result<RunSummary> {
    let monitor = MonitorConfig {
        input: spec.input.clone(),
        state: state.to_path_buf(),
        interval: options.progress_interval,
        format: if crate::console::json() {
            EventFormat::Json
        } else {
            EventFormat::Text
        },
        // No bar in JSON mode: every line on standard error is a JSON object.
        bar: crate::console::stderr_is_terminal()
            && !crate::console::quiet()
            && !crate::console::json(),
        concurrency: options.concurrency,
        configured_rate: options.throttle.rate.map(|r| r.per_second()),
    };
    let reporters = Reporters {
        signals: Some(Box::new(|| {
            say!("stopped at once; the state is consistent, resume with the same command");
            std::process::exit(exit::SIGNAL as i32);
        })),
        monitor: Some(monitor),
        metrics,
    };
    run_reported(
        store,
        spec,
        Arc::new(handler),
        options,
        reporters,
        engine::stop_pair(),
        log,
    )
    .await
    .context("the run stopped")
}

async fn rerun(args: RerunArgs) -> Result<u8> {
    if let Some(code) = open_files(&args.run) {
        return Ok(code);
    }
    let state = args.run.state.clone();
    match state_arg(&state, args.run.job.as_deref()) {
        Ok(StateArg::Dir) => {}
        Ok(StateArg::Pg { .. }) => {
            say!("error: rerun of a PostgreSQL job is not supported yet");
            return Ok(exit::USAGE);
        }
        Err(code) => return Ok(code),
    }
    let mut request = match args.run.request() {
        Ok(r) => r,
        Err(message) => {
            say!("error: {message}");
            return Ok(exit::USAGE);
        }
    };
    request.command = "rerun".into();
    // Listen first: a bad --metrics-addr stops the rerun before anything is created.
    let metrics = match args.run.metrics_addr {
        Some(addr) => Some(
            crate::metrics::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("--metrics-addr {e}"))?,
        ),
        None => None,
    };
    if args.all_items && args.buckets.is_empty() {
        say!("error: --all-items goes with --buckets (it redoes every ID of those buckets)");
        return Ok(exit::USAGE);
    }
    let ask = if args.failed {
        RerunAsk::Failed
    } else if let Some(file) = &args.ids {
        RerunAsk::Ids(file.clone())
    } else {
        RerunAsk::Buckets {
            buckets: args.buckets.clone(),
            all_items: args.all_items,
        }
    };
    let store = SledStore::open(&state, OpenMode::Existing, args.run.store_cache_mb << 20)?;
    store.set_reopen_after(args.run.store_reopen_after);
    if store.job().await?.is_none() {
        say!("error: {} holds no job to rerun", state.display());
        return Ok(exit::USAGE);
    }
    // Every refusal comes before anything is written (a spec change included).
    let chosen = match crate::rerun::choose(&store, &ask, &state).await {
        Ok(chosen) => chosen,
        Err(e @ (RerunError::Usage(_) | RerunError::Unfinished { .. })) => {
            say!("error: {e}");
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e.into()),
    };
    let spec = match open_job(&store, &request).await {
        Ok(spec) => spec,
        Err(e) => return refused(e),
    };
    if let Some(code) = library_job(&spec, &format!("the job in {}", state.display())) {
        return Ok(code);
    }
    // A missing ${VAR} is refused before the rerun is written.
    let handler = crate::job::job_handler(&spec)?;
    let rerun = match crate::rerun::start(&store, &spec, chosen).await {
        Ok(Prepared::Ready { rerun, resumed }) => {
            say!(
                "{} rerun {} ({}): {} IDs in {} rerun buckets",
                if resumed { "resuming" } else { "starting" },
                rerun.number,
                rerun.selection,
                rerun.ids,
                rerun.buckets
            );
            rerun
        }
        Ok(Prepared::Nothing(why)) => {
            say!("nothing to rerun: {why}");
            return Ok(exit::OK);
        }
        Err(e @ (RerunError::Usage(_) | RerunError::Unfinished { .. })) => {
            say!("error: {e}");
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e.into()),
    };
    let store = Arc::new(store);
    let summary = run_log(
        store.clone(),
        spec,
        handler,
        &args.run.options(),
        &state,
        metrics,
        Log::Rerun(rerun.number),
    )
    .await?;
    say!("{}", summary.render());
    let r = store.rerun_stats(rerun.number).await?;
    say!(
        "rerun {} ({}): {} ok, {} failed, {} pending of {} IDs",
        r.number,
        rerun.selection,
        r.ok,
        r.failed,
        r.pending,
        r.ids
    );
    if !r.finished() {
        if let Some(reason) = &summary.halted {
            say!(
                "stopped: {reason}\nresume with: highwater rerun --state {} {}",
                shell_path(&state),
                rerun.selection
            );
            return Ok(exit::ERROR);
        }
        say!(
            "resume with: highwater rerun --state {} {}",
            shell_path(&state),
            rerun.selection
        );
        return Ok(if summary.interrupted {
            exit::SIGNAL
        } else {
            exit::ERROR
        });
    }
    Ok(if r.failed > 0 {
        exit::FAILURES
    } else {
        exit::OK
    })
}

async fn failures(args: FailuresArgs) -> Result<u8> {
    if let Some(class) = &args.class {
        let names = crate::failure::ErrorClass::ALL.map(|c| c.name());
        if !names.contains(&class.as_str()) {
            say!(
                "error: --class {class:?} is not an error class (one of: {})",
                names.join(", ")
            );
            return Ok(exit::USAGE);
        }
    }
    match state_arg(&args.state, args.job.as_deref()) {
        Ok(StateArg::Dir) => {}
        Ok(StateArg::Pg { url, job }) => {
            let (store, _) = pg::open_reader(&url, &job).await?;
            return failures_of(&store, &args).await;
        }
        Err(code) => return Ok(code),
    }
    let (store, _) = open_existing(&args.state).await?;
    failures_of(&store, &args).await
}

/// `failures` over an opened store.
async fn failures_of<S: Store>(store: &S, args: &FailuresArgs) -> Result<u8> {
    if let Some(b) = args.bucket {
        if store.offset(b).await?.is_none() {
            say!(
                "error: --bucket {b}: the job has no bucket {b} ({} planned)",
                store.stats().await?.buckets_planned
            );
            return Ok(exit::USAGE);
        }
    }
    let filter = sink::FailureFilter {
        bucket: args.bucket,
        class: args.class.clone(),
    };
    let mut out = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
    match sink::failures(store, args.format, &filter, &mut out).await {
        Ok(_) => {}
        Err(crate::store::ExportError::Write(e)) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(e).context("listing failures to standard output"),
    }
    Ok(exit::OK)
}

/// First SIGINT/SIGTERM: stop gracefully. Second: exit at once (the store stays consistent).
/// Open a state directory that must hold a job, for reading.
async fn open_existing(state: &Path) -> Result<(SledStore, JobSpec)> {
    let store = SledStore::open(state, OpenMode::Existing, 16 << 20)?;
    let spec = crate::job::stored_job(&store).await?.with_context(|| {
        format!(
            "{} holds no job yet (its first run stopped before creating one)",
            state.display()
        )
    })?;
    Ok((store, spec))
}

async fn status(args: StatusArgs) -> Result<u8> {
    if let Err(code) = state_arg(&args.state, args.job.as_deref()) {
        return Ok(code);
    }
    if !args.watch {
        let (text, _) = status_once(&args).await?;
        let _ = io::stdout().lock().write_all(text.as_bytes());
        return Ok(exit::OK);
    }
    let clear = std::io::IsTerminal::is_terminal(&io::stdout()) && !args.json;
    loop {
        let (text, live) = status_once(&args).await?;
        let mut out = io::stdout().lock();
        // Home the cursor and clear the screen: refresh in place.
        let home: &[u8] = if clear { b"\x1b[H\x1b[2J" } else { b"" };
        let written = out
            .write_all(home)
            .and_then(|()| out.write_all(text.as_bytes()))
            .and_then(|()| out.flush());
        drop(out);
        // Nobody reads any more (a closed pipe, `| head`): stop watching.
        if !live || written.is_err() {
            return Ok(exit::OK);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The status text (or JSON line), and whether a run is live.
async fn status_once(args: &StatusArgs) -> Result<(String, bool)> {
    use crate::live;
    match state_arg(&args.state, args.job.as_deref()) {
        Ok(StateArg::Dir) => {}
        Ok(StateArg::Pg { url, job }) => return pg::status(&url, &job, args.json).await,
        Err(_) => anyhow::bail!("--state and --job do not go together"),
    }
    let now = crate::job::now_ms();
    let state_text = args.state.display().to_string();
    let (store, spec) = match open_existing(&args.state).await {
        Ok(opened) => opened,
        Err(e) => {
            let busy = e.downcast_ref().map(crate::store::StoreError::root);
            let Some(crate::store::StoreError::Busy { pid, .. }) = busy else {
                return Err(e);
            };
            // A run holds the store: show what it publishes. The snapshot is read after the
            // lock was found held, and judged by its pid and age.
            let live = live::read(&args.state).filter(|s| Some(s.pid) == *pid && !s.finished);
            let Some(s) = live else {
                return Ok((
                    if args.json {
                        format!(
                            "{}\n",
                            serde_json::json!({"state": state_text, "runner": "starting", "pid": pid, "finished": false})
                        )
                    } else {
                        format!(
                            "{} is in use by a run (pid {}) that has not published a live snapshot yet\n",
                            args.state.display(),
                            pid.map_or("?".into(), |p| p.to_string())
                        )
                    },
                    true,
                ));
            };
            let runner = s.runner(now);
            let text = if args.json {
                format!(
                    "{}\n",
                    serde_json::json!({
                        "state": state_text,
                        "job_id": s.job_id,
                        "runner": runner,
                        "live": s,
                        "stats": s.stats(),
                        "finished": false,
                    })
                )
            } else {
                s.render(&args.state, runner, now)
            };
            return Ok((text, true));
        }
    };
    // The store is free and we hold its lock: no run is active, and none can start until we
    // let go. A runner marks its snapshot finished before it lets go of the lock, so a
    // snapshot read now that is not marked finished means the last runner died (kill -9,
    // crash, power loss), whatever process has its pid now.
    let died = live::read(&args.state).filter(|s| !s.finished);
    let runner = match &died {
        Some(_) => "died",
        None => "none",
    };
    let text = describe(&store, &spec, &args.state, args.json, runner, died, None).await?;
    Ok((text, false))
}

/// A job's status from its store: text, or one JSON line. `died`: the last run's snapshot
/// when it died unfinished; `workers`: a shared job's worker sessions.
async fn describe<S: Store>(
    store: &S,
    spec: &JobSpec,
    state: &Path,
    json: bool,
    runner: &str,
    died: Option<crate::live::LiveSnapshot>,
    workers: Option<(serde_json::Value, String)>,
) -> Result<String> {
    use crate::live;
    let state_text = state.display().to_string();
    let stats = store.stats().await?;
    let bad = store.bad_lines(5).await?;
    let failures = sink::FailureSummary::of(store, FAILED_BUCKETS_SHOWN).await?;
    let mut reruns = Vec::new();
    for r in store.reruns().await? {
        reruns.push((store.rerun_stats(r.number).await?, r));
    }
    Ok(if json {
        let mut value = serde_json::json!({
            "state": state_text,
            "job_id": spec.job_id,
            "input": spec.input.path.display().to_string(),
            "input_format": spec.input.format.to_string(),
            "input_bytes": spec.fingerprint.len,
            "url": spec.request.url,
            "method": spec.request.method,
            "exec": spec.exec.as_ref().map(|e| &e.command),
            "bucket_size": spec.bucket_size,
            "runner": runner,
            "last_run": died,
            "stats": stats,
            "finished": stats.finished(),
            "bad_line_examples": bad,
            "failures": failures,
            "reruns": reruns.iter().map(|(s, r)| serde_json::json!({
                "number": r.number,
                "selection": r.selection.to_string(),
                "created_at_ms": r.created_at_ms,
                "ids": r.ids,
                "ok": s.ok,
                "failed": s.failed,
                "pending": s.pending,
                "finished": s.finished(),
            })).collect::<Vec<_>>(),
            "spec_history": spec.history,
        });
        if let Some((w, _)) = &workers {
            value["workers"] = w.clone();
        }
        format!("{value}\n")
    } else {
        let mut text = String::new();
        if let Some(s) = &died {
            text.push_str(&format!(
                "the last run (pid {}, run {}, started {}) died without finishing; its last snapshot was at {}. \
                 The figures below are the store's: resume with `highwater run --state {}`\n",
                s.pid,
                s.run_id,
                live::format_ms(s.started_ms),
                live::format_ms(s.updated_ms),
                shell_path(state)
            ));
        }
        text.push_str(&render_status(state, spec, &stats, &bad));
        text.push_str(&failures.render());
        for (s, r) in &reruns {
            text.push_str(&format!(
                "rerun {}:    {}: {} ok, {} failed, {} pending of {} IDs{}\n",
                r.number,
                r.selection,
                s.ok,
                s.failed,
                s.pending,
                r.ids,
                if s.finished() { "" } else { " (not finished)" }
            ));
        }
        for change in &spec.history {
            text.push_str(&format!("spec change: {change}\n"));
        }
        if let Some((_, w)) = &workers {
            text.push_str(w);
        }
        text
    })
}

/// How many buckets committed with failures `status` lists (it counts them all).
const FAILED_BUCKETS_SHOWN: usize = 100;

fn render_status(
    state: &Path,
    spec: &JobSpec,
    s: &StoreStats,
    bad: &[crate::store::BadLine],
) -> String {
    let read = if s.input_exhausted {
        "read to the end".to_string()
    } else if spec.fingerprint.len > 0 {
        format!(
            "{:.1}% read",
            100.0 * s.input_bytes_read as f64 / spec.fingerprint.len as f64
        )
    } else {
        String::new()
    };
    let mut text = format!(
        "state:      {}\njob:        {}\ninput:      {} ({}), {} rows {}\n{}\n\
         buckets:    {} planned, {} committed, {} in flight (size {})\n\
         IDs:        {} ok, {} failed, {} pending of {} planned\n\
         duplicates: {}\nbad lines:  {}\nfinished:   {}\n",
        state.display(),
        spec.job_id,
        spec.input.path.display(),
        spec.input.format,
        s.rows_read,
        read,
        match &spec.exec {
            Some(exec) => format!("exec:       {}", exec.command),
            None => format!("request:    {} {}", spec.request.method, spec.request.url),
        },
        s.buckets_planned,
        s.buckets_committed,
        s.buckets_in_flight,
        spec.bucket_size,
        s.ok,
        s.failed,
        s.pending,
        s.ids_planned,
        s.duplicates,
        s.bad_lines,
        if s.finished() { "yes" } else { "no" },
    );
    for b in bad {
        text.push_str(&format!("  bad line {}: {}\n", b.line, b.reason));
    }
    text
}

async fn export(args: ExportArgs) -> Result<u8> {
    let parquet = args.format == ExportFormat::Parquet;
    if args.flatten && !parquet {
        say!("error: --flatten goes with --format parquet");
        return Ok(exit::USAGE);
    }
    if parquet && args.output.is_none() {
        say!("error: --format parquet needs --output FILE (Parquet is not written to standard output)");
        return Ok(exit::USAGE);
    }
    match state_arg(&args.state, args.job.as_deref()) {
        Ok(StateArg::Dir) => {}
        Ok(StateArg::Pg { url, job }) => {
            let (store, _) = pg::open_reader(&url, &job).await?;
            return export_of(&store, &args).await;
        }
        Err(code) => return Ok(code),
    }
    let (store, _) = open_existing(&args.state).await?;
    export_of(&store, &args).await
}

/// `export` over an opened store.
async fn export_of<S: Store>(store: &S, args: &ExportArgs) -> Result<u8> {
    let parquet = args.format == ExportFormat::Parquet;
    let only = args.status.map(|s| match s {
        StatusArg::Ok => ItemStatus::Ok,
        StatusArg::Failed => ItemStatus::Failed,
    });
    match &args.output {
        Some(path) => {
            let n = if parquet {
                crate::parquet_export::export_to_file(store, only, args.flatten, path).await
            } else {
                sink::export_to_file(store, args.format, only, path).await
            }
            .with_context(|| format!("exporting to {}", path.display()))?;
            say!("wrote {n} records to {}", path.display());
        }
        None => {
            let mut out = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
            match sink::export(store, args.format, only, &mut out).await {
                Ok(_) => {}
                Err(crate::store::ExportError::Write(e))
                    if e.kind() == io::ErrorKind::BrokenPipe => {}
                Err(e) => return Err(e).context("exporting to standard output"),
            }
        }
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_and_without_units() {
        assert_eq!(byte_size("64MiB"), Ok(64 << 20));
        assert_eq!(byte_size("512KiB"), Ok(512 << 10));
        assert_eq!(byte_size("2G"), Ok(2 << 30));
        // README's way to turn reopening off.
        assert_eq!(byte_size("1TiB"), Ok(1 << 40));
        assert_eq!(byte_size("4096"), Ok(4096));
        assert_eq!(byte_size(" 16 K "), Ok(16 << 10));
        for bad in [
            "",
            "MiB",
            "0",
            "0MiB",
            "1.5MiB",
            "64MB",
            "-1",
            "99999999999999G",
            "99999999999T",
            "1PiB",
        ] {
            assert!(byte_size(bad).is_err(), "{bad:?} accepted");
        }
    }
}
