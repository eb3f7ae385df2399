//! Parquet files through [`InputReader`]: IDs of each column type, kept columns, cursors at
//! any row, and the files and columns refused up front.

use super::super::parquet::test_file::{self, Col};
use crate::input::{Cursor, InputFormat, InputReader, InputSpec};

fn spec(path: &std::path::Path, column: &str) -> InputSpec {
    InputSpec {
        path: path.to_owned(),
        format: InputFormat::Parquet {
            column: column.into(),
        },
    }
}

type Rows = Vec<(u64, u64, Result<String, String>)>;

fn all(spec: &InputSpec, cursor: Cursor) -> (Rows, Cursor) {
    let mut r = InputReader::open(spec, cursor).unwrap();
    let mut out = vec![];
    while let Some(row) = r.next_row().unwrap() {
        out.push((row.index, row.line, row.id));
    }
    (out, r.cursor())
}

fn refused(spec: &InputSpec) -> String {
    InputReader::open(spec, Cursor::default())
        .err()
        .expect("refused")
        .to_string()
}

#[test]
fn string_ids_across_row_groups_with_null_and_empty_as_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.parquet");
    test_file::ids(
        &path,
        &[
            vec![Some("a"), Some("b/é"), None],
            vec![Some("c"), Some(""), Some(" d ")],
            vec![],
            vec![Some("e")],
        ],
        2,
    );
    let spec = spec(&path, "id");
    let reader = InputReader::open(&spec, Cursor::default()).unwrap();
    assert_eq!(reader.rows_in_file(), Some(7));
    let (rows, end) = all(&spec, Cursor::default());
    assert_eq!(
        rows,
        vec![
            (0, 1, Ok("a".into())),
            (1, 2, Ok("b/é".into())),
            (2, 3, Err("ID is null".into())),
            (3, 4, Ok("c".into())),
            (4, 5, Err("ID is empty".into())),
            (5, 6, Ok("d".into())),
            (6, 7, Ok("e".into())),
        ]
    );
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(
        end,
        Cursor {
            byte: len,
            line: 8,
            row: 7
        }
    );
}

