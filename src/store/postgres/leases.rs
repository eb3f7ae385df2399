//! [`PgStore`]'s leases ([`Leases`]) and its part in a fleet ([`Fleet`]).
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
//! The session is renewed in the background ([`super::heartbeat`]). The worker trusts it
//! until `ttl` after the last renewal was sent, on its own monotonic clock
//! ([`PgStore::alive`]); a renewal that finds the session expired drops every lease and
//! registers a new session.
//!
//! No SQL here: the statements are in [`super::buckets`], [`super::results`] and the other
//! per-table modules.

// Real time (std's `Instant`), not tokio's: a session lives on the database server's clock,
// which a paused tokio clock does not stop.
use std::time::{Duration, Instant};

use super::buckets::{self, Acquired};
use super::error::PgError;
use super::flight::{begin, end};
use super::heartbeat::take_grant;
use super::keys::{log_number, WorkerId};
use super::outage::Outage;
use super::results::{commit_bucket_as, committed_buckets_as, move_counts};
use super::rows::to_i64;
use super::session::{heartbeat, Grant, Heartbeat};
use super::state::{Inner, PgStore, WriterConn};
use super::writes::one_statement;
use super::{items, planner, rate, reruns, session, stats};
use crate::store::{
    Commit, CommitRecord, Fleet, FleetRate, ItemRecord, Lease, LeaseScope, LeaseToken,
    LeasedBucket, Leases, Log, PlannerState, StoreError,
};

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
            if local.idle {
                local.rejoined = Some(tokio::time::Instant::now());
            }
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
            LeaseScope::Job => buckets::acquire_job(c, self.inner.job, &me).await,
            LeaseScope::Bucket { log, bucket } => {
                buckets::acquire_one(c, self.inner.job, &me, log, bucket).await
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
            LeaseScope::Job => buckets::release_job(&*c, self.inner.job, &me, token).await,
            LeaseScope::Bucket { log, bucket } => {
                let l = super::keys::Lease { log, bucket, token };
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
                // Taken under the writer's lock (see `writes.rs`).
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

    async fn commit_each(
        &self,
        commits: &[(Lease, CommitRecord)],
    ) -> Result<Vec<bool>, StoreError> {
        self.commit_each_here(commits).await
    }

    /// Both commits write the buffered results first, in their transaction.
    fn commits_write_results(&self) -> bool {
        true
    }
}

impl PgStore {
    /// [`Leases::commit_each`]: the buffered results and every commit in one transaction,
    /// sent in one flight ([`commit_each_fenced`]); a lease not held here is refused before
    /// the database is asked.
    async fn commit_each_here(
        &self,
        commits: &[(Lease, CommitRecord)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut done = vec![false; commits.len()];
        // The commits the database is asked for, with their place in `commits`.
        let mut asked: Vec<(usize, super::keys::Lease, &CommitRecord)> = Vec::new();
        for (i, (lease, record)) in commits.iter().enumerate() {
            let LeaseScope::Bucket { log, bucket } = lease.scope else {
                tracing::error!(
                    bucket = record.bucket,
                    "a bucket's commit under a job lease"
                );
                continue;
            };
            if log != Log::Job || bucket != record.bucket || !self.held_here(lease) {
                continue;
            }
            let token = lease.token.0 as i64;
            asked.push((i, super::keys::Lease { log, bucket, token }, record));
        }
        if asked.is_empty() {
            // The results recorded before are written all the same, as a commit's are.
            crate::store::Store::sync(self).await?;
            return Ok(done);
        }
        let me = self.inner.me();
        let mut outage = Outage::default();
        let committed = loop {
            let attempt = async {
                let mut conn = self.inner.writer_connection().await?;
                let w = conn.as_mut().expect("connected by writer_connection()");
                // Taken under the writer's lock (see `writes.rs`).
                let results = std::mem::take(&mut self.inner.local().results);
                // Again after an outage: the results and commits are idempotent (a bucket
                // this lease committed counts as committed).
                let done = commit_each_fenced(w, &self.inner, &me, &asked, &results).await;
                if done.is_err() {
                    // Nothing of it counts as written: the results wait for the next flush,
                    // on a new connection (no transaction is left open on this one).
                    self.inner.keep_for_later(results);
                    *conn = None;
                }
                done
            }
            .await;
            match attempt {
                Err(e) if outage.wait(&e).await => continue,
                attempt => break attempt.map_err(|e| self.inner.err(e))?,
            }
        };
        let mut local = self.inner.local();
        for ((i, lease, _), ok) in asked.iter().zip(committed) {
            done[*i] = ok;
            if ok {
                local.held.remove(&(log_number(lease.log), lease.bucket));
            }
        }
        Ok(done)
    }
}

/// The buffered `results`, then each of `commits` under its own lease, in one transaction
/// sent in one flight: `BEGIN`, the results' write, every bucket's update and `COMMIT` are
/// pipelined on the writer's connection (each sent before the answer to the one before is
/// read), so the whole group costs one round trip. For each commit, whether its bucket is
/// committed (now, or before under the same lease: a commit tried again after an outage);
/// a lost lease costs only its own bucket, as its results were fenced out.
async fn commit_each_fenced(
    w: &mut WriterConn,
    inner: &Inner,
    me: &WorkerId,
    commits: &[(usize, super::keys::Lease, &CommitRecord)],
    results: &[(String, ItemRecord)],
) -> Result<Vec<bool>, PgError> {
    let mut results = results;
    if !one_statement(results) {
        // A rerun's results look their buckets up before they are written: written first,
        // in a transaction of their own, durable before the commits.
        let tx = w
            .client
            .transaction()
            .await
            .map_err(PgError::sql("starting a sync"))?;
        inner.write_fenced(&tx, &w.write, results).await?;
        tx.commit()
            .await
            .map_err(PgError::sql("committing a sync"))?;
        results = &[];
    }
    let c = &w.client;
    let updates =
        futures_util::future::join_all(commits.iter().map(|(_, lease, record)| {
            commit_bucket_as(c, &w.commit, inner.job, me, lease, record)
        }));
    // `join4` polls each in order, and each sends its statement when first polled.
    let (begun, written, updated, ended) = futures_util::future::join4(
        begin(c, "starting a commit"),
        inner.write_fenced(c, &w.write, results),
        updates,
        end(c, "committing buckets"),
    )
    .await;
    begun?;
    written?;
    let mut done = Vec::with_capacity(commits.len());
    for u in updated {
        match u {
            Ok(()) => done.push(true),
            Err(PgError::LeaseLost { .. }) => done.push(false),
            Err(e) => return Err(e),
        }
    }
    ended?;
    // A bucket not updated may be one this lease committed before (tried again).
    for (ok, (_, lease, _)) in done.iter_mut().zip(commits) {
        if *ok {
            continue;
        }
        let bucket = [to_i64(lease.bucket)?];
        let rows = committed_buckets_as(
            c,
            &w.committed,
            inner.job,
            me,
            lease.log,
            &bucket,
            lease.token,
        )
        .await?;
        *ok = rows.iter().any(|(_, ours)| *ours);
    }
    Ok(done)
}

/// PostgreSQL is a fleet's backend: its workers' sessions, bucket leases, planner lease and
/// rate shares live in the database (see the module doc and `session.rs`).
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

    /// The lease first, then every leased bucket's items in one flight (pipelined on one
    /// connection): two round trips, where asking one question after another took one for
    /// the lease and two per bucket.
    async fn acquire_work(&self, log: Log, n: u32) -> Result<Vec<LeasedBucket>, StoreError> {
        let leases = self.acquire_next(log, n).await?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let job = self.inner.job;
        let mut outage = Outage::default();
        let items = loop {
            let attempt = async {
                let conn = self.inner.connection().await?;
                let c = conn.as_ref().expect("connected by connection()");
                let reads = leases.iter().map(|lease| async move {
                    let LeaseScope::Bucket { bucket, .. } = lease.scope else {
                        return Ok(Vec::new());
                    };
                    match log {
                        Log::Job => items::bucket_items(c, job, bucket).await,
                        Log::Rerun(k) => reruns::rerun_bucket_items(c, job, k, bucket).await,
                    }
                });
                futures_util::future::try_join_all(reads).await
            }
            .await;
            match attempt {
                Err(e) if outage.wait(&e).await => continue,
                attempt => break attempt.map_err(|e| self.inner.err(e))?,
            }
        };
        Ok(leases
            .into_iter()
            .zip(items)
            .map(|(lease, items)| LeasedBucket { lease, items })
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
            paused_until: session.paused_until.map(tokio::time::Instant::from_std),
            // This worker is counted as making calls: it asks in order to make one.
            workers: session.grant.as_ref().map(|g| g.peers.saturating_add(1)),
            rejoined: local.rejoined,
        }
    }

    async fn set_fleet_rate(&self, rate: f64, burst: Option<u32>) -> Result<(), StoreError> {
        let mut conn = self.inner.client().await?;
        let c = conn.as_mut().expect("connected by client()");
        let job = self.inner.job;
        let changed = rate::ensure_rate(c, job, rate, burst)
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
            rate::pause(c, self.inner.job, pause)
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
        session::drain(c, self.inner.job, &me)
            .await
            .map_err(|e| self.inner.err(e))
    }

    async fn take_planner(&self) -> Result<Option<PlannerState>, StoreError> {
        let me = self.inner.me();
        let conn = self.inner.planner_connection().await;
        let conn = conn.map_err(|e| self.inner.err(e))?;
        let c = conn.as_ref().expect("connected by planner_connection()");
        let taken = planner::take_planner_at(c, self.inner.job, &me)
            .await
            .map_err(|e| self.inner.err(e))?;
        Ok(taken.map(|(_, position)| position))
    }

    async fn log_finished(&self, log: Log) -> Result<bool, StoreError> {
        let mut outage = Outage::default();
        loop {
            let attempt = async {
                let conn = self.inner.connection().await?;
                let c = conn.as_ref().expect("connected by connection()");
                stats::finished(c, self.inner.job, log).await
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
    results: &[(String, ItemRecord)],
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
    let rows = committed_buckets_as(&tx, &w.committed, inner.job, me, log, &numbers, token).await?;
    if rows.iter().any(|(_, ours)| !ours) {
        return Ok(false);
    }
    let committed: Vec<i64> = rows.iter().map(|(bucket, _)| *bucket).collect();
    for record in records {
        if committed.contains(&to_i64(record.bucket)?) {
            continue;
        }
        let held = super::keys::Lease {
            log,
            bucket: record.bucket,
            token: lease.token.0 as i64,
        };
        match commit_bucket_as(&tx, &w.commit, inner.job, me, &held, record).await {
            Ok(()) => {}
            Err(PgError::LeaseLost { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    for m in moved {
        move_counts(&tx, inner.job, m).await?;
    }
    tx.commit()
        .await
        .map_err(PgError::sql("committing buckets"))?;
    Ok(true)
}
