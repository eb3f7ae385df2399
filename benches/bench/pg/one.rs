//! `pg --only one`: one PostgreSQL worker against one sled run, alternating (with `--before`,
//! a baseline binary's PostgreSQL run too), with the database's counts per run
//! ([`DbCounts`]: transactions, WAL, buffers, HOT updates, the server's CPU; with
//! `--statements`, pg_stat_statements' costliest statements), and the tables' size per ID
//! afterwards.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::pg_cluster::{TestDb, TEST_DATABASE};
use super::{table_sizes, Bench, TableSize, JOB};
use crate::args::Args;
use crate::child::worker_args;
use crate::external::{run_binary, BinRun};
use crate::machine::us_per;
use crate::numbers::{median, mib, thousands};
use crate::scratch::dir_size;

/// With `--statements`: the run's costliest statements, one a line (`|` between the fields).
const TOP_STATEMENTS: &str = "SELECT round(total_exec_time::numeric, 0) AS ms, calls, rows, \
     shared_blks_hit + shared_blks_read AS blocks, shared_blks_dirtied, wal_records, wal_bytes, \
     left(regexp_replace(query, '\\s+', ' ', 'g'), 110) \
     FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 12";

pub(super) fn one_vs_sled(
    bench: &Bench,
    args: &Args,
    out: &mut String,
    failed: &mut Vec<String>,
) -> Result<()> {
    let (n, c) = (bench.n, bench.c);
    let url = bench.api.url_template();
    let mut rows = Vec::new();
    let mut sled_bytes = 0;
    // The last job of each binary, for its storage.
    let mut last_dbs: Vec<(&str, TestDb)> = Vec::new();
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
        // With `--before`, both binaries each round, their order swapped every round.
        let mut arms: Vec<(&str, &Path)> = vec![("pg", &bench.bin)];
        if let Some(before) = &args.before {
            arms.push(("pg before", before));
            if rep % 2 == 0 {
                arms.reverse();
            }
        }
        for (label, bin) in arms {
            let db = bench.cluster.create_db();
            let pg_args = worker_args(Some(&bench.input), &url, Bench::state(&db), c);
            if args.statements {
                bench
                    .cluster
                    .psql(TEST_DATABASE, "SELECT pg_stat_statements_reset()");
            }
            let start = bench.db_counts(&db)?;
            let log = bench
                .tmp
                .join(format!("{}-{rep}.log", label.replace(' ', "-")));
            let pg = bench.run_bin(bin, &pg_args, &[], &log)?;
            let counts = bench.db_counts_after(&db, &start)?;
            if args.statements {
                eprintln!(
                    "{label}, round {rep}: {}",
                    bench.cluster.psql(TEST_DATABASE, TOP_STATEMENTS)
                );
            }
            // The dead row versions' cleanup, outside the run (else the next run's server
            // CPU has this run's autovacuum in it).
            let vacuumed = Instant::now();
            bench.sql(&db, "VACUUM hw_item");
            let vacuum = vacuumed.elapsed();
            eprintln!(
                "rep {rep}: sled {:.0} items/s, {label} {:.0} items/s ({:.2}); steady {:.0} / {:.0} \
                 ({:.2}); per 1000 items: {:.1} transactions, {:.1} WAL syncs; WAL sync time \
                 {:.2} s of {:.2} s; CPU per item: binary {:.1} µs, server {:.1} µs; per item: \
                 {:.0} WAL bytes, {:.2} WAL records, {:.3} FPIs, {:.1} buffer accesses; HOT \
                 {:.0}% of {} updates; {} autovacuum/analyze runs; VACUUM after {:.2} s",
                sled.items_per_sec(n),
                pg.items_per_sec(n),
                pg.items_per_sec(n) / sled.items_per_sec(n),
                sled.steady.unwrap_or(0.0),
                pg.steady.unwrap_or(0.0),
                pg.steady.unwrap_or(0.0) / sled.steady.unwrap_or(0.0).max(1.0),
                counts.per_1000(counts.commits, n),
                counts.per_1000(counts.wal_syncs, n),
                counts.wal_sync_secs,
                pg.elapsed.as_secs_f64(),
                us_per(pg.exit.cpu, n),
                counts.server_cpu_secs * 1e6 / n as f64,
                counts.per_item(counts.wal_bytes, n),
                counts.per_item(counts.wal_records, n),
                counts.per_item(counts.wal_fpi, n),
                counts.per_item(counts.blocks, n),
                counts.hot_share() * 100.0,
                counts.item_updates,
                counts.item_autovacuums,
                vacuum.as_secs_f64()
            );
            rows.push((label, sled.clone(), pg, counts, vacuum));
            last_dbs.retain(|(l, _)| *l != label);
            last_dbs.push((label, db));
        }
    }
    writeln!(out, "\n### one PostgreSQL worker against one sled run\n")?;
    writeln!(
        out,
        "Each round: `highwater run --input FILE --url URL --state DIR` (sled), then the same \
         with `--state postgres://... --job {JOB}` on a fresh schema (a new job), one after \
         the other (with `--before`, the baseline binary too, the two PostgreSQL runs' order \
         swapped every round); CPU is the binary's own (user + system, from wait4; the \
         server's is not in it); transactions committed (`pg_stat_database`) and WAL syncs \
         and their time (`pg_stat_wal`, `track_wal_io_timing` on) are the run's deltas.\n"
    )?;
    writeln!(
        out,
        "| round | binary | sled items/s | pg items/s | pg / sled (target ≥ 0.5) | steady (10% to 90% of the IDs): sled, pg, ratio | CPU per item: sled, pg, pg's server | pg per 1000 items: transactions, WAL syncs | pg: WAL sync time / run |"
    )?;
    writeln!(out, "|---:|---|---:|---:|---:|---:|---:|---:|---:|")?;
    let (mut s_rates, mut p_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut before_ratios = Vec::new();
    for (i, (label, s, p, d, _)) in rows.iter().enumerate() {
        let (sr, pr) = (s.items_per_sec(n), p.items_per_sec(n));
        let (ss, ps) = (s.steady.unwrap_or(0.0), p.steady.unwrap_or(0.0));
        writeln!(
            out,
            "| {} | {label} | {} | {} | {:.2} | {} / {} ({:.2}) | {:.1} / {:.1} / {:.1} µs | {:.1}, {:.1} | {:.2} / {:.2} s |",
            i + 1,
            thousands(sr as u64),
            thousands(pr as u64),
            pr / sr,
            thousands(ss as u64),
            thousands(ps as u64),
            ps / ss.max(1.0),
            us_per(s.exit.cpu, n),
            us_per(p.exit.cpu, n),
            d.server_cpu_secs * 1e6 / n as f64,
            d.per_1000(d.commits, n),
            d.per_1000(d.wal_syncs, n),
            d.wal_sync_secs,
            p.elapsed.as_secs_f64()
        )?;
        if *label != "pg" {
            before_ratios.push(pr / sr);
            continue;
        }
        s_rates.push(sr);
        p_rates.push(pr);
        ratios.push(pr / sr);
    }
    if !before_ratios.is_empty() {
        writeln!(
            out,
            "| **median** | pg before | | | **{:.2}** | | | | |",
            median(&before_ratios)
        )?;
    }
    writeln!(
        out,
        "| **median** | pg | **{}** | **{}** | **{:.2}** | | | | |",
        thousands(median(&s_rates) as u64),
        thousands(median(&p_rates) as u64),
        median(&ratios)
    )?;
    server_work(n, &rows, out)?;
    for (label, db) in &last_dbs {
        storage(bench, label, db, sled_bytes, out)?;
    }
    Ok(())
}

