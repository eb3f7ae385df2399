//! [`PgStore`]'s leases ([`Leases`]), its part in a fleet ([`Fleet`]) and the session that
//! keeps them valid.
//!
//! - A **bucket lease** ([`LeaseScope::Bucket`]) is a row of `hw_bucket` leased to this
//!   session under a fresh token ([`super::buckets`]); [`PgStore::acquire_buckets`] takes the
//!   next open (or orphaned) ones, as a worker of a fleet does.
//! - A **job lease** ([`LeaseScope::Job`]) leases every uncommitted bucket of every log to
//!   this session under one token, and the buckets it plans or creates while holding it too;
//!   it is refused while another live session holds any bucket. It is what a lone run takes.
//!
//! Leases live in memory too: a lease this store no longer holds (released, superseded, or
//! lost with the session) is refused before the database is asked. A commit writes the
//! buffered results and the commit records in one transaction, each bucket updated only for
//! this session and the lease's token (see [`super::results`]); one refusal refuses all. A
//! bucket committed before is left as it is if this lease committed it, else the commit is
//! refused: a stale worker's commit never reads as a success.
//!
//! The session is renewed in the background every third of its TTL (at most every second
//! while the job has a fleet rate: [`heartbeat_every`]) on a connection of its own. The
//! worker trusts it until `ttl` after the last renewal was sent, on its own monotonic clock
//! ([`PgStore::alive`]); a renewal that finds the session expired drops every lease and
//! registers a new session.

use std::sync::Weak;
use std::time::{Duration, Instant};

use super::buckets::{self, Acquired};
use super::error::PgError;
use super::job::to_i64;
use super::outage::Outage;
use super::session::{heartbeat, Grant, Heartbeat};
use super::store::{register_here, Inner, PgStore};
use super::writes::WriterConn;
use super::{connect, log_number, WorkerId};
use crate::store::{
    Commit, CommitRecord, Fleet, FleetRate, Lease, LeaseScope, LeaseToken, Leases, Log, StoreError,
};

/// This process's worker session, as the worker knows it.
pub(super) struct Session {
    pub(super) me: WorkerId,
    /// Until when (monotonic) the session is surely alive: `ttl` after the last renewal
    /// was sent.
    pub(super) deadline: Instant,
    /// What the last renewal granted, and when that renewal was sent.
    pub(super) grant: Option<Grant>,
    granted_sent: Option<Instant>,
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

/// Renew the session every third of its TTL until the store is dropped.
pub(super) async fn keep_alive(inner: Weak<Inner>) {
    let mut client = None;
    // Results recorded at the last heartbeat, and when: for items/s in `status`.
    let mut last = (0u64, Instant::now());
    loop {
        let Some(store) = inner.upgrade() else { return };
        if client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            client = connect(&store.target, &store.options).await.ok();
        }
        if let Some(c) = client.as_mut() {
            let sent = Instant::now();
            let me = store.me();
            let (recorded, idle) = {
                let local = store.local();
                (local.recorded, local.idle)
            };
            let secs = last.1.elapsed().as_secs_f64().max(1e-3);
            let stats = serde_json::json!({
                "items": recorded,
                "items_per_s": (recorded - last.0) as f64 / secs,
            });
            last = (recorded, Instant::now());
            match heartbeat(c, store.job, &me, store.ttl, &stats, idle).await {
                Ok(Heartbeat::Renewed(grant)) => {
                    take_grant(&store, &me, sent, grant);
                }
                Ok(Heartbeat::Expired) => {
                    tracing::warn!(worker = %me, "the worker's session expired: its leases are void");
                    {
                        let mut local = store.local();
                        local.held.clear();
                        local.job_lease = None;
                    }
                    if let Ok(new) = register_here(c, store.job, store.ttl).await {
                        let mut local = store.local();
                        local.session = super::leases::Session::new(new, sent + store.ttl);
                    }
                }
                Err(e) => {
                    tracing::warn!("the worker's heartbeat failed: {e}");
                    client = None;
                }
            }
        }
        // After the renewal: a worker's first grant tells it whether the job has a rate (a
        // joiner that waited ttl/3 with a share of 0 left the fleet a worker short for 10 s).
        let every = heartbeat_every(store.ttl, store.local().session.grant.as_ref());
        let wake = store.wake.clone();
        drop(store);
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = wake.notified() => {}
        }
    }
}

