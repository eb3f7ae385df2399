//! The exec handler: one process per ID (`--exec`), killed and resumed like an HTTP job,
//! with no process left behind.

use std::collections::HashMap;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use highwater::demo::api::ApiConfig;
use rand::Rng;
use serde_json::Value;

use crate::harness::{finish, p, Harness};

/// The processes (pid, last argument) with an argument equal to `marker`, zombies aside.
fn processes_with(marker: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        if args.contains(&marker.as_bytes()) {
            let last = String::from_utf8_lossy(args.last().expect("the marker")).into_owned();
            found.push((pid, last));
        }
    }
    found
}

/// Wait (at most 2 s: less than a slow call of [`PROGRAM`] takes) until no process has the
/// argument `marker`; the ones left.
fn survivors(marker: &str) -> Vec<(u32, String)> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = processes_with(marker);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |t| t.iter().filter(|b| **b == b'\n').count())
}

/// Wait until `log` has `target` lines or `child` exits; false if it exited.
fn wait_for_lines(child: &mut Child, log: &Path, target: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if lines(log) >= target {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(
            Instant::now() < deadline,
            "no progress to {target} calls in 120 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The test program: logs each call, fails IDs ending in 7 for good (exit 3, with a reason
/// on stderr), IDs ending in 3 once with exit 75, takes 5 s for IDs ending in 11, and prints
/// a JSON result. Its first argument is the marker the process scan looks for.
const PROGRAM: &str = r#"marker=$1; id=$2
echo "$id" >> "$marker/calls.log"
case "$id" in
  *7) echo "starting $id" >&2; echo "refused $id for good" >&2; exit 3 ;;
  *3) if [ ! -e "$marker/seen/$id" ]; then : > "$marker/seen/$id"; echo "busy" >&2; exit 75; fi ;;
  *11) sleep 5 ;;
esac
printf '{"id":"%s","n":%s}\n' "$id" "${id#id-}"
"#;

