//! The library's examples (examples/*.rs), run as the programs they are; README's Library
//! block, which must be examples/closure_handler.rs word for word; and README's paginated
//! command, run as written against the loopback API. The examples are built by `cargo test`
//! (or `cargo build --examples`) next to the `highwater` binary.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use highwater::demo::api::ApiConfig;

use crate::harness::{finish, p, signal, Harness, Run, BIN};

/// The built example `name`.
fn example(name: &str) -> PathBuf {
    let dir = PathBuf::from(BIN).parent().unwrap().join("examples");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: `cargo test` builds the examples (or run `cargo build --examples`)",
        path.display()
    );
    path
}

#[track_caller]
fn run_example(name: &str, args: &[&str]) -> Run {
    let run: Run = Command::new(example(name))
        .args(args)
        .output()
        .expect("the example runs")
        .into();
    run.expect_code(0);
    run
}

fn repo_file(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn readme_library_block_is_the_closure_handler_example() {
    let readme = repo_file("README.md");
    let section = readme
        .split_once("\n## Library\n")
        .expect("README has a Library section")
        .1;
    let block = section
        .split_once("```rust\n")
        .expect("the Library section has a rust block")
        .1
        .split_once("\n```")
        .expect("the block is closed")
        .0;
    assert_eq!(
        format!("{block}\n"),
        repo_file("examples/closure_handler.rs"),
        "README's Library block and examples/closure_handler.rs differ"
    );
}

/// The command of README's shell block under the heading `heading`, split into its words.
fn readme_command(heading: &str) -> Vec<String> {
    let readme = repo_file("README.md");
    let section = readme
        .split_once(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("README has a section {heading:?}"))
        .1;
    let block = section
        .split_once("```sh\n")
        .expect("the section has a shell block")
        .1
        .split_once("\n```")
        .expect("the block is closed")
        .0;
    shlex::split(&block.replace("\\\n", " ")).expect("the block is one command")
}

#[test]
fn readme_paginated_command_follows_every_page_of_each_id() {
    let h = Harness::new(ApiConfig::fast());
    let ids = vec!["p250-a".to_string(), "p7-b".to_string()];
    let input = h.ids_file("users.txt", &ids);
    let state = h.state();
    // Its flags as written; its input, state and API (a `Link` route, 100 a page) this test's.
    let url = format!("{}?per_page=100", h.api.pages_link_url_template());
    let mut args = readme_command("Lists spread over pages");
    assert_eq!(args[..2], ["highwater", "run"], "{args:?}");
    for (flag, value) in [
        ("--input", p(&input)),
        ("--state", p(&state)),
        ("--url", &url),
    ] {
        let at = args.iter().position(|a| a == flag).expect(flag) + 1;
        args[at] = value.to_string();
    }
    let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    h.run_env(&args, &[("GH_TOKEN", "a-token")], &[])
        .expect_code(0);
    let export = h.export(&state);
    assert_eq!(export.len(), ids.len());
    for (record, id) in export.iter().zip(&ids) {
        assert_eq!(record["id"], id.as_str());
        let items = record["body"].as_array().expect("the items");
        assert_eq!(
            items.len(),
            h.api.page_items(id).len(),
            "{id}: every page's"
        );
        let picked = serde_json::json!({"name": null, "stars": null});
        assert!(items.iter().all(|item| *item == picked), "{items:?}");
    }
}

#[test]
fn the_closure_handler_example_squares_and_reads_back() {
    let run = run_example("closure_handler", &[]);
    let mut expected = String::from("ok 990 failed 10\n");
    for n in (100..=1000).step_by(100) {
        expected.push_str(&format!("{n} failed: {n} is refused\n"));
    }
    // 1² + ... + 1000², less the ten refused.
    expected.push_str("sum of squares 329983500\n");
    assert_eq!(run.stdout, expected);
}

#[test]
fn the_http_example_enriches_ids_from_a_loopback_api() {
    let run = run_example("http_enrichment", &[]);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[1], "records 500", "{}", run.stdout);
    assert_eq!(lines[2], "answers match the API: true");
    let (ok, failed) = lines[0]
        .strip_prefix("ok ")
        .and_then(|l| l.split_once(" failed "))
        .expect("the summary line");
    let (ok, failed): (u64, u64) = (ok.parse().unwrap(), failed.parse().unwrap());
    assert_eq!(ok + failed, 500);
    assert!(failed > 0, "5% of the IDs are missing");
    assert_eq!(
        lines[3],
        format!("failures are its {failed} missing IDs: true")
    );
    assert!(lines[4].ends_with("for 500 IDs"), "{}", lines[4]);
}

