//! Throughput control: the rate limit, Retry-After, retries, outages and failure storms,
//! counted by the server.

use std::time::Duration;

use highwater::demo::api::{ApiConfig, Fault};

use crate::harness::*;

fn fast_with_latency(ms: u64) -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(ms),
        latency_max: Duration::from_millis(ms),
        ..ApiConfig::fast()
    }
}

/// Start a new job over `ids` in the background, with the harness's quick retries.
fn start_new_job(
    h: &Harness,
    ids: &[String],
    extra: &[&str],
) -> (std::path::PathBuf, std::process::Child) {
    let input = h.ids_file("ids.txt", ids);
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend_from_slice(extra);
    let child = h.spawn(&args);
    (state, child)
}

#[test]
fn the_rate_limit_holds_in_every_window() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(400);
    for adaptive in ["off", "on"] {
        let state = h.path(&format!("state-{adaptive}"));
        let input = h.ids_file("ids.txt", &ids);
        let before = h.api.total_calls();
        h.run_new(
            &state,
            &input,
            &h.url(),
            &[
                "--rate",
                "100/s",
                "--adaptive",
                adaptive,
                "--concurrency",
                "32",
            ],
        )
        .expect_code(0);
        assert_eq!(h.api.total_calls() - before, 400);
    }
    // 800 calls at 100/s: in any window of t seconds at most 100*t + burst (1), plus one for
    // the granularity of the server's clock.
    for ms in [100u64, 500, 1000, 2000] {
        let window = Duration::from_millis(ms);
        let most = h.api.max_calls_in_window(window);
        let allowed = (100 * ms / 1000) as usize + 1 + 1;
        assert!(
            most <= allowed,
            "{most} calls in a {ms} ms window; at most {allowed} allowed"
        );
    }
}

#[test]
fn retry_after_is_honoured() {
    let h = Harness::new(ApiConfig {
        throttled_per_mille: 1000,
        retry_after_secs: 1,
        transient_attempts: 1,
        ..ApiConfig::fast()
    });
    let ids = ids(20);
    let (_, state) = h.finished_job(&ids, &[]);
    for id in &ids {
        let times = h.api.calls_per_id_times(id);
        assert_eq!(times.len(), 2, "{id}: one 429, then the success");
        let waited = times[1] - times[0];
        assert!(
            waited >= Duration::from_millis(990),
            "{id} was retried after {waited:?}, before Retry-After: 1"
        );
    }
    let export = h.export(&state);
    assert!(export.iter().all(|r| r["status"] == "ok"));
    assert!(
        export
            .iter()
            .all(|r| r["attempt_errors"][0]["http_status"] == 429),
        "the 429 is in each item's history"
    );
}

#[test]
fn server_errors_are_retried_up_to_the_limit_and_not_found_is_not_retried() {
    let h = Harness::new(ApiConfig {
        // Few enough that twenty 503s in a row (an outage) do not happen by chance.
        not_found_per_mille: 100,
        unavailable_per_mille: 40,
        transient_attempts: 1000,
        ..ApiConfig::fast()
    });
    let ids = ids(600);
    let (_, state) = h.finished_job(&ids, &["--max-attempts", "3"]);
    let export = h.export(&state);
    for r in &export {
        let id = r["id"].as_str().unwrap();
        match h.api.fault(id) {
            Fault::NotFound => {
                assert_eq!(h.api.calls(id), 1, "404 is not retried: {r}");
                assert_eq!(r["attempts"], 1);
            }
            Fault::Unavailable => {
                assert_eq!(
                    h.api.calls(id),
                    3,
                    "503 is retried up to --max-attempts: {r}"
                );
                assert_eq!(
                    (r["status"].as_str(), r["http_status"].as_u64()),
                    (Some("failed"), Some(503))
                );
                assert_eq!(r["attempt_errors"].as_array().unwrap().len(), 3);
            }
            _ => assert_eq!(r["status"], "ok"),
        }
    }
}

#[test]
fn a_two_minute_outage_fails_no_item_and_the_run_completes() {
    let h = Harness::new(fast_with_latency(1));
    let ids = ids(3000);
    let (state, mut child) = start_new_job(
        &h,
        &ids,
        &[
            "--rate",
            "150/s",
            "--concurrency",
            "8",
            "--max-attempts",
            "3",
            "--timeout",
            "1s",
        ],
    );
    assert!(
        h.wait_for_calls(&mut child, 400),
        "the run ended before the outage"
    );
    h.block_on(h.api.set_down(true));
    let down_at = h.api.total_calls();
    std::thread::sleep(Duration::from_secs(120));
    h.block_on(h.api.set_down(false));
    let run = finish(child);
    run.expect_code(0)
        .expect_stderr("looks down")
        .expect_stderr("answers again");
    assert!(down_at < 3000);
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    assert!(
        export.iter().all(|r| r["status"] == "ok"),
        "no item failed because of the outage"
    );
}

