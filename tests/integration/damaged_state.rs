//! A damaged or foreign state directory: refused with a clear message naming what is wrong,
//! never read as if intact, never silently repaired into lost results (but for what can be
//! derived again, like the ID index).

use std::path::Path;
use std::time::Duration;

use highwater::demo::api::ApiConfig;

use crate::harness::*;

#[test]
fn a_busy_state_directory_is_refused_naming_the_pid() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(20),
        latency_max: Duration::from_millis(20),
        ..ApiConfig::fast()
    });
    let ids = ids(1500);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut create = vec!["run", "--state", p(&state), "--input", p(&input)];
    create.extend(["--url", &url, "--concurrency", "2"]);
    create.extend(QUICK);
    let mut first = h.spawn(&create);
    assert!(h.wait_for_calls(&mut first, 5), "the first run ended early");
    let pid = format!("pid {}", first.id());

    // The same command again, and a plain resume.
    let second = h.run(&create);
    second.expect_refused(1, &["in use", &pid]);
    h.resume(&state, &[]).expect_refused(1, &["in use", &pid]);
    // `status` shows the live run (tests/integration/progress.rs); export says it is busy.
    let status = h.run(&["status", "--state", p(&state)]);
    status.expect_no_panic().expect_code(0);
    assert!(status.stdout.contains(&pid), "{}", status.stdout);
    h.run(&["export", "--state", p(&state)])
        .expect_refused(1, &["in use"]);

    // The first run was not disturbed; kill it and resume to the end.
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first run is still going"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    h.resume(&state, &["--concurrency", "64"])
        .expect_no_panic()
        .expect_code(0);
    h.check_export_exactly_once(&h.export(&state), &ids);
}

#[test]
fn a_directory_that_is_not_a_state_is_refused() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(10));

    // An existing directory with other files in it.
    let dir = h.path("photos");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("holiday.jpg"), b"not really").unwrap();
    h.run_new(&dir, &input, &h.url(), &[])
        .expect_refused(1, &["not a highwater state directory", p(&dir)]);
    assert_eq!(dir_entries(&dir), vec!["holiday.jpg"], "nothing written");
    h.run(&["status", "--state", p(&dir)])
        .expect_refused(1, &["not a highwater state directory"]);
    h.run(&["export", "--state", p(&dir)])
        .expect_refused(1, &["not a highwater state directory"]);
    assert_eq!(dir_entries(&dir), vec!["holiday.jpg"], "nothing written");

    // A directory that does not exist.
    let nope = h.path("nope");
    for missing in ["/nonexistent/highwater-state", p(&nope)] {
        h.run(&["status", "--state", missing])
            .expect_refused(1, &[missing]);
        h.run(&["export", "--state", missing])
            .expect_refused(1, &[missing]);
        h.run(&["run", "--state", missing])
            .expect_refused(1, &[missing]);
    }
    assert!(!nope.exists(), "a failed resume creates nothing");

    // A file.
    let file = h.file("state.txt", "hello");
    h.run_new(&file, &input, &h.url(), &[])
        .expect_refused(1, &[p(&file)]);
    h.run(&["status", "--state", p(&file)])
        .expect_refused(1, &[p(&file)]);
    h.resume(&file, &[]).expect_refused(1, &[p(&file)]);
    assert_eq!(std::fs::read(&file).unwrap(), b"hello");
    assert_eq!(h.api.total_calls(), 0);
}

#[test]
fn a_store_of_another_version_is_refused() {
    let h = Harness::new(ApiConfig::fast());
    let (input, state) = h.finished_job(&ids(20), &[]);
    let calls = h.api.total_calls();
    std::fs::write(
        state.join("highwater.json"),
        r#"{"format":"highwater-state","version":99}"#,
    )
    .unwrap();
    for args in [
        vec!["status", "--state", p(&state)],
        vec!["status", "--state", p(&state), "--json"],
        vec!["export", "--state", p(&state)],
        vec!["run", "--state", p(&state)],
    ] {
        h.run(&args).expect_refused(1, &["version 99"]);
    }
    h.run_new(&state, &input, &h.url(), &[])
        .expect_refused(1, &["version 99"]);
    assert_eq!(h.api.total_calls(), calls);
}

/// Creates a finished job, damages its sled files with `damage`, and checks that status,
/// export and run (a resume, and the creating command run again) refuse with exit 1 and a
/// message, without a panic and without calls.
///
/// With `intact_allowed`, a command may instead succeed if it shows exactly what the store
/// held before: sled reuses freed log segments, so cutting its file can cut only stale ones.
fn check_damaged_store(damage: impl Fn(&Path), intact_allowed: bool) {
    check_damaged_state(|state| damage(&state.join("sled")), intact_allowed)
}

