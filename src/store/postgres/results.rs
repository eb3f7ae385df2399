//! Fenced result writes and commits (`hw_item`, `hw_bucket`).
//!
//! A result is written only if, in the same statement, the bucket row it belongs to still
//! holds the writer as owner under the writer's token, and that row is share-locked until
//! the transaction ends, so no acquire can move the lease between the check and the commit
//! of the write. The upsert also never replaces a row written under a newer token. A commit
//! updates the bucket only for its current owner and token (`state = 'leased'`); no row
//! updated means the lease was lost ([`PgError::LeaseLost`]). [`flush`] does a group flush's
//! results and commits in one transaction and one round trip per statement, so "results
//! durable before commit" holds by construction.

use std::collections::HashMap;

use tokio_postgres::{GenericClient, ToStatement};

use super::error::PgError;
use super::keys::{log_number, JobId, Lease, WorkerId};
use super::rows::to_i64;
use crate::store::{CommitRecord, ItemStatus, Log};

/// One final result, written under `lease` (a bucket of the job's log or of a rerun's).
#[derive(Debug, Clone)]
pub(crate) struct ResultRow {
    pub lease: Lease,
    pub id: String,
    /// The job bucket and input row of the ID (used only if the ID was never planned).
    pub bucket: u64,
    pub row: u64,
    pub status: ItemStatus,
    pub http_status: Option<u16>,
    /// The API's answer, JSON text, stored byte for byte.
    pub body: Option<String>,
    /// The rest of the item's record, JSON text.
    pub record: String,
}

/// What a fenced write did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Written {
    pub written: u64,
    /// Rows not written: their lease is not held, or a newer token wrote the item.
    pub fenced: u64,
}

/// The fence of a fenced write, as the start of its statement: `held`, the rows of the
/// buckets (`$4`) still leased to this session (`$2`) in log `$3` of job `$1` under the
/// tokens (`$5`) the rows are written with, share-locked until the statement's transaction
/// ends, so no acquire moves a lease between the check and the write. Rows to write join
/// it on (bucket, token); those that find no row are fenced out.
macro_rules! held_leases {
    () => {
        "WITH held AS (
                 SELECT b.bucket, b.lease_token FROM hw_bucket b
                 WHERE b.job_id = $1 AND b.rerun = $3 AND b.owner = $2::text::uuid
                   AND b.state = 'leased'
                   AND (b.bucket, b.lease_token) IN
                       (SELECT DISTINCT * FROM unnest($4::bigint[], $5::bigint[]))
                 FOR SHARE OF b),"
    };
}

pub(crate) use held_leases;

