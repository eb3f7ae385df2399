//! `pg`: the PostgreSQL store, the real binary against a throwaway cluster (started as the
//! tests start theirs, `tests/support/pg_cluster.rs`, then made durable: `fsync`,
//! `synchronous_commit` and `full_page_writes` on, as sled's group commit is) and the fast
//! fake API in this process. Parts (`--only`): `one`, one worker against one sled run,
//! alternating, and the tables' size per ID afterwards; `fleet`, several workers on one
//! job; `failover`, the same with one worker killed (SIGKILL) mid-run, timed until its
//! buckets are leased by others; `wire`, one worker through a counting TCP proxy;
//! `capacity`, the fleet against a hidden capacity (its own fake API, [`capacity`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};

use crate::args::Args;
use crate::child::{binary, State};
use crate::external::{run_to_end, BinRun};
use crate::loops::{raw_client, raw_run};
use crate::machine::{machine_facts, Baseline};
use crate::numbers::{mib, thousands};
use crate::scratch::{finish_temp, temp_dir, write_input};

mod capacity;
mod fleet;
mod near;
mod one;
#[path = "../../tests/support/pg_cluster.rs"]
mod pg_cluster;
mod proxy;
mod wire;

pub use pg_cluster::{PgCluster, TestDb};

/// The job's name in every database.
pub const JOB: &str = "bench";

/// The password of the `postgres` role over TCP (127.0.0.1 asks for one): a throwaway one,
/// given to the workers by `PGPASSWORD` (see [`Bench::tcp_url`]).
const PASSWORD: &str = "bench";

/// What every part runs against.
struct Bench {
    bin: PathBuf,
    input: PathBuf,
    tmp: PathBuf,
    cluster: PgCluster,
    api: FakeApi,
    n: u64,
    c: usize,
    workers: usize,
    /// The API's answer, in bytes per ID.
    body: u64,
}

pub fn pg(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let bin = binary(args)?;
    let (n, c) = (args.ids, args.concurrency);
    let (guard, tmp) = temp_dir(args.keep)?;
    let input = tmp.join("ids.txt");
    let input_bytes = write_input(&input, n)?;
    let cluster = start_cluster(!args.no_fsync);
    // For `pg_stat_wal`'s sync time (the `one` part's WAL columns).
    cluster.psql("postgres", "ALTER SYSTEM SET track_wal_io_timing = on");
    if args.pg_log.is_some() {
        cluster.psql("postgres", "ALTER SYSTEM SET log_statement = 'all'");
        cluster.psql("postgres", "ALTER SYSTEM SET log_connections = on");
        cluster.psql("postgres", "ALTER SYSTEM SET log_line_prefix = '%m [%p] '");
    }
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    if args.statements {
        cluster.psql(
            "postgres",
            "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'",
        );
        cluster.restart();
        cluster.psql(
            pg_cluster::TEST_DATABASE,
            "CREATE EXTENSION pg_stat_statements",
        );
    }
    let settings = cluster.psql(
        "postgres",
        "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings \
         WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', \
         'server_version')",
    );
    let api = rt
        .block_on(FakeApi::start(ApiConfig::fast()))
        .context("starting the fake API")?;
    // Untimed: every run meets a server that has seen every ID once.
    let (_, body_bytes) = rt.block_on(raw_run(&raw_client(c), &api, n, c))?;
    let bench = Bench {
        bin,
        input,
        tmp: tmp.clone(),
        cluster,
        api,
        n,
        c,
        workers: args.workers,
        body: body_bytes / n.max(1),
    };
    eprintln!(
        "{} IDs ({}), fake API on {}, {settings}",
        thousands(n),
        mib(input_bytes),
        bench.api.url_template()
    );

    let mut out = String::new();
    writeln!(out, "\n## highwater on PostgreSQL (real binaries)\n")?;
    writeln!(out, "- command: `{command}`")?;
    let mut body = String::new();
    let mut failed = Vec::new();
    if args.pg_part("one") {
        one::one_vs_sled(&bench, args, &mut body, &mut failed)?;
    }
    if args.pg_part("fleet") {
        let run = fleet::fleet(&bench, None)?;
        fleet::report_fleet(&bench, &run, &mut body, &mut failed)?;
    }
    if args.pg_part("failover") {
        let mut runs = Vec::new();
        for ttl in &args.ttls {
            runs.push(fleet::fleet(&bench, Some(*ttl))?);
        }
        fleet::report_failover(&bench, &runs, &mut body)?;
    }
    if args.pg_part("wire") {
        wire::wire(rt, &bench, &mut body)?;
    }
    if args.pg_part("near") {
        near::near(rt, &bench, args, &mut body)?;
    }
    if args.pg_part("capacity") {
        capacity::capacity(rt, &bench, &mut body, &mut failed)?;
    }
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- PostgreSQL: a throwaway cluster on this machine (`tests/support/pg_cluster.rs`), \
         {settings}; workers connect over its unix socket (the `wire` part over TCP)"
    )?;
    writeln!(
        out,
        "- {} distinct IDs per job, `--concurrency {c}` per binary, the fake API \
         (`ApiConfig::fast()`: no latency, no faults) in this process; items/s = IDs / (the \
         first binary's start to the last one's exit)",
        thousands(n)
    )?;
    out.push_str(&body);
    print!("{out}");
    if let Some(to) = &args.pg_log {
        std::fs::copy(bench.cluster.log(), to)
            .with_context(|| format!("copying the cluster's log to {}", to.display()))?;
    }
    drop(bench);
    finish_temp(guard, &tmp);
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// A throwaway cluster (`tests/support/pg_cluster.rs`), made `durable` (`fsync`,
/// `synchronous_commit` and `full_page_writes` on, as sled's group commit is) or left with
/// the tests' settings (all three off).
pub fn start_cluster(durable: bool) -> PgCluster {
    eprintln!("starting a throwaway PostgreSQL cluster");
    let cluster = PgCluster::start();
    if durable {
        for setting in ["fsync", "synchronous_commit", "full_page_writes"] {
            cluster.psql("postgres", &format!("ALTER SYSTEM SET {setting} = on"));
        }
        cluster.psql("postgres", "SELECT pg_reload_conf()");
    }
    cluster
}

