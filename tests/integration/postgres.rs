//! Many workers, one job: the real binary against a throwaway PostgreSQL cluster
//! (`tests/support/pg_cluster.rs`) and the fake API.

use std::process::Child;
use std::time::{Duration, Instant};

use highwater::demo::api::{ApiConfig, Fault};
use highwater::engine::max_unsynced_items_over_network;
use rand::Rng;

use crate::fleet::{finish_within, Fleet};
use crate::harness::*;
use crate::pg_cluster;

const JOB: &str = "crash";

/// The flags of a worker joining the job (no input).
const JOINER: [&str; 8] = [
    "--concurrency",
    "8",
    "--lease-ttl",
    "2s",
    "--shutdown-timeout",
    "2s",
    "--progress-interval",
    "0",
];

/// The job `JOB` in a fresh database; its joining workers get [`JOINER`], its first worker
/// only what each test gives it.
fn fleet(h: &Harness) -> Fleet<'_> {
    Fleet::new(h, JOB).join_flags(&JOINER)
}

/// The calls a clean run makes for `id`: one, plus the failing attempts of a transient fault
/// (a slow answer times out: `--timeout` is below the fake API's `slow_delay`).
fn clean_calls(h: &Harness, id: &str) -> u64 {
    let transient = u64::from(h.api.config().transient_attempts);
    match h.api.fault(id) {
        Fault::None | Fault::NotFound => 1,
        Fault::Unavailable | Fault::Drop | Fault::Slow | Fault::Throttled => transient + 1,
    }
}

/// Each worker of the crash test calls this many IDs at once.
const CRASH_CONCURRENCY: usize = 16;

