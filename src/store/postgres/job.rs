//! The job's row (`hw_job`): created by the first worker, found by name by every other;
//! its spec as stored, read and written; removed when its creation is refused.

use tokio_postgres::GenericClient;

use super::error::PgError;
use super::keys::JobId;
use super::rows::{spec_from_json, sql, to_i64};
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
