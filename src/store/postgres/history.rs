//! The job's history in `hw_history`: the records ([`crate::history::Record`], as JSON) every
//! worker's monitor appends, read back in the order written. Bounded like the sled
//! backend's history file: past [`MAX_SAMPLES`] samples, every other one of the older
//! three quarters is deleted.

use tokio_postgres::Client;

use super::error::PgError;
use super::keys::JobId;
use super::typed::typed;

/// Samples kept at most per job (a fleet's workers each write theirs).
pub(crate) const MAX_SAMPLES: i64 = 20_000;

/// Append `records` (each a JSON object whose `kind` says whether it is a sample), then
/// thin the job's samples if they passed the bound.
pub(crate) async fn append(
    client: &Client,
    job: JobId,
    records: &[serde_json::Value],
) -> Result<(), PgError> {
    // The records and the count in one flight: each insert is its own transaction, sent
    // (and so run) before the count, which sees them.
    let inserts = futures_util::future::join_all(records.iter().map(|record| async move {
        let sample = record.get("kind").and_then(|k| k.as_str()) == Some("sample");
        client
            .execute_typed(
                "INSERT INTO hw_history (job_id, sample, record) VALUES ($1, $2, $3)",
                &typed![job.0, sample, record],
            )
            .await
            .map_err(PgError::sql("appending to the job's history"))
    }));
    let count = async {
        client
            .query_typed_one(
                "SELECT count(*) FROM hw_history WHERE job_id = $1 AND sample",
                &typed![job.0],
            )
            .await
            .map_err(PgError::sql("counting the job's history"))
    };
    let (inserted, row) = futures_util::future::join(inserts, count).await;
    for i in inserted {
        i?;
    }
    let row = row?;
    let samples: i64 = row.get(0);
    if samples > MAX_SAMPLES {
        client
            .execute_typed(
                "DELETE FROM hw_history WHERE job_id = $1 AND seq IN (
                     SELECT seq FROM (
                         SELECT seq, row_number() OVER (ORDER BY seq) AS n
                         FROM hw_history WHERE job_id = $1 AND sample
                     ) s
                     WHERE s.n * 4 < $2 * 3 AND s.n % 2 = 0)",
                &typed![job.0, samples],
            )
            .await
            .map_err(PgError::sql("thinning the job's history"))?;
    }
    Ok(())
}

/// Every record of the job's history, oldest first.
pub(crate) async fn read(client: &Client, job: JobId) -> Result<Vec<serde_json::Value>, PgError> {
    let rows = client
        .query_typed(
            "SELECT record FROM hw_history WHERE job_id = $1 ORDER BY seq",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("reading the job's history"))?;
    Ok(rows.into_iter().map(|r| r.get(0)).collect())
}