/// The server's work per item of each PostgreSQL run of [`one_vs_sled`]: counts that do not
/// depend on the machine's load.
fn server_work(
    n: u64,
    rows: &[(&str, BinRun, BinRun, DbCounts, Duration)],
    out: &mut String,
) -> Result<()> {
    writeln!(
        out,
        "\nThe server's work per item of the same runs: WAL (`pg_stat_wal`: bytes, records, \
         full page images), shared buffer accesses (`pg_stat_database`: hit + read), the \
         share of the job's `hw_item` updates that were HOT (`pg_stat_user_tables`: no index \
         entry written), autovacuum and autoanalyze runs on it during the run, and the time \
         of a `VACUUM hw_item` right after it (not in the run).\n"
    )?;
    writeln!(
        out,
        "| round | binary | server CPU per item | WAL bytes | WAL records | FPIs | buffer accesses | HOT updates | autovacuum/analyze | VACUUM after |"
    )?;
    writeln!(out, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for (i, (label, _, _, d, vacuum)) in rows.iter().enumerate() {
        writeln!(
            out,
            "| {} | {label} | {:.1} µs | {:.0} | {:.2} | {:.3} | {:.1} | {:.0}% of {} | {} | {:.2} s |",
            i + 1,
            d.server_cpu_secs * 1e6 / n as f64,
            d.per_item(d.wal_bytes, n),
            d.per_item(d.wal_records, n),
            d.per_item(d.wal_fpi, n),
            d.per_item(d.blocks, n),
            d.hot_share() * 100.0,
            thousands(d.item_updates),
            d.item_autovacuums,
            vacuum.as_secs_f64()
        )?;
    }
    Ok(())
}

/// The job's tables in `db` after its run: as left, and after `VACUUM FULL`.
fn storage(
    bench: &Bench,
    label: &str,
    db: &TestDb,
    sled_bytes: u64,
    out: &mut String,
) -> Result<()> {
    let n = bench.n;
    let left = table_sizes(&bench.cluster, db);
    // This job's tables only: the other jobs' schemas share the database.
    let tables: Vec<&str> = left.iter().map(|t| t.name.as_str()).collect();
    bench.sql(db, &format!("VACUUM FULL {}", tables.join(", ")));
    let full = table_sizes(&bench.cluster, db);
    writeln!(
        out,
        "\nStorage of the last round's job of `{label}` ({} IDs, each result the API's {}-byte \
         JSON body): `pg_total_relation_size` (table + indexes + TOAST) per table of the job's \
         schema, as the run left it (then `VACUUM hw_item`) and after `VACUUM FULL`; the sled \
         state dir of the same round beside it.\n",
        thousands(n),
        bench.body
    )?;
    writeln!(
        out,
        "| table | as left | per ID | after VACUUM FULL | per ID |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    let (mut total_left, mut total_full) = (0, 0);
    for TableSize { name, total, .. } in &left {
        let after = full.iter().find(|f| f.name == *name).map_or(0, |f| f.total);
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

/// The database's committed transactions, the cluster's WAL, the job's item table and the
/// server's CPU, as counted so far.
#[derive(Debug, Clone, Copy, Default)]
struct DbCounts {
    commits: u64,
    wal_syncs: u64,
    wal_sync_secs: f64,
    /// `pg_stat_wal`: records, full page images, bytes.
    wal_records: u64,
    wal_fpi: u64,
    wal_bytes: u64,
    /// `pg_stat_database`: shared buffers found (hit) and read in.
    blocks: u64,
    /// `pg_stat_user_tables` of the job's `hw_item`: rows updated, of them HOT (no index
    /// touched), and autovacuum and autoanalyze runs.
    item_updates: u64,
    item_hot_updates: u64,
    item_autovacuums: u64,
    /// CPU of the server's processes (user + system): the postmaster's children, the ended
    /// ones included (reaped: in its `cutime`).
    server_cpu_secs: f64,
}

impl DbCounts {
    fn per_1000(&self, count: u64, n: u64) -> f64 {
        count as f64 * 1000.0 / n.max(1) as f64
    }

    fn per_item(&self, count: u64, n: u64) -> f64 {
        count as f64 / n.max(1) as f64
    }

    /// The share of the item table's updates that were HOT.
    fn hot_share(&self) -> f64 {
        self.item_hot_updates as f64 / self.item_updates.max(1) as f64
    }

    /// What was counted from `before` to `self`.
    fn since(&self, before: &DbCounts) -> DbCounts {
        DbCounts {
            commits: self.commits - before.commits,
            wal_syncs: self.wal_syncs - before.wal_syncs,
            wal_sync_secs: self.wal_sync_secs - before.wal_sync_secs,
            wal_records: self.wal_records - before.wal_records,
            wal_fpi: self.wal_fpi - before.wal_fpi,
            wal_bytes: self.wal_bytes - before.wal_bytes,
            blocks: self.blocks - before.blocks,
            item_updates: self.item_updates - before.item_updates,
            item_hot_updates: self.item_hot_updates - before.item_hot_updates,
            item_autovacuums: self.item_autovacuums - before.item_autovacuums,
            server_cpu_secs: self.server_cpu_secs - before.server_cpu_secs,
        }
    }
}

impl Bench {
    fn db_counts(&self, db: &TestDb) -> Result<DbCounts> {
        let text = self.cluster.psql(
            "postgres",
            &format!(
                "SELECT d.xact_commit, w.wal_sync, w.wal_sync_time / 1000, w.wal_records, \
                 w.wal_fpi, w.wal_bytes, d.blks_hit + d.blks_read \
                 FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = '{}'",
                db.name
            ),
        );
        let f: Vec<&str> = text.split('|').map(str::trim).collect();
        let [commits, syncs, secs, records, fpi, bytes, blocks] = f[..] else {
            bail!("pg_stat_database, pg_stat_wal: {text:?}");
        };
        // Before the run the job's schema has no tables yet: zeros.
        let text = self.sql(
            db,
            "SELECT n_tup_upd, n_tup_hot_upd, autovacuum_count + autoanalyze_count \
             FROM pg_stat_user_tables WHERE relname = 'hw_item' \
             AND schemaname = current_schema()",
        );
        let t: Vec<u64> = text
            .split('|')
            .map(|v| v.trim().parse().unwrap_or(0))
            .collect();
        let table = |i: usize| t.get(i).copied().unwrap_or(0);
        Ok(DbCounts {
            commits: commits.parse().context("xact_commit")?,
            wal_syncs: syncs.parse().context("wal_sync")?,
            wal_sync_secs: secs.parse().context("wal_sync_time")?,
            wal_records: records.parse().context("wal_records")?,
            wal_fpi: fpi.parse().context("wal_fpi")?,
            wal_bytes: bytes.parse().context("wal_bytes")?,
            blocks: blocks.parse().context("blks_hit")?,
            item_updates: table(0),
            item_hot_updates: table(1),
            item_autovacuums: table(2),
            server_cpu_secs: self.server_cpu()?,
        })
    }

    /// The server's CPU so far, in seconds, from /proc: the postmaster's own and its reaped
    /// children's, plus its live children's.
    fn server_cpu(&self) -> Result<f64> {
        let pid = self
            .cluster
            .psql(
                "postgres",
                "SELECT split_part(pg_read_file('postmaster.pid'), E'\\n', 1)",
            )
            .parse::<u32>()
            .context("the postmaster's pid")?;
        let mut ticks = 0u64;
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Some(this) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // After the command's ")": state, ppid, ..., utime (12th), stime, cutime, cstime.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let f: Vec<u64> = rest
                .split_whitespace()
                .skip(1)
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            if f.len() < 15 {
                continue;
            }
            if this == pid || f[0] == u64::from(pid) {
                ticks += f[10] + f[11] + f[12] + f[13];
            }
        }
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Ok(ticks as f64 / hz)
    }

    /// What a run that counted from `before` added, once its backends (which report their
    /// counts as they end) are gone: psql's few reads included.
    fn db_counts_after(&self, db: &TestDb, before: &DbCounts) -> Result<DbCounts> {
        let wait = Instant::now() + Duration::from_secs(5);
        let mut after = self.db_counts(db)?;
        while after.commits == before.commits && Instant::now() < wait {
            std::thread::sleep(Duration::from_millis(100));
            after = self.db_counts(db)?;
        }
        Ok(after.since(before))
    }
}