/// [`check_damaged_store`] with `damage` given the whole state directory.
fn check_damaged_state(damage: impl Fn(&Path), intact_allowed: bool) {
    let h = Harness::new(ApiConfig::fast());
    let (input, state) = h.finished_job(&ids(600), &["--bucket-size", "50"]);
    let calls = h.api.total_calls();
    // What each command prints on the undamaged store (read from a copy, so the store's
    // own files are damaged as the run left them).
    let copy = h.dir.path().join("undamaged");
    copy_dir(&state, &copy);
    let undamaged = |args: &[&str]| {
        let mut args: Vec<&str> = args.to_vec();
        let at = args.iter().position(|a| *a == "--state").unwrap() + 1;
        args[at] = p(&copy);
        let run = h.run(&args);
        (run.code, run.stdout.replace(p(&copy), p(&state)))
    };
    let mut any_intact = false;
    damage(&state);
    let url = h.url();
    let mut problems = Vec::new();
    for args in [
        vec!["status", "--state", p(&state)],
        vec!["status", "--state", p(&state), "--json"],
        vec!["export", "--state", p(&state)],
        vec!["export", "--state", p(&state), "--format", "csv"],
        vec!["run", "--state", p(&state)],
        vec![
            "run",
            "--state",
            p(&state),
            "--input",
            p(&input),
            "--url",
            &url,
            "--bucket-size",
            "50",
        ],
    ] {
        let expected = intact_allowed.then(|| undamaged(&args));
        let before = h.api.total_calls();
        let run = h.run(&args);
        let panicked = run.stderr.contains("panicked") || run.stdout.contains("panicked");
        let called = h.api.total_calls() - before;
        let intact =
            expected.is_some_and(|(code, stdout)| run.code == code && run.stdout == stdout);
        any_intact |= intact;
        let refused = run.code == 1 && !run.stderr.trim().is_empty();
        if intact {
            eprintln!(
                "`{}`: the damage cut nothing the store still used",
                args.join(" ")
            );
        }
        if !(refused || intact) || panicked || called > 0 {
            problems.push(format!(
                "`{}` exited {} after {called} calls (stdout {} bytes) stderr: {}",
                args.join(" "),
                run.code,
                run.stdout.len(),
                run.stderr.trim()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "a damaged store was not refused with exit 1:\n{}",
        problems.join("\n")
    );
    if any_intact {
        // What a command accepted as intact left behind still reads as the undamaged store.
        let export = ["export", "--state", p(&state)];
        let after = h.run(&export);
        assert_eq!(
            (after.code, after.stdout),
            undamaged(&export),
            "a store taken as intact exports what it held"
        );
    }
    assert_eq!(h.api.total_calls(), calls, "a damaged store makes no calls");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The files sled keeps its data in: `db` and any `snap.*`.
fn sled_data_files(sled: &Path) -> Vec<std::path::PathBuf> {
    let files: Vec<_> = files_under(sled)
        .into_iter()
        .filter(|f| {
            let name = f.file_name().unwrap().to_string_lossy();
            name == "db" || name.starts_with("snap.")
        })
        .collect();
    assert!(
        !files.is_empty(),
        "no sled data files in {}",
        sled.display()
    );
    files
}

fn garbage(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn damaged_store_db_truncated_to_half_is_refused_or_reads_intact() {
    check_damaged_store(
        |sled| {
            for f in sled_data_files(sled) {
                let len = std::fs::metadata(&f).unwrap().len();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_len(len / 2)
                    .unwrap();
            }
        },
        true,
    );
}

#[test]
fn damaged_store_db_truncated_to_zero_is_refused() {
    check_damaged_store(
        |sled| {
            for f in sled_data_files(sled) {
                std::fs::write(&f, b"").unwrap();
            }
        },
        false,
    );
}

#[test]
fn damaged_store_db_overwritten_with_garbage_is_refused() {
    check_damaged_store(
        |sled| {
            for f in sled_data_files(sled) {
                let len = std::fs::metadata(&f).unwrap().len() as usize;
                std::fs::write(&f, garbage(len)).unwrap();
            }
        },
        false,
    );
}

#[test]
fn damaged_store_db_with_garbage_in_the_middle_is_refused_or_reads_intact() {
    check_damaged_store(
        |sled| {
            use std::io::{Seek, SeekFrom, Write};
            for f in sled_data_files(sled) {
                let len = std::fs::metadata(&f).unwrap().len();
                let mut file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                file.seek(SeekFrom::Start(len / 2)).unwrap();
                file.write_all(&garbage(4096.min(len as usize / 4)))
                    .unwrap();
            }
        },
        true,
    );
}

#[test]
fn damaged_store_db_deleted_is_refused() {
    check_damaged_store(
        |sled| {
            for f in sled_data_files(sled) {
                std::fs::remove_file(&f).unwrap();
            }
        },
        false,
    );
}

#[test]
fn damaged_store_sled_directory_deleted_is_refused() {
    check_damaged_store(|sled| std::fs::remove_dir_all(sled).unwrap(), false);
}

#[test]
fn damaged_store_sled_conf_overwritten_is_refused() {
    check_damaged_store(
        |sled| {
            let conf = sled.join("conf");
            let len = std::fs::metadata(&conf).unwrap().len() as usize;
            std::fs::write(&conf, garbage(len)).unwrap();
        },
        false,
    );
}

fn cut_to_half(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    assert!(len > 0, "{} is empty", file.display());
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
}

#[test]
fn damaged_store_results_log_truncated_is_refused() {
    check_damaged_state(|state| cut_to_half(&state.join("results.log")), false);
}

#[test]
fn damaged_store_results_log_deleted_is_refused() {
    check_damaged_state(
        |state| std::fs::remove_file(state.join("results.log")).unwrap(),
        false,
    );
}

#[test]
fn damaged_store_id_lists_truncated_is_refused() {
    check_damaged_state(|state| cut_to_half(&state.join("ids.log")), false);
}

#[test]
fn damaged_store_positions_deleted_is_refused() {
    check_damaged_state(
        |state| std::fs::remove_file(state.join("positions")).unwrap(),
        false,
    );
}

/// The positions file's durable length is recorded: every command refuses a shorter one,
/// `status` included (before, only `export` noticed).
#[test]
fn damaged_store_positions_cut_is_refused() {
    check_damaged_state(|state| cut_to_half(&state.join("positions")), false);
}

/// The ID index is derived from the offset log: deleted, or with its headers overwritten, it
/// is built again, and every command reads the store as it was; a job continued on the
/// larger input still sees the old IDs as duplicates.
#[test]
fn a_lost_or_damaged_id_index_is_built_again() {
    for (what, damage) in [
        (
            "deleted",
            Box::new(|index: &Path| std::fs::remove_file(index).unwrap()) as Box<dyn Fn(&Path)>,
        ),
        (
            "headers overwritten",
            Box::new(|index: &Path| {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().write(true).open(index).unwrap();
                f.write_all(&garbage(256 << 10)).unwrap();
            }),
        ),
    ] {
        let h = Harness::new(ApiConfig::fast());
        let all = ids(400);
        let (input, state) = h.finished_job(&all[..300], &["--bucket-size", "50"]);
        let before = (h.export(&state), h.status(&state));
        damage(&state.join("ids.idx"));
        assert_eq!((h.export(&state), h.status(&state)), before, "{what}");
        // The input grows, repeating 20 old IDs: they are duplicates, not called again.
        let mut grown = all.clone();
        grown.extend(all[..20].iter().cloned());
        std::fs::write(&input, grown.join("\n") + "\n").unwrap();
        let calls = h.api.total_calls();
        h.run(&["run", "--state", p(&state)]).expect_code(0);
        assert_eq!(
            h.api.total_calls() - calls,
            100,
            "{what}: only the new IDs are called"
        );
        let status = h.status(&state);
        assert_eq!(status["stats"]["duplicates"], 20, "{what}: {status}");
        h.check_export_exactly_once(&h.export(&state), &grown);
    }
}

/// Damage that only a full read meets: an open does not read every result back, so `status`
/// (which counts from the commit log) still answers, but an export reads every record and
/// refuses rather than leave any out.
#[test]
fn damaged_results_are_refused_by_export_never_left_out() {
    for (what, damage) in [(
        "garbage in the middle of results.log",
        Box::new(|state: &Path| {
            use std::os::unix::fs::FileExt;
            let f = state.join("results.log");
            let len = std::fs::metadata(&f).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .unwrap()
                .write_all_at(&garbage(64), len / 2)
                .unwrap();
        }) as Box<dyn Fn(&Path)>,
    )] {
        let h = Harness::new(ApiConfig::fast());
        let (_, state) = h.finished_job(&ids(600), &["--bucket-size", "50"]);
        damage(&state);
        for format in ["jsonl", "csv"] {
            let run = h.run(&["export", "--state", p(&state), "--format", format]);
            assert_eq!(
                run.code,
                1,
                "{what}: export --format {format} exited {} ({} bytes out): {}",
                run.code,
                run.stdout.len(),
                run.stderr
            );
            assert!(
                run.stderr.contains("corrupt") && !run.stderr.contains("panicked"),
                "{what}: {}",
                run.stderr
            );
        }
    }
}