/// The fleet's crash test: three workers on one job of 20,000 IDs against a flaky API, ten
/// SIGKILLs of random workers (each restarted), one worker paused with SIGSTOP past its TTL
/// (its buckets taken over) then woken: every ID is exported exactly once, only the IDs the
/// API refuses (404) failed, what the paused worker wrote late was fenced out, and the
/// repeated calls stay within what the killed and paused workers can have had in flight or
/// unflushed ([`max_unsynced_items_over_network`] each).
#[test]
fn three_workers_with_kills_and_a_paused_worker_export_every_id_once() {
    let started = Instant::now();
    let h = Harness::new(ApiConfig {
        slow_delay: Duration::from_secs(2),
        ..ApiConfig::faulty()
    });
    let fleet = fleet(&h);
    let ids = ids(20_000);
    let expected_total: u64 = ids.iter().map(|id| clean_calls(&h, id)).sum();
    let input = h.ids_file("ids.txt", &ids);
    let concurrency = CRASH_CONCURRENCY.to_string();
    // Adaptive control on (the default): the flaky API's steady ~9% of transient failures
    // (503s, drops, timeouts) once drove the controller to its 1/s floor within 2 s; the
    // pushback filter now learns that share (seen at a load of 17: 180-910 calls/s, 470/s
    // on average, against 750/s with `--adaptive off`; no full second below 180).
    let worker_flags = ["--concurrency", concurrency.as_str()];
    let mut first = fleet.create(
        &input,
        &[
            "--bucket-size",
            "50",
            "--timeout",
            "500ms",
            "--retry-initial",
            "5ms",
            "--retry-max",
            "50ms",
            "--concurrency",
            &concurrency,
            "--lease-ttl",
            "2s",
            "--shutdown-timeout",
            "2s",
            "--progress-interval",
            "0",
        ],
    );
    assert!(h.wait_for_calls(&mut first, 1), "the first worker calls");
    // Joining workers find the input where the job says it is: any of them plans on when
    // the planner is killed.
    let mut workers = vec![first, fleet.join(&worker_flags), fleet.join(&worker_flags)];
    let mut rng = rand::rng();
    let mut kills = 0;
    while kills < 10 {
        fleet.progress(&mut workers, 800);
        let i = rng.random_range(0..workers.len());
        assert!(
            workers[i].try_wait().unwrap().is_none(),
            "a worker exited after {kills} kills: make the job longer"
        );
        signal(&workers[i], libc::SIGKILL);
        kills += 1;
        let _ = workers[i].wait();
        workers[i] = fleet.join(&worker_flags);
    }
    let killed_at = started.elapsed();
    // One worker paused past its TTL: its session expires and its buckets are taken over;
    // what it writes when it wakes up is fenced out.
    // Paused while it holds a bucket with items to call, so that it has work to lose.
    let mut tries = 0;
    let (paused, pid) = loop {
        tries += 1;
        assert!(
            tries <= 50,
            "no worker held a bucket with pending items in 50 tries"
        );
        fleet.progress(&mut workers, 300);
        let i = rng.random_range(0..workers.len());
        assert!(
            workers[i].try_wait().unwrap().is_none(),
            "a worker exited before the pause: make the job longer"
        );
        signal(&workers[i], libc::SIGSTOP);
        let pid = workers[i].id();
        let pending = fleet.query(&format!(
            "SELECT count(*) FROM hw_item i \
             JOIN hw_bucket b ON b.job_id = i.job_id AND b.rerun = 0 AND b.bucket = i.bucket \
             JOIN hw_worker w ON w.worker_id = b.owner \
             WHERE w.pid = {pid} AND b.state = 'leased' AND i.status = 'pending'"
        ));
        if pending != "0" {
            break (i, pid);
        }
        signal(&workers[i], libc::SIGCONT);
    };
    let stopped_at = started.elapsed();
    fleet.wait_for_sql(
        &format!("SELECT count(*) FROM hw_worker WHERE pid = {pid} AND expires_at < now()"),
        "1",
        30,
        "the paused worker's session expires",
    );
    let expired_at = started.elapsed();
    fleet.wait_for_sql(
        &format!(
            "SELECT count(*) FROM hw_bucket b JOIN hw_worker w ON w.worker_id = b.owner \
             WHERE w.pid = {pid} AND b.state = 'leased'"
        ),
        "0",
        30,
        "the paused worker's buckets are taken over (within the TTL and a few seconds)",
    );
    let paused_at = started.elapsed();
    signal(&workers[paused], libc::SIGCONT);
    let runs = finish_within(workers, 1200);
    for r in &runs {
        assert!(
            r.code == 0 || r.code == 3,
            "every worker exits by itself with 0 or 3: {r:?}"
        );
    }
    let late = &runs[paused].stderr;
    assert!(
        late.contains("session expired"),
        "the paused worker found its session expired: {late}"
    );
    // Whether it still had answers to write when it woke depends on what was in flight at
    // the SIGSTOP and on which of its timers fires first (a call's timeout, or the
    // heartbeat that finds the session expired and abandons the calls): not asserted here.
    // That late results are fenced out is the engine's fleet test
    // `a_worker_that_lost_its_buckets_writes_nothing_that_counts`, on this store too;
    // here, the export below holds every ID exactly once whatever the paused worker did.
    let exported = fleet.export();
    h.check_export_exactly_once(&exported, &ids);
    let status = fleet.status();
    let not_found = ids
        .iter()
        .filter(|id| h.api.fault(id) == Fault::NotFound)
        .count() as u64;
    assert_eq!(status["finished"], true, "{status}");
    assert_eq!(status["stats"]["failed"], not_found, "{status}");
    assert_eq!(
        status["stats"]["ok"],
        ids.len() as u64 - not_found,
        "{status}"
    );
    // Repeated calls: what each killed (or paused) worker had in flight or unflushed.
    let total = h.api.total_calls();
    let bound = ((kills + 1) * max_unsynced_items_over_network(CRASH_CONCURRENCY)) as u64;
    assert!(
        total >= expected_total,
        "fewer calls than a clean run needs: {total} < {expected_total}"
    );
    let repeated = total - expected_total;
    assert!(
        repeated <= bound,
        "{repeated} repeated calls after {kills} kills and a pause; bound {bound}"
    );
    let switches = fleet.query("SELECT sum(owner_switches) FROM hw_bucket");
    eprintln!("calls per second: {:?}", calls_per_second(&h));
    eprintln!(
        "{kills} kills (done at {killed_at:.1?}), a worker paused at {stopped_at:.1?}, \
         expired at {expired_at:.1?}, its buckets taken over and it woken at {paused_at:.1?}, \
         {repeated} repeated calls (bound {bound}), {total} calls, {switches} owner switches, \
         {:.1?} in all",
        started.elapsed()
    );
}

/// The API's calls in each second of the run, from its own arrival times.
fn calls_per_second(h: &Harness) -> Vec<u64> {
    let times = h.api.call_times();
    let mut per_s: Vec<u64> = Vec::new();
    for t in &times {
        let s = (*t - times[0]).as_secs() as usize;
        if per_s.len() <= s {
            per_s.resize(s + 1, 0);
        }
        per_s[s] += 1;
    }
    per_s
}

