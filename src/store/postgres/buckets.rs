//! Bucket leases (`hw_bucket`): acquire and release, one bucket, the next ones, or the whole
//! job's; and a log's bucket rows read back a page at a time. A lease is (bucket, token) held
//! by a worker session; it is valid while the bucket still carries that owner and token.
//! There is no rescuer and no time-based rescue of live workers: [`acquire`] takes open
//! buckets and the buckets of sessions that expired, in the same statement, each with a
//! fresh token.

use tokio_postgres::{Client, GenericClient, Row};

use super::error::PgError;
use super::keys::{log_number, JobId, Lease, WorkerId};
use super::liveness::live_sessions;
use super::rows::{sql, to_i64, BUCKET_COLUMNS};
use super::typed::typed;
use crate::store::Log;

/// A bucket just leased.
#[derive(Debug, Clone)]
pub struct Acquired {
    pub lease: Lease,
    /// The bucket's write-ahead record as stored (an `OffsetRecord` or `RerunOffset`).
    pub offset_record: serde_json::Value,
    pub items: u64,
    /// Times the bucket was leased again after an earlier lease, this one included.
    pub owner_switches: u32,
    /// Taken from a session that expired (not open).
    pub taken_over: bool,
}

/// Lease up to `n` buckets of `log`, lowest first: open ones and those whose owner's session
/// expired, skipping rows other transactions hold. Nothing if this session is not live or
/// is draining.
pub(crate) async fn acquire(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    log: Log,
    n: u32,
) -> Result<Vec<Acquired>, PgError> {
    let rows = client
        .query_typed(
            concat!(
                "WITH cand AS (
                 SELECT b.job_id, b.rerun, b.bucket, b.owner AS old_owner
                 FROM hw_bucket b, ",
                live_sessions!(),
                "
                 WHERE live.me_live AND b.job_id = $1 AND b.rerun = $3
                   AND b.state <> 'committed'
                   AND (b.state = 'open' OR b.owner <> ALL (live.ids))
                 ORDER BY b.bucket
                 LIMIT $4
                 FOR UPDATE OF b SKIP LOCKED)
             UPDATE hw_bucket b
             SET state = 'leased', owner = $2::text::uuid,
                 lease_token = nextval('hw_lease_token'),
                 owner_switches = b.owner_switches + (b.lease_token IS NOT NULL)::integer
             FROM cand
             WHERE b.job_id = cand.job_id AND b.rerun = cand.rerun AND b.bucket = cand.bucket
               AND b.owner IS NOT DISTINCT FROM cand.old_owner AND b.state <> 'committed'
             RETURNING b.bucket, b.lease_token, b.offset_record, b.items, b.owner_switches,
                       cand.old_owner IS NOT NULL"
            ),
            &typed![job.0, me.0, log_number(log), i64::from(n)],
        )
        .await
        .map_err(PgError::sql("acquiring buckets"))?;
    let mut acquired: Vec<Acquired> = rows
        .iter()
        .map(|r| Acquired {
            lease: Lease {
                log,
                bucket: r.get::<_, i64>(0) as u64,
                token: r.get(1),
            },
            offset_record: r.get(2),
            items: r.get::<_, i64>(3) as u64,
            owner_switches: r.get::<_, i32>(4) as u32,
            taken_over: r.get(5),
        })
        .collect();
    acquired.sort_by_key(|a| a.lease.bucket);
    Ok(acquired)
}

/// Give leased buckets back (open, no owner) so others take them at once. Only leases this
/// session still holds under the given tokens are released. Returns how many.
pub(crate) async fn release(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    leases: &[Lease],
) -> Result<u64, PgError> {
    let mut released = 0;
    for log in logs(leases) {
        let (buckets, tokens) = lease_arrays(leases.iter().filter(|l| l.log == log))?;
        released += client
            .execute_typed(
                "UPDATE hw_bucket SET state = 'open', owner = NULL
                 WHERE job_id = $1 AND rerun = $3 AND owner = $2::text::uuid AND state = 'leased'
                   AND (bucket, lease_token) IN (SELECT * FROM unnest($4::bigint[], $5::bigint[]))",
                &typed![job.0, me.0, log_number(log), buckets, tokens],
            )
            .await
            .map_err(PgError::sql("releasing buckets"))?;
    }
    Ok(released)
}

/// Release every bucket this session holds, in every log (a drain's last step).
pub(crate) async fn release_all(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
) -> Result<u64, PgError> {
    client
        .execute_typed(
            "UPDATE hw_bucket SET state = 'open', owner = NULL
             WHERE job_id = $1 AND owner = $2::text::uuid AND state = 'leased'",
            &typed![job.0, me.0],
        )
        .await
        .map_err(PgError::sql("releasing buckets"))
}

/// Give back every bucket this session holds under the job-wide lease `token`.
pub(super) async fn release_job(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    token: i64,
) -> Result<u64, PgError> {
    client
        .execute_typed(
            "UPDATE hw_bucket SET state = 'open', owner = NULL
                     WHERE job_id = $1 AND owner = $2::text::uuid AND state = 'leased'
                       AND lease_token = $3",
            &typed![job.0, me.0, token],
        )
        .await
        .map_err(PgError::sql("releasing the job's buckets"))
}

