//! Progress a user can trust: JSON progress events, `status` from another shell while a run
//! is live or after it died, the metrics endpoint, and the terminal bar under a pseudo-terminal.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use highwater::demo::api::ApiConfig;
use serde_json::Value;

use crate::harness::*;

/// An API slow enough that a run over `ids(5000)` at concurrency 1 lasts far longer than
/// any test waits (5000 × 20 ms): the tests stop it themselves.
fn slow_api() -> Harness {
    Harness::new(ApiConfig {
        latency_min: Duration::from_millis(20),
        latency_max: Duration::from_millis(20),
        ..ApiConfig::fast()
    })
}

/// Start a long run in `state` with `extra` flags.
fn spawn_long_run(h: &Harness, extra: &[&str]) -> Child {
    let input = h.ids_file("ids.txt", &ids(5000));
    let state = h.state();
    let url = h.url();
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url, "--concurrency", "1", "--bucket-size", "50"]);
    args.extend(QUICK);
    args.extend_from_slice(extra);
    h.spawn(&args)
}

/// Wait until the runner's live snapshot shows results, and return it.
fn wait_for_live_results(state: &Path, child: &mut Child) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(bytes) = std::fs::read(state.join("live.json")) {
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                if v["pid"] == child.id() && v["ok"].as_u64().unwrap_or(0) > 0 {
                    return v;
                }
            }
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(Instant::now() < deadline, "no live snapshot with results");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The progress events among stderr's lines: every line must be a JSON object.
fn json_events(stderr: &str) -> Vec<Value> {
    let mut events = Vec::new();
    for line in stderr.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a JSON line does not parse ({e}): {line}"));
        if v["event"] == "progress" {
            events.push(v);
        }
    }
    events
}

