//! `export --per-item`: one row per item of each ID, in JSON lines, CSV and Parquet. Every
//! item of every paginated ID exactly once, in order, with its index and its page, across IDs
//! of 40 pages; an ID without items (failed, or paginated with none) still has its one row;
//! a job that does not page gives one row per ID, its body as the item; a job in PostgreSQL
//! gives the same rows; an ID of 200,000 items exports in flat memory; flags that do not go
//! together are refused.

use std::path::Path;

use highwater::demo::api::{ApiConfig, Fault};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use serde_json::Value;

use crate::harness::*;

/// Items a full page holds in these tests.
const SIZE: u64 = 50;

/// The flags of a job paging by the fake API's cursor, in the query.
const CURSOR: [&str; 6] = [
    "--paginate",
    "cursor=.next_cursor",
    "--page-param",
    "cursor",
    "--items",
    ".data[]",
];

/// The three formats.
const FORMATS: [&str; 3] = ["jsonl", "csv", "parquet"];

/// A per-item export's row, read from any format.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    id: String,
    index: Option<u64>,
    page: Option<u64>,
    status: String,
    item: Option<Value>,
    error: Option<String>,
}

/// `export --per-item` of the job in `state` as `format` (to a file), with `extra` flags:
/// its rows, in order.
#[track_caller]
fn per_item(h: &Harness, state: &Path, format: &str, extra: &[&str]) -> Vec<Row> {
    per_item_of(h, &["--state", p(state)], format, extra)
}

/// [`per_item`] of the job at `place` (`--state URL --job NAME` for PostgreSQL).
#[track_caller]
fn per_item_of(h: &Harness, place: &[&str], format: &str, extra: &[&str]) -> Vec<Row> {
    let output = h.path(&format!("per-item.{format}"));
    let mut args = vec!["export"];
    args.extend_from_slice(place);
    args.extend(["--per-item", "--format", format, "--output", p(&output)]);
    args.extend_from_slice(extra);
    let run = h.run(&args);
    run.expect_code(0).expect_no_panic();
    let rows = match format {
        "jsonl" => jsonl_rows(&std::fs::read_to_string(&output).unwrap()),
        "csv" => csv_rows(&output),
        "parquet" => parquet_rows(&output),
        other => panic!("no format {other}"),
    };
    run.expect_stderr(&format!("wrote {} rows to", rows.len()));
    rows
}

fn jsonl_rows(text: &str) -> Vec<Row> {
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("a JSON line");
            for field in ["item_index", "page", "status", "http_status", "attempts"] {
                assert!(v.get(field).is_some(), "{field} in every line: {line}");
            }
            Row {
                id: v["id"].as_str().unwrap().to_string(),
                index: v["item_index"].as_u64(),
                page: v["page"].as_u64(),
                status: v["status"].as_str().unwrap().to_string(),
                item: v.get("item").cloned(),
                error: v["error"].as_str().map(String::from),
            }
        })
        .collect()
}

fn csv_rows(path: &Path) -> Vec<Row> {
    let mut reader = csv::Reader::from_path(path).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(
        header,
        [
            "id",
            "item_index",
            "page",
            "status",
            "http_status",
            "item",
            "error",
            "error_class",
            "attempts",
            "bucket"
        ]
    );
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            Row {
                id: r[0].to_string(),
                index: some(&r[1]).map(|n| n.parse().unwrap()),
                page: some(&r[2]).map(|n| n.parse().unwrap()),
                status: r[3].to_string(),
                item: some(&r[5]).map(|t| serde_json::from_str(&t).expect("item is JSON")),
                error: some(&r[6]).map(|t| serde_json::from_str(&t).expect("error is JSON")),
            }
        })
        .collect()
}

fn parquet_rows(path: &Path) -> Vec<Row> {
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let names: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "id",
            "item_index",
            "page",
            "status",
            "http_status",
            "item",
            "error",
            "error_class",
            "attempts",
            "bucket"
        ]
    );
    let text = |f: &Field| match f {
        Field::Str(s) => Some(s.clone()),
        Field::Null => None,
        other => panic!("a string column: {other:?}"),
    };
    let long = |f: &Field| match f {
        Field::Long(n) => Some(*n as u64),
        Field::Null => None,
        other => panic!("an INT64 column: {other:?}"),
    };
    reader
        .get_row_iter(None)
        .unwrap()
        .map(|row| {
            let fields: Vec<Field> = row
                .unwrap()
                .get_column_iter()
                .map(|(_, f)| f.clone())
                .collect();
            Row {
                id: text(&fields[0]).unwrap(),
                index: long(&fields[1]),
                page: long(&fields[2]),
                status: text(&fields[3]).unwrap(),
                item: text(&fields[5]).map(|t| serde_json::from_str(&t).expect("item is JSON")),
                error: text(&fields[6]),
            }
        })
        .collect()
}

