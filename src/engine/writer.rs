//! The result writer: receives final records, writes them in groups and makes each group
//! durable with one sync (group commit) or, with async progress, syncs in the background
//! every checkpoint; then writes the commit records of the buckets those results completed,
//! each under its bucket's lease.

use std::collections::HashMap;
use std::sync::Arc;
// `Instant` (std's) times store I/O: real time, paused tokio clock or not.
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use super::error::EngineError;
use super::stop::Halt;
use crate::clock::Clock;
use crate::progress::Counters;
use crate::spec::FailureLimit;
use crate::store::{
    CommitRecord, ItemRecord, ItemStatus, Lease, LeaseScope, Leases, Log, PageRecord, Store,
    StoreError, Tally,
};

/// The capacity of the queue of results waiting to be made durable.
///
/// While one group of results is being flushed the next one queues here, so this is also
/// the largest group a flush covers: large enough that the flush's fixed cost is spread over
/// hundreds of results at full speed, small enough that a kill -9 repeats few calls. A
/// store whose sync waits on a network round trip ([`Store::over_network`]) gets eight
/// times as much: one worker's results go through one sync at a time, each costing the
/// server's time for what it holds plus the round trip, so its groups must be large
/// enough that the round trip is a small part. Measured at 10 ms each way
/// (benches/README.md), 1,024 results a sync held one worker to about 16,000 items/s
/// where the same worker did 24,000 on the database's own machine.
pub(super) fn writer_queue(concurrency: usize, over_network: bool) -> usize {
    let local = (4 * concurrency).max(256);
    if over_network {
        8 * local
    } else {
        local
    }
}

/// How long the writer gathers results before one flush makes them durable, unless a
/// group's worth ([`group_target`]) is queued sooner.
pub(crate) const GROUP_COMMIT_DELAY: Duration = Duration::from_millis(5);

/// The most items whose API call may be repeated after a kill -9: those in flight, plus
/// those whose results were queued or being written but not yet durable. For a store on
/// this machine; see [`max_unsynced_items_over_network`] for a database server.
pub fn max_unsynced_items(concurrency: usize) -> usize {
    concurrency + 2 * writer_queue(concurrency, false)
}

/// [`max_unsynced_items`] for a store whose syncs wait on a network round trip
/// ([`Store::over_network`]: PostgreSQL), which lets larger groups wait for a sync.
pub fn max_unsynced_items_over_network(concurrency: usize) -> usize {
    concurrency + 2 * writer_queue(concurrency, true)
}

/// The bound of a run on `store`: [`max_unsynced_items`] or
/// [`max_unsynced_items_over_network`], as [`Store::over_network`] says.
pub fn max_unsynced_items_of<S: Store>(store: &S, concurrency: usize) -> usize {
    concurrency + 2 * writer_queue(concurrency, store.over_network())
}

/// A bucket about to be dispatched: `remaining` items to wait for, `done` already counted,
/// and the lease its commit carries.
pub(super) struct Track {
    /// What the bucket's items carry as their `track`: the bucket itself, or in a fleet a
    /// key of this lease's own (a bucket leased again gets a new track, and the
    /// results of its earlier lease's items never count towards it).
    pub(super) key: u64,
    pub(super) bucket: u64,
    pub(super) remaining: u64,
    pub(super) done: Tally,
    pub(super) lease: Lease,
}

// Nearly every message is a `Done`: boxing its record would cost an allocation per item to
// save space in the rare `Track`s.
#[allow(clippy::large_enum_variant)]
pub(super) enum WriterMsg {
    /// Buckets about to be dispatched (one message per planner batch: with one-row buckets,
    /// one message per bucket would double the writer's traffic).
    Track(Vec<Track>),
    Done {
        id: String,
        track: u64,
        record: ItemRecord,
    },
    /// A page of a paginated ID, for a store that keeps pages: written before any record
    /// that comes after it (its ID's final record among them), and made durable with them.
    Page { id: String, page: Box<PageRecord> },
}

pub(super) struct Tracked {
    bucket: u64,
    remaining: u64,
    done: Tally,
}

