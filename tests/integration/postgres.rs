//! Many workers, one job: the real binary against a throwaway PostgreSQL cluster
//! (`tests/support/pg_cluster.rs`) and the fake API.

use std::process::Child;
use std::time::{Duration, Instant};

use highwater::demo::api::ApiConfig;
use rand::Rng;

#[path = "../support/pg_cluster.rs"]
mod pg_cluster;

use crate::harness::*;

const JOB: &str = "crash";

/// `export --state URL --job JOB`, parsed.
fn export(h: &Harness, url: &str) -> Vec<serde_json::Value> {
    let out = h.run(&["export", "--state", url, "--job", JOB]);
    out.expect_code(0);
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("export lines are JSON"))
        .collect()
}

/// A worker joining the job (no input).
fn join(h: &Harness, url: &str) -> Child {
    h.spawn(&[
        "run",
        "--state",
        url,
        "--job",
        JOB,
        "--concurrency",
        "8",
        "--lease-ttl",
        "2s",
        "--shutdown-timeout",
        "2s",
        "--progress-interval",
        "0",
    ])
}

/// Wait until `calls` more calls were made, or every worker exited.
fn progress(h: &Harness, workers: &mut [Child], calls: u64) {
    let target = h.api.total_calls() + calls;
    let deadline = Instant::now() + Duration::from_secs(120);
    while h.api.total_calls() < target {
        if workers.iter_mut().all(|w| w.try_wait().unwrap().is_some()) {
            return;
        }
        assert!(Instant::now() < deadline, "no progress in 120 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn three_workers_with_kills_and_a_paused_worker_export_every_id_once() {
    let h = Harness::new(ApiConfig {
        slow_delay: Duration::from_millis(300),
        ..ApiConfig::faulty()
    });
    let db = pg_cluster::fresh_db();
    let url = db.url.clone();
    let ids = ids(6_000);
    let input = h.ids_file("ids.txt", &ids);
    let api = h.url();
    let mut first = h.spawn(&[
        "run",
        "--state",
        &url,
        "--job",
        JOB,
        "--input",
        p(&input),
        "--url",
        &api,
        "--bucket-size",
        "50",
        "--concurrency",
        "8",
        "--lease-ttl",
        "2s",
        "--shutdown-timeout",
        "2s",
        "--progress-interval",
        "0",
    ]);
    assert!(h.wait_for_calls(&mut first, 1), "the first worker calls");
    let mut workers = vec![first, join(&h, &url), join(&h, &url)];
    let mut rng = rand::rng();
    let mut kills = 0;
    for _ in 0..10 {
        progress(&h, &mut workers, 200);
        let i = rng.random_range(0..workers.len());
        if workers[i].try_wait().unwrap().is_none() {
            signal(&workers[i], libc::SIGKILL);
            kills += 1;
        }
        let _ = workers[i].wait();
        workers[i] = join(&h, &url);
    }
    // One worker paused past its TTL: its buckets are taken over, and what it writes when
    // it wakes up is fenced out.
    progress(&h, &mut workers, 200);
    let paused = rng.random_range(0..workers.len());
    signal(&workers[paused], libc::SIGSTOP);
    let pid = workers[paused].id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let expired = format!(
        "SET search_path TO {}; SELECT count(*) FROM hw_worker WHERE pid = {pid} AND expires_at < now()",
        db.schema
    );
    while pg_cluster::shared().psql(&db.name, &expired) != "1" {
        assert!(
            Instant::now() < deadline,
            "the paused worker's session expires"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    progress(&h, &mut workers, 100);
    signal(&workers[paused], libc::SIGCONT);
    let mut runs = Vec::new();
    for w in workers {
        runs.push(finish(w));
    }
    for r in &runs {
        assert!(
            r.code == 0 || r.code == 3,
            "every worker exits by itself with 0 or 3: {r:?}"
        );
    }
    assert!(
        runs[paused].stderr.contains("session expired"),
        "the paused worker found its session expired: {}",
        runs[paused].stderr
    );
    assert!(kills >= 5, "{kills} kills");
    let exported = export(&h, &url);
    h.check_export_exactly_once(&exported, &ids);
}

#[test]
fn a_url_needs_a_job_name_and_a_directory_refuses_one() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(3));
    let state = h.state();
    let api = h.url();
    h.run(&[
        "run",
        "--state",
        "postgres://nobody@127.0.0.1:1/db",
        "--input",
        p(&input),
        "--url",
        &api,
    ])
    .expect_code(2)
    .expect_stderr("--job");
    h.run(&["status", "--state", p(&state), "--job", "j"])
        .expect_code(2)
        .expect_stderr("--job");
    assert!(!state.exists(), "nothing created");
}

#[test]
fn sigterm_drains_a_worker_and_releases_its_buckets_at_once() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(20),
        latency_max: Duration::from_millis(40),
        ..ApiConfig::fast()
    });
    let db = pg_cluster::fresh_db();
    let url = db.url.clone();
    let ids = ids(1_500);
    let input = h.ids_file("ids.txt", &ids);
    let api = h.url();
    let mut worker = h.spawn(&[
        "run",
        "--state",
        &url,
        "--job",
        JOB,
        "--input",
        p(&input),
        "--url",
        &api,
        "--bucket-size",
        "20",
        "--concurrency",
        "4",
        "--lease-ttl",
        "30s",
        "--progress-interval",
        "0",
    ]);
    assert!(h.wait_for_calls(&mut worker, 50), "the worker calls");
    let status = h.run(&["status", "--state", &url, "--job", JOB, "--json"]);
    status.expect_code(0);
    let status: serde_json::Value = serde_json::from_str(status.stdout.trim()).unwrap();
    let workers = status["workers"]
        .as_array()
        .expect("status lists the workers");
    assert_eq!(workers.len(), 1, "{status}");
    assert_eq!(workers[0]["state"], "alive", "{status}");
    assert_eq!(workers[0]["pid"], worker.id(), "{status}");
    let text = h.run(&["status", "--state", &url, "--job", JOB]);
    text.expect_code(0);
    assert!(text.stdout.contains("workers:    1"), "{}", text.stdout);
    signal(&worker, libc::SIGTERM);
    let run = finish(worker);
    run.expect_code(130).expect_stderr(&format!("--job {JOB}"));
    // No TTL to wait for: nothing is leased, the session is gone.
    let query = |sql: &str| {
        pg_cluster::shared().psql(
            &db.name,
            &format!("SET search_path TO {}; {sql}", db.schema),
        )
    };
    assert_eq!(
        query("SELECT count(*) FROM hw_bucket WHERE state = 'leased'"),
        "0"
    );
    assert_eq!(query("SELECT count(*) FROM hw_worker"), "0");
    let status = h.run(&["status", "--state", &url, "--job", JOB, "--json"]);
    status.expect_code(0);
    let status: serde_json::Value = serde_json::from_str(status.stdout.trim()).unwrap();
    assert_eq!(status["finished"], false);
    assert_eq!(status["workers"].as_array().map(Vec::len), Some(0));
    // A joining worker finishes the job.
    let rest = finish(join(&h, &url));
    assert!(rest.code == 0 || rest.code == 3, "{rest:?}");
    h.check_export_exactly_once(&export(&h, &url), &ids);
}

