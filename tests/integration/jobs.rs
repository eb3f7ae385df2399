//! Whole jobs that go right: exit codes, transient faults, status and export.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use highwater::demo::api::{ApiConfig, Fault};
use serde_json::Value;

use crate::harness::*;

// ---------------------------------------------------------------------------
// Exit codes and failures

#[test]
fn exit_0_when_every_id_succeeds() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(500);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &[])
        .expect_no_panic()
        .expect_code(0)
        .expect_stderr("job finished");
    h.check_export_exactly_once(&h.export(&state), &ids);
    assert_eq!(h.api.total_calls(), 500);
}

#[test]
fn exit_3_when_some_ids_fail_with_their_status_error_and_attempts() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 100,
        ..ApiConfig::fast()
    });
    let ids = ids(500);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &[])
        .expect_no_panic()
        .expect_code(3);
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    let failed: Vec<&Value> = export.iter().filter(|r| r["status"] == "failed").collect();
    assert!(!failed.is_empty());
    for r in &failed {
        let id = r["id"].as_str().unwrap();
        assert_eq!(h.api.fault(id), Fault::NotFound, "{r}");
        assert_eq!(r["http_status"], 404, "{r}");
        assert_eq!(r["error_class"], "http", "{r}");
        assert!(r["error"].as_str().unwrap().contains("404"), "{r}");
        assert_eq!(r["attempts"], 1, "a 404 is not retried: {r}");
        assert_eq!(h.api.calls(id), 1, "{r}");
        assert!(r.get("body").is_none(), "{r}");
    }
    for r in export.iter().filter(|r| r["status"] == "ok") {
        assert_eq!(r["http_status"], 200, "{r}");
        assert_eq!(r["attempts"], 1, "{r}");
        assert!(r.get("error").is_none(), "{r}");
    }
    let status = h.status(&state);
    assert_eq!(status["stats"]["failed"], failed.len(), "{status}");
    assert_eq!(status["stats"]["ok"], 500 - failed.len(), "{status}");
}

/// `ids(n)`, checked to hold every fault of `config`.
fn ids_with_every_fault(h: &Harness, n: usize) -> Vec<String> {
    let ids = ids(n);
    for f in [
        Fault::None,
        Fault::NotFound,
        Fault::Unavailable,
        Fault::Drop,
        Fault::Slow,
    ] {
        assert!(
            ids.iter().any(|id| h.api.fault(id) == f),
            "no ID with {f:?} in {n}"
        );
    }
    ids
}

fn faulty() -> ApiConfig {
    ApiConfig {
        slow_delay: Duration::from_secs(2),
        ..ApiConfig::faulty()
    }
}

#[test]
fn transient_faults_fail_after_one_attempt_with_max_attempts_1() {
    let h = Harness::new(faulty());
    let ids = ids_with_every_fault(&h, 600);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    h.run_new(
        &state,
        &input,
        &h.url(),
        &["--max-attempts", "1", "--timeout", "500ms"],
    )
    .expect_no_panic()
    .expect_code(3);
    let export = h.export(&state);
    assert_eq!(export.len(), ids.len());
    for r in &export {
        let id = r["id"].as_str().unwrap();
        assert_eq!(r["attempts"], 1, "{r}");
        assert_eq!(h.api.calls(id), 1, "{r}");
        match h.api.fault(id) {
            Fault::None => assert_eq!(r["status"], "ok", "{r}"),
            Fault::NotFound => assert_eq!(r["http_status"], 404, "{r}"),
            Fault::Unavailable => {
                assert_eq!(r["status"], "failed", "{r}");
                assert_eq!(r["http_status"], 503, "{r}");
                assert_eq!(r["error_class"], "http", "{r}");
                assert!(r["error"].as_str().unwrap().contains("503"), "{r}");
            }
            Fault::Drop => {
                assert_eq!(r["status"], "failed", "{r}");
                assert_eq!(r["error_class"], "connection", "{r}");
                assert!(r["http_status"].is_null(), "{r}");
                assert!(!r["error"].as_str().unwrap().is_empty(), "{r}");
            }
            Fault::Slow => {
                assert_eq!(r["status"], "failed", "{r}");
                assert_eq!(r["error_class"], "timeout", "{r}");
            }
            Fault::Throttled => panic!("faulty() answers no 429: {r}"),
        }
    }
}

