//! The job's row (`hw_job`): created by the first worker, found by name by every other;
//! its spec as stored, read and written; removed when its creation is refused.

use tokio_postgres::GenericClient;

use std::time::Duration;

use super::error::PgError;
use super::keys::{JobId, WorkerId};
use super::rows::{spec_from_json, sql, to_i64};
use super::session::WorkerInfo;
use super::typed::typed;
use crate::store::StoredJob;

/// What a new job row holds. `spec` is the job spec as stored (templates unexpanded).
#[derive(Debug, Clone)]
pub(crate) struct NewJob<'a> {
    pub name: &'a str,
    pub spec: &'a serde_json::Value,
    pub input_fingerprint: Option<&'a serde_json::Value>,
    pub bucket_size: u64,
    pub rate_per_s: Option<f64>,
    /// `--burst` (none: each worker derives its own from its share).
    pub burst: Option<u32>,
}

/// Create the job, or find it if a job of that name exists. Returns its id and whether
/// this call created it.
pub(crate) async fn create_job(
    client: &impl GenericClient,
    job: &NewJob<'_>,
) -> Result<(JobId, bool), PgError> {
    let created = client
        .query_typed_opt(
            "INSERT INTO hw_job (name, spec, input_fingerprint, bucket_size, rate_per_s, burst)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (name) DO NOTHING RETURNING job_id",
            &typed![
                job.name,
                job.spec,
                job.input_fingerprint,
                to_i64(job.bucket_size)?,
                job.rate_per_s,
                job.burst
                    .map(|b| i32::try_from(b.max(1)).unwrap_or(i32::MAX))
            ],
        )
        .await
        .map_err(PgError::sql("creating the job"))?;
    match created {
        Some(row) => Ok((JobId(row.get(0)), true)),
        None => Ok((find_job(client, job.name).await?, false)),
    }
}

/// What [`open_row`] found or made: the job, whether this call created it, its spec as
/// stored (JSON `null` before a first run stored one) and the session registered on it.
#[derive(Debug)]
pub(crate) struct OpenedRow {
    pub job: JobId,
    pub created: bool,
    pub spec: serde_json::Value,
    pub me: Option<WorkerId>,
}

/// Find the job named `job.name` (with `create`, create it if there is none), register a
/// session on it for `worker` (host, pid, version, TTL), and read its spec: one statement,
/// one round trip, where finding, creating, registering and reading one after the other
/// cost four. `None`: no job of that name is visible to this statement, either because
/// there is none (and `create` is false) or because another worker's creation committed
/// after the statement began; the caller then takes the long way ([`create_job`],
/// [`find_job`]), whose statements each see what committed before them.
pub(crate) async fn open_row(
    client: &impl GenericClient,
    job: &NewJob<'_>,
    create: bool,
    worker: Option<(&WorkerInfo<'_>, Duration)>,
) -> Result<Option<OpenedRow>, PgError> {
    let (host, pid, version, ttl) = match worker {
        Some((info, ttl)) => (
            Some(info.host),
            Some(i32::try_from(info.pid).unwrap_or(i32::MAX)),
            Some(info.version),
            ttl.as_secs_f64(),
        ),
        None => (None, None, None, 0.0),
    };
    // A row made by `made` is not visible to the statement's own read of hw_job (one
    // snapshot): `found` sees the job only when `made` made nothing, so `job` has one row.
    let row = client
        .query_typed_opt(
            "WITH made AS (
                 INSERT INTO hw_job (name, spec, input_fingerprint, bucket_size, rate_per_s, burst)
                 SELECT $1, $2, $3, $4, $5, $6 WHERE $7
                 ON CONFLICT (name) DO NOTHING RETURNING job_id, spec
             ), job AS (
                 SELECT job_id, spec, true AS created FROM made
                 UNION ALL
                 SELECT job_id, spec, false FROM hw_job WHERE name = $1
                 LIMIT 1
             ), me AS (
                 INSERT INTO hw_worker (job_id, host, pid, version, expires_at)
                 SELECT job_id, $9, $10, $11, clock_timestamp() + make_interval(secs => $12)
                 FROM job WHERE $8
                 RETURNING worker_id::text AS worker_id
             )
             SELECT job.job_id, job.created, job.spec, (SELECT worker_id FROM me) FROM job",
            &typed![
                job.name,
                job.spec,
                job.input_fingerprint,
                to_i64(job.bucket_size)?,
                job.rate_per_s,
                job.burst
                    .map(|b| i32::try_from(b.max(1)).unwrap_or(i32::MAX)),
                create,
                worker.is_some(),
                host,
                pid,
                version,
                ttl
            ],
        )
        .await
        .map_err(PgError::sql("opening the job"))?;
    Ok(row.map(|row| OpenedRow {
        job: JobId(row.get(0)),
        created: row.get(1),
        spec: row.get(2),
        me: row.get::<_, Option<String>>(3).map(WorkerId),
    }))
}

/// The id of the job named `name`.
pub(crate) async fn find_job(client: &impl GenericClient, name: &str) -> Result<JobId, PgError> {
    client
        .query_typed_opt("SELECT job_id FROM hw_job WHERE name = $1", &typed![name])
        .await
        .map_err(PgError::sql("finding the job"))?
        .map(|row| JobId(row.get(0)))
        .ok_or_else(|| PgError::NoSuchJob(name.into()))
}

/// The job's spec as stored (none before a first run stored one).
pub(super) async fn read_spec(
    client: &impl GenericClient,
    job: JobId,
) -> Result<Option<StoredJob>, PgError> {
    let row = client
        .query_typed_one("SELECT spec FROM hw_job WHERE job_id = $1", &typed![job.0])
        .await
        .map_err(sql("reading the job"))?;
    spec_from_json(&row.get(0))
}

/// Store the job's spec (as [`super::rows::spec_json`] makes it).
pub(super) async fn write_spec(
    client: &impl GenericClient,
    job: JobId,
    spec: &serde_json::Value,
) -> Result<(), PgError> {
    client
        .execute_typed(
            "UPDATE hw_job SET spec = $2 WHERE job_id = $1",
            &typed![job.0, spec],
        )
        .await
        .map_err(sql("storing the job"))?;
    Ok(())
}

/// Remove the job's row (a job this open created, whose creation was refused after all).
pub(super) async fn delete_job(client: &impl GenericClient, job: JobId) -> Result<(), PgError> {
    client
        .execute_typed("DELETE FROM hw_job WHERE job_id = $1", &typed![job.0])
        .await
        .map_err(PgError::sql("removing the new job"))?;
    Ok(())
}