/// A Parquet input planned into the database: the planner reads it by row group like any
/// input, a worker killed mid-run leaves its buckets to the others, and the null row is one
/// bad row of the job whichever worker planned it.
#[test]
fn a_fleet_runs_a_parquet_input_with_a_null_id() {
    let h = Harness::new(ApiConfig::fast());
    let fleet = fleet(&h);
    let (rows, null_row) = crate::inputs::parquet_rows();
    let input = crate::inputs::parquet_input(&h, "ids.parquet", &rows, 1000);
    let mut first = fleet.create(
        &input,
        &[
            "--id-column",
            "id",
            "--skip-bad-lines",
            "--bucket-size",
            "50",
            "--concurrency",
            "4",
            "--lease-ttl",
            "2s",
            "--progress-interval",
            "0",
        ],
    );
    assert!(h.wait_for_calls(&mut first, 500), "the first worker calls");
    let mut workers = vec![fleet.join(&[]), fleet.join(&[])];
    // The planner dies in the first row group; a joining worker plans on from its cursor.
    first.kill().unwrap();
    first.wait().unwrap();
    workers.push(fleet.join(&[]));
    for run in finish_within(workers, 120) {
        assert_eq!(run.code, 0, "{run:?}");
    }
    let ids: Vec<String> = rows.iter().flatten().cloned().collect();
    h.check_export_exactly_once(&fleet.export(), &ids);
    let status = fleet.status();
    assert_eq!(status["stats"]["bad_lines"], 1, "{status}");
    assert_eq!(status["stats"]["rows_read"], rows.len(), "{status}");
    assert_eq!(status["bad_line_examples"][0]["row"], null_row, "{status}");
}

#[test]
fn a_fleet_runs_a_folder_input_and_a_part_added_later_as_a_grown_input() {
    let h = Harness::new(ApiConfig::fast());
    let fleet = fleet(&h);
    let dir = h.path("parts");
    std::fs::create_dir(&dir).unwrap();
    let all = ids(1_600);
    let part = |n: usize, ids: &[String]| {
        let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
        std::fs::write(dir.join(format!("part-{n:05}.txt")), text).unwrap();
    };
    for (n, chunk) in all[..1_200].chunks(400).enumerate() {
        part(n, chunk);
    }
    let first_flags = [
        "--bucket-size",
        "30",
        "--concurrency",
        "4",
        "--lease-ttl",
        "2s",
        "--progress-interval",
        "0",
    ];
    let mut first = fleet.create(&dir, &first_flags);
    assert!(h.wait_for_calls(&mut first, 300), "the first worker calls");
    let mut workers = vec![fleet.join(&[])];
    // The planner dies in the first file; a joining worker plans on from its cursor.
    first.kill().unwrap();
    first.wait().unwrap();
    workers.push(fleet.join(&[]));
    for run in finish_within(workers, 120) {
        assert_eq!(run.code, 0, "{run:?}");
    }
    h.check_export_exactly_once(&fleet.export(), &all[..1_200]);
    // Another part: a run given the folder plans it after the last bucket.
    part(3, &all[1_200..]);
    let calls = h.api.total_calls();
    let run = finish_within(vec![fleet.create(&dir, &first_flags)], 120).remove(0);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        h.api.total_calls() - calls,
        400,
        "only the new part is called"
    );
    h.check_export_exactly_once(&fleet.export(), &all);
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
    let fleet = fleet(&h);
    let ids = ids(1_500);
    let input = h.ids_file("ids.txt", &ids);
    let mut worker = fleet.create(
        &input,
        &[
            "--bucket-size",
            "20",
            "--concurrency",
            "4",
            "--lease-ttl",
            "30s",
            "--progress-interval",
            "0",
        ],
    );
    assert!(h.wait_for_calls(&mut worker, 50), "the worker calls");
    let status = fleet.status();
    let workers = status["workers"]
        .as_array()
        .expect("status lists the workers");
    assert_eq!(workers.len(), 1, "{status}");
    assert_eq!(workers[0]["state"], "alive", "{status}");
    assert_eq!(workers[0]["pid"], worker.id(), "{status}");
    let text = fleet.status_text();
    assert!(text.contains("workers:    1"), "{text}");
    signal(&worker, libc::SIGTERM);
    let run = finish(worker);
    run.expect_code(130).expect_stderr(&format!("--job {JOB}"));
    // No TTL to wait for: nothing is leased, the session is gone.
    assert_eq!(
        fleet.query("SELECT count(*) FROM hw_bucket WHERE state = 'leased'"),
        "0"
    );
    assert_eq!(fleet.query("SELECT count(*) FROM hw_worker"), "0");
    let status = fleet.status();
    assert_eq!(status["finished"], false);
    assert_eq!(status["workers"].as_array().map(Vec::len), Some(0));
    // A joining worker finishes the job.
    let rest = finish(fleet.join(&[]));
    assert!(rest.code == 0 || rest.code == 3, "{rest:?}");
    h.check_export_exactly_once(&fleet.export(), &ids);
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
    let fleet = Fleet::in_cluster(&h, &cluster, JOB).join_flags(&JOINER);
    let ids = ids(3_000);
    let input = h.ids_file("ids.txt", &ids);
    let mut first = fleet.create(
        &input,
        &[
            "--bucket-size",
            "25",
            "--concurrency",
            "8",
            "--lease-ttl",
            "10s",
            "--progress-interval",
            "0",
        ],
    );
    assert!(h.wait_for_calls(&mut first, 1), "the first worker calls");
    let mut workers = vec![first, fleet.join(&[])];
    fleet.progress(&mut workers, 800);
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
    h.check_export_exactly_once(&fleet.export(), &ids);
}