/// The fenced result write of [`write_results`] (one statement: check, share-lock, upsert).
pub(crate) const WRITE_RESULTS: &str = concat!(
    held_leases!(),
    "
             incoming AS (
                 SELECT * FROM unnest($4::bigint[], $5::bigint[], $6::text[], $7::bigint[],
                                      $8::bigint[], $9::text[], $10::integer[], $11::text[],
                                      $12::text[]) WITH ORDINALITY
                     AS u(lease_bucket, token, id, bucket, item_row, status, http_status,
                          body, record, ord))
             INSERT INTO hw_item AS i
                 (job_id, id, bucket, \"row\", status, http_status, body, record, lease_token)
             SELECT $1, u.id, u.bucket, u.item_row, u.status, u.http_status, u.body::json,
                    u.record::jsonb, u.token
             FROM incoming u JOIN held h ON h.bucket = u.lease_bucket AND h.lease_token = u.token
             ORDER BY u.ord
             ON CONFLICT (job_id, id) DO UPDATE
                 SET status = EXCLUDED.status, http_status = EXCLUDED.http_status,
                     body = EXCLUDED.body, record = EXCLUDED.record,
                     lease_token = EXCLUDED.lease_token
                 WHERE i.lease_token <= EXCLUDED.lease_token"
);

/// Write final results of one log, fenced by their leases (see the module doc). A later row
/// for the same ID in `rows` wins. One statement: by itself, or inside the transaction that
/// commits the buckets.
// The tests' way to the statements the writer (`writes.rs`) runs.
#[cfg(test)]
pub(crate) async fn write_results(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    log: Log,
    rows: &[ResultRow],
) -> Result<Written, PgError> {
    write_results_as(client, WRITE_RESULTS, job, me, log, rows).await
}

/// [`write_results`] by `statement`: [`WRITE_RESULTS`], or the same prepared.
pub(crate) async fn write_results_as<T: ?Sized + ToStatement + Sync + Send>(
    client: &impl GenericClient,
    statement: &T,
    job: JobId,
    me: &WorkerId,
    log: Log,
    rows: &[ResultRow],
) -> Result<Written, PgError> {
    if rows.iter().any(|r| r.lease.log != log) {
        return Err(PgError::Malformed(
            "results of several logs in one write".into(),
        ));
    }
    // ON CONFLICT DO UPDATE may touch a row once per statement: keep each ID's last result.
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        last.insert(&r.id, i);
    }
    let mut picked: Vec<usize> = last.into_values().collect();
    picked.sort_unstable();
    let n = picked.len();
    let (mut lease_buckets, mut tokens, mut ids, mut buckets, mut item_rows) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut statuses, mut http, mut bodies, mut records) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for &i in &picked {
        let r = &rows[i];
        lease_buckets.push(to_i64(r.lease.bucket)?);
        tokens.push(r.lease.token);
        ids.push(r.id.as_str());
        buckets.push(to_i64(r.bucket)?);
        item_rows.push(to_i64(r.row)?);
        statuses.push(status_name(r.status));
        http.push(r.http_status.map(i32::from));
        bodies.push(r.body.as_deref());
        records.push(r.record.as_str());
    }
    let written = client
        .execute(
            statement,
            &[
                &job.0,
                &me.0,
                &log_number(log),
                &lease_buckets,
                &tokens,
                &ids,
                &buckets,
                &item_rows,
                &statuses,
                &http,
                &bodies,
                &records,
            ],
        )
        .await
        .map_err(PgError::sql("writing results"))?;
    Ok(Written {
        written,
        fenced: rows.len() as u64 - written,
    })
}

fn status_name(status: ItemStatus) -> &'static str {
    match status {
        ItemStatus::Pending => "pending",
        ItemStatus::Ok => "ok",
        ItemStatus::Failed => "failed",
    }
}

/// Commit a bucket with its commit record's counts and time, for its current owner and
/// token only. [`PgError::LeaseLost`] if another session leased it since (nothing is
/// changed).
// The tests' way to the statements the writer (`writes.rs`) runs.
#[cfg(test)]
pub(crate) async fn commit_bucket(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    lease: &Lease,
    tally: &CommitRecord,
) -> Result<(), PgError> {
    commit_bucket_as(client, COMMIT_BUCKET, job, me, lease, tally).await
}

/// The update of [`commit_bucket`].
pub(crate) const COMMIT_BUCKET: &str = "UPDATE hw_bucket
             SET state = 'committed', ok = $6, failed = $7, failed_by_class = $8,
                 committed_at = to_timestamp($9::float8 / 1000),
                 usage_input = $10, usage_output = $11
             WHERE job_id = $1 AND rerun = $3 AND bucket = $4 AND owner = $2::text::uuid
               AND lease_token = $5 AND state = 'leased'";

/// [`commit_bucket`] by `statement`: [`COMMIT_BUCKET`], or the same prepared.
pub(crate) async fn commit_bucket_as<T: ?Sized + ToStatement + Sync + Send>(
    client: &impl GenericClient,
    statement: &T,
    job: JobId,
    me: &WorkerId,
    lease: &Lease,
    tally: &CommitRecord,
) -> Result<(), PgError> {
    let by_class = serde_json::to_value(&tally.failed_by_class)
        .map_err(|e| PgError::Malformed(e.to_string()))?;
    let n = client
        .execute(
            statement,
            &[
                &job.0,
                &me.0,
                &log_number(lease.log),
                &to_i64(lease.bucket)?,
                &lease.token,
                &to_i64(tally.ok)?,
                &to_i64(tally.failed)?,
                &by_class,
                &(tally.committed_at_ms as f64),
                &to_i64(tally.usage.input)?,
                &to_i64(tally.usage.output)?,
            ],
        )
        .await
        .map_err(PgError::sql("committing a bucket"))?;
    if n == 0 {
        return Err(PgError::LeaseLost {
            log: log_number(lease.log),
            bucket: lease.bucket,
            token: lease.token,
        });
    }
    Ok(())
}

