//! Single files through [`InputReader`]: text, CSV and JSONL rows, kept columns, cursors
//! that resume, bounded reads, overlong lines and the fingerprint.

use std::io::Write;
use std::path::PathBuf;

use crate::input::file::MAX_LINE_BYTES;
use crate::input::{Cursor, Fingerprint, InputFormat, InputReader, InputSpec};

fn write(content: &[u8], ext: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("input.{ext}"));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(content)
        .unwrap();
    (dir, path)
}

#[test]
fn a_bounded_reader_stops_at_the_fingerprinted_length() {
    let ids = |spec: &InputSpec, cursor: Cursor, end: u64| {
        let mut r = InputReader::open_bounded(spec, cursor, end).unwrap();
        let mut out = vec![];
        while let Some(row) = r.next_row().unwrap() {
            out.push(row.id.unwrap());
        }
        (out, r.cursor())
    };
    // The job saw "a\nb\n"; a producer has since written "c\nd" (d still being written).
    let (_d, path) = write(b"a\nb\nc\nd", "txt");
    let text = InputSpec {
        path,
        format: InputFormat::Text,
    };
    let (got, cursor) = ids(&text, Cursor::default(), 4);
    assert_eq!(got, ["a", "b"]);
    assert_eq!(cursor.byte, 4);
    // Resumed at the end, nothing more is read until the input is checked again.
    assert!(ids(&text, cursor, 4).0.is_empty());
    // Checked again at 6 bytes: only "c", never the half-written "d".
    assert_eq!(ids(&text, cursor, 6).0, ["c"]);

    let (_d, path) = write(b"id,x\n1,a\n2,b\n3,c\n4", "csv");
    let csv = InputSpec {
        path,
        format: InputFormat::Csv {
            column: "id".into(),
        },
    };
    let (got, cursor) = ids(&csv, Cursor::default(), 13);
    assert_eq!(got, ["1", "2"]);
    assert_eq!(ids(&csv, cursor, 17).0, ["3"]);
}

fn all(spec: &InputSpec, cursor: Cursor) -> Vec<(u64, u64, Result<String, String>)> {
    let mut r = InputReader::open(spec, cursor).unwrap();
    let mut out = vec![];
    while let Some(row) = r.next_row().unwrap() {
        out.push((row.index, row.line, row.id));
    }
    out
}

/// Every row's ID (or why none) with its kept values, read from `cursor` on.
fn kept(
    spec: &InputSpec,
    cursor: Cursor,
    columns: &[&str],
) -> Vec<(Result<String, String>, Option<String>)> {
    let mut r = InputReader::open(spec, cursor).unwrap();
    let columns: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
    r.keep_columns(&columns).unwrap();
    let mut out = vec![];
    while let Some(row) = r.next_row().unwrap() {
        out.push((row.id, row.values));
    }
    out
}

