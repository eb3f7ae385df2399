//! The windows a job learnt from the API's refusals, in `hw_job.learned_limits` (a JSON
//! array of [`KeptLimit`]s): read by every worker, replaced by one that learnt more.

use tokio_postgres::GenericClient;

use super::error::PgError;
use super::keys::JobId;
use super::rows::malformed;
use super::typed::typed;
use crate::quota::KeptLimit;

/// The job's kept limits (none: empty). A value this build cannot read is an error, never
/// taken as none.
pub(crate) async fn read(
    client: &impl GenericClient,
    job: JobId,
) -> Result<Vec<KeptLimit>, PgError> {
    let row = client
        .query_typed_opt(
            "SELECT learned_limits FROM hw_job WHERE job_id = $1",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("reading the job's learnt limits"))?;
    let Some(row) = row else {
        return Ok(Vec::new());
    };
    let value: serde_json::Value = row.get(0);
    serde_json::from_value(value).map_err(|e| malformed("the job's learnt limits", e))
}

/// Replace the job's kept limits with `limits`.
pub(crate) async fn write(
    client: &impl GenericClient,
    job: JobId,
    limits: &[KeptLimit],
) -> Result<(), PgError> {
    let value = serde_json::to_value(limits).expect("kept limits always serialize");
    client
        .execute_typed(
            "UPDATE hw_job SET learned_limits = $2 WHERE job_id = $1",
            &typed![job.0, value],
        )
        .await
        .map_err(PgError::sql("keeping the job's learnt limits"))?;
    Ok(())
}
