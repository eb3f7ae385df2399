//! The PostgreSQL store: several workers on several machines share one job
//! through one database. [`PgStore`] implements the `Store`, `Leases` and `Fleet` seam
//! ([`store`], [`leases`]) on top of the functions of the other modules here.
//!
//! # Schema (`migrations/0001_init.sql`, `0002_fleet_burst_idle.sql` and
//! `0003_quota_usage.sql`, applied by [`migrate()`])
//!
//! - `hw_job`: one row per job (`name` unique). The spec as stored (templates as written:
//!   `${VAR}` never expanded, so no secret), the input fingerprint, the planner's position
//!   (`next_bucket`, cursor, `planner_exhausted`) and the **planner lease** (`planner`,
//!   `planner_token`), the fleet's `rate_per_s` and `burst` (NULL: no `--burst`), and the
//!   shared `paused_until`, and the fleet's `quota_usage` ([`quota`]).
//! - `hw_worker`: one row per process start (`worker_id` a random UUID made by the
//!   database), with host, pid, version, `heartbeat_at` and `expires_at` in **database time**,
//!   `draining`, `idle` (holds no bucket, found none: takes no rate share), `rate_share` and
//!   `stats`.
//! - `hw_bucket`: one row per bucket of a log (`rerun` 0 is the job's own log, n > 0 rerun
//!   n): the offset record, `state` open / leased / committed, `owner` (a worker session),
//!   `lease_token`, `owner_switches`, and the counts written at commit.
//! - `hw_item`: one row per unique ID, key `(job_id, id)`: the job bucket and row of its first
//!   occurrence, `status`, `http_status`, `body` (`json`: kept byte for byte), the rest of the
//!   record, and the `lease_token` it was written under (0: by the planner).
//! - `hw_rerun` (one row per rerun), `hw_bad_line`, the view `hw_result` (results by job
//!   name, for users' SQL), the sequence `hw_lease_token`, and `hw_schema` (the runner's).
//!
//! # Leases and fences
//!
//! Liveness is the worker's session, not a timer per bucket: [`session::heartbeat`] renews
//! `expires_at = now() + ttl` and says when the session had already expired (the worker must
//! then drop everything it holds and register again). A bucket's lease is valid while its
//! owner's session is: [`buckets::acquire`] takes open buckets and buckets of expired
//! sessions in one `FOR UPDATE SKIP LOCKED` statement, each with a fresh token. Every
//! result write and every commit carries the token ([`results`]): results are written only
//! under a share lock on a bucket row that still holds the writer's token, never over a row
//! written under a newer token, and a commit updates the bucket only for its current owner
//! and token, in the transaction of the bucket's last results. A worker that lost a lease
//! writes nothing that counts. The planner lease ([`planner`]) is the same idea on the job
//! row. Rate shares ([`session`]) are granted from free capacity under the job row's lock,
//! so they never sum above the job's rate.
//!
//! All times are the database's `now()`; no function here reads the local clock.

pub mod buckets;
pub mod connect;
pub mod error;
pub mod history;
pub mod job;
pub mod leases;
pub mod migrate;
pub mod outage;
pub mod planner;
pub mod quota;
pub mod rate;
mod reruns;
pub mod results;
mod rows;
pub mod session;
pub mod stats;
pub mod store;
mod tls;
mod writes;

#[cfg(test)]
pub(crate) mod test_db;

pub use connect::{connect, ConnectOptions, PgTarget};
pub use error::PgError;
pub use migrate::{migrate, Migration, MIGRATIONS};
pub use store::{PgOpen, PgStore};

/// A job's row id in `hw_job`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobId(pub i64);

/// A worker session: the random UUID of one process start (text form).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkerId(pub String);

impl std::fmt::Display for WorkerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A log's number in `hw_bucket.rerun`: 0 for the job's own, n for rerun n.
pub fn log_number(log: crate::store::Log) -> i32 {
    match log {
        crate::store::Log::Job => 0,
        crate::store::Log::Rerun(n) => i32::try_from(n).unwrap_or(i32::MAX),
    }
}

/// One held bucket lease: which bucket of which log, and the token it was granted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub log: crate::store::Log,
    pub bucket: u64,
    pub token: i64,
}
