//! A folder as the input: its data files in name order read as one input (CSV with a header
//! per file, Parquet), files added later planned as a grown input, a changed or inserted
//! planned file refused, bad lines named by their file.

use std::path::{Path, PathBuf};

use highwater::demo::api::ApiConfig;

use crate::harness::*;
use crate::inputs::parquet_input;

/// `n` IDs from `from` on.
fn some_ids(from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("user-{i:04}")).collect()
}

/// A folder `name` in the scratch directory, with the files Spark writes beside its data.
fn spark_folder(h: &Harness, name: &str) -> PathBuf {
    let dir = h.path(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("_SUCCESS"), "").unwrap();
    std::fs::write(dir.join(".part-0000.csv.crc"), "not data").unwrap();
    dir
}

/// Write `ids` as a CSV part file with its own header row.
fn csv_part(dir: &Path, name: &str, ids: &[String]) {
    let mut text = String::from("name,id\n");
    for id in ids {
        text.push_str(&format!("someone,{id}\n"));
    }
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn a_folder_of_three_csv_files_then_a_fourth_added_runs_as_a_grown_input() {
    let h = Harness::new(ApiConfig::fast());
    let dir = spark_folder(&h, "users");
    let parts = [some_ids(0, 30), some_ids(30, 25), some_ids(55, 20)];
    for (n, ids) in parts.iter().enumerate() {
        csv_part(&dir, &format!("part-{n:04}.csv"), ids);
    }
    let state = h.state();
    // Buckets of 7 rows: some span two files.
    h.run_new(
        &state,
        &dir,
        &h.url(),
        &["--id-column", "id", "--bucket-size", "7"],
    )
    .expect_no_panic()
    .expect_code(0);
    let first: Vec<String> = parts.concat();
    h.check_export_exactly_once(&h.export(&state), &first);
    for id in &first {
        assert_eq!(h.api.calls(id), 1, "{id}");
    }
    let status = h.status(&state);
    assert_eq!(status["stats"]["rows_read"], 75, "{status}");
    assert_eq!(status["input"], canonical(&dir), "{status}");

    // Spark writes another part: only its IDs are called.
    let fourth = some_ids(75, 12);
    csv_part(&dir, "part-0003.csv", &fourth);
    h.resume(&state, &[]).expect_no_panic().expect_code(0);
    let all: Vec<String> = [first.clone(), fourth.clone()].concat();
    h.check_export_exactly_once(&h.export(&state), &all);
    for id in &all {
        assert_eq!(h.api.calls(id), 1, "{id}");
    }
    assert_eq!(h.api.total_calls(), 87);
    let status = h.status(&state);
    assert_eq!(status["stats"]["rows_read"], 87, "{status}");
    assert_eq!(status["finished"], true, "{status}");
}

#[test]
fn a_glob_reads_the_files_it_matches_and_a_new_match_is_a_grown_input() {
    let h = Harness::new(ApiConfig::fast());
    let dir = spark_folder(&h, "mixed");
    csv_part(&dir, "users-1.csv", &some_ids(0, 10));
    csv_part(&dir, "users-2.csv", &some_ids(10, 10));
    std::fs::write(dir.join("notes.txt"), "not IDs\n").unwrap();
    let glob = dir.join("users-*.csv");
    let state = h.state();
    h.run_new(
        &state,
        &glob,
        &h.url(),
        &["--id-column", "id", "--bucket-size", "3"],
    )
    .expect_no_panic()
    .expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &some_ids(0, 20));
    csv_part(&dir, "users-3.csv", &some_ids(20, 5));
    csv_part(&dir, "zzz.csv", &some_ids(100, 5));
    h.resume(&state, &[]).expect_no_panic().expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &some_ids(0, 25));
    assert_eq!(h.api.total_calls(), 25);
}

