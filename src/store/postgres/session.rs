//! Worker sessions (`hw_worker`): one row per process start with a random id. Liveness is
//! the session: a heartbeat renews `expires_at = now() + ttl` in database time, and every
//! lease the worker holds is valid only while its session is. The heartbeat also grants the
//! worker's **rate share** from free capacity and reports the job's shared pause.
//!
//! Rate shares, computed in the heartbeat's transaction under a per-job advisory lock (not
//! the job row's lock, so a planning transaction never delays a heartbeat):
//! fair = R / live workers neither draining nor idle; free = R - the other live workers'
//! shares; share = max(0, min(fair, free)); a draining or idle worker's (one that holds no
//! bucket and found none to lease) is 0. Each worker's part of the job's burst B is
//! floor(B · share / R), at least 1 while its share is positive. Every grant leaves the
//! live shares' sum at most R, and an expired session's share stops counting at once, so
//! the sum never exceeds R. A newcomer starts at 0 and grows as others' next heartbeats
//! give up their excess. The worker must stop using its share (and its leases) when its
//! own monotonic deadline (`ttl` after it sent the heartbeat) passes without a renewal.

use std::time::Duration;

use tokio_postgres::{Client, GenericClient};

use super::error::PgError;
use super::flight;
use super::keys::{JobId, WorkerId};
use super::typed::typed;

/// Who a worker is, for `status`.
#[derive(Debug, Clone)]
pub(crate) struct WorkerInfo<'a> {
    pub host: &'a str,
    pub pid: u32,
    pub version: &'a str,
}

/// What a renewed session may use until its next heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// Calls per second this worker may make (none: the job has no rate limit).
    pub rate_share: Option<f64>,
    /// This worker's part of the job's `--burst` (at least 1 while it has a share; none:
    /// the job has no `--burst`).
    pub burst: Option<u32>,
    /// The job is paused (a shared `Retry-After`) for this much longer.
    pub paused_for: Option<Duration>,
    pub draining: bool,
    /// The job's live workers sharing its calls, this one among them (at least 1).
    pub live: u32,
    /// The job's other live workers making calls (not draining, not idle): the API's
    /// announced limits are divided among them and this one.
    pub peers: u32,
}

/// A heartbeat's outcome.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Heartbeat {
    Renewed(Grant),
    /// The session had expired: its leases may be anyone's. Drop them all, register again.
    Expired,
}

/// The advisory lock class under which a job's rate shares are computed ("hwra").
const RATE_LOCK: i32 = 0x6877_7261;

/// Register a new session for this process start; it lives `ttl` unless renewed.
pub(crate) async fn register(
    client: &impl GenericClient,
    job: JobId,
    info: &WorkerInfo<'_>,
    ttl: Duration,
) -> Result<WorkerId, PgError> {
    let row = client
        .query_typed_one(
            "INSERT INTO hw_worker (job_id, host, pid, version, expires_at)
             VALUES ($1, $2, $3, $4, clock_timestamp() + make_interval(secs => $5))
             RETURNING worker_id::text",
            &typed![
                job.0,
                info.host,
                i32::try_from(info.pid).unwrap_or(i32::MAX),
                info.version,
                ttl.as_secs_f64()
            ],
        )
        .await
        .map_err(PgError::sql("registering the worker"))?;
    Ok(WorkerId(row.get(0)))
}

/// This machine's name, as a session is registered under it.
pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