/// Keep what a renewal sent at `sent` granted `me` (unless the session changed meanwhile).
fn take_grant(store: &Inner, me: &WorkerId, sent: Instant, grant: Grant) {
    let received = Instant::now();
    let mut local = store.local();
    // A renewal sent before the one whose grant is kept (the background heartbeat racing
    // the one after a rate change) grants nothing newer.
    if local.session.me != *me || local.session.granted_sent.is_some_and(|t| sent < t) {
        return;
    }
    local.session.deadline = sent + store.ttl;
    if let Some(p) = grant.paused_for {
        // Counted from the answer: the pause is never cut short.
        let until = received + p;
        local.session.paused_until =
            Some(local.session.paused_until.map_or(until, |u| u.max(until)));
    }
    local.session.grant = Some(grant);
    local.session.granted_sent = Some(sent);
}

impl PgStore {
    /// Whether the session is surely alive now (its last renewal is less than a TTL old, on
    /// this process's monotonic clock). A worker starts no call when it is not.
    pub fn alive(&self) -> bool {
        Instant::now() < self.inner.local().session.deadline
    }

    /// What the last heartbeat granted (rate share, shared pause), if any.
    pub fn grant(&self) -> Option<Grant> {
        self.inner.local().session.grant.clone()
    }

    /// Lease up to `n` buckets of `log`: open ones, and those of sessions that expired.
    pub async fn acquire_buckets(&self, log: Log, n: u32) -> Result<Vec<Acquired>, StoreError> {
        let me = self.inner.me();
        let mut outage = Outage::default();
        let got = loop {
            let attempt = async {
                let conn = self.inner.connection().await?;
                let c = conn.as_ref().expect("connected by connection()");
                buckets::acquire(c, self.inner.job, &me, log, n).await
            }
            .await;
            match attempt {
                Err(e) if outage.wait(&e).await => continue,
                attempt => break attempt.map_err(|e| self.inner.err(e))?,
            }
        };
        let mut local = self.inner.local();
        for a in &got {
            local
                .held
                .insert((log_number(log), a.lease.bucket), a.lease.token);
        }
        let idle = local.held.is_empty();
        if idle != local.idle {
            local.idle = idle;
            // The share follows at once: an idle worker's goes to the busy ones, and a
            // worker with work again asks for its part.
            self.inner.wake.notify_one();
        }
        Ok(got)
    }

    /// Have the session renewed now, not at its next heartbeat (a test's expiry is learned
    /// at once).
    #[cfg(test)]
    pub(crate) fn renew_session_now(&self) {
        self.inner.wake.notify_one();
    }

    /// Whether `lease` is the one this store holds for its scope.
    fn held_here(&self, lease: &Lease) -> bool {
        let local = self.inner.local();
        let token = match lease.scope {
            LeaseScope::Job => local.job_lease,
            LeaseScope::Bucket { log, bucket } => {
                local.held.get(&(log_number(log), bucket)).copied()
            }
        };
        token == Some(lease.token.0 as i64)
    }
}

fn lost(lease: &Lease) -> StoreError {
    StoreError::LeaseLost {
        scope: match lease.scope {
            LeaseScope::Job => "the job".into(),
            LeaseScope::Bucket { log, bucket } => match log {
                Log::Job => format!("bucket {bucket}"),
                Log::Rerun(k) => format!("bucket {bucket} of rerun {k}"),
            },
        },
        token: lease.token.0,
    }
}

impl Leases for PgStore {
    type Fleet = Self;

    async fn acquire(&self, scope: LeaseScope) -> Result<Option<Lease>, StoreError> {
        let me = self.inner.me();
        let mut conn = self.inner.client().await?;
        let c = conn.as_mut().expect("connected by client()");
        let token = match scope {
            LeaseScope::Job => acquire_job(c, &self.inner, &me).await,
            LeaseScope::Bucket { log, bucket } => {
                acquire_one(c, &self.inner, &me, log, bucket).await
            }
        }
        .map_err(|e| self.inner.err(e))?;
        let Some(token) = token else { return Ok(None) };
        let mut local = self.inner.local();
        match scope {
            LeaseScope::Job => local.job_lease = Some(token),
            LeaseScope::Bucket { log, bucket } => {
                local.held.insert((log_number(log), bucket), token);
            }
        }
        Ok(Some(Lease {
            scope,
            token: LeaseToken(token as u64),
        }))
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        if !self.held_here(lease) || !self.alive() {
            return Err(lost(lease));
        }
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        if !self.held_here(lease) {
            return Ok(());
        }
        {
            let mut local = self.inner.local();
            match lease.scope {
                LeaseScope::Job => local.job_lease = None,
                LeaseScope::Bucket { log, bucket } => {
                    local.held.remove(&(log_number(log), bucket));
                }
            }
        }
        let me = self.inner.me();
        let mut conn = self.inner.client().await?;
        let c = conn.as_mut().expect("connected by client()");
        let token = lease.token.0 as i64;
        let released = match lease.scope {
            LeaseScope::Job => c
                .execute(
                    "UPDATE hw_bucket SET state = 'open', owner = NULL
                     WHERE job_id = $1 AND owner = $2::text::uuid AND state = 'leased'
                       AND lease_token = $3",
                    &[&self.inner.job.0, &me.0, &token],
                )
                .await
                .map_err(PgError::sql("releasing the job's buckets")),
            LeaseScope::Bucket { log, bucket } => {
                let l = super::Lease { log, bucket, token };
                buckets::release(&*c, self.inner.job, &me, &[l]).await
            }
        };
        released.map(|_| ()).map_err(|e| self.inner.err(e))
    }

