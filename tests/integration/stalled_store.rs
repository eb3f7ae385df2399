//! A store that stops answering: the state directory on a disk whose syncs hang
//! ([`LazyFs::stall_syncs`], as a dying disk or a network file system does). The run notices
//! within `--store-timeout`, names what is stuck, and exits 6 rather than hanging; once the
//! disk answers again, the same command resumes and ends with every ID exactly once.

use std::process::Child;
use std::time::{Duration, Instant};

use highwater::demo::api::ApiConfig;

use crate::harness::*;
use crate::lazyfs::LazyFs;

/// Wait until `child` has ended itself: exited, or (a thread of it still held in a sync the
/// disk never answers, which no process can leave) its main thread gone. Fails the test (and
/// kills the child) if neither happens within `limit`: a hang is what this file tests for.
fn ends_itself_within(child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    let stat = format!("/proc/{}/stat", child.id());
    loop {
        if child.try_wait().expect("wait for the run").is_some() {
            return;
        }
        // The state is the field after the command's closing parenthesis: Z once the
        // process called exit and only threads held by the kernel remain.
        let state = std::fs::read_to_string(&stat).unwrap_or_default();
        let state = state.rsplit(')').next().unwrap_or("").trim_start();
        if state.starts_with('Z') {
            return;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the run still hung after {limit:?} ({state:.40})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait for `child` to exit on its own, failing the test (and killing it) if it has not
/// within `limit`: a hang is exactly what this file tests for.
fn exits_within(mut child: Child, limit: Duration) -> Run {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait for the run").is_some() {
            return finish(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let run = finish(child);
            panic!("the run still hung after {limit:?}: {run:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_run_whose_disk_stops_answering_exits_6_and_the_same_command_resumes() {
    let h = Harness::new(ApiConfig::default());
    let fs = LazyFs::mount();
    let state = fs.path().join("state");
    let ids = ids(10_000);
    let input = h.ids_file("ids.txt", &ids);
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend([
        "--concurrency",
        "8",
        "--progress-interval",
        "0",
        "--store-timeout",
        "2s",
    ]);

    let mut child = h.spawn(&args);
    assert!(
        h.wait_for_calls(&mut child, 300),
        "the run ended before the disk stalled"
    );
    fs.stall_syncs();
    ends_itself_within(&mut child, Duration::from_secs(120));
    assert!(
        fs.unanswered_syncs() >= 1,
        "the run stopped on a sync the disk never answered"
    );
    // The kernel holds a thread that waits on the disk until the disk answers (so would a
    // hung real disk); the process has exited otherwise.
    fs.answer_syncs();
    let run = exits_within(child, Duration::from_secs(60));
    run.expect_code(6)
        .expect_stderr("the store has not answered for")
        .expect_stderr("is stuck")
        .expect_stderr("run the same command to resume")
        .expect_no_panic();
    // The work was waiting: no more calls were made once the store hung for long.
    let calls_at_stop = h.api.total_calls();
    assert!(calls_at_stop < ids.len() as u64, "the job was not done");

    let resumed = h.run(&args);
    resumed.expect_code(0);
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
}

#[test]
fn a_store_timeout_that_is_not_a_duration_is_a_usage_error() {
    let h = Harness::new(ApiConfig::default());
    let state = h.state();
    let run = h.run(&["status", "--state", p(&state), "--store-timeout", "soon"]);
    run.expect_code(2).expect_stderr("--store-timeout");
}
