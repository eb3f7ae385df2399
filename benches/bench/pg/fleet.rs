//! `pg --only fleet` and `failover`: several workers on one job, the first creating it and
//! the others joining once it calls; for failover, one joining worker killed with SIGKILL
//! mid-run and timed until its buckets are leased by others.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::pg_cluster::TestDb;
use super::{Bench, JOB};
use crate::child::{worker_args, Exit, Proc};
use crate::machine::us_per;
use crate::numbers::thousands;

pub(super) struct FleetRun {
    ttl: Option<Duration>,
    pub(super) elapsed: Duration,
    /// From the first start to the first call, and to the call of the last ID.
    first_call: Duration,
    all_called: Option<Duration>,
    /// Calls per second between 10% and 90% of the IDs.
    pub(super) steady: Option<f64>,
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
pub(super) fn fleet(bench: &Bench, ttl: Option<Duration>) -> Result<FleetRun> {
    fleet_via(bench, ttl, None, bench.workers)
}

/// [`fleet`] of `workers` workers, through the TCP proxy on port `via` if given (else on
/// the unix socket).
pub(super) fn fleet_via(
    bench: &Bench,
    ttl: Option<Duration>,
    via: Option<u16>,
    workers: usize,
) -> Result<FleetRun> {
    let (n, c) = (bench.n, bench.c);
    let db = bench.cluster.create_db();
    let tcp_url = via.map(|port| bench.tcp_url(port, &db));
    let state = match &tcp_url {
        Some(url) => crate::child::State::Pg { url, job: JOB },
        None => Bench::state(&db),
    };
    let env: &[(&str, &str)] = match via {
        Some(_) => &[("PGPASSWORD", super::PASSWORD)],
        None => &[],
    };
    let url = bench.api.url_template();
    let mut extra = Vec::new();
    if let Some(t) = ttl {
        extra = vec!["--lease-ttl".to_string(), format!("{}s", t.as_secs())];
    }
    let label = match (ttl, via) {
        (Some(t), _) => format!("failover-{}s", t.as_secs()),
        (None, Some(port)) => format!("fleet-{workers}-via-{port}"),
        (None, None) => format!("fleet-{workers}"),
    };
    let before = bench.calls();
    let log = |i: usize| bench.tmp.join(format!("{label}-{i}.log"));
    let creator = [
        worker_args(Some(&bench.input), &url, state, c),
        extra.clone(),
    ]
    .concat();
    eprintln!("{label}: {} {}", bench.bin.display(), creator.join(" "));
    let mut procs = vec![Proc::spawn_with_env(&bench.bin, &creator, env, &log(0))?];
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
    let joiner = [worker_args(None, &url, state, c), extra].concat();
    for i in 1..workers {
        procs.push(Proc::spawn_with_env(&bench.bin, &joiner, env, &log(i))?);
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

pub(super) fn report_fleet(
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

pub(super) fn report_failover(bench: &Bench, runs: &[FleetRun], out: &mut String) -> Result<()> {
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