/// Which of a commit's buckets (`$3`) are committed already, and whether by this session
/// (`$4`) under this token (`$5`).
pub(crate) const COMMITTED_BUCKETS: &str =
    "SELECT bucket, owner = $4::text::uuid AND lease_token = $5 FROM hw_bucket
     WHERE job_id = $1 AND rerun = $2 AND bucket = ANY($3) AND state = 'committed'";

/// Which of `buckets` of `log` are committed already (by [`COMMITTED_BUCKETS`], or the same
/// prepared): each with whether `me` committed it under `token`.
pub(crate) async fn committed_buckets_as<T: ?Sized + ToStatement + Sync + Send>(
    client: &impl GenericClient,
    statement: &T,
    job: JobId,
    me: &WorkerId,
    log: Log,
    buckets: &[i64],
    token: i64,
) -> Result<Vec<(i64, bool)>, PgError> {
    let rows = client
        .query(
            statement,
            &[&job.0, &log_number(log), &buckets, &me.0, &token],
        )
        .await
        .map_err(PgError::sql("reading committed buckets"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Set a committed job bucket's counts to `moved`'s (a rerun's commit moved its items'
/// outcomes).
pub(crate) async fn move_counts(
    client: &impl GenericClient,
    job: JobId,
    moved: &CommitRecord,
) -> Result<(), PgError> {
    let by_class = serde_json::to_value(&moved.failed_by_class)
        .map_err(|e| PgError::Malformed(e.to_string()))?;
    client
        .execute(
            "UPDATE hw_bucket SET ok = $3, failed = $4, failed_by_class = $5,
                    usage_input = $6, usage_output = $7
             WHERE job_id = $1 AND rerun = 0 AND bucket = $2 AND state = 'committed'",
            &[
                &job.0,
                &to_i64(moved.bucket)?,
                &to_i64(moved.ok)?,
                &to_i64(moved.failed)?,
                &by_class,
                &to_i64(moved.usage.input)?,
                &to_i64(moved.usage.output)?,
            ],
        )
        .await
        .map_err(PgError::sql("moving a job bucket's counts"))?;
    Ok(())
}

/// What a group flush did.
// The tests' way to the statements the writer (`writes.rs`) runs.
#[cfg(test)]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Flushed {
    pub results: Written,
    /// Buckets committed now.
    pub committed: Vec<Lease>,
    /// Leases found lost at commit: forget these buckets (their results were not written).
    pub lost: Vec<Lease>,
}

/// One group flush: the results, then the commits of buckets whose last results these are,
/// in one transaction. A lost lease costs only its own bucket.
// The tests' way to the statements the writer (`writes.rs`) runs.
#[cfg(test)]
pub(crate) async fn flush(
    client: &mut tokio_postgres::Client,
    job: JobId,
    me: &WorkerId,
    log: Log,
    rows: &[ResultRow],
    commits: &[(Lease, CommitRecord)],
) -> Result<Flushed, PgError> {
    let tx = client
        .transaction()
        .await
        .map_err(PgError::sql("starting a flush"))?;
    let mut flushed = Flushed {
        results: write_results(&tx, job, me, log, rows).await?,
        ..Flushed::default()
    };
    for (lease, tally) in commits {
        match commit_bucket(&tx, job, me, lease, tally).await {
            Ok(()) => flushed.committed.push(*lease),
            Err(PgError::LeaseLost { .. }) => flushed.lost.push(*lease),
            Err(e) => return Err(e),
        }
    }
    tx.commit()
        .await
        .map_err(PgError::sql("committing a flush"))?;
    Ok(flushed)
}
