//! Speed and memory benchmarks for highwater, against the in-process fake API.
//!
//! ```text
//! cargo bench --bench bench -- throughput [--ids N] [--concurrency N] [--repeat K]
//! cargo bench --bench bench -- rss [--ids N] [--concurrency N] [--skip-full]
//! cargo bench --bench bench -- rate [--secs S] [--concurrency N]
//! cargo bench --bench bench -- capacity [--phase-secs S] [--ids N] [--concurrency N]
//! cargo bench --bench bench -- durability [--ids N] [--concurrency N] [--repeat K]
//! cargo bench --bench bench -- latency [--concurrency N] [--latency-ms L] [--before BIN]
//! cargo bench --bench bench -- cpu [--ids N] [--concurrency N] [--before BIN]
//! cargo bench --bench bench -- client [--ids N] [--concurrency N] [--repeat K]
//! cargo bench --bench bench -- pg [--ids N] [--workers N] [--ttls S,S] [--only PARTS]
//! cargo bench --bench bench -- refusals [--ids N] [--rate R] [--before BIN]
//! cargo bench --bench bench -- windows [--ids N] [--before BIN]
//! cargo bench --bench bench -- tokens [--ids N] [--before BIN]
//! cargo bench --bench bench -- dashboard [--ids N] [--repeat K]
//! cargo bench --bench bench -- storage [--ids N] [--repeat K] [--before BIN]
//! cargo bench --bench bench -- scale [--ids N] [--kill-at P] [--store sled|pg]
//! ```
//!
//! `throughput` compares, in one process and against the same server, a bare hyper client
//! loop (no storage) with a full highwater run (sled store, group commit: one durable sled
//! flush per group of results).
//! `rss` runs the real `highwater` binary as a subprocess over a large input and reports its
//! peak memory, then SIGKILLs runs and measures how long a resume takes to make its first
//! request.
//! `rate` checks that `--rate R` at defaults is what the API sees: achieved rate and the most
//! calls in any 1 s and 100 ms window, at 5, 50, 300, 2000, 8000 and 20,000/s.
//! `capacity` steps a hidden server capacity (1000/s, 400/s, 1000/s) under a run with a
//! 2000/s ceiling, adaptive and fixed: goodput, 429 share and settling time per phase.
//! `durability` runs synchronous and `--async-progress` runs at bucket sizes 1, 100 and
//! 1000 in one process against the same fast fake API: items/s and the ratios to size 1000.
//! `latency` ([`latency`]) runs the binary against a slow API (a server in this process
//! answering after a set delay) beside `wrk` with as many connections: items/s against wrk's
//! and the ideal, peak RSS. `cpu` ([`cpu`]) runs it against nginx serving static JSON beside
//! `wrk`: CPU per item and items/s against wrk's. `client` ([`client`]) measures what each
//! reqwest setting costs per request against the same nginx.
//! `pg` ([`pg`]) runs the binary on the PostgreSQL store (a throwaway cluster): one worker
//! against one sled run, several workers on one job, failover after a kill -9, round trips
//! and bytes per item, storage per ID.
//! `refusals` ([`refusals`]) runs it against an API refusing some IDs every time, beside the
//! same job without them: ok items/s, IDs failed, the rate limit. `windows` ([`windows`])
//! runs it against an API with quota windows, announced in headers or given as `--quota`:
//! goodput against what the windows allow, and 429s. `tokens` ([`tokens`]) runs it against
//! a language-model API limiting tokens and requests per window: token goodput against the
//! limit, and the calls refused. `storage` ([`storage`]) measures the
//! state's bytes per ID on realistic answers against its own zstd Parquet export. `scale`
//! ([`scale`]) runs one job of 100 million IDs (by default) end to end, a line per tenth as
//! it goes: items/s and memory as the store grows, a kill -9 and resume near the end, the
//! state's size, `status` and `export` on the finished job.
//! Everything talks to 127.0.0.1 only. Results end with Markdown tables.
//!
//! `cargo bench` builds the `highwater` binary too (the modes that run it find it there)
//! and passes `--bench` after the arguments (ignored). One file per mode; what the modes
//! share: [`args`] (the command line), [`in_process`] (a job run in this process, through
//! the library's `Job`), [`child`] (the binary as a child process), [`loops`] (bare client
//! loops), [`machine`] (load and CPU time), [`numbers`], [`scratch`] (temp dirs, inputs),
//! [`trace`] (the adaptive controller's rate changes).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use args::{parse_args, Mode, Parsed, USAGE};