#[test]
fn an_exec_job_killed_five_times_exports_every_id_once_and_leaves_no_process() {
    let h = Harness::new(ApiConfig::fast());
    let marker = canonical_dir(&h);
    std::fs::create_dir(h.path("seen")).unwrap();
    let script = h.file("program.sh", PROGRAM);
    let ids: Vec<String> = (0..5000).map(|i| format!("id-{i}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let log = h.path("calls.log");
    let command = format!("sh {} {} {{id}}", p(&script), marker);
    let mut rng = rand::rng();
    // Kills that found a slow call in flight: one that would outlive the survivors' wait
    // unless killed with highwater.
    let (mut kills, mut caught_in_flight) = (0, 0);
    while kills < 5 {
        let mut args = vec!["run", "--state", p(&state), "--concurrency", "32"];
        if kills == 0 {
            args.extend([
                "--input",
                p(&input),
                "--exec",
                &command,
                "--retry-initial",
                "10ms",
            ]);
        }
        let mut child = h.spawn(&args);
        let target = lines(&log) + rng.random_range(150..700);
        if !wait_for_lines(&mut child, &log, target) {
            panic!("the run ended before its kill: {:?}", finish(child));
        }
        if processes_with(&marker)
            .iter()
            .any(|(_, id)| id.ends_with("11"))
        {
            caught_in_flight += 1;
        }
        child.kill().unwrap();
        assert!(child.wait().unwrap().code().is_none(), "killed");
        kills += 1;
        let left = survivors(&marker);
        assert!(
            left.is_empty(),
            "kill {kills}: processes outlived highwater: {left:?}"
        );
    }
    assert!(caught_in_flight > 0, "no kill found a slow call in flight");
    let run = h.run(&["run", "--state", p(&state), "--concurrency", "32"]);
    run.expect_code(3);
    assert!(survivors(&marker).is_empty());

    let export = h.export(&state);
    let got: Vec<&str> = export.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(got, ids, "every ID exactly once, in input order");
    for r in &export {
        let id = r["id"].as_str().unwrap();
        if id.ends_with('7') {
            assert_eq!(r["status"], "failed", "{r}");
            assert_eq!(r["error_class"], "exit", "{r}");
            assert_eq!(r["attempts"], 1, "{r}");
            let error = r["error"].as_str().unwrap();
            assert!(error.starts_with("exit code 3; stderr: starting"), "{r}");
            assert!(error.ends_with(&format!("refused {id} for good")), "{r}");
        } else {
            assert_eq!(r["status"], "ok", "{r}");
            let n: u64 = id[3..].parse().unwrap();
            assert_eq!(r["body"], serde_json::json!({"id": id, "n": n}), "{r}");
        }
    }
    // Calls repeated by the kills are few: those in flight or not yet durable at each.
    let calls = lines(&log);
    let expected = 5000 + ids.iter().filter(|id| id.ends_with('3')).count();
    assert!(calls >= expected, "{calls} calls");
    assert!(calls <= expected + 5 * 1000, "{calls} calls for {expected}");
}

/// The scratch directory's canonical path: an argument no other process has.
fn canonical_dir(h: &Harness) -> String {
    std::fs::canonicalize(h.dir.path())
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_process_past_the_timeout_is_killed_with_its_group_and_retried_as_a_timeout() {
    let h = Harness::new(ApiConfig::fast());
    let marker = canonical_dir(&h);
    // The process starts a child of its own in the background, notes its pid, and waits.
    let script = h.file("slow.sh", r#"sleep 300 & echo $! >> "$1/pids"; wait"#);
    let input = h.ids_file("ids.txt", &["a".to_string()]);
    let state = h.state();
    let command = format!("sh {} {} {{id}}", p(&script), marker);
    let started = Instant::now();
    let run = h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        &command,
        "--timeout",
        "1s",
        "--max-attempts",
        "2",
        "--retry-initial",
        "10ms",
    ]);
    run.expect_code(3);
    assert!(started.elapsed() < Duration::from_secs(60));
    let export = h.export(&state);
    assert_eq!(export[0]["status"], "failed");
    assert_eq!(export[0]["error_class"], "timeout");
    assert_eq!(export[0]["attempts"], 2, "retried once");
    let error = export[0]["error"].as_str().unwrap();
    assert!(error.contains("killed with its process group"), "{error}");
    let pids = std::fs::read_to_string(h.path("pids")).unwrap();
    let pids: Vec<&str> = pids.lines().collect();
    assert_eq!(pids.len(), 2, "one background child per attempt");
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in pids {
        // Gone, or a zombie waiting for init.
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "))
        {
            assert!(
                Instant::now() < deadline,
                "the background child {pid} lives on"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(processes_with(&marker).is_empty());
}

#[test]
fn exit_codes_answer_checks_and_the_stderr_tail_reach_the_error_table() {
    let h = Harness::new(ApiConfig::fast());
    let dir = canonical_dir(&h);
    let script = h.file(
        "codes.sh",
        r#"case "$2" in
  again) if [ ! -e "$1/again" ]; then : > "$1/again"; exit 75; fi; echo '{"v": 1}' ;;
  nine) exit 9 ;;
  bad) i=0; while [ $i -lt 500 ]; do echo "noise line $i" >&2; i=$((i+1)); done; echo "the real reason" >&2; exit 4 ;;
  refused) echo '{"error": "no such thing"}' ;;
  text) echo "plain words" ;;
  *) echo "{\"v\": \"$2\", \"big\": \"dropped\"}" ;;
esac
"#,
    );
    let ids: Vec<String> = ["again", "nine", "bad", "refused", "text", "fine"]
        .map(String::from)
        .to_vec();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let command = format!("sh {} {} {{id}}", p(&script), dir);
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        &command,
        "--retry-initial",
        "10ms",
        "--max-attempts",
        "3",
        "--fail-if",
        "type == \"object\" and .error != null",
        "--extract",
        "if type == \"object\" then {v} else . end",
    ])
    .expect_code(3);
    let export: HashMap<String, Value> = h
        .export(&state)
        .into_iter()
        .map(|r| (r["id"].as_str().unwrap().to_string(), r))
        .collect();
    assert_eq!(export["again"]["status"], "ok");
    assert_eq!(export["again"]["attempts"], 2, "exit 75 is retried");
    assert_eq!(export["again"]["body"], serde_json::json!({"v": 1}));
    assert_eq!(
        export["fine"]["body"],
        serde_json::json!({"v": "fine"}),
        "extracted"
    );
    assert_eq!(export["text"]["body"], "plain words", "not JSON: a string");
    assert_eq!(
        export["nine"]["attempts"], 1,
        "exit 9 is not retried by default"
    );
    assert_eq!(export["refused"]["error_class"], "invalid");
    let failures = h.run(&["failures", "--state", p(&state), "--format", "jsonl"]);
    failures.expect_code(0);
    let rows: HashMap<String, Value> = failures
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|r| (r["id"].as_str().unwrap().to_string(), r))
        .collect();
    assert_eq!(rows.len(), 3, "{}", failures.stdout);
    let bad = rows["bad"]["error"].as_str().unwrap();
    assert!(bad.starts_with("exit code 4; stderr: …"), "{bad}");
    assert!(bad.ends_with("noise line 499\nthe real reason"), "{bad}");
    assert!(bad.len() < 2200, "only the tail: {} bytes", bad.len());
    assert_eq!(rows["bad"]["error_class"], "exit");
    assert!(rows["refused"]["error"]
        .as_str()
        .unwrap()
        .contains("fail-if"));
    let table = h.run(&["failures", "--state", p(&state), "--class", "exit"]);
    assert!(table.stdout.contains("the real reason") && table.stdout.contains("exit code 9"));
    // 9 retried once asked: a rerun of the failed IDs with --retry-exit-codes 9 still
    // fails it, now after --max-attempts.
    h.run(&[
        "rerun",
        "--state",
        p(&state),
        "--failed",
        "--retry-exit-codes",
        "9",
        "--retry-initial",
        "10ms",
    ])
    .expect_code(3);
    let nine = h
        .export(&state)
        .into_iter()
        .find(|r| r["id"] == "nine")
        .unwrap();
    assert_eq!(nine["error_class"], "exit");
    assert_eq!(nine["attempts"], 4, "1 before, 3 in the rerun: {nine}");
}

