//! Failures and targeted reruns: the error table, `rerun`, grown input, spec changes.
//!
//! The fake API makes chosen IDs fail for their first two attempts (503 or a dropped
//! connection) and heal on the third: a run with `--max-attempts 2` leaves them failed, and
//! a rerun finds the server healed. Its per-ID call counter proves what was called.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use highwater::demo::api::{ApiConfig, Fault};
use highwater::engine::max_unsynced_items;
use serde_json::Value;

use crate::harness::*;

/// 10% of IDs answer 503 and 5% drop the connection, for two attempts, then heal.
fn healing() -> ApiConfig {
    ApiConfig {
        unavailable_per_mille: 100,
        drop_per_mille: 50,
        transient_attempts: 2,
        seed: 7,
        ..ApiConfig::fast()
    }
}

/// Flags that leave the healing IDs failed after one run.
const FAIL_FAST: [&str; 6] = [
    "--max-attempts",
    "2",
    "--adaptive",
    "off",
    "--bucket-size",
    "50",
];

/// A finished job over `n` IDs whose healing IDs failed: (ids, state).
fn failed_job(h: &Harness, n: usize) -> (Vec<String>, std::path::PathBuf) {
    let ids = ids(n);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &FAIL_FAST)
        .expect_code(3);
    (ids, state)
}

/// The IDs that failed, in input order, with their class, read from the export. Each is one
/// the server fails at first (503: class http; a dropped connection: class connection), and
/// every other ID is ok. (Not every such ID fails: an attempt during what the throttle takes
/// for an outage is free, so some get a third attempt and succeed.)
#[track_caller]
fn actual_failures(
    h: &Harness,
    state: &std::path::Path,
    ids: &[String],
) -> Vec<(String, &'static str)> {
    let export = h.export(state);
    assert_eq!(export.len(), ids.len());
    let mut out = Vec::new();
    for r in &export {
        let id = r["id"].as_str().unwrap();
        let class = match h.api.fault(id) {
            Fault::Unavailable => "http",
            Fault::Drop => "connection",
            _ => {
                assert_eq!(r["status"], "ok", "{r}");
                continue;
            }
        };
        if r["status"] == "failed" {
            assert_eq!(r["error_class"], class, "{r}");
            out.push((id.to_string(), class));
        }
    }
    out
}

fn rerun(h: &Harness, state: &std::path::Path, extra: &[&str]) -> Run {
    let mut args = vec!["rerun", "--state", p(state)];
    args.extend(QUICK);
    args.extend(["--adaptive", "off"]);
    args.extend_from_slice(extra);
    h.run(&args)
}

/// One record per ID, in input order; ok records carry the server's body; returns how
/// many failed.
#[track_caller]
fn check_once_in_order(h: &Harness, export: &[Value], ids: &[String]) -> usize {
    let exported: Vec<&str> = export.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(exported, ids.iter().map(String::as_str).collect::<Vec<_>>());
    let mut failed = 0;
    for r in export {
        if r["status"] == "ok" {
            assert_eq!(
                r["body"],
                h.api.expected_body(r["id"].as_str().unwrap()),
                "{r}"
            );
        } else {
            failed += 1;
        }
    }
    failed
}

fn jsonl(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect()
}

fn failures(h: &Harness, state: &std::path::Path, extra: &[&str]) -> Run {
    let mut args = vec!["failures", "--state", p(state)];
    args.extend_from_slice(extra);
    let run = h.run(&args);
    run.expect_code(0);
    run
}

/// The IDs whose call count grew between two snapshots, with the growth.
fn called_since(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(id, n)| {
            let d = n - before.get(id).copied().unwrap_or(0);
            (d > 0).then(|| (id.clone(), d))
        })
        .collect()
}

