//! Bad input of every kind: a clear message naming the file, line or flag, a non-zero exit.

use std::path::Path;
use std::time::Duration;

use highwater::demo::api::{ApiConfig, Fault};
use serde_json::Value;

use crate::harness::*;

// ---------------------------------------------------------------------------
// Input files

#[test]
fn empty_input_is_refused_naming_the_file() {
    let h = Harness::new(ApiConfig::fast());
    for (name, content) in [
        ("empty.txt", ""),
        ("blank.txt", "\n  \n\t\r\n\n"),
        ("empty.jsonl", "\n\n"),
    ] {
        let input = h.file(name, content);
        let state = h.path(&format!("state-{name}"));
        let extra: &[&str] = if name.ends_with(".jsonl") {
            &["--id-field", "id"]
        } else {
            &[]
        };
        h.run_new(&state, &input, &h.url(), extra)
            .expect_refused(1, &[&canonical(&input)]);
    }
    // A CSV with a header and no records holds no IDs either.
    let input = h.file("header-only.csv", "id,name\n");
    h.run_new(
        &h.path("state-csv"),
        &input,
        &h.url(),
        &["--id-column", "id"],
    )
    .expect_refused(1, &[&canonical(&input)]);
    assert_eq!(h.api.total_calls(), 0);
}

#[test]
fn missing_input_file_names_the_path() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.path("no-such-ids.txt");
    let state = h.state();
    let run = h.run_new(&state, &input, &h.url(), &[]);
    run.expect_refused(1, &[p(&input)]);
    // The cause once, not repeated by the error chain.
    assert_eq!(
        run.stderr.matches("No such file").count(),
        1,
        "{}",
        run.stderr
    );
    assert!(
        !state.exists(),
        "nothing is created for a job that cannot start"
    );
    assert_eq!(h.api.total_calls(), 0);
}

/// The rows of a text input with one line that is not UTF-8: (content, IDs in row order with
/// `None` for the bad row, the bad line's number).
fn input_with_a_bad_line(ids: usize, bad_at_row: usize) -> (Vec<u8>, Vec<Option<String>>, u64) {
    let mut content = Vec::new();
    let mut rows = Vec::new();
    let mut line = 0u64;
    let mut bad_line = 0;
    // A blank line first, so line numbers and row numbers differ.
    content.extend_from_slice(b"\n");
    line += 1;
    for i in 0..ids {
        if i == bad_at_row {
            content.extend_from_slice(b"caf\xe9-latin1\n");
            line += 1;
            bad_line = line;
            rows.push(None);
        }
        let id = format!("id-{i:05}");
        content.extend_from_slice(id.as_bytes());
        content.extend_from_slice(b"\n");
        line += 1;
        rows.push(Some(id));
    }
    (content, rows, bad_line)
}

/// Checks a finished job whose input had exactly one bad row: the bad line is recorded and
/// every row, the bad one included, keeps its bucket.
fn check_skipped_bad_line(
    h: &Harness,
    state: &Path,
    rows: &[Option<String>],
    bad_line: u64,
    bucket_size: usize,
) {
    let status = h.status(state);
    assert_eq!(status["finished"], true, "{status}");
    assert_eq!(status["stats"]["bad_lines"], 1, "{status}");
    assert_eq!(status["bad_line_examples"][0]["line"], bad_line, "{status}");
    let bad_row = rows.iter().position(Option::is_none).unwrap();
    assert_eq!(status["bad_line_examples"][0]["row"], bad_row, "{status}");
    assert_eq!(status["stats"]["rows_read"], rows.len(), "{status}");
    let buckets = rows.len().div_ceil(bucket_size);
    assert_eq!(status["stats"]["buckets_planned"], buckets, "{status}");
    assert_eq!(status["stats"]["buckets_committed"], buckets, "{status}");

    let ids: Vec<String> = rows.iter().flatten().cloned().collect();
    let export = h.export(state);
    h.check_export_exactly_once(&export, &ids);
    for (row, id) in rows.iter().enumerate() {
        let Some(id) = id else { continue };
        let record = export.iter().find(|r| r["id"] == id.as_str()).unwrap();
        assert_eq!(
            record["bucket"],
            row / bucket_size,
            "row {row} ({id}) is in bucket {}: {record}",
            row / bucket_size
        );
        assert_eq!(h.api.calls(id), 1, "{id}");
    }
}

