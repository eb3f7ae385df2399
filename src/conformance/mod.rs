//! The conformance suite: what every backend must do, asserted once.
//!
//! [`run_all`] takes a [`Backend`] (a factory that creates a store, "crashes" it and opens it
//! again, and damages it) and checks the contract written on [`crate::store::backend`]:
//! plans are durable once synced (the offset record is there before any item is
//! dispatched), results replace by ID and a replay finds only pending IDs, commits are final
//! and fenced by their lease, reruns move the job's counts once, a grown input plans on
//! without calling old IDs again, damage is refused and never read as less data, and the
//! real engine over the backend runs, stops, resumes and ends with every ID exactly once,
//! every write and sync it made logged by [`crate::engine::audit::Audit`], which checks the
//! engine's invariants 1 (an offset record is durable before its items are called) and 2 (a
//! commit only after its results are durable). The sled backend,
//! [`crate::store::mem::MemStore`], the in-memory store of a fleet
//! ([`crate::store::mem::SharedMem`]) and PostgreSQL run it in `cargo test`; a new backend
//! adds one test that calls [`run_all`] with its factory.
//!
//! It lives above the store (it drives the engine, the job and the HTTP handler against the
//! fake API), one file per kind of check: [`log`] (plans, results, commits, a grown input),
//! [`reruns`], [`damage`], [`engine`] (the engine's invariants), [`quota`] (quota usage); the backends it runs
//! against are in [`backends`].

use std::sync::Arc;

use crate::input::{Cursor, Fingerprint};
use crate::store::*;

mod backends;
mod damage;
mod engine;
mod log;
mod quota;
mod reruns;
mod tests;

/// A backend under test.
pub(crate) trait Backend {
    type S: Store + Leases;
    /// A new, empty store.
    fn create(&mut self) -> Arc<Self::S>;
    /// Close `store` (the caller holds its only reference) as abruptly as the backend can be
    /// closed in a test, and open it again: everything synced must be there.
    fn crash(&mut self, store: Arc<Self::S>) -> Arc<Self::S>;
    /// Damage the durable result of `id` in `store` (closed) and open it again: the error the
    /// open gave, or the store.
    fn damage_result(&mut self, store: Arc<Self::S>, id: &str) -> Result<Arc<Self::S>, StoreError>;
}

/// Run every check against `backend`.
pub(crate) async fn run_all<B: Backend>(backend: &mut B) {
    log::plans_are_durable_once_synced(backend).await;
    log::results_replace_by_id_and_a_replay_finds_only_pending_ids(backend).await;
    log::commits_are_final_and_fenced_by_their_lease(backend).await;
    reruns::a_rerun_moves_the_job_counts_once(backend).await;
    log::a_grown_input_plans_on_and_old_ids_stay_duplicates(backend).await;
    log::kept_columns_come_back_with_their_ids(backend).await;
    damage::damage_is_refused_never_read_as_less(backend).await;
    engine::the_engine_stops_and_resumes_every_id_exactly_once(backend).await;
    quota::quota_reservations_are_durable_and_never_exceed_a_limit(backend).await;
}

fn cursor(row: u64) -> Cursor {
    Cursor {
        row,
        line: row + 1,
        byte: row * 3,
    }
}

/// Bucket `bucket` holding `ids` at consecutive rows from `first_row`.
fn planned(bucket: u64, first_row: u64, ids: &[&str]) -> PlannedBucket {
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

fn planner_at(next_bucket: u64, row: u64, exhausted: bool) -> PlannerState {
    PlannerState {
        next_bucket,
        cursor: cursor(row),
        exhausted,
    }
}

fn result(row: u64, bucket: u64, ok: bool) -> ItemRecord {
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

fn commit_of(bucket: u64, records: &[&ItemRecord]) -> CommitRecord {
    let mut tally = Tally::default();
    for r in records {
        tally.add(r);
    }
    CommitRecord::new(bucket, tally)
}

async fn lease<S: Leases>(store: &S) -> Lease {
    store
        .acquire(LeaseScope::Job)
        .await
        .unwrap()
        .expect("a lease on a job nobody works on")
}

async fn finals<S: Store>(store: &S) -> Result<Vec<(String, ItemStatus)>, ExportError> {
    let mut out = Vec::new();
    store
        .for_each_final(&mut |id, r| {
            out.push((id.to_string(), r.status));
            Ok(())
        })
        .await?;
    Ok(out)
}