#[test]
fn kept_csv_columns_are_read_beside_the_id_and_a_missing_one_is_a_bad_row() {
    let (_d, path) = write(
        "name,id,domain\n\"Smith, J\",1, a.example \n\"\"\"q\"\" é\",2,b\nc,3\n,4,\n".as_bytes(),
        "csv",
    );
    let spec = InputSpec {
        path: path.clone(),
        format: InputFormat::Csv {
            column: "id".into(),
        },
    };
    let rows = kept(&spec, Cursor::default(), &["domain", "name"]);
    assert_eq!(
        rows,
        vec![
            (
                Ok("1".into()),
                Some(r#"{"domain":" a.example ","name":"Smith, J"}"#.into())
            ),
            (
                Ok("2".into()),
                Some(r#"{"domain":"b","name":"\"q\" é"}"#.into())
            ),
            (
                Err("record has 2 fields, no value for the column \"domain\"".into()),
                None
            ),
            (Ok("4".into()), Some(r#"{"domain":"","name":""}"#.into())),
        ]
    );
    // Read again from a row's cursor, the values are the same.
    let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
    r.next_row().unwrap();
    assert_eq!(kept(&spec, r.cursor(), &["domain", "name"]), rows[1..]);
    let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
    let err = r.keep_columns(&["nme".into()]).unwrap_err().to_string();
    assert!(
        err.contains("no column \"nme\" (columns: name, id, domain)"),
        "{err}"
    );
    assert!(err.contains(&path.display().to_string()), "{err}");
}

#[test]
fn kept_jsonl_fields_keep_their_json_and_absent_or_null_is_a_bad_row() {
    let (_d, path) = write(
        concat!(
            r#"{"k":"a","geo":{"lat":1.5},"n":2}"#,
            "\n",
            r#"{"k":"b","n":3}"#,
            "\n",
            r#"{"k":"c","geo":null,"n":1}"#,
            "\n"
        )
        .as_bytes(),
        "jsonl",
    );
    let spec = InputSpec {
        path,
        format: InputFormat::Jsonl { field: "k".into() },
    };
    assert_eq!(
        kept(&spec, Cursor::default(), &["n", "geo"]),
        vec![
            (Ok("a".into()), Some(r#"{"geo":{"lat":1.5},"n":2}"#.into())),
            (Err("object has no field \"geo\"".into()), None),
            (Err("field \"geo\" is null".into()), None),
        ]
    );
    assert_eq!(
        kept(&spec, Cursor::default(), &[])[0],
        (Ok("a".into()), None)
    );
    let (_d, path) = write(b"a\n", "txt");
    let text = InputSpec {
        path,
        format: InputFormat::Text,
    };
    let mut r = InputReader::open(&text, Cursor::default()).unwrap();
    let err = r.keep_columns(&["x".into()]).unwrap_err().to_string();
    assert!(err.contains("no columns"), "{err}");
}

#[test]
fn text_trims_and_skips_blank_lines() {
    let (_d, path) = write(b"  a \r\n\n b/c?d#e%f \n\t\nz\xc3\xa9", "txt");
    let spec = InputSpec {
        path,
        format: InputFormat::Text,
    };
    let rows = all(&spec, Cursor::default());
    assert_eq!(
        rows,
        vec![
            (0, 1, Ok("a".into())),
            (1, 3, Ok("b/c?d#e%f".into())),
            (2, 5, Ok("zé".into()))
        ]
    );
}

#[test]
fn lines_blank_after_trimming_unicode_whitespace_are_not_rows() {
    let (_d, path) = write(
        b"\xef\xbb\xbf\r\nid-1\r\n\xc2\xa0\r\n\xe2\x80\x83\nid-2",
        "txt",
    );
    let spec = InputSpec {
        path,
        format: InputFormat::Text,
    };
    let rows = all(&spec, Cursor::default());
    assert_eq!(
        rows,
        vec![(0, 2, Ok("id-1".into())), (1, 5, Ok("id-2".into()))]
    );
}

#[test]
fn text_invalid_utf8_is_a_bad_row_with_its_line() {
    let (_d, path) = write(b"a\n\xff\xfe\nb\n", "txt");
    let spec = InputSpec {
        path,
        format: InputFormat::Text,
    };
    let rows = all(&spec, Cursor::default());
    assert_eq!(rows[1].0, 1);
    assert_eq!(rows[1].1, 2);
    assert!(rows[1].2.is_err());
    assert_eq!(rows[2].2, Ok("b".into()));
}

#[test]
fn cursor_resumes_at_the_same_rows() {
    let (_d, path) = write(b"a\n\nb\nc\r\nd\n", "txt");
    let spec = InputSpec {
        path,
        format: InputFormat::Text,
    };
    let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
    r.next_row().unwrap();
    r.next_row().unwrap();
    let cursor = r.cursor();
    let rest: Vec<_> = all(&spec, cursor);
    assert_eq!(rest, vec![(2, 4, Ok("c".into())), (3, 5, Ok("d".into()))]);
}

#[test]
fn csv_reads_the_named_column_and_resumes() {
    let (_d, path) = write(
        b"\xEF\xBB\xBFname,id\nx,1\n\ny,\"2,5\"\nshort\nz,3\n",
        "csv",
    );
    let spec = InputSpec {
        path,
        format: InputFormat::Csv {
            column: "id".into(),
        },
    };
    let rows = all(&spec, Cursor::default());
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0], (0, 2, Ok("1".into())));
    assert_eq!(rows[1], (1, 4, Ok("2,5".into())));
    assert_eq!(rows[2].1, 5);
    assert!(rows[2].2.is_err());
    assert_eq!(rows[3], (3, 6, Ok("3".into())));
    let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
    r.next_row().unwrap();
    r.next_row().unwrap();
    let rest = all(&spec, r.cursor());
    assert_eq!(rest[1], (3, 6, Ok("3".into())));
}

#[test]
fn csv_without_the_column_names_the_columns() {
    let (_d, path) = write(b"a,b\n1,2\n", "csv");
    let spec = InputSpec {
        path,
        format: InputFormat::Csv {
            column: "id".into(),
        },
    };
    let err = InputReader::open(&spec, Cursor::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no column \"id\""), "{err}");
    assert!(err.contains("a, b"), "{err}");
}

#[test]
fn jsonl_reads_strings_and_numbers_and_flags_bad_lines() {
    let (_d, path) = write(
        b"{\"id\":\"a\"}\n{\"id\":7}\n[1]\n{\"x\":1}\nnope\n{\"id\":null}\n",
        "jsonl",
    );
    let spec = InputSpec {
        path,
        format: InputFormat::Jsonl { field: "id".into() },
    };
    let rows = all(&spec, Cursor::default());
    assert_eq!(rows[0].2, Ok("a".into()));
    assert_eq!(rows[1].2, Ok("7".into()));
    assert!(rows[2]
        .2
        .as_ref()
        .unwrap_err()
        .contains("not a JSON object"));
    assert!(rows[3].2.as_ref().unwrap_err().contains("no field"));
    assert!(rows[4].2.as_ref().unwrap_err().contains("not valid JSON"));
    assert!(rows[5].2.is_err());
}

#[test]
fn overlong_lines_are_bad_rows_not_memory() {
    let mut content = vec![b'x'; MAX_LINE_BYTES + 10];
    content.extend_from_slice(b"\nok\n");
    let (_d, path) = write(&content, "txt");
    let spec = InputSpec {
        path,
        format: InputFormat::Text,
    };
    let rows = all(&spec, Cursor::default());
    assert!(rows[0].2.is_err());
    assert_eq!(rows[1], (1, 2, Ok("ok".into())));
}

#[test]
fn fingerprint_detects_change_and_prefix() {
    let (_d, path) = write(b"a\nb\n", "txt");
    let f1 = Fingerprint::of_file(&path).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"c\n")
        .unwrap();
    let f2 = Fingerprint::of_file(&path).unwrap();
    assert_ne!(f1, f2);
    assert_eq!(Fingerprint::of_prefix(&path, f1.len).unwrap(), f1);
    assert!(Fingerprint::of_prefix(&path, 100).is_err());
}