#[test]
fn transient_faults_heal_with_default_attempts() {
    let h = Harness::new(faulty());
    let ids = ids_with_every_fault(&h, 600);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--timeout", "500ms"])
        .expect_no_panic()
        .expect_code(3); // the 404s
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    let transient = h.api.config().transient_attempts + 1;
    for r in &export {
        let id = r["id"].as_str().unwrap();
        let expected = match h.api.fault(id) {
            Fault::None | Fault::NotFound => 1,
            Fault::Unavailable | Fault::Drop | Fault::Slow | Fault::Throttled => transient,
        };
        assert_eq!(r["attempts"], expected, "{r}");
        assert_eq!(h.api.calls(id), u64::from(expected), "{r}");
    }
}

// ---------------------------------------------------------------------------
// Export

const CSV_HEADER: [&str; 8] = [
    "id",
    "status",
    "http_status",
    "body",
    "error",
    "error_class",
    "attempts",
    "bucket",
];

/// Parse a CSV export and check it against the JSONL export of the same state.
fn check_csv_export(h: &Harness, path: &Path, jsonl: &[Value]) {
    let mut reader = csv::Reader::from_path(path).unwrap();
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_string)
        .collect();
    assert_eq!(header, CSV_HEADER);
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), jsonl.len(), "one row per unique ID");
    for (row, record) in rows.iter().zip(jsonl) {
        assert_eq!(row.len(), 8, "{row:?}");
        let id = &row[0];
        assert_eq!(id, record["id"].as_str().unwrap());
        assert_eq!(&row[1], record["status"].as_str().unwrap(), "{row:?}");
        assert_eq!(
            row[6].parse::<u64>().unwrap(),
            record["attempts"],
            "{row:?}"
        );
        assert_eq!(row[7].parse::<u64>().unwrap(), record["bucket"], "{row:?}");
        match &row[1] {
            "ok" => {
                assert_eq!(&row[2], "200", "{row:?}");
                let body: Value = serde_json::from_str(&row[3]).expect("body is JSON");
                assert_eq!(body, h.api.expected_body(id), "{row:?}");
                assert_eq!(body, record["body"]);
                assert!(row[4].is_empty() && row[5].is_empty(), "{row:?}");
            }
            "failed" => {
                assert_eq!(&row[2], "404", "{row:?}");
                assert!(row[3].is_empty(), "{row:?}");
                let error: Value = serde_json::from_str(&row[4]).expect("error is JSON");
                assert_eq!(error, record["error"], "{row:?}");
                assert_eq!(&row[5], "http", "{row:?}");
            }
            other => panic!("status {other:?} in {row:?}"),
        }
    }
}

#[test]
fn export_csv_to_a_file_parses_and_leaves_no_temp_files() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 100,
        ..ApiConfig::fast()
    });
    let mut ids = ids(400);
    let repeated = ids[3].clone();
    ids.extend(["text:plain, with comma".to_string(), repeated]);
    let (input, state) = h.finished_job(&ids, &["--bucket-size", "64"]);
    let jsonl = h.export(&state);
    h.check_export_exactly_once(&jsonl, &ids);

    let out = h.path("out");
    std::fs::create_dir(&out).unwrap();
    let csv_path = out.join("results.csv");
    for _ in 0..2 {
        // The second time replaces the first.
        h.run(&[
            "export",
            "--state",
            p(&state),
            "--format",
            "csv",
            "--output",
            p(&csv_path),
        ])
        .expect_no_panic()
        .expect_code(0)
        .expect_stderr(&format!("wrote {} records", jsonl.len()));
        check_csv_export(&h, &csv_path, &jsonl);
        assert_eq!(dir_entries(&out), vec!["results.csv"]);
    }

    // JSONL to a file: the same as standard output.
    let jsonl_path = out.join("results.jsonl");
    h.run(&["export", "--state", p(&state), "--output", p(&jsonl_path)])
        .expect_no_panic()
        .expect_code(0);
    let from_file: Vec<Value> = std::fs::read_to_string(&jsonl_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(from_file, jsonl);
    assert_eq!(dir_entries(&out), vec!["results.csv", "results.jsonl"]);

    // Export does not need the input file.
    std::fs::remove_file(&input).unwrap();
    assert_eq!(h.export(&state), jsonl);
}