#[test]
fn failures_are_listed_with_their_class_in_every_format_and_filter() {
    let h = Harness::new(healing());
    let (ids, state) = failed_job(&h, 400);
    let expected = actual_failures(&h, &state, &ids);
    assert!(expected.len() > 20, "the fault shares give enough failures");

    let rows = jsonl(&failures(&h, &state, &["--format", "jsonl"]).stdout);
    let listed: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["error_class"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = expected
        .iter()
        .map(|(id, c)| (id.clone(), c.to_string()))
        .collect();
    assert_eq!(
        listed, want,
        "every failed ID, in input order, with its class"
    );
    for r in &rows {
        // Two counted attempts, and maybe free ones (see actual_failures).
        assert!(r["attempts"].as_u64().unwrap() >= 2, "{r}");
        assert_eq!(
            r["attempt_classes"].as_array().unwrap().len() as u64,
            r["attempts"].as_u64().unwrap(),
            "{r}"
        );
        assert!(
            r["first_attempt"].is_string() && r["last_attempt"].is_string(),
            "{r}"
        );
        assert_eq!(
            r["bucket"],
            ids.iter()
                .position(|i| i == r["id"].as_str().unwrap())
                .unwrap()
                / 50
        );
        if r["error_class"] == "http" {
            assert_eq!(r["http_status"], 503, "{r}");
        }
    }

    // --class and --bucket filter.
    let conn = jsonl(&failures(&h, &state, &["--format", "jsonl", "--class", "connection"]).stdout);
    assert_eq!(
        conn.len(),
        expected.iter().filter(|(_, c)| *c == "connection").count()
    );
    assert!(conn.iter().all(|r| r["error_class"] == "connection"));
    let b3 = jsonl(&failures(&h, &state, &["--format", "jsonl", "--bucket", "3"]).stdout);
    let want3: Vec<&str> = ids[150..200]
        .iter()
        .filter(|id| expected.iter().any(|(e, _)| e == *id))
        .map(String::as_str)
        .collect();
    assert_eq!(
        b3.iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        want3
    );

    // CSV: a header and one record per failure; the table names every failed ID.
    let csv = failures(&h, &state, &["--format", "csv"]).stdout;
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    assert_eq!(&reader.headers().unwrap()[0], "id");
    let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), expected.len());
    assert_eq!(&records[0][0], expected[0].0.as_str());
    let table = failures(&h, &state, &[]).stdout;
    assert!(table.starts_with("ID"), "{table}");
    for (id, class) in &expected {
        let line = table.lines().find(|l| l.starts_with(id.as_str())).unwrap();
        assert!(line.contains(class), "{line}");
    }
    // A wrong class is refused, naming the flag.
    h.run(&["failures", "--state", p(&state), "--class", "nope"])
        .expect_refused(2, &["--class", "nope"]);

    // status: failed buckets and counts by class.
    let status = h.status(&state);
    let failed_buckets: BTreeSet<u64> = expected
        .iter()
        .map(|(id, _)| (ids.iter().position(|i| i == id).unwrap() / 50) as u64)
        .collect();
    let listed: BTreeSet<u64> = status["failures"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    assert_eq!(listed, failed_buckets, "{status}");
    assert_eq!(status["failures"]["buckets_total"], failed_buckets.len());
    let by_class = &status["failures"]["by_class"];
    for class in ["http", "connection"] {
        assert_eq!(
            by_class[class],
            expected.iter().filter(|(_, c)| *c == class).count(),
            "{status}"
        );
    }
    let text = h.run(&["status", "--state", p(&state)]);
    text.expect_code(0);
    assert!(
        text.stdout.contains("committed with failures"),
        "{}",
        text.stdout
    );

    // export --status filters.
    let out = h.run(&["export", "--state", p(&state), "--status", "failed"]);
    assert_eq!(jsonl(&out.stdout).len(), expected.len());
    let out = h.run(&["export", "--state", p(&state), "--status", "ok"]);
    let ok = jsonl(&out.stdout);
    assert_eq!(ok.len(), ids.len() - expected.len());
    assert!(ok.iter().all(|r| r["status"] == "ok"));
}

