//! What the database counts for `status` and for idle workers, each in one query: the job's
//! figures ([`counted`], the same as the walk of `JobView::stats` but aggregated by the
//! database instead of read bucket by bucket), whether a log is finished ([`finished`]: the
//! partial index of uncommitted buckets, so an idle worker's poll costs the same at 100
//! buckets as at 100,000), and where planning stands ([`planning`]).

use tokio_postgres::GenericClient;

use super::error::PgError;
use super::keys::{log_number, JobId};
use super::typed::typed;
use crate::store::{Log, StoreStats};

/// The job's figures: those of committed buckets from their commit counts, those of the
/// others from their items (as `JobView::stats` derives them).
pub(crate) async fn counted(
    client: &impl GenericClient,
    job: JobId,
) -> Result<StoreStats, PgError> {
    let row = client
        .query_typed_one(
            "SELECT j.planner_exhausted, j.cursor_row, j.cursor_byte,
                    b.planned, b.committed, b.ids, b.duplicates, b.bad_lines, b.ok, b.failed,
                    open.ok, open.failed, b.usage_input, b.usage_output,
                    open.usage_input, open.usage_output
             FROM hw_job j,
                  (SELECT count(*) AS planned,
                          count(*) FILTER (WHERE state = 'committed') AS committed,
                          coalesce(sum((offset_record ->> 'items')::bigint), 0)::bigint AS ids,
                          coalesce(sum((offset_record ->> 'duplicates')::bigint), 0)::bigint
                              AS duplicates,
                          coalesce(sum((offset_record ->> 'bad_lines')::bigint), 0)::bigint
                              AS bad_lines,
                          coalesce(sum(ok) FILTER (WHERE state = 'committed'), 0)::bigint AS ok,
                          coalesce(sum(failed) FILTER (WHERE state = 'committed'), 0)::bigint
                              AS failed,
                          coalesce(sum(usage_input) FILTER (WHERE state = 'committed'), 0)::bigint
                              AS usage_input,
                          coalesce(sum(usage_output) FILTER (WHERE state = 'committed'), 0)::bigint
                              AS usage_output
                   FROM hw_bucket WHERE job_id = $1 AND rerun = 0) b,
                  (SELECT count(*) FILTER (WHERE i.status = 'ok') AS ok,
                          count(*) FILTER (WHERE i.status = 'failed') AS failed,
                          coalesce(sum((i.record -> 'usage' ->> 'input')::bigint)
                              FILTER (WHERE i.status <> 'pending'), 0)::bigint AS usage_input,
                          coalesce(sum((i.record -> 'usage' ->> 'output')::bigint)
                              FILTER (WHERE i.status <> 'pending'), 0)::bigint AS usage_output
                   FROM hw_bucket u JOIN hw_item i ON i.job_id = u.job_id AND i.bucket = u.bucket
                   WHERE u.job_id = $1 AND u.rerun = 0 AND u.state <> 'committed') open
             WHERE j.job_id = $1",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("counting the job's figures"))?;
    let n = |i: usize| row.get::<_, i64>(i).max(0) as u64;
    let mut s = StoreStats {
        input_exhausted: row.get(0),
        rows_read: n(1),
        input_bytes_read: n(2),
        buckets_planned: n(3),
        buckets_committed: n(4),
        ids_planned: n(5),
        duplicates: n(6),
        bad_lines: n(7),
        ok: n(8) + n(10),
        failed: n(9) + n(11),
        usage: crate::meter::Usage {
            input: n(12) + n(14),
            output: n(13) + n(15),
        },
        ..StoreStats::default()
    };
    s.buckets_in_flight = s.buckets_planned - s.buckets_committed;
    s.pending = s.ids_planned.saturating_sub(s.ok + s.failed);
    Ok(s)
}

/// Whether `log` is finished: the job's planned to its end (a rerun's buckets are all
/// written at its creation) and none of its buckets uncommitted.
pub(crate) async fn finished(
    client: &impl GenericClient,
    job: JobId,
    log: Log,
) -> Result<bool, PgError> {
    let row = client
        .query_typed_one(
            "SELECT ($2 > 0 OR j.planner_exhausted) AND NOT EXISTS (
                        SELECT 1 FROM hw_bucket b
                        WHERE b.job_id = $1 AND b.rerun = $2 AND b.state <> 'committed')
             FROM hw_job j WHERE j.job_id = $1",
            &typed![job.0, log_number(log)],
        )
        .await
        .map_err(PgError::sql("checking whether the job is finished"))?;
    Ok(row.get(0))
}

/// Where planning stands, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Planning {
    /// `done` (the input is planned to its end), `planning` (a live worker holds the
    /// planner lease) or `waiting` (nobody plans: the job waits for a worker with the input).
    pub state: &'static str,
    /// The session holding (or last holding) the planner lease.
    pub planner: Option<String>,
}

/// Where planning stands: done, planned by a live worker, or waiting for one with the input.
pub(crate) async fn planning(client: &impl GenericClient, job: JobId) -> Result<Planning, PgError> {
    let row = client
        .query_typed_one(
            "SELECT j.planner_exhausted, j.planner::text, EXISTS (
                        SELECT 1 FROM hw_worker w WHERE w.job_id = j.job_id
                          AND w.worker_id = j.planner AND w.expires_at > now())
             FROM hw_job j WHERE j.job_id = $1",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("reading the planner"))?;
    let state = match (row.get::<_, bool>(0), row.get::<_, bool>(2)) {
        (true, _) => "done",
        (false, true) => "planning",
        (false, false) => "waiting",
    };
    Ok(Planning {
        state,
        planner: row.get(1),
    })
}