/// The rows an ID with no item gives: one, with its status, no index, page or item.
#[track_caller]
fn check_no_item(row: &Row, id: &str, status: &str) {
    assert_eq!(
        (
            row.id.as_str(),
            row.index,
            row.page,
            &row.item,
            row.status.as_str()
        ),
        (id, None, None, &None, status),
        "{row:?}"
    );
}

/// `rows` are, ID after ID in the order of `ids`, each ok ID's items of the API in order
/// (index from 0, page by [`SIZE`]), and one row for an ID without items: a failed one with
/// its error saying `failed_says`.
#[track_caller]
fn check_rows(h: &Harness, rows: &[Row], ids: &[String], failed_says: &str) {
    let mut at = 0;
    for id in ids {
        let want = h.api.page_items(id);
        let mine: Vec<&Row> = rows[at..].iter().take_while(|r| &r.id == id).collect();
        at += mine.len();
        assert!(!mine.is_empty(), "{id} has a row");
        if mine[0].status == "failed" {
            assert_eq!(mine.len(), 1, "{id}: a failed ID's one row");
            check_no_item(mine[0], id, "failed");
            let error = mine[0].error.as_deref().unwrap_or_default();
            assert!(error.contains(failed_says), "{id}: {error}");
            continue;
        }
        if want.is_empty() {
            assert_eq!(mine.len(), 1, "{id}: an ID without items has one row");
            check_no_item(mine[0], id, "ok");
            continue;
        }
        assert_eq!(mine.len(), want.len(), "{id}: one row per item");
        for (k, (row, item)) in (0..).zip(mine.iter().zip(&want)) {
            assert_eq!(row.index, Some(k), "{id}: its items in order");
            assert_eq!(row.page, Some(k / SIZE), "{id}: item {k}'s page");
            assert_eq!(row.status, "ok");
            assert_eq!(row.error, None);
            assert!(row.item.as_ref() == Some(item), "{id}: item {k}: {row:?}");
        }
    }
    assert_eq!(at, rows.len(), "no row of an ID not in the input");
}

#[test]
fn every_item_of_every_id_is_a_row_once_in_order_in_each_format_and_no_id_is_left_out() {
    let h = Harness::new(ApiConfig::fast());
    // Two IDs of 40 pages, one of none, one of a page and a half, one that loops (failed).
    let ids: Vec<String> = ["p2000-a", "p0-none", "p1000-loop-x", "p75-b", "p2000-c"]
        .map(String::from)
        .to_vec();
    let input = h.ids_file("ids.txt", &ids);
    let url = format!("{}?limit={SIZE}", h.api.pages_cursor_url_template());
    let state = h.state();
    h.run_new(&state, &input, &url, &CURSOR).expect_code(3);
    for format in FORMATS {
        let rows = per_item(&h, &state, format, &[]);
        assert_eq!(rows.len(), 2000 + 1 + 1 + 75 + 2000, "{format}");
        check_rows(&h, &rows, &ids, "the pages loop");
    }
    // The same rows through standard output.
    let out = h.run(&["export", "--state", p(&state), "--per-item"]);
    out.expect_code(0);
    check_rows(&h, &jsonl_rows(&out.stdout), &ids, "the pages loop");
    // A status keeps the rows of its IDs.
    let failed = per_item(&h, &state, "csv", &["--status", "failed"]);
    assert_eq!(failed.len(), 1, "{failed:?}");
    check_no_item(&failed[0], "p1000-loop-x", "failed");
    let ok = per_item(&h, &state, "parquet", &["--status", "ok"]);
    let ok_ids: Vec<String> = ids
        .iter()
        .filter(|id| !id.contains("loop"))
        .cloned()
        .collect();
    check_rows(&h, &ok, &ok_ids, "");
}