    async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), StoreError> {
        if !self.held_here(lease) {
            return Err(lost(lease));
        }
        let (log, records, moved): (Log, &[CommitRecord], &[CommitRecord]) = match commit {
            Commit::Job(records) => (Log::Job, records, &[]),
            Commit::Rerun {
                rerun,
                buckets,
                moved,
            } => (Log::Rerun(rerun), buckets, moved),
        };
        if let Some(c) = records.iter().find(|c| !lease.covers(log, c.bucket)) {
            tracing::error!(bucket = c.bucket, "a commit outside its lease");
            return Err(lost(lease));
        }
        let me = self.inner.me();
        let mut outage = Outage::default();
        let done = loop {
            let attempt = async {
                let mut conn = self.inner.writer_connection().await?;
                let w = conn.as_mut().expect("connected by writer_connection()");
                // Taken under the writer's lock (see `super::writes`).
                let results = std::mem::take(&mut self.inner.local().results);
                // Again after an outage: the results and commits are idempotent (a bucket
                // this lease committed is left as it is).
                let done =
                    commit_fenced(w, &self.inner, &me, lease, log, records, moved, &results).await;
                if !matches!(done, Ok(true)) {
                    // Nothing of it was written: the results wait for the next flush.
                    self.inner.keep_for_later(results);
                }
                done
            }
            .await;
            match attempt {
                Err(e) if outage.wait(&e).await => continue,
                attempt => break attempt,
            }
        };
        match done {
            Ok(true) => {
                if let LeaseScope::Bucket { log, bucket } = lease.scope {
                    self.inner.local().held.remove(&(log_number(log), bucket));
                }
                Ok(())
            }
            Ok(false) => Err(lost(lease)),
            Err(e) => Err(self.inner.err(e)),
        }
    }
}

/// PostgreSQL is a fleet's backend: its workers' sessions, bucket leases, planner lease and
/// rate shares live in the database (see the module doc and [`super::session`]).
impl Fleet for PgStore {
    async fn acquire_next(&self, log: Log, n: u32) -> Result<Vec<Lease>, StoreError> {
        Ok(self
            .acquire_buckets(log, n)
            .await?
            .into_iter()
            .map(|a| Lease {
                scope: LeaseScope::Bucket {
                    log,
                    bucket: a.lease.bucket,
                },
                token: LeaseToken(a.lease.token as u64),
            })
            .collect())
    }

    fn alive(&self) -> bool {
        PgStore::alive(self)
    }

    fn holds(&self, lease: &Lease) -> bool {
        self.held_here(lease)
    }

    fn fleet_rate(&self) -> FleetRate {
        let local = self.inner.local();
        let session = &local.session;
        FleetRate {
            // No grant yet (a newcomer): wait for the first heartbeat's.
            share: session.grant.as_ref().map_or(Some(0.0), |g| g.rate_share),
            burst: session
                .grant
                .as_ref()
                .filter(|g| g.rate_share.is_some())
                .and_then(|g| g.burst),
            paused_until: session.paused_until,
        }
    }

    async fn set_fleet_rate(&self, rate: f64, burst: Option<u32>) -> Result<(), StoreError> {
        let mut conn = self.inner.client().await?;
        let c = conn.as_mut().expect("connected by client()");
        let job = self.inner.job;
        let changed = super::rate::ensure_rate(c, job, rate, burst)
            .await
            .map_err(|e| self.inner.err(e))?;
        if changed {
            // Every share was reset, this worker's grant too: renew it now rather than run
            // on the old one (or wait for the next heartbeat).
            let me = self.inner.me();
            let sent = Instant::now();
            let stats = serde_json::json!({"items": 0, "items_per_s": 0.0});
            let idle = self.inner.local().idle;
            match heartbeat(c, job, &me, self.inner.ttl, &stats, idle).await {
                Ok(Heartbeat::Renewed(grant)) => take_grant(&self.inner, &me, sent, grant),
                Ok(Heartbeat::Expired) => self.inner.local().session.grant = None,
                Err(e) => return Err(self.inner.err(e)),
            }
        }
        Ok(())
    }