/// One table of a job's schema: its name, `pg_total_relation_size` (table, indexes and
/// TOAST) and `pg_relation_size` (the table alone), in bytes.
pub struct TableSize {
    pub name: String,
    pub total: u64,
    pub table: u64,
}

/// The tables of `db`'s schema (one job's), largest first.
pub fn table_sizes(cluster: &PgCluster, db: &TestDb) -> Vec<TableSize> {
    let query = format!(
        "SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid) \
         FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace \
         WHERE s.nspname = '{}' AND c.relkind = 'r' ORDER BY 2 DESC",
        db.schema
    );
    cluster
        .psql(&db.name, &query)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            Some(TableSize {
                name: f.first()?.to_string(),
                total: f.get(1)?.parse().ok()?,
                table: f.get(2)?.parse().ok()?,
            })
        })
        .collect()
}

impl Bench {
    fn calls(&self) -> u64 {
        self.api.total_calls()
    }

    /// SQL in `db`'s schema, through psql (one statement: psql runs `-c` as one
    /// transaction).
    fn sql(&self, db: &TestDb, sql: &str) -> String {
        let conninfo = format!("dbname={} options='-c search_path={}'", db.name, db.schema);
        self.cluster.psql(&conninfo, sql)
    }

    /// The URL of `db`'s schema over TCP through a proxy on `port` (`sslmode=disable`), its
    /// password ([`PASSWORD`]) set on the server.
    fn tcp_url(&self, port: u16, db: &TestDb) -> String {
        self.cluster.psql(
            "postgres",
            &format!("ALTER ROLE postgres PASSWORD '{PASSWORD}'"),
        );
        format!(
            "postgresql://postgres@127.0.0.1:{port}/{}?sslmode=disable&options=-c%20search_path%3D{}",
            db.name, db.schema
        )
    }

    fn state<'a>(db: &'a TestDb) -> State<'a> {
        State::Pg {
            url: &db.url,
            job: JOB,
        }
    }

    /// A run of the binary with `args` to its end, checked to have called every ID once.
    fn run_once(&self, args: &[String], env: &[(&str, &str)], log: &Path) -> Result<BinRun> {
        self.run_bin(&self.bin, args, env, log)
    }

    /// [`Bench::run_once`] with another binary.
    fn run_bin(
        &self,
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<BinRun> {
        let calls = || self.calls();
        let run = run_to_end(bin, args, env, log, self.n, Some(&calls))?;
        if run.calls != Some(self.n) {
            bail!(
                "{} calls for {} IDs: not one call per ID",
                run.calls.unwrap_or(0),
                self.n
            );
        }
        Ok(run)
    }
}
