//! The IDs reach the API as they were written, and answers come back as they were sent:
//! awkward IDs in a path, query or body, blank and dot lines, CSV, JSONL and Parquet input,
//! duplicates, text answers.

use std::path::{Path, PathBuf};

use highwater::demo::api::{ApiConfig, Fault};
use serde_json::Value;

use crate::harness::*;

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

/// Write `rows` (`None`: a null ID) as a Parquet file of one optional string column `id` and
/// a `score` column of doubles, `group_rows` rows per row group, with the parquet crate.
pub(crate) fn parquet_input(
    h: &Harness,
    name: &str,
    rows: &[Option<String>],
    group_rows: usize,
) -> PathBuf {
    use parquet::data_type::{ByteArray, ByteArrayType, DoubleType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;

    let path = h.path(name);
    let schema =
        parse_message_type("message ids { optional binary id (UTF8); required double score; }")
            .unwrap();
    let props = WriterProperties::builder()
        .set_data_page_row_count_limit(300)
        .set_write_batch_size(300)
        .build();
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
    for group in rows.chunks(group_rows) {
        let values: Vec<ByteArray> = group
            .iter()
            .flatten()
            .map(|id| ByteArray::from(id.as_str()))
            .collect();
        let defs: Vec<i16> = group.iter().map(|id| i16::from(id.is_some())).collect();
        let scores: Vec<f64> = (0..group.len()).map(|i| i as f64 / 2.0).collect();
        let mut g = writer.next_row_group().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        c.typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        c.typed::<DoubleType>()
            .write_batch(&scores, None, None)
            .unwrap();
        c.close().unwrap();
        g.close().unwrap();
    }
    writer.close().unwrap();
    path
}

/// 4,000 rows in row groups of 1,000 (pages of 300), row 2345 a null ID.
pub(crate) fn parquet_rows() -> (Vec<Option<String>>, usize) {
    let null_row = 2345;
    let rows = ids(4000)
        .into_iter()
        .enumerate()
        .map(|(i, id)| (i != null_row).then_some(id))
        .collect();
    (rows, null_row)
}

/// The finished job over [`parquet_rows`]: the null row recorded as a bad row with its
/// position, every other ID exported once, in input order, and called once (unless `killed`:
/// an ID in flight at a kill may have been called again).
fn check_parquet_job(
    h: &Harness,
    state: &Path,
    (rows, null_row): (&[Option<String>], usize),
    killed: bool,
) {
    let status = h.status(state);
    assert_eq!(status["finished"], true, "{status}");
    assert_eq!(status["stats"]["rows_read"], rows.len(), "{status}");
    assert_eq!(status["stats"]["bad_lines"], 1, "{status}");
    let bad = &status["bad_line_examples"][0];
    assert_eq!(bad["row"], null_row, "{status}");
    assert_eq!(bad["line"], null_row + 1, "{status}");
    assert_eq!(bad["reason"], "ID is null", "{status}");
    let text = h.run(&["status", "--state", p(state)]);
    text.expect_code(0);
    let want = format!("bad row {}: ID is null", null_row + 1);
    assert!(text.stdout.contains(&want), "{}", text.stdout);
    assert!(
        status["input_format"]
            .as_str()
            .unwrap()
            .starts_with("parquet"),
        "{status}"
    );
    let ids: Vec<String> = rows.iter().flatten().cloned().collect();
    h.check_export_exactly_once(&h.export(state), &ids);
    for id in ids.iter().filter(|_| !killed) {
        assert_eq!(h.api.calls(id), 1, "{id}");
    }
}

#[test]
fn parquet_input_in_row_groups_with_a_null_id() {
    let h = Harness::new(ApiConfig::fast());
    let (rows, null_row) = parquet_rows();
    let input = parquet_input(&h, "curated.parquet", &rows, 1000);
    let state = h.state();
    // Without --skip-bad-lines the null row stops the job, named by its row number.
    h.run_new(
        &state,
        &input,
        &h.url(),
        &["--id-column", "id", "--bucket-size", "64"],
    )
    .expect_refused(
        1,
        &[
            &format!("{}:{}: ID is null", canonical(&input), null_row + 1),
            "--skip-bad-lines",
        ],
    );
    h.resume(&state, &["--skip-bad-lines"])
        .expect_no_panic()
        .expect_code(0);
    check_parquet_job(&h, &state, (&rows, null_row), false);

    // A changed Parquet file is refused on resume: it cannot have grown by appending.
    parquet_input(&h, "curated.parquet", &rows, 500);
    h.resume(&state, &[]).expect_refused(
        1,
        &[&canonical(&input), "cannot have grown by appending rows"],
    );
}

#[test]
fn parquet_input_killed_and_resumed_gives_every_id_once() {
    let h = Harness::new(ApiConfig::fast());
    let (rows, null_row) = parquet_rows();
    let input = parquet_input(&h, "ids.parquet", &rows, 1000);
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend([
        "--input-format",
        "parquet",
        "--id-column",
        "id",
        "--skip-bad-lines",
        "--bucket-size",
        "50",
        "--concurrency",
        "4",
    ]);
    // Killed twice: in the first row group, then in the third (past the null row).
    for calls in [700, 2600] {
        let mut child = h.spawn(&args);
        assert!(h.wait_for_calls(&mut child, calls), "the run ended early");
        child.kill().unwrap();
        child.wait().unwrap();
    }
    h.resume(&state, &[]).expect_no_panic().expect_code(0);
    check_parquet_job(&h, &state, (&rows, null_row), true);
}

#[test]
fn parquet_input_without_the_column_or_with_a_float_column_is_refused_up_front() {
    let h = Harness::new(ApiConfig::fast());
    let rows: Vec<Option<String>> = ids(10).into_iter().map(Some).collect();
    let input = parquet_input(&h, "ids.parquet", &rows, 4);
    let state = h.state();
    h.run_new(&state, &input, &h.url(), &["--id-column", "user_id"])
        .expect_refused(
            1,
            &[&canonical(&input), "no column \"user_id\"", "id, score"],
        );
    h.run_new(&state, &input, &h.url(), &["--id-column", "score"])
        .expect_refused(1, &[&canonical(&input), "\"score\" holds DOUBLE"]);
    h.run_new(&state, &input, &h.url(), &[])
        .expect_refused(2, &["--id-column"]);
    assert!(!state.exists(), "nothing is created for a refused job");
    assert_eq!(h.api.total_calls(), 0);
}
