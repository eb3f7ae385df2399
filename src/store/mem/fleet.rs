//! [`SharedMem`]: a job's records in memory, shared by a fleet of workers as a database is;
//! each [`MemWorker`] is one worker's session on it, and implements [`Fleet`].
//!
//! It keeps what the engine relies on of a fleet's backend (PostgreSQL is the real one):
//!
//! - **Sessions.** A worker's leases (on buckets, the whole job, the planner) are valid while
//!   its session lives. A session ends when its worker is dropped, its leases released, or
//!   expires ([`MemWorker::expire`], as a time to live passing without a heartbeat would):
//!   its leases are then anyone's to take. A worker whose session expired learns so at its
//!   next call and registers anew, holding nothing. There is no clock: a worker never doubts
//!   its leases, so [`Fleet::alive`] is always true.
//! - **Leases.** Buckets are leased lowest first, each under a fresh fencing token, from the
//!   open ones and those of sessions that are gone ([`Fleet::acquire_next`]); a lease on the
//!   whole job is refused while another live session holds a bucket. A commit is refused
//!   unless its lease is held.
//! - **Fenced results.** A worker buffers its results and writes them at [`Store::sync`]:
//!   those of a bucket it holds no lease on (nor the job's) are dropped and counted
//!   ([`MemWorker::fenced`]). Everything else (plans, commits, reruns) is written at once,
//!   as a database's transaction is: a worker's crash ([`MemWorker::crash`]) loses only the
//!   results it had not synced.
//! - **The planner's lease**, taken (or kept) by planning, refused while another live worker
//!   holds it; a planner that read a stale position is refused too.
//! - **One rate**: the job's rate split evenly among the live workers that neither drain nor
//!   idle, computed when read (the database grants shares at heartbeats); the job's pause
//!   is the latest asked for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::records::Records;
use crate::quota::{QuotaGrant, QuotaLedger, QuotaWant};
use crate::store::{
    BadLine, BucketState, Commit, Fleet, FleetRate, ItemRecord, Lease, LeaseScope, LeaseToken,
    Leases, Log, OffsetRecord, PlannedBucket, PlannerState, RerunBucket, RerunBucketState,
    RerunOffset, RerunRecord, Store, StoreError, StoredJob,
};

/// A worker session's number.
type SessionId = u64;

/// A lease as the shared state keeps it: the session holding it and its fencing token.
type Held = (SessionId, u64);

/// A job's records in memory, shared by the workers of a fleet (see the module doc).
#[derive(Clone, Default)]
pub struct SharedMem {
    shared: Arc<Mutex<Shared>>,
}

/// Everything the workers share.
#[derive(Default)]
struct Shared {
    records: Records,
    /// Live sessions; one that expired or ended is gone, and its leases with it.
    sessions: HashMap<SessionId, Session>,
    last_session: SessionId,
    /// The last fencing token granted (every kind of lease draws from it).
    tokens: u64,
    /// Leased buckets not committed yet, by log and bucket.
    leased: HashMap<(Log, u64), Held>,
    job_lease: Option<Held>,
    planner: Option<Held>,
    /// The job's rate (requests per second, over all workers) and burst.
    rate: Option<(f64, Option<u32>)>,
    paused_until: Option<Instant>,
}

#[derive(Default)]
struct Session {
    draining: bool,
    /// Holds no bucket and found none to lease: takes no rate share.
    idle: bool,
}

impl SharedMem {
    /// An empty shared store, no session yet.
    pub fn new() -> SharedMem {
        SharedMem::default()
    }

    /// A new worker on the job: a session of its own.
    pub fn worker(&self) -> MemWorker {
        let me = lock(&self.shared).register();
        MemWorker {
            shared: self.shared.clone(),
            me: AtomicU64::new(me),
            local: Mutex::default(),
            fenced: AtomicU64::new(0),
            grant_withheld: AtomicBool::new(false),
        }
    }

    /// Damage: lose the result of `id` (what a damaged database does). Returns whether it
    /// had one.
    pub fn lose_result(&self, id: &str) -> bool {
        lock(&self.shared).records.results.remove(id).is_some()
    }
}

