//! The fleet's engine tests: workers of one job sharing a store, each run by the real
//! engine against the fake API. Every test runs on the in-memory store of a fleet
//! ([`SharedMem`]) and on PostgreSQL, through [`SharedJob`]; what only a database counts is
//! tested on PostgreSQL alone.

use std::sync::Arc;
use std::time::Duration;

use crate::demo::api::{Announce, ApiConfig, ApiWindow, FakeApi};
use crate::engine::planner::PLANNER_POLL;
use crate::engine::source::leased::POLL_MAX;
use crate::engine::{max_unsynced_items_of, run, stop_pair};
use crate::handler::http::HttpHandler;
use crate::progress::{Counters, RunSummary};
use crate::spec::{JobSpec, RunOptions};
use crate::store::mem::{MemWorker, SharedMem};
use crate::store::{Fleet, ItemStatus, JobView, LeaseScope, Leases, Log, Store};

/// A job's store several workers share, for these tests.
trait SharedJob: Sized + Send + Sync + 'static {
    type W: Fleet;
    /// An empty store.
    async fn new() -> Self;
    /// A new worker on the job: a session of its own.
    async fn worker(&self) -> Arc<Self::W>;
    /// Let `w`'s session expire, as a time to live passing without a heartbeat would.
    fn expire(&self, w: &Self::W);
    /// Have `w` learn at once whether its session expired.
    fn renew_now(w: &Self::W);
    /// How many results `w` wrote without holding their bucket's lease (dropped).
    fn fenced(w: &Self::W) -> u64;
    /// Where planning stands: `done`, `planning` (a live worker holds the planner's lease)
    /// or `waiting`.
    async fn planning(w: &Self::W) -> &'static str;
}

/// The in-memory store of a fleet.
struct MemJob(SharedMem);

impl SharedJob for MemJob {
    type W = MemWorker;
    async fn new() -> Self {
        MemJob(SharedMem::new())
    }
    async fn worker(&self) -> Arc<MemWorker> {
        Arc::new(self.0.worker())
    }
    fn expire(&self, w: &MemWorker) {
        w.expire();
    }
    /// A worker in memory learns of its expiry at its next call.
    fn renew_now(_: &MemWorker) {}
    fn fenced(w: &MemWorker) -> u64 {
        w.fenced()
    }
    async fn planning(w: &MemWorker) -> &'static str {
        w.planning()
    }
}

/// A job in a fresh database of the test cluster; its workers' sessions live 3 s.
#[cfg(feature = "postgres")]
struct PgJob(crate::store::postgres::test_db::Db);

#[cfg(feature = "postgres")]
impl SharedJob for PgJob {
    type W = crate::store::postgres::PgStore;
    async fn new() -> Self {
        PgJob(crate::store::postgres::test_db::migrated().await)
    }
    async fn worker(&self) -> Arc<Self::W> {
        use crate::store::postgres::{PgOpen, PgStore};
        let open = PgOpen {
            create: true,
            ttl: Duration::from_secs(3),
            ..PgOpen::new("fleet")
        };
        Arc::new(PgStore::open(&self.0.target, &open).await.unwrap())
    }
    fn expire(&self, w: &Self::W) {
        self.0.psql(&format!(
            "SET search_path TO {}; UPDATE hw_worker SET expires_at = now() - interval '1 second' \
             WHERE worker_id = '{}'",
            self.0.db.schema,
            w.worker()
        ));
    }
    fn renew_now(w: &Self::W) {
        w.renew_session_now();
    }
    fn fenced(w: &Self::W) -> u64 {
        w.fenced()
    }
    async fn planning(w: &Self::W) -> &'static str {
        w.planning().await.unwrap().state
    }
}

