//! The bench's command line: the modes, their options and defaults, parsed into [`Args`].

use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
highwater benchmarks (all traffic goes to 127.0.0.1)

usage:
  cargo bench --bench bench -- <mode> [options]

modes:
  throughput   (default) items/s of a bare hyper client loop vs. a full highwater run
               (sled store, group commit), alternating, in one process, against the
               same in-process fake API (no latency, no faults)
    --ids N           IDs per run [default: 200000]
    --concurrency N   requests in flight [default: 16]
    --repeat K        how many (raw, highwater) pairs to run [default: 3]

  rss          runs the real binary (target/release/highwater, which `cargo bench` builds)
               over a large input: peak RSS, elapsed, items/s,
               state size; then SIGKILLs runs and measures the time a resume takes to
               make its first request (3 times)
    --ids N           IDs in the input [default: 10000000; ~1 GiB of call counters in
                      this process for the fake API at that size]
    --concurrency N   --concurrency of the binary [default: 32]
    --skip-full       only the resume-latency part
    --kill-after N    calls between kills in the resume part [default: IDs/5, at most
                      200000]; e.g. 3000000 with 10M IDs resumes stores holding 3M, 6M, 9M
    --bin PATH        the highwater binary [default: the one cargo built]

  rate         rate accuracy of --rate R at defaults (adaptive on, default burst): for R
               in 5, 50, 300, 2000, 8000, 20000/s one in-process run over 10*R IDs against
               a fresh fast fake API; achieved / R (start-up included) and the most calls
               in any 1 s / 100 ms window vs. 1.01 R + 2 and 0.1 R + max(2, 0.01 R) + 1
    --secs S          seconds each run should take at R (IDs = S*R) [default: 10]
    --rates R,R,...   the rates to measure [default: 5,50,300,2000,8000,20000]
    --concurrency N   items in flight [default: 64]

  capacity     adaptive control against a hidden capacity: the fake API (2 ms latency)
               accepts C/s and answers 429 beyond; C = 1000/s, 400/s, 1000/s, one phase
               each; one run with a 2000/s adaptive ceiling, one fixed at 2000/s; per
               phase goodput, 429 share and time to settle (sampled every 100 ms)
    --phase-secs S    seconds per phase [default: 20]
    --ids N           IDs in the input (enough never to finish) [default: 200000]
    --concurrency N   items in flight [default: 64]
    RUST_LOG=...      also print highwater's log (e.g. highwater=debug: every rate change)

  durability   sync (group commit) and async progress (1 s checkpoints) at bucket sizes
               1, 100 and 1000, one process, one fast fake API, runs interleaved
    --ids N           IDs per run [default: 100000]
    --concurrency N   requests in flight [default: 16]
    --repeat K        rounds of the six runs [default: 2]
    --only MODE:SIZE  run only this one (e.g. async:1), for profiling; no ratio

  latency      the real binary against a slow API: a server in this process answering every
               request after a set delay (holds 10,000 connections and more), beside
               `wrk -c N` on the same server, alternating, --repeat times: items/s against
               wrk's requests/s and the ideal N / latency, peak RSS (needs wrk on PATH)
    --ids N           IDs per run [default: 200000]
    --concurrency N   --concurrency of the binary and wrk's connections [default: 4000]
    --latency-ms L    the server's delay [default: 200]
    --wrk-secs S      seconds of each wrk run [default: 5]
    --repeat K        rounds [default: 3]
    --bin PATH        the highwater binary [default: the one cargo built]
    --before PATH     another highwater binary (a baseline build) run in every round too

  cpu          the real binary against nginx on 127.0.0.1 serving static JSON (one worker,
               keep-alive), beside `wrk -c N` on the same nginx, alternating, --repeat
               times: CPU per item (user + system, whole process, from wait4) and items/s
               against wrk's requests/s (needs nginx and wrk on PATH)
    --ids N           IDs per run [default: 200000]
    --concurrency N   --concurrency of the binary and wrk's connections [default: 64]
    --wrk-secs S      seconds of each wrk run [default: 5]
    --repeat K        rounds [default: 3]
    --bin PATH, --before PATH   as for latency

  client       CPU per request of reqwest clients one setting apart (highwater's at
               aaa7d89, + no_proxy, + no redirects, + http1_only, unlimited idle pool,
               without the whole-request timeout), a bare loop in this process against the
               same nginx, alternating (needs nginx on PATH)
    --ids N           requests per variant and round [default: 100000]
    --concurrency N   tasks [default: 64]
    --repeat K        rounds [default: 3]

  pg           the PostgreSQL store (real binaries, a throwaway cluster started here as in
               the tests, fsync and synchronous_commit on) against the fast fake API in this
               process: one worker vs. one sled run (items/s, ratio), --workers workers on
               one job (items/s together), failover after a kill -9 at each --ttls (time
               until the dead worker's buckets are leased by others), database round trips
               and bytes per item (one worker through a counting TCP proxy), and the tables'
               size per ID after the one-worker job
    --ids N           IDs per job [default: 100000]
    --concurrency N   --concurrency of each binary [default: 16]
    --repeat K        (sled, pg) pairs [default: 3]
    --workers N       workers of the fleet and failover parts [default: 3]
    --ttls S,S,...    --lease-ttl of the failover runs, in seconds [default: 30,3]
    --only P,P,...    run only these parts: one (incl. storage), fleet, failover, wire,
                      capacity (the fleet against a hidden capacity C = 300/s: goodput
                      and 429s with the job's --rate at 2·C and without), near (one
                      worker, then --workers, on the unix socket and through a TCP proxy
                      delaying each way by each --pg-delay-ms: ratios, round trips)
    --pg-delay-ms D,D,...  the near part's one-way delays, in ms [default: 2.5,10]
    --no-fsync        keep the test cluster's settings (fsync, synchronous_commit and
                      full_page_writes off: not durable; shows what the disk costs)
    --statements      load pg_stat_statements and print each `one` run's top statements
                      (time, calls, rows, buffers, WAL) to standard error
    --pg-log FILE     log every statement with its server time (ms) and backend pid, and
                      copy the cluster's log to FILE at the end: with `near`, the round
                      trips that wait on each other show as gaps of twice the delay
    --bin PATH        the highwater binary [default: the one cargo built]
    --before PATH     another highwater binary (a baseline build): a PostgreSQL run of it
                      in every round of the `one` part too, the two in alternating order

  refusals     IDs the API refuses every time: the binary against the fake API (200 after
               20 ms; 2% of IDs 404 and 3% or 10% of IDs 503 on every attempt, at once, with
               and without Retry-After: 1), beside the same job over the input less the
               refused IDs against the API without 503s; ok items/s (until the last ok
               answer) and their ratio, IDs failed with 503, lowest rate limit shown
    --ids N           IDs per run [default: 20000]
    --concurrency N   --concurrency of the binary [default: 16, the CLI's]
    --rate R          also run with --rate R [default: none, the CLI's]
    --repeat K        rounds [default: 1]
    --bin PATH, --before PATH   as for latency

  windows      an API's quota windows: the binary against the fake API (200 after 20 ms;
               50 calls per 2 s and 200 per 10 s, 429 above either) announcing them in
               RateLimit headers, X-RateLimit headers or not at all (then also with the
               windows as --quota flags); goodput against the 20/s allowed, 429 share
    --ids N           IDs per run [default: 400]
    --concurrency N   --concurrency of the binary [default: 16, the CLI's]
    --repeat K        rounds [default: 1]
    --bin PATH, --before PATH   as for latency

  tokens       a language-model API's token and request windows: the binary against the
               fake API's OpenAI-shaped route (20,000 tokens and 60 requests per 10 s, 429
               above either; 200 after 100-300 ms with 20-250 completion tokens) announcing
               them in OpenAI's headers, Anthropic's (its Anthropic-shaped route) or none,
               over a CSV of texts of 50-500 prompt tokens sent by a row template, no other
               flag, started on a window's boundary; token goodput (tokens granted in the
               windows the run spans whole against their 20,000), share of calls refused
    --ids N           rows in the input [default: 200: three whole windows and a part]
    --concurrency N   --concurrency of the binary [default: 16, the CLI's]
    --repeat K        rounds [default: 1]
    --bin PATH, --before PATH   as for latency

  parquet-input  the real binary over a Parquet input (one UTF8 column in row groups of
               100,000 rows, one null ID, written here with the parquet crate) and over the
               same IDs as text: elapsed, peak RSS and VmRSS at each tenth of the calls
    --ids N           rows in the input [default: 1000000]
    --concurrency N   --concurrency of the binary [default: 32]
    --bin PATH        the highwater binary [default: the one cargo built]

  dashboard    does a watching page slow a job? The same job (200 after 1 ms) alone and
               with `highwater serve` on its state directory polled every second for the
               page and each data endpoint; items/s (median) and the ratio
    --ids N           IDs per run [default: 200000]
    --concurrency N   --concurrency of the binary [default: 16, the CLI's]
    --repeat K        rounds, alternating the two cases [default: 3]
    --bin PATH        the highwater binary [default: the one cargo built]

  storage      the state's bytes per ID on realistic answers (company profiles of about
               1.9 KB of nested JSON): whole answers, the fixed cost (--extract keeping one
               number), the state against its own `export --format parquet --compression
               zstd`, CPU per item; a baseline build beside it in every round
    --ids N           IDs per run [default: 200000]
    --concurrency N   --concurrency of the binary [default: 32]
    --repeat K        rounds [default: 1]
    --bin PATH        the highwater binary [default: the one cargo built]
    --before PATH     another highwater binary (a baseline build) run in every round too

  scale        one job of N IDs end to end, the real binary against the fast fake API with
               `--extract .score`, a line per tenth as it goes (to read with `tail`): the
               free disk against what the run needs (refused if short), the planner's speed,
               items/s and VmRSS per tenth, a kill -9 and resume, the state's size per part,
               `status` and a Parquet `export` timed; a Markdown table at the end
    --ids N           IDs in the job [default: 100000000; 10000000 with --store pg]
    --concurrency N   --concurrency of the binary [default: 32]
    --kill-at P       kill -9 once the API has seen P% of the IDs, then resume [default: 90]
    --store S         sled (a state directory) or pg (a throwaway PostgreSQL cluster)
                      [default: sled]
    --bin PATH        the highwater binary [default: the one cargo built]

  --burst N     (rate, capacity) burst of the runs [default: derived from the rate, as
                the CLI]

common:
  --keep      keep the temporary directory (input, state dirs, logs)
  -h, --help  this text
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Throughput,
    Rss,
    Rate,
    Capacity,
    Durability,
    Latency,
    Cpu,
    Client,
    Pg,
    Refusals,
    Windows,
    Tokens,
    ParquetInput,
    Dashboard,
    Storage,
    Scale,
}