#[test]
fn rerun_failed_after_the_server_heals_calls_exactly_the_failed_ids_once() {
    let h = Harness::new(healing());
    let (ids, state) = failed_job(&h, 400);
    let expected = actual_failures(&h, &state, &ids);
    let before = h.api.calls_snapshot();

    let run = rerun(&h, &state, &["--failed"]);
    run.expect_code(0);
    let called = called_since(&before, &h.api.calls_snapshot());
    let want: BTreeMap<String, u64> = expected.iter().map(|(id, _)| (id.clone(), 1)).collect();
    assert_eq!(called, want, "exactly the failed IDs, once each");

    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    for r in &export {
        if expected
            .iter()
            .any(|(id, _)| id == r["id"].as_str().unwrap())
        {
            // Two (or more) failed attempts before, one successful now.
            let attempts = r["attempts"].as_u64().unwrap();
            assert!(attempts >= 3, "the history is kept: {r}");
            let errors = r["attempt_errors"].as_array().unwrap().len() as u64;
            assert_eq!(errors, attempts - 1, "{r}");
        }
    }
    let status = h.status(&state);
    assert_eq!(status["stats"]["failed"], 0, "{status}");
    assert_eq!(status["stats"]["ok"], ids.len());
    assert_eq!(status["failures"]["buckets_total"], 0);
    assert_eq!(status["reruns"][0]["number"], 1);
    assert_eq!(status["reruns"][0]["finished"], true);
    assert!(failures(&h, &state, &["--format", "jsonl"])
        .stdout
        .is_empty());

    // Nothing failed any more: a second rerun calls nothing.
    let calls = h.api.total_calls();
    rerun(&h, &state, &["--failed"])
        .expect_code(0)
        .expect_stderr("nothing to rerun");
    assert_eq!(h.api.total_calls(), calls);
}

#[test]
fn bucket_scoped_reruns_touch_only_those_buckets() {
    let h = Harness::new(healing());
    let (ids, state) = failed_job(&h, 400);
    let expected = actual_failures(&h, &state, &ids);
    let bucket_of = |id: &str| ids.iter().position(|i| i == id).unwrap() / 50;

    let before = h.api.calls_snapshot();
    rerun(&h, &state, &["--buckets", "1,3"]).expect_code(0);
    let called = called_since(&before, &h.api.calls_snapshot());
    let want: BTreeMap<String, u64> = expected
        .iter()
        .filter(|(id, _)| [1, 3].contains(&bucket_of(id)))
        .map(|(id, _)| (id.clone(), 1))
        .collect();
    assert!(!want.is_empty());
    assert_eq!(called, want, "only the failed IDs of buckets 1 and 3");
    let still = expected.len() - want.len();
    assert_eq!(h.status(&state)["stats"]["failed"], still);

    // --all-items redoes every ID of the bucket, the ones that succeeded too.
    let before = h.api.calls_snapshot();
    rerun(&h, &state, &["--buckets", "5", "--all-items"]).expect_code(0);
    let called = called_since(&before, &h.api.calls_snapshot());
    let want: BTreeMap<String, u64> = ids[250..300].iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(called, want);
    let status = h.status(&state);
    let fixed5 = expected.iter().filter(|(id, _)| bucket_of(id) == 5).count();
    assert_eq!(status["stats"]["failed"], still - fixed5, "{status}");
    assert_eq!(status["stats"]["ok"], ids.len() - (still - fixed5));
    assert_eq!(
        check_once_in_order(&h, &h.export(&state), &ids),
        still - fixed5
    );

    // A bucket the job does not have is refused before any call.
    let calls = h.api.total_calls();
    rerun(&h, &state, &["--buckets", "99"]).expect_refused(2, &["no bucket 99"]);
    rerun(&h, &state, &["--failed", "--all-items"]).expect_refused(2, &["--all-items"]);
    assert_eq!(h.api.total_calls(), calls);
}