#[test]
fn invalid_utf8_line_is_named_and_can_be_skipped() {
    let h = Harness::new(ApiConfig::fast());
    let (content, rows, bad_line) = input_with_a_bad_line(20, 6);
    let input = h.file("ids.txt", content);
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--bucket-size", "4"])
        .expect_refused(
            1,
            &[
                &format!("{}:{bad_line}:", canonical(&input)),
                "UTF-8",
                "--skip-bad-lines",
            ],
        );

    // Resuming with --skip-bad-lines records the line and goes on.
    h.resume(&state, &["--skip-bad-lines"])
        .expect_no_panic()
        .expect_code(0);
    check_skipped_bad_line(&h, &state, &rows, bad_line, 4);

    // The same from a fresh state: the same buckets.
    let h = Harness::new(ApiConfig::fast());
    let input = h.file("ids.txt", input_with_a_bad_line(20, 6).0);
    h.run_new(
        &h.state(),
        &input,
        &h.url(),
        &["--bucket-size", "4", "--skip-bad-lines"],
    )
    .expect_no_panic()
    .expect_code(0);
    check_skipped_bad_line(&h, &h.state(), &rows, bad_line, 4);
}

#[test]
fn bad_line_after_some_buckets_stops_the_run_and_a_resume_finishes_it() {
    let h = Harness::new(ApiConfig::fast());
    // Past the planner's first batch, so some buckets are done before the bad line is met.
    let (content, rows, bad_line) = input_with_a_bad_line(1300, 1150);
    let input = h.file("ids.txt", content);
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--bucket-size", "100"])
        .expect_refused(1, &[&format!("{}:{bad_line}:", canonical(&input))]);
    let status = h.status(&state);
    assert_eq!(status["finished"], false, "{status}");

    h.resume(&state, &["--skip-bad-lines"])
        .expect_no_panic()
        .expect_code(0);
    check_skipped_bad_line(&h, &state, &rows, bad_line, 100);
    assert_eq!(h.api.total_calls(), rows.len() as u64 - 1);
}

#[test]
fn csv_without_the_id_column_names_it_and_the_columns() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.file("people.csv", "name,email\nann,a@x\n");
    h.run_new(&h.state(), &input, &h.url(), &["--id-column", "id"])
        .expect_refused(1, &[&canonical(&input), "\"id\"", "name, email"]);
    assert_eq!(h.api.total_calls(), 0);
}

#[test]
fn csv_short_row_is_named_by_its_line() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.file("rows.csv", "name,id\nann,a-1\n\nbob,b-2\nshort\ncid,c-3\n");
    h.run_new(&h.state(), &input, &h.url(), &["--id-column", "id"])
        .expect_refused(1, &[&format!("{}:5:", canonical(&input))]);
}

#[test]
fn csv_input_needs_id_column_and_jsonl_needs_id_field() {
    let h = Harness::new(ApiConfig::fast());
    let csv = h.file("rows.csv", "id\na\n");
    h.run_new(&h.path("s1"), &csv, &h.url(), &[])
        .expect_refused(2, &["--id-column"]);
    let jsonl = h.file("rows.jsonl", "{\"id\":\"a\"}\n");
    h.run_new(&h.path("s2"), &jsonl, &h.url(), &[])
        .expect_refused(2, &["--id-field"]);
    // And the flag of the other format.
    h.run_new(&h.path("s3"), &jsonl, &h.url(), &["--id-column", "id"])
        .expect_refused(2, &["--id-field"]);
    h.run_new(
        &h.path("s4"),
        &jsonl,
        &h.url(),
        &["--id-field", "id", "--id-column", "id"],
    )
    .expect_refused(2, &["--id-column"]);
    h.run_new(
        &h.path("s5"),
        &csv,
        &h.url(),
        &["--id-column", "id", "--id-field", "id"],
    )
    .expect_refused(2, &["--id-field"]);
    assert_eq!(h.api.total_calls(), 0);
}

