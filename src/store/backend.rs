//! The seam a backend implements: [`Store`] (a job's records) and [`Leases`] (who may work on
//! a bucket and commit it), and, for a backend several workers may share a job through,
//! [`Fleet`] (sessions, bucket-by-bucket leases, the planner's lease, the shared rate). A
//! backend opts into the fleet in its type ([`Leases::Fleet`]): sled and memory name
//! [`NoFleet`], PostgreSQL names itself.
//!
//! They are small and async. Everything a job derives from its records (statistics, the
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
//!   it. Results are written under a lease on their bucket: a [`Fleet`]'s backend drops
//!   those of buckets it holds no lease on (a worker that lost a bucket writes nothing that
//!   counts); a backend with one holder at a time may apply them (they are the same item's
//!   final result). Either way they never make a bucket committed.
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
use std::sync::Arc;
use std::time::Duration;

use crate::quota::{KeptLimit, QuotaGrant, QuotaLedger, QuotaWant};

use super::{
    BadLine, CommitRecord, ItemRecord, OffsetRecord, PageMark, PageRecord, PlannedBucket,
    PlannerState, RerunBucket, RerunOffset, RerunRecord, StoreError, StoreStats, StoredJob,
};

/// A bucket of the job's log with its commit record, if it is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketState {
    /// The bucket's write-ahead record.
    pub offset: OffsetRecord,
    /// Its commit record; none until committed.
    pub commit: Option<CommitRecord>,
}

/// A rerun bucket with its commit record, if it is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerunBucketState {
    /// The rerun bucket's write-ahead record.
    pub offset: RerunOffset,
    /// Its commit record; none until committed.
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
    /// Reserve calls in the job's quota windows ([`QuotaLedger::reserve`]), atomically and
    /// durably: once this returns, the reservation outlives any crash, and every worker of
    /// the job reserves from the same usage.
    fn reserve_quota(
        &self,
        wants: &[QuotaWant],
        now_ms: u64,
    ) -> impl Future<Output = Result<Vec<QuotaGrant>, StoreError>> + Send;
    /// The job's quota usage as stored.
    fn quota_ledger(&self) -> impl Future<Output = Result<QuotaLedger, StoreError>> + Send;
    /// The job's figures counted by the backend itself (a database's aggregate), if it can;
    /// `None`: [`super::view::JobView::stats`] derives them by walking every bucket. Either
    /// way the figures are the same.
    fn counted_stats(&self) -> impl Future<Output = Result<Option<StoreStats>, StoreError>> + Send {
        async { Ok(None) }
    }
    /// Append records of the job's history (`crate::history`'s records, as JSON objects),
    /// durably. A backend that keeps no history of its own ignores them: the sled backend's
    /// history is a file beside it, written by the run's monitor and read without the
    /// store's lock.
    fn append_history(
        &self,
        records: &[serde_json::Value],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = records;
        async { Ok(()) }
    }
    /// The windows the job's runs learnt from the API's refusals, as last kept
    /// ([`Store::keep_learned_limits`]; none kept: empty).
    fn learned_limits(&self) -> impl Future<Output = Result<Vec<KeptLimit>, StoreError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// Keep `limits` as the windows the job learnt, replacing those kept: a resume paces by
    /// them from its first call, and every worker of a fleet reads them. Not a result: a
    /// backend may make them durable with its next write. One that keeps none ignores them
    /// (its runs learn the windows again).
    fn keep_learned_limits(
        &self,
        limits: &[KeptLimit],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = limits;
        async { Ok(()) }
    }
    /// The job's history as [`Store::append_history`] kept it, oldest first (none: empty).
    fn history(&self) -> impl Future<Output = Result<Vec<serde_json::Value>, StoreError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// Whether each of the store's syncs waits on a network round trip (a database server
    /// elsewhere): the writer then lets larger groups wait for a sync, since a round trip,
    /// not the store's work, bounds how many syncs a second it makes (see
    /// [`crate::engine::max_unsynced_items_over_network`]). False (the default) for a
    /// store on this machine.
    fn over_network(&self) -> bool {
        false
    }
    /// Whether the store keeps the pages of paginated IDs ([`Store::record_pages`]). One
    /// that does not (the default) has a paginated ID's items held in memory until its last
    /// page and written as its record's body; one that does lets a resume continue an ID at
    /// the page it was on.
    fn keeps_pages(&self) -> bool {
        false
    }
    /// Write pages of paginated IDs, each with its ID ([`PageRecord`]), buffered as
    /// [`Store::record`] is: durable at the next [`Store::sync`], in the order written, an ID's
    /// pages before any record written after them. A page written again (the same ID,
    /// generation and number) replaces the earlier one. Called only when
    /// [`Store::keeps_pages`] says so.
    fn record_pages(
        &self,
        pages: &[(String, PageRecord)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = pages;
        async {
            Err(StoreError::Corrupt {
                reason: "this store keeps no pages".into(),
            })
        }
    }
    /// Where the pages of each of `ids` (its row and ID) stand in `generation`: the mark of
    /// its last page stored, none for an ID without one.
    fn page_marks(
        &self,
        generation: u32,
        ids: &[(u64, &str)],
    ) -> impl Future<Output = Result<Vec<Option<PageMark>>, StoreError>> + Send {
        let _ = generation;
        let none = vec![None; ids.len()];
        async { Ok(none) }
    }
    /// Pages `from..from + count` of the ID `id` (at `row`) in `generation`, in order: each
    /// of them, or [`StoreError::Corrupt`] when one is missing (a final record counts pages
    /// the store made durable before it).
    fn pages(
        &self,
        row: u64,
        id: &str,
        generation: u32,
        from: u32,
        count: u32,
    ) -> impl Future<Output = Result<Vec<PageRecord>, StoreError>> + Send {
        let _ = (row, generation, from);
        let reason = format!("this store keeps no pages, and {count} of {id:?} were asked for");
        async move { Err(StoreError::Corrupt { reason }) }
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
    Bucket {
        /// The job's log or a rerun's.
        log: Log,
        /// The bucket's number in that log.
        bucket: u64,
    },
}

/// The right to work on a scope and commit it, until it is released or lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// What the lease covers.
    pub scope: LeaseScope,
    /// Its fencing token, carried by every write under it.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Log {
    /// The job's own log.
    Job,
    /// The log of the rerun of this number.
    Rerun(u32),
}