#[test]
fn json_progress_events_parse_carry_the_fields_and_name_the_job_and_each_run() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(5),
        latency_max: Duration::from_millis(5),
        not_found_per_mille: 50,
        ..ApiConfig::fast()
    });
    let ids = ids(3000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = vec!["--log-format", "json", "run", "--state", p(&state)];
    args.extend(["--input", p(&input), "--url", &url, "--concurrency", "4"]);
    args.extend([
        "--bucket-size",
        "100",
        "--rate",
        "100000",
        "--adaptive",
        "off",
    ]);
    args.extend(QUICK);
    // After QUICK's 0, so this interval wins.
    args.extend(["--progress-interval", "100ms"]);
    let mut child = h.spawn(&args);
    assert!(h.wait_for_calls(&mut child, 300), "the run ended early");
    signal(&child, libc::SIGTERM);
    let first = finish(child);
    first.expect_no_panic().expect_code(130);
    // Log lines and messages are JSON too (json_events below parses every line).
    let lines: Vec<Value> = first
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).expect("stderr lines are JSON with --log-format json"))
        .collect();
    let message = |v: &Value| v["fields"]["message"].as_str().unwrap_or("").to_string();
    let stop = lines.iter().find(|v| message(v).contains("stop requested"));
    assert_eq!(stop.expect("the stop is logged")["level"], "WARN");
    assert!(
        lines
            .iter()
            .any(|v| message(v).contains("resume with: highwater run --state")),
        "{}",
        first.stderr
    );
    let mut resume = vec!["--log-format", "json", "run", "--state", p(&state)];
    resume.extend(QUICK);
    resume.extend([
        "--progress-interval",
        "100ms",
        "--rate",
        "100000",
        "--adaptive",
        "off",
    ]);
    let second = h.run(&resume);
    second.expect_no_panic().expect_code(3);

    let (a, b) = (json_events(&first.stderr), json_events(&second.stderr));
    let last = b.last().expect("a last event");
    assert_eq!(last["last"], true, "{last}");
    assert_eq!(a.last().unwrap()["last"], true);
    let job_id = h.status(&state)["job_id"].clone();
    for e in a.iter().chain(&b) {
        assert_eq!(e["job_id"], job_id, "{e}");
        for field in [
            "run_id",
            "timestamp",
            "buckets_committed",
            "ok",
            "failed",
            "pending",
            "input_rows_per_second",
            "processed_items_per_second",
            "effective_rate",
            "retries",
            "throttled",
            "unavailable",
            "in_flight",
            "writer_backpressure",
            "eta_s",
        ] {
            assert!(e.get(field).is_some(), "{field} missing: {e}");
        }
        for d in [
            "offset_write_ms",
            "offset_sync_ms",
            "api_ms",
            "result_write_ms",
            "result_sync_ms",
            "commit_write_ms",
        ] {
            assert!(e["duration_ms"][d].as_f64().is_some(), "{d} missing: {e}");
        }
        humantime::parse_rfc3339(e["timestamp"].as_str().unwrap()).expect("an RFC 3339 time");
    }
    // One run id per run, a new one for the resume.
    let run_a = &a[0]["run_id"];
    assert!(a.iter().all(|e| &e["run_id"] == run_a));
    assert!(b.iter().all(|e| e["run_id"] == b[0]["run_id"]));
    assert_ne!(run_a, &b[0]["run_id"]);
    // The last event's job-wide figures are the store's.
    let stats = &h.status(&state)["stats"];
    assert_eq!(last["ok"], stats["ok"], "{last}");
    assert_eq!(last["failed"], stats["failed"], "{last}");
    assert_eq!(last["pending"], 0);
    assert_eq!(last["buckets_committed"], 30);
    assert_eq!(last["input_rows"], 3000);
    assert_eq!(last["eta_s"], 0);
    assert!(last["duration_ms"]["api_ms"].as_f64().unwrap() > 0.0);
    assert!(last["duration_ms"]["result_sync_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(last["effective_rate"], 100000.0);
    h.check_export_exactly_once(&h.export(&state), &ids);
}

#[test]
fn text_progress_lines_are_logged_at_the_end_and_not_at_all_with_interval_zero() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(200);
    let input = h.ids_file("ids.txt", &ids);
    let run = h.run_new(&h.state(), &input, &h.url(), &["--progress-interval", "1h"]);
    run.expect_no_panic().expect_code(0);
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("progress: "))
        .expect("a progress line at the end");
    assert!(line.contains("200 ok, 0 failed, 0 pending"), "{line}");
    assert!(line.contains("INFO"), "{line}");

    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids);
    let run = h.run_new(&h.state(), &input, &h.url(), &[]);
    run.expect_code(0);
    assert!(!run.stderr.contains("progress: "), "{}", run.stderr);
}

#[test]
fn status_during_a_live_run_shows_the_runners_figures() {
    let h = slow_api();
    let state = h.state();
    let mut child = spawn_long_run(&h, &[]);
    let snapshot = wait_for_live_results(&state, &mut child);
    assert_eq!(snapshot["finished"], false);

    let status = h.status(&state);
    assert_eq!(status["runner"], "live", "{status}");
    assert_eq!(status["finished"], false);
    assert_eq!(status["live"]["pid"], child.id());
    assert_eq!(status["job_id"], snapshot["job_id"]);
    let ok = status["stats"]["ok"].as_u64().unwrap();
    assert!(ok > 0, "{status}");
    assert!(status["live"]["items_per_second"].as_f64().unwrap() > 0.0);
    assert!(status["live"]["started_ms"].as_u64().unwrap() > 0);
    assert!(status["stats"]["pending"].as_u64().is_some());

    let text = h.run(&["status", "--state", p(&state)]);
    text.expect_code(0);
    assert!(text.stdout.contains("running: pid"), "{}", text.stdout);
    assert!(text.stdout.contains("ETA:"), "{}", text.stdout);

    signal(&child, libc::SIGTERM);
    finish(child).expect_no_panic().expect_code(130);
    // A clean stop marks the snapshot finished: status reads the store again, no warning.
    let after = h.status(&state);
    assert_eq!(after["runner"], "none", "{after}");
    let live: Value = serde_json::from_slice(&std::fs::read(state.join("live.json")).unwrap())
        .expect("live.json is JSON");
    assert_eq!(live["finished"], true);
    assert_eq!(live["outcome"], "stopped");
}