#[test]
fn bad_jsonl_lines_are_named_by_file_and_line() {
    let h = Harness::new(ApiConfig::fast());
    for (name, content, line, reason) in [
        (
            "not-json.jsonl",
            "{\"id\":\"a\"}\n{\"id\":\"b\"}\nnot json at all\n{\"id\":\"c\"}\n",
            3,
            "not valid JSON",
        ),
        (
            "array.jsonl",
            "{\"id\":\"a\"}\n[\"b\", 1]\n{\"id\":\"c\"}\n",
            2,
            "not a JSON object",
        ),
        (
            "no-field.jsonl",
            "{\"id\":\"a\"}\n\n{\"id\":\"b\"}\n{\"name\":\"c\"}\n",
            4,
            "no field \"id\"",
        ),
        (
            "null-field.jsonl",
            "{\"id\":\"a\"}\n{\"id\":null}\n",
            2,
            "\"id\"",
        ),
    ] {
        let input = h.file(name, content);
        h.run_new(
            &h.path(&format!("state-{name}")),
            &input,
            &h.url(),
            &["--id-field", "id"],
        )
        .expect_refused(1, &[&format!("{}:{line}:", canonical(&input)), reason]);
    }
}

// ---------------------------------------------------------------------------
// Resuming with a different input or different flags

#[test]
fn changed_input_on_resume_is_refused() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(50);
    let (input, state) = h.finished_job(&ids, &[]);
    let original = std::fs::read(&input).unwrap();
    let calls = h.api.total_calls();

    // One character changed in place: same length.
    let mut changed = original.clone();
    let at = changed.len() / 2;
    changed[at] = if changed[at] == b'7' { b'8' } else { b'7' };
    assert_eq!(changed.len(), original.len());
    std::fs::write(&input, &changed).unwrap();
    h.resume(&state, &[])
        .expect_refused(1, &["changed", &canonical(&input)]);
    h.run_new(&state, &input, &h.url(), &[])
        .expect_refused(1, &["changed"]);

    assert_eq!(h.api.total_calls(), calls, "a refused resume calls no one");

    // Put back as it was: accepted again.
    std::fs::write(&input, &original).unwrap();
    h.resume(&state, &[]).expect_no_panic().expect_code(0);
    assert_eq!(h.api.total_calls(), calls);

    // Lines appended are a grown input (see reruns.rs): only the new line is called. The old
    // content is then shorter than the stored input: refused.
    let mut appended = original.clone();
    appended.extend_from_slice(b"id-new\n");
    std::fs::write(&input, &appended).unwrap();
    h.resume(&state, &[]).expect_no_panic().expect_code(0);
    assert_eq!(h.api.total_calls(), calls + 1);
    assert_eq!(h.api.calls("id-new"), 1);
    std::fs::write(&input, &original).unwrap();
    h.resume(&state, &[])
        .expect_refused(1, &["changed", "shorter than at creation"]);
}

#[test]
fn a_moved_input_is_accepted_said_and_recorded_and_a_different_file_is_refused_naming_both() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(50);
    let (input, state) = h.finished_job(&ids, &[]);
    let calls = h.api.total_calls();

    // Another file: refused, naming the file given and the job's own.
    let other = h.ids_file("other.txt", &ids[..40]);
    h.resume(&state, &["--input", p(&other)])
        .expect_refused(1, &[&canonical(&other), "created from", &canonical(&input)]);

    // The same content somewhere else (a redeploy moved it), with a row appended: accepted.
    let moved = h.path("moved.txt");
    let mut content = std::fs::read(&input).unwrap();
    content.extend_from_slice(b"id-new\n");
    std::fs::write(&moved, &content).unwrap();
    h.resume(&state, &["--input", p(&moved)])
        .expect_no_panic()
        .expect_code(0)
        .expect_stderr("input moved from");
    assert_eq!(
        h.api.total_calls(),
        calls + 1,
        "only the appended row is called"
    );
    let status = h.status(&state);
    assert_eq!(status["input"], canonical(&moved), "{status}");
    let history = status["spec_history"].to_string();
    assert!(history.contains("input moved from"), "{history}");
    assert!(history.contains(&canonical(&input)), "{history}");
}

