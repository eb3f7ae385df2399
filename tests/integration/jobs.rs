//! Whole jobs that go right: formats, encodings, bodies, exit codes, status and export.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use highwater::demo::api::{ApiConfig, Fault};
use highwater::engine::max_unsynced_items;
use serde_json::Value;

use crate::harness::*;

/// IDs that need care in a URL, a JSON body or a text file, as they stand in the input
/// (`raw`, with the surrounding whitespace the reader trims) and as the server must see them.
fn awkward_ids() -> Vec<(&'static str, &'static str)> {
    vec![
        ("\u{feff}first", "first"),
        ("  a/b  ", "a/b"),
        ("with space", "with space"),
        ("what?", "what?"),
        ("hash#tag", "hash#tag"),
        ("100%", "100%"),
        ("%2F", "%2F"),
        ("%zz", "%zz"),
        ("a+b", "a+b"),
        ("x&y=z", "x&y=z"),
        ("\tcafé\t", "café"),
        ("日本/語", "日本/語"),
        ("/?#% é+&=", "/?#% é+&="),
        ("tab\tinside", "tab\tinside"),
        ("semi;colon,comma", "semi;colon,comma"),
        ("quote\"and\\backslash", "quote\"and\\backslash"),
        ("{id}", "{id}"),
        ("${HOME}", "${HOME}"),
        ("emoji 🦀", "emoji 🦀"),
        ("last-without-newline", "last-without-newline"),
    ]
}

/// A text input of `awkward_ids` with `\r\n` line endings, blank lines and no final newline.
fn awkward_input(h: &Harness) -> (std::path::PathBuf, Vec<String>) {
    let ids = awkward_ids();
    let mut text = String::new();
    for (n, (raw, _)) in ids.iter().enumerate() {
        text.push_str(raw);
        if n + 1 < ids.len() {
            text.push_str("\r\n");
        }
        if n % 5 == 2 {
            text.push_str("   \r\n\r\n");
        }
    }
    let expected = ids.iter().map(|(_, id)| id.to_string()).collect();
    (h.file("awkward.txt", text), expected)
}

/// Runs the awkward IDs against `url` (plus `extra`) and checks every ID reached the server
/// intact, once, and the export holds the right bodies in input order.
fn check_awkward_ids_reach_the_server(url: impl Fn(&Harness) -> String, extra: &[&str]) {
    let h = Harness::new(ApiConfig::fast());
    let (input, ids) = awkward_input(&h);
    let state = h.state();
    h.run_new(&state, &input, &url(&h), extra)
        .expect_no_panic()
        .expect_code(0);
    for id in &ids {
        assert_eq!(h.api.calls(id), 1, "the server saw {id:?} intact, once");
    }
    assert_eq!(h.api.total_calls(), ids.len() as u64);
    assert_eq!(h.api.distinct_ids(), ids.len());
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
}

#[test]
fn awkward_ids_reach_the_server_intact_in_a_path() {
    check_awkward_ids_reach_the_server(|h| h.url(), &[]);
}

#[test]
fn awkward_ids_reach_the_server_intact_in_a_query() {
    check_awkward_ids_reach_the_server(|h| h.api.query_url_template(), &[]);
}

#[test]
fn awkward_ids_reach_the_server_intact_in_a_post_body() {
    check_awkward_ids_reach_the_server(
        |h| h.api.post_url(),
        &["--method", "POST", "--body", r#"{"id":"{id}"}"#],
    );
}

/// The same with `{id}` in the URL as well (the server reads the ID from the body): checks
/// the body's JSON escaping even where a URL without `{id}` is refused.
#[test]
fn awkward_ids_reach_the_server_intact_in_a_post_body_with_the_id_in_the_url_too() {
    check_awkward_ids_reach_the_server(
        |h| format!("{}?ref={{id}}", h.api.post_url()),
        &["--method", "POST", "--body", r#"{"id":"{id}"}"#],
    );
}

/// A line that is blank once trimmed (a byte-order mark alone, as editors write before an
/// empty first line; a no-break space) is a blank line: skipped, never an empty ID.
#[test]
fn lines_blank_after_trimming_are_skipped_not_called_as_empty_ids() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.file(
        "ids.txt",
        "\u{feff}\r\nid-1\r\n\u{a0}\r\n\u{2003}\u{a0}\t\r\nid-2\r\n",
    );
    let state = h.state();
    let run = h.run_new(&state, &input, &h.url(), &[]);
    run.expect_no_panic();
    let export = h.export(&state);
    let ids: Vec<&str> = export.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["id-1", "id-2"], "{export:?}");
    run.expect_code(0);
    let status = h.status(&state);
    assert_eq!(status["stats"]["rows_read"], 2, "{status}");
}