#[test]
fn the_exec_example_runs_a_process_per_id() {
    let run = run_example("exec_job", &[]);
    let sevens: Vec<String> = (7..=49)
        .step_by(7)
        .map(|n| format!("{n} failed: {n} is a multiple of 7"))
        .collect();
    let mut expected = vec![
        "ok 43 failed 7".to_string(),
        r#"1 -> {"id":"1","tripled":3}"#.into(),
        r#"2 -> {"id":"2","tripled":6}"#.into(),
    ];
    expected.extend(sevens);
    expected.push(r#"50 -> {"id":"50","tripled":150}"#.into());
    assert_eq!(run.stdout.lines().collect::<Vec<_>>(), expected);
}

#[test]
fn the_read_example_reads_its_own_job() {
    let run = run_example("read_results", &[]);
    let mut expected: Vec<String> = (2..=10)
        .step_by(2)
        .map(|n| format!("ok {n} {{\"half\":{}}}", n / 2))
        .collect();
    expected.push("5 ok, 5 failed".into());
    expected.extend(
        (1..=9)
            .step_by(2)
            .map(|n| format!("failed {n} [handler] after 1 attempts: {n} is odd")),
    );
    assert_eq!(run.stdout.lines().collect::<Vec<_>>(), expected);
}

#[test]
fn the_read_example_reads_a_command_line_job_as_its_export_says() {
    let h = Harness::new(ApiConfig::faulty());
    let ids = crate::harness::ids(300);
    let (_input, state) = h.finished_job(&ids, &[]);
    let export = h.export(&state);
    let run = run_example("read_results", &[p(&state)]);
    let oks: Vec<String> = export
        .iter()
        .filter(|r| r["status"] == "ok")
        .map(|r| format!("ok {} {}", r["id"].as_str().unwrap(), r["body"]))
        .collect();
    let failed: Vec<&str> = export
        .iter()
        .filter(|r| r["status"] == "failed")
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert!(!failed.is_empty(), "the faulty API fails some IDs for good");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[..oks.len()], oks[..]);
    assert_eq!(
        lines[oks.len()],
        format!("{} ok, {} failed", oks.len(), failed.len())
    );
    let failure_ids: Vec<&str> = lines[oks.len() + 1..]
        .iter()
        .map(|l| {
            l.strip_prefix("failed ")
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
        })
        .collect();
    let failed_plain: Vec<&str> = failed
        .iter()
        .filter(|id| !id.contains(' '))
        .copied()
        .collect();
    assert_eq!(
        failure_ids
            .iter()
            .filter(|id| failed_plain.contains(id))
            .count(),
        failed_plain.len(),
        "every failure is listed:\n{}",
        run.stdout
    );
    assert_eq!(failure_ids.len(), failed.len());
}

/// The done-when test of the library: a closure-handler job of 10,000 IDs from an
/// iterator, SIGKILLed three times and resumed, has every ID exactly once.
#[test]
fn a_library_job_killed_with_sigkill_and_resumed_has_every_id_once() {
    const N: u64 = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let calls = dir.path().join("calls.txt");
    let count = || {
        std::fs::read_to_string(&calls)
            .map(|s| s.lines().count() as u64)
            .unwrap_or(0)
    };
    let start = || {
        Command::new(example("kill_resume"))
            .args([p(&state), &N.to_string(), p(&calls)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example starts")
    };
    let mut kills = 0;
    for at in [1_500, 4_000, 7_000] {
        let mut child = start();
        let deadline = Instant::now() + Duration::from_secs(120);
        while count() < at && child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "no progress to {at} calls");
            std::thread::sleep(Duration::from_millis(2));
        }
        if child.try_wait().unwrap().is_none() {
            signal(&child, libc::SIGKILL);
            kills += 1;
        }
        let _ = finish(child);
    }
    assert!(
        kills >= 2,
        "the job ran too fast to be killed: {kills} kills"
    );
    let last = finish(start());
    last.expect_code(0);
    assert_eq!(last.stdout, "ok 9990 failed 10\n");

    // Every ID exactly once, in order, by the command line's export of the library's job.
    let export: Run = Command::new(BIN)
        .args(["export", "--state", p(&state)])
        .output()
        .unwrap()
        .into();
    export.expect_code(0);
    let records: Vec<serde_json::Value> = export
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<String> = records
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..N).map(|i| i.to_string()).collect();
    assert_eq!(ids, expected, "every ID once, in input order");
    for r in &records {
        let id = r["id"].as_str().unwrap();
        if id.ends_with("999") {
            assert_eq!(r["status"], "failed", "{r}");
        } else {
            assert_eq!((&r["status"], &r["body"]["id"]), (&"ok".into(), &id.into()));
        }
    }
    // The command line reads the job but cannot run a library program's handler.
    let resume: Run = Command::new(BIN)
        .args(["run", "--state", p(&state)])
        .output()
        .unwrap()
        .into();
    resume
        .expect_code(2)
        .expect_stderr("run by a library program (its handler \"kill-resume\")");
    // Only calls in flight at a kill are repeated.
    let mut per_id: HashMap<String, u32> = HashMap::new();
    for id in std::fs::read_to_string(&calls).unwrap().lines() {
        *per_id.entry(id.to_owned()).or_default() += 1;
    }
    assert_eq!(per_id.len() as u64, N, "every ID was called");
    let repeated = per_id.values().filter(|c| **c > 1).count();
    let bound = kills * highwater::engine::max_unsynced_items(16);
    assert!(
        repeated <= bound,
        "{repeated} IDs called again, at most {bound}"
    );
}