#[test]
fn status_watch_refreshes_until_the_run_ends() {
    let h = slow_api();
    let state = h.state();
    let mut child = spawn_long_run(&h, &[]);
    wait_for_live_results(&state, &mut child);
    let mut watch = h.spawn(&["status", "--state", p(&state), "--watch"]);
    // Two refreshes seen, then the run stops and the watch ends by itself.
    let stdout = watch.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut refreshes = 0;
    while refreshes < 2 {
        let line = lines.next().expect("watch output").unwrap();
        if line.starts_with("runner:") {
            refreshes += 1;
        }
    }
    signal(&child, libc::SIGTERM);
    finish(child).expect_code(130);
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = watch.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        rest.iter().any(|l| l.starts_with("finished:   no")),
        "the watch ends with the store's status: {rest:?}"
    );
}

#[test]
fn status_after_a_kill_9_says_the_runner_died_and_shows_the_stores_figures() {
    let h = slow_api();
    let state = h.state();
    let mut child = spawn_long_run(&h, &[]);
    wait_for_live_results(&state, &mut child);
    let pid = child.id();
    child.kill().unwrap();
    child.wait().unwrap();

    let status = h.status(&state);
    assert_eq!(status["runner"], "died", "{status}");
    assert_eq!(status["last_run"]["pid"], pid);
    assert_eq!(status["finished"], false);
    // The store's own figures: what was durable.
    let exported = h.export(&state).len() as u64;
    let stats = &status["stats"];
    assert_eq!(
        stats["ok"].as_u64().unwrap() + stats["failed"].as_u64().unwrap(),
        exported
    );
    let text = h.run(&["status", "--state", p(&state)]);
    text.expect_code(0);
    assert!(
        text.stdout.contains(&format!("(pid {pid}")) && text.stdout.contains("died"),
        "{}",
        text.stdout
    );
}

/// Read `child`'s stderr lines until one contains `needle`; return it. The rest of stderr
/// is drained in the background so the child never blocks on it.
fn stderr_line_with(child: &mut Child, needle: &str) -> String {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no stderr line with {needle:?}"));
        if line.contains(needle) {
            std::thread::spawn(move || for _ in rx {});
            return line;
        }
    }
}

