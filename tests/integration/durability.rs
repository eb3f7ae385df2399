//! Async progress tracking: kill -9 in one durability mode, resume in the other, and every
//! ID exactly once; one-row buckets in both modes.

use std::time::Duration;

use highwater::demo::api::ApiConfig;
use rand::Rng;

use crate::harness::*;

/// Alternate the mode at every start, SIGKILL each run at a random point, then finish.
fn kill_and_switch(first_async: bool) {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(4),
        latency_max: Duration::from_millis(8),
        slow_delay: Duration::from_millis(300),
        ..ApiConfig::faulty()
    });
    let ids = ids(5000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let base = [
        "run",
        "--state",
        p(&state),
        "--concurrency",
        "16",
        "--timeout",
        "2s",
        "--retry-initial",
        "5ms",
        "--retry-max",
        "50ms",
        "--progress-interval",
        "0",
    ];
    let async_flags = ["--async-progress", "--checkpoint-interval", "20ms"];
    let mut rng = rand::rng();
    let mut kills = 0;
    let mut async_mode = first_async;
    while kills < 6 {
        let mut args = base.to_vec();
        if kills == 0 {
            args.extend(["--input", p(&input), "--url", &url, "--bucket-size", "1"]);
        }
        if async_mode {
            args.extend(async_flags);
        }
        let ok_before = if kills == 0 {
            0
        } else {
            h.status(&state)["stats"]["ok"].as_u64().unwrap()
        };
        let mut child = h.spawn(&args);
        let target = h.api.total_calls() + rng.random_range(400..800);
        if !h.wait_for_calls(&mut child, target) {
            let run = finish(child);
            panic!("the run ended before it could be killed: {run:?}");
        }
        child.kill().unwrap();
        assert!(child.wait().unwrap().code().is_none(), "killed, not exited");
        kills += 1;
        // Each killed run, in either mode, left durable progress behind: 400 calls at 16
        // in flight and 4-8 ms each take at least 100 ms, five 20 ms checkpoint intervals.
        let ok_after = h.status(&state)["stats"]["ok"].as_u64().unwrap();
        assert!(
            ok_after > ok_before,
            "no durable progress in a killed {} run",
            if async_mode { "async" } else { "sync" }
        );
        async_mode = !async_mode;
    }
    let mut args = base.to_vec();
    if async_mode {
        args.extend(async_flags);
    }
    h.run(&args).expect_code(3); // the 404 IDs fail permanently
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    let status = h.status(&state);
    assert_eq!(status["finished"], true);
    assert_eq!(status["stats"]["buckets_committed"], 5000);
    assert_eq!(status["stats"]["buckets_in_flight"], 0);
}

#[test]
fn kill_9_in_async_mode_then_resume_in_sync_mode_and_back() {
    kill_and_switch(true);
}

#[test]
fn kill_9_in_sync_mode_then_resume_in_async_mode_and_back() {
    kill_and_switch(false);
}

#[test]
fn one_row_buckets_finish_in_both_modes() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(3000);
    let input = h.ids_file("ids.txt", &ids);
    for (name, extra) in [
        ("sync", &[][..]),
        (
            "async",
            &["--async-progress", "--checkpoint-interval", "20ms"][..],
        ),
    ] {
        let state = h.path(name);
        let mut args = vec!["--bucket-size", "1"];
        args.extend_from_slice(extra);
        h.run_new(&state, &input, &h.url(), &args).expect_code(0);
        let status = h.status(&state);
        assert_eq!(status["finished"], true, "{name}");
        assert_eq!(status["stats"]["buckets_committed"], 3000, "{name}");
        h.check_export_exactly_once(&h.export(&state), &ids);
    }
    assert_eq!(h.api.total_calls(), 6000, "each ID once per job");
}

#[test]
fn checkpoint_interval_needs_async_progress_and_a_positive_duration() {
    let h = Harness::new(ApiConfig::fast());
    let state = h.state();
    let run = h.run(&["run", "--state", p(&state), "--checkpoint-interval", "2s"]);
    run.expect_code(2).expect_stderr("--async-progress");
    let run = h.run(&[
        "run",
        "--state",
        p(&state),
        "--async-progress",
        "--checkpoint-interval",
        "0",
    ]);
    run.expect_code(2).expect_stderr("--checkpoint-interval");
    assert!(!state.exists(), "a usage error creates nothing");
}
