//! The seam a backend implements: [`Store`] (a job's records) and [`Leases`] (who may work on
//! a bucket and commit it).
//!
//! Both are small and async. Everything a job derives from its records (statistics, the
//! export's completeness check, failure listings, a rerun's count moves) is written once
//! above them, in [`super::view`], for every backend.
//!
//! # The contract (checked for every backend by `crate::conformance`)
//!
//! - **Durability.** A write (`plan`, `record`, `create_rerun`, a lease's `commit`) may be
//!   buffered; it is durable once a later [`Store::sync`] returns. Writes become durable in
//!   the order they were made: a sync never makes a later write durable without the earlier
//!   ones. `put_job` is durable when it returns.
//! - **Atomicity.** `plan` writes all its buckets (offset records, ID lists, bad lines) and
//!   the planner's new position, or none; `create_rerun` the rerun with all its buckets;
//!   a commit all its records.
//! - **Results.** A record is keyed by its ID: writing an ID again replaces its record. An ID
//!   of a planned bucket without a record reads as pending.
//! - **Commits are final.** A bucket committed once keeps its commit record (a rerun's
//!   commit moves its counts, nothing else does); committing it again is ignored.
//! - **Fencing.** Every commit carries the [`Lease`] it was made under; a backend refuses
//!   ([`StoreError::LeaseLost`]) a commit whose lease it no longer holds, and applies none of
//!   it. Results are written under a lease on their bucket: a backend shared by several
//!   workers drops those of buckets it holds no lease on (the PostgreSQL backend does: a
//!   worker that lost a bucket writes nothing that counts); a backend with one holder at a
//!   time may apply them (they are the same item's final result). Either way they never
//!   make a bucket committed.
//! - **Damage.** A backend that finds data it had made durable missing or garbled says
//!   [`StoreError::Corrupt`], at open where it can, and never returns less than it holds.
//! - **Errors** are [`StoreError`]s; where they happened is the backend's to add
//!   ([`StoreError::At`]).
//!
//! Methods return futures that are `Send`, so the engine can run them on any worker. A
//! backend whose work is cheap and never blocks for long (the sled backend's reads and
//! buffered writes: page-cache `pread`s, appends, in-memory sled) may do it inside the
//! future; what blocks (an fdatasync) belongs on the blocking pool.

use std::future::Future;

use super::{
    BadLine, CommitRecord, ItemRecord, OffsetRecord, PlannedBucket, PlannerState, RerunBucket,
    RerunOffset, RerunRecord, StoreError, StoreStats, StoredJob,
};

/// A bucket of the job's log with its commit record, if it is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketState {
    pub offset: OffsetRecord,
    pub commit: Option<CommitRecord>,
}

/// A rerun bucket with its commit record, if it is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerunBucketState {
    pub offset: RerunOffset,
    pub commit: Option<CommitRecord>,
}

