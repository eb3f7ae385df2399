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
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};

use crate::args::Args;
use crate::child::{binary, worker_args, Exit, Proc, State};
use crate::external::{run_binary, run_to_end, BinRun};
use crate::loops::{raw_client, raw_run};
use crate::machine::{machine_facts, us_per, Baseline};
use crate::numbers::{median, mib, thousands};
use crate::scratch::{dir_size, finish_temp, temp_dir, write_input};

mod capacity;
#[path = "../../tests/support/pg_cluster.rs"]
mod pg_cluster;
mod proxy;

use pg_cluster::{PgCluster, TestDb};
use proxy::Proxy;

/// The job's name in every database.
const JOB: &str = "bench";

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
    eprintln!("starting a throwaway PostgreSQL cluster");
    let cluster = PgCluster::start();
    if !args.no_fsync {
        for setting in ["fsync", "synchronous_commit", "full_page_writes"] {
            cluster.psql("postgres", &format!("ALTER SYSTEM SET {setting} = on"));
        }
    }
    cluster.psql("postgres", "SELECT pg_reload_conf()");
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
        one_vs_sled(&bench, args, &mut body, &mut failed)?;
    }
    if args.pg_part("fleet") {
        let run = fleet(&bench, None)?;
        report_fleet(&bench, &run, &mut body, &mut failed)?;
    }
    if args.pg_part("failover") {
        let mut runs = Vec::new();
        for ttl in &args.ttls {
            runs.push(fleet(&bench, Some(*ttl))?);
        }
        report_failover(&bench, &runs, &mut body)?;
    }
    if args.pg_part("wire") {
        wire(rt, &bench, &mut body)?;
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
    drop(bench);
    finish_temp(guard, &tmp);
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
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

    fn state<'a>(db: &'a TestDb) -> State<'a> {
        State::Pg {
            url: &db.url,
            job: JOB,
        }
    }

    /// A run of one binary with `args` to its end, checked to have called every ID once.
    fn run_once(&self, args: &[String], env: &[(&str, &str)], log: &Path) -> Result<BinRun> {
        let calls = || self.calls();
        let run = run_to_end(&self.bin, args, env, log, self.n, Some(&calls))?;
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

// ---------------------------------------------------------------------------
// one worker against one sled run; storage per ID

fn one_vs_sled(
    bench: &Bench,
    args: &Args,
    out: &mut String,
    failed: &mut Vec<String>,
) -> Result<()> {
    let (n, c) = (bench.n, bench.c);
    let url = bench.api.url_template();
    let mut rows = Vec::new();
    let mut sled_bytes = 0;
    let mut last_db = None;
    for rep in 1..=args.repeat {
        let state = bench.tmp.join(format!("sled-{rep}"));
        let calls = || bench.calls();
        let sled = run_binary(&bench.bin, &bench.input, &url, &state, c, n, Some(&calls))?;
        if sled.calls != Some(n) {
            failed.push(format!("sled run {rep}: not one call per ID"));
        }
        sled_bytes = dir_size(&state).1;
        if !args.keep {
            let _ = std::fs::remove_dir_all(&state);
        }
        let db = bench.cluster.create_db();
        let pg_args = worker_args(Some(&bench.input), &url, Bench::state(&db), c);
        let pg = bench.run_once(&pg_args, &[], &bench.tmp.join(format!("pg-{rep}.log")))?;
        eprintln!(
            "rep {rep}: sled {:.0} items/s, pg {:.0} items/s ({:.2})",
            sled.items_per_sec(n),
            pg.items_per_sec(n),
            pg.items_per_sec(n) / sled.items_per_sec(n)
        );
        rows.push((sled, pg));
        last_db = Some(db);
    }
    writeln!(out, "\n### one PostgreSQL worker against one sled run\n")?;
    writeln!(
        out,
        "Each round: `highwater run --input FILE --url URL --state DIR` (sled), then the same \
         with `--state postgres://... --job {JOB}` on a fresh schema (a new job), one after \
         the other; CPU is the binary's own (user + system, from wait4; the server's is not \
         in it).\n"
    )?;
    writeln!(
        out,
        "| round | sled items/s | pg items/s | pg / sled (target ≥ 0.5) | steady (10% to 90% of the IDs): sled, pg, ratio | CPU per item: sled, pg |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|")?;
    let (mut s_rates, mut p_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (s, p)) in rows.iter().enumerate() {
        let (sr, pr) = (s.items_per_sec(n), p.items_per_sec(n));
        let (ss, ps) = (s.steady.unwrap_or(0.0), p.steady.unwrap_or(0.0));
        writeln!(
            out,
            "| {} | {} | {} | {:.2} | {} / {} ({:.2}) | {:.1} / {:.1} µs |",
            i + 1,
            thousands(sr as u64),
            thousands(pr as u64),
            pr / sr,
            thousands(ss as u64),
            thousands(ps as u64),
            ps / ss.max(1.0),
            us_per(s.exit.cpu, n),
            us_per(p.exit.cpu, n)
        )?;
        s_rates.push(sr);
        p_rates.push(pr);
        ratios.push(pr / sr);
    }
    writeln!(
        out,
        "| **median** | **{}** | **{}** | **{:.2}** | | |",
        thousands(median(&s_rates) as u64),
        thousands(median(&p_rates) as u64),
        median(&ratios)
    )?;
    if let Some(db) = last_db {
        storage(bench, &db, sled_bytes, out)?;
    }
    Ok(())
}

/// The job's tables in `db` after its run: as left, and after `VACUUM FULL`.
fn storage(bench: &Bench, db: &TestDb, sled_bytes: u64, out: &mut String) -> Result<()> {
    let n = bench.n;
    let query = format!(
        "SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid) \
         FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace \
         WHERE s.nspname = '{}' AND c.relkind = 'r' ORDER BY 2 DESC",
        db.schema
    );
    let sizes = |text: String| -> Vec<(String, u64, u64)> {
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('|').collect();
                Some((
                    f.first()?.to_string(),
                    f.get(1)?.parse().ok()?,
                    f.get(2)?.parse().ok()?,
                ))
            })
            .collect()
    };
    let left = sizes(bench.cluster.psql(&db.name, &query));
    bench.sql(db, "VACUUM FULL");
    let full = sizes(bench.cluster.psql(&db.name, &query));
    writeln!(
        out,
        "\nStorage of the last round's job ({} IDs, each result the API's {}-byte JSON body): \
         `pg_total_relation_size` (table + indexes + TOAST) per table of the job's schema, as \
         the run left it and after `VACUUM FULL`; the sled state dir of the same round beside \
         it.\n",
        thousands(n),
        bench.body
    )?;
    writeln!(
        out,
        "| table | as left | per ID | after VACUUM FULL | per ID |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    let (mut total_left, mut total_full) = (0, 0);
    for (name, total, _) in &left {
        let after = full.iter().find(|(n2, _, _)| n2 == name).map_or(0, |f| f.1);
        total_left += total;
        total_full += after;
        if *total >= 64 * 1024 || after >= 64 * 1024 {
            writeln!(
                out,
                "| {name} | {} | {:.0} B | {} | {:.0} B |",
                mib(*total),
                *total as f64 / n as f64,
                mib(after),
                after as f64 / n as f64
            )?;
        }
    }
    writeln!(
        out,
        "| **all tables** | **{}** | **{:.0} B** | **{}** | **{:.0} B** |",
        mib(total_left),
        total_left as f64 / n as f64,
        mib(total_full),
        total_full as f64 / n as f64
    )?;
    writeln!(
        out,
        "| sled state dir (allocated) | {} | {:.0} B | | |",
        mib(sled_bytes),
        sled_bytes as f64 / n as f64
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------
// several workers on one job; failover

struct FleetRun {
    ttl: Option<Duration>,
    elapsed: Duration,
    /// From the first start to the first call, and to the call of the last ID.
    first_call: Duration,
    all_called: Option<Duration>,
    /// Calls per second between 10% and 90% of the IDs.
    steady: Option<f64>,
    calls: u64,
    exits: Vec<Exit>,
    failover: Option<Failover>,
}

struct Failover {
    /// Buckets the killed worker held.
    buckets: usize,
    /// Its session's time to live left at the kill (database time).
    ttl_left: Duration,
    /// From the kill to the first of its buckets leased by another worker, and to the last.
    first: Duration,
    all: Duration,
}

/// `bench.workers` workers on one new job; with `ttl`, `--lease-ttl` and one joining worker
/// killed with SIGKILL once 30% of the IDs were called.
fn fleet(bench: &Bench, ttl: Option<Duration>) -> Result<FleetRun> {
    let (n, c) = (bench.n, bench.c);
    let db = bench.cluster.create_db();
    let url = bench.api.url_template();
    let mut extra = Vec::new();
    if let Some(t) = ttl {
        extra = vec!["--lease-ttl".to_string(), format!("{}s", t.as_secs())];
    }
    let label = match ttl {
        Some(t) => format!("failover-{}s", t.as_secs()),
        None => "fleet".into(),
    };
    let before = bench.calls();
    let log = |i: usize| bench.tmp.join(format!("{label}-{i}.log"));
    let creator = [
        worker_args(Some(&bench.input), &url, Bench::state(&db), c),
        extra.clone(),
    ]
    .concat();
    eprintln!("{label}: {} {}", bench.bin.display(), creator.join(" "));
    let mut procs = vec![Proc::spawn(&bench.bin, &creator, &log(0))?];
    let t0 = procs[0].started;
    // The others join once the job exists (it does once the first worker calls).
    while bench.calls() == before {
        if let Some(e) = procs[0].reap(false)? {
            bail!(
                "{label}: the first worker ended ({}) before calling",
                e.describe()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let first_call = t0.elapsed();
    let mut all_called = None;
    let joiner = [worker_args(None, &url, Bench::state(&db), c), extra].concat();
    for i in 1..bench.workers {
        procs.push(Proc::spawn(&bench.bin, &joiner, &log(i))?);
    }
    let (mut t10, mut t90) = (None, None);
    let mut failover = None;
    let mut exits: Vec<Option<Exit>> = vec![None; procs.len()];
    loop {
        for (p, e) in procs.iter_mut().zip(exits.iter_mut()) {
            if e.is_none() {
                *e = p.reap(false)?;
            }
        }
        if exits.iter().all(Option::is_some) {
            break;
        }
        let done = bench.calls() - before;
        let now = Instant::now();
        if t10.is_none() && done * 10 >= n {
            t10 = Some((now, done));
        }
        if t90.is_none() && done * 10 >= n * 9 {
            t90 = Some((now, done));
        }
        if all_called.is_none() && done >= n {
            all_called = Some(now - t0);
        }
        if ttl.is_some() && failover.is_none() && done * 10 >= n * 3 && exits[1].is_none() {
            failover = kill_and_time(bench, &db, &mut procs[1], ttl.unwrap_or_default())?;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let exits: Vec<Exit> = exits.into_iter().flatten().collect();
    let last = exits.iter().map(|e| e.at).max().unwrap_or(t0);
    for (i, e) in exits.iter().enumerate() {
        let killed = ttl.is_some() && i == 1;
        if !killed && e.code != Some(0) {
            let text = std::fs::read_to_string(log(i)).unwrap_or_default();
            bail!(
                "{label}: worker {i} ended with {}:\n{}",
                e.describe(),
                text.trim()
            );
        }
    }
    if ttl.is_some() && failover.is_none() {
        bail!("{label}: the job ended before a worker could be killed mid-run (use more --ids)");
    }
    let stored = bench.sql(&db, "SELECT count(*) FROM hw_item WHERE status = 'ok'");
    if stored.trim() != n.to_string() {
        bail!("{label}: {stored} IDs ok in the database, not {n}");
    }
    Ok(FleetRun {
        ttl,
        elapsed: last - t0,
        first_call,
        all_called,
        steady: match (t10, t90) {
            (Some((a, na)), Some((b, nb))) if b > a => {
                Some((nb - na) as f64 / (b - a).as_secs_f64())
            }
            _ => None,
        },
        calls: bench.calls() - before,
        exits,
        failover,
    })
}

/// Kill `victim` (SIGKILL) if it holds buckets, and time until others lease them: None if
/// it holds none at the moment (try again later).
fn kill_and_time(
    bench: &Bench,
    db: &TestDb,
    victim: &mut Proc,
    ttl: Duration,
) -> Result<Option<Failover>> {
    let worker = bench.sql(
        db,
        &format!(
            "SELECT worker_id FROM hw_worker WHERE pid = {} ORDER BY started_at DESC LIMIT 1",
            victim.pid
        ),
    );
    if worker.is_empty() {
        return Ok(None);
    }
    let held = bench.sql(
        db,
        &format!(
            "SELECT string_agg(bucket::text, ',') FROM hw_bucket \
             WHERE owner = '{worker}' AND state = 'leased'"
        ),
    );
    if held.is_empty() {
        return Ok(None);
    }
    let ttl_left: f64 = bench
        .sql(
            db,
            &format!(
                "SELECT extract(epoch FROM expires_at - now()) FROM hw_worker \
                 WHERE worker_id = '{worker}'"
            ),
        )
        .parse()
        .unwrap_or(f64::NAN);
    victim.kill()?;
    let killed = Instant::now();
    let buckets = held.split(',').count();
    eprintln!(
        "  killed worker pid {} holding {buckets} buckets, its session had {ttl_left:.1} s to live",
        victim.pid
    );
    let taken = format!(
        "SELECT count(*) FROM hw_bucket WHERE rerun = 0 AND bucket IN ({held}) \
         AND (state = 'committed' OR (state = 'leased' AND owner <> '{worker}'))"
    );
    let deadline = killed + ttl + Duration::from_secs(120);
    let mut first = None;
    loop {
        let k: usize = bench.sql(db, &taken).parse().unwrap_or(0);
        let at = killed.elapsed();
        if k > 0 && first.is_none() {
            first = Some(at);
        }
        if k == buckets {
            eprintln!(
                "  every one leased elsewhere after {:.2} s",
                at.as_secs_f64()
            );
            return Ok(Some(Failover {
                buckets,
                ttl_left: Duration::from_secs_f64(ttl_left.max(0.0)),
                first: first.unwrap_or(at),
                all: at,
            }));
        }
        if Instant::now() > deadline {
            bail!("the killed worker's buckets were not taken over within its TTL + 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn report_fleet(
    bench: &Bench,
    run: &FleetRun,
    out: &mut String,
    failed: &mut Vec<String>,
) -> Result<()> {
    let n = bench.n;
    if run.calls != n {
        failed.push(format!("fleet: {} calls for {n} IDs", run.calls));
    }
    let cpu: Duration = run.exits.iter().map(|e| e.cpu).sum();
    writeln!(out, "\n### {} workers on one job\n", bench.workers)?;
    writeln!(
        out,
        "The first worker creates the job (`--input`, `--url`); once it calls, {} more join \
         (`run --state postgres://... --job {JOB}`), all on this machine; every one exits 0 \
         by itself.\n",
        bench.workers - 1
    )?;
    writeln!(
        out,
        "| workers | items/s together (first start to last exit) | steady (10% to 90% of the IDs) | first call | last ID called | last exit | calls | CPU per item (all workers) |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    writeln!(
        out,
        "| {} | {} | {} | {:.2} s | {} | {:.2} s | {} | {:.1} µs |",
        bench.workers,
        thousands((n as f64 / run.elapsed.as_secs_f64()) as u64),
        run.steady.map_or("n/a".into(), |s| thousands(s as u64)),
        run.first_call.as_secs_f64(),
        run.all_called
            .map_or("n/a".into(), |t| format!("{:.2} s", t.as_secs_f64())),
        run.elapsed.as_secs_f64(),
        thousands(run.calls),
        us_per(cpu, n)
    )?;
    Ok(())
}

fn report_failover(bench: &Bench, runs: &[FleetRun], out: &mut String) -> Result<()> {
    let n = bench.n;
    writeln!(out, "\n### failover after kill -9\n")?;
    writeln!(
        out,
        "{} workers on a new job with `--lease-ttl T`; once 30% of the IDs were called, a \
         joining worker holding buckets is killed with SIGKILL; then `hw_bucket` is read \
         (psql, every ~10 ms plus psql's start) until every bucket it held is leased by \
         another worker or committed. \"TTL left\" is its session's `expires_at - now()` \
         just before the kill: the takeover cannot come sooner. Repeated calls: calls beyond \
         one per ID, i.e. the killed worker's items in flight and unflushed.\n",
        bench.workers
    )?;
    writeln!(
        out,
        "| --lease-ttl | buckets held | TTL left at the kill | first bucket leased elsewhere | all leased elsewhere | all, after the TTL left | repeated calls | job finished |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for run in runs {
        let Some(f) = &run.failover else { continue };
        writeln!(
            out,
            "| {} s | {} | {:.1} s | {:.2} s | {:.2} s | {:.2} s | {} | {:.1} s after the start |",
            run.ttl.map_or(0, |t| t.as_secs()),
            f.buckets,
            f.ttl_left.as_secs_f64(),
            f.first.as_secs_f64(),
            f.all.as_secs_f64(),
            f.all.as_secs_f64() - f.ttl_left.as_secs_f64(),
            thousands(run.calls.saturating_sub(n)),
            run.elapsed.as_secs_f64()
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// the wire

/// One worker through a counting proxy: round trips, statements, bytes and transactions
/// per item.
fn wire(rt: &tokio::runtime::Runtime, bench: &Bench, out: &mut String) -> Result<()> {
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