#[test]
fn rerun_ids_from_a_file_calls_exactly_those_and_refuses_unknown_ones() {
    let h = Harness::new(healing());
    let (ids, state) = failed_job(&h, 200);
    let expected = actual_failures(&h, &state, &ids);
    let ok_id = ids
        .iter()
        .find(|id| h.api.fault(id) == Fault::None)
        .unwrap()
        .clone();

    let bad = h.file(
        "bad.txt",
        format!("{}\n{ok_id}\nno-such-id\n", expected[0].0),
    );
    let calls = h.api.total_calls();
    rerun(&h, &state, &["--ids", p(&bad)]).expect_refused(1, &["bad.txt:3", "no-such-id"]);
    assert_eq!(h.api.total_calls(), calls, "nothing is called");

    let good = h.file(
        "good.txt",
        format!("{ok_id}\n\n{}\n{ok_id}\n", expected[0].0),
    );
    let before = h.api.calls_snapshot();
    rerun(&h, &state, &["--ids", p(&good)]).expect_code(0);
    let called = called_since(&before, &h.api.calls_snapshot());
    let want: BTreeMap<String, u64> = [(ok_id, 1), (expected[0].0.clone(), 1)].into();
    assert_eq!(called, want);
    assert_eq!(
        check_once_in_order(&h, &h.export(&state), &ids),
        expected.len() - 1
    );
}

#[test]
fn a_killed_rerun_resumes_with_the_same_command_and_finishes_exactly_once() {
    let h = Harness::new(ApiConfig {
        unavailable_per_mille: 400,
        latency_min: std::time::Duration::from_millis(3),
        latency_max: std::time::Duration::from_millis(3),
        ..healing()
    });
    let (ids, state) = failed_job(&h, 1000);
    let expected = actual_failures(&h, &state, &ids);
    let before = h.api.calls_snapshot();
    let concurrency = 4;

    let mut args = vec![
        "rerun",
        "--state",
        p(&state),
        "--failed",
        "--concurrency",
        "4",
    ];
    args.extend(QUICK);
    args.extend(["--adaptive", "off"]);
    let mut child = h.spawn(&args);
    let start = h.api.total_calls();
    assert!(
        h.wait_for_calls(&mut child, start + expected.len() as u64 / 3),
        "the rerun ended before the kill"
    );
    child.kill().unwrap();
    assert!(child.wait().unwrap().code().is_none(), "killed");

    // The unfinished rerun is named by status and run, and another selection is refused.
    let status = h.status(&state);
    assert_eq!(status["reruns"][0]["finished"], false, "{status}");
    h.resume(&state, &[])
        .expect_stderr("rerun 1 (--failed) is not finished");
    rerun(&h, &state, &["--buckets", "0"]).expect_refused(2, &["rerun 1", "--failed"]);

    rerun(&h, &state, &["--failed", "--concurrency", "4"])
        .expect_code(0)
        .expect_stderr("resuming rerun 1");
    let called = called_since(&before, &h.api.calls_snapshot());
    let failed: BTreeSet<&str> = expected.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        called.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        failed,
        "only failed IDs were called"
    );
    let repeated: u64 = called.values().map(|n| n - 1).sum();
    assert!(
        repeated <= max_unsynced_items(concurrency) as u64,
        "{repeated} repeated calls"
    );
    h.check_export_exactly_once(&h.export(&state), &ids);
    let status = h.status(&state);
    assert_eq!(status["stats"]["failed"], 0, "{status}");
    // The job buckets' counts moved once per rerun commit, replays included.
    assert_eq!(status["stats"]["ok"], ids.len() as u64, "{status}");
    assert_eq!(status["reruns"][0]["finished"], true);
    let failures = h.run(&["failures", "--state", p(&state), "--format", "jsonl"]);
    failures.expect_code(0);
    assert_eq!(failures.stdout.trim(), "", "no failure left");
}

// ---------------------------------------------------------------------------
// Grown input

/// The IDs called since `before`, as a sorted set.
fn called_set(h: &Harness, before: &HashMap<String, u64>) -> BTreeSet<String> {
    let called = called_since(before, &h.api.calls_snapshot());
    assert!(called.values().all(|n| *n == 1), "each once: {called:?}");
    called.into_keys().collect()
}

fn append(path: &std::path::Path, text: &str) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