#[test]
fn kept_columns_are_read_in_step_with_the_id_across_pages_and_row_groups() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows.parquet");
    let names = |from: usize, n: usize| -> Vec<Option<&'static str>> {
        (from..from + n)
            .map(|i| match i {
                4 => None,
                i => Some(["Smith, J", "é/?", "x"][i % 3]),
            })
            .collect()
    };
    test_file::write(
        &path,
        "message m { required binary id (UTF8); optional binary name (UTF8); \
         required int64 n; optional double score; optional int32 u (UINT_32); }",
        vec![
            vec![
                Col::Str(vec![Some("a"), Some("b"), Some("c"), Some("d"), Some("e")]),
                Col::Str(names(0, 5)),
                Col::I64(vec![Some(1), Some(2), Some(3), Some(4), Some(5)]),
                Col::F64(vec![Some(0.5), Some(f64::NAN), None, Some(-2.0), Some(1e3)]),
                Col::I32(vec![Some(-1), Some(1), Some(2), Some(3), Some(4)]),
            ],
            vec![
                Col::Str(vec![Some("f"), Some("g")]),
                Col::Str(names(5, 2)),
                Col::I64(vec![Some(6), Some(7)]),
                Col::F64(vec![Some(6.0), Some(7.25)]),
                Col::I32(vec![Some(6), Some(7)]),
            ],
        ],
        2,
    );
    let read = |cursor: Cursor, columns: &[&str]| {
        let mut r = InputReader::open(&spec(&path, "id"), cursor).unwrap();
        let columns: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        r.keep_columns(&columns).unwrap();
        let mut out = vec![];
        while let Some(row) = r.next_row().unwrap() {
            out.push((row.index, row.id, row.values));
        }
        out
    };
    let rows = read(Cursor::default(), &["name", "n", "u"]);
    let value =
        |name: &str, n: u64, u: u64| Some(format!(r#"{{"n":{n},"name":{name:?},"u":{u}}}"#));
    assert_eq!(
        rows,
        vec![
            (0, Ok("a".into()), value("Smith, J", 1, 4294967295)),
            (1, Ok("b".into()), value("é/?", 2, 1)),
            (2, Ok("c".into()), value("x", 3, 2)),
            (3, Ok("d".into()), value("Smith, J", 4, 3)),
            (4, Err("column \"name\" is null".into()), None),
            (5, Ok("f".into()), value("x", 6, 6)),
            (6, Ok("g".into()), value("Smith, J", 7, 7)),
        ]
    );
    // Started at any row, every column starts there.
    for start in 0..7 {
        let cursor = Cursor {
            row: start,
            ..Cursor::default()
        };
        assert_eq!(
            read(cursor, &["name", "n", "u"]),
            rows[start as usize..],
            "from row {start}"
        );
    }
    // A double JSON cannot write (NaN) and a null are bad rows.
    let scores: Vec<_> = read(Cursor::default(), &["score"])
        .into_iter()
        .map(|(_, id, v)| match v {
            Some(v) => Ok(v),
            None => Err(id.unwrap_err()),
        })
        .collect();
    assert_eq!(scores[0], Ok(r#"{"score":0.5}"#.into()));
    assert!(
        scores[1].as_ref().unwrap_err().contains("NaN"),
        "{scores:?}"
    );
    assert_eq!(scores[2], Err("column \"score\" is null".into()));
    assert_eq!(scores[6], Ok(r#"{"score":7.25}"#.into()));
    let mut r = InputReader::open(&spec(&path, "id"), Cursor::default()).unwrap();
    let err = r.keep_columns(&["nope".into()]).unwrap_err().to_string();
    assert!(err.contains("no column \"nope\""), "{err}");
}

#[test]
fn integer_ids_become_decimal_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.parquet");
    test_file::write(
        &path,
        "message m { required int64 id; optional int32 u (UINT_32); required int32 small; }",
        vec![
            vec![
                Col::I64(vec![Some(-7), Some(9_007_199_254_740_993)]),
                Col::I32(vec![Some(-1), None]),
                Col::I32(vec![Some(3), Some(-4)]),
            ],
            vec![
                Col::I64(vec![Some(0)]),
                Col::I32(vec![Some(5)]),
                Col::I32(vec![Some(i32::MIN)]),
            ],
        ],
        100,
    );
    let ids = |column| {
        all(&spec(&path, column), Cursor::default())
            .0
            .into_iter()
            .map(|r| r.2)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids("id"),
        [
            Ok("-7".into()),
            Ok("9007199254740993".into()),
            Ok("0".into())
        ]
    );
    assert_eq!(
        ids("u"),
        [
            Ok("4294967295".into()),
            Err("ID is null".into()),
            Ok("5".into())
        ]
    );
    assert_eq!(
        ids("small"),
        [Ok("3".into()), Ok("-4".into()), Ok("-2147483648".into())]
    );
}

#[test]
fn a_cursor_restarts_at_any_row_as_a_full_read_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.parquet");
    let group = |n: usize, nulls: usize| -> Vec<Option<&'static str>> {
        (0..n)
            .map(|i| {
                if i % nulls == 3 {
                    None
                } else {
                    Some(&*Box::leak(format!("id{i}").into_boxed_str()))
                }
            })
            .collect()
    };
    test_file::ids(&path, &[group(250, 50), group(1, 7), group(400, 90)], 64);
    let spec = spec(&path, "id");
    let (full, _) = all(&spec, Cursor::default());
    assert_eq!(full.len(), 651);
    let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
    for at in 0..=full.len() {
        let cursor = r.cursor();
        assert_eq!(cursor.row, at as u64);
        if at % 13 == 0 || (248..=252).contains(&at) || at + 2 >= full.len() {
            assert_eq!(all(&spec, cursor).0, full[at..], "from row {at}");
            // Only the row is needed to start again.
            let bare = Cursor {
                row: at as u64,
                ..Cursor::default()
            };
            assert_eq!(all(&spec, bare).0, full[at..], "from bare row {at}");
        }
        r.next_row().unwrap();
    }
}

#[test]
fn binary_ids_must_be_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.parquet");
    test_file::write(
        &path,
        "message m { required binary id; }",
        vec![vec![Col::Bytes(vec![
            Some(b"ok-1"),
            Some(b"\xff\xfe"),
            Some(b"ok-2"),
        ])]],
        10,
    );
    let rows = all(&spec(&path, "id"), Cursor::default()).0;
    assert_eq!(
        rows,
        vec![
            (0, 1, Ok("ok-1".into())),
            (1, 2, Err("ID is not valid UTF-8".into())),
            (2, 3, Ok("ok-2".into())),
        ]
    );
}

#[test]
fn a_missing_column_names_the_file_and_its_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.parquet");
    test_file::write(
        &path,
        "message m { required int64 user_id; optional binary name (UTF8); }",
        vec![vec![Col::I64(vec![Some(1)]), Col::Str(vec![Some("ann")])]],
        10,
    );
    let err = refused(&spec(&path, "id"));
    assert!(err.contains("ids.parquet"), "{err}");
    assert!(err.contains("no column \"id\""), "{err}");
    assert!(err.contains("user_id, name"), "{err}");
}

#[test]
fn columns_that_cannot_hold_ids_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.parquet");
    test_file::write(
        &path,
        "message m { required double score; required int32 day (DATE); }",
        vec![vec![Col::F64(vec![Some(1.5)]), Col::I32(vec![Some(1)])]],
        10,
    );
    let err = refused(&spec(&path, "score"));
    assert!(err.contains("\"score\" holds DOUBLE"), "{err}");
    assert!(
        err.contains("strings (or binary UTF-8) or integers"),
        "{err}"
    );
    let err = refused(&spec(&path, "day"));
    assert!(err.contains("\"day\" holds INT32 (Date)"), "{err}");

    let nested = dir.path().join("nested.parquet");
    test_file::write(
        &nested,
        "message m { optional group info { optional binary name (UTF8); } required int32 n; }",
        vec![vec![Col::Str(vec![None]), Col::I32(vec![Some(1)])]],
        10,
    );
    let err = refused(&spec(&nested, "info"));
    assert!(err.contains("\"info\" is nested"), "{err}");

    let repeated = dir.path().join("repeated.parquet");
    test_file::write(&repeated, "message m { repeated int64 ids; }", vec![], 10);
    let err = refused(&spec(&repeated, "ids"));
    assert!(err.contains("\"ids\" is repeated"), "{err}");

    let text = dir.path().join("not.parquet");
    std::fs::write(&text, "id\n1\n").unwrap();
    let err = refused(&spec(&text, "id"));
    assert!(
        err.contains("not.parquet: cannot read it as Parquet"),
        "{err}"
    );
}

#[test]
fn a_file_without_rows_reads_as_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.parquet");
    test_file::ids(&path, &[], 10);
    assert!(all(&spec(&path, "id"), Cursor::default()).0.is_empty());
}