    async fn pause_fleet(&self, pause: Duration) -> Result<Duration, StoreError> {
        let left = {
            let conn = self.inner.client().await?;
            let c = conn.as_ref().expect("connected by client()");
            super::rate::pause(c, self.inner.job, pause)
                .await
                .map_err(|e| self.inner.err(e))?
        };
        let until = Instant::now() + left;
        let mut local = self.inner.local();
        let p = &mut local.session.paused_until;
        *p = Some(p.map_or(until, |u| u.max(until)));
        Ok(left)
    }

    async fn drain(&self) -> Result<(), StoreError> {
        let me = self.inner.me();
        let conn = self.inner.client().await?;
        let c = conn.as_ref().expect("connected by client()");
        super::session::drain(c, self.inner.job, &me)
            .await
            .map_err(|e| self.inner.err(e))
    }

    async fn take_planner(&self) -> Result<bool, StoreError> {
        let me = self.inner.me();
        let conn = self.inner.planner_connection().await;
        let conn = conn.map_err(|e| self.inner.err(e))?;
        let c = conn.as_ref().expect("connected by planner_connection()");
        let token = super::planner::acquire_planner(c, self.inner.job, &me)
            .await
            .map_err(|e| self.inner.err(e))?;
        Ok(token.is_some())
    }

    async fn log_finished(&self, log: Log) -> Result<bool, StoreError> {
        let mut outage = Outage::default();
        loop {
            let attempt = async {
                let conn = self.inner.connection().await?;
                let c = conn.as_ref().expect("connected by connection()");
                super::stats::finished(c, self.inner.job, log).await
            }
            .await;
            match attempt {
                Err(e) if outage.wait(&e).await => continue,
                attempt => return attempt.map_err(|e| self.inner.err(e)),
            }
        }
    }

    fn worker_label(&self) -> String {
        self.inner.me().0
    }
}

