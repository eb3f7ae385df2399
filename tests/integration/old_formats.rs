//! State directories written by older builds open and resume.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::harness::*;
use highwater::demo::api::ApiConfig;

/// What a fixture's store held when it was killed (tests/fixtures/README.md).
struct Killed {
    /// The fixture's folder under tests/fixtures (`--dir` of the demo that wrote it).
    fixture: &'static str,
    /// The demo's `--ids`.
    ids: u64,
    ok: u64,
    failed: u64,
    pending: u64,
}

/// `killed` opens with this build: `status` reads it as it was, the demo resumes it to the
/// end with every ID exactly once, the results made durable before the kill read back after
/// it as they did before (bodies, statuses, attempts), and the store is marked the current
/// format. The old results log entries stay as they are (one record each, read by the old
/// decoder); the resume appends groups after them.
fn opens_and_resumes(killed: Killed) {
    let h = Harness::new(ApiConfig::demo());
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(killed.fixture);
    let dir = h.path("demo");
    copy_dir(&fixture, &dir);
    let state = dir.join("state");
    let (old_entries, old_groups) = entry_kinds(&state.join("results.log"));
    assert!(
        old_entries > 0 && old_groups == 0,
        "{old_entries} {old_groups}"
    );
    let before = h.status(&state);
    assert_eq!(before["stats"]["ok"], killed.ok, "{before}");
    assert_eq!(before["stats"]["failed"], killed.failed, "{before}");
    assert_eq!(before["stats"]["pending"], killed.pending, "{before}");
    assert_eq!(before["finished"], false);
    let kept = h.export(&state);
    assert_eq!(kept.len() as u64, killed.ok + killed.failed);
    let ids = killed.ids.to_string();
    let resumed = h.run(&["demo", "--dir", p(&dir), "--ids", &ids]);
    resumed.expect_no_panic();
    assert!(
        [0, 3].contains(&resumed.code),
        "the demo resumes to the end: {}",
        resumed.stderr
    );
    let after = h.status(&state);
    assert_eq!(after["finished"], true, "{after}");
    assert_eq!(after["stats"]["pending"], 0, "{after}");
    let marker = std::fs::read_to_string(state.join("highwater.json")).unwrap();
    assert!(
        marker.contains(&format!("\"version\":{}", highwater::store::FORMAT_VERSION)),
        "{marker}"
    );
    let (entries, groups) = entry_kinds(&state.join("results.log"));
    assert_eq!(
        entries, old_entries,
        "the old entries are kept, not converted"
    );
    assert!(groups > 0, "the resume appended groups");
    let export = h.export(&state);
    let all: Vec<String> = highwater::demo::demo_ids(killed.ids).collect();
    h.check_export_exactly_once(&export, &all);
    // The old records are read beside the ones the resume wrote, unchanged.
    let now: HashMap<&str, &Value> = export
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r))
        .collect();
    for record in &kept {
        let id = record["id"].as_str().unwrap();
        assert_eq!(Some(&record), now.get(id), "{id}'s record was kept");
    }
}

/// A format 4 state directory (JSON item records, whole-ID log entries and ID lists), killed
/// mid-run by the build before the async store seam.
#[test]
fn a_format_4_state_killed_mid_run_opens_and_resumes() {
    opens_and_resumes(Killed {
        fixture: "format4-killed-demo",
        ids: 1200,
        ok: 1175,
        failed: 13,
        pending: 11,
    });
}

/// A format 5 state directory (binary item records, bodies compressed before and with the
/// trained dictionary, compact log entries and ID lists), killed mid-run after its
/// dictionary was trained.
#[test]
fn a_format_5_state_killed_mid_run_opens_and_resumes() {
    let dict = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/format5-killed-demo/state/results.dict");
    assert!(dict.exists(), "the fixture has its dictionary");
    opens_and_resumes(Killed {
        fixture: "format5-killed-demo",
        ids: 6000,
        ok: 2869,
        failed: 28,
        pending: 3097,
    });
}

/// How many entries of a results log hold one record, and how many a group (the two top bits
/// of the length field set; see `src/store/sled_store/log_groups.rs`).
fn entry_kinds(log: &Path) -> (usize, usize) {
    let bytes = std::fs::read(log).unwrap();
    let (mut entries, mut groups, mut at) = (0, 0, 0);
    while at + 8 <= bytes.len() {
        let field = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = if field >> 30 == 3 {
            groups += 1;
            field & !(3 << 30)
        } else {
            entries += 1;
            field & !(1 << 31)
        };
        at += 8 + len as usize;
    }
    assert_eq!(at, bytes.len(), "{} ends inside an entry", log.display());
    (entries, groups)
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