impl Log {
    /// The rerun's number, for a rerun's log.
    pub(crate) fn rerun(self) -> Option<u32> {
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
        /// The rerun's number.
        rerun: u32,
        /// Commit records of the rerun's buckets.
        buckets: &'a [CommitRecord],
        /// The job buckets' commit records with their new counts.
        moved: &'a [CommitRecord],
    },
}

/// Who may work on a bucket and commit it. The engine takes a lease before it works and
/// every commit carries it.
pub trait Leases: Sized + Send + Sync + 'static {
    /// The fleet this backend's workers form, said once, in the type: [`NoFleet`] for a
    /// backend with one holder at a time (sled's flock, memory), whose run takes the whole
    /// job's lease; `Self` for a backend that implements [`Fleet`], whose runs lease buckets
    /// one by one, several workers sharing the job. The engine picks how a run gets its
    /// buckets by this type ([`FleetKind`]).
    type Fleet: FleetKind<Self>;

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
    /// Whether [`Leases::commit`] and [`Leases::commit_each`] write the results recorded
    /// before them too, in the same atomic write, durable with the commit records (a
    /// database's transaction): the writer then needs no [`Store::sync`] of its own before
    /// a commit. False unless a backend says so.
    fn commits_write_results(&self) -> bool {
        false
    }
    /// Write the commit records of several job buckets, each under its own bucket lease, as
    /// [`Leases::commit`] of each one would, in as few round trips as the backend can: for
    /// each, in order, whether it was committed (false: its lease is lost, only that bucket
    /// is refused). Callers make the buckets' results durable first, as for
    /// [`Leases::commit`]. Another error refuses the rest.
    fn commit_each(
        &self,
        commits: &[(Lease, CommitRecord)],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send {
        async move {
            let mut done = Vec::with_capacity(commits.len());
            for (lease, record) in commits {
                let one = Commit::Job(std::slice::from_ref(record));
                match self.commit(lease, one).await {
                    Ok(()) => done.push(true),
                    Err(e) if matches!(e.root(), StoreError::LeaseLost { .. }) => done.push(false),
                    Err(e) => return Err(e),
                }
            }
            Ok(done)
        }
    }
}