#[cfg(feature = "postgres")]
#[test]
fn a_paginated_job_in_postgresql_exports_the_same_rows() {
    let h = Harness::new(ApiConfig::fast());
    let ids: Vec<String> = ["p2000-a", "p0-none", "p1000-loop-x", "p75-b"]
        .map(String::from)
        .to_vec();
    let input = h.ids_file("ids.txt", &ids);
    let url = format!("{}?limit={SIZE}", h.api.pages_cursor_url_template());
    let fleet = crate::fleet::Fleet::new(&h, "per-item");
    let flags = [&["--url", url.as_str()][..], &CURSOR[..]].concat();
    finish(fleet.create(&input, &flags)).expect_code(3);
    let place = ["--state", fleet.url(), "--job", fleet.job()];
    for format in FORMATS {
        let rows = per_item_of(&h, &place, format, &[]);
        check_rows(&h, &rows, &ids, "the pages loop");
    }
}

#[test]
fn a_job_that_does_not_page_gives_one_row_per_id_its_body_as_item_0() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 200,
        ..ApiConfig::fast()
    });
    let ids = ids(40);
    let (_, state) = h.finished_job(&ids, &[]);
    let failed = ids.iter().filter(|id| h.api.fault(id) == Fault::NotFound);
    assert!(failed.count() > 0, "some IDs fail");
    for format in FORMATS {
        let rows = per_item(&h, &state, format, &[]);
        let exported: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(exported, ids, "{format}: one row per ID, in input order");
        for row in &rows {
            if h.api.fault(&row.id) == Fault::NotFound {
                check_no_item(row, &row.id, "failed");
                assert!(row.error.as_deref().unwrap().contains("404"), "{row:?}");
            } else {
                assert_eq!(row.status, "ok", "{row:?}");
                assert_eq!((row.index, row.page), (Some(0), None), "{row:?}");
                assert_eq!(row.item, Some(h.api.expected_body(&row.id)), "{row:?}");
            }
        }
    }
}

#[test]
fn an_id_of_200_000_items_runs_and_exports_one_row_per_item_in_flat_memory() {
    // 200,000 items of about 300 bytes (60 MB), in pages of 1,000. The export writes them
    // as the pages are read, Parquet in row groups: its peak stays where a few pages put it.
    const ITEMS: u64 = 200_000;
    const MOST_MIB: u64 = 150;
    let h = Harness::new(ApiConfig {
        page_item_pad: 260,
        ..ApiConfig::fast()
    });
    let id = format!("p{ITEMS}-big");
    let input = h.ids_file("ids.txt", std::slice::from_ref(&id));
    let url = format!("{}?limit=1000", h.api.pages_cursor_url_template());
    let state = h.state();
    // The run too: its pages are written as they come, never held together.
    let ran = h.run_new(&state, &input, &url, &CURSOR);
    ran.expect_code(0);
    assert!(peak_mib(&ran) < MOST_MIB, "the run: {}", ran.stderr);
    for format in FORMATS {
        let output = h.path(&format!("big.{format}"));
        let run = h.run(&[
            "export",
            "--state",
            p(&state),
            "--per-item",
            "--format",
            format,
            "--output",
            p(&output),
        ]);
        run.expect_code(0)
            .expect_stderr(&format!("wrote {ITEMS} rows to"));
        let peak = peak_mib(&run);
        assert!(peak < MOST_MIB, "the {format} export: {}", run.stderr);
        if format == "parquet" {
            let reader = SerializedFileReader::new(std::fs::File::open(&output).unwrap()).unwrap();
            assert!(
                reader.metadata().num_row_groups() > 1,
                "written in row groups"
            );
        }
        if format == "jsonl" {
            let text = std::fs::read_to_string(&output).unwrap();
            for (k, line) in (0..).zip(text.lines()) {
                let v: Value = serde_json::from_str(line).unwrap();
                assert_eq!(v["item_index"], k, "items in order");
                assert_eq!(v["page"], k / 1000);
                assert!(v["item"] == h.api.page_item(&id, k), "item {k}");
            }
        }
    }
}

#[test]
fn per_item_with_flatten_or_parquet_without_a_file_is_refused_with_a_clear_error() {
    let h = Harness::new(ApiConfig::fast());
    let (_, state) = h.finished_job(&ids(3), &[]);
    let output = h.path("x.parquet");
    let export = |extra: &[&str]| {
        let mut args = vec!["export", "--state", p(&state), "--per-item"];
        args.extend_from_slice(extra);
        h.run(&args)
    };
    export(&["--format", "parquet", "--flatten", "--output", p(&output)])
        .expect_refused(2, &["--flatten", "--per-item"]);
    assert!(!output.exists(), "nothing written");
    export(&["--format", "parquet"]).expect_refused(2, &["--output"]);
}