/// The arguments of a fleet worker with `--rate 600` as the job's total.
const FLEET_RATE: [&str; 8] = [
    "--rate",
    "600",
    "--concurrency",
    "16",
    "--lease-ttl",
    "3s",
    "--progress-interval",
    "0",
];

/// Start a fleet of three workers at `--rate 600` (`extra` for each) on a job of a fresh
/// database, the first creating the job; the others join once it calls.
fn fleet_of_three<'h>(h: &'h Harness, ids: &[String], extra: &[&str]) -> (Fleet<'h>, Vec<Child>) {
    let input = h.ids_file("ids.txt", ids);
    let fleet = Fleet::new(h, JOB).flags(&FLEET_RATE).flags(extra);
    let mut workers = vec![fleet.create(&input, &["--bucket-size", "50"])];
    assert!(
        h.wait_for_calls(&mut workers[0], 20),
        "the first worker calls"
    );
    for _ in 0..2 {
        workers.push(fleet.join(&[]));
    }
    (fleet, workers)
}

/// Wait for every worker; each must exit 0.
fn all_exit_0(workers: Vec<Child>) {
    for w in workers {
        let run = finish(w);
        assert_eq!(run.code, 0, "{run:?}");
    }
}

/// The rate shares of the live workers, as `status --json` lists them.
fn live_shares(fleet: &Fleet) -> Vec<f64> {
    fleet.status()["workers"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter(|w| w["state"] == "alive")
                .map(|w| w["rate_share"].as_f64().unwrap_or(0.0))
                .collect()
        })
        .unwrap_or_default()
}

/// `--rate` is the job's total, not each worker's: three workers at `--rate 600` never send
/// more than 600·t + burst together in any window, and still use most of it.
#[test]
fn three_workers_share_one_rate_limit() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(4_000);
    // Without adaptive control: on a loaded machine the controllers take scheduling delays
    // for a latency rise and cut their shares (seen with it: 250-387/s over the middle of
    // the run, 476-498 calls in the best second, no 429; against a 25 ms API, 311-498/s and
    // 497-585). The shares and their use are what this tests.
    let (fleet, mut workers) = fleet_of_three(&h, &ids, &["--adaptive", "off"]);
    // The shares converge to fair: 200 each, all of the 600 in use.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut shares: Vec<f64> = Vec::new();
    while !(shares.len() == 3 && shares.iter().all(|s| (s - 200.0).abs() < 1e-6)) {
        assert!(
            Instant::now() < deadline
                && workers.iter_mut().all(|w| w.try_wait().unwrap().is_none()),
            "the shares did not converge to 200 each while the workers ran: {shares:?}"
        );
        shares = live_shares(&fleet);
        assert!(shares.iter().sum::<f64>() <= 600.0 + 1e-6, "{shares:?}");
    }
    all_exit_0(workers);
    h.check_export_exactly_once(&fleet.export(), &ids);
    assert_eq!(h.api.total_calls(), 4_000);
    // The bound with room for a loaded machine (arrivals bunched by scheduling, a share
    // handed over a heartbeat apart); a rate per worker would send 1800/s.
    for ms in [500u64, 1000, 2000, 5000] {
        let most = h.api.max_calls_in_window(Duration::from_millis(ms));
        let allowed = (600.0 * ms as f64 / 1000.0 * 1.05) as usize + 60;
        assert!(
            most <= allowed,
            "{most} calls in a {ms} ms window; at most {allowed} allowed"
        );
    }
    // Unthrottled (the fake API never pushes back), the fleet uses its whole rate. In its
    // best second (bounded above by 600 + burst: the rate held for a second, not a burst):
    // the aim is 0.95 of 600; 606-607 calls were measured at a load of 10-12 on this
    // 2-core box, 503 at a load of 19, so 0.8 is asserted. Over the middle of the run (20% to
    // 80% of the calls) only very loosely: a loaded machine starves the workers (487-529/s
    // at a load of 10-12, 388/s at 19; 115/s was once seen over a whole run in the full suite).
    let times = h.api.call_times();
    let best = h.api.max_calls_in_window(Duration::from_secs(1));
    let (from, to) = (times[times.len() / 5], times[times.len() * 4 / 5]);
    let middle = (times.len() * 3 / 5) as f64 / (to - from).as_secs_f64();
    eprintln!(
        "fleet rate: {best} calls in its best second, {middle:.0}/s over the middle {:.1} s",
        (to - from).as_secs_f64()
    );
    assert!(best >= 480, "{best} calls in the fleet's best second");
    assert!(middle >= 60.0, "{middle:.0}/s over the middle of the run");
}