impl<'a> WorkerInfo<'a> {
    /// This process on `host` ([`hostname`]), at this build's version.
    pub(super) fn here(host: &'a str) -> WorkerInfo<'a> {
        WorkerInfo {
            host,
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION"),
        }
    }
}

/// Register a session for this process, named by its host and pid.
pub(super) async fn register_here(
    client: &impl GenericClient,
    job: JobId,
    ttl: Duration,
) -> Result<WorkerId, PgError> {
    let host = hostname();
    register(client, job, &WorkerInfo::here(&host), ttl).await
}

/// Renew the session for `ttl` (database time), store `stats`, and take this worker's rate
/// share. [`Heartbeat::Expired`] if the session had already expired (nothing is renewed).
pub(crate) async fn heartbeat(
    client: &mut Client,
    job: JobId,
    me: &WorkerId,
    ttl: Duration,
    stats: &serde_json::Value,
    idle: bool,
) -> Result<Heartbeat, PgError> {
    // One flight (see `flight.rs`): the transaction, the lock, the renewal and the commit,
    // where waiting for each answer cost four round trips (a newcomer with a rate waits for
    // its first grant before its first call).
    let tx: &Client = client;
    let lock = async {
        tx.execute_typed(
            "SELECT pg_advisory_xact_lock($1, ($2::bigint % 2147483647)::integer)",
            &typed![RATE_LOCK, job.0],
        )
        .await
        .map_err(PgError::sql("taking the rate-share lock"))
    };
    // clock_timestamp, not now(): the lock may have been waited for.
    let renew = async {
        tx.query_typed_opt(
            "UPDATE hw_worker w
             SET heartbeat_at = clock_timestamp(),
                 expires_at = clock_timestamp() + make_interval(secs => $3),
                 stats = $4,
                 idle = $5,
                 rate_share = CASE
                     WHEN j.rate_per_s IS NULL THEN NULL
                     WHEN w.draining OR $5 THEN 0
                     ELSE greatest(0, least(j.rate_per_s / greatest(live.n, 1),
                                            j.rate_per_s - others.s))
                 END
             FROM (SELECT rate_per_s, burst, paused_until FROM hw_job WHERE job_id = $1) j,
                  (SELECT count(*) AS n FROM hw_worker
                   WHERE job_id = $1 AND NOT draining AND expires_at > clock_timestamp()
                     AND CASE WHEN worker_id = $2::text::uuid THEN NOT $5 ELSE NOT idle END) live,
                  (SELECT coalesce(sum(rate_share), 0) AS s FROM hw_worker
                   WHERE job_id = $1 AND worker_id <> $2::text::uuid
                     AND expires_at > clock_timestamp()) others,
                  (SELECT count(*) AS n FROM hw_worker
                   WHERE job_id = $1 AND worker_id <> $2::text::uuid AND NOT draining
                     AND NOT idle AND expires_at > clock_timestamp()) peers
             WHERE w.job_id = $1 AND w.worker_id = $2::text::uuid
               AND w.expires_at > clock_timestamp()
             RETURNING w.rate_share, j.rate_per_s, j.burst, w.draining,
                       extract(epoch FROM j.paused_until - clock_timestamp())::float8,
                       live.n, peers.n",
            &typed![job.0, me.0, ttl.as_secs_f64(), stats, idle],
        )
        .await
        .map_err(PgError::sql("renewing the worker session"))
    };
    let (begun, locked, renewed, ended) = futures_util::future::join4(
        flight::begin(tx, "starting a heartbeat"),
        lock,
        renew,
        flight::end(tx, "committing a heartbeat"),
    )
    .await;
    // The first error is the one said: after it the others fail too, and the commit rolls
    // back without one.
    begun?;
    locked?;
    let renewed = renewed?;
    ended?;
    // No row: the session had expired (the commit changed nothing).
    let Some(row) = renewed else {
        return Ok(Heartbeat::Expired);
    };
    let rate_share: Option<f64> = row.get(0);
    let rate: Option<f64> = row.get(1);
    let burst: Option<i32> = row.get(2);
    let paused: Option<f64> = row.get(4);
    let live: i64 = row.get(5);
    let peers: i64 = row.get(6);
    Ok(Heartbeat::Renewed(Grant {
        rate_share,
        burst: share_of_burst(burst, rate_share, rate),
        paused_for: paused.filter(|s| *s > 0.0).map(Duration::from_secs_f64),
        draining: row.get(3),
        live: u32::try_from(live).unwrap_or(u32::MAX).max(1),
        peers: u32::try_from(peers).unwrap_or(u32::MAX),
    }))
}

/// This worker's part of the job's burst B: floor(B · share / R), at least 1 while the share
/// is positive. Floors sum to at most B; only workers whose floor is 0 round up, so the
/// fleet's burst is B, or one call per worker when B is smaller than the workers.
fn share_of_burst(burst: Option<i32>, share: Option<f64>, rate: Option<f64>) -> Option<u32> {
    let burst = burst?.max(1) as u32;
    Some(match (share, rate) {
        (Some(share), Some(rate)) if share > 0.0 && rate > 0.0 => {
            ((f64::from(burst) * share / rate + 1e-9).floor() as u32).clamp(1, burst)
        }
        (Some(_), Some(_)) => 0,
        _ => burst,
    })
}

/// One worker session as `status` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerRow {
    /// The session's id (a UUID).
    pub worker: String,
    /// The host the worker runs on.
    pub host: String,
    /// The worker's process id on that host.
    pub pid: i32,
    /// The highwater version the worker runs.
    pub version: String,
    /// Milliseconds since the epoch (database time).
    pub started_ms: u64,
    /// The last heartbeat, in milliseconds since the epoch (database time).
    pub heartbeat_ms: u64,
    /// Seconds since the last heartbeat (database time).
    pub heartbeat_age_s: f64,
    /// alive, expired or draining.
    pub state: String,
    /// Buckets the worker holds a lease on now.
    pub buckets_held: i64,
    /// Calls per second granted at the last heartbeat; none when the job has no rate limit.
    pub rate_share: Option<f64>,
    /// The figures the worker sent with its last heartbeat (JSON).
    pub stats: serde_json::Value,
}

