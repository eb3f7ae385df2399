//! The command line's clap definitions and value parsers; their conversion into the
//! library's [`JobRequest`] and [`RunOptions`] is `job_flags.rs`'s.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::job::FailureLimit;
use crate::sink::{self, ExportFormat};
use crate::throttle::Rate;

pub(crate) const EXIT_CODES: &str = "Exit codes:
  0    every ID succeeded
  1    the job could not proceed (input, state or store error)
  2    usage error
  3    the run completed but some IDs failed permanently
  4    a credential was rejected (fix it, then run the same command to resume)
  5    the job's budget (--budget, or --quota N/job) is spent (raise it to go on)
  6    the store stopped answering (--store-timeout): restart with the same command
  7    the API says the account is out of credit (add credit, then run the same command)
  130  stopped by a signal (run the same command again to resume)";

#[derive(Debug, Parser)]
#[command(name = "highwater", version, about = "Long, resumable enrichment jobs: one API call per ID, crash-safe", after_help = EXIT_CODES)]
pub(crate) struct Cli {
    /// More log output (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub(crate) verbose: u8,
    /// Less log output (warnings and errors only).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub(crate) quiet: bool,
    /// Log lines and progress events as text, or as one JSON object per line.
    #[arg(long, value_enum, default_value = "text", global = true)]
    pub(crate) log_format: LogFormat,
    /// Stop with exit code 6 when a store call (a flush, a sync, a write) has not returned
    /// for this long: a hung disk or store, which a restart resumes (0 = never).
    #[arg(long, default_value = "60s", value_parser = duration, value_name = "DURATION", global = true)]
    pub(crate) store_timeout: Duration,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    /// Serve the job's dashboard: a read-only web page, live while the job runs.
    Serve(ServeArgs),
    /// Write the job's dashboard as one self-contained HTML file.
    Report(ReportArgs),
    /// Run a complete job against a local fake API with injected faults.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[arg(long, value_name = "DIR|URL")]
    pub(crate) state: PathBuf,
    /// With a PostgreSQL --state: the job's name.
    #[arg(long, value_name = "NAME")]
    pub(crate) job: Option<String>,
    /// The address to listen on (another host than 127.0.0.1 shows the job to whoever
    /// reaches it).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR:PORT")]
    pub(crate) addr: std::net::SocketAddr,
}

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    #[arg(long, value_name = "DIR|URL")]
    pub(crate) state: PathBuf,
    /// With a PostgreSQL --state: the job's name.
    #[arg(long, value_name = "NAME")]
    pub(crate) job: Option<String>,
    /// The HTML file to write.
    #[arg(long, value_name = "FILE")]
    pub(crate) output: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// State directory (created on first run, resumed after), or a PostgreSQL URL
    /// (postgres://user@host/db, ${VAR} expanded) with --job: the job's workers share it.
    #[arg(long, value_name = "DIR|URL")]
    pub(crate) state: PathBuf,
    /// With a PostgreSQL --state: the job's name in that database.
    #[arg(long, value_name = "NAME")]
    pub(crate) job: Option<String>,
    /// With a PostgreSQL --state: how long a worker's leases outlive its last heartbeat
    /// (its buckets are taken over after that when it dies).
    #[arg(long, default_value = "30s", value_parser = lease_ttl, value_name = "DURATION")]
    pub(crate) lease_ttl: Duration,
    /// File of IDs, or a folder of such files read in name order, or a glob of them
    /// (`data/part-*.csv`) (needed to create the job; optional on resume).
    #[arg(long, value_name = "FILE|DIR")]
    pub(crate) input: Option<PathBuf>,
    /// Input format; default from the extension (.csv, .jsonl/.ndjson, .parquet, else text).
    #[arg(long, value_enum)]
    pub(crate) input_format: Option<FormatArg>,
    /// CSV or Parquet column holding the ID.
    #[arg(long, value_name = "NAME")]
    pub(crate) id_column: Option<String>,
    /// JSONL field holding the ID.
    #[arg(long, value_name = "NAME")]
    pub(crate) id_field: Option<String>,
    /// Call a batch endpoint: up to N IDs of a bucket per request, written with {ids} (or
    /// {rows} in the body); needs --split.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..=100_000))]
    pub(crate) batch_size: Option<u64>,
    /// With --batch-size: what joins the IDs of {ids} in the URL or a header [default: ,].
    #[arg(long, value_name = "TEXT")]
    pub(crate) batch_separator: Option<String>,
    /// With --batch-size: jq program splitting an answer into {key, value} objects, one per
    /// ID (key the ID), e.g. '.results[] | {key: .id, value: .}'.
    #[arg(long, value_name = "JQ")]
    pub(crate) split: Option<String>,
    /// Follow the pages of each ID's answer: link (the Link header's rel="next"),
    /// next-url=JQ (a URL read from the body), cursor=JQ (a cursor read from the body, put at
    /// --page-param), page or offset (counted, put at --page-param), or jq=PROGRAM. Needs
    /// --items; each ID's result is its items of every page, in order.
    #[arg(long, value_name = "STYLE")]
    pub(crate) paginate: Option<String>,
    /// With --paginate: jq program whose outputs are the items kept of each page, e.g.
    /// '.data[]'.
    #[arg(long, value_name = "JQ")]
    pub(crate) items: Option<String>,
    /// With --paginate cursor, page or offset: the query parameter NAME its value replaces,
    /// or body:PATH, the field of the JSON body it is set at (e.g. body:page.after).
    #[arg(long, value_name = "NAME|body:PATH")]
    pub(crate) page_param: Option<String>,
    /// With --paginate page: the number of the first page [default: 1].
    #[arg(long, value_name = "N")]
    pub(crate) page_start: Option<u64>,
    /// With --paginate page or offset: the items of a full page (a page with fewer is the
    /// last; without it, only an empty page is).
    #[arg(long, value_name = "N")]
    pub(crate) page_size: Option<u32>,
    /// With --paginate: the most pages followed for one ID [default: 10000].
    #[arg(long, value_name = "N")]
    pub(crate) max_pages: Option<u32>,
    /// Input columns (CSV or Parquet) or fields (JSONL) to keep of each row beside those a
    /// {column} of the templates names, for `export --columns`; fixed at creation.
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub(crate) keep_columns: Vec<String>,
    /// URL template: {id} is percent-encoded, ${VAR} comes from the environment.
    #[arg(long, value_name = "TEMPLATE")]
    pub(crate) url: Option<String>,
    /// Run a command for each ID instead of calling a URL: 'PROGRAM ARG... {id}', split
    /// like a shell would (no shell unless you write sh -c), {id} one argument, ${VAR} from
    /// the environment. Standard output is the result; exit 0 ok, a --retry-exit-codes code
    /// retried, past --timeout killed and retried, any other exit fails the ID.
    #[arg(long, value_name = "COMMAND", conflicts_with_all = ["url", "method", "headers", "body", "connect_timeout"])]
    pub(crate) exec: Option<String>,
    /// With --exec: exit codes that mean "try again later" [default: 75].
    #[arg(long, value_name = "CODE,...", value_delimiter = ',', value_parser = clap::value_parser!(i32).range(1..=255))]
    pub(crate) retry_exit_codes: Option<Vec<i32>>,
    /// HTTP method [default: GET].
    #[arg(long)]
    pub(crate) method: Option<String>,
    /// Request header 'Name: value' (repeatable); ${VAR} comes from the environment.
    #[arg(long = "header", short = 'H', value_name = "HEADER")]
    pub(crate) headers: Vec<String>,
    /// Body template: {id} is JSON-escaped, ${VAR} comes from the environment.
    #[arg(long, value_name = "TEMPLATE")]
    pub(crate) body: Option<String>,
    /// A credential renewed during the run, printed by a command: 'NAME=COMMAND'
    /// (repeatable), split like --exec's. ${NAME} in --url, --header, --body and --exec is
    /// its value (and NAME in --exec's environment); renewed when the API answers 401 and
    /// every --credential-every.
    #[arg(long, value_name = "NAME=COMMAND")]
    pub(crate) credential_command: Vec<String>,
    /// A credential renewed during the run, from an OAuth2 client-credentials grant:
    /// 'NAME=TOKEN_URL' (repeatable), with --oauth2-client-id and --oauth2-client-secret.
    /// Renewed before its expires_in runs out and when the API answers 401.
    #[arg(long, value_name = "NAME=TOKEN_URL")]
    pub(crate) credential_oauth2: Vec<String>,
    /// With --credential-oauth2: the client ID; ${VAR} comes from the environment.
    #[arg(long, value_name = "TEMPLATE")]
    pub(crate) oauth2_client_id: Option<String>,
    /// With --credential-oauth2: the client secret, as '${VAR}' (read from the environment
    /// at run time, never stored).
    #[arg(long, value_name = "TEMPLATE")]
    pub(crate) oauth2_client_secret: Option<String>,
    /// With --credential-oauth2: the scope to ask for.
    #[arg(long, value_name = "SCOPE")]
    pub(crate) oauth2_scope: Option<String>,
    /// With --credential-oauth2: how the client authenticates to the token endpoint: HTTP
    /// Basic auth (client_secret_basic), or the ID and secret in the form body
    /// (client_secret_post) [default: basic].
    #[arg(long, value_enum, value_name = "METHOD")]
    pub(crate) oauth2_client_auth: Option<ClientAuthArg>,
    /// Renew each credential at least this often (an OAuth2 token also before it expires).
    #[arg(long, value_parser = positive_duration, value_name = "DURATION")]
    pub(crate) credential_every: Option<Duration>,
    /// Renew credentials when the API answers 403 too, not only 401.
    #[arg(long)]
    pub(crate) credential_renew_on_403: bool,
    /// Rows per bucket (micro-batch) [default: 1000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) bucket_size: Option<u64>,
    /// Items in flight at most.
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) concurrency: u32,
    /// TCP connect timeout [default: 10s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub(crate) connect_timeout: Option<Duration>,
    /// Whole-request timeout; with --exec, how long a process may run [default: 30s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub(crate) timeout: Option<Duration>,
    /// Attempts per ID, the first included [default: 5].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: Option<u32>,
    /// First retry wait; doubles per attempt, with jitter [default: 500ms].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub(crate) retry_initial: Option<Duration>,
    /// Longest retry wait [default: 30s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub(crate) retry_max: Option<Duration>,
    /// Give up on an ID this long after its first attempt [default: 15m].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub(crate) max_retry_time: Option<Duration>,
    /// Skip input lines without a usable ID (counted and recorded) instead of stopping.
    #[arg(long)]
    pub(crate) skip_bad_lines: bool,
    /// After SIGINT/SIGTERM, how long in-flight items may take to finish.
    #[arg(long, default_value = "30s", value_parser = duration, value_name = "DURATION")]
    pub(crate) shutdown_timeout: Duration,
    /// How often to report progress when standard error is not a terminal, and whether to
    /// report at the end (0 = never).
    #[arg(long, default_value = "30s", value_parser = duration, value_name = "DURATION")]
    pub(crate) progress_interval: Duration,
    /// How often a sample of the run (counts, answers by class, latency percentiles, the
    /// rate limit and its cause) goes to the job's history, which `serve` and `report` chart
    /// (0 = none).
    #[arg(long, default_value = "10s", value_parser = duration, value_name = "DURATION")]
    pub(crate) history_interval: Duration,
    /// Make results and commit records durable in the background every
    /// --checkpoint-interval instead of before each bucket's commit (a crash then repeats
    /// up to one interval of calls). May be switched on or off between runs.
    #[arg(long)]
    pub(crate) async_progress: bool,
    /// With --async-progress: how often results and commits are made durable.
    #[arg(long, default_value = "1s", value_parser = positive_duration, value_name = "DURATION", requires = "async_progress")]
    pub(crate) checkpoint_interval: Duration,
    /// Requests per second at most, retries and probes included: 50, 50/s, 3000/min, 0.5/s.
    /// With adaptive control (the default) this is the ceiling.
    #[arg(long, value_name = "RATE")]
    pub(crate) rate: Option<Rate>,
    /// Calls allowed per window, every one kept (repeatable): 10000/h, 50/2s, 15000/day
    /// (fixed windows aligned on UTC: on the hour, at midnight), 600/10min,rolling, or a
    /// budget for the whole job, 1000000/job. Usage is stored with the job; given on a
    /// resume, the list replaces the stored one (`--quota none` removes them all).
    /// A quota may count a language model's tokens instead of calls: 90000tokens/min,
    /// 40000input-tokens/min, 8000output-tokens/min, 5000000tokens/job.
    #[arg(long = "quota", value_name = "CALLS/WINDOW", value_parser = quota)]
    pub(crate) quotas: Vec<Option<crate::quota::Quota>>,
    /// The price of the tokens a call reads (the prompt), per million tokens as price lists
    /// give it: 2.50, 2.50/1M, 0.0025/1K. Stored with the job; the spend is shown by
    /// status, the progress line and the dashboard.
    #[arg(long, value_name = "PRICE")]
    pub(crate) price_input: Option<crate::meter::Price>,
    /// The price of the tokens a call writes (the answer), as --price-input.
    #[arg(long, value_name = "PRICE")]
    pub(crate) price_output: Option<crate::meter::Price>,
    /// The most the job may spend by its prices, every run together (25, 12.50): the run
    /// stops with exit code 5 before a call could pass it; a larger budget goes on (`none`
    /// removes it).
    #[arg(long, value_name = "AMOUNT", value_parser = budget)]
    pub(crate) budget: Option<BudgetArg>,
    /// Requests that may start at once above the rate: the API sees at most R*t + N in any
    /// window of t seconds. Default: derived from the rate (2 at low rates, about 5 ms
    /// worth at high ones), enough to make up for late timer wake-ups without tuning.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) burst: Option<u32>,
    /// Follow the API's pushback (429, 503, timeouts, rising latency): the rate between
    /// --min-rate and --rate, or, without --rate, the concurrency up to --concurrency.
    #[arg(long, value_enum, default_value = "on")]
    pub(crate) adaptive: OnOff,
    /// Floor of the adaptive rate [default: --rate / 100, at least 0.1/s].
    #[arg(long, value_name = "RATE")]
    pub(crate) min_rate: Option<Rate>,
    /// Starting rate [default: --rate].
    #[arg(long, value_name = "RATE")]
    pub(crate) initial_rate: Option<Rate>,
    /// Control law, proportional gain (experts).
    #[arg(long, default_value_t = 1.0, value_name = "K")]
    pub(crate) kp: f64,
    /// Control law, integral gain, applied to the share of pushback (experts).
    #[arg(long, default_value_t = 0.2, value_name = "K")]
    pub(crate) ki: f64,
    /// Control law, derivative gain (experts).
    #[arg(long, default_value_t = 0.0, value_name = "K")]
    pub(crate) kd: f64,
    /// How long the API may be unreachable (everything failing) before the run stops with
    /// exit 1, progress durable.
    #[arg(long, default_value = "30m", value_parser = duration, value_name = "DURATION")]
    pub(crate) max_outage: Duration,
    /// Stop the run once more IDs than this failed permanently in it: a count or N%.
    #[arg(long, value_name = "N|N%")]
    pub(crate) max_failures: Option<FailureLimit>,
    /// sled page cache size in MiB.
    #[arg(long, default_value_t = 32, value_name = "MIB")]
    pub(crate) store_cache_mb: u64,
    /// Reopen the sled database after this much written (e.g. 64MiB, 512KiB; at least 1/32
    /// of the store's size), so it writes a snapshot: a restart after a crash then replays at
    /// most about this much of sled's log before the first request. Lower: faster restarts,
    /// more short pauses; 1TiB: never (least memory, but a restart replays everything since
    /// the last start).
    #[arg(long, default_value = "64MiB", value_parser = byte_size, value_name = "SIZE")]
    pub(crate) store_reopen_after: u64,
    /// Serve Prometheus metrics over HTTP on this address during the run, e.g. 127.0.0.1:9184.
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Serve the job's dashboard (the page of `serve`, every panel live: the bucket map and
    /// the failures too) during the run, on this address (127.0.0.1:8080 when none is
    /// given); `serve` of the state directory reaches it while the run lasts.
    #[arg(long, value_name = "ADDR:PORT", num_args = 0..=1, default_missing_value = "127.0.0.1:8080")]
    pub(crate) dashboard: Option<std::net::SocketAddr>,
    /// Accept a changed --url, --method, --body or answer check (--expect, --fail-if,
    /// --retry-if, --extract, --keep-body) for an existing job (recorded in the job's spec
    /// history, shown by `status`).
    #[arg(long)]
    pub(crate) allow_spec_change: bool,
    /// What a 2xx answer must be: json (else a retryable failure of class body), or any
    /// [default: any].
    #[arg(long, value_enum, value_name = "KIND")]
    pub(crate) expect: Option<ExpectArg>,
    /// jq condition over the answer ($status, $headers bound): true fails the ID for good,
    /// class invalid. E.g. '.error != null'. '' removes it.
    #[arg(long, value_name = "EXPR")]
    pub(crate) fail_if: Option<String>,
    /// jq condition over the answer: true retries the attempt with backoff (counted against
    /// --max-attempts and --max-retry-time), class invalid. E.g. '.status == "pending"'.
    #[arg(long, value_name = "EXPR")]
    pub(crate) retry_if: Option<String>,
    /// jq program whose one output is stored as the result instead of the whole body.
    /// E.g. '{name: .data.name, score: .data.score}'. '' removes it.
    #[arg(long, value_name = "EXPR")]
    pub(crate) extract: Option<String>,
    /// With --extract: keep the raw body too (stored as {"extract": ..., "raw": ...}).
    #[arg(long)]
    pub(crate) keep_body: bool,
    /// jq over the whole answer ($status, $headers bound): what the call cost, for an API
    /// metered otherwise than a language model's usage: a number of units, or {input,
    /// output}. E.g. '.meta.credits_used' or '$headers["x-credits"] | tonumber'. '' removes
    /// it.
    #[arg(long, value_name = "EXPR")]
    pub(crate) usage: Option<String>,
    /// jq over the request's body as sent: what a call will cost, for token quotas and the
    /// announced token limits (expected) and a --budget (at the most): a number, or {input,
    /// output}. E.g. '{input: (.messages[0].content | length / 3), output: .max_tokens}'.
    /// '' removes it.
    #[arg(long, value_name = "EXPR")]
    pub(crate) estimate: Option<String>,
}

