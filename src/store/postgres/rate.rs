//! The fleet's rate limit and shared pause on the job row. Shares themselves are granted in
//! the heartbeat ([`super::session`]).

use std::time::Duration;

use tokio_postgres::Client;

use super::error::PgError;
use super::keys::JobId;
use super::typed::typed;

/// Change the job's total rate (none: unlimited) and burst. Every share is reset in the same
/// transaction (and regrows from the new rate at the next heartbeats), so a lower rate is
/// never exceeded by shares granted under the old one.
pub(crate) async fn set_rate(
    client: &mut Client,
    job: JobId,
    rate_per_s: Option<f64>,
    burst: Option<u32>,
) -> Result<(), PgError> {
    let tx = client
        .transaction()
        .await
        .map_err(PgError::sql("starting a rate change"))?;
    tx.execute_typed(
        "UPDATE hw_job SET rate_per_s = $2, burst = $3 WHERE job_id = $1",
        &typed![
            job.0,
            rate_per_s,
            burst.map(|b| i32::try_from(b.max(1)).unwrap_or(i32::MAX))
        ],
    )
    .await
    .map_err(PgError::sql("setting the rate"))?;
    tx.execute_typed(
        "UPDATE hw_worker SET rate_share = CASE WHEN $2::float8 IS NULL THEN NULL ELSE 0 END
         WHERE job_id = $1",
        &typed![job.0, rate_per_s],
    )
    .await
    .map_err(PgError::sql("resetting rate shares"))?;
    tx.commit()
        .await
        .map_err(PgError::sql("committing a rate change"))?;
    Ok(())
}

/// Make `rate_per_s` the job's total rate and `burst` its burst unless they already are (a
/// worker started with `--rate`): the shares are reset only by a change, so workers joining
/// with the same rate do not stall the others. Returns whether anything changed.
pub(crate) async fn ensure_rate(
    client: &mut Client,
    job: JobId,
    rate_per_s: f64,
    burst: Option<u32>,
) -> Result<bool, PgError> {
    let row = client
        .query_typed_one(
            "SELECT rate_per_s, burst FROM hw_job WHERE job_id = $1",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("reading the rate"))?;
    let (current, current_burst): (Option<f64>, Option<i32>) = (row.get(0), row.get(1));
    let burst = burst.map(|b| b.max(1));
    let same_rate = current.is_some_and(|c| (c - rate_per_s).abs() <= 1e-9 * rate_per_s);
    if same_rate && current_burst.map(|b| b as u32) == burst {
        return Ok(false);
    }
    set_rate(client, job, Some(rate_per_s), burst).await?;
    Ok(true)
}

/// Pause every worker of the job for `pause` from now (database time), unless it is
/// already paused for longer (a `Retry-After` seen by one worker). Returns how long the
/// job is paused from now.
pub(crate) async fn pause(
    client: &Client,
    job: JobId,
    pause: Duration,
) -> Result<Duration, PgError> {
    let row = client
        .query_typed_one(
            "UPDATE hw_job
             SET paused_until = greatest(coalesce(paused_until, now()),
                                         now() + make_interval(secs => $2))
             WHERE job_id = $1
             RETURNING extract(epoch FROM paused_until - now())::float8",
            &typed![job.0, pause.as_secs_f64()],
        )
        .await
        .map_err(PgError::sql("pausing the job"))?;
    Ok(Duration::from_secs_f64(row.get::<_, f64>(0).max(0.0)))
}