#[test]
fn exec_and_url_together_are_refused_and_nothing_is_created() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &["a".to_string()]);
    let state = h.state();
    let url = h.url();
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        "echo {id}",
        "--url",
        &url,
    ])
    .expect_refused(2, &["--exec", "--url"]);
    assert!(!state.exists());
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        "no-such-program-x {id}",
    ])
    .expect_refused(2, &["--exec", "no-such-program-x", "not found"]);
    assert!(!state.exists());
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--url",
        &url,
        "--retry-exit-codes",
        "75",
    ])
    .expect_refused(2, &["--retry-exit-codes"]);
    assert!(!state.exists());
}

/// A command that exits with the retry code for the same IDs every time (10% of them): they
/// fail after their attempts, class `exit`, and the adaptive rate is not lowered for them
/// (an exit code is the command's answer, never the API's pushback).
#[test]
fn ids_whose_command_asks_for_a_retry_every_time_fail_alone_at_the_rate() {
    let h = Harness::new(ApiConfig::fast());
    let script = h.file(
        "again.sh",
        r#"case "$1" in
  bad-*) exit 75 ;;
  *) echo "{\"v\": \"$1\"}" ;;
esac
"#,
    );
    let ids: Vec<String> = (0..600)
        .map(|i| {
            if i % 10 == 3 {
                format!("bad-{i}")
            } else {
                format!("ok-{i}")
            }
        })
        .collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let command = format!("sh {} {{id}}", p(&script));
    let run = h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        &command,
        "--rate",
        "100",
        "--concurrency",
        "4",
        "--retry-initial",
        "200ms",
        "--max-attempts",
        "3",
        "--progress-interval",
        "1s",
        // The controller's decisions, with what each saw.
        "-v",
    ]);
    run.expect_code(3);
    for r in h.export(&state) {
        let id = r["id"].as_str().unwrap();
        if id.starts_with("bad-") {
            assert_eq!(r["status"], "failed", "{r}");
            assert_eq!(r["error_class"], "exit", "{r}");
            assert_eq!(r["attempts"], 3, "{r}");
        } else {
            assert_eq!(r["status"], "ok", "{r}");
        }
    }
    let rates = run.rate_limits();
    assert!(
        !rates.is_empty(),
        "progress lines with the rate: {}",
        run.stderr
    );
    // The adaptive rate may still move with the command's latency (a busy machine slows a
    // fork), but never for pushback: every change it made saw none, and no outage was read.
    let adjusted: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("rate adjusted"))
        .collect();
    assert!(
        adjusted.iter().all(|l| l.contains(" pushback=0 ")),
        "the rate was moved for pushback: {adjusted:#?}"
    );
    assert!(
        !run.stderr.contains("looks down"),
        "an outage was read: {}",
        run.stderr
    );
}

/// A command's job keeps no HTTP request: a resume that gives what would shape one is
/// refused with the reason, never run as if it had not been given.
#[test]
fn a_resume_of_a_command_job_refuses_what_shapes_an_http_request() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &["a".to_string(), "b".to_string()]);
    let state = h.state();
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        "echo {id}",
    ])
    .expect_code(0);
    for extra in [&["--method", "POST"][..], &["--body", "{id}"][..]] {
        let mut args = vec!["run", "--state", p(&state)];
        args.extend_from_slice(extra);
        h.run(&args)
            .expect_refused(2, &[extra[0], "runs a command", "--exec", "--url"]);
    }
    assert_eq!(h.status(&state)["stats"]["ok"], 2);
}