#[test]
fn the_metrics_endpoint_serves_prometheus_text_during_a_run() {
    let h = slow_api();
    let mut child = spawn_long_run(
        &h,
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--rate",
            "500",
            "--adaptive",
            "off",
        ],
    );
    let line = stderr_line_with(&mut child, "metrics on http://");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("the address in the log line")
        .to_string();
    assert!(h.wait_for_calls(&mut child, 20), "the run ended early");
    // Results are durable (and counted) a little after the calls: scrape until they show.
    let deadline = Instant::now() + Duration::from_secs(60);
    let samples = loop {
        let (status, body) = http_get(&addr, "/metrics");
        assert!(status.contains("200"), "{status}");
        let samples = parse_metrics(&body);
        if sample(&samples, r#"highwater_run_items_total{status="ok"}"#) > 0.0 {
            break samples;
        }
        assert!(Instant::now() < deadline, "no item counted:\n{body}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(sample(&samples, r#"highwater_requests_total{code="200"}"#) > 0.0);
    assert!(sample(&samples, r#"highwater_items{status="ok"}"#) > 0.0);
    assert!(sample(&samples, r#"highwater_items{status="pending"}"#) <= 5000.0);
    assert_eq!(sample(&samples, "highwater_rate_limit"), 500.0);
    assert!(sample(&samples, "highwater_in_flight") <= 1.0);
    assert!(sample(&samples, "highwater_buckets_planned") > 0.0);
    assert!(
        sample(
            &samples,
            r#"highwater_store_seconds_total{op="result_sync"}"#
        ) > 0.0
    );
    // The histogram: cumulative buckets, +Inf equal to the count, 20 ms calls above 10 ms.
    let buckets: Vec<f64> = samples
        .iter()
        .filter(|(n, _)| n.starts_with("highwater_request_duration_seconds_bucket"))
        .map(|(_, v)| *v)
        .collect();
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    let count = sample(&samples, "highwater_request_duration_seconds_count");
    assert_eq!(*buckets.last().unwrap(), count);
    assert_eq!(
        sample(
            &samples,
            r#"highwater_request_duration_seconds_bucket{le="0.01"}"#
        ),
        0.0
    );
    assert!(count > 0.0);

    // Idle connections hold at most 32 places: the next connection is closed unanswered,
    // and once one of them goes, scrapes are answered again.
    let mut idle: Vec<TcpStream> = (0..32)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let mut refused = TcpStream::connect(&addr).unwrap();
    let _ = write!(refused, "GET /metrics HTTP/1.0\r\n\r\n");
    let mut answer = Vec::new();
    let _ = refused.read_to_end(&mut answer);
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    idle.pop();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut stream = TcpStream::connect(&addr).unwrap();
        let mut text = String::new();
        let answered = write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").is_ok()
            && stream.read_to_string(&mut text).is_ok()
            && text.starts_with("HTTP/1.0 200");
        if answered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no answer after a connection closed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(idle);
    signal(&child, libc::SIGTERM);
    assert_eq!(child.wait().unwrap().code(), Some(130));
}

#[test]
fn a_bad_metrics_address_is_refused_naming_the_flag() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(10));
    h.run_new(
        &h.state(),
        &input,
        &h.url(),
        &["--metrics-addr", "localhost"],
    )
    .expect_refused(2, &["--metrics-addr"]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    h.run_new(&h.state(), &input, &h.url(), &["--metrics-addr", &addr])
        .expect_refused(1, &["--metrics-addr", &addr, "cannot listen"]);
}

/// Strip ANSI escape sequences (CSI ... letter) from terminal output.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[test]
fn under_a_terminal_a_bar_shows_and_log_lines_print_whole_above_it() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(4),
        not_found_per_mille: 100,
        ..ApiConfig::fast()
    });
    let ids = ids(600);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors we then own; the other arguments may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors were just opened and are owned here only.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let url = h.url();
    let mut args = vec!["-v", "run", "--state", p(&state), "--input", p(&input)];
    args.extend([
        "--url",
        &url,
        "--concurrency",
        "2",
        "--rate",
        "400",
        "--adaptive",
        "off",
    ]);
    args.extend(QUICK);
    let mut cmd = h.cmd(&args);
    cmd.env("TERM", "xterm")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(slave));
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut reader = std::fs::File::from(master);
    let output = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once the child exited and the last slave descriptor closed.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let status = child.wait().unwrap();
    let screen = strip_ansi(&output.join().unwrap());
    assert_eq!(status.code(), Some(3), "{screen}");
    assert!(
        screen.contains(" rows ") && screen.contains(" ok ") && screen.contains("items/s"),
        "no bar on the terminal:\n{screen}"
    );
    assert!(screen.contains("limit 400/s"), "{screen}");
    // Every log line printed while the bar was shown is whole, on its own line.
    let segments: Vec<&str> = screen.split(['\r', '\n']).collect();
    let failed: Vec<&&str> = segments
        .iter()
        .filter(|s| s.contains("item failed"))
        .collect();
    assert!(failed.len() >= 10, "too few failures logged:\n{screen}");
    for s in &failed {
        assert!(
            s.contains("DEBUG") && s.contains("class=http") && !s.contains(" rows "),
            "a torn log line: {s:?}\n{screen}"
        );
    }
    assert!(screen.contains("job finished:"), "{screen}");
}

