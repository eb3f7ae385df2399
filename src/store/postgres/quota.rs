//! The job's quota usage on the job row (`hw_job.quota_usage`): every worker of the fleet
//! reserves calls from the same ledger, under the row's lock, in the database's time, so
//! workers whose clocks differ still agree on the windows.

use tokio_postgres::Client;

use super::error::PgError;
use super::keys::JobId;
use super::rows::malformed;
use super::typed::typed;
use crate::quota::{QuotaGrant, QuotaLedger, QuotaWant};

/// Reserve `wants` ([`QuotaLedger::reserve`]) at the database's now, in one transaction.
pub(crate) async fn reserve(
    client: &mut Client,
    job: JobId,
    wants: &[QuotaWant],
) -> Result<Vec<QuotaGrant>, PgError> {
    let tx = client
        .transaction()
        .await
        .map_err(PgError::sql("starting a quota reservation"))?;
    let row = tx
        .query_typed_one(
            "SELECT quota_usage, (extract(epoch FROM clock_timestamp()) * 1000)::bigint
             FROM hw_job WHERE job_id = $1 FOR UPDATE",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("reading the quota usage"))?;
    let mut ledger = ledger(row.get(0))?;
    let now_ms: i64 = row.get(1);
    let grants = ledger.reserve(wants, u64::try_from(now_ms).unwrap_or(0));
    let usage = serde_json::to_value(&ledger).expect("a ledger always serializes");
    tx.execute_typed(
        "UPDATE hw_job SET quota_usage = $2 WHERE job_id = $1",
        &typed![job.0, usage],
    )
    .await
    .map_err(PgError::sql("storing the quota usage"))?;
    tx.commit()
        .await
        .map_err(PgError::sql("committing a quota reservation"))?;
    Ok(grants)
}

/// The job's quota usage.
pub(crate) async fn read(client: &Client, job: JobId) -> Result<QuotaLedger, PgError> {
    let row = client
        .query_typed_one(
            "SELECT quota_usage FROM hw_job WHERE job_id = $1",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("reading the quota usage"))?;
    ledger(row.get(0))
}

fn ledger(value: serde_json::Value) -> Result<QuotaLedger, PgError> {
    serde_json::from_value(value).map_err(|e| malformed("the quota usage", e))
}
