//! `pg --only wire`: one worker through a counting TCP proxy ([`super::proxy`]): round trips,
//! statements, bytes and transactions per item.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::proxy::Proxy;
use super::{Bench, JOB};
use crate::child::{worker_args, State};
use crate::numbers::thousands;

/// One worker through a counting proxy: round trips, statements, bytes and transactions
/// per item.
pub(super) fn wire(rt: &tokio::runtime::Runtime, bench: &Bench, out: &mut String) -> Result<()> {
    let n = bench.n;
    let proxy = rt.block_on(Proxy::start(bench.cluster.port()))?;
    // TCP on 127.0.0.1 asks for a password; a throwaway one, given by PGPASSWORD.
    let password = "bench";
    bench.cluster.psql(
        "postgres",
        &format!("ALTER ROLE postgres PASSWORD '{password}'"),
    );
    let db = bench.cluster.create_db();
    let url = format!(
        "postgresql://postgres@127.0.0.1:{}/{}?sslmode=disable&options=-c%20search_path%3D{}",
        proxy.port, db.name, db.schema
    );
    let stats = || -> Result<Vec<u64>> {
        bench
            .cluster
            .psql(
                "postgres",
                &format!(
                    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated \
                     FROM pg_stat_database WHERE datname = '{}'",
                    db.name
                ),
            )
            .split('|')
            .map(|v| v.trim().parse::<u64>().context("pg_stat_database"))
            .collect()
    };
    let before = stats()?;
    let args = worker_args(
        Some(&bench.input),
        &bench.api.url_template(),
        State::Pg {
            url: &url,
            job: JOB,
        },
        bench.c,
    );
    let run = bench.run_once(
        &args,
        &[("PGPASSWORD", password)],
        &bench.tmp.join("wire.log"),
    )?;
    // A backend reports its counts when it ends; the worker's ended with it.
    let mut after = stats()?;
    let wait = Instant::now() + Duration::from_secs(5);
    while after[0] == before[0] && Instant::now() < wait {
        std::thread::sleep(Duration::from_millis(100));
        after = stats()?;
    }
    let d: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let c = &proxy.counts;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let per = |v: u64| v as f64 / n as f64;
    writeln!(out, "\n### database round trips and bytes per item\n")?;
    writeln!(
        out,
        "One worker on a new job over TCP through a counting proxy in this process \
         (`sslmode=disable`): bytes each way, round trips (a client flight after the server \
         spoke, per connection), statements (the protocol's Query and Execute messages); \
         transactions and rows from `pg_stat_database` of the database (its delta over the \
         run, psql's few reads included). {} items/s through the proxy.\n",
        thousands(run.items_per_sec(n) as u64)
    )?;
    writeln!(out, "| per item | value | whole run |")?;
    writeln!(out, "|---|---:|---:|")?;
    for (what, v) in [
        ("round trips", get(&c.round_trips)),
        ("statements", get(&c.statements)),
        ("transactions committed", d[0]),
        ("bytes to the server", get(&c.to_server)),
        ("bytes from the server", get(&c.to_client)),
        ("rows inserted", d[2]),
        ("rows updated", d[3]),
    ] {
        writeln!(out, "| {what} | {:.3} | {} |", per(v), thousands(v))?;
    }
    writeln!(
        out,
        "\n{} connections; {} transactions rolled back.",
        get(&c.connections),
        d[1]
    )?;
    Ok(())
}