/// The writer task's bookkeeping: which buckets wait for how many results, and the run's
/// failure limit.
pub(super) struct Writer<S> {
    pub(super) store: Arc<S>,
    pub(super) counters: Arc<Counters>,
    pub(super) max_failures: Option<FailureLimit>,
    pub(super) halt: Arc<Halt>,
    pub(super) open: HashMap<u64, Tracked>,
    /// Which commit log the buckets belong to: the job's or a rerun's.
    pub(super) log: Log,
    /// The lease each track is committed under, by track key.
    pub(super) leases: HashMap<u64, Lease>,
    /// The leases of completed buckets waiting for their commit, by bucket.
    pub(super) completed: HashMap<u64, Lease>,
    /// Rung when a sender finds the queue holding a group, or full.
    pub(super) full: Arc<Notify>,
    /// Pages of paginated IDs sorted and not yet written.
    pub(super) pages: Vec<(String, PageRecord)>,
    /// What commit records are stamped with.
    pub(super) clock: Clock,
    /// Rung after each commit ([`super::dispatcher::Dispatcher::committed`]).
    pub(super) committed: Arc<Notify>,
}

impl<S: Store + Leases> Writer<S> {
    /// Sort messages: start tracking buckets (those with nothing left to wait for go
    /// straight to `ready`), collect results with the bucket each one completes (`tracks`).
    fn sort(
        &mut self,
        msgs: &mut Vec<WriterMsg>,
        results: &mut Vec<(String, ItemRecord)>,
        tracks: &mut Vec<u64>,
        ready: &mut Vec<CommitRecord>,
    ) {
        for msg in msgs.drain(..) {
            match msg {
                WriterMsg::Track(tracks) => {
                    for Track {
                        key,
                        bucket,
                        remaining,
                        done,
                        lease,
                    } in tracks
                    {
                        if remaining == 0 {
                            self.completed.insert(bucket, lease);
                            ready.push(CommitRecord::new(bucket, done, self.clock.now_ms()));
                        } else {
                            self.leases.insert(key, lease);
                            self.open.insert(
                                key,
                                Tracked {
                                    bucket,
                                    remaining,
                                    done,
                                },
                            );
                        }
                    }
                }
                WriterMsg::Done { id, track, record } => {
                    tracks.push(track);
                    results.push((id, record))
                }
                WriterMsg::Page { id, page } => self.pages.push((id, *page)),
            }
        }
    }

    /// Write the pages sorted so far, then results, to the store (durable at the next sync)
    /// and count them; the buckets whose last result this was go to `done`. `tracks[i]` is
    /// the bucket `results[i]` completes (the job bucket, or the rerun bucket in a rerun).
    /// Whether anything was written.
    async fn record(
        &mut self,
        results: &[(String, ItemRecord)],
        tracks: &[u64],
        done: &mut Vec<CommitRecord>,
    ) -> Result<bool, StoreError> {
        let paged = !self.pages.is_empty();
        if paged {
            // Before the results: an ID's final record never goes before its last page.
            let start = Instant::now();
            let pages = std::mem::take(&mut self.pages);
            self.store.record_pages(&pages).await?;
            Counters::add_elapsed(&self.counters.record_write_ns, start);
        }
        if results.is_empty() {
            return Ok(paged);
        }
        let start = Instant::now();
        self.store.record(results).await?;
        Counters::add_elapsed(&self.counters.record_write_ns, start);
        for ((_, record), &track) in results.iter().zip(tracks) {
            let ok = record.status == ItemStatus::Ok;
            Counters::add(
                if ok {
                    &self.counters.ok
                } else {
                    &self.counters.failed
                },
                1,
            );
            let Some(t) = self.open.get_mut(&track) else {
                tracing::error!(bucket = track, "a result for a bucket that is not tracked");
                continue;
            };
            t.done.add(record);
            t.remaining = t.remaining.saturating_sub(1);
            if t.remaining == 0 {
                let t = self.open.remove(&track).expect("just seen");
                if let Some(lease) = self.leases.remove(&track) {
                    self.completed.insert(t.bucket, lease);
                }
                done.push(CommitRecord::new(t.bucket, t.done, self.clock.now_ms()));
            }
        }
        self.check_failures(results);
        Ok(true)
    }

