//! What calls cost: the usage an answer reports (a language model's tokens) is kept with
//! each ID's result, carried by the export, and added up for the job across a kill, a
//! resume and a rerun, in `status` and in the run's progress events.

use std::process::Stdio;
use std::time::{Duration, Instant};

use highwater::demo::api::ApiConfig;
use serde_json::Value;

use crate::harness::*;

/// A command that answers like a language model: ID `n` costs `n` input tokens and 1 output
/// token.
const PROGRAM: &str = r#"sleep 0.005
printf '{"n":%s,"usage":{"prompt_tokens":%s,"completion_tokens":1,"total_tokens":%s}}\n' "$1" "$1" "$(($1 + 1))"
"#;

fn usage(v: &Value) -> (u64, u64) {
    (
        v["input"].as_u64().unwrap_or(0),
        v["output"].as_u64().unwrap_or(0),
    )
}

#[test]
fn what_each_call_cost_is_kept_with_its_result_and_added_up_for_the_job() {
    let h = Harness::new(ApiConfig::fast());
    let script = h.file("llm.sh", PROGRAM);
    let n = 2000u64;
    let ids: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let command = format!("sh {} {{id}}", p(&script));
    let create = [
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        &command,
        "--bucket-size",
        "50",
        "--concurrency",
        "2",
    ];
    // Killed once results are stored, then resumed to the end.
    let mut child = h
        .cmd(&create)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let live = std::fs::read_to_string(state.join("live.json")).unwrap_or_default();
        let done = serde_json::from_str::<Value>(&live)
            .ok()
            .and_then(|v| v["ok"].as_u64())
            .unwrap_or(0);
        if done >= 100 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run never stored 100 results"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, libc::SIGKILL);
    assert!(child.wait().unwrap().code().is_none(), "killed mid-run");
    let resumed = h.run(&[
        "run",
        "--state",
        p(&state),
        "--log-format",
        "json",
        "--progress-interval",
        "1s",
    ]);
    resumed.expect_code(0);

    // Each ID's usage with its result: what its answer said, once.
    let rows = h.export(&state);
    assert_eq!(rows.len() as u64, n);
    for row in &rows {
        let id: u64 = row["id"].as_str().unwrap().parse().unwrap();
        assert_eq!(usage(&row["usage"]), (id, 1), "{row}");
    }
    // The job's total, from the commit records.
    let all = n * (n + 1) / 2;
    let status = h.status(&state);
    assert_eq!(usage(&status["stats"]["usage"]), (all, n), "{status}");
    let text = h.run(&["status", "--state", p(&state)]);
    assert!(
        text.stdout
            .contains(&format!("usage:      {all} in + {n} out")),
        "{}",
        text.stdout
    );
    // The resumed run's last progress event: the job's usage, and the run's own part.
    let last: Value = resumed
        .stderr
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "progress")
        .expect("a progress event");
    assert_eq!(usage(&last["usage"]), (all, n), "{last}");
    let (run_in, run_out) = usage(&last["run_usage"]);
    assert!(run_out > 0 && run_out < n, "{last}");
    assert!(run_in < all, "{last}");

    // A rerun calls bucket 0's IDs again: what they cost adds up, with each ID and the job.
    h.run(&[
        "rerun",
        "--state",
        p(&state),
        "--buckets",
        "0",
        "--all-items",
    ])
    .expect_code(0);
    let again: u64 = (1..=50).sum();
    let status = h.status(&state);
    assert_eq!(
        usage(&status["stats"]["usage"]),
        (all + again, n + 50),
        "{status}"
    );
    for row in h.export(&state).iter().take(60) {
        let id: u64 = row["id"].as_str().unwrap().parse().unwrap();
        let times = if id <= 50 { 2 } else { 1 };
        assert_eq!(usage(&row["usage"]), (id * times, times), "{row}");
    }
}

/// Answers that report no usage leave no trace: no usage in the export, the status or the
/// progress events.
#[test]
fn answers_without_usage_cost_nothing_to_report() {
    let h = Harness::new(ApiConfig::fast());
    let (_, state) = h.finished_job(&ids(50), &[]);
    assert!(h.export(&state).iter().all(|r| r.get("usage").is_none()));
    let status = h.status(&state);
    assert!(status["stats"].get("usage").is_none(), "{status}");
    assert!(!h
        .run(&["status", "--state", p(&state)])
        .stdout
        .contains("usage:"));
}