#[test]
fn a_database_restart_mid_run_loses_and_doubles_nothing() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(10),
        ..ApiConfig::fast()
    });
    // A cluster of its own: the shared one serves the other tests.
    let cluster = pg_cluster::PgCluster::start();
    let db = cluster.create_db();
    let url = db.url.clone();
    let ids = ids(3_000);
    let input = h.ids_file("ids.txt", &ids);
    let api = h.url();
    let mut first = h.spawn(&[
        "run",
        "--state",
        &url,
        "--job",
        JOB,
        "--input",
        p(&input),
        "--url",
        &api,
        "--bucket-size",
        "25",
        "--concurrency",
        "8",
        "--lease-ttl",
        "10s",
        "--progress-interval",
        "0",
    ]);
    assert!(h.wait_for_calls(&mut first, 1), "the first worker calls");
    let mut workers = vec![first, join(&h, &url)];
    progress(&h, &mut workers, 800);
    cluster.restart();
    let runs: Vec<Run> = workers.into_iter().map(finish).collect();
    for r in &runs {
        assert!(r.code == 0 || r.code == 3, "{r:?}");
    }
    assert!(
        runs.iter()
            .any(|r| r.stderr.contains("the database is unreachable")),
        "the restart was seen: {runs:?}"
    );
    h.check_export_exactly_once(&export(&h, &url), &ids);
}