/// Lease every uncommitted bucket of every log under one new token, unless another live
/// session holds one of them.
pub(super) async fn acquire_job(
    c: &mut Client,
    job: JobId,
    me: &WorkerId,
) -> Result<Option<i64>, PgError> {
    let tx = c
        .transaction()
        .await
        .map_err(PgError::sql("starting a job lease"))?;
    let live = tx
        .query_typed_opt(
            "SELECT nextval('hw_lease_token') FROM hw_worker
             WHERE job_id = $1 AND worker_id = $2::text::uuid AND expires_at > now()
               AND NOT draining",
            &typed![job.0, me.0],
        )
        .await
        .map_err(PgError::sql("taking a token"))?;
    let Some(token) = live.map(|r| r.get::<_, i64>(0)) else {
        return Ok(None);
    };
    // Rows are locked by the update (others' SKIP LOCKED acquires pass them by); then
    // anything still held by someone alive refuses the lease.
    tx.execute_typed(
        concat!(
            "UPDATE hw_bucket b SET state = 'leased', owner = $2::text::uuid, lease_token = $3,
             owner_switches = b.owner_switches
                 + (b.lease_token IS NOT NULL AND b.owner IS DISTINCT FROM $2::text::uuid)::integer
             FROM ",
            live_sessions!(),
            "
             WHERE b.job_id = $1 AND b.state <> 'committed'
               AND (b.state = 'open' OR b.owner = $2::text::uuid OR b.owner <> ALL (live.ids))"
        ),
        &typed![job.0, me.0, token],
    )
    .await
    .map_err(PgError::sql("leasing the job's buckets"))?;
    let others = tx
        .query_typed_one(
            "SELECT EXISTS (SELECT 1 FROM hw_bucket b WHERE b.job_id = $1 AND b.state = 'leased'
                 AND b.owner <> $2::text::uuid)",
            &typed![job.0, me.0],
        )
        .await
        .map_err(PgError::sql("checking other workers' buckets"))?;
    if others.get::<_, bool>(0) {
        return Ok(None);
    }
    tx.commit()
        .await
        .map_err(PgError::sql("committing a job lease"))?;
    Ok(Some(token))
}

/// Lease one bucket (open, orphaned, or this session's own: a new token supersedes the
/// old), unless it is committed or another live session holds it.
pub(super) async fn acquire_one(
    c: &mut Client,
    job: JobId,
    me: &WorkerId,
    log: Log,
    bucket: u64,
) -> Result<Option<i64>, PgError> {
    let row = c
        .query_typed_opt(
            concat!(
                "UPDATE hw_bucket b SET state = 'leased', owner = $2::text::uuid,
                 lease_token = nextval('hw_lease_token'),
                 owner_switches = b.owner_switches
                   + (b.lease_token IS NOT NULL AND b.owner IS DISTINCT FROM $2::text::uuid)::integer
                 FROM ",
                live_sessions!(),
                "
                 WHERE live.me_live AND b.job_id = $1 AND b.rerun = $3 AND b.bucket = $4
                   AND b.state <> 'committed'
                   AND (b.state = 'open' OR b.owner = $2::text::uuid OR b.owner <> ALL (live.ids))
                 RETURNING b.lease_token"
            ),
            &typed![job.0, me.0, log_number(log), to_i64(bucket)?],
        )
        .await
        .map_err(PgError::sql("leasing a bucket"))?;
    Ok(row.map(|r| r.get(0)))
}

/// A page of a log's bucket rows ([`BUCKET_COLUMNS`]).
pub(super) async fn bucket_rows(
    c: &Client,
    job: JobId,
    log: Log,
    from: u64,
    limit: usize,
) -> Result<Vec<Row>, PgError> {
    c.query_typed(
        &format!(
            "SELECT {BUCKET_COLUMNS} FROM hw_bucket
             WHERE job_id = $1 AND rerun = $2 AND bucket >= $3 ORDER BY bucket LIMIT $4"
        ),
        &typed![
            job.0,
            log_number(log),
            to_i64(from)?,
            (limit.min(i64::MAX as usize) as i64)
        ],
    )
    .await
    .map_err(sql("reading buckets"))
}

/// The distinct logs of `leases`, in first-seen order.
pub(crate) fn logs(leases: &[Lease]) -> Vec<Log> {
    let mut logs = Vec::new();
    for l in leases {
        if !logs.contains(&l.log) {
            logs.push(l.log);
        }
    }
    logs
}

/// Buckets and tokens as bigint arrays.
pub(crate) fn lease_arrays<'a>(
    leases: impl Iterator<Item = &'a Lease>,
) -> Result<(Vec<i64>, Vec<i64>), PgError> {
    let mut buckets = Vec::new();
    let mut tokens = Vec::new();
    for l in leases {
        buckets.push(to_i64(l.bucket)?);
        tokens.push(l.token);
    }
    Ok((buckets, tokens))
}
