//! The job's items (`hw_item`) and bad lines (`hw_bad_line`) read back: which IDs the planner
//! has planned and at which row, a bucket's items, one item, the bad lines. Written by
//! [`super::planner`] (planned items, bad lines) and [`super::results`] (results).

use std::collections::HashMap;

use tokio_postgres::GenericClient;

use super::error::PgError;
use super::keys::JobId;
use super::rows::{item_record, sql, to_i64};
use super::typed::typed;
use crate::store::{BadLine, ItemRecord};

/// The row of each of `ids` already planned (IDs not planned are absent).
pub(super) async fn planned_rows(
    c: &impl GenericClient,
    job: JobId,
    ids: &[&str],
) -> Result<HashMap<String, u64>, PgError> {
    // One primary-key probe per ID, whatever the table's statistics say: with
    // `id = ANY($2)` the planner (no statistics yet on a new job's rows: `job_id`
    // looks selective) scanned every row of the job per batch, quadratic in the job.
    let found = c
        .query_typed(
            "SELECT u.id, i.\"row\" FROM unnest($2::text[]) AS u(id)
                     CROSS JOIN LATERAL (SELECT \"row\" FROM hw_item
                                         WHERE job_id = $1 AND id = u.id LIMIT 1) i",
            &typed![job.0, ids],
        )
        .await
        .map_err(sql("looking up planned IDs"))?;
    Ok(found
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        .collect())
}

/// A job bucket's items in input order, with their records.
pub(super) async fn bucket_items(
    c: &impl GenericClient,
    job: JobId,
    bucket: u64,
) -> Result<Vec<(String, ItemRecord)>, PgError> {
    let rows = c
        .query_typed(
            "SELECT id, \"row\", bucket, status, body::text, record::text, row_values::text
                     FROM hw_item
                     WHERE job_id = $1 AND bucket = $2 ORDER BY \"row\"",
            &typed![job.0, to_i64(bucket)?],
        )
        .await
        .map_err(sql("reading a bucket's items"))?;
    rows.iter().map(|r| item_record(r, 0)).collect()
}

/// The record of item `id`, if it was planned (pending or final).
pub(super) async fn item(
    c: &impl GenericClient,
    job: JobId,
    id: &str,
) -> Result<Option<ItemRecord>, PgError> {
    let row = c
        .query_typed_opt(
            "SELECT id, \"row\", bucket, status, body::text, record::text, row_values::text
                     FROM hw_item
                     WHERE job_id = $1 AND id = $2",
            &typed![job.0, id],
        )
        .await
        .map_err(sql("reading an item"))?;
    match row {
        Some(r) => Ok(Some(item_record(&r, 0)?.1)),
        None => Ok(None),
    }
}

/// The first `limit` bad lines of the input, by row.
pub(super) async fn bad_lines(
    c: &impl GenericClient,
    job: JobId,
    limit: usize,
) -> Result<Vec<BadLine>, PgError> {
    let rows = c
        .query_typed(
            "SELECT \"row\", line, reason FROM hw_bad_line WHERE job_id = $1
                     ORDER BY \"row\" LIMIT $2",
            &typed![job.0, (limit.min(i64::MAX as usize) as i64)],
        )
        .await
        .map_err(sql("reading bad lines"))?;
    Ok(rows
        .iter()
        .map(|r| BadLine {
            row: r.get::<_, i64>(0) as u64,
            line: r.get::<_, i64>(1) as u64,
            reason: r.get(2),
        })
        .collect())
}