/// A user of the state that panics leaves it as it was between two operations (each changes
/// it under the lock without unwinding half way), so a poisoned lock is taken as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn register(&mut self) -> SessionId {
        self.last_session += 1;
        self.sessions.insert(self.last_session, Session::default());
        self.last_session
    }

    fn token(&mut self) -> u64 {
        self.tokens += 1;
        self.tokens
    }

    fn live(&self, session: SessionId) -> bool {
        self.sessions.contains_key(&session)
    }

    /// Held by another session that lives.
    fn others(&self, held: Option<&Held>, me: SessionId) -> bool {
        held.is_some_and(|&(s, _)| s != me && self.live(s))
    }

    fn draining(&self, me: SessionId) -> bool {
        self.sessions.get(&me).is_none_or(|s| s.draining)
    }

    fn holds(&self, me: SessionId, lease: &Lease) -> bool {
        let held = match lease.scope {
            LeaseScope::Job => self.job_lease.as_ref(),
            LeaseScope::Bucket { log, bucket } => self.leased.get(&(log, bucket)),
        };
        self.live(me) && held == Some(&(me, lease.token.0))
    }

    fn committed(&self, log: Log, bucket: u64) -> bool {
        match log {
            Log::Job => self.records.commits.contains_key(&bucket),
            Log::Rerun(k) => self.records.rerun_commits.contains_key(&(k, bucket)),
        }
    }

    /// The buckets of `log`, in order.
    fn buckets_of(&self, log: Log) -> Vec<u64> {
        match log {
            Log::Job => self.records.buckets.keys().copied().collect(),
            Log::Rerun(k) => self
                .records
                .rerun_buckets
                .range((k, 0)..=(k, u64::MAX))
                .map(|(&(_, b), _)| b)
                .collect(),
        }
    }

    /// The bucket whose lease a result is written under: its job bucket, or the rerun's
    /// bucket that holds its ID.
    fn lease_of(&self, id: &str, record: &ItemRecord) -> (Log, u64) {
        let Some(k) = record.rerun else {
            return (Log::Job, record.bucket);
        };
        let bucket = self
            .records
            .rerun_buckets
            .range((k, 0)..=(k, u64::MAX))
            .find(|(_, (_, ids))| ids.iter().any(|(_, i)| i == id))
            .map_or(u64::MAX, |(&(_, b), _)| b);
        (Log::Rerun(k), bucket)
    }

    fn lease(&mut self, me: SessionId, scope: LeaseScope) -> Lease {
        let token = self.token();
        match scope {
            LeaseScope::Job => self.job_lease = Some((me, token)),
            LeaseScope::Bucket { log, bucket } => {
                self.leased.insert((log, bucket), (me, token));
            }
        }
        Lease {
            scope,
            token: LeaseToken(token),
        }
    }

    /// End `me`'s session: give back everything it holds.
    fn end(&mut self, me: SessionId) {
        self.leased.retain(|_, (s, _)| *s != me);
        if self.job_lease.is_some_and(|(s, _)| s == me) {
            self.job_lease = None;
        }
        if self.planner.is_some_and(|(s, _)| s == me) {
            self.planner = None;
        }
        self.sessions.remove(&me);
    }
}

/// One worker's session on a [`SharedMem`] (see the module doc).
pub struct MemWorker {
    shared: Arc<Mutex<Shared>>,
    /// The session now: a new one once the worker learns its last one expired.
    me: AtomicU64,
    local: Mutex<Local>,
    fenced: AtomicU64,
    /// Its fleet's grant withheld ([`MemWorker::withhold_grant`]).
    grant_withheld: AtomicBool,
}

/// What a worker keeps to itself until it writes it.
#[derive(Default)]
struct Local {
    /// Results recorded, written at the next sync.
    results: Vec<(String, ItemRecord)>,
    /// IDs noted by the planner (with their rows), not planned yet.
    notes: HashMap<String, u64>,
}