/// The tests below, on a backend.
macro_rules! fleet_tests {
    ($job:ty) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn three_workers_share_a_job_and_call_each_id_once() {
            super::three_workers_share_a_job_and_call_each_id_once::<$job>().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_worker_that_lost_its_buckets_writes_nothing_that_counts() {
            super::a_worker_that_lost_its_buckets_writes_nothing_that_counts::<$job>().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_worker_whose_session_expired_calls_none_of_the_items_it_had_queued() {
            super::a_worker_whose_session_expired_calls_none_of_the_items_it_had_queued::<$job>()
                .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_worker_with_the_input_takes_planning_over_from_a_dead_planner() {
            super::a_worker_with_the_input_takes_planning_over_from_a_dead_planner::<$job>().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_worker_that_dies_mid_run_leaves_its_buckets_to_the_others() {
            super::a_worker_that_dies_mid_run_leaves_its_buckets_to_the_others::<$job>().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn two_and_three_workers_divide_what_the_api_announces() {
            for workers in [2, 3] {
                super::workers_divide_what_the_api_announces::<$job>(workers).await;
            }
        }
    };
}

mod memory {
    use super::MemJob;
    fleet_tests!(MemJob);

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn ids_refused_every_time_do_not_pause_the_fleet() {
        super::ids_refused_every_time_do_not_pause_the_fleet().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_newcomer_takes_nothing_of_the_announced_windows_before_its_grant() {
        super::a_newcomer_takes_nothing_of_the_announced_windows_before_its_grant().await;
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::PgJob;
    fleet_tests!(PgJob);

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn status_figures_counted_by_the_database_are_the_walks() {
        super::status_figures_counted_by_the_database_are_the_walks().await;
    }
}

struct FleetJob<D> {
    _dir: tempfile::TempDir,
    db: D,
    api: FakeApi,
    spec: Arc<JobSpec>,
    ids: Vec<String>,
}

/// A job of `n` IDs in bucket of 7 (some twice), created by a first worker's open.
async fn fleet<D: SharedJob>(n: usize) -> FleetJob<D> {
    let ids: Vec<String> = (0..n).map(|i| format!("f-{i}")).collect();
    let mut rows = ids.clone();
    rows.extend(ids[..n / 10].iter().cloned());
    let api = ApiConfig {
        latency_min: Duration::from_micros(200),
        latency_max: Duration::from_millis(1),
        not_found_per_mille: 30,
        ..ApiConfig::fast()
    };
    fleet_of(ids, rows, api, 7).await
}

/// A job of the input `rows` (whose unique IDs are `ids`) in buckets of `bucket_size`,
/// against a fake API of `api`, created by a first worker's open.
async fn fleet_of<D: SharedJob>(
    ids: Vec<String>,
    rows: Vec<String>,
    api: ApiConfig,
    bucket_size: u64,
) -> FleetJob<D> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.txt");
    std::fs::write(&input, rows.join("\n")).unwrap();
    let api = FakeApi::start(api).await.unwrap();
    let db = D::new().await;
    let first = db.worker().await;
    let spec =
        Arc::new(super::tests::url_job(&*first, input, api.url_template(), bucket_size).await);
    FleetJob {
        _dir: dir,
        db,
        api,
        spec,
        ids,
    }
}

fn options() -> RunOptions {
    RunOptions {
        concurrency: 4,
        progress_interval: Duration::ZERO,
        ..RunOptions::default()
    }
}

/// Every ID once in the export, in input order.
async fn exactly_once<S: Store>(store: &S, ids: &[String]) {
    let mut seen = Vec::new();
    store
        .for_each_final(&mut |id, _| {
            seen.push(id.to_string());
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(seen.len(), ids.len(), "every ID once");
    assert!(seen.iter().zip(ids).all(|(a, b)| a == b), "in input order");
}

/// Run a worker of the fleet's job in the background.
fn spawn_run<S: Fleet>(store: Arc<S>, spec: Arc<JobSpec>) -> tokio::task::JoinHandle<RunSummary> {
    let request = spec.work.request().unwrap().clone();
    spawn_run_against(store, spec, request)
}

/// [`spawn_run`], its calls made as `request` says (another API).
fn spawn_run_against<S: Fleet>(
    store: Arc<S>,
    spec: Arc<JobSpec>,
    request: crate::handler::http::RequestSpec,
) -> tokio::task::JoinHandle<RunSummary> {
    spawn_run_with(store, spec, request, options())
}

/// [`spawn_run_against`] with `options`.
fn spawn_run_with<S: Fleet>(
    store: Arc<S>,
    spec: Arc<JobSpec>,
    request: crate::handler::http::RequestSpec,
    options: RunOptions,
) -> tokio::task::JoinHandle<RunSummary> {
    tokio::spawn(async move {
        let handler = Arc::new(HttpHandler::new(&request).unwrap());
        run(
            store,
            spec,
            handler,
            &options,
            Arc::new(Counters::default()),
            stop_pair().1,
        )
        .await
        .unwrap()
    })
}

/// Wait (with a deadline) until `ready` says yes.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut ready: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !ready().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The IDs the two APIs were called for more than once between them.
fn called_twice<'a>(ids: &'a [String], one: &FakeApi, other: &FakeApi) -> Vec<&'a String> {
    let (one, other) = (one.calls_snapshot(), other.calls_snapshot());
    ids.iter()
        .filter(|id| one.get(*id).copied().unwrap_or(0) + other.get(*id).copied().unwrap_or(0) > 1)
        .collect()
}

async fn three_workers_share_a_job_and_call_each_id_once<D: SharedJob>() {
    let f = fleet::<D>(1200).await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        let store = f.db.worker().await;
        let (spec, api) = (f.spec.clone(), f.api.clone());
        runs.push(tokio::spawn(async move {
            let handler = Arc::new(HttpHandler::new(spec.work.request().unwrap()).unwrap());
            let counters = Arc::new(Counters::default());
            let summary = run(
                store.clone(),
                spec,
                handler,
                &options(),
                counters,
                stop_pair().1,
            )
            .await
            .unwrap();
            drop(api);
            (summary, store)
        }));
    }
    let mut calls_by_worker = Vec::new();
    let mut last = None;
    for r in runs {
        let (summary, store) = r.await.unwrap();
        assert!(summary.job.finished(), "{:?}", summary.job);
        calls_by_worker.push(summary.run.ok + summary.run.failed);
        last = Some(store);
    }
    let store = last.unwrap();
    assert_eq!(f.api.distinct_ids(), 1200);
    assert_eq!(f.api.total_calls(), 1200, "no ID called twice");
    assert_eq!(calls_by_worker.iter().sum::<u64>(), 1200);
    assert!(
        calls_by_worker.iter().filter(|&&c| c > 0).count() >= 2,
        "the work was shared: {calls_by_worker:?}"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.ok + stats.failed, stats.duplicates), (1200, 120));
    exactly_once(&*store, &f.ids).await;
}
async fn a_worker_that_lost_its_buckets_writes_nothing_that_counts<D: SharedJob>() {
    let f = fleet::<D>(70).await;
    // Plan everything with a first run stopped after a few calls.
    let planner = f.db.worker().await;
    let (handle, stop) = stop_pair();
    let api = f.api.clone();
    let watcher = tokio::spawn(async move {
        while api.total_calls() < 10 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        handle.stop();
    });
    let handler = Arc::new(HttpHandler::new(f.spec.work.request().unwrap()).unwrap());
    let counters = Arc::new(Counters::default());
    run(
        planner,
        f.spec.clone(),
        handler.clone(),
        &options(),
        counters,
        stop,
    )
    .await
    .unwrap();
    watcher.await.unwrap();
    // A leases a bucket and is paused past its TTL: its session expires.
    let a = f.db.worker().await;
    let held = a.acquire_next(Log::Job, 1).await.unwrap();
    assert_eq!(held.len(), 1);
    let LeaseScope::Bucket { bucket, .. } = held[0].scope else {
        panic!("a bucket lease")
    };
    f.db.expire(&a);
    // B takes the job over, A's bucket included, and finishes it.
    let b = f.db.worker().await;
    let summary = run(
        b.clone(),
        f.spec.clone(),
        handler,
        &options(),
        Arc::new(Counters::default()),
        stop_pair().1,
    )
    .await
    .unwrap();
    assert!(summary.job.finished());
    // A wakes up and writes its bucket as failed, then commits it: nothing counts.
    let offset = b.offset(bucket).await.unwrap().unwrap();
    let items = b.bucket_items(&offset).await.unwrap();
    let first = items[0].0.clone();
    let before = b.item(&first).await.unwrap().unwrap();
    let late: Vec<_> = items
        .into_iter()
        .map(|(id, mut r)| {
            r.status = ItemStatus::Failed;
            r.error = Some("late".into());
            r.http_status = Some(500);
            r.body = None;
            (id, r)
        })
        .collect();
    a.record(&late).await.unwrap();
    a.sync().await.unwrap();
    assert_eq!(D::fenced(&a), late.len() as u64, "every late result fenced");
    let commit = crate::store::CommitRecord {
        bucket,
        failed: late.len() as u64,
        ..Default::default()
    };
    let refused =
        crate::store::view::commit(&*a, &held[0], Log::Job, std::slice::from_ref(&commit)).await;
    assert!(refused.is_err(), "a lost lease commits nothing");
    // Nor in a group of commits, each under its own lease, as the writer sends a fleet's.
    let each = a.commit_each(&[(held[0].clone(), commit)]).await.unwrap();
    assert_eq!(
        each,
        vec![false],
        "a lost lease commits nothing in a group either"
    );
    let after = b.item(&first).await.unwrap().unwrap();
    assert_eq!(after.status, before.status);
    assert_eq!(after.error, before.error);
    assert_eq!(b.stats().await.unwrap(), summary.job);
    exactly_once(&*b, &f.ids).await;
}
/// A worker whose session expired (paused past its TTL) and who registered again holds
/// none of its old leases: the items it had queued for them are not called (their
/// results would be fenced out; the buckets are others' now), only the items of buckets
/// it leases again. A (a slow API of its own) has a queue full of its buckets' items when
/// its session expires; B (the fast API) finishes the job meanwhile. An ID is called
/// twice only if A had it in flight, or called it before it learned of the expiry.
async fn a_worker_whose_session_expired_calls_none_of_the_items_it_had_queued<D: SharedJob>() {
    let f = fleet::<D>(700).await;
    let slow = FakeApi::start(ApiConfig {
        latency_min: std::time::Duration::from_millis(300),
        latency_max: std::time::Duration::from_millis(300),
        ..f.api.config().clone()
    })
    .await
    .unwrap();
    let a = f.db.worker().await;
    let a_run = {
        let mut request = f.spec.work.request().unwrap().clone();
        request.url = slow.url_template();
        spawn_run_against(a.clone(), f.spec.clone(), request)
    };
    // A's queue is full (it leases as room frees): more than its 4 calls in flight.
    until("A calls", || {
        let slow = slow.clone();
        async move { slow.total_calls() >= 4 }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let old = a.worker_label();
    f.db.expire(&a);
    D::renew_now(&a);
    until("A learns its session expired and registers again", || {
        let (a, old) = (a.clone(), old.clone());
        async move { a.worker_label() != old }
    })
    .await;
    let called_by_a = slow.total_calls();
    let b = f.db.worker().await;
    let b_sum = spawn_run(b.clone(), f.spec.clone()).await.unwrap();
    let a_sum = tokio::time::timeout(std::time::Duration::from_secs(60), a_run)
        .await
        .expect("A ends once the job is finished")
        .unwrap();
    assert!(b_sum.job.finished() && a_sum.job.finished());
    exactly_once(&*b, &f.ids).await;
    // Every call A made after it learned of the expiry was for a bucket it leased anew
    // (without the check, 70 of its queued IDs were called twice, A having called 4).
    let twice = called_twice(&f.ids, &f.api, &slow);
    assert!(
        twice.len() as u64 <= called_by_a,
        "{} IDs called twice (A called {called_by_a} before it learned of the expiry): \
         {twice:?}",
        twice.len()
    );
}
async fn a_worker_with_the_input_takes_planning_over_from_a_dead_planner<D: SharedJob>() {
    let f = fleet::<D>(700).await;
    // X plans the first 100 rows, then dies with the planner lease.
    let x = f.db.worker().await;
    let reader = crate::input::InputReader::open_bounded(
        &f.spec.input,
        Default::default(),
        f.spec.fingerprint.len,
    )
    .unwrap();
    let mut planner = crate::plan::Planner::new(
        reader,
        Default::default(),
        f.spec.bucket_size,
        false,
        f.spec.fingerprint,
    );
    let batch = planner.next_batch(&*x, 100).await.unwrap();
    x.plan(&batch, &planner.state()).await.unwrap();
    assert_eq!(D::planning(&x).await, "planning");
    let planned_by_x = x.stats().await.unwrap().buckets_planned;
    assert!(planned_by_x > 0);
    // B has no input: it works on what X planned, then waits. C has the input, but X
    // is alive and plans: C waits too, ready to take over.
    let mut no_input = (*f.spec).clone();
    no_input.input.path = std::path::PathBuf::new();
    let b = f.db.worker().await;
    let b_run = spawn_run(b.clone(), Arc::new(no_input));
    let c = f.db.worker().await;
    let c_run = spawn_run(c.clone(), f.spec.clone());
    until("X's buckets committed", || {
        let b = b.clone();
        async move { b.stats().await.unwrap().buckets_committed == planned_by_x }
    })
    .await;
    // Two idle polls and planner polls later, both still wait for the live planner.
    tokio::time::sleep(POLL_MAX.max(PLANNER_POLL) * 2).await;
    assert!(!b_run.is_finished() && !c_run.is_finished(), "both wait");
    assert_eq!(b.stats().await.unwrap().buckets_planned, planned_by_x);
    assert!(!b.log_finished(Log::Job).await.unwrap());
    // X dies: C, still running, takes the planner lease over and plans the rest.
    f.db.expire(&x);
    let both = async { (b_run.await.unwrap(), c_run.await.unwrap()) };
    let (b_sum, c_sum) = tokio::time::timeout(std::time::Duration::from_secs(60), both)
        .await
        .expect("C plans the rest and both finish");
    assert!(b_sum.job.finished() && c_sum.job.finished());
    assert_eq!(D::planning(&c).await, "done");
    assert_eq!(f.api.total_calls(), 700, "no ID called twice");
    exactly_once(&*c, &f.ids).await;
}
/// A worker that dies mid-run (its session expires with calls in flight, its run is gone)
/// leaves its buckets to the others: B takes them over and finishes the job, every ID once
/// in the export. What A made durable is not called again; the IDs called twice are at most
/// those A had in flight or not yet written.
async fn a_worker_that_dies_mid_run_leaves_its_buckets_to_the_others<D: SharedJob>() {
    let f = fleet::<D>(700).await;
    let slow = FakeApi::start(ApiConfig {
        latency_min: Duration::from_millis(50),
        latency_max: Duration::from_millis(50),
        ..f.api.config().clone()
    })
    .await
    .unwrap();
    let a = f.db.worker().await;
    let a_run = {
        let mut request = f.spec.work.request().unwrap().clone();
        request.url = slow.url_template();
        spawn_run_against(a.clone(), f.spec.clone(), request)
    };
    until("A commits buckets", || {
        let a = a.clone();
        async move { a.stats().await.unwrap().buckets_committed >= 3 }
    })
    .await;
    // A dies: its session expires with calls in flight and results not yet written, then
    // its run is gone.
    f.db.expire(&a);
    a_run.abort();
    assert!(a_run.await.unwrap_err().is_cancelled());
    let committed_by_a = a.stats().await.unwrap().buckets_committed;
    // B takes A's buckets over (open, or leased to a session that is gone) and finishes.
    let b = f.db.worker().await;
    let b_sum = tokio::time::timeout(
        Duration::from_secs(60),
        spawn_run(b.clone(), f.spec.clone()),
    )
    .await
    .expect("B finishes the job A left")
    .unwrap();
    assert!(b_sum.job.finished(), "{:?}", b_sum.job);
    exactly_once(&*b, &f.ids).await;
    assert!(
        b_sum.run.ok + b_sum.run.failed < 700 && committed_by_a > 0,
        "what A made durable counts: B called {} of 700",
        b_sum.run.ok + b_sum.run.failed
    );
    // Called twice: only what A had in flight or not yet durable when it died.
    let twice = called_twice(&f.ids, &f.api, &slow);
    assert!(
        twice.len() <= max_unsynced_items_of(&*b, 4),
        "{} IDs called twice: {twice:?}",
        twice.len()
    );
}

#[cfg(feature = "postgres")]
async fn status_figures_counted_by_the_database_are_the_walks() {
    let f = fleet::<PgJob>(400).await;
    let a = f.db.worker().await;
    let (handle, stop) = stop_pair();
    let api = f.api.clone();
    let watcher = tokio::spawn(async move {
        while api.total_calls() < 60 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        handle.stop();
    });
    let handler = Arc::new(HttpHandler::new(f.spec.work.request().unwrap()).unwrap());
    run(
        a.clone(),
        f.spec.clone(),
        handler,
        &options(),
        Arc::new(Counters::default()),
        stop,
    )
    .await
    .unwrap();
    watcher.await.unwrap();
    // Stopped part way: committed buckets, buckets with some results, duplicates.
    let walked = crate::store::view::walked_stats(&*a).await.unwrap();
    assert!(
        walked.buckets_committed > 0 && walked.pending > 0,
        "{walked:?}"
    );
    assert_eq!(a.counted_stats().await.unwrap(), Some(walked.clone()));
    assert_eq!(a.stats().await.unwrap(), walked);
    assert!(!a.log_finished(Log::Job).await.unwrap());
    let b = f.db.worker().await;
    let done = spawn_run(b.clone(), f.spec.clone()).await.unwrap();
    let walked = crate::store::view::walked_stats(&*b).await.unwrap();
    assert!(walked.finished() && walked.duplicates == 40, "{walked:?}");
    assert_eq!(b.counted_stats().await.unwrap(), Some(walked.clone()));
    assert_eq!(done.job, walked);
    assert!(b.log_finished(Log::Job).await.unwrap());
}

/// Two workers against an API that refuses 10% of the IDs every time, at once, with
/// `Retry-After: 1`: those IDs fail with their 503 after their attempts, the others succeed,
/// and no worker pauses the fleet for them (a `Retry-After` of an ID's own refusal holds
/// that ID only; taken for the whole fleet, every refused ID paused both workers).
async fn ids_refused_every_time_do_not_pause_the_fleet() {
    let ids: Vec<String> = (0..600).map(|i| format!("r-{i}")).collect();
    let config = ApiConfig {
        latency_min: Duration::from_millis(1),
        latency_max: Duration::from_millis(1),
        unavailable_per_mille: 100,
        transient_attempts: u32::MAX,
        unavailable_retry_after_secs: Some(1),
        refusals_at_once: true,
        ..ApiConfig::fast()
    };
    let f = fleet_of::<MemJob>(ids.clone(), ids, config.clone(), 25).await;
    let first = f.db.worker().await;
    let second = f.db.worker().await;
    let runs = [
        spawn_run(first.clone(), f.spec.clone()),
        spawn_run(second.clone(), f.spec.clone()),
    ];
    for r in runs {
        assert!(r.await.unwrap().job.finished());
    }
    assert_eq!(
        first.fleet_rate().paused_until,
        None,
        "a refusal of the same IDs paused the fleet"
    );
    let mut refused = 0;
    first
        .for_each_final(&mut |id, record| {
            if config.fault(id) == crate::demo::api::Fault::Unavailable {
                refused += 1;
                assert_eq!(record.status, ItemStatus::Failed, "{id}");
                assert_eq!(record.http_status, Some(503), "{id}");
            } else {
                assert_eq!(record.status, ItemStatus::Ok, "{id}");
            }
            Ok(())
        })
        .await
        .unwrap();
    assert!(refused > 30, "{refused} IDs refused");
}

/// Workers pacing by the windows the API announces each take their part of what remains
/// (the API counts all their calls): together they meet no 429 (no window would have gone
/// above its limit), and every ID is called once.
async fn workers_divide_what_the_api_announces<D: SharedJob>(workers: usize) {
    let ids: Vec<String> = (0..240).map(|i| format!("w-{i}")).collect();
    let api = ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(2),
        windows: vec![
            ApiWindow {
                limit: 40,
                length: Duration::from_secs(1),
            },
            ApiWindow {
                limit: 120,
                length: Duration::from_secs(4),
            },
        ],
        announce: Announce::Ietf,
        ..ApiConfig::fast()
    };
    let f = fleet_of::<D>(ids.clone(), ids.clone(), api, 10).await;
    let mut runs = Vec::new();
    for _ in 0..workers {
        let store = f.db.worker().await;
        runs.push((spawn_run(store.clone(), f.spec.clone()), store));
    }
    let mut last = None;
    for (run, store) in runs {
        let summary = run.await.unwrap();
        assert!(summary.job.finished(), "{:?}", summary.job);
        last = Some(store);
    }
    // The API refuses what would take a window above its limit: none was refused.
    assert_eq!(f.api.window_refusals(), 0, "{workers} workers met 429s");
    assert_eq!(f.api.total_calls(), 240, "no ID called twice");
    exactly_once(&*last.unwrap(), &ids).await;
}

/// A newcomer whose first grant has not come back (a database's worker before its first
/// heartbeat's answer) does not know how many workers share the windows the API announces:
/// its calls wait for the grant before they take any part of them, then go as a joiner's do
/// (held until the others count it, its first call alone). Taken for a worker alone, its
/// attempts passed the windows with nothing known yet and waited for the grant at the
/// fleet's gate, to go all at once when it came: a burst of its whole concurrency into
/// windows the first worker was already pacing.
async fn a_newcomer_takes_nothing_of_the_announced_windows_before_its_grant() {
    let ids: Vec<String> = (0..300).map(|i| format!("n-{i}")).collect();
    let api = ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(2),
        windows: vec![ApiWindow {
            limit: 30,
            length: Duration::from_secs(1),
        }],
        announce: Announce::Ietf,
        ..ApiConfig::fast()
    };
    // Buckets of 10: the first worker holds what it can queue (64 items and the buckets it
    // leased ahead), the newcomer leases the others.
    let f = fleet_of::<MemJob>(ids.clone(), ids.clone(), api, 10).await;
    let first = f.db.worker().await;
    let first_run = spawn_run(first.clone(), f.spec.clone());
    until("the first worker's calls", || async {
        f.api.total_calls() >= 5
    })
    .await;
    let newcomer = f.db.worker().await;
    newcomer.withhold_grant(true);
    let request = f.spec.work.request().unwrap().clone();
    let options = RunOptions {
        concurrency: 40,
        ..options()
    };
    let newcomer_run = spawn_run_with(newcomer.clone(), f.spec.clone(), request, options);
    // Time for the newcomer to lease its buckets and bring its items to their calls: the
    // first worker's next calls, paced by the windows.
    let before = f.api.total_calls();
    until("the first worker's next calls", || async {
        f.api.total_calls() >= before + 15
    })
    .await;
    newcomer.withhold_grant(false);
    for run in [first_run, newcomer_run] {
        let summary = run.await.unwrap();
        assert!(summary.job.finished(), "{:?}", summary.job);
    }
    assert_eq!(
        f.api.window_refusals(),
        0,
        "the newcomer's calls went above an announced window"
    );
    assert_eq!(f.api.total_calls(), 300, "no ID called twice");
    exactly_once(&*newcomer, &ids).await;
}