#[test]
fn a_run_behind_its_rate_is_warned_about_with_the_cause() {
    let h = slow_api();
    let extra = ["--rate", "500", "--adaptive", "off"];
    let mut child = spawn_long_run(
        &h,
        &[&extra[..], &["--progress-interval", "300ms"]].concat(),
    );
    // 20 ms calls one at a time: about 50/s of the 500/s asked for. Only a sustained
    // shortfall is warned about (two intervals in a row, start-up not counted), so the
    // first warning already covers calls that finished and names the latency.
    let line = stderr_line_with(&mut child, "falling behind");
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("--rate is 500.0/s"), "{line}");
    assert!(
        line.contains("API latency: ") && line.contains("ms per call with --concurrency 1"),
        "{line}"
    );
    signal(&child, libc::SIGTERM);
    assert_eq!(child.wait().unwrap().code(), Some(130));
}

#[test]
fn calls_cut_off_at_the_shutdown_timeout_leave_nothing_in_flight() {
    // Answers take 20 s: the four calls under way when the stop comes are cut off at once.
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_secs(20),
        latency_max: Duration::from_secs(20),
        ..ApiConfig::fast()
    });
    let input = h.ids_file("ids.txt", &ids(100));
    let state = h.state();
    let url = h.url();
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend([
        "--url",
        &url,
        "--concurrency",
        "4",
        "--shutdown-timeout",
        "0s",
    ]);
    args.extend(QUICK);
    let mut child = h.spawn(&args);
    assert!(h.wait_for_calls(&mut child, 4), "the run ended early");
    signal(&child, libc::SIGTERM);
    finish(child).expect_no_panic().expect_code(130);
    let live: Value = serde_json::from_slice(&std::fs::read(state.join("live.json")).unwrap())
        .expect("live.json is JSON");
    assert_eq!(live["outcome"], "stopped", "{live}");
    assert_eq!(live["in_flight"], 0, "{live}");
    assert_eq!(live["run_ok"], 0, "{live}");
}

#[test]
fn status_judges_the_last_run_by_its_snapshot_once_the_store_is_free() {
    let h = Harness::new(ApiConfig::fast());
    let (_, state) = h.finished_job(&ids(50), &[]);
    // A clean run marks its snapshot finished before it lets go of the store.
    let live: Value = serde_json::from_slice(&std::fs::read(state.join("live.json")).unwrap())
        .expect("live.json is JSON");
    assert_eq!(live["finished"], true, "{live}");
    let status = h.status(&state);
    assert_eq!(status["runner"], "none", "{status}");
    assert_eq!(status["last_run"], Value::Null, "{status}");

    // A run that died without marking its snapshot, whose pid another process (this
    // test) has now: the free store proves no runner is active, so it died.
    let mut died = live.clone();
    died["finished"] = Value::Bool(false);
    died["outcome"] = Value::Null;
    died["pid"] = std::process::id().into();
    std::fs::write(state.join("live.json"), died.to_string()).unwrap();
    let status = h.status(&state);
    assert_eq!(status["runner"], "died", "{status}");
    assert_eq!(status["last_run"]["pid"], std::process::id(), "{status}");
}

#[test]
fn status_watch_ends_when_its_reader_goes_away() {
    let h = slow_api();
    let state = h.state();
    let mut child = spawn_long_run(&h, &[]);
    wait_for_live_results(&state, &mut child);
    let mut watch = h.spawn(&["status", "--state", p(&state), "--watch"]);
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    assert!(lines.next().is_some(), "no watch output");
    // The reader goes away while the run goes on: the next refresh fails and ends the watch.
    drop(lines);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = watch.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the watch goes on without a reader"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0));
    assert!(child.try_wait().unwrap().is_none(), "the run ended first");
    signal(&child, libc::SIGTERM);
    finish(child).expect_code(130);
}

#[test]
fn logs_written_to_a_file_carry_no_colour_codes() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(50));
    let state = h.state();
    let url = h.url();
    let args = [
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--url",
        &url,
        "--progress-interval",
        "0",
    ];
    // stderr is a pipe here, as with nohup or systemd; NO_COLOR unset on purpose.
    let run: Run = h
        .cmd(&args)
        .env_remove("NO_COLOR")
        .output()
        .expect("the binary runs")
        .into();
    run.expect_code(0).expect_stderr("running");
    assert!(
        !run.stderr.contains('\x1b'),
        "colour codes in a log: {:?}",
        run.stderr
    );
}