impl MemWorker {
    fn shared(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// This worker's session, registered anew if it expired (its leases are void).
    fn session(&self, s: &mut Shared) -> SessionId {
        let me = self.me.load(Ordering::Acquire);
        if s.live(me) {
            return me;
        }
        tracing::warn!(
            worker = me,
            "the worker's session expired: its leases are void"
        );
        let new = s.register();
        self.me.store(new, Ordering::Release);
        new
    }

    /// Let the session expire, as a time to live passing without a heartbeat would: every
    /// lease it holds is anyone's to take; the worker registers anew at its next call.
    pub fn expire(&self) {
        let me = self.me.load(Ordering::Acquire);
        self.shared().sessions.remove(&me);
    }

    /// Withhold this worker's grant (`true`) or give it (`false`): while withheld, it reads
    /// a share of 0 and an uncounted fleet, as a database's newcomer does before its first
    /// heartbeat's grant comes back.
    pub fn withhold_grant(&self, withheld: bool) {
        self.grant_withheld.store(withheld, Ordering::Release);
    }

    /// A crash: the results not synced are lost, and the session expires. A task of the
    /// crashed run that still holds the worker (an aborted task is dropped a moment later)
    /// writes nothing that counts: its leases went with its session.
    pub fn crash(&self) {
        lock(&self.local).results.clear();
        self.expire();
    }

    /// Where planning stands, as the database's `status` says: `done` (the input is planned
    /// to its end), `planning` (a live worker holds the planner's lease) or `waiting`.
    pub fn planning(&self) -> &'static str {
        let s = self.shared();
        match (s.records.planner.exhausted, s.planner) {
            (true, _) => "done",
            (false, Some((p, _))) if s.live(p) => "planning",
            (false, _) => "waiting",
        }
    }

    /// How many results were dropped because their bucket's lease was not held.
    pub fn fenced(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }

    fn lost(lease: &Lease) -> StoreError {
        StoreError::LeaseLost {
            scope: format!("{:?}", lease.scope),
            token: lease.token.0,
        }
    }

    fn planner_lost(s: &Shared) -> StoreError {
        StoreError::LeaseLost {
            scope: "the planner".into(),
            token: s.planner.map_or(0, |(_, t)| t),
        }
    }
}

impl Drop for MemWorker {
    fn drop(&mut self) {
        let me = self.me.load(Ordering::Acquire);
        self.shared().end(me);
    }
}

impl Store for MemWorker {
    async fn job(&self) -> Result<Option<StoredJob>, StoreError> {
        Ok(self.shared().records.job.clone())
    }

    async fn reserve_quota(
        &self,
        wants: &[QuotaWant],
        now_ms: u64,
    ) -> Result<Vec<QuotaGrant>, StoreError> {
        Ok(self.shared().records.quotas.reserve(wants, now_ms))
    }

    async fn quota_ledger(&self) -> Result<QuotaLedger, StoreError> {
        Ok(self.shared().records.quotas.clone())
    }

    async fn learned_limits(&self) -> Result<Vec<crate::quota::KeptLimit>, StoreError> {
        Ok(self.shared().records.learned.clone())
    }

    async fn keep_learned_limits(
        &self,
        limits: &[crate::quota::KeptLimit],
    ) -> Result<(), StoreError> {
        self.shared().records.learned = limits.to_vec();
        Ok(())
    }

    async fn put_job(&self, job: &StoredJob) -> Result<(), StoreError> {
        self.shared().records.job = Some(job.clone());
        Ok(())
    }

    async fn planner(&self) -> Result<PlannerState, StoreError> {
        Ok(self.shared().records.planner)
    }