/// `.` and `..` are IDs like any other: they must reach the server as themselves, or fail
/// without a request, never be sent to another path (`/items/..` is `/`).
#[test]
fn dot_ids_are_not_sent_to_another_path() {
    let h = Harness::new(ApiConfig::fast());
    let ids: Vec<String> = [".", "..", "...", "a/..", "../b", "plain"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let run = h.run_new(&state, &input, &h.url(), &[]);
    run.expect_no_panic();
    let export = h.export(&state);
    assert_eq!(export.len(), ids.len(), "{export:?}");
    let mut wrong = Vec::new();
    for record in &export {
        let id = record["id"].as_str().unwrap();
        let ok = record["status"] == "ok"
            && record["body"] == h.api.expected_body(id)
            && h.api.calls(id) == 1;
        let refused_unsent = record["status"] == "failed"
            && record["error_class"] == "request"
            && h.api.calls(id) == 0;
        if !ok && !refused_unsent {
            wrong.push(format!("{id:?}: {record}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "IDs sent elsewhere or answered for another resource:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn text_answers_are_stored_as_json_strings() {
    let h = Harness::new(ApiConfig::fast());
    let ids: Vec<String> = ["text:hello", "json-one", "text:with space/é", "text:"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for id in &ids {
        assert_eq!(h.api.fault(id), Fault::None);
    }
    let (_, state) = h.finished_job(&ids, &[]);
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    for record in &export {
        let id = record["id"].as_str().unwrap();
        if id.starts_with("text:") {
            assert_eq!(
                record["body"],
                Value::String(format!("plain {id}")),
                "{record}"
            );
        } else {
            assert!(record["body"].is_object(), "{record}");
        }
    }
}

#[test]
fn csv_input_with_quotes_commas_and_a_bom() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.file(
        "people.csv",
        "\u{feff}id,name,note\r\n\
         abc-1,\"Smith, John\",\"a,b\"\r\n\
         \"id,with,commas\",x,y\r\n\
         \r\n\
         \"quoted \"\"inner\"\" id\",x,\"multi\nline\"\r\n\
         \x20 spaced \x20,x,y\r\n\
         café/1,x,y\r\n\
         abc-1,again,dup\r\n\
         last,x,y",
    );
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--id-column", "id"])
        .expect_no_panic()
        .expect_code(0);
    let ids: Vec<String> = [
        "abc-1",
        "id,with,commas",
        "quoted \"inner\" id",
        "spaced",
        "café/1",
        "abc-1",
        "last",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    h.check_export_exactly_once(&h.export(&state), &ids);
    for id in &ids {
        assert_eq!(h.api.calls(id), 1, "{id}");
    }
    let status = h.status(&state);
    assert_eq!(status["stats"]["duplicates"], 1, "{status}");
    assert_eq!(status["stats"]["rows_read"], 7, "{status}");
    assert_eq!(status["input"], canonical(&input), "{status}");
    assert!(
        status["input_format"].as_str().unwrap().starts_with("csv"),
        "{status}"
    );
}

#[test]
fn jsonl_input_with_string_and_number_ids() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.file(
        "rows.jsonl",
        "{\"id\":\"a-1\",\"x\":1}\n\
         {\"id\": 42}\n\
         \n\
         {\"other\":\"z\",\"id\":\"x/y é\"}\r\n\
         \x20 {\"id\": -7, \"nested\": {\"id\": \"no\"}}  \n\
         {\"id\":\"a-1\"}\n\
         {\"id\":\"quote\\\"d\"}",
    );
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--id-field", "id"])
        .expect_no_panic()
        .expect_code(0);
    let ids: Vec<String> = ["a-1", "42", "x/y é", "-7", "a-1", "quote\"d"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    h.check_export_exactly_once(&h.export(&state), &ids);
    for id in &ids {
        assert_eq!(h.api.calls(id), 1, "{id}");
    }
    assert_eq!(h.status(&state)["stats"]["duplicates"], 1);
}

#[test]
fn duplicates_are_called_once_and_counted() {
    let h = Harness::new(ApiConfig::fast());
    let ids: Vec<String> = ["a", "b", "a", "c", "b", "a", "d", "  a  ", "e", "c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Bucket size 3: the repeats fall in the same bucket and in later ones.
    let (_, state) = h.finished_job(&ids, &["--bucket-size", "3"]);
    let trimmed: Vec<String> = ids.iter().map(|s| s.trim().to_string()).collect();
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &trimmed);
    for id in ["a", "b", "c", "d", "e"] {
        assert_eq!(h.api.calls(id), 1, "{id}");
    }
    assert_eq!(h.api.total_calls(), 5);
    let status = h.status(&state);
    assert_eq!(status["stats"]["duplicates"], 5, "{status}");
    assert_eq!(status["stats"]["ids_planned"], 5, "{status}");
    assert_eq!(status["stats"]["rows_read"], 10, "{status}");
    assert_eq!(status["stats"]["buckets_planned"], 4, "{status}");
    // The first occurrence decides the bucket.
    let buckets: Vec<u64> = export
        .iter()
        .map(|r| r["bucket"].as_u64().unwrap())
        .collect();
    assert_eq!(buckets, vec![0, 0, 1, 2, 2]);
}

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