/// What several workers (processes, machines) sharing one job need of their store, beyond
/// [`Leases`]: a backend opts in by implementing it and naming itself its
/// [`Leases::Fleet`].
///
/// A worker is a session of the store: its leases are valid while the session lives. A run
/// leases buckets one by one ([`Fleet::acquire_next`]), a worker may join or leave at any
/// time, and a bucket whose lease is lost is dropped, not an error. Results written under a
/// bucket's lease that is no longer held are dropped (see the fencing contract above).
pub trait Fleet: Store + Leases {
    /// Lease up to `n` buckets of `log` that need work (open, or their holder's session
    /// expired), lowest first, each with a bucket-scoped lease.
    fn acquire_next(
        &self,
        log: Log,
        n: u32,
    ) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send;

    /// Lease up to `n` buckets of `log` as [`Fleet::acquire_next`] does, and read each one's
    /// items as [`Store::bucket_items`] (the job's log) or [`Store::rerun_bucket_items`] (a
    /// rerun's) give them: what a worker needs to work on the buckets. A backend whose
    /// every read is a round trip to a server reads them together, in one flight after
    /// the lease; this default asks one question after another.
    fn acquire_work(
        &self,
        log: Log,
        n: u32,
    ) -> impl Future<Output = Result<Vec<LeasedBucket>, StoreError>> + Send {
        async move {
            let leases = self.acquire_next(log, n).await?;
            let mut work = Vec::with_capacity(leases.len());
            for lease in leases {
                let LeaseScope::Bucket { bucket, .. } = lease.scope else {
                    continue;
                };
                let items = match log {
                    Log::Job => {
                        let found = self.buckets(bucket, 1).await?.into_iter().next();
                        match found.filter(|b| b.offset.bucket == bucket) {
                            Some(b) => self.bucket_items(&b.offset).await?,
                            None => continue,
                        }
                    }
                    Log::Rerun(k) => {
                        let found = self.rerun_buckets(k, bucket, 1).await?.into_iter().next();
                        match found.filter(|b| b.offset.bucket == bucket) {
                            Some(b) => self.rerun_bucket_items(&b.offset).await?,
                            None => continue,
                        }
                    }
                };
                work.push(LeasedBucket { lease, items });
            }
            Ok(work)
        }
    }

    /// Whether this worker's leases are surely still valid (for a store whose leases
    /// expire: its last renewal is less than a time to live old, on the local monotonic
    /// clock). A worker starts no call while they are not.
    fn alive(&self) -> bool;

    /// Whether this worker still holds `lease`, as far as it knows without asking: a lease
    /// released, or lost with a session that expired, is not. A worker calls no item of a
    /// lease it does not hold (its results would be fenced out).
    fn holds(&self, lease: &Lease) -> bool;

    /// The fleet's rate as this worker last learned it: its share and the shared pause.
    fn fleet_rate(&self) -> FleetRate;