    /// A planned ID is a repeat of the row it was planned at; one only noted by this
    /// worker's planner, of the row it was noted at (another worker's notes are its own).
    async fn first_rows(&self, rows: &[(u64, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        let s = self.shared();
        let mut local = lock(&self.local);
        Ok(rows
            .iter()
            .map(|&(row, id)| {
                let first = s
                    .records
                    .first_rows
                    .get(id)
                    .or_else(|| local.notes.get(id))
                    .copied()
                    .unwrap_or(row);
                if first < row {
                    Some(first)
                } else {
                    local.notes.insert(id.to_string(), row);
                    None
                }
            })
            .collect())
    }

    /// Under the planner's lease, taken or kept here; without buckets, only the planner
    /// moves, unless another live worker plans.
    async fn plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> Result<(), StoreError> {
        let mut s = self.shared();
        let me = self.session(&mut s);
        if buckets.is_empty() {
            if s.others(s.planner.as_ref(), me) {
                return Err(Self::planner_lost(&s));
            }
            s.records.planner = *planner;
            return Ok(());
        }
        let mine = s.planner.is_some_and(|(p, _)| p == me);
        if !mine {
            if s.others(s.planner.as_ref(), me) || s.draining(me) {
                return Err(Self::planner_lost(&s));
            }
            let token = s.token();
            s.planner = Some((me, token));
        }
        // A planner that read the position before another planned on from it is stale.
        let next = s.records.planner;
        if next.exhausted || buckets[0].offset.bucket != next.next_bucket {
            return Err(Self::planner_lost(&s));
        }
        s.records.plan(buckets, planner);
        let mut local = lock(&self.local);
        for b in buckets {
            for (_, id) in &b.items {
                local.notes.remove(id);
            }
        }
        Ok(())
    }

    async fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        lock(&self.local).results.extend_from_slice(results);
        Ok(())
    }

    /// Write the results recorded since the last sync, fenced by their buckets' leases.
    async fn sync(&self) -> Result<(), StoreError> {
        let results = std::mem::take(&mut lock(&self.local).results);
        if results.is_empty() {
            return Ok(());
        }
        let mut s = self.shared();
        let me = self.session(&mut s);
        let whole_job = s.job_lease.is_some_and(|(o, _)| o == me);
        let (kept, dropped): (Vec<_>, Vec<_>) = results.into_iter().partition(|(id, r)| {
            whole_job
                || s.leased
                    .get(&s.lease_of(id, r))
                    .is_some_and(|&(o, _)| o == me)
        });
        if !dropped.is_empty() {
            tracing::warn!(
                results = dropped.len(),
                "results of buckets whose lease this worker does not hold were not written"
            );
            self.fenced
                .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        }
        s.records.record(&kept);
        Ok(())
    }

    async fn buckets(&self, from: u64, limit: usize) -> Result<Vec<BucketState>, StoreError> {
        Ok(self.shared().records.buckets(from, limit))
    }

    async fn bucket_items(
        &self,
        bucket: &OffsetRecord,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.shared().records.bucket_items(bucket)
    }

    async fn item(&self, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        Ok(self.shared().records.results.get(id).cloned())
    }

    async fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError> {
        Ok(self.shared().records.bad_lines(limit))
    }

    async fn reruns(&self) -> Result<Vec<RerunRecord>, StoreError> {
        Ok(self.shared().records.reruns())
    }

    async fn create_rerun(
        &self,
        rerun: &RerunRecord,
        buckets: &[RerunBucket],
    ) -> Result<(), StoreError> {
        self.shared().records.create_rerun(rerun, buckets);
        Ok(())
    }

    async fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        Ok(self.shared().records.rerun_buckets(rerun, from, limit))
    }

    async fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.shared().records.rerun_bucket_items(offset)
    }
}

impl Leases for MemWorker {
    type Fleet = Self;

    /// The job's lease is refused while another live session holds a bucket or the job; a
    /// bucket's, once it is committed or while another live session holds it.
    async fn acquire(&self, scope: LeaseScope) -> Result<Option<Lease>, StoreError> {
        let mut s = self.shared();
        let me = self.session(&mut s);
        if s.draining(me) || s.others(s.job_lease.as_ref(), me) {
            return Ok(None);
        }
        let free = match scope {
            LeaseScope::Job => !s.leased.values().any(|&(o, _)| o != me && s.live(o)),
            LeaseScope::Bucket { log, bucket } => {
                !s.committed(log, bucket) && !s.others(s.leased.get(&(log, bucket)), me)
            }
        };
        Ok(free.then(|| s.lease(me, scope)))
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        let s = self.shared();
        if s.holds(self.me.load(Ordering::Acquire), lease) {
            Ok(())
        } else {
            Err(Self::lost(lease))
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut s = self.shared();
        if s.holds(self.me.load(Ordering::Acquire), lease) {
            match lease.scope {
                LeaseScope::Job => s.job_lease = None,
                LeaseScope::Bucket { log, bucket } => {
                    s.leased.remove(&(log, bucket));
                }
            }
        }
        Ok(())
    }

    async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), StoreError> {
        let mut s = self.shared();
        let me = self.session(&mut s);
        let (log, records) = match commit {
            Commit::Job(records) => (Log::Job, records),
            Commit::Rerun { rerun, buckets, .. } => (Log::Rerun(rerun), buckets),
        };
        if !s.holds(me, lease) || records.iter().any(|c| !lease.covers(log, c.bucket)) {
            return Err(Self::lost(lease));
        }
        s.records.commit(commit);
        for c in records {
            s.leased.remove(&(log, c.bucket));
        }
        Ok(())
    }
}

