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
    // The CSV and Parquet exports carry it in two columns of their own.
    let csv = h.run(&["export", "--state", p(&state), "--format", "csv"]);
    csv.expect_code(0);
    let mut reader = csv::Reader::from_reader(csv.stdout.as_bytes());
    let header = reader.headers().unwrap().clone();
    let at = |name: &str| header.iter().position(|c| c == name).expect(name);
    let (input_at, output_at) = (at("usage_input"), at("usage_output"));
    assert_eq!(input_at, at("bucket") + 1);
    for record in reader.records() {
        let record = record.unwrap();
        assert_eq!(record[input_at], record[0], "ID n costs n in");
        assert_eq!(&record[output_at], "1");
    }
    let parquet = h.path("usage.parquet");
    h.run(&[
        "export",
        "--state",
        p(&state),
        "--format",
        "parquet",
        "--output",
        p(&parquet),
    ])
    .expect_code(0);
    {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::record::Field;
        let file = SerializedFileReader::new(std::fs::File::open(&parquet).unwrap()).unwrap();
        let mut rows = 0u64;
        for row in file.get_row_iter(None).unwrap() {
            let row = row.unwrap();
            let get = |name: &str| {
                row.get_column_iter()
                    .find(|(n, _)| n.as_str() == name)
                    .map(|(_, v)| v.clone())
                    .expect(name)
            };
            let Field::Str(id) = get("id") else {
                panic!("id")
            };
            let id: i64 = id.parse().unwrap();
            assert_eq!(get("usage_input"), Field::Long(id));
            assert_eq!(get("usage_output"), Field::Long(1));
            rows += 1;
        }
        assert_eq!(rows, n);
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
    // Nor do the CSV's columns change.
    let csv = h.run(&["export", "--state", p(&state), "--format", "csv"]);
    assert!(
        csv.stdout
            .starts_with("id,status,http_status,body,error,error_class,attempts,bucket\n"),
        "{}",
        csv.stdout
    );
    let status = h.status(&state);
    assert!(status["stats"].get("usage").is_none(), "{status}");
    assert!(!h
        .run(&["status", "--state", p(&state)])
        .stdout
        .contains("usage:"));
}

/// An API metered otherwise (credits in its body, or in a header) is read by the job's own
/// usage program, with `$headers` bound; a program that fails on an answer leaves that
/// call's cost unknown, with one warning, and fails no ID.
#[test]
fn a_usage_program_reads_what_another_api_counts() {
    let h = Harness::new(ApiConfig::fast());
    // A command whose answers say what they cost in credits: ID n costs n credits.
    let script = h.file(
        "credits.sh",
        "printf '{\"n\":%s,\"meta\":{\"credits\":%s}}\\n' \"$1\" \"$1\"\n",
    );
    let ids: Vec<String> = (1..=40).map(|i| i.to_string()).collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let command = format!("sh {} {{id}}", p(&script));
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        &command,
        "--usage",
        ".meta.credits",
    ])
    .expect_code(0);
    let export = h.export(&state);
    for (i, record) in export.iter().enumerate() {
        assert_eq!(record["usage"]["input"], (i + 1) as u64, "{record}");
    }
    let status = h.status(&state);
    assert_eq!(status["stats"]["usage"]["input"], 40 * 41 / 2, "{status}");

    // An HTTP API's header, by `$headers`; a program that fails says so once and fails
    // nothing.
    let state = h.path("http");
    h.run_new(
        &state,
        &input,
        &h.url(),
        &["--usage", r#"$headers["content-length"] | tonumber"#],
    )
    .expect_code(0);
    let export = h.export(&state);
    assert!(export
        .iter()
        .all(|r| r["usage"]["input"].as_u64().unwrap() > 0));
    let broken = h.path("broken");
    let run = h.run_new(
        &broken,
        &input,
        &h.url(),
        &["--usage", ".no.such | tonumber"],
    );
    run.expect_code(0)
        .expect_stderr("that call's cost is not counted");
    assert_eq!(
        run.stderr
            .matches("that call's cost is not counted")
            .count(),
        1,
        "{}",
        run.stderr
    );
    assert!(h.status(&broken)["stats"].get("usage").is_none());
}

/// The job's own estimate of a call is what a token quota takes of it before the call:
/// one above a whole window stops the run at once, naming the quota.
#[test]
fn an_estimate_program_is_what_a_call_takes_of_a_token_quota() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(10));
    let state = h.state();
    h.run_new(
        &state,
        &input,
        &h.url(),
        &[
            "--quota",
            "1000tokens/1min",
            "--estimate",
            "{input: 1500, output: 10}",
        ],
    )
    .expect_refused(1, &["expected to cost 1510 tokens", "1000tokens/1min"]);
    assert_eq!(h.api.total_calls(), 0);
    // A smaller estimate goes through, and the change is kept in the job's history.
    h.resume(&state, &["--estimate", "{input: 10}"])
        .expect_code(0);
    let status = h.status(&state);
    assert!(
        status.to_string().contains("estimate changed from"),
        "{status}"
    );
}
