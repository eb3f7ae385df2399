//! The records the checks build (cursors, planned buckets, results, commits) and the reads
//! and lease they share.

use crate::input::{Cursor, Fingerprint};
use crate::store::{
    CommitRecord, ExportError, ItemRecord, ItemStatus, JobView, Lease, LeaseScope, Leases,
    OffsetRecord, PlannedBucket, PlannerState, Store, Tally,
};

pub(super) fn cursor(row: u64) -> Cursor {
    Cursor {
        row,
        line: row + 1,
        byte: row * 3,
    }
}

/// Bucket `bucket` holding `ids` at consecutive rows from `first_row`.
pub(super) fn planned(bucket: u64, first_row: u64, ids: &[&str]) -> PlannedBucket {
    let end = first_row + ids.len() as u64;
    PlannedBucket {
        offset: OffsetRecord {
            bucket,
            start: cursor(first_row),
            end: cursor(end),
            items: ids.len() as u64,
            duplicates: 0,
            bad_lines: 0,
            input: Fingerprint { len: 99, xxh3: 7 },
            planned_at_ms: 1,
        },
        items: ids
            .iter()
            .enumerate()
            .map(|(i, id)| (first_row + i as u64, id.to_string()))
            .collect(),
        bad_lines: vec![],
        values: Vec::new(),
    }
}

pub(super) fn planner_at(next_bucket: u64, row: u64, exhausted: bool) -> PlannerState {
    PlannerState {
        next_bucket,
        cursor: cursor(row),
        exhausted,
    }
}

pub(super) fn result(row: u64, bucket: u64, ok: bool) -> ItemRecord {
    let mut r = ItemRecord::pending(row, bucket);
    r.attempts = 1;
    if ok {
        r.status = ItemStatus::Ok;
        r.body = Some(serde_json::value::to_raw_value(&row).unwrap());
    } else {
        r.status = ItemStatus::Failed;
        r.error = Some("HTTP 404".into());
    }
    r
}

pub(super) fn commit_of(bucket: u64, records: &[&ItemRecord]) -> CommitRecord {
    let mut tally = Tally::default();
    for r in records {
        tally.add(r);
    }
    CommitRecord::new(bucket, tally, crate::store::now_ms())
}

pub(super) async fn lease<S: Leases>(store: &S) -> Lease {
    store
        .acquire(LeaseScope::Job)
        .await
        .unwrap()
        .expect("a lease on a job nobody works on")
}

pub(super) async fn finals<S: Store>(store: &S) -> Result<Vec<(String, ItemStatus)>, ExportError> {
    let mut out = Vec::new();
    store
        .for_each_final(&mut |id, r| {
            out.push((id.to_string(), r.status));
            Ok(())
        })
        .await?;
    Ok(out)
}
