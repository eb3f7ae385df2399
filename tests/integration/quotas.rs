//! Quotas over windows longer than a second, and the job's budget: kept across a kill and a
//! resume, a spent window pausing the job (and saying until when), a spent budget stopping
//! it cleanly, counted by the server.

use std::time::{Duration, Instant};

use highwater::demo::api::ApiConfig;

use crate::harness::*;

fn fast_with_latency(ms: u64) -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(ms),
        latency_max: Duration::from_millis(ms),
        ..ApiConfig::fast()
    }
}

/// A budget stops the job cleanly (exit 5, every finished result kept, no ID failed); a
/// larger one continues it from where it stopped; every ID ends up exactly once.
#[test]
fn a_spent_budget_stops_the_job_and_a_larger_one_continues_it() {
    let h = Harness::new(fast_with_latency(1));
    let ids = ids(120);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let run = h.run_new(&state, &input, &h.url(), &["--quota", "50/job"]);
    run.expect_code(5).expect_stderr("budget");
    assert!(h.api.total_calls() <= 50, "{} calls", h.api.total_calls());
    let done = h.export(&state);
    assert!(done.iter().all(|r| r["status"] == "ok"), "no ID failed");
    assert!(
        done.len() >= 40 && done.len() <= 50,
        "{} results",
        done.len()
    );
    // The same budget again: nothing left to spend, nothing called.
    let calls = h.api.total_calls();
    h.resume(&state, &[]).expect_code(5);
    assert_eq!(h.api.total_calls(), calls);
    // Raised: the job goes on and finishes.
    h.resume(&state, &["--quota", "200/job"]).expect_code(0);
    assert!(h.api.total_calls() <= 200);
    h.check_export_exactly_once(&h.export(&state), &ids);
    let status = h.status(&state);
    let history = status.to_string();
    assert!(
        history.contains("quotas changed from 50/job to 200/job"),
        "{history}"
    );
}

/// A window spent mid-job (a daily quota, shortened to seconds) pauses the job: no ID fails
/// and no attempt is spent while it waits, `status` says which window and until when, and
/// the job finishes once the window frees calls.
#[test]
fn a_spent_window_pauses_the_job_and_status_says_until_when() {
    let h = Harness::new(fast_with_latency(1));
    let ids = ids(90);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(["--quota", "40/4s", "--progress-interval", "100ms"]);
    let mut child = h.spawn(&args);
    let deadline = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        assert!(
            Instant::now() < deadline,
            "status never said the quota was spent"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the job ended before its window was spent"
        );
        let out = h.run(&["status", "--state", p(&state)]);
        if out.stdout.contains("spent: waiting until") {
            break out.stdout;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(seen.contains("quota 40/4s"), "{seen}");
    let run = finish(child);
    run.expect_code(0);
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    assert!(
        export.iter().all(|r| r["attempts"] == 1),
        "no attempt spent waiting"
    );
    assert_eq!(h.api.total_calls(), 90);
}