#[test]
fn a_changed_planned_file_or_one_inserted_before_the_last_is_refused_naming_it() {
    let h = Harness::new(ApiConfig::fast());
    let dir = spark_folder(&h, "ids");
    for n in 0..3 {
        std::fs::write(
            dir.join(format!("part-{n}.txt")),
            some_ids(n * 10, 10).join("\n") + "\n",
        )
        .unwrap();
    }
    let state = h.state();
    h.run_new(&state, &dir, &h.url(), &["--bucket-size", "4"])
        .expect_no_panic()
        .expect_code(0);
    let calls = h.api.total_calls();
    assert_eq!(calls, 30);

    let middle = dir.join("part-1.txt");
    let planned = std::fs::read(&middle).unwrap();
    std::fs::write(&middle, "someone-else\n").unwrap();
    h.resume(&state, &[])
        .expect_refused(1, &[&canonical(&middle), "has changed"]);
    std::fs::write(&middle, &planned).unwrap();

    let inserted = dir.join("part-1a.txt");
    std::fs::write(&inserted, "new-one\n").unwrap();
    h.resume(&state, &[])
        .expect_refused(1, &[&canonical(&inserted), "sorts before part-2.txt"]);
    std::fs::remove_file(&inserted).unwrap();

    std::fs::remove_file(&middle).unwrap();
    h.resume(&state, &[])
        .expect_refused(1, &["part-1.txt", "removed or renamed"]);
    std::fs::write(&middle, &planned).unwrap();

    h.resume(&state, &[]).expect_no_panic().expect_code(0);
    assert_eq!(h.api.total_calls(), calls, "nothing was called again");
}

#[test]
fn a_bad_line_in_the_second_file_is_named_by_that_file_and_line() {
    let h = Harness::new(ApiConfig::fast());
    let dir = h.path("jsonl");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("a.jsonl"), "{\"id\":\"a1\"}\n{\"id\":\"a2\"}\n").unwrap();
    std::fs::write(
        dir.join("b.jsonl"),
        "{\"id\":\"b1\"}\n\n{\"other\":1}\n{\"id\":\"b2\"}\n",
    )
    .unwrap();
    let state = h.state();
    let bad = format!(
        "{}:3: object has no field \"id\"",
        canonical(&dir.join("b.jsonl"))
    );
    h.run_new(&state, &dir, &h.url(), &["--id-field", "id"])
        .expect_refused(1, &[&bad, "--skip-bad-lines"]);
    h.resume(&state, &["--skip-bad-lines"])
        .expect_no_panic()
        .expect_code(0);
    let ids: Vec<String> = ["a1", "a2", "b1", "b2"].map(String::from).to_vec();
    h.check_export_exactly_once(&h.export(&state), &ids);
    let status = h.status(&state);
    assert_eq!(status["stats"]["bad_lines"], 1, "{status}");
    assert_eq!(status["bad_line_examples"][0]["row"], 3, "{status}");
    assert_eq!(status["bad_line_examples"][0]["line"], 3, "{status}");
    assert_eq!(
        status["bad_line_examples"][0]["reason"], "b.jsonl: object has no field \"id\"",
        "{status}"
    );
}

#[test]
fn a_folder_of_parquet_files_killed_and_resumed_gives_every_id_once() {
    let h = Harness::new(ApiConfig::fast());
    let dir = spark_folder(&h, "curated");
    let mut all = Vec::new();
    for n in 0..3 {
        let ids = some_ids(n * 700, 700);
        let rows: Vec<Option<String>> = ids.iter().cloned().map(Some).collect();
        parquet_input(
            &h,
            &format!("curated/part-{n:05}.snappy.parquet"),
            &rows,
            300,
        );
        all.extend(ids);
    }
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &dir, &url);
    args.extend([
        "--id-column",
        "id",
        "--bucket-size",
        "50",
        "--concurrency",
        "4",
    ]);
    // Killed in the first file, then in the third.
    for calls in [500, 1600] {
        let mut child = h.spawn(&args);
        assert!(h.wait_for_calls(&mut child, calls), "the run ended early");
        child.kill().unwrap();
        child.wait().unwrap();
    }
    h.resume(&state, &[]).expect_no_panic().expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &all);
    let status = h.status(&state);
    assert_eq!(status["stats"]["rows_read"], 2100, "{status}");
    assert!(
        status["input_format"]
            .as_str()
            .unwrap()
            .starts_with("parquet"),
        "{status}"
    );
}

#[test]
fn an_empty_folder_or_one_of_mixed_formats_is_refused_before_anything_is_created() {
    let h = Harness::new(ApiConfig::fast());
    let dir = spark_folder(&h, "empty");
    let state = h.state();
    h.run_new(&state, &dir, &h.url(), &["--input-format", "text"])
        .expect_refused(1, &[&canonical(&dir), "holds no data files"]);
    std::fs::write(dir.join("a.csv"), "id\n1\n").unwrap();
    std::fs::write(dir.join("b.txt"), "2\n").unwrap();
    h.run_new(&state, &dir, &h.url(), &[])
        .expect_refused(2, &["a.csv is csv", "b.txt is text"]);
    assert!(!state.exists(), "nothing is created for a refused job");
    assert_eq!(h.api.total_calls(), 0);
}