/// The buffered results, then each bucket's commit (a bucket committed before is left as
/// it is), then the job buckets' moved counts, in one transaction. False (nothing written)
/// if a bucket is not held under the lease's token.
#[allow(clippy::too_many_arguments)]
async fn commit_fenced(
    w: &mut WriterConn,
    inner: &Inner,
    me: &WorkerId,
    lease: &Lease,
    log: Log,
    records: &[CommitRecord],
    moved: &[CommitRecord],
    results: &[(String, crate::store::ItemRecord)],
) -> Result<bool, PgError> {
    let tx = w
        .client
        .transaction()
        .await
        .map_err(PgError::sql("starting a commit"))?;
    inner.write_fenced(&tx, &w.write, results).await?;
    let numbers = records
        .iter()
        .map(|r| to_i64(r.bucket))
        .collect::<Result<Vec<_>, _>>()?;
    // A bucket committed before under this lease is left as it is; under another, the
    // lease was lost.
    let token = lease.token.0 as i64;
    let rows = tx
        .query(
            &w.committed,
            &[&inner.job.0, &log_number(log), &numbers, &me.0, &token],
        )
        .await
        .map_err(PgError::sql("reading committed buckets"))?;
    if rows.iter().any(|r| !r.get::<_, bool>(1)) {
        return Ok(false);
    }
    let committed: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    for record in records {
        if committed.contains(&to_i64(record.bucket)?) {
            continue;
        }
        let held = super::Lease {
            log,
            bucket: record.bucket,
            token: lease.token.0 as i64,
        };
        match super::results::commit_bucket_as(&tx, &w.commit, inner.job, me, &held, record).await {
            Ok(()) => {}
            Err(PgError::LeaseLost { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    for m in moved {
        let by_class = serde_json::to_value(&m.failed_by_class)
            .map_err(|e| PgError::Malformed(e.to_string()))?;
        tx.execute(
            "UPDATE hw_bucket SET ok = $3, failed = $4, failed_by_class = $5
             WHERE job_id = $1 AND rerun = 0 AND bucket = $2 AND state = 'committed'",
            &[
                &inner.job.0,
                &to_i64(m.bucket)?,
                &to_i64(m.ok)?,
                &to_i64(m.failed)?,
                &by_class,
            ],
        )
        .await
        .map_err(PgError::sql("moving a job bucket's counts"))?;
    }
    tx.commit()
        .await
        .map_err(PgError::sql("committing buckets"))?;
    Ok(true)
}

/// Lease every uncommitted bucket of every log under one new token, unless another live
/// session holds one of them.
async fn acquire_job(
    c: &mut tokio_postgres::Client,
    inner: &Inner,
    me: &WorkerId,
) -> Result<Option<i64>, PgError> {
    let tx = c
        .transaction()
        .await
        .map_err(PgError::sql("starting a job lease"))?;
    let live = tx
        .query_opt(
            "SELECT nextval('hw_lease_token') FROM hw_worker
             WHERE job_id = $1 AND worker_id = $2::text::uuid AND expires_at > now()
               AND NOT draining",
            &[&inner.job.0, &me.0],
        )
        .await
        .map_err(PgError::sql("taking a token"))?;
    let Some(token) = live.map(|r| r.get::<_, i64>(0)) else {
        return Ok(None);
    };
    // Rows are locked by the update (others' SKIP LOCKED acquires pass them by); then
    // anything still held by someone alive refuses the lease.
    tx.execute(
        "UPDATE hw_bucket b SET state = 'leased', owner = $2::text::uuid, lease_token = $3,
             owner_switches = b.owner_switches
                 + (b.lease_token IS NOT NULL AND b.owner IS DISTINCT FROM $2::text::uuid)::integer
         WHERE b.job_id = $1 AND b.state <> 'committed'
           AND (b.state = 'open' OR b.owner = $2::text::uuid OR NOT EXISTS (
                 SELECT 1 FROM hw_worker w WHERE w.job_id = b.job_id AND w.worker_id = b.owner
                   AND w.expires_at > now()))",
        &[&inner.job.0, &me.0, &token],
    )
    .await
    .map_err(PgError::sql("leasing the job's buckets"))?;
    let others = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM hw_bucket b WHERE b.job_id = $1 AND b.state = 'leased'
                 AND b.owner <> $2::text::uuid)",
            &[&inner.job.0, &me.0],
        )
        .await
        .map_err(PgError::sql("checking other workers' buckets"))?;
    if others.get::<_, bool>(0) {
        return Ok(None);
    }
    tx.commit()
        .await
        .map_err(PgError::sql("committing a job lease"))?;
    Ok(Some(token))
}

/// Lease one bucket (open, orphaned, or this session's own: a new token supersedes the
/// old), unless it is committed or another live session holds it.
async fn acquire_one(
    c: &mut tokio_postgres::Client,
    inner: &Inner,
    me: &WorkerId,
    log: Log,
    bucket: u64,
) -> Result<Option<i64>, PgError> {
    let row = c
        .query_opt(
            "UPDATE hw_bucket b SET state = 'leased', owner = $2::text::uuid,
                 lease_token = nextval('hw_lease_token'),
                 owner_switches = b.owner_switches
                   + (b.lease_token IS NOT NULL AND b.owner IS DISTINCT FROM $2::text::uuid)::integer
             WHERE b.job_id = $1 AND b.rerun = $3 AND b.bucket = $4 AND b.state <> 'committed'
               AND (b.state = 'open' OR b.owner = $2::text::uuid OR NOT EXISTS (
                     SELECT 1 FROM hw_worker w WHERE w.job_id = b.job_id
                       AND w.worker_id = b.owner AND w.expires_at > now()))
               AND EXISTS (SELECT 1 FROM hw_worker w WHERE w.job_id = $1
                       AND w.worker_id = $2::text::uuid AND w.expires_at > now()
                       AND NOT w.draining)
             RETURNING b.lease_token",
            &[&inner.job.0, &me.0, &log_number(log), &to_i64(bucket)?],
        )
        .await
        .map_err(PgError::sql("leasing a bucket"))?;
    Ok(row.map(|r| r.get(0)))
}

/// How long to wait between two heartbeats of a session living `ttl`: a third of it, and at
/// most [`SHARE_FOLLOW`] while the job has a fleet rate (`grant`, the last one), so that
/// shares follow workers joining and leaving within a second or so rather than a third of
/// the TTL (at the default 30 s, a newcomer waited 10 s with a share of 0 for the others to
/// give up their excess).
pub fn heartbeat_every(ttl: Duration, grant: Option<&Grant>) -> Duration {
    let every = ttl / 3;
    match grant {
        Some(g) if g.rate_share.is_some() => every.min(SHARE_FOLLOW),
        _ => every,
    }
}

/// The longest wait between two heartbeats while the job has a fleet rate.
pub const SHARE_FOLLOW: Duration = Duration::from_secs(1);