/// Every session of the job, newest first.
pub(crate) async fn workers(
    client: &impl GenericClient,
    job: JobId,
) -> Result<Vec<WorkerRow>, PgError> {
    let rows = client
        .query_typed(
            "SELECT w.worker_id::text, w.host, w.pid, w.version,
                    (extract(epoch FROM w.started_at) * 1000)::float8,
                    (extract(epoch FROM w.heartbeat_at) * 1000)::float8,
                    extract(epoch FROM now() - w.heartbeat_at)::float8,
                    CASE WHEN w.expires_at <= now() THEN 'expired'
                         WHEN w.draining THEN 'draining' ELSE 'alive' END,
                    (SELECT count(*) FROM hw_bucket b WHERE b.job_id = w.job_id
                       AND b.owner = w.worker_id AND b.state = 'leased'),
                    w.rate_share, w.stats
             FROM hw_worker w WHERE w.job_id = $1 ORDER BY w.started_at DESC",
            &typed![job.0],
        )
        .await
        .map_err(PgError::sql("listing workers"))?;
    Ok(rows
        .iter()
        .map(|r| WorkerRow {
            worker: r.get(0),
            host: r.get(1),
            pid: r.get(2),
            version: r.get(3),
            started_ms: r.get::<_, f64>(4).max(0.0).round() as u64,
            heartbeat_ms: r.get::<_, f64>(5).max(0.0).round() as u64,
            heartbeat_age_s: r.get(6),
            state: r.get(7),
            buckets_held: r.get(8),
            rate_share: r.get(9),
            stats: r.get(10),
        })
        .collect())
}

/// Start draining: no new buckets, and the rate share goes back to the others at once.
pub(crate) async fn drain(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
) -> Result<(), PgError> {
    client
        .execute_typed(
            "UPDATE hw_worker SET draining = true,
                 rate_share = CASE WHEN rate_share IS NULL THEN NULL ELSE 0 END
             WHERE job_id = $1 AND worker_id = $2::text::uuid",
            &typed![job.0, me.0],
        )
        .await
        .map_err(PgError::sql("marking the worker draining"))?;
    Ok(())
}

/// End the session: release every bucket and the planner lease it holds, and delete its
/// row, in one transaction. Returns how many buckets were released.
pub(crate) async fn end(client: &Client, job: JobId, me: &WorkerId) -> Result<u64, PgError> {
    // One flight (see `flight.rs`): each statement's result is checked, and one error means
    // the transaction was rolled back whole.
    let (begun, released, planner, deleted, ended) = futures_util::future::join5(
        flight::begin(client, "starting the session's end"),
        super::buckets::release_all(client, job, me),
        super::planner::release_planner(client, job, me),
        async {
            client
                .execute_typed(
                    "DELETE FROM hw_worker WHERE job_id = $1 AND worker_id = $2::text::uuid",
                    &typed![job.0, me.0],
                )
                .await
                .map_err(PgError::sql("deleting the worker session"))
        },
        flight::end(client, "committing the session's end"),
    )
    .await;
    begun?;
    let released = released?;
    planner?;
    deleted?;
    ended?;
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::share_of_burst;

    #[test]
    fn burst_is_shared_in_proportion_never_above_the_jobs_and_never_zero_with_a_share() {
        assert_eq!(share_of_burst(Some(10), Some(50.0), Some(100.0)), Some(5));
        assert_eq!(share_of_burst(Some(10), Some(1.0), Some(100.0)), Some(1));
        assert_eq!(share_of_burst(Some(10), Some(0.0), Some(100.0)), Some(0));
        assert_eq!(share_of_burst(Some(10), None, None), Some(10));
        assert_eq!(share_of_burst(None, Some(50.0), Some(100.0)), None);
        // Three fair shares of 100: 3 + 3 + 3 <= 10 (a ceiling would give 4 + 4 + 4).
        let third = 100.0 / 3.0;
        let parts: u32 = (0..3)
            .map(|_| share_of_burst(Some(10), Some(third), Some(100.0)).unwrap())
            .sum();
        assert_eq!(parts, 9);
    }
}
