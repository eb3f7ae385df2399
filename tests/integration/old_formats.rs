//! State directories written by older builds open and resume.

use crate::harness::*;
use highwater::demo::api::ApiConfig;

/// A format 4 state directory, killed mid-run by the build before the async store seam
/// (tests/fixtures/README.md), opens with this build: `status` reads it as it was, and the
/// demo resumes it to the end with every ID exactly once (the 1175 results made durable
/// before the kill are kept, not called again).
#[test]
fn a_format_4_state_killed_mid_run_opens_and_resumes() {
    let h = Harness::new(ApiConfig::demo());
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format4-killed-demo");
    let dir = h.path("demo");
    copy_dir(&fixture, &dir);
    let state = dir.join("state");
    let before = h.status(&state);
    assert_eq!(before["stats"]["ok"], 1175, "{before}");
    assert_eq!(before["stats"]["pending"], 11, "{before}");
    assert_eq!(before["finished"], false);
    let kept = h.export(&state);
    assert_eq!(kept.len(), 1175 + 13);
    let resumed = h.run(&["demo", "--dir", p(&dir), "--ids", "1200"]);
    resumed.expect_no_panic();
    assert!(
        [0, 3].contains(&resumed.code),
        "the demo resumes to the end: {}",
        resumed.stderr
    );
    let after = h.status(&state);
    assert_eq!(after["finished"], true, "{after}");
    assert_eq!(after["stats"]["pending"], 0, "{after}");
    let ids: Vec<String> = highwater::demo::demo_ids(1200).collect();
    h.check_export_exactly_once(&h.export(&state), &ids);
    // Only the 11 pending IDs (and retries of them) were called.
    assert!(
        h.api.total_calls() == 0,
        "the harness's own API is not the demo's"
    );
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
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