impl Fleet for MemWorker {
    async fn acquire_next(&self, log: Log, n: u32) -> Result<Vec<Lease>, StoreError> {
        let mut s = self.shared();
        let me = self.session(&mut s);
        if s.draining(me) || s.others(s.job_lease.as_ref(), me) {
            return Ok(Vec::new());
        }
        // Open buckets, and those of sessions that are gone.
        let mut got = Vec::new();
        for bucket in s.buckets_of(log) {
            if got.len() == n as usize {
                break;
            }
            let held = s
                .leased
                .get(&(log, bucket))
                .is_some_and(|&(o, _)| s.live(o));
            if !held && !s.committed(log, bucket) {
                got.push(s.lease(me, LeaseScope::Bucket { log, bucket }));
            }
        }
        let idle = !s.leased.values().any(|&(o, _)| o == me);
        if let Some(session) = s.sessions.get_mut(&me) {
            session.idle = idle;
        }
        Ok(got)
    }

    fn alive(&self) -> bool {
        let mut s = self.shared();
        self.session(&mut s);
        true
    }

    fn holds(&self, lease: &Lease) -> bool {
        self.shared().holds(self.me.load(Ordering::Acquire), lease)
    }

    fn fleet_rate(&self) -> FleetRate {
        if self.grant_withheld.load(Ordering::Acquire) {
            return FleetRate {
                share: Some(0.0),
                burst: None,
                paused_until: None,
                workers: None,
                rejoined: None,
            };
        }
        let s = self.shared();
        let me = self.me.load(Ordering::Acquire);
        let sharing = |session: &Session| !session.draining && !session.idle;
        let share = s.rate.map(|(rate, _)| match s.sessions.get(&me) {
            Some(mine) if sharing(mine) => {
                rate / s.sessions.values().filter(|x| sharing(x)).count() as f64
            }
            _ => 0.0,
        });
        let burst = match (s.rate, share) {
            (Some((rate, Some(burst))), Some(share)) => Some(share_of_burst(burst, share, rate)),
            _ => None,
        };
        // This worker is counted as making calls: it asks in order to make one.
        let peers = s
            .sessions
            .iter()
            .filter(|(id, x)| **id != me && sharing(x))
            .count();
        FleetRate {
            share,
            burst,
            paused_until: s.paused_until,
            workers: Some(u32::try_from(peers + 1).unwrap_or(u32::MAX)),
            // Counted at once: the others read who is idle when they look.
            rejoined: None,
        }
    }

    async fn set_fleet_rate(&self, rate: f64, burst: Option<u32>) -> Result<(), StoreError> {
        self.shared().rate = Some((rate, burst));
        Ok(())
    }

    async fn pause_fleet(&self, pause: Duration) -> Result<Duration, StoreError> {
        let mut s = self.shared();
        let now = Instant::now();
        let until = s.paused_until.map_or(now + pause, |u| u.max(now + pause));
        s.paused_until = Some(until);
        Ok(until - now)
    }

    async fn drain(&self) -> Result<(), StoreError> {
        let mut s = self.shared();
        let me = self.session(&mut s);
        if let Some(session) = s.sessions.get_mut(&me) {
            session.draining = true;
        }
        Ok(())
    }

    async fn take_planner(&self) -> Result<Option<PlannerState>, StoreError> {
        let mut s = self.shared();
        let me = self.session(&mut s);
        if s.draining(me) || s.records.planner.exhausted || s.others(s.planner.as_ref(), me) {
            return Ok(None);
        }
        let mine = s.planner.is_some_and(|(p, _)| p == me);
        if !mine {
            let token = s.token();
            s.planner = Some((me, token));
        }
        Ok(Some(s.records.planner))
    }

    async fn log_finished(&self, log: Log) -> Result<bool, StoreError> {
        let s = self.shared();
        let planned = match log {
            Log::Job => s.records.planner.exhausted,
            Log::Rerun(_) => true,
        };
        Ok(planned
            && s.buckets_of(log)
                .into_iter()
                .all(|bucket| s.committed(log, bucket)))
    }

    fn worker_label(&self) -> String {
        format!("memory-{}", self.me.load(Ordering::Acquire))
    }
}

/// A worker's part of the job's burst B: floor(B · share / R), at least 1 while its share
/// is positive (as the database grants it).
fn share_of_burst(burst: u32, share: f64, rate: f64) -> u32 {
    let burst = burst.max(1);
    if share > 0.0 && rate > 0.0 {
        ((f64::from(burst) * share / rate + 1e-9).floor() as u32).clamp(1, burst)
    } else {
        0
    }
}
