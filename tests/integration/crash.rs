//! Crash safety: SIGKILL at random points, resume, and every ID exactly once.

use std::collections::HashSet;
use std::time::Duration;

use highwater::demo::api::{ApiConfig, Fault};
use highwater::engine::max_unsynced_items;

use crate::harness::*;
use crate::scenario::Scenario;

const CONCURRENCY: usize = 16;

/// The calls a clean run makes for `id`: one, plus the failing attempts of a transient fault.
fn clean_calls(h: &Harness, id: &str) -> u64 {
    let transient = h.api.config().transient_attempts as u64;
    match h.api.fault(id) {
        Fault::None | Fault::NotFound => 1,
        Fault::Unavailable | Fault::Drop | Fault::Slow | Fault::Throttled => transient + 1,
    }
}

#[test]
fn sigkill_at_random_points_then_resume_gives_every_id_exactly_once() {
    let mut ids = ids(12_000);
    // A few repeated IDs: processed once, counted as duplicates.
    for i in (0..ids.len()).step_by(997).skip(1) {
        ids[i] = ids[i - 500].clone();
    }
    let unique: HashSet<String> = ids.iter().cloned().collect();
    let duplicates = ids.len() - unique.len();
    let concurrency = CONCURRENCY.to_string();
    let mut s = Scenario::new(ApiConfig {
        slow_delay: Duration::from_secs(2),
        ..ApiConfig::faulty()
    })
    .ids(ids)
    .flags(&[
        "--concurrency",
        &concurrency,
        "--timeout",
        "500ms",
        "--retry-initial",
        "5ms",
        "--retry-max",
        "50ms",
        "--progress-interval",
        "0",
    ])
    .create_flags(&["--bucket-size", "250"])
    // Every other start reopens its store every 32 KiB written (the default is 64 MiB,
    // which this job never reaches): kills then also land during and around reopens.
    .alternate_flags(&["--store-reopen-after", "32KiB"]);
    let h = s.harness();
    let expected_total: u64 = unique.iter().map(|id| clean_calls(h, id)).sum();

    let kills = s.kill_at_random_points(12, 100..1200);
    assert!(
        kills >= 10,
        "only {kills} kills happened before the job finished; make the job longer"
    );

    // Resume to the end.
    s.resume().expect_code(3); // the 404 IDs fail permanently
    let export = s.export_exactly_once();

    let h = s.harness();
    let status = s.status();
    assert_eq!(status["finished"], true);
    assert_eq!(status["stats"]["duplicates"], duplicates as u64);
    let not_found = export
        .iter()
        .filter(|r| h.api.fault(r["id"].as_str().unwrap()) == Fault::NotFound)
        .count();
    assert_eq!(status["stats"]["failed"], not_found as u64);
    assert_eq!(status["stats"]["ok"], (export.len() - not_found) as u64);

    // Repeated calls are bounded by what can be in flight at each kill, not by buckets.
    let total = h.api.total_calls();
    let repeated = total.saturating_sub(expected_total);
    let bound = (kills * max_unsynced_items(CONCURRENCY)) as u64;
    assert!(
        total >= expected_total,
        "fewer calls than a clean run needs: {total} < {expected_total}"
    );
    assert!(
        repeated <= bound,
        "{repeated} repeated calls after {kills} kills; bound {bound}"
    );
    eprintln!("{kills} kills, {repeated} repeated calls (bound {bound}), {total} calls in all");
}

/// A run that reopens its store every few KiB (so sled writes a snapshot each time) finishes
/// with every ID exactly once, and says at debug level that it reopened.
#[test]
fn a_run_that_reopens_its_store_often_keeps_every_result() {
    let h = Harness::new(ApiConfig::faulty());
    // One-row buckets: results and ID lists live outside sled, offset and commit records
    // in it, so these make about 1 MiB of sled writes, a reopen after most plans and
    // group commits.
    let ids = ids(5_000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let run = h.run_env(
        &[
            "run",
            "--input",
            input.to_str().unwrap(),
            "--url",
            &url,
            "--state",
            state.to_str().unwrap(),
            "--bucket-size",
            "1",
            "--retry-initial",
            "5ms",
            "--retry-max",
            "50ms",
            "--progress-interval",
            "0",
            "--store-reopen-after",
            "8KiB",
        ],
        &[("RUST_LOG", "highwater=debug")],
        &[],
    );
    run.expect_code(3);
    let reopens = run
        .stderr
        .lines()
        .filter(|l| l.contains("reopened the database") && l.contains("reopened=true"))
        .count();
    assert!(reopens >= 5, "{reopens} reopens logged:\n{}", run.stderr);
    eprintln!("{reopens} reopens");
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    let status = h.status(&state);
    assert_eq!(status["finished"], true);
}
