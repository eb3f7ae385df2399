//! A folder of files read as one through [`InputReader`]: any cursor resumes across the
//! files, only the planned files are read, each file's reader as for a single file.

use std::path::Path;

use crate::input::{
    folder_files, folder_fingerprint, Cursor, InputFile, InputFormat, InputReader, InputSpec,
};

fn folder(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    dir
}

fn spec(dir: &Path, format: InputFormat) -> InputSpec {
    InputSpec {
        path: dir.to_owned(),
        format,
    }
}

/// Every row from `cursor` on: (index, line, file name, ID), and the cursor before each.
fn rows_from(spec: &InputSpec, cursor: Cursor) -> Vec<(Cursor, (u64, u64, String, String))> {
    let mut r = InputReader::open(spec, cursor).unwrap();
    let mut out = vec![];
    loop {
        let at = r.cursor();
        let Some(row) = r.next_row().unwrap() else {
            break;
        };
        let file = r.path().file_name().unwrap().to_str().unwrap().to_owned();
        out.push((
            at,
            (row.index, row.line, file, row.id.unwrap_or_else(|e| e)),
        ));
    }
    out
}

/// Reading from the cursor before any row gives the same rows as a read from the start.
fn check_every_cursor_resumes(spec: &InputSpec) -> Vec<(u64, u64, String, String)> {
    let all = rows_from(spec, Cursor::default());
    for (i, (cursor, _)) in all.iter().enumerate() {
        let rest: Vec<_> = rows_from(spec, *cursor).into_iter().map(|r| r.1).collect();
        let want: Vec<_> = all[i..].iter().map(|r| r.1.clone()).collect();
        assert_eq!(rest, want, "from {cursor:?}");
    }
    all.into_iter().map(|r| r.1).collect()
}

#[test]
fn csv_files_each_with_a_header_are_one_input_and_any_cursor_resumes() {
    let dir = folder(&[
        ("p0.csv", b"id,x\n1,a\n2,b\n"),
        ("p1.csv", b"x,id\na,3\n\nb,4"),
        ("p2.csv", b""),
        ("p3.csv", b"id\n5\n"),
    ]);
    let spec = spec(
        dir.path(),
        InputFormat::Csv {
            column: "id".into(),
        },
    );
    let rows = check_every_cursor_resumes(&spec);
    let s = |v: &str| v.to_string();
    assert_eq!(
        rows,
        vec![
            (0, 2, s("p0.csv"), s("1")),
            (1, 3, s("p0.csv"), s("2")),
            (2, 2, s("p1.csv"), s("3")),
            (3, 4, s("p1.csv"), s("4")),
            (4, 2, s("p3.csv"), s("5")),
        ]
    );
}

#[test]
fn text_files_read_across_boundaries_and_a_bad_line_names_its_file() {
    let dir = folder(&[
        ("a.txt", b"a\nb\n"),
        ("b.txt", b"\nc\n\xff\n"),
        ("c.txt", b"d"),
    ]);
    let spec = spec(dir.path(), InputFormat::Text);
    let rows = check_every_cursor_resumes(&spec);
    let got: Vec<_> = rows.iter().map(|r| (r.0, r.1, r.2.as_str())).collect();
    assert_eq!(
        got,
        [
            (0, 1, "a.txt"),
            (1, 2, "a.txt"),
            (2, 2, "b.txt"),
            (3, 3, "b.txt"),
            (4, 1, "c.txt")
        ]
    );
    assert_eq!(rows[3].3, "line is not valid UTF-8");
}

#[test]
fn only_the_planned_files_are_read_and_the_last_only_to_its_planned_length() {
    let dir = folder(&[("a.txt", b"a\nb\n"), ("b.txt", b"c\n")]);
    let planned = folder_files(dir.path()).unwrap();
    let end = folder_fingerprint(&planned).len;
    // Since planned: rows appended to the last file, and a new file.
    std::fs::write(dir.path().join("b.txt"), "c\nd\n").unwrap();
    std::fs::write(dir.path().join("c.txt"), "e\n").unwrap();
    let spec = spec(dir.path(), InputFormat::Text);
    let ids = |files: &[InputFile], cursor: Cursor, end: u64| {
        let mut r = InputReader::open_planned(&spec, files, cursor, end).unwrap();
        let mut out = vec![];
        while let Some(row) = r.next_row().unwrap() {
            out.push(row.id.unwrap());
        }
        (out, r.cursor())
    };
    let (got, at_end) = ids(&planned, Cursor::default(), end);
    assert_eq!(got, ["a", "b", "c"]);
    assert_eq!((at_end.byte, at_end.row), (end, 3));
    // Planned again as grown: from the old end on, the appended row, then the new file.
    let grown = folder_files(dir.path()).unwrap();
    let (got, _) = ids(&grown, at_end, folder_fingerprint(&grown).len);
    assert_eq!(got, ["d", "e"]);
}

#[test]
fn parquet_files_resume_at_any_row_across_files() {
    let dir = tempfile::tempdir().unwrap();
    let groups = |from: usize, n: usize| -> Vec<Vec<Option<&'static str>>> {
        let ids: Vec<Option<&'static str>> = (from..from + n)
            .map(|i| Some(&*Box::leak(format!("id{i}").into_boxed_str())))
            .collect();
        ids.chunks(7).map(|c| c.to_vec()).collect()
    };
    crate::input::parquet_test_file::ids(&dir.path().join("p0.parquet"), &groups(0, 20), 3);
    crate::input::parquet_test_file::ids(&dir.path().join("p1.parquet"), &[], 3);
    crate::input::parquet_test_file::ids(&dir.path().join("p2.parquet"), &groups(20, 9), 4);
    let spec = spec(
        dir.path(),
        InputFormat::Parquet {
            column: "id".into(),
        },
    );
    let rows = check_every_cursor_resumes(&spec);
    assert_eq!(rows.len(), 29);
    let reader = InputReader::open(&spec, Cursor::default()).unwrap();
    assert_eq!(reader.rows_in_file(), Some(29));
    assert_eq!(rows[19], (19, 20, "p0.parquet".into(), "id19".into()));
    assert_eq!(rows[20], (20, 1, "p2.parquet".into(), "id20".into()));
    assert_eq!(rows[28], (28, 9, "p2.parquet".into(), "id28".into()));
}