#[test]
fn appended_input_processes_only_the_new_ids_as_new_buckets() {
    let h = Harness::new(ApiConfig::fast());
    let all = ids(200);
    let input = h.ids_file("ids.txt", &all[..120]);
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--bucket-size", "50"])
        .expect_code(0);
    assert_eq!(h.status(&state)["stats"]["buckets_planned"], 3);

    // New rows, and one of them repeats an old ID.
    let mut grown: Vec<String> = all[120..].to_vec();
    grown.insert(10, all[3].clone());
    append(&input, &(grown.join("\n") + "\n"));
    let before = h.api.calls_snapshot();
    h.resume(&state, &[]).expect_code(0);
    let want: BTreeSet<String> = all[120..].iter().cloned().collect();
    assert_eq!(called_set(&h, &before), want, "only the new IDs, once each");

    let status = h.status(&state);
    assert_eq!(status["stats"]["buckets_planned"], 5, "{status}");
    assert_eq!(status["stats"]["duplicates"], 1);
    assert_eq!(status["finished"], true);
    let history = status["spec_history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{status}");
    assert!(history[0]["changes"][0]
        .as_str()
        .unwrap()
        .contains("input grew"));
    assert!(history[0]["previous_input"]["len"].is_u64());
    let mut rows = all[..120].to_vec();
    rows.extend(grown);
    h.check_export_exactly_once(&h.export(&state), &rows);
    // New rows start a new bucket after the last one.
    let export = h.export(&state);
    assert_eq!(export[119]["bucket"], 2);
    assert_eq!(export[120]["bucket"], 3);

    // Unchanged again: nothing to do.
    let calls = h.api.total_calls();
    h.resume(&state, &[]).expect_code(0);
    assert_eq!(h.api.total_calls(), calls);
}

#[test]
fn appending_to_an_input_without_a_final_newline() {
    let h = Harness::new(ApiConfig::fast());
    // The appended part starts with the newline the old last line lacked: accepted.
    let input = h.file("ids.txt", "a1\na2\na3");
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--bucket-size", "2"])
        .expect_code(0);
    append(&input, "\na4\na5\n");
    let before = h.api.calls_snapshot();
    h.resume(&state, &[]).expect_code(0);
    let want: BTreeSet<String> = ["a4".to_string(), "a5".to_string()].into();
    assert_eq!(called_set(&h, &before), want);
    let ids: Vec<String> = (1..=5).map(|i| format!("a{i}")).collect();
    h.check_export_exactly_once(&h.export(&state), &ids);

    // Appended text that continues the old last line would change its ID: refused.
    let other = h.file("other.txt", "b1\nb2");
    let state2 = h.path("state2");
    h.run_new(&state2, &other, &h.url(), &[]).expect_code(0);
    append(&other, "b3\n");
    let calls = h.api.total_calls();
    h.resume(&state2, &[])
        .expect_refused(1, &["had no newline", "other.txt"]);
    assert_eq!(h.api.total_calls(), calls);
}

#[test]
fn appended_csv_rows_are_planned_after_the_old_ones() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.file("ids.csv", "name,id\nx,c1\ny,c2\n");
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--id-column", "id"])
        .expect_code(0);
    append(&input, "z,c3\n");
    let before = h.api.calls_snapshot();
    h.resume(&state, &[]).expect_code(0);
    assert_eq!(called_set(&h, &before), BTreeSet::from(["c3".to_string()]));
    assert_eq!(h.export(&state).len(), 3);
}

#[test]
fn an_input_changed_in_the_middle_or_truncated_is_refused_saying_what_differs() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(60);
    let (input, state) = h.finished_job(&ids, &[]);
    let original = std::fs::read_to_string(&input).unwrap();
    let calls = h.api.total_calls();

    // Same length, one byte changed.
    h.file("ids.txt", original.replacen("id-000010", "id-000011", 1));
    h.resume(&state, &[])
        .expect_refused(1, &["has changed", "differs at the same length"]);
    // Grown, but the old part changed too.
    h.file(
        "ids.txt",
        original.replacen("id-000010", "id-000011", 1) + "new-1\n",
    );
    h.resume(&state, &[])
        .expect_refused(1, &["has changed", "first", "bytes", "changed"]);
    // Truncated.
    h.file("ids.txt", &original[..original.len() / 2]);
    h.resume(&state, &[])
        .expect_refused(1, &["has changed", "shorter than at creation"]);
    assert_eq!(h.api.total_calls(), calls, "nothing called");
    assert_eq!(h.status(&state)["spec_history"], serde_json::json!([]));
}

// ---------------------------------------------------------------------------
// Spec changes

