//! A job of a PostgreSQL database in one chain, as [`crate::scenario`] is for a state
//! directory: the test's own schema (in the shared throwaway cluster, or in a cluster the
//! test started), the job's name and the flags its workers get; then workers of the real
//! binary started against it (the first with the input and the API's URL, the others
//! joining), any command run against it, and its export, status and tables read back.
//!
//! ```ignore
//! let h = Harness::new(ApiConfig::fast());
//! let fleet = Fleet::new(&h, "crash")
//!     .flags(&["--lease-ttl", "2s", "--progress-interval", "0"])
//!     .create_flags(&["--bucket-size", "50"]);
//! let mut first = fleet.create(&input, &[]);
//! assert!(h.wait_for_calls(&mut first, 1));
//! let mut workers = vec![first, fleet.join(&["--concurrency", "4"])];
//! fleet.progress(&mut workers, 800);
//! assert_eq!(fleet.query("SELECT count(*) FROM hw_worker"), "2");
//! finish_within(workers, 120);
//! h.check_export_exactly_once(&fleet.export(), &ids);
//! assert_eq!(fleet.status()["finished"], true);
//! ```

#![allow(dead_code)]

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{finish, p, Harness, Run};
use crate::pg_cluster::{self, PgCluster, TestDb};

/// One job of a fresh test database, and how its workers are started.
pub struct Fleet<'a> {
    h: &'a Harness,
    cluster: &'a PgCluster,
    db: TestDb,
    job: String,
    /// Given to every worker started by [`Fleet::create`] or [`Fleet::join`].
    flags: Vec<String>,
    /// Given, after `flags`, to the workers started with the input ([`Fleet::create`]).
    create_flags: Vec<String>,
    /// Given, after `flags`, to the workers joining without it ([`Fleet::join`]).
    join_flags: Vec<String>,
}

impl<'a> Fleet<'a> {
    /// The job `job` in a fresh schema of the cluster shared by the tests; no flags yet.
    pub fn new(h: &'a Harness, job: &str) -> Fleet<'a> {
        Fleet::in_cluster(h, pg_cluster::shared(), job)
    }

    /// The job `job` in a fresh schema of `cluster` (one the test started, to restart it).
    pub fn in_cluster(h: &'a Harness, cluster: &'a PgCluster, job: &str) -> Fleet<'a> {
        Fleet {
            h,
            cluster,
            db: cluster.create_db(),
            job: job.to_string(),
            flags: Vec::new(),
            create_flags: Vec::new(),
            join_flags: Vec::new(),
        }
    }