/// Where `scale` keeps its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// A state directory.
    Sled,
    /// A job of a throwaway PostgreSQL cluster.
    Pg,
}

impl Mode {
    fn parse(word: &str) -> Option<Mode> {
        Some(match word {
            "throughput" => Mode::Throughput,
            "rss" => Mode::Rss,
            "rate" => Mode::Rate,
            "capacity" => Mode::Capacity,
            "durability" => Mode::Durability,
            "latency" => Mode::Latency,
            "cpu" => Mode::Cpu,
            "client" => Mode::Client,
            "pg" => Mode::Pg,
            "refusals" => Mode::Refusals,
            "windows" => Mode::Windows,
            "tokens" => Mode::Tokens,
            "parquet-input" => Mode::ParquetInput,
            "dashboard" => Mode::Dashboard,
            "storage" => Mode::Storage,
            "scale" => Mode::Scale,
            _ => return None,
        })
    }

    /// (IDs, concurrency, repeat) when not given.
    fn defaults(self) -> (u64, usize, usize) {
        match self {
            Mode::Throughput => (200_000, 16, 3),
            Mode::Durability => (100_000, 16, 2),
            Mode::Rss => (10_000_000, 32, 1),
            Mode::Rate => (0, 64, 1),
            Mode::Capacity => (200_000, 64, 1),
            Mode::Latency => (200_000, 4000, 3),
            Mode::Cpu => (200_000, 64, 3),
            Mode::Client => (100_000, 64, 3),
            Mode::Pg => (100_000, 16, 3),
            Mode::Refusals => (20_000, 16, 1),
            Mode::Windows => (400, 16, 1),
            Mode::Tokens => (200, 16, 1),
            Mode::ParquetInput => (1_000_000, 32, 1),
            Mode::Dashboard => (200_000, 16, 3),
            Mode::Storage => (200_000, 32, 1),
            Mode::Scale => (100_000_000, 32, 1),
        }
    }
}