#[test]
fn a_changed_url_needs_allow_spec_change_and_is_recorded() {
    let h = Harness::new(healing());
    let (ids, state) = failed_job(&h, 200);
    let new_url = h.api.query_url_template();
    let calls = h.api.total_calls();
    rerun(&h, &state, &["--failed", "--url", &new_url])
        .expect_refused(1, &["--url", "--allow-spec-change"]);
    assert_eq!(h.api.total_calls(), calls, "nothing called");
    assert_eq!(h.status(&state)["url"], h.url());
    // A rerun refused for what it asks writes nothing, not even an allowed spec change.
    rerun(
        &h,
        &state,
        &["--buckets", "999", "--url", &new_url, "--allow-spec-change"],
    )
    .expect_refused(2, &["999"]);
    let status = h.status(&state);
    assert_eq!(status["url"], h.url(), "{status}");
    assert_eq!(status["spec_history"], serde_json::json!([]));
    assert_eq!(status["reruns"], serde_json::json!([]));
    assert_eq!(h.api.total_calls(), calls, "nothing called");

    // A fresh token in a header is an operational change; the URL change is allowed.
    let secret = format!("hw-s3cret-{:016x}", rand::random::<u64>());
    let mut args = vec!["rerun", "--state", p(&state), "--failed"];
    args.extend(QUICK);
    args.extend([
        "--adaptive",
        "off",
        "--url",
        &new_url,
        "--allow-spec-change",
        "-H",
        "Authorization: Bearer ${HW_RERUN_TOKEN}",
    ]);
    h.run_env(&args, &[("HW_RERUN_TOKEN", secret.as_str())], &[])
        .expect_code(0);
    let status = h.status(&state);
    assert_eq!(status["url"], new_url);
    let history = status["spec_history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{status}");
    assert_eq!(history[0]["command"], "rerun");
    assert!(history[0]["changes"][0].as_str().unwrap().contains("--url"));
    let text = h.run(&["status", "--state", p(&state)]);
    assert!(text.stdout.contains("spec change:"), "{}", text.stdout);
    assert_eq!(check_once_in_order(&h, &h.export(&state), &ids), 0);
    for file in files_under(&state) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{} holds the expanded secret",
            file.display()
        );
    }
}

#[test]
fn a_rerun_stopped_by_sigint_exits_130_and_resumes() {
    let h = Harness::new(ApiConfig {
        unavailable_per_mille: 400,
        latency_min: std::time::Duration::from_millis(3),
        latency_max: std::time::Duration::from_millis(3),
        ..healing()
    });
    let (ids, state) = failed_job(&h, 600);
    let expected = actual_failures(&h, &state, &ids);
    let failed = expected.len() as u64;
    let mut args = vec!["rerun", "--state", p(&state), "--ids"];
    let list = h.ids_file("again.txt", &ids[..300]);
    args.push(p(&list));
    args.extend(["--concurrency", "2"]);
    args.extend(QUICK);
    let mut child = h.spawn(&args);
    let start = h.api.total_calls();
    assert!(
        h.wait_for_calls(&mut child, start + 30),
        "ended before the signal"
    );
    signal(&child, libc::SIGINT);
    let run = finish(child);
    run.expect_code(130)
        .expect_stderr("resume with: highwater rerun --state");
    let status = h.status(&state);
    assert_eq!(status["reruns"][0]["finished"], false, "{status}");
    assert!(status["reruns"][0]["pending"].as_u64().unwrap() > 0);

    let mut again = vec!["rerun", "--state", p(&state), "--ids", p(&list)];
    again.extend(QUICK);
    h.run(&again).expect_code(0);
    let export = h.export(&state);
    assert_eq!(check_once_in_order(&h, &export, &ids) as u64, {
        // Failures left: those outside the rerun's 300 IDs.
        let outside = expected
            .iter()
            .filter(|(id, _)| !ids[..300].contains(id))
            .count() as u64;
        assert!(outside < failed);
        outside
    });
    for r in &export[..300] {
        assert_eq!(
            r["rerun"], 1,
            "the rerun wrote every record it selected: {r}"
        );
    }
    assert!(export[300..].iter().all(|r| r["rerun"].is_null()));
}