#[test]
fn export_of_a_killed_job_has_only_final_records() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(6),
        not_found_per_mille: 50,
        ..ApiConfig::fast()
    });
    let ids = ids(2000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url, "--concurrency", "8", "--bucket-size", "100"]);
    args.extend(QUICK);
    let mut child = h.spawn(&args);
    assert!(h.wait_for_calls(&mut child, 600), "the run ended early");
    child.kill().unwrap();
    child.wait().unwrap();

    let export = h.export(&state);
    assert!(!export.is_empty() && export.len() < ids.len());
    let mut seen = HashSet::new();
    let position: std::collections::HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut last = None;
    for r in &export {
        let id = r["id"].as_str().unwrap();
        assert!(seen.insert(id), "{id} exported twice");
        assert!(r["status"] == "ok" || r["status"] == "failed", "{r}");
        h.check_record(r);
        let at = position[id];
        assert!(last < Some(at), "the export is in input order");
        last = Some(at);
    }
    let status = h.status(&state);
    assert_eq!(status["finished"], false, "{status}");
    let done =
        status["stats"]["ok"].as_u64().unwrap() + status["stats"]["failed"].as_u64().unwrap();
    assert_eq!(done, export.len() as u64, "{status}");

    let csv_path = h.path("partial.csv");
    h.run(&[
        "export",
        "--state",
        p(&state),
        "--format",
        "csv",
        "--output",
        p(&csv_path),
    ])
    .expect_no_panic()
    .expect_code(0);
    check_csv_export(&h, &csv_path, &export);
}

// ---------------------------------------------------------------------------
// Status and re-runs

#[test]
fn status_of_a_finished_job() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 50,
        ..ApiConfig::fast()
    });
    let mut ids = ids(1000);
    for i in [10, 500, 999] {
        ids[i] = ids[i - 7].clone();
    }
    let unique = ids.iter().collect::<HashSet<_>>().len();
    let (input, state) = h.finished_job(&ids, &["--bucket-size", "64"]);
    let export = h.export(&state);
    let failed = export.iter().filter(|r| r["status"] == "failed").count();
    let ok = unique - failed;
    let buckets = 1000usize.div_ceil(64);

    let s = h.status(&state);
    assert_eq!(s["finished"], true, "{s}");
    assert_eq!(s["input"], canonical(&input), "{s}");
    assert_eq!(s["url"], h.url(), "{s}");
    assert_eq!(s["method"], "GET", "{s}");
    assert_eq!(s["bucket_size"], 64, "{s}");
    assert_eq!(s["input_format"], "text", "{s}");
    let st = &s["stats"];
    assert_eq!(st["buckets_planned"], buckets, "{s}");
    assert_eq!(st["buckets_committed"], buckets, "{s}");
    assert_eq!(st["buckets_in_flight"], 0, "{s}");
    assert_eq!(st["rows_read"], 1000, "{s}");
    assert_eq!(st["ids_planned"], unique, "{s}");
    assert_eq!(st["ok"], ok, "{s}");
    assert_eq!(st["failed"], failed, "{s}");
    assert_eq!(st["pending"], 0, "{s}");
    assert_eq!(st["duplicates"], 3, "{s}");
    assert_eq!(st["bad_lines"], 0, "{s}");
    assert_eq!(st["input_exhausted"], true, "{s}");
    assert_eq!(s["bad_line_examples"], serde_json::json!([]), "{s}");

    let text = h.run(&["status", "--state", p(&state)]);
    text.expect_no_panic().expect_code(0);
    for needle in [
        format!("{buckets} planned, {buckets} committed, 0 in flight (size 64)"),
        format!("{ok} ok, {failed} failed, 0 pending of {unique} planned"),
        "duplicates: 3".to_string(),
        "finished:   yes".to_string(),
        "1000 rows read to the end".to_string(),
        canonical(&input),
    ] {
        assert!(
            text.stdout.contains(&needle),
            "{needle:?} in\n{}",
            text.stdout
        );
    }
}

#[test]
fn rerunning_a_finished_job_makes_no_calls_and_repeats_its_exit_code() {
    for (config, code) in [
        (ApiConfig::fast(), 0),
        (
            ApiConfig {
                not_found_per_mille: 100,
                ..ApiConfig::fast()
            },
            3,
        ),
    ] {
        let h = Harness::new(config);
        let ids = ids(200);
        let input = h.ids_file("ids.txt", &ids);
        let state = h.state();
        h.run_new(&state, &input, &h.url(), &[]).expect_code(code);
        let calls = h.api.total_calls();
        let export = h.export(&state);
        h.resume(&state, &[])
            .expect_no_panic()
            .expect_code(code)
            .expect_stderr("already finished");
        h.run_new(&state, &input, &h.url(), &[])
            .expect_no_panic()
            .expect_code(code);
        assert_eq!(h.api.total_calls(), calls);
        assert_eq!(h.export(&state), export);
    }
}