/// Every option of every mode; a mode reads its own.
#[derive(Debug)]
pub struct Args {
    pub mode: Mode,
    pub ids: u64,
    pub concurrency: usize,
    pub repeat: usize,
    pub keep: bool,
    /// `rss`: only the resume part.
    pub skip_full: bool,
    /// `rss`: calls between kills in the resume part.
    pub kill_after: Option<u64>,
    pub bin: Option<PathBuf>,
    /// `rate`: seconds per run at the target rate.
    pub secs: u64,
    /// `rate`: the rates to measure.
    pub rates: Option<Vec<f64>>,
    /// `rate`, `capacity`: the burst (default: derived from the rate, as the CLI's).
    pub burst: Option<u32>,
    /// `capacity`: seconds per capacity phase.
    pub phase_secs: u64,
    /// `durability`: the one run to make (`MODE:SIZE`); `pg`: the parts to run.
    pub only: Option<String>,
    /// `latency`: the server's delay.
    pub latency: Duration,
    /// `latency`, `cpu`: seconds of each wrk run.
    pub wrk_secs: u64,
    /// `latency`, `cpu`: a baseline binary run beside `bin`.
    pub before: Option<PathBuf>,
    /// `pg`: workers on one job.
    pub workers: usize,
    /// `pg`: the lease TTLs of the failover runs.
    pub ttls: Vec<Duration>,
    /// `pg`: the `near` part's one-way delays of the proxy.
    pub pg_delays: Vec<Duration>,
    /// `pg`: keep the test cluster's settings (fsync, synchronous_commit off).
    pub no_fsync: bool,
    /// `pg`: pg_stat_statements per run of the `one` part, on standard error.
    pub statements: bool,
    /// `pg`: where the cluster's statement log is copied at the end.
    pub pg_log: Option<std::path::PathBuf>,
    /// `refusals`: the job's `--rate`.
    pub job_rate: Option<f64>,
    /// `scale`: the percentage of the IDs called at which the run is killed.
    pub kill_at: u64,
    /// `scale`: where the job lives.
    pub store: Store,
}