/// The storage a job's progress lives in.
pub trait Store: Send + Sync + 'static {
    /// The stored job, if the job was created.
    fn job(&self) -> impl Future<Output = Result<Option<StoredJob>, StoreError>> + Send;
    /// Store the job (at creation, or with changed operational fields), durably.
    fn put_job(&self, job: &StoredJob) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Where the planner stands.
    fn planner(&self) -> impl Future<Output = Result<PlannerState, StoreError>> + Send;
    /// Note that the planner read each `(row, id)`, in order, and say for each whether it is
    /// a repeat: the row of the ID's first occurrence if that is an earlier row, else none (a
    /// first occurrence, also when this row was noted before: planning again after a crash
    /// reads the same rows). An ID may repeat within `rows`. Notes are durable with the plan
    /// that holds the row.
    fn first_rows(
        &self,
        rows: &[(u64, &str)],
    ) -> impl Future<Output = Result<Vec<Option<u64>>, StoreError>> + Send;
    /// Atomically write planned buckets (offset records, their unique IDs, bad lines)
    /// together with the planner's new position (no buckets: only move the planner).
    fn plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Write final item records.
    fn record(
        &self,
        results: &[(String, ItemRecord)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Make every earlier write durable.
    fn sync(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Up to `limit` buckets of the job's log from bucket `from` on, in bucket order, with
    /// their commit records.
    fn buckets(
        &self,
        from: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<BucketState>, StoreError>> + Send;
    /// The unique IDs of a bucket, in input order, with their records (pending if none).
    fn bucket_items(
        &self,
        bucket: &OffsetRecord,
    ) -> impl Future<Output = Result<Vec<(String, ItemRecord)>, StoreError>> + Send;
    /// The record of one ID (none: not planned, or pending).
    fn item(&self, id: &str)
        -> impl Future<Output = Result<Option<ItemRecord>, StoreError>> + Send;
    /// Recorded bad lines, in input order, at most `limit`.
    fn bad_lines(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<BadLine>, StoreError>> + Send;
    /// Every rerun, oldest first.
    fn reruns(&self) -> impl Future<Output = Result<Vec<RerunRecord>, StoreError>> + Send;
    /// Atomically write a new rerun with all its buckets. Callers sync before dispatching.
    fn create_rerun(
        &self,
        rerun: &RerunRecord,
        buckets: &[RerunBucket],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Up to `limit` buckets of a rerun from bucket `from` on, in bucket order, with their
    /// commit records.
    fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RerunBucketState>, StoreError>> + Send;
    /// A rerun bucket's IDs, in input order, with their current records (every ID of a
    /// rerun has one: it was final when the rerun selected it).
    fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> impl Future<Output = Result<Vec<(String, ItemRecord)>, StoreError>> + Send;
    /// The job's figures counted by the backend itself (a database's aggregate), if it can;
    /// `None`: [`super::view::JobView::stats`] derives them by walking every bucket. Either
    /// way the figures are the same.
    fn counted_stats(&self) -> impl Future<Output = Result<Option<StoreStats>, StoreError>> + Send {
        async { Ok(None) }
    }
}

/// A fencing token: a lease granted later carries a larger one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseToken(pub u64);

/// What a lease is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseScope {
    /// The whole job: every bucket of its log and of its reruns.
    Job,
    /// One bucket of the job's log or of a rerun's.
    Bucket { log: Log, bucket: u64 },
}

/// The right to work on a scope and commit it, until it is released or lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub scope: LeaseScope,
    pub token: LeaseToken,
}

impl Lease {
    /// Whether this lease covers `bucket` of `log`.
    pub fn covers(&self, log: Log, bucket: u64) -> bool {
        match self.scope {
            LeaseScope::Job => true,
            LeaseScope::Bucket { log: l, bucket: b } => l == log && b == bucket,
        }
    }
}

/// Which commit log a run writes to: the job's, or a rerun's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    Job,
    Rerun(u32),
}

impl Log {
    /// The rerun's number, for a rerun's log.
    pub fn rerun(self) -> Option<u32> {
        match self {
            Log::Job => None,
            Log::Rerun(k) => Some(k),
        }
    }
}

/// What one commit writes, atomically.
#[derive(Debug, Clone, Copy)]
pub enum Commit<'a> {
    /// Commit records of job buckets.
    Job(&'a [CommitRecord]),
    /// Commit records of rerun buckets not committed yet, and the job buckets' commit
    /// records as their counts move ([`super::view::JobView::rerun_moves`]).
    Rerun {
        rerun: u32,
        buckets: &'a [CommitRecord],
        moved: &'a [CommitRecord],
    },
}

/// Who may work on a bucket and commit it. The engine takes a lease before it works and
/// every commit carries it.
pub trait Leases: Send + Sync + 'static {
    /// Take a lease on `scope`, or none if another worker holds it.
    fn acquire(
        &self,
        scope: LeaseScope,
    ) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;
    /// Keep a lease (a backend whose leases expire needs this within their time to live);
    /// [`StoreError::LeaseLost`] if it is not held any more.
    fn renew(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Give a lease up; commits carrying it are refused from now on.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Write commit records under `lease`, or refuse all of them with
    /// [`StoreError::LeaseLost`]. Callers make the buckets' results durable first; the
    /// commit itself is durable at the next [`Store::sync`].
    fn commit(
        &self,
        lease: &Lease,
        commit: Commit<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether several workers share the job: then a run leases buckets one by one
    /// ([`Leases::acquire_next`]) instead of the whole job, a worker may join or leave at
    /// any time, and a bucket whose lease is lost is dropped, not an error. A store with one
    /// holder at a time (sled's flock) says no, and a run takes the whole job.
    fn shared(&self) -> bool {
        false
    }

    /// Lease up to `n` buckets of `log` that need work (open, or their holder's lease
    /// lapsed), lowest first, each with a bucket-scoped lease. Only for a shared store.
    fn acquire_next(
        &self,
        _log: Log,
        _n: u32,
    ) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Whether this worker's leases are surely still valid (for a store whose leases
    /// expire: its last renewal is less than a time to live old, on the local monotonic
    /// clock). A worker starts no call while they are not.
    fn alive(&self) -> bool {
        true
    }

    /// Whether this worker still holds `lease`, as far as it knows without asking: a lease
    /// released, or lost with a session that expired, is not. A worker calls no item of a
    /// lease it does not hold (its results would be fenced out).
    fn holds(&self, _lease: &Lease) -> bool {
        true
    }

    /// The fleet's rate as this worker last learned it (for a shared store whose job has
    /// one rate for all its workers): its share and the shared pause. `None`: the store
    /// shares no rate, the run's own rate applies.
    fn fleet_rate(&self) -> Option<FleetRate> {
        None
    }

    /// Make `rate` (requests per second, over all workers) the job's total rate, and
    /// `burst` (`--burst`; none: one call) its burst, if they are not already. Only for a
    /// store that shares a rate.
    fn set_fleet_rate(
        &self,
        _rate: f64,
        _burst: Option<u32>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// Pause every worker of the job for `pause` from now (the API said `Retry-After`);
    /// returns how long the job is paused from now, or `None` for a store that shares no
    /// pause.
    fn pause_fleet(
        &self,
        _pause: std::time::Duration,
    ) -> impl Future<Output = Result<Option<std::time::Duration>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// Say that this worker is draining (a stop was asked for): it takes no new bucket and
    /// gives its rate share back, while it finishes or abandons what it holds. Only for a
    /// shared store; the leases themselves are released by the run as it ends.
    fn drain(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// Take the planner's lease (or keep it) before planning the job's input: false while
    /// another live worker of a shared store plans, or once the input is planned to its
    /// end. A store with one holder at a time plans under its job lease: always true.
    fn take_planner(&self) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async { Ok(true) }
    }

    /// Whether `log` is planned to its end with every bucket committed, if the store can
    /// say so cheaply (a shared store's idle workers ask this at every poll); `None`: derive
    /// it from the records ([`super::view::JobView::stats`]).
    fn log_finished(
        &self,
        _log: Log,
    ) -> impl Future<Output = Result<Option<bool>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// This worker's name among the job's workers (for a shared store: its session), for
    /// the `worker` label of its metrics; `None` for a store with one worker at a time.
    fn worker_label(&self) -> Option<String> {
        None
    }
}

/// A worker's part of the fleet's rate ([`Leases::fleet_rate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetRate {
    /// Requests per second this worker may start: `Some(0.0)` waits (a newcomer before its
    /// first grant, a draining worker); `None`: the job has no rate limit.
    pub share: Option<f64>,
    /// How many of the job's `--burst` this worker may send at once (its part, in proportion
    /// to its share: the parts never sum above the job's burst while it covers a call per
    /// worker); `None`: the run's own burst applies.
    pub burst: Option<u32>,
    /// Start nothing before this (a `Retry-After` seen by any worker of the job).
    pub paused_until: Option<std::time::Instant>,
}