#[test]
fn changed_input_of_a_stopped_job_is_refused() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(5),
        latency_max: Duration::from_millis(5),
        ..ApiConfig::fast()
    });
    let ids = ids(3000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url, "--concurrency", "2"]);
    let mut child = h.spawn(&args);
    assert!(h.wait_for_calls(&mut child, 20), "the run ended early");
    child.kill().unwrap();
    child.wait().unwrap();

    let mut content = std::fs::read(&input).unwrap();
    let last = content.len() - 2;
    content[last] = if content[last] == b'1' { b'2' } else { b'1' };
    std::fs::write(&input, &content).unwrap();
    let calls = h.api.total_calls();
    h.resume(&state, &[]).expect_refused(1, &["changed"]);
    assert_eq!(h.api.total_calls(), calls);
}

#[test]
fn meaning_changing_flags_are_refused_on_resume() {
    let h = Harness::new(ApiConfig::fast());
    let ids = ids(40);
    let (input, state) = h.finished_job(&ids, &["--bucket-size", "10"]);
    let calls = h.api.total_calls();
    let other_input = h.ids_file("other.txt", &ids);
    let different_input = h.ids_file("different.txt", &ids[1..]);
    let other_url = format!("http://{}/other/{{id}}", h.api.addr());
    let query_url = h.api.query_url_template();
    for (flags, named) in [
        (vec!["--url", other_url.as_str()], "--url"),
        (vec!["--url", query_url.as_str()], "--url"),
        (vec!["--bucket-size", "20"], "--bucket-size"),
        (vec!["--method", "POST"], "--method"),
        (vec!["--body", "{\"id\":\"{id}\"}"], "--body"),
        (
            vec![
                "--input",
                p(&other_input),
                "--input-format",
                "csv",
                "--id-column",
                "id",
            ],
            "input format",
        ),
    ] {
        let run = h.resume(&state, &flags);
        run.expect_refused(1, &[named]);
        for other in [
            "--url:",
            "--method:",
            "--body:",
            "--bucket-size:",
            "input format:",
        ] {
            assert!(
                other.starts_with(named) || !run.stderr.contains(other),
                "only {named} changed, yet {other} is named: {}",
                run.stderr
            );
        }
    }
    assert_eq!(h.api.total_calls(), calls, "a refused resume calls no one");

    // The same meaning-changing flags as stored, and operational flags, are accepted.
    let url = h.url();
    for flags in [
        vec!["--concurrency", "4"],
        vec![
            "--url",
            url.as_str(),
            "--bucket-size",
            "10",
            "--method",
            "get",
        ],
        vec!["--input", p(&input)],
        // A moved input with the same content is the same job.
        vec!["--input", p(&other_input)],
        vec![
            "--timeout",
            "2s",
            "--max-attempts",
            "2",
            "--header",
            "X-Extra: 1",
            "--skip-bad-lines",
        ],
    ] {
        h.resume(&state, &flags).expect_no_panic().expect_code(0);
    }
    // Another file with other content is not.
    h.resume(&state, &["--input", p(&different_input)])
        .expect_refused(1, &["changed"]);
    assert_eq!(h.api.total_calls(), calls);
}

#[test]
fn operational_flags_may_change_when_resuming_a_stopped_job() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(5),
        latency_max: Duration::from_millis(5),
        ..ApiConfig::fast()
    });
    let ids = ids(1000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url, "--concurrency", "2"]);
    let mut child = h.spawn(&args);
    assert!(h.wait_for_calls(&mut child, 20), "the run ended early");
    child.kill().unwrap();
    child.wait().unwrap();

    h.resume(
        &state,
        &[
            "--concurrency",
            "32",
            "--timeout",
            "5s",
            "--max-attempts",
            "3",
        ],
    )
    .expect_no_panic()
    .expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &ids);
}

// ---------------------------------------------------------------------------
// Templates and secrets

