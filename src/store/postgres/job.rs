//! The job's row (`hw_job`): created by the first worker, found by name by every other.

use tokio_postgres::GenericClient;

use super::error::PgError;
use super::JobId;

/// What a new job row holds. `spec` is the job spec as stored (templates unexpanded).
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
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
pub async fn create_job(
    client: &impl GenericClient,
    job: &NewJob<'_>,
) -> Result<(JobId, bool), PgError> {
    let created = client
        .query_opt(
            "INSERT INTO hw_job (name, spec, input_fingerprint, bucket_size, rate_per_s, burst)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (name) DO NOTHING RETURNING job_id",
            &[
                &job.name,
                job.spec,
                &job.input_fingerprint,
                &to_i64(job.bucket_size)?,
                &job.rate_per_s,
                &job.burst
                    .map(|b| i32::try_from(b.max(1)).unwrap_or(i32::MAX)),
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
pub async fn find_job(client: &impl GenericClient, name: &str) -> Result<JobId, PgError> {
    client
        .query_opt("SELECT job_id FROM hw_job WHERE name = $1", &[&name])
        .await
        .map_err(PgError::sql("finding the job"))?
        .map(|row| JobId(row.get(0)))
        .ok_or_else(|| PgError::NoSuchJob(name.into()))
}

/// A count or number as PostgreSQL's bigint.
pub(crate) fn to_i64(n: u64) -> Result<i64, PgError> {
    i64::try_from(n).map_err(|_| PgError::Malformed(format!("{n} does not fit a bigint")))
}
