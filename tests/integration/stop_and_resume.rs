//! Stopping a job and resuming it: SIGTERM and a second signal, a standard error that goes
//! away, the demo's resume, and the printed resume command pasted into a shell.

use std::collections::HashSet;
use std::time::Duration;

use highwater::demo::api::{ApiConfig, Fault};
use highwater::engine::max_unsynced_items;

use crate::harness::*;

// ---------------------------------------------------------------------------
// Signals

#[test]
fn sigterm_stops_gracefully_and_a_resume_finishes_with_few_repeated_calls() {
    const CONCURRENCY: usize = 8;
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(3),
        latency_max: Duration::from_millis(6),
        ..ApiConfig::fast()
    });
    let ids = ids(2000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let concurrency = CONCURRENCY.to_string();
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url, "--concurrency", &concurrency]);
    args.extend(["--bucket-size", "250"]);
    args.extend(QUICK);
    let mut child = h.spawn(&args);
    assert!(h.wait_for_calls(&mut child, 300), "the run ended early");
    signal(&child, libc::SIGTERM);
    let run = finish(child);
    run.expect_no_panic()
        .expect_code(130)
        .expect_stderr(&format!("run --state {}", p(&state)));
    let status = h.status(&state);
    assert_eq!(status["finished"], false, "{status}");
    let stopped_calls = h.api.total_calls();
    assert!(stopped_calls < ids.len() as u64);

    h.resume(&state, &["--concurrency", &concurrency])
        .expect_no_panic()
        .expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &ids);
    let total = h.api.total_calls();
    let clean = ids.len() as u64;
    assert!(total >= clean, "{total} calls < {clean}");
    let bound = max_unsynced_items(CONCURRENCY) as u64;
    assert!(
        total - clean <= bound,
        "{} repeated calls after one SIGTERM; bound {bound}",
        total - clean
    );
}

#[test]
fn a_second_signal_exits_at_once_and_the_store_stays_consistent() {
    let h = Harness::new(ApiConfig {
        slow_per_mille: 500,
        slow_delay: Duration::from_secs(10),
        transient_attempts: 1,
        ..ApiConfig::fast()
    });
    // Four slow IDs fill the four slots; the others wait behind them.
    let candidates = ids(200);
    let slow = candidates
        .iter()
        .filter(|id| h.api.fault(id) == Fault::Slow);
    let fast = candidates
        .iter()
        .filter(|id| h.api.fault(id) == Fault::None);
    let ids: Vec<String> = slow.take(4).chain(fast.take(20)).cloned().collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url, "--concurrency", "4"]);
    args.extend(["--shutdown-timeout", "60s"]);
    args.extend(QUICK);
    let mut child = h.spawn(&args);
    assert!(h.wait_for_calls(&mut child, 4), "the run ended early");

    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    signal(&child, libc::SIGTERM);
    // The first signal is seen: a graceful stop waits for the slow requests in flight.
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the run logs the stop request");
        if line.contains("stop requested") {
            break;
        }
    }
    signal(&child, libc::SIGTERM);
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("stopped at once"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // It did not wait for the slow requests: none of them has a result.
    assert!(h.export(&state).is_empty());
    assert_eq!(h.status(&state)["finished"], false);

    h.resume(&state, &[]).expect_no_panic().expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &ids);
    for id in &ids[..4] {
        assert_eq!(h.api.calls(id), 2, "{id}: the abandoned call and one more");
    }
    assert_eq!(h.api.total_calls(), 4 * 2 + 20);
}

