//! The PostgreSQL store: several workers on several machines share one job
//! through one database. [`PgStore`] implements the `Store`, `Leases` and `Fleet` seam
//! on top of the functions of the per-table modules here.
//!
//! # Layers (a file uses only the files named before it here, never one after)
//!
//! 1. Shared values, no SQL: `error`, `keys.rs` (`JobId`, `WorkerId`, `Lease`),
//!    `rows.rs` (rows as records), `tls.rs`, `connect` (targets and connections),
//!    `outage`, `typed.rs` (statements sent in one flight), `flight.rs` (a transaction
//!    whose `BEGIN` and `COMMIT` travel with its statements).
//! 2. SQL, one module per table or concern, each a set of functions taking a client or a
//!    transaction: `migrate` (the schema), `job`, `planner`, `items.rs`, `buckets`,
//!    `results`, `reruns.rs`, `session`, `rate`, `quota`, `stats`, `history`.
//! 3. The store's state, no SQL: `state.rs` ([`PgStore`]'s connections and its session
//!    in memory).
//! 4. What acts on that state with the SQL modules, no SQL of its own: `heartbeat.rs` (the
//!    session kept alive), `writes.rs` (the result writer), then `open.rs` ([`PgOpen`], open
//!    and close), `leases.rs` (`Leases`, `Fleet`) and `store.rs` (`Store`).
//! 5. Test support on top: `test_db.rs`, and the tests that need a database in `tests/`.
//!
//! # Schema (`migrations/0001_init.sql`, `0002_fleet_burst_idle.sql` and
//! `0003_quota_usage.sql`, applied by `migrate()`)
//!
//! - `hw_job`: one row per job (`name` unique). The spec as stored (templates as written:
//!   `${VAR}` never expanded, so no secret), the input fingerprint, the planner's position
//!   (`next_bucket`, cursor, `planner_exhausted`) and the **planner lease** (`planner`,
//!   `planner_token`), the fleet's `rate_per_s` and `burst` (NULL: no `--burst`), and the
//!   shared `paused_until`, and the fleet's `quota_usage` (`quota`).
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
//! Liveness is the worker's session, not a timer per bucket: `session::heartbeat` renews
//! `expires_at = now() + ttl` and says when the session had already expired (the worker must
//! then drop everything it holds and register again). A bucket's lease is valid while its
//! owner's session is: `buckets::acquire` takes open buckets and buckets of expired
//! sessions in one `FOR UPDATE SKIP LOCKED` statement, each with a fresh token. Every
//! result write and every commit carries the token (`results`): results are written only
//! under a share lock on a bucket row that still holds the writer's token, never over a row
//! written under a newer token, and a commit updates the bucket only for its current owner
//! and token, in the transaction of the bucket's last results. A fleet's writer commits
//! the buckets one flush completed together (`Leases::commit_each`): one transaction, sent
//! in one flight, each bucket's update still fenced by its own token, so a lost lease
//! refuses only its bucket. A worker that lost a lease
//! writes nothing that counts. The planner lease (`planner`) is the same idea on the job
//! row. Rate shares (`session`) are granted from free capacity under the job row's lock,
//! so they never sum above the job's rate.
//!
//! All times are the database's `now()`; no function here reads the local clock.

pub(crate) mod buckets;
pub(crate) mod connect;
pub(crate) mod error;
mod flight;
mod heartbeat;
pub(crate) mod history;
mod items;
pub(crate) mod job;
mod keys;
mod learned;
mod leases;
mod liveness;
pub(crate) mod migrate;
mod open;
pub(crate) mod outage;
mod pages;
pub(crate) mod planner;
pub(crate) mod quota;
pub(crate) mod rate;
mod reruns;
pub(crate) mod results;
mod rows;
pub(crate) mod session;
mod state;
pub(crate) mod stats;
mod store;
mod tls;
pub(crate) mod typed;
mod writes;

#[cfg(test)]
pub(crate) mod test_db;
#[cfg(test)]
mod tests;

pub(crate) use connect::redact_url;
pub use connect::{ConnectOptions, PgTarget};
pub use error::PgError;
pub use open::PgOpen;
pub(crate) use session::WorkerRow;
pub use state::PgStore;
pub(crate) use stats::Planning;
