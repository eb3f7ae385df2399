//! The planner lease and the planning transaction (`hw_job`, `hw_item`, `hw_bucket`).
//!
//! One planner at a time: the lease is (planner session, token) on the job row, valid while
//! that session lives, taken by another live worker once it expires (River's elect and
//! re-elect, tied to the session like the bucket leases). [`plan`] writes a batch of buckets
//! in one transaction fenced by the lease: the items (`ON CONFLICT DO NOTHING`: an ID already
//! planned is a duplicate, found by the table's key, across workers and restarts), the
//! bucket rows with their final counts, the bad lines, and the planner's new position.

use tokio_postgres::{Client, GenericClient};

use super::error::PgError;
use super::flight::{begin, end, rollback};
use super::keys::{JobId, WorkerId};
use super::liveness::live_sessions;
use super::rows::to_i64;
use super::typed::typed;
use crate::store::{BadLine, PlannerState};

/// Take the planner lease, or keep it if this session holds it. Its token, or none if another
/// live session holds it or the input is planned to its end.
pub(crate) async fn acquire_planner(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
) -> Result<Option<i64>, PgError> {
    Ok(take_planner_at(client, job, me)
        .await?
        .map(|(token, _)| token))
}

/// [`acquire_planner`], with where planning stands as the lease was taken: its token and
/// the position, in one statement (the row the lease is written on is the position's).
pub(crate) async fn take_planner_at(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
) -> Result<Option<(i64, PlannerState)>, PgError> {
    let row = client
        .query_typed_opt(
            concat!(
                "UPDATE hw_job j
                 SET planner = $2::text::uuid,
                     planner_token = CASE WHEN j.planner = $2::text::uuid THEN j.planner_token
                                          ELSE nextval('hw_lease_token') END
                 FROM ",
                live_sessions!(),
                "
                 WHERE j.job_id = $1 AND NOT j.planner_exhausted AND live.me_live
                   AND (j.planner IS NULL OR j.planner = $2::text::uuid
                        OR j.planner <> ALL (live.ids))
                 RETURNING planner_token, next_bucket, cursor_byte, cursor_line, cursor_row,
                           planner_exhausted"
            ),
            &typed![job.0, me.0],
        )
        .await
        .map_err(PgError::sql("taking the planner lease"))?;
    Ok(row.map(|r| (r.get(0), position(&r, 1))))
}

/// Give the planner lease up (drain, end of session).
pub(crate) async fn release_planner(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
) -> Result<(), PgError> {
    client
        .execute_typed(
            "UPDATE hw_job SET planner = NULL WHERE job_id = $1 AND planner = $2::text::uuid",
            &typed![job.0, me.0],
        )
        .await
        .map_err(PgError::sql("releasing the planner lease"))?;
    Ok(())
}

/// Move the planner without planning (the input grew, or was found at its end), unless
/// another live session holds the planner lease.
pub(super) async fn move_planner(
    c: &Client,
    job: JobId,
    me: &WorkerId,
    p: &PlannerState,
) -> Result<(), PgError> {
    let n = c
        .execute_typed(
            concat!(
                "UPDATE hw_job j SET next_bucket = $3, cursor_byte = $4, cursor_line = $5,
                     cursor_row = $6, planner_exhausted = $7
                 FROM ",
                live_sessions!(),
                "
                 WHERE j.job_id = $1 AND (j.planner IS NULL OR j.planner = $2::text::uuid
                     OR j.planner <> ALL (live.ids))"
            ),
            &typed![
                job.0,
                me.0,
                to_i64(p.next_bucket)?,
                to_i64(p.cursor.byte)?,
                to_i64(p.cursor.line)?,
                to_i64(p.cursor.row)?,
                p.exhausted
            ],
        )
        .await
        .map_err(PgError::sql("moving the planner"))?;
    if n == 0 {
        return Err(PgError::PlannerLeaseLost { token: 0 });
    }
    Ok(())
}

/// One bucket as the planner cut it: its unique-in-the-input-so-far IDs with their rows.
#[derive(Debug, Clone)]
pub(crate) struct PlanBucket {
    pub bucket: u64,
    /// (row, ID), in input order.
    pub items: Vec<(u64, String)>,
    /// The kept columns of each item's row, as [`crate::store::PlannedBucket::values`].
    pub values: Vec<String>,
}