#[test]
fn missing_variable_in_url_or_header_is_named_and_nothing_is_created() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(10));
    let url = format!("{}?k=${{HW_TEST_MISSING_URL_VAR}}", h.url());
    let state = h.path("s1");
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url]);
    h.run_env(&args, &[], &["HW_TEST_MISSING_URL_VAR"])
        .expect_refused(2, &["HW_TEST_MISSING_URL_VAR", "--url"]);
    assert!(
        !state.exists(),
        "a template that cannot make a request creates nothing"
    );

    let state = h.path("s2");
    let url = h.url();
    let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url]);
    args.extend(["--header", "Authorization: Bearer ${HW_TEST_MISSING_TOKEN}"]);
    h.run_env(&args, &[], &["HW_TEST_MISSING_TOKEN"])
        .expect_refused(2, &["HW_TEST_MISSING_TOKEN", "--header"]);
    assert!(
        !state.exists(),
        "a template that cannot make a request creates nothing"
    );
    assert_eq!(h.api.total_calls(), 0);

    // Set now: the same command creates the job and runs it.
    h.run_env(&args, &[("HW_TEST_MISSING_TOKEN", "t")], &[])
        .expect_no_panic()
        .expect_code(0);
    assert_eq!(h.api.total_calls(), 10);
}

/// A misspelt variable, then the corrected command in the same state directory: the first
/// leaves nothing behind, so the second is a new job, not a changed one.
#[test]
fn a_misspelt_variable_can_be_corrected_in_the_same_state_directory() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(10));
    let state = h.state();
    let typo = format!("{}?api_key=${{HW_TEST_API_TOKN}}", h.url());
    let fixed = format!("{}?api_key=${{HW_TEST_API_TOKEN}}", h.url());
    for (url, code) in [(&typo, 2), (&fixed, 0)] {
        let mut args = new_job_args(&state, &input, url);
        args.extend(["--concurrency", "2"]);
        let run = h.run_env(
            &args,
            &[("HW_TEST_API_TOKEN", "s3cret")],
            &["HW_TEST_API_TOKN"],
        );
        run.expect_no_panic().expect_code(code);
        if code == 2 {
            run.expect_stderr("HW_TEST_API_TOKN");
            assert!(
                !state.exists(),
                "nothing left behind: {:?}",
                files_under(h.dir.path())
            );
        }
    }
    assert_eq!(h.api.total_calls(), 10);
}

/// An empty input, into an empty directory given as the state: refused (1), and the
/// directory stays as it was.
#[test]
fn an_empty_input_creates_nothing_even_in_an_existing_empty_directory() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.file("empty.txt", "");
    let state = h.state();
    std::fs::create_dir(&state).unwrap();
    h.run_new(&state, &input, &h.url(), &[])
        .expect_refused(1, &["empty"]);
    assert!(dir_entries(&state).is_empty(), "{:?}", dir_entries(&state));
}

#[test]
fn an_invalid_url_template_can_be_corrected_in_the_same_state_directory() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(10));
    let state = h.state();
    // A typo: no {id} in the template.
    let typo = format!("http://{}/items/id", h.api.addr());
    h.run_new(&state, &input, &typo, &[])
        .expect_refused(2, &["--url", "{id}"]);
    let not_a_url = "htp:/nowhere/{id}";
    h.run_new(&state, &input, not_a_url, &[])
        .expect_refused(2, &["--url"]);
    h.run_new(&state, &input, &h.url(), &["--header", "no colon here"])
        .expect_refused(2, &["--header", "Name: value"]);
    assert!(!state.exists(), "a mistyped flag leaves nothing behind");
    assert_eq!(h.api.total_calls(), 0);
    // The user fixes the flag and runs the same command again.
    h.run_new(&state, &input, &h.url(), &[])
        .expect_no_panic()
        .expect_code(0);
    assert_eq!(h.api.total_calls(), 10);
}