// What `client`, `cpu` and `latency` take from here (`super::`).
use args::Args;
use child::{binary, logged_run_args, run_args, Proc};
use loops::reqwest_loop;
use machine::{loadavg, machine_facts, process_cpu, Baseline};
use numbers::{kib_mib, median, thousands};
use scratch::{finish_temp, id_of, temp_dir, write_input};

mod args;
mod capacity;
mod child;
mod client;
mod cpu;
mod dashboard;
mod durability;
mod external;
mod in_process;
mod latency;
mod loops;
mod machine;
mod numbers;
mod parquet_input;
mod pg;
mod rate;
mod refusals;
mod rss;
mod scale;
mod scratch;
mod storage;
mod throughput;
mod tokens;
mod trace;
mod windows;

/// The allocator the `highwater` binary uses (src/main.rs), so in-process runs measure what
/// the binary does; every arm of a comparison runs in this process, on the same allocator.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's start-up options, the binary's (src/main.rs: a thread's cache is
/// garbage-collected after every 1 MiB it allocates).
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: it points at a constant string that lives for the whole program.
unsafe impl Sync for MallocConf {}

// SAFETY: jemalloc reads this symbol (its prefixed `malloc_conf`) as a C string once, at
// its first allocation; nothing else has that name.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: MallocConf = MallocConf(c"tcache_gc_incr_bytes:1048576".as_ptr());

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some(latency::REQWEST_LOOP) {
        return latency::reqwest_loop_child(&raw[1..]);
    }
    let args = match parse_args(&raw) {
        Ok(Parsed::Run(a)) => a,
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n(see --help)");
            return ExitCode::from(2);
        }
    };
    let command = format!(
        "cargo bench --bench bench --{}",
        raw.iter()
            .filter(|a| *a != "--bench")
            .fold(String::new(), |mut s, a| {
                let _ = write!(s, " {}", shell_word(a));
                s
            })
    );
    trace::install_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.mode {
        Mode::Throughput => runtime.block_on(throughput::throughput(&args, &command)),
        Mode::Rss => rss::rss(&runtime, &args, &command),
        Mode::Rate => runtime.block_on(rate::rate_accuracy(&args, &command)),
        Mode::Capacity => runtime.block_on(capacity::capacity(&args, &command)),
        Mode::Durability => runtime.block_on(durability::durability(&args, &command)),
        Mode::Latency => latency::latency(&runtime, &args, &command),
        Mode::Cpu => cpu::cpu(&args, &command),
        Mode::Client => client::client(&runtime, &args, &command),
        Mode::Pg => pg::pg(&runtime, &args, &command),
        Mode::Refusals => refusals::refusals(&runtime, &args, &command),
        Mode::Windows => windows::windows(&runtime, &args, &command),
        Mode::Tokens => tokens::tokens(&runtime, &args, &command),
        Mode::ParquetInput => parquet_input::parquet_input(&runtime, &args, &command),
        Mode::Dashboard => dashboard::dashboard(&runtime, &args, &command),
        Mode::Storage => storage::storage(&runtime, &args, &command),
        Mode::Scale => scale::scale(&runtime, &args, &command),
    };
    // The fake API's tasks live on the runtime; do not wait for them.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `text` as one POSIX shell word, quoted only when it must be (as the console quotes the
/// commands it suggests).
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=./:,@%+".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}