/// A bucket's counts after the database found the duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketCounts {
    pub bucket: u64,
    /// IDs inserted: first occurrences, the bucket's items to call.
    pub items: u64,
    /// IDs already planned (in an earlier bucket, or earlier in this one).
    pub duplicates: u64,
}

/// A batch of planning: buckets, the bad lines met, and where the planner stands after.
#[derive(Debug, Clone)]
pub(crate) struct Plan<'a> {
    pub buckets: &'a [PlanBucket],
    pub bad_lines: &'a [BadLine],
    pub position: PlannerState,
}

/// Plan a batch under the planner lease, in one transaction sent in two flights (see
/// `flight.rs`): the lease taken or kept ([`acquire_planner`], which locks the job's row
/// until the transaction ends), its position checked and the items inserted; then, from
/// their counts, each bucket's write-ahead record (`offset_record`, JSON text), the bucket
/// rows and bad lines, the planner's new position and the commit.
/// [`PgError::PlannerLeaseLost`] (nothing written) if another live session holds the lease
/// or planned on from the position this planner read. With `lease`, the buckets are written
/// leased to `me` under that token (a job-wide lease), not open.
pub(crate) async fn plan(
    client: &Client,
    job: JobId,
    me: &WorkerId,
    batch: &Plan<'_>,
    offset_record: impl Fn(&BucketCounts) -> String,
    lease: Option<i64>,
) -> Result<Vec<BucketCounts>, PgError> {
    let (buckets, bad_lines, position) = (batch.buckets, batch.bad_lines, &batch.position);
    let tx = client;
    let first = match buckets.first() {
        Some(b) => Some(to_i64(b.bucket)?),
        None => None,
    };
    let (mut ids, mut item_buckets, mut rows) = (Vec::new(), Vec::new(), Vec::new());
    let mut values: Vec<Option<&str>> = Vec::new();
    for b in buckets {
        let mut kept = b.values.iter();
        for (row, id) in &b.items {
            ids.push(id.as_str());
            item_buckets.push(to_i64(b.bucket)?);
            rows.push(to_i64(*row)?);
            values.push(kept.next().map(String::as_str));
        }
    }
    let (mut bad_rows, mut lines, mut reasons) = (Vec::new(), Vec::new(), Vec::new());
    for b in bad_lines {
        bad_rows.push(to_i64(b.row)?);
        lines.push(to_i64(b.line)?);
        reasons.push(b.reason.as_str());
    }
    let (next, byte, line, row) = (
        to_i64(position.next_bucket)?,
        to_i64(position.cursor.byte)?,
        to_i64(position.cursor.line)?,
        to_i64(position.cursor.row)?,
    );
    // The first flight: the transaction opened, the lease taken or kept (its row lock
    // keeps it here until the transaction ends), the position checked (a planner that read
    // it before another planned on from it is stale: its first bucket is not the job's
    // next one) and the items inserted.
    let (begun, token, held, inserted) = futures_util::future::join4(
        begin(tx, "starting a planning transaction"),
        acquire_planner(tx, job, me),
        async {
            tx.query_typed_opt(
                "SELECT 1 FROM hw_job
                 WHERE job_id = $1 AND planner = $2::text::uuid
                   AND ($3::bigint IS NULL OR next_bucket = $3)",
                &typed![job.0, me.0, first],
            )
            .await
            .map_err(PgError::sql("checking the planner's position"))
        },
        async {
            tx.query_typed(
                "WITH ins AS (
                     INSERT INTO hw_item (job_id, id, bucket, \"row\", row_values)
                     SELECT $1, u.id, u.bucket, u.item_row, u.row_values::json
                     FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::text[])
                         WITH ORDINALITY AS u(id, bucket, item_row, row_values, ord)
                     ORDER BY u.ord
                     ON CONFLICT (job_id, id) DO NOTHING
                     RETURNING bucket)
                 SELECT bucket, count(*) FROM ins GROUP BY bucket",
                &typed![job.0, ids, item_buckets, rows, values],
            )
            .await
            .map_err(PgError::sql("inserting planned items"))
        },
    )
    .await;
    let first_flight = (|| {
        begun?;
        let (token, held, inserted) = (token?, held?, inserted?);
        if token.is_none() || held.is_none() {
            return Err(PgError::PlannerLeaseLost {
                token: token.unwrap_or(0),
            });
        }
        let inserted: std::collections::HashMap<i64, i64> =
            inserted.iter().map(|r| (r.get(0), r.get(1))).collect();
        let counts: Vec<BucketCounts> = buckets
            .iter()
            .map(|b| {
                let items = inserted.get(&(b.bucket as i64)).copied().unwrap_or(0) as u64;
                BucketCounts {
                    bucket: b.bucket,
                    items,
                    duplicates: b.items.len() as u64 - items,
                }
            })
            .collect();
        let (mut numbers, mut records, mut items) = (Vec::new(), Vec::new(), Vec::new());
        for c in &counts {
            numbers.push(to_i64(c.bucket)?);
            records.push(offset_record(c));
            items.push(to_i64(c.items)?);
        }
        Ok((counts, numbers, records, items))
    })();
    let (counts, numbers, records, items) = match first_flight {
        Ok(next) => next,
        Err(e) => {
            // Nothing of it stays: the transaction is still open on the connection.
            if let Err(r) = rollback(tx).await {
                tracing::warn!("could not roll a planning transaction back: {r}");
            }
            return Err(e);
        }
    };
    // The second flight: the buckets, the bad lines, the planner's move and the commit.
    let (buckets_written, bad_written, planner_moved, ended) = futures_util::future::join4(
        async {
            tx.execute_typed(
                "INSERT INTO hw_bucket (job_id, rerun, bucket, offset_record, items, state,
                                        owner, lease_token)
                 SELECT $1, 0, u.bucket, u.record::jsonb, u.items,
                        CASE WHEN $5::bigint IS NULL THEN 'open' ELSE 'leased' END,
                        CASE WHEN $5::bigint IS NULL THEN NULL ELSE $6::text::uuid END, $5
                 FROM unnest($2::bigint[], $3::text[], $4::bigint[]) AS u(bucket, record, items)",
                &typed![job.0, numbers, records, items, lease, me.0],
            )
            .await
            .map_err(PgError::sql("inserting planned buckets"))
        },
        async {
            if bad_rows.is_empty() {
                return Ok(0);
            }
            tx.execute_typed(
                "INSERT INTO hw_bad_line (job_id, \"row\", line, reason)
                 SELECT $1, * FROM unnest($2::bigint[], $3::bigint[], $4::text[])
                 ON CONFLICT DO NOTHING",
                &typed![job.0, bad_rows, lines, reasons],
            )
            .await
            .map_err(PgError::sql("inserting bad lines"))
        },
        async {
            tx.execute_typed(
                "UPDATE hw_job SET next_bucket = $2, cursor_byte = $3, cursor_line = $4,
                     cursor_row = $5, planner_exhausted = $6
                 WHERE job_id = $1",
                &typed![job.0, next, byte, line, row, position.exhausted],
            )
            .await
            .map_err(PgError::sql("moving the planner"))
        },
        end(tx, "committing a plan"),
    )
    .await;
    buckets_written?;
    bad_written?;
    planner_moved?;
    ended?;
    Ok(counts)
}

/// Where the planner stands.
pub(crate) async fn planner_state(
    client: &impl GenericClient,
    job: JobId,
) -> Result<PlannerState, PgError> {
    let row = client
        .query_typed_one(
            "SELECT next_bucket, cursor_byte, cursor_line, cursor_row, planner_exhausted
             FROM hw_job WHERE job_id = $1",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("reading the planner's position"))?;
    Ok(position(&row, 0))
}

/// The planner's position in `row`, from column `at`: next_bucket, cursor_byte,
/// cursor_line, cursor_row, planner_exhausted.
fn position(row: &tokio_postgres::Row, at: usize) -> PlannerState {
    PlannerState {
        next_bucket: row.get::<_, i64>(at) as u64,
        cursor: crate::input::Cursor {
            byte: row.get::<_, i64>(at + 1) as u64,
            line: row.get::<_, i64>(at + 2) as u64,
            row: row.get::<_, i64>(at + 3) as u64,
        },
        exhausted: row.get(at + 4),
    }
}