/// `--oauth2-client-auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ClientAuthArg {
    /// HTTP Basic auth (client_secret_basic).
    Basic,
    /// The client ID and secret in the form body (client_secret_post).
    Post,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ExpectArg {
    /// The body must be one JSON document.
    Json,
    /// Any body (not JSON is stored as a JSON string).
    Any,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("selection").required(true).args(["failed", "buckets", "ids"])))]
pub(crate) struct RerunArgs {
    /// Call again every failed ID of the job.
    #[arg(long)]
    pub(crate) failed: bool,
    /// Call again the failed IDs of these buckets: 10,20,21.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    pub(crate) buckets: Vec<u64>,
    /// With --buckets: call every ID of those buckets, the ones that succeeded too.
    #[arg(long)]
    pub(crate) all_items: bool,
    /// Call again exactly the IDs in FILE (one per line); each must belong to the job.
    #[arg(long, value_name = "FILE")]
    pub(crate) ids: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

#[derive(Debug, Args)]
pub(crate) struct FailuresArgs {
    #[arg(long, value_name = "DIR|URL")]
    pub(crate) state: PathBuf,
    /// With a PostgreSQL --state: the job's name.
    #[arg(long, value_name = "NAME")]
    pub(crate) job: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) format: sink::FailuresFormat,
    /// Only the failures of this bucket.
    #[arg(long, value_name = "N")]
    pub(crate) bucket: Option<u64>,
    /// Only failures of this error class: http, timeout, connect, connection, body, request,
    /// invalid.
    #[arg(long, value_name = "CLASS")]
    pub(crate) class: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum FormatArg {
    Text,
    Csv,
    Jsonl,
    Parquet,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[arg(long, value_name = "DIR|URL")]
    pub(crate) state: PathBuf,
    /// With a PostgreSQL --state: the job's name.
    #[arg(long, value_name = "NAME")]
    pub(crate) job: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Refresh every second until the run ends (Ctrl-C to leave).
    #[arg(long)]
    pub(crate) watch: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    #[arg(long, value_name = "DIR|URL")]
    pub(crate) state: PathBuf,
    /// With a PostgreSQL --state: the job's name.
    #[arg(long, value_name = "NAME")]
    pub(crate) job: Option<String>,
    #[arg(long, value_enum, default_value = "jsonl")]
    pub(crate) format: ExportFormat,
    /// Write here (atomically) instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Only the records with this status.
    #[arg(long, value_enum)]
    pub(crate) status: Option<StatusArg>,
    /// With --format parquet: the top-level fields of object results become typed columns
    /// in place of body.
    #[arg(long)]
    pub(crate) flatten: bool,
    /// With --format parquet: the pages' compression [default: snappy].
    #[arg(long, value_enum)]
    pub(crate) compression: Option<CompressionArg>,
    /// Input columns (kept by the job) to carry beside each result, named as in the input.
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub(crate) columns: Vec<String>,
    /// One row per item of each ID (a paginated ID's items, with their index and page) in
    /// place of one record per ID; an ID without items still has one row.
    #[arg(long)]
    pub(crate) per_item: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CompressionArg {
    Snappy,
    Zstd,
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StatusArg {
    Ok,
    Failed,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Where to put the input and the state (default: a new temporary directory).
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// How many IDs the demo input holds.
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub(crate) ids: u64,
}

pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 500ms, 30s, 5m)"))
}

/// A `--budget`: an amount, or none (`none`). A type of its own: clap reads an
/// `Option<Option<_>>` field as a flag whose value may be left out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BudgetArg(pub(crate) Option<crate::meter::Money>);

/// A `--budget`, or `none` (no budget).
fn budget(s: &str) -> Result<BudgetArg, String> {
    if s.trim() == "none" {
        return Ok(BudgetArg(None));
    }
    let amount: crate::meter::Money = s
        .parse()
        .map_err(|e: crate::meter::MoneyParseError| e.to_string())?;
    if amount.0 == 0 {
        return Err("a budget of 0 allows nothing (`none` removes the budget)".into());
    }
    Ok(BudgetArg(Some(amount)))
}

/// A `--quota`, or `none` (no quota at all).
fn quota(s: &str) -> Result<Option<crate::quota::Quota>, String> {
    if s.trim() == "none" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e: crate::quota::QuotaParseError| e.to_string())
}

/// A size in bytes: a number with an optional unit, B, KiB, MiB, GiB or TiB (K, M, G, T also).
pub(crate) fn byte_size(s: &str) -> Result<u64, String> {
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

pub(crate) fn lease_ttl(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        d if d < Duration::from_secs(2) => Err("must be at least 2s (write e.g. 30s)".into()),
        d => Ok(d),
    }
}

pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        d if d.is_zero() => Err("must be more than 0 (write e.g. 500ms, 1s)".into()),
        d => Ok(d),
    }
}