    /// Make `rate` (requests per second, over all workers) the job's total rate, and
    /// `burst` (`--burst`; none: one call) its burst, if they are not already.
    fn set_fleet_rate(
        &self,
        rate: f64,
        burst: Option<u32>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Pause every worker of the job for `pause` from now (the API said `Retry-After`);
    /// returns how long the job is paused from now.
    fn pause_fleet(
        &self,
        pause: Duration,
    ) -> impl Future<Output = Result<Duration, StoreError>> + Send;

    /// Say that this worker is draining (a stop was asked for): it takes no new bucket and
    /// gives its rate share back, while it finishes or abandons what it holds. The leases
    /// themselves are released by the run as it ends.
    fn drain(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Take the planner's lease (or keep it) before planning the job's input, and say where
    /// planning stands under it (as [`Store::planner`] would, read with the lease): none
    /// while another live worker plans, or once the input is planned to its end.
    fn take_planner(&self)
        -> impl Future<Output = Result<Option<PlannerState>, StoreError>> + Send;

    /// Whether `log` is planned to its end with every bucket committed (idle workers ask
    /// this at every poll: a cheap question).
    fn log_finished(&self, log: Log) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// This worker's name among the job's workers (its session), for the `worker` label of
    /// its metrics.
    fn worker_label(&self) -> String;
}

/// A bucket just leased, with its items ([`Fleet::acquire_work`]).
#[derive(Debug, Clone)]
pub struct LeasedBucket {
    /// The bucket's lease (bucket-scoped).
    pub lease: Lease,
    /// Its items with their records, pending or final, in row order: the job's records for
    /// a bucket of the job's log, those a rerun's bucket holds for a rerun's.
    pub items: Vec<(String, ItemRecord)>,
}

/// A worker's part of the fleet's rate ([`Fleet::fleet_rate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetRate {
    /// Requests per second this worker may start: `Some(0.0)` waits (a newcomer before its
    /// first grant, a draining worker); `None`: the job has no rate limit.
    pub share: Option<f64>,
    /// How many of the job's `--burst` this worker may send at once (its part, in proportion
    /// to its share: the parts never sum above the job's burst while it covers a call per
    /// worker); `None`: the run's own burst applies.
    pub burst: Option<u32>,
    /// Start nothing before this (a `Retry-After` seen by any worker of the job), in
    /// tokio's time, as every wait of a run.
    pub paused_until: Option<tokio::time::Instant>,
    /// The job's live workers sharing its calls, this one among them, as the store last
    /// counted them (what the API announces it has left is divided among them); `None`: not
    /// counted yet.
    pub workers: Option<u32>,
    /// When this worker last leased a bucket after holding none, if the other workers count
    /// it only at their next look at the fleet (a database's heartbeats): while it held none
    /// they divided what the API announces among themselves, so it takes nothing of it until
    /// they count it again. `None`: it never came back from idle, or the others count it at
    /// once.
    pub rejoined: Option<tokio::time::Instant>,
}

/// The [`Leases::Fleet`] of a backend with one holder at a time: it forms no fleet.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFleet;

/// What a backend's [`Leases::Fleet`] may be: [`NoFleet`], or the backend itself when it
/// implements [`Fleet`]. It hands the store on as what it is, to a [`FleetVisitor`]: the
/// engine's choice of a run's mode, made by type (no backend answers "am I shared?" at run
/// time).
pub trait FleetKind<S> {
    /// Call `visitor`'s [`FleetVisitor::alone`] or [`FleetVisitor::fleet`] with `store`.
    fn visit<V: FleetVisitor<S>>(store: Arc<S>, visitor: V) -> V::Output;
}

/// Something done one way with a store that has one holder at a time, another with a
/// fleet's ([`FleetKind::visit`]).
pub trait FleetVisitor<S> {
    /// What the visit yields.
    type Output;
    /// `store`'s [`Leases::Fleet`] is [`NoFleet`].
    fn alone(self, store: Arc<S>) -> Self::Output;
    /// `store` is a fleet's.
    fn fleet(self, store: Arc<S>) -> Self::Output
    where
        S: Fleet;
}

impl<S> FleetKind<S> for NoFleet {
    fn visit<V: FleetVisitor<S>>(store: Arc<S>, visitor: V) -> V::Output {
        visitor.alone(store)
    }
}

impl<S: Fleet> FleetKind<S> for S {
    fn visit<V: FleetVisitor<S>>(store: Arc<S>, visitor: V) -> V::Output {
        visitor.fleet(store)
    }
}

/// This worker's name among the job's workers ([`Fleet::worker_label`]); `None` for a
/// backend with one holder at a time.
pub(crate) fn worker_label<S: Leases>(store: &Arc<S>) -> Option<String> {
    struct Label;
    impl<S> FleetVisitor<S> for Label {
        type Output = Option<String>;
        fn alone(self, _: Arc<S>) -> Option<String> {
            None
        }
        fn fleet(self, store: Arc<S>) -> Option<String>
        where
            S: Fleet,
        {
            Some(store.worker_label())
        }
    }
    S::Fleet::visit(store.clone(), Label)
}