    /// Flags every worker gets.
    pub fn flags(mut self, flags: &[&str]) -> Fleet<'a> {
        self.flags.extend(flags.iter().map(|f| f.to_string()));
        self
    }

    /// Flags the workers started with the input get (after [`Fleet::flags`]).
    pub fn create_flags(mut self, flags: &[&str]) -> Fleet<'a> {
        self.create_flags
            .extend(flags.iter().map(|f| f.to_string()));
        self
    }

    /// Flags the joining workers get (after [`Fleet::flags`]).
    pub fn join_flags(mut self, flags: &[&str]) -> Fleet<'a> {
        self.join_flags.extend(flags.iter().map(|f| f.to_string()));
        self
    }

    pub fn harness(&self) -> &'a Harness {
        self.h
    }

    pub fn db(&self) -> &TestDb {
        &self.db
    }

    /// The database's URL, the workers' `--state`.
    pub fn url(&self) -> &str {
        &self.db.url
    }

    pub fn job(&self) -> &str {
        &self.job
    }

    /// `COMMAND --state URL --job JOB`, then `extra`.
    fn args<'s>(&'s self, state: &'s str, command: &'s str, extra: &[&'s str]) -> Vec<&'s str> {
        let mut args = vec![command, "--state", state, "--job", &self.job];
        args.extend_from_slice(extra);
        args
    }

    /// A worker given `input` and the fake API's URL, started: the first creates the job
    /// (and plans it); a later one resumes it with the input. Its flags: `--input` and
    /// `--url`, [`Fleet::flags`], [`Fleet::create_flags`], then `extra`.
    pub fn create(&self, input: &Path, extra: &[&str]) -> Child {
        self.create_through(&self.db.url, input, extra)
    }

    /// [`Fleet::create`], the worker reaching the database by `url` (a proxy in front of it)
    /// instead of the fleet's URL.
    pub fn create_through(&self, url: &str, input: &Path, extra: &[&str]) -> Child {
        let api = self.h.url();
        let mut flags = vec!["--input", p(input), "--url", &api];
        flags.extend(self.flags.iter().map(String::as_str));
        flags.extend(self.create_flags.iter().map(String::as_str));
        flags.extend_from_slice(extra);
        self.h.spawn(&self.args(url, "run", &flags))
    }

    /// A worker joining the job (no input, no URL unless in `extra`), started. Its flags:
    /// [`Fleet::flags`], [`Fleet::join_flags`], then `extra`.
    pub fn join(&self, extra: &[&str]) -> Child {
        let mut flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        flags.extend(self.join_flags.iter().map(String::as_str));
        flags.extend_from_slice(extra);
        self.h.spawn(&self.args(&self.db.url, "run", &flags))
    }

    /// `COMMAND --state URL --job JOB EXTRA` run to its end (`status`, `export`, `rerun`,
    /// `failures`, or a `run` whose flags are the test's point), none of the fleet's flags.
    pub fn run(&self, command: &str, extra: &[&str]) -> Run {
        self.h.run(&self.args(&self.db.url, command, extra))
    }

    /// The JSONL export, parsed.
    pub fn export(&self) -> Vec<Value> {
        self.export_with(&[])
    }

    /// The JSONL export with `extra` (`--status failed`), parsed.
    pub fn export_with(&self, extra: &[&str]) -> Vec<Value> {
        let out = self.run("export", extra);
        out.expect_code(0);
        out.stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("export lines are JSON"))
            .collect()
    }

    /// `status --json`, parsed.
    pub fn status(&self) -> Value {
        let out = self.run("status", &["--json"]);
        out.expect_code(0);
        serde_json::from_str(out.stdout.trim()).expect("status --json is one JSON object")
    }

    /// `status` as text.
    pub fn status_text(&self) -> String {
        let out = self.run("status", &[]);
        out.expect_code(0);
        out.stdout
    }

    /// Run `sql` in the test's schema (as the superuser, through the socket); its output.
    pub fn query(&self, sql: &str) -> String {
        self.cluster.psql(
            &self.db.name,
            &format!("SET search_path TO {}; {sql}", self.db.schema),
        )
    }

    /// Wait until `sql` answers `want` (within `secs`), saying `what` if it never does.
    #[track_caller]
    pub fn wait_for_sql(&self, sql: &str, want: &str, secs: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let got = self.query(sql);
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {sql} gives {got:?}, not {want:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until the fake API saw `calls` more calls, or every one of `workers` exited.
    #[track_caller]
    pub fn progress(&self, workers: &mut [Child], calls: u64) {
        let target = self.h.api.total_calls() + calls;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.h.api.total_calls() < target {
            if workers.iter_mut().all(|w| w.try_wait().unwrap().is_some()) {
                return;
            }
            assert!(Instant::now() < deadline, "no progress in 120 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Wait for every worker to exit by itself within `secs`; if one does not, kill them all and
/// fail with what they logged.
pub fn finish_within(workers: Vec<Child>, secs: u64) -> Vec<Run> {
    let mut workers = workers;
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !workers.iter_mut().all(|w| w.try_wait().unwrap().is_some()) {
        if Instant::now() > deadline {
            for w in &mut workers {
                let _ = w.kill();
            }
            let logs: Vec<String> = workers
                .into_iter()
                .map(|w| {
                    let r = finish(w);
                    let tail: Vec<&str> = r.stderr.lines().rev().take(40).collect();
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                })
                .collect();
            panic!(
                "the workers did not finish in {secs} s; their logs' ends:\n{}",
                logs.join("\n---\n")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    workers.into_iter().map(finish).collect()
}
