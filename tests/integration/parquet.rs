//! Results as Parquet: `export --format parquet`, with and without `--flatten`, read back
//! with the parquet crate, every row checked.

use std::collections::HashMap;

use parquet::basic::Type as Physical;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

use crate::answers::{number, AnswerApi};
use crate::harness::{new_job_args, p, Harness};
use highwater::demo::api::ApiConfig;

type Row = HashMap<String, Field>;

/// Column names with their physical types, and every row by ID.
fn read(path: &std::path::Path) -> (Vec<(String, Physical)>, HashMap<String, Row>) {
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let columns = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| (c.name().to_string(), c.physical_type()))
        .collect();
    let mut rows = HashMap::new();
    for row in reader.get_row_iter(None).unwrap() {
        let row: Row = row
            .unwrap()
            .get_column_iter()
            .map(|(n, f)| (n.clone(), f.clone()))
            .collect();
        let Field::Str(id) = &row["id"] else {
            panic!("id is a string: {row:?}")
        };
        assert!(rows.insert(id.clone(), row).is_none(), "one row per ID");
    }
    (columns, rows)
}

#[test]
fn parquet_export_has_the_documented_columns_and_every_row() {
    let h = Harness::new(ApiConfig::default());
    let api = AnswerApi::start(&h);
    let ids: Vec<String> = (0..30)
        .map(|i| format!("{}-{i}", if i % 3 == 0 { "err" } else { "ok" }))
        .collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let mut args = new_job_args(&state, &input, &api.url);
    args.extend([
        "--fail-if",
        ".error != null",
        "--extract",
        r#"{value, name, half: (.value / 2), even: (.value % 2 == 0), id: "inner"}"#,
    ]);
    h.run(&args).expect_code(3);

    let out = h.path("results.parquet");
    let export = |extra: &[&str]| {
        let mut args = vec![
            "export",
            "--state",
            p(&state),
            "--format",
            "parquet",
            "--output",
            p(&out),
        ];
        args.extend(extra);
        h.run(&args)
    };
    export(&[]).expect_code(0).expect_stderr("wrote 30 records");
    let (columns, rows) = read(&out);
    use Physical::*;
    let fixed = [
        ("id", BYTE_ARRAY),
        ("status", BYTE_ARRAY),
        ("http_status", INT32),
        ("attempts", INT64),
        ("bucket", INT64),
        ("error_class", BYTE_ARRAY),
        ("error", BYTE_ARRAY),
    ];
    let mut expected: Vec<(String, Physical)> =
        fixed.iter().map(|(n, t)| (n.to_string(), *t)).collect();
    expected.push(("body".into(), BYTE_ARRAY));
    assert_eq!(columns, expected);
    assert_eq!(rows.len(), ids.len());
    for id in &ids {
        let r = &rows[id];
        assert_eq!(r["http_status"], Field::Int(200));
        assert_eq!(r["attempts"], Field::Long(1));
        assert_eq!(r["bucket"], Field::Long(0));
        if id.starts_with("err") {
            assert_eq!(r["status"], Field::Str("failed".into()));
            assert_eq!(r["error_class"], Field::Str("invalid".into()));
            assert!(
                matches!(&r["error"], Field::Str(e) if e.contains("fail-if")),
                "{r:?}"
            );
            assert_eq!(r["body"], Field::Null);
        } else {
            assert_eq!(r["status"], Field::Str("ok".into()));
            assert_eq!(r["error"], Field::Null);
            let Field::Str(body) = &r["body"] else {
                panic!("{r:?}")
            };
            let body: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(body["value"], number(id));
        }
    }

    // --flatten: the extracted fields as typed columns; `id` is a fixed name, so body_id.
    export(&["--flatten", "--status", "ok"]).expect_code(0);
    let (columns, rows) = read(&out);
    let mut expected: Vec<(String, Physical)> =
        fixed.iter().map(|(n, t)| (n.to_string(), *t)).collect();
    expected.extend([
        ("value".into(), INT64),
        ("name".into(), BYTE_ARRAY),
        ("half".into(), DOUBLE),
        ("even".into(), BOOLEAN),
        ("body_id".into(), BYTE_ARRAY),
    ]);
    assert_eq!(columns, expected);
    let ok: Vec<&String> = ids.iter().filter(|id| id.starts_with("ok")).collect();
    assert_eq!(rows.len(), ok.len());
    for id in ok {
        let r = &rows[id];
        let n = number(id);
        assert_eq!(r["value"], Field::Long(n as i64), "{r:?}");
        assert_eq!(r["name"], Field::Str(format!("item {id}")));
        assert_eq!(r["half"], Field::Double(n as f64 / 2.0));
        assert_eq!(r["even"], Field::Bool(n % 2 == 0));
        assert_eq!(r["body_id"], Field::Str("inner".into()));
    }

    // Only failed ones.
    export(&["--status", "failed"]).expect_code(0);
    let (_, rows) = read(&out);
    assert_eq!(
        rows.len(),
        ids.iter().filter(|id| id.starts_with("err")).count()
    );
    assert!(rows
        .values()
        .all(|r| r["status"] == Field::Str("failed".into())));
    // No temp file is left beside the output.
    let left: Vec<_> = std::fs::read_dir(h.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn parquet_needs_a_file_and_flatten_needs_parquet() {
    let h = Harness::new(ApiConfig::default());
    let ids = vec!["a".to_string()];
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    h.run(&new_job_args(&state, &input, &url)).expect_code(0);
    h.run(&["export", "--state", p(&state), "--format", "parquet"])
        .expect_code(2)
        .expect_stderr("--output");
    h.run(&["export", "--state", p(&state), "--flatten"])
        .expect_code(2)
        .expect_stderr("--flatten");
}
