//! `rerun` on a job of a PostgreSQL database works as on a state directory: the failed IDs
//! are called again once each, and the export then holds every ID exactly once.

use std::collections::BTreeMap;

use highwater::demo::api::ApiConfig;

use crate::fleet::Fleet;
use crate::harness::*;

const JOB: &str = "rerun";

/// Every ID the server fails (503 or a dropped connection) fails its first two attempts and
/// succeeds after: with two attempts a run leaves it failed, and a rerun heals it.
fn healing() -> ApiConfig {
    ApiConfig {
        unavailable_per_mille: 100,
        drop_per_mille: 50,
        transient_attempts: 2,
        seed: 7,
        ..ApiConfig::fast()
    }
}

/// Two attempts, so that the healing IDs fail a run; given to each run and rerun.
const TWO_ATTEMPTS: [&str; 6] = [
    "--max-attempts",
    "2",
    "--adaptive",
    "off",
    "--progress-interval",
    "0",
];

#[test]
fn rerun_failed_on_a_database_job_calls_each_failed_id_once_and_heals_the_export() {
    let h = Harness::new(healing());
    let fleet = Fleet::new(&h, JOB).flags(&TWO_ATTEMPTS);
    let ids = ids(400);
    let input = h.ids_file("ids.txt", &ids);

    finish(fleet.create(&input, &["--bucket-size", "50"])).expect_code(3);
    let failed: Vec<String> = fleet
        .export_with(&["--status", "failed"])
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!failed.is_empty(), "the first run leaves failures");

    let before = h.api.calls_snapshot();
    let rerun = [&["--failed"][..], &TWO_ATTEMPTS].concat();
    fleet
        .run("rerun", &rerun)
        .expect_code(0)
        .expect_stderr("starting rerun 1 (--failed)")
        .expect_stderr(&format!(
            "rerun 1 (--failed): {} ok, 0 failed",
            failed.len()
        ));
    let after = h.api.calls_snapshot();
    let called: BTreeMap<&str, u64> = after
        .iter()
        .map(|(id, n)| (id.as_str(), n - before.get(id).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let want: BTreeMap<&str, u64> = failed.iter().map(|id| (id.as_str(), 1)).collect();
    assert_eq!(called, want, "exactly the failed IDs, once each");

    let exported = fleet.export();
    h.check_export_exactly_once(&exported, &ids);
    assert!(exported.iter().all(|r| r["status"] == "ok"));
    let status = fleet.status();
    assert_eq!(status["stats"]["failed"], 0, "{status}");
    assert_eq!(status["reruns"][0]["selection"], "--failed", "{status}");
    assert_eq!(status["reruns"][0]["finished"], true, "{status}");

    // Nothing failed any more: a second rerun calls nothing; an unknown bucket is refused.
    let calls = h.api.total_calls();
    fleet
        .run("rerun", &rerun)
        .expect_code(0)
        .expect_stderr("nothing to rerun");
    fleet
        .run("rerun", &["--buckets", "99"])
        .expect_code(2)
        .expect_stderr("--buckets: the job has no bucket 99 (its buckets are 0 to 7)");
    assert_eq!(h.api.total_calls(), calls);
}
