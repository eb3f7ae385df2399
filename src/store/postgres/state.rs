//! What a [`PgStore`] holds, shared by the files that implement it: its connections (the
//! dispatcher's, the planner's, the result writer's, each connected again when lost), the
//! job and session it is opened on, and the session's state in memory ([`Local`]: held
//! leases, buffered results, the last grant). No SQL here: the per-table modules have it,
//! and `open`, `store`, `leases`, `writes` and `heartbeat` act on this state with them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, Statement};

use super::connect::{connect, ConnectOptions, PgTarget};
use super::error::PgError;
use super::keys::{JobId, WorkerId};
use super::session::Grant;
use crate::store::{ItemRecord, StoreError};

/// A job of a PostgreSQL database, as one worker session sees it (see the module doc of
/// `store::postgres`).
pub struct PgStore {
    pub(super) inner: Arc<Inner>,
    /// The session's heartbeat task (a no-op for a store opened without a session).
    pub(super) heartbeat: tokio::task::JoinHandle<()>,
}

pub(super) struct Inner {
    pub(super) target: PgTarget,
    pub(super) options: ConnectOptions,
    pub(super) job: JobId,
    pub(super) name: String,
    pub(super) ttl: Duration,
    /// Whether this open created the job's row.
    pub(super) created: bool,
    /// The dispatcher's connection (leases, bucket reads) and everything else's but the
    /// planner's, the result writer's, the quotas' and the heartbeat's.
    pub(super) conn: tokio::sync::Mutex<Option<Client>>,
    /// The job's spec as the open read it, in the statement that found the job and
    /// registered the session: it answers the first `job()` (the job's open reads it next,
    /// nothing of this process between), which is then a round trip fewer. Taken by that
    /// read, cleared by any write of the spec; every later read goes to the database.
    pub(super) opened_spec: Mutex<Option<serde_json::Value>>,
    /// The planner's (connected once it plans): its batches never hold up the leases.
    pub(super) planner_conn: tokio::sync::Mutex<Option<Client>>,
    /// The result writer's (connected at its first write, see `writes.rs`).
    pub(super) writer: tokio::sync::Mutex<Option<WriterConn>>,
    /// The quotas' (connected at the first reservation): an item waiting for its
    /// reservation never queues behind the dispatcher's leases and bucket reads.
    pub(super) quota_conn: tokio::sync::Mutex<Option<Client>>,
    pub(super) local: Mutex<Local>,
    /// Wakes the heartbeat early: the worker's idleness changed, its share should follow.
    pub(super) wake: Arc<tokio::sync::Notify>,
}

/// What the session holds in memory.
pub(super) struct Local {
    pub(super) session: Session,
    /// Results written but not synced.
    pub(super) results: Vec<(String, ItemRecord)>,
    /// IDs the planner noted (`first_rows`) and has not planned yet, with their rows.
    pub(super) notes: HashMap<String, u64>,
    /// Bucket leases held: (log number, bucket) → token.
    pub(super) held: HashMap<(i32, u64), i64>,
    /// The job-wide lease held, if any: every bucket this session leased under it carries
    /// its token.
    pub(super) job_lease: Option<i64>,
    /// Results dropped by a fence since the store was opened.
    pub(super) fenced: u64,
    /// Results written (recorded) since the store was opened: the heartbeat reports them.
    pub(super) recorded: u64,
    /// The worker holds no bucket and found none to lease: its heartbeat gives its rate
    /// share back to the busy workers.
    pub(super) idle: bool,
    /// When it last leased a bucket after being idle ([`crate::store::FleetRate::rejoined`]).
    pub(super) rejoined: Option<tokio::time::Instant>,
}

/// This process's worker session, as the worker knows it.
pub(super) struct Session {
    pub(super) me: WorkerId,
    /// Until when (monotonic) the session is surely alive: `ttl` after the last renewal
    /// was sent.
    pub(super) deadline: Instant,
    /// What the last renewal granted, and when that renewal was sent.
    pub(super) grant: Option<Grant>,
    pub(super) granted_sent: Option<Instant>,
    /// Until when (monotonic) the job is paused, as the last renewal or this worker's own
    /// pause said.
    pub(super) paused_until: Option<Instant>,
}

impl Session {
    pub(super) fn new(me: WorkerId, deadline: Instant) -> Session {
        Session {
            me,
            deadline,
            grant: None,
            granted_sent: None,
            paused_until: None,
        }
    }
}

/// The writer's connection, with its hot statements prepared on it (see `writes.rs`).
pub(super) struct WriterConn {
    pub(super) client: Client,
    /// [`super::results::WRITE_RESULTS`].
    pub(super) write: Statement,
    /// [`super::results::COMMITTED_BUCKETS`].
    pub(super) committed: Statement,
    /// [`super::results::COMMIT_BUCKET`].
    pub(super) commit: Statement,
}

impl Inner {
    pub(super) fn local(&self) -> MutexGuard<'_, Local> {
        // Every change under the lock is complete before it is released.
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The spec the open read ([`Inner::opened_spec`]), if no read or write took it yet.
    pub(super) fn take_opened_spec(&self) -> Option<serde_json::Value> {
        self.opened_spec
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    pub(super) fn me(&self) -> WorkerId {
        self.local().session.me.clone()
    }

    /// `e`, said of this job.
    pub(super) fn err(&self, e: PgError) -> StoreError {
        StoreError::at(format!("job {:?} of {}", self.name, self.target), e.into())
    }

    /// The store's connection, connected again first if it was lost (a restarted
    /// database).
    pub(super) async fn client(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, StoreError> {
        self.connection().await.map_err(|e| self.err(e))
    }

    /// [`Inner::client`], its error as the database said it.
    pub(super) async fn connection(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, PgError> {
        self.connected(&self.conn).await
    }

    /// The planner's connection, as [`Inner::connection`].
    pub(super) async fn planner_connection(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, PgError> {
        self.connected(&self.planner_conn).await
    }

    /// The quotas' connection, as [`Inner::connection`].
    pub(super) async fn quota_connection(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, PgError> {
        self.connected(&self.quota_conn).await
    }

    /// `conn`, connected (again) if it is not.
    async fn connected<'a>(
        &self,
        conn: &'a tokio::sync::Mutex<Option<Client>>,
    ) -> Result<tokio::sync::MutexGuard<'a, Option<Client>>, PgError> {
        let mut conn = conn.lock().await;
        if conn.as_ref().is_none_or(Client::is_closed) {
            *conn = None;
            *conn = Some(connect(&self.target, &self.options).await?);
        }
        Ok(conn)
    }

    /// Put `results` (taken for a flush that failed) back before those recorded since.
    pub(super) fn keep_for_later(&self, results: Vec<(String, ItemRecord)>) {
        let mut local = self.local();
        let later = std::mem::replace(&mut local.results, results);
        local.results.extend(later);
    }
}