#[test]
fn secrets_stay_out_of_logs_exports_status_and_the_state_directory() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 100,
        unavailable_per_mille: 100,
        drop_per_mille: 100,
        transient_attempts: 3,
        ..ApiConfig::fast()
    });
    let ids = ids(300);
    for f in [
        Fault::NotFound,
        Fault::Unavailable,
        Fault::Drop,
        Fault::None,
    ] {
        assert!(ids.iter().any(|i| h.api.fault(i) == f), "no ID with {f:?}");
    }
    let secret = format!("hw-s3cret-{:016x}", rand::random::<u64>());
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = format!("{}?key=${{HW_TEST_TOKEN}}", h.url());
    let mut args = vec!["-vv", "run", "--state", p(&state), "--input", p(&input)];
    args.extend(["--url", &url, "--max-attempts", "2", "--timeout", "500ms"]);
    args.extend(["--header", "Authorization: Bearer ${HW_TEST_TOKEN}"]);
    args.extend(QUICK);
    let env = [("HW_TEST_TOKEN", secret.as_str())];
    let run = h.run_env(&args, &env, &[]);
    run.expect_no_panic().expect_code(3);
    assert!(
        run.stderr.contains("TRACE") || run.stderr.contains("DEBUG"),
        "-vv logs"
    );

    let mut outputs = vec![("run", run)];
    let resume = vec!["-vv", "run", "--state", p(&state)];
    outputs.push(("resume", h.run_env(&resume, &env, &[])));
    for (what, args) in [
        ("status", vec!["-vv", "status", "--state", p(&state)]),
        (
            "status --json",
            vec!["status", "--state", p(&state), "--json"],
        ),
        ("export", vec!["export", "--state", p(&state)]),
        (
            "export csv",
            vec!["export", "--state", p(&state), "--format", "csv"],
        ),
    ] {
        outputs.push((what, h.run_env(&args, &env, &[])));
    }
    for (what, out) in &outputs {
        assert!(
            !out.stdout.contains(&secret) && !out.stderr.contains(&secret),
            "the secret is in the output of {what}:\n--- stdout\n{}\n--- stderr\n{}",
            out.stdout,
            out.stderr
        );
    }
    let export = &outputs[4].1.stdout;
    assert!(export.contains("\"status\":\"failed\""), "{export}");

    for file in files_under(&state) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret is in {}",
            file.display()
        );
    }
}

// ---------------------------------------------------------------------------
// Usage errors

#[test]
fn usage_errors_exit_2_naming_the_flag() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(10));
    let url = h.url();
    for (n, (extra, named)) in [
        (vec!["--url", url.as_str(), "--frobnicate"], "--frobnicate"),
        (
            vec!["--url", url.as_str(), "--concurrency", "0"],
            "--concurrency",
        ),
        (
            vec!["--url", url.as_str(), "--bucket-size", "0"],
            "--bucket-size",
        ),
        (vec![], "--url"),
        (
            vec!["--url", url.as_str(), "--timeout", "nonsense"],
            "--timeout",
        ),
        (
            vec!["--url", url.as_str(), "--max-attempts", "0"],
            "--max-attempts",
        ),
        (
            vec!["--url", url.as_str(), "--input-format", "xml"],
            "--input-format",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let state = h.path(&format!("state-{n}"));
        let mut args = vec!["run", "--state", p(&state), "--input", p(&input)];
        args.extend(extra);
        h.run(&args).expect_refused(2, &[named]);
    }
    h.run(&["run"]).expect_refused(2, &["--state"]);
    h.run(&["frobnicate"]).expect_refused(2, &["frobnicate"]);
    h.run(&["status"]).expect_refused(2, &["--state"]);
    assert_eq!(h.api.total_calls(), 0);
}

#[test]
fn export_to_an_unwritable_place_names_it() {
    let h = Harness::new(ApiConfig::fast());
    let (_, state) = h.finished_job(&ids(10), &[]);
    let target = h.path("no-such-dir").join("out.jsonl");
    h.run(&["export", "--state", p(&state), "--output", p(&target)])
        .expect_refused(1, &[p(&target)]);
    let v: Value = h.status(&state);
    assert_eq!(v["finished"], true);
}

#[test]
fn a_concurrency_past_the_open_file_limit_is_refused_before_anything_is_created() {
    use std::os::unix::process::CommandExt;
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(10));
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(["--concurrency", "1000"]);
    let mut cmd = h.cmd(&args);
    // SAFETY: setrlimit is async-signal-safe; it only lowers this child's own limit.
    unsafe {
        cmd.pre_exec(|| {
            let l = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 512,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--concurrency 1000") && stderr.contains("at most 512"),
        "{stderr}"
    );
    assert!(!state.exists(), "nothing was created");
    assert_eq!(h.api.total_calls(), 0);
    // Within the hard limit (raised from the soft 256 at start) the same run works.
    let mut args = new_job_args(&state, &input, &url);
    args.extend(["--concurrency", "400"]);
    let mut cmd = h.cmd(&args);
    // SAFETY: as above.
    unsafe {
        cmd.pre_exec(|| {
            let l = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 512,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