#[test]
fn a_killed_ids_rerun_resumes_from_its_stored_ids_after_the_file_is_gone() {
    let h = Harness::new(ApiConfig {
        unavailable_per_mille: 400,
        latency_min: std::time::Duration::from_millis(3),
        latency_max: std::time::Duration::from_millis(3),
        ..healing()
    });
    let (ids, state) = failed_job(&h, 1000);
    let expected = actual_failures(&h, &state, &ids);
    let list: String = expected.iter().map(|(id, _)| format!("{id}\n")).collect();
    let file = h.file("retry.txt", list);
    let before = h.api.calls_snapshot();
    let mut args = vec![
        "rerun",
        "--state",
        p(&state),
        "--ids",
        p(&file),
        "--concurrency",
        "4",
    ];
    args.extend(QUICK);
    args.extend(["--adaptive", "off"]);
    let mut child = h.spawn(&args);
    let start = h.api.total_calls();
    assert!(
        h.wait_for_calls(&mut child, start + expected.len() as u64 / 3),
        "the rerun ended before the kill"
    );
    child.kill().unwrap();
    assert!(child.wait().unwrap().code().is_none(), "killed");

    // The file is gone: the same command still resumes the rerun from the stored IDs.
    std::fs::remove_file(&file).unwrap();
    h.run(&args)
        .expect_code(0)
        .expect_stderr("resuming rerun 1");
    let called = called_since(&before, &h.api.calls_snapshot());
    let want: BTreeSet<&str> = expected.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        called.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        want,
        "only the listed IDs were called"
    );
    h.check_export_exactly_once(&h.export(&state), &ids);
    assert_eq!(h.status(&state)["stats"]["failed"], 0);
}

#[test]
fn a_rerun_with_a_missing_variable_is_refused_before_it_is_written() {
    let h = Harness::new(healing());
    let (_ids, state) = failed_job(&h, 200);
    let calls = h.api.total_calls();
    let args = [
        "rerun",
        "--state",
        p(&state),
        "--failed",
        "-H",
        "Authorization: Bearer ${HW_RERUN_MISSING}",
    ];
    h.run_env(&args, &[], &["HW_RERUN_MISSING"])
        .expect_refused(1, &["HW_RERUN_MISSING"]);
    assert_eq!(h.api.total_calls(), calls, "nothing called");
    assert_eq!(h.status(&state)["reruns"], serde_json::json!([]));
}

/// The failures table keeps every row in line whatever the IDs' lengths: the ID column is
/// as wide as the IDs (bounded), a longer ID is cut with a mark.
#[test]
fn the_failures_table_sizes_its_id_column_to_the_ids() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 300,
        ..ApiConfig::fast()
    });
    let ids: Vec<String> = (0..200)
        .map(|i| match i % 3 {
            0 => format!("short-{i}"),
            1 => format!("customer/2024/region-eu-west/account-{i:08}"),
            _ => format!("{}-{i}", "x".repeat(90)),
        })
        .collect();
    let (_, state) = h.finished_job(&ids, &[]);
    let table = failures(&h, &state, &[]).stdout;
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    let bucket_end = header.find("BUCKET").unwrap() + "BUCKET".len();
    let mut rows = 0;
    let mut cut = 0;
    for line in lines {
        rows += 1;
        let chars: Vec<char> = line.chars().collect();
        let before: String = chars[..bucket_end].iter().collect();
        assert!(
            before.trim_end().ends_with(|c: char| c.is_ascii_digit()) && chars[bucket_end] == ' ',
            "the bucket column is in line:\n{header}\n{line}"
        );
        let id_cell: String = chars[..bucket_end - "BUCKET".len() - 1].iter().collect();
        if id_cell.trim_end().ends_with('…') {
            cut += 1;
        } else {
            assert!(ids.contains(&id_cell.trim_end().to_string()), "{line}");
        }
    }
    assert!(rows > 20, "{table}");
    assert!(cut > 0, "the 90-character IDs are cut: {table}");
    assert!(
        table.contains("customer/2024/region-eu-west/account-"),
        "a 45-character ID is shown whole: {table}"
    );
}
