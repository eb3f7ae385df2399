//! The sled backend's own tests (the conformance suite runs the shared ones).

use super::*;
use std::fs::File;
use std::os::fd::AsRawFd;

#[cfg(feature = "demo")]
mod dictionary;
mod flush;
mod index;
mod open;
mod pages;
mod reruns;
mod segments;

/// Commit job buckets under a lease, as a run does.
async fn commit(s: &SledStore, commits: &[CommitRecord]) {
    let lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
    s.commit(&lease, Commit::Job(commits)).await.unwrap();
}

/// Commit rerun buckets under a lease, with the counts they move.
async fn commit_rerun(s: &SledStore, rerun: u32, commits: &[CommitRecord]) {
    let lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
    super::super::view::commit(s, &lease, Log::Rerun(rerun), commits)
        .await
        .unwrap();
}

async fn first_row(s: &SledStore, id: &str, row: u64) -> Option<u64> {
    s.first_rows(&[(row, id)]).await.unwrap()[0]
}

fn offset(bucket: u64, start: u64, end: u64, items: u64) -> OffsetRecord {
    OffsetRecord {
        bucket,
        start: Cursor {
            row: start,
            line: start + 1,
            byte: start * 2,
        },
        end: Cursor {
            row: end,
            line: end + 1,
            byte: end * 2,
        },
        items,
        duplicates: 0,
        bad_lines: 0,
        input: Fingerprint { len: 10, xxh3: 1 },
        planned_at_ms: 0,
    }
}

fn planned(bucket: u64, ids: &[(u64, &str)], end: u64) -> PlannedBucket {
    let start = ids.first().map(|i| i.0).unwrap_or(end);
    PlannedBucket {
        offset: offset(bucket, start, end, ids.len() as u64),
        items: ids.iter().map(|(r, i)| (*r, i.to_string())).collect(),
        bad_lines: vec![],
        values: Vec::new(),
    }
}

/// Buckets 0..n of one row each, holding the IDs "id0", "id1", ...
fn one_row_buckets(n: u64) -> Vec<PlannedBucket> {
    (0..n)
        .map(|i| planned(i, &[(i, &format!("id{i}"))], i + 1))
        .collect()
}

/// A new store with [`one_row_buckets`]`(n)` planned.
async fn store_of_one_row_buckets(n: u64) -> (tempfile::TempDir, SledStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    s.plan(&one_row_buckets(n), &PlannerState::default())
        .await
        .unwrap();
    (dir, s)
}

fn done(row: u64, bucket: u64, ok: bool) -> ItemRecord {
    let mut r = ItemRecord::pending(row, bucket);
    r.status = if ok {
        ItemStatus::Ok
    } else {
        ItemStatus::Failed
    };
    r.attempts = 1;
    if ok {
        r.body = Some(serde_json::value::to_raw_value(&serde_json::json!({"v": row})).unwrap());
    } else {
        r.error = Some("HTTP 404".into());
    }
    r
}