    /// Write commit records, each under its bucket's lease; callers made the buckets'
    /// results durable first. A bucket leased on its own (by a worker of a fleet) whose lease
    /// was lost is another worker's now: it is dropped here, with a warning. A lost lease on
    /// the whole job fails the run.
    pub(super) async fn commit(
        &mut self,
        commits: &mut Vec<CommitRecord>,
    ) -> Result<(), StoreError> {
        if commits.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let mut groups: Vec<(Lease, Vec<CommitRecord>)> = Vec::new();
        // Job buckets leased one by one (a fleet's): committed together, each under its own
        // lease, so a group's commits cost the store one write, not one each.
        let mut each: Vec<(Lease, CommitRecord)> = Vec::new();
        for c in commits.drain(..) {
            let Some(lease) = self.completed.remove(&c.bucket) else {
                tracing::error!(bucket = c.bucket, "a bucket to commit without a lease");
                continue;
            };
            if self.log == Log::Job && matches!(lease.scope, LeaseScope::Bucket { .. }) {
                each.push((lease, c));
                continue;
            }
            match groups.iter_mut().find(|(l, _)| *l == lease) {
                Some((_, group)) => group.push(c),
                None => groups.push((lease, vec![c])),
            }
        }
        if !each.is_empty() {
            let done = self.store.commit_each(&each).await?;
            let lost: Vec<u64> = each
                .iter()
                .zip(&done)
                .filter(|(_, ok)| !**ok)
                .map(|((_, c), _)| c.bucket)
                .collect();
            let committed = (each.len() - lost.len()) as u64;
            Counters::add(&self.counters.buckets_committed, committed);
            if !lost.is_empty() {
                tracing::warn!(buckets = ?lost, "not committed here: their leases were lost");
            }
        }
        for (lease, group) in groups {
            match crate::store::view::commit(&*self.store, &lease, self.log, &group).await {
                Ok(()) => Counters::add(&self.counters.buckets_committed, group.len() as u64),
                Err(e)
                    if matches!(lease.scope, LeaseScope::Bucket { .. })
                        && matches!(e.root(), StoreError::LeaseLost { .. }) =>
                {
                    let buckets: Vec<u64> = group.iter().map(|c| c.bucket).collect();
                    tracing::warn!(?buckets, "not committed here: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        Counters::add_elapsed(&self.counters.commit_write_ns, start);
        self.committed.notify_one();
        Ok(())
    }

    /// Give back the leases of buckets left unfinished (a stop), so other workers take
    /// them at once. Only bucket leases (a fleet's): a lease on the whole job is the run's,
    /// released by its source.
    async fn release_unfinished(&mut self) -> Result<(), StoreError> {
        for (_, lease) in self.leases.drain() {
            if matches!(lease.scope, LeaseScope::Bucket { .. }) {
                self.store.release(&lease).await?;
            }
        }
        Ok(())
    }

    fn check_failures(&self, results: &[(String, ItemRecord)]) {
        let Some(limit) = self.max_failures else {
            return;
        };
        let now = self.counters.snapshot();
        if limit.exceeded(now.failed, now.done()) {
            let last = results
                .iter()
                .rev()
                .find_map(|(_, r)| r.error.clone())
                .unwrap_or_default();
            self.halt.halt(
                crate::progress::HaltKind::Failures,
                format!(
                    "{} of {} IDs failed permanently in this run, past {}; the last error: {last}",
                    now.failed,
                    now.done(),
                    crate::setting::Setting::MaxFailures
                ),
            );
        }
    }

    /// Synchronous progress: gather a group, write it, make it durable with one sync, then
    /// write the commit records of the buckets it completed (group commit).
    pub(super) async fn run_sync(
        mut self,
        mut rx: mpsc::Receiver<WriterMsg>,
    ) -> Result<(), EngineError> {
        let (mut msgs, mut results, mut ready) = (Vec::new(), Vec::new(), Vec::new());
        let mut tracks = Vec::new();
        let max_group = rx.max_capacity();
        while rx.recv_many(&mut msgs, max_group).await > 0 {
            // One flush covers the whole group. Nobody waits on it but the commit records.
            gather(&mut rx, &mut msgs, &self.full).await;
            self.sort(&mut msgs, &mut results, &mut tracks, &mut ready);
            let mut done = Vec::new();
            if self.record(&results, &tracks, &mut done).await? {
                results.clear();
                tracks.clear();
                ready.append(&mut done);
                // A store whose commit writes the results with it needs no sync first: one
                // write, not two, when the group completes a bucket. Not a rerun's: its
                // commit reads the results first to move the job buckets' counts.
                let with_commit = self.log == Log::Job && self.store.commits_write_results();
                if ready.is_empty() || !with_commit {
                    timed_sync(&*self.store, &self.counters).await?;
                }
            }
            self.commit(&mut ready).await?;
        }
        timed_sync(&*self.store, &self.counters).await?;
        Ok(self.release_unfinished().await?)
    }

    /// Asynchronous progress: write results as they come; every `interval` a background
    /// sync makes everything written so far durable, and once it returns the commit records
    /// of the buckets completed before it started are written (durable at the next one).
    pub(super) async fn run_async(
        mut self,
        mut rx: mpsc::Receiver<WriterMsg>,
        interval: Duration,
    ) -> Result<(), EngineError> {
        let (mut msgs, mut results, mut tracks) = (Vec::new(), Vec::new(), Vec::new());
        // Buckets whose results are all written but not yet covered by a finished sync.
        let mut unsynced: Vec<CommitRecord> = Vec::new();
        // The sync in progress and the buckets it covers.
        let mut syncing: Option<(Vec<CommitRecord>, tokio::task::JoinHandle<_>)> = None;
        let mut dirty = false;
        let max_group = rx.max_capacity();
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut msgs, max_group) => {
                    if n == 0 {
                        break;
                    }
                    // Fewer, larger store writes.
                    gather(&mut rx, &mut msgs, &self.full).await;
                    self.sort(&mut msgs, &mut results, &mut tracks, &mut unsynced);
                    let wrote = self.record(&results, &tracks, &mut unsynced).await?;
                    dirty |= wrote || !unsynced.is_empty();
                    results.clear();
                    tracks.clear();
                }
                _ = ticker.tick(), if syncing.is_none() && dirty => {
                    let (store, counters) = (self.store.clone(), self.counters.clone());
                    let covered = std::mem::take(&mut unsynced);
                    let sync = async move { timed_sync(&*store, &counters).await };
                    syncing = Some((covered, tokio::spawn(sync)));
                    dirty = false;
                }
                synced = async { (&mut syncing.as_mut().expect("guarded").1).await }, if syncing.is_some() => {
                    let (mut covered, _) = syncing.take().expect("guarded");
                    synced.map_err(|e| EngineError::Internal(format!("background sync: {e}")))??;
                    Counters::add(&self.counters.checkpoints, 1);
                    dirty |= !covered.is_empty();
                    self.commit(&mut covered).await?;
                }
            }
        }
        // The run is over: make everything durable, then commit what is left.
        if let Some((mut covered, handle)) = syncing.take() {
            handle
                .await
                .map_err(|e| EngineError::Internal(format!("background sync: {e}")))??;
            self.commit(&mut covered).await?;
        }
        timed_sync(&*self.store, &self.counters).await?;
        self.commit(&mut unsynced).await?;
        timed_sync(&*self.store, &self.counters).await?;
        Ok(self.release_unfinished().await?)
    }
}

/// The writer's sync, timed and counted for progress reports.
async fn timed_sync<S: Store>(store: &S, counters: &Counters) -> Result<(), StoreError> {
    let start = Instant::now();
    store.sync().await?;
    Counters::add_elapsed(&counters.result_sync_ns, start);
    Counters::add(&counters.store_syncs, 1);
    Ok(())
}

/// Add to `msgs` what arrives within [`GROUP_COMMIT_DELAY`], until it holds a group
/// ([`group_target`]) or the delay is over.
async fn gather(rx: &mut mpsc::Receiver<WriterMsg>, msgs: &mut Vec<WriterMsg>, full: &Notify) {
    // Woken by the deadline or a queue holding a group, not by every message: at tens of
    // thousands of results per second a wake-up per result cost more than writing them.
    let max_group = rx.max_capacity();
    let target = group_target(max_group);
    let deadline = tokio::time::sleep(GROUP_COMMIT_DELAY);
    tokio::pin!(deadline);
    loop {
        let open = take_queued(rx, msgs, max_group);
        if !open || msgs.len() >= target {
            return;
        }
        tokio::select! {
            biased;
            _ = full.notified() => {}
            _ = &mut deadline => {
                take_queued(rx, msgs, max_group);
                return;
            }
        }
    }
}

/// How many results the writer gathers before it writes them without waiting for the group
/// commit delay: three quarters of its queue, so the rest takes the results that come while
/// it writes and syncs, and workers seldom wait for room.
pub(super) fn group_target(queue: usize) -> usize {
    queue - queue / 4
}

/// Move queued messages to `msgs` until it holds `max`; false once no sender is left.
fn take_queued(rx: &mut mpsc::Receiver<WriterMsg>, msgs: &mut Vec<WriterMsg>, max: usize) -> bool {
    while msgs.len() < max {
        match rx.try_recv() {
            Ok(msg) => msgs.push(msg),
            Err(mpsc::error::TryRecvError::Empty) => break,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
    true
}