#[test]
fn an_outage_longer_than_max_outage_stops_cleanly_and_resumes() {
    let h = Harness::new(fast_with_latency(1));
    let ids = ids(2000);
    let (state, mut child) = start_new_job(
        &h,
        &ids,
        &[
            "--rate",
            "200/s",
            "--concurrency",
            "8",
            "--max-outage",
            "3s",
        ],
    );
    assert!(h.wait_for_calls(&mut child, 300));
    h.block_on(h.api.set_down(true));
    let run = finish(child);
    run.expect_code(1)
        .expect_stderr("unreachable")
        .expect_stderr("resume with");
    let status = h.status(&state);
    assert_eq!(status["finished"], false);
    assert_eq!(
        status["stats"]["failed"], 0,
        "nothing failed because of the outage"
    );
    h.block_on(h.api.set_down(false));
    h.resume(&state, &[]).expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &ids);
}

#[test]
fn max_failures_stops_a_failure_storm_with_progress_intact() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 300,
        ..fast_with_latency(1)
    });
    let ids = ids(3000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let run = h.run_new(
        &state,
        &input,
        &h.url(),
        &["--max-failures", "20", "--concurrency", "4"],
    );
    run.expect_code(1).expect_stderr("--max-failures");
    let status = h.status(&state);
    assert_eq!(status["finished"], false);
    let failed = status["stats"]["failed"].as_u64().unwrap();
    assert!(failed > 20, "{failed}");
    assert!(
        h.api.total_calls() < 1000,
        "the storm was stopped early: {} calls",
        h.api.total_calls()
    );
    // Percent form: 30% of IDs fail, a limit of 50% lets the job finish.
    h.resume(&state, &["--max-failures", "50%"]).expect_code(3);
    h.check_export_exactly_once(&h.export(&state), &ids);
}

#[test]
fn without_a_rate_concurrency_adapts_to_a_hidden_capacity() {
    let h = Harness::new(fast_with_latency(2));
    h.api.set_capacity(Some(300.0));
    let ids = ids(1500);
    // Realistic retry waits (the harness's defaults are 5-20 ms), so that the controller's
    // 200 ms ticks see the pushback before items run out of attempts.
    let (_, state) = h.finished_job(
        &ids,
        &[
            "--concurrency",
            "64",
            "--max-attempts",
            "10",
            "--retry-initial",
            "100ms",
            "--retry-max",
            "1s",
        ],
    );
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    assert!(export.iter().all(|r| r["status"] == "ok"));
    assert!(h.api.rejected_429() > 0, "the capacity was hit");
}

/// IDs that always lose their connection while the API answers the others: more than
/// twenty of them in a row at the end of the input look like an outage, but a probe with an
/// ID known to work gets its answer, so they fail with their error and the job ends, instead
/// of being held as an outage until `--max-outage` halts it.
#[test]
fn ids_that_always_lose_their_connection_fail_and_are_not_an_outage() {
    let h = Harness::new(ApiConfig {
        drop_per_mille: 100,
        transient_attempts: 1000,
        ..fast_with_latency(1)
    });
    let candidates = ids(6000);
    let with_fault = |fault: Fault, n: usize| -> Vec<String> {
        let picked: Vec<String> = candidates
            .iter()
            .filter(|id| h.api.fault(id) == fault)
            .take(n)
            .cloned()
            .collect();
        assert_eq!(picked.len(), n);
        picked
    };
    let good = with_fault(Fault::None, 300);
    let poisoned = with_fault(Fault::Drop, 24);
    let all: Vec<String> = good.iter().chain(&poisoned).cloned().collect();
    let input = h.ids_file("ids.txt", &all);
    let state = h.state();
    let url = h.url();
    let run = h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--url",
        &url,
        "--max-attempts",
        "3",
        "--retry-initial",
        "100ms",
        "--max-outage",
        "5s",
        "--progress-interval",
        "0",
    ]);
    run.expect_code(3);
    assert!(!run.stderr.contains("unreachable"), "{}", run.stderr);
    let status = h.status(&state);
    assert_eq!(status["finished"], true, "{status}");
    assert_eq!(status["stats"]["ok"], 300, "{status}");
    assert_eq!(status["stats"]["failed"], 24, "{status}");
    assert_eq!(
        status["stats"]["buckets_committed"], status["stats"]["buckets_planned"],
        "{status}"
    );
    for r in h.export(&state) {
        let id = r["id"].as_str().unwrap();
        if h.api.fault(id) == Fault::Drop {
            assert_eq!(r["status"], "failed", "{r}");
            assert_eq!(r["error_class"], "connection", "{r}");
            assert_eq!(h.api.calls(id), 3, "--max-attempts 3: {r}");
        } else {
            assert_eq!(r["status"], "ok", "{r}");
        }
    }
}
