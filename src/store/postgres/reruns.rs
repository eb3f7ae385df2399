//! Reruns in the database (`hw_rerun`, its buckets in `hw_bucket` under `rerun` = its
//! number, their IDs in `hw_rerun_item`): written in one transaction at creation, read back
//! a page of buckets at a time, and which rerun bucket each ID of a result is in (its
//! result's fence). [`super::PgStore`]'s `Store` methods for reruns call these.

use std::collections::HashMap;

use tokio_postgres::{Client, GenericClient};

use super::buckets::bucket_rows;
use super::error::PgError;
use super::keys::{JobId, WorkerId};
use super::rows::{commit_record, item_record, malformed, sql, to_i64};
use super::typed::typed;
use crate::store::{ItemRecord, Log, RerunBucket, RerunBucketState, RerunOffset, RerunRecord};

/// Every rerun of the job, oldest first.
pub(super) async fn reruns(c: &Client, job: JobId) -> Result<Vec<RerunRecord>, PgError> {
    let rows = c
        .query_typed(
            "SELECT number, selection, buckets, ids,
                    (extract(epoch FROM created_at) * 1000)::float8
             FROM hw_rerun WHERE job_id = $1 ORDER BY number",
            &typed![job.0],
        )
        .await
        .map_err(sql("reading reruns"))?;
    rows.iter()
        .map(|r| {
            Ok(RerunRecord {
                number: r.get::<_, i32>(0) as u32,
                selection: serde_json::from_value(r.get(1))
                    .map_err(|e| malformed("a rerun's selection", e))?,
                buckets: r.get::<_, i64>(2) as u64,
                ids: r.get::<_, i64>(3) as u64,
                created_at_ms: r.get::<_, f64>(4).round() as u64,
            })
        })
        .collect()
}

/// Write a rerun with all its buckets and their IDs, in one transaction. With `job_lease`
/// (a job-wide lease this session holds) its buckets are written leased to `me`.
pub(super) async fn create_rerun(
    c: &mut Client,
    job: JobId,
    me: &WorkerId,
    job_lease: Option<i64>,
    rerun: &RerunRecord,
    buckets: &[RerunBucket],
) -> Result<(), PgError> {
    let selection =
        serde_json::to_value(&rerun.selection).map_err(|e| malformed("a selection", e))?;
    let number = rerun.number as i32;
    let tx = c.transaction().await.map_err(sql("starting a rerun"))?;
    tx.execute_typed(
        "INSERT INTO hw_rerun (job_id, number, selection, buckets, ids, created_at)
         VALUES ($1, $2, $3, $4, $5, to_timestamp($6::float8 / 1000))",
        &typed![
            job.0,
            number,
            selection,
            to_i64(rerun.buckets)?,
            to_i64(rerun.ids)?,
            (rerun.created_at_ms as f64)
        ],
    )
    .await
    .map_err(sql("writing a rerun"))?;
    let (mut numbers, mut records, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut item_buckets, mut rows, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    for b in buckets {
        numbers.push(to_i64(b.offset.bucket)?);
        records.push(serde_json::to_string(&b.offset).map_err(|e| malformed("a rerun offset", e))?);
        sizes.push(to_i64(b.offset.items)?);
        for (row, id) in &b.items {
            item_buckets.push(to_i64(b.offset.bucket)?);
            rows.push(to_i64(*row)?);
            ids.push(id.as_str());
        }
    }
    tx.execute_typed(
        "INSERT INTO hw_bucket (job_id, rerun, bucket, offset_record, items, state, owner,
                                lease_token)
         SELECT $1, $2, u.bucket, u.record::jsonb, u.items,
                CASE WHEN $6::bigint IS NULL THEN 'open' ELSE 'leased' END,
                CASE WHEN $6::bigint IS NULL THEN NULL ELSE $7::text::uuid END, $6
         FROM unnest($3::bigint[], $4::text[], $5::bigint[]) AS u(bucket, record, items)",
        &typed![job.0, number, numbers, records, sizes, job_lease, me.0],
    )
    .await
    .map_err(sql("writing rerun buckets"))?;
    tx.execute_typed(
        "INSERT INTO hw_rerun_item (job_id, rerun, bucket, \"row\", id)
         SELECT $1, $2, * FROM unnest($3::bigint[], $4::bigint[], $5::text[])",
        &typed![job.0, number, item_buckets, rows, ids],
    )
    .await
    .map_err(sql("writing rerun IDs"))?;
    tx.commit().await.map_err(sql("committing a rerun"))
}

/// A page of a rerun's buckets with their commit records.
pub(super) async fn rerun_buckets(
    c: &Client,
    job: JobId,
    rerun: u32,
    from: u64,
    limit: usize,
) -> Result<Vec<RerunBucketState>, PgError> {
    let rows = bucket_rows(c, job, Log::Rerun(rerun), from, limit).await?;
    rows.iter()
        .map(|r| {
            let offset: RerunOffset =
                serde_json::from_value(r.get(6)).map_err(|e| malformed("a rerun offset", e))?;
            Ok(RerunBucketState {
                offset,
                commit: commit_record(r, 0)?,
            })
        })
        .collect()
}

/// A rerun bucket's IDs in input order, with their current records.
pub(super) async fn rerun_bucket_items(
    c: &impl GenericClient,
    job: JobId,
    rerun: u32,
    bucket: u64,
) -> Result<Vec<(String, ItemRecord)>, PgError> {
    let rows = c
        .query_typed(
            "SELECT i.id, i.\"row\", i.bucket, i.status, i.body::text, i.record::text,
                    i.row_values::text
             FROM hw_rerun_item r JOIN hw_item i ON i.job_id = r.job_id AND i.id = r.id
             WHERE r.job_id = $1 AND r.rerun = $2 AND r.bucket = $3 ORDER BY r.\"row\"",
            &typed![job.0, (rerun as i32), to_i64(bucket)?],
        )
        .await
        .map_err(sql("reading a rerun bucket's items"))?;
    rows.iter().map(|r| item_record(r, 0)).collect()
}

/// The bucket of rerun `rerun` each of `ids` is in (IDs not in the rerun are absent).
pub(super) async fn buckets_of(
    c: &impl GenericClient,
    job: JobId,
    rerun: u32,
    ids: &[&str],
) -> Result<HashMap<String, u64>, PgError> {
    let rows = c
        .query_typed(
            "SELECT id, bucket FROM hw_rerun_item
                     WHERE job_id = $1 AND rerun = $2 AND id = ANY($3)",
            &typed![job.0, (rerun as i32), ids],
        )
        .await
        .map_err(PgError::sql("finding rerun buckets"))?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        .collect())
}
