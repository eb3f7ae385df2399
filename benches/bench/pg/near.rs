//! `pg --only near`: how much a database some milliseconds away costs. One worker, then
//! `--workers` workers, each run on the unix socket (0.05 ms away) and right after through
//! a TCP proxy ([`super::proxy`]) that delays every chunk by `--pg-delay-ms` each way: items/s
//! of both, their ratio, and the proxy's round trips per bucket and per item.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use anyhow::Result;

use super::fleet::fleet_via;
use super::proxy::{Counts, Proxy};
use super::{Bench, JOB, PASSWORD};
use crate::args::Args;
use crate::child::{worker_args, State};
use crate::numbers::thousands;

/// Rows per bucket of the bench's jobs (the binary's default).
const BUCKET_SIZE: u64 = 1000;

/// One line of the table: a run on the socket and the same through the proxy.
struct Pair {
    delay: Duration,
    workers: usize,
    direct: f64,
    delayed: f64,
    round_trips: u64,
    statements: u64,
    connections: u64,
}

pub(super) fn near(
    rt: &tokio::runtime::Runtime,
    bench: &Bench,
    args: &Args,
    out: &mut String,
) -> Result<()> {
    let n = bench.n;
    let mut pairs = Vec::new();
    for &delay in &args.pg_delays {
        for workers in [1, bench.workers] {
            let direct = rate(bench, None, workers)?;
            let proxy = rt.block_on(Proxy::start_delayed(bench.cluster.port(), delay))?;
            let delayed = rate(bench, Some(proxy.port), workers)?;
            let c: &Counts = &proxy.counts;
            let pair = Pair {
                delay,
                workers,
                direct,
                delayed,
                round_trips: c.round_trips.load(Relaxed),
                statements: c.statements.load(Relaxed),
                connections: c.connections.load(Relaxed),
            };
            eprintln!(
                "near: {:.1} ms each way, {workers} worker(s): {:.0} items/s on the socket, \
                 {:.0} through the proxy ({:.2}); {:.3} round trips per item",
                delay.as_secs_f64() * 1e3,
                direct,
                delayed,
                delayed / direct,
                pair.round_trips as f64 / n as f64
            );
            pairs.push(pair);
        }
    }
    let buckets = n.div_ceil(BUCKET_SIZE) as f64;
    writeln!(out, "\n### a database some milliseconds away\n")?;
    writeln!(
        out,
        "Each line: a new job run to its end on the unix socket, then another through a TCP \
         proxy in this process that forwards every chunk that long after reading it, both \
         ways (`sslmode=disable`); one worker, or {} (`fleet`: the first creates the job, \
         the others join once it calls). Round trips (a client flight after the server \
         spoke, per connection, every connection of every worker) and statements counted \
         by the proxy; {} buckets of {BUCKET_SIZE}.\n",
        bench.workers,
        thousands(buckets as u64)
    )?;
    writeln!(
        out,
        "| one way | workers | socket items/s | proxy items/s | proxy / socket (target ≥ 0.8) | round trips per bucket | per item | statements per item | connections |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for p in &pairs {
        writeln!(
            out,
            "| {:.1} ms | {} | {} | {} | {:.2} | {:.1} | {:.3} | {:.3} | {} |",
            p.delay.as_secs_f64() * 1e3,
            p.workers,
            thousands(p.direct as u64),
            thousands(p.delayed as u64),
            p.delayed / p.direct,
            p.round_trips as f64 / buckets,
            p.round_trips as f64 / n as f64,
            p.statements as f64 / n as f64,
            p.connections
        )?;
    }
    Ok(())
}

/// Items/s of `workers` workers on a new job, through the proxy on `via` or on the socket:
/// IDs over the first start to the last exit.
fn rate(bench: &Bench, via: Option<u16>, workers: usize) -> Result<f64> {
    let n = bench.n as f64;
    if workers > 1 {
        let run = fleet_via(bench, None, via, workers)?;
        return Ok(n / run.elapsed.as_secs_f64());
    }
    let db = bench.cluster.create_db();
    let url = bench.api.url_template();
    let (tcp, env): (Option<String>, Vec<(&str, &str)>) = match via {
        Some(port) => (
            Some(bench.tcp_url(port, &db)),
            vec![("PGPASSWORD", PASSWORD)],
        ),
        None => (None, vec![]),
    };
    let state = match &tcp {
        Some(u) => State::Pg { url: u, job: JOB },
        None => Bench::state(&db),
    };
    let args = worker_args(Some(&bench.input), &url, state, bench.c);
    let label = match via {
        Some(port) => format!("near-1-via-{port}.log"),
        None => "near-1.log".into(),
    };
    let run = bench.run_once(&args, &env, &bench.tmp.join(label))?;
    Ok(run.items_per_sec(bench.n))
}