pub enum Parsed {
    Run(Box<Args>),
    Help,
}

/// The parts of `pg --only`.
pub const PG_PARTS: [&str; 6] = ["one", "fleet", "failover", "wire", "capacity", "near"];

pub fn parse_args(raw: &[String]) -> Result<Parsed, String> {
    let mut it = raw.iter().peekable();
    let mode = match it.peek().map(|s| s.as_str()) {
        Some(word) if !word.starts_with('-') => {
            let mode = Mode::parse(word).ok_or(format!("unknown mode {word:?}"))?;
            it.next();
            mode
        }
        _ => Mode::Throughput,
    };
    let (ids, concurrency, repeat) = mode.defaults();
    let mut args = Args {
        mode,
        ids,
        concurrency,
        repeat,
        keep: false,
        skip_full: false,
        kill_after: None,
        bin: None,
        secs: 10,
        rates: None,
        burst: None,
        phase_secs: 20,
        only: None,
        latency: Duration::from_millis(200),
        wrk_secs: 5,
        before: None,
        workers: 3,
        ttls: vec![Duration::from_secs(30), Duration::from_secs(3)],
        pg_delays: vec![Duration::from_micros(2500), Duration::from_millis(10)],
        no_fsync: false,
        statements: false,
        pg_log: None,
        job_rate: None,
        kill_at: 90,
        store: Store::Sled,
    };
    let mut ids_given = false;
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().ok_or(format!("{what} needs a value")),
            }
        };
        let number = |what: &str, v: String| -> Result<u64, String> {
            let n = v
                .replace('_', "")
                .parse::<u64>()
                .map_err(|_| format!("{what}: {v:?} is not a number"))?;
            if n == 0 {
                return Err(format!("{what} must be at least 1"));
            }
            Ok(n)
        };
        match name {
            "-h" | "--help" => return Ok(Parsed::Help),
            // `cargo bench` adds it after the arguments given.
            "--bench" => {}
            "--ids" if mode != Mode::Rate => {
                args.ids = number(name, value(name)?)?;
                ids_given = true;
            }
            "--secs" if mode == Mode::Rate => args.secs = number(name, value(name)?)?,
            "--phase-secs" if mode == Mode::Capacity => {
                let s = number(name, value(name)?)?;
                if s < 2 {
                    return Err("--phase-secs must be at least 2".into());
                }
                args.phase_secs = s
            }
            "--concurrency" => args.concurrency = number(name, value(name)?)? as usize,
            "--repeat"
                if matches!(
                    mode,
                    Mode::Throughput
                        | Mode::Durability
                        | Mode::Latency
                        | Mode::Cpu
                        | Mode::Client
                        | Mode::Pg
                        | Mode::Refusals
                        | Mode::Windows
                        | Mode::Tokens
                        | Mode::Storage
                ) =>
            {
                args.repeat = number(name, value(name)?)? as usize
            }
            "--skip-full" if mode == Mode::Rss => args.skip_full = true,
            "--kill-after" if mode == Mode::Rss => {
                args.kill_after = Some(number(name, value(name)?)?)
            }
            "--bin"
                if matches!(
                    mode,
                    Mode::Rss
                        | Mode::Latency
                        | Mode::Cpu
                        | Mode::Pg
                        | Mode::Refusals
                        | Mode::Windows
                        | Mode::Tokens
                        | Mode::ParquetInput
                        | Mode::Dashboard
                        | Mode::Storage
                        | Mode::Scale
                ) =>
            {
                args.bin = Some(PathBuf::from(value(name)?))
            }
            "--before"
                if matches!(
                    mode,
                    Mode::Latency
                        | Mode::Cpu
                        | Mode::Pg
                        | Mode::Refusals
                        | Mode::Windows
                        | Mode::Tokens
                        | Mode::Storage
                ) =>
            {
                args.before = Some(PathBuf::from(value(name)?))
            }
            "--latency-ms" if mode == Mode::Latency => {
                args.latency = Duration::from_millis(number(name, value(name)?)?)
            }
            "--wrk-secs" if matches!(mode, Mode::Latency | Mode::Cpu) => {
                args.wrk_secs = number(name, value(name)?)?
            }
            "--rates" if mode == Mode::Rate => {
                let v = value(name)?;
                let rates = v
                    .split(',')
                    .map(|r| match r.trim().parse::<f64>() {
                        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
                        _ => Err(format!("--rates: {r:?} is not a rate above zero")),
                    })
                    .collect::<Result<Vec<f64>, String>>()?;
                args.rates = Some(rates);
            }
            "--burst" if matches!(mode, Mode::Rate | Mode::Capacity) => {
                let b = number(name, value(name)?)?;
                args.burst =
                    Some(u32::try_from(b).map_err(|_| "--burst is too large".to_string())?);
            }
            "--only" if mode == Mode::Durability => {
                let v = value(name)?;
                let ok = matches!(v.split_once(':'), Some(("sync" | "async", s)) if ["1", "100", "1000"].contains(&s));
                if !ok {
                    return Err(format!(
                        "--only: {v:?} is not MODE:SIZE (sync|async : 1|100|1000)"
                    ));
                }
                args.only = Some(v);
            }
            "--only" if mode == Mode::Pg => {
                let v = value(name)?;
                if let Some(bad) = v.split(',').find(|p| !PG_PARTS.contains(p)) {
                    return Err(format!(
                        "--only: {bad:?} is not one of {}",
                        PG_PARTS.join(", ")
                    ));
                }
                args.only = Some(v);
            }
            "--workers" if mode == Mode::Pg => {
                let w = number(name, value(name)?)?;
                if w < 2 {
                    return Err("--workers must be at least 2 (one is killed)".into());
                }
                args.workers = w as usize;
            }
            "--ttls" if mode == Mode::Pg => {
                let v = value(name)?;
                args.ttls = v
                    .split(',')
                    .map(|s| match s.trim().parse::<u64>() {
                        Ok(s) if s >= 2 => Ok(Duration::from_secs(s)),
                        _ => Err(format!(
                            "--ttls: {s:?} is not a whole number of seconds of at least 2"
                        )),
                    })
                    .collect::<Result<_, String>>()?;
            }
            "--pg-delay-ms" if mode == Mode::Pg => {
                let v = value(name)?;
                args.pg_delays = v
                    .split(',')
                    .map(|s| match s.trim().parse::<f64>() {
                        Ok(ms) if ms.is_finite() && ms > 0.0 && ms <= 1000.0 => {
                            Ok(Duration::from_secs_f64(ms / 1000.0))
                        }
                        _ => Err(format!(
                            "--pg-delay-ms: {s:?} is not a delay above 0 and at most 1000 ms"
                        )),
                    })
                    .collect::<Result<_, String>>()?;
            }
            "--rate" if mode == Mode::Refusals => {
                let v = value(name)?;
                match v.parse::<f64>() {
                    Ok(r) if r.is_finite() && r > 0.0 => args.job_rate = Some(r),
                    _ => return Err(format!("--rate: {v:?} is not a rate above zero")),
                }
            }
            "--kill-at" if mode == Mode::Scale => {
                let p = number(name, value(name)?)?;
                if p >= 100 {
                    return Err("--kill-at must be a percentage from 1 to 99".into());
                }
                args.kill_at = p;
            }
            "--store" if mode == Mode::Scale => {
                args.store = match value(name)?.as_str() {
                    "sled" => Store::Sled,
                    "pg" => Store::Pg,
                    other => return Err(format!("--store: {other:?} is not sled or pg")),
                }
            }
            "--no-fsync" if mode == Mode::Pg => args.no_fsync = true,
            "--statements" if mode == Mode::Pg => args.statements = true,
            "--pg-log" if mode == Mode::Pg => args.pg_log = Some(value(name)?.into()),
            "--keep" => args.keep = true,
            other => return Err(format!("unknown option {other:?} for this mode")),
        }
    }
    if mode == Mode::Scale && args.store == Store::Pg && !ids_given {
        args.ids = 10_000_000;
    }
    if args.concurrency > 100_000 {
        return Err("--concurrency must be at most 100000".into());
    }
    Ok(Parsed::Run(Box::new(args)))
}

impl Args {
    /// Whether `pg` runs `part` (every part unless `--only` names others).
    pub fn pg_part(&self, part: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|only| only.split(',').any(|p| p == part))
    }
}