/// A log reader that goes away (`highwater run ... 2>&1 | head`) must not turn a finished
/// job into a crash or a hang: the results are durable and the exit code is the job's.
#[test]
fn a_job_whose_stderr_reader_goes_away_still_ends_with_its_exit_code() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(300);
    let input = h.ids_file("ids.txt", &ids);
    let url = h.url();
    let mut problems = Vec::new();
    for verbosity in ["-q", "-v", "-vv"] {
        let state = h.path(&format!("state{verbosity}"));
        let mut args = vec![verbosity, "run", "--state", p(&state), "--input", p(&input)];
        args.extend(["--url", &url]);
        args.extend(QUICK);
        let mut child = h
            .cmd(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stderr.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        match status {
            None => problems.push(format!("{verbosity}: still running after 60 s")),
            Some(s) if s.code() != Some(0) => problems.push(format!("{verbosity}: ended {s}")),
            Some(_) => {}
        }
        let status = h.run(&["status", "--state", p(&state), "--json"]);
        if !status.stdout.contains("\"finished\":true") {
            problems.push(format!(
                "{verbosity}: job not finished: {}{}",
                status.stdout, status.stderr
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// The demo

#[test]
fn demo_runs_to_completion_and_prints_the_next_commands() {
    // A harness with the demo's fault model, to judge the records.
    let h = Harness::new(ApiConfig::demo());
    let dir = h.path("demo");
    let run = h.run(&["demo", "--dir", p(&dir), "--ids", "2000"]);
    run.expect_no_panic();
    assert!(run.code == 0 || run.code == 3, "{run:?}");
    let state = std::fs::canonicalize(&dir).unwrap().join("state");
    for needle in [
        "next:".to_string(),
        format!("status --state {}", p(&state)),
        format!("export --state {}", p(&state)),
        format!("demo --dir {}", p(&std::fs::canonicalize(&dir).unwrap())),
    ] {
        run.expect_stderr(&needle);
    }

    let ids: Vec<String> = highwater::demo::demo_ids(2000).collect();
    let unique = ids.iter().collect::<HashSet<_>>().len();
    assert!(unique < 2000, "the demo input has repeats");
    let status = h.status(&state);
    assert_eq!(status["finished"], true, "{status}");
    assert_eq!(status["stats"]["duplicates"], 2000 - unique, "{status}");
    let export = h.export(&state);
    assert_eq!(export.len(), unique);
    h.check_export_exactly_once(&export, &ids);
    let failed = status["stats"]["failed"].as_u64().unwrap();
    assert_eq!(run.code, if failed > 0 { 3 } else { 0 }, "{status}");
}

#[test]
fn a_stopped_demo_says_to_resume_it_with_the_demo_and_that_works() {
    let h = Harness::new(ApiConfig::demo());
    let dir = h.path("a demo");
    let mut child = h.spawn(&["demo", "--dir", p(&dir), "--ids", "20000"]);
    // Stopped once results are being written (the demo's API is inside the process).
    let results = dir.join("state").join("results.log");
    let started = std::time::Instant::now();
    while std::fs::metadata(&results).map_or(0, |m| m.len()) == 0 {
        assert!(child.try_wait().unwrap().is_none(), "the demo ended early");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no result in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, libc::SIGINT);
    let stopped = finish(child);
    stopped.expect_no_panic().expect_code(130);
    let suggested = stopped
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("resume with: "))
        .unwrap_or_else(|| panic!("no resume command in:\n{}", stopped.stderr))
        .to_string();
    // Not `run --state`: that job's URL names the demo's own API, which only the demo starts.
    assert!(suggested.contains(" demo --dir "), "{suggested}");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&suggested)
        .output()
        .unwrap();
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(3),
        "{suggested}: {code:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = std::fs::canonicalize(&dir).unwrap().join("state");
    assert_eq!(h.status(&state)["finished"], true);
}

#[test]
fn the_printed_resume_command_works_pasted_into_a_shell_whatever_the_state_path() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(2),
        ..ApiConfig::fast()
    });
    let ids = ids(2000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.path("it's a $state");
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(["--concurrency", "2"]);
    let mut child = h.spawn(&args);
    assert!(h.wait_for_calls(&mut child, 100), "the run ended early");
    signal(&child, libc::SIGTERM);
    let stopped = finish(child);
    stopped.expect_no_panic().expect_code(130);
    let suggested = stopped
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("resume with: highwater "))
        .unwrap_or_else(|| panic!("no resume command in:\n{}", stopped.stderr))
        .to_string();
    // What a shell makes of the suggestion: its words, one per line.
    let words = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("printf '%s\\n' {suggested}"))
        .output()
        .unwrap();
    let words = String::from_utf8(words.stdout).unwrap();
    let words: Vec<&str> = words.lines().collect();
    assert_eq!(words, ["run", "--state", p(&state)], "{suggested}");
    let mut resume = words.clone();
    resume.extend(QUICK);
    h.run(&resume).expect_no_panic().expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &ids);
}