/// A `Retry-After` seen by one worker pauses them all: the job's shared `paused_until`,
/// read at every worker's heartbeat (each second here). After each 429 (`Retry-After: 8`)
/// nobody calls from the time the others surely learned it (4 s: a heartbeat interval and
/// room for a loaded machine) until the pause ends.
#[test]
fn a_retry_after_seen_by_one_worker_pauses_the_fleet() {
    let h = Harness::new(ApiConfig {
        throttled_per_mille: 1,
        transient_attempts: 1,
        retry_after_secs: 8,
        seed: 17,
        ..ApiConfig::fast()
    });
    let ids = ids(2_000);
    let throttled: Vec<&String> = ids
        .iter()
        .filter(|id| h.api.fault(id) == Fault::Throttled)
        .collect();
    assert!(!throttled.is_empty(), "the seed throttles some IDs");
    let (fleet, workers) = fleet_of_three(&h, &ids, &[]);
    all_exit_0(workers);
    h.check_export_exactly_once(&fleet.export(), &ids);
    let times = h.api.call_times();
    for id in throttled {
        let first = h.api.calls_per_id_times(id)[0];
        let (from, until) = (
            first + Duration::from_millis(4_000),
            first + Duration::from_millis(7_500),
        );
        let during = times.iter().filter(|t| **t >= from && **t < until).count();
        assert_eq!(
            during, 0,
            "{during} calls 4-7.5 s after {id:?} was answered Retry-After: 8"
        );
    }
}

/// A first run refused for any reason leaves no job in the database: the same command,
/// corrected, creates it as new. A worker joining a job that is not there is told how to
/// create it, and a refused resume keeps the job as it was.
#[test]
fn a_refused_creation_leaves_no_job_in_the_database() {
    let h = Harness::new(ApiConfig::fast());
    // No flags but each attempt's own: what is refused is the point.
    let fleet = Fleet::new(&h, JOB);
    let input = h.ids_file("ids.txt", &ids(20));
    let empty = h.ids_file("empty.txt", &[]);
    let api = h.url();
    let jobs = || fleet.query("SELECT count(*) FROM hw_job");
    let create = |extra: &[&str]| fleet.run("run", extra);
    let unset = format!("{api}?k=${{HW_TEST_NEVER_SET}}");
    for (extra, code, said) in [
        (
            vec!["--input", p(&input), "--url", &unset],
            2,
            "HW_TEST_NEVER_SET",
        ),
        (
            vec!["--input", p(&input), "--url", &api, "--fail-if", ".["],
            2,
            "fail-if",
        ),
        (vec!["--input", p(&input)], 2, "--url"),
        (vec!["--input", p(&empty), "--url", &api], 1, "holds no IDs"),
    ] {
        create(&extra).expect_code(code).expect_stderr(said);
        assert_eq!(jobs(), "0", "no job left after {extra:?}");
    }
    create(&["--input", "/nonexistent/ids.txt", "--url", &api]).expect_code(1);
    assert_eq!(jobs(), "0", "no job left after a missing input");
    // No job, no input: a worker cannot join.
    create(&[])
        .expect_code(2)
        .expect_stderr("create it with --input");
    assert_eq!(jobs(), "0");
    // Created, then a resume that changes the URL refused: the job is kept.
    create(&["--input", p(&input), "--url", &api]).expect_code(0);
    let other = format!("{api}/other");
    create(&["--url", &other])
        .expect_code(1)
        .expect_stderr("--url");
    assert_eq!(jobs(), "1");
    h.check_export_exactly_once(&fleet.export(), &ids(20));
}
