//! The engine's unit tests: runs over a real sled store against the fake API, and over a
//! store that logs every write and sync, checking the write-ahead and commit order.

use std::collections::HashMap;
use std::time::Duration;

use super::audit::Audit;
use super::dispatcher::work_queue;
use super::stop::{Halt, HaltOnPanic};
use super::worker::Abandon;
use super::*;
use crate::demo::api::{ApiConfig, FakeApi, Fault};
use crate::handler::http::HttpHandler;
use crate::input::{Fingerprint, InputFormat, InputReader, InputSpec};
use crate::plan::Planner;
use crate::spec::Durability;
use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};
use crate::store::{ItemRecord, ItemStatus, JobView, Store};

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<SledStore>,
    spec: Arc<JobSpec>,
    api: FakeApi,
}

async fn setup(ids: &[String], bucket_size: u64, config: ApiConfig) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.txt");
    std::fs::write(&input, ids.join("\n")).unwrap();
    let api = FakeApi::start(config).await.unwrap();
    let store = SledStore::open(
        &dir.path().join("state"),
        OpenMode::CreateIfMissing,
        DEFAULT_CACHE_BYTES,
    )
    .unwrap();
    let spec = url_job(&store, input, api.url_template(), bucket_size).await;
    Setup {
        _dir: dir,
        store: Arc::new(store),
        spec: Arc::new(spec),
        api,
    }
}

/// Store a new job that asks `url` for each ID of the text file `input`, as a creation with
/// these flags would (the engine runs what the job layer created; it does not create).
pub(super) async fn url_job<S: Store>(
    store: &S,
    input: std::path::PathBuf,
    url: String,
    bucket_size: u64,
) -> JobSpec {
    let fingerprint = Fingerprint::of_file(&input).unwrap();
    let mut spec = JobSpec::new(
        InputSpec {
            path: input,
            format: InputFormat::Text,
        },
        fingerprint,
    );
    if let crate::spec::Work::Request(request) = &mut spec.work {
        request.url = url;
    }
    spec.bucket_size = bucket_size;
    store.put_job(&spec.to_stored()).await.unwrap();
    spec
}

async fn run_once(s: &Setup, stop: Stop) -> RunSummary {
    run_with(s.store.clone(), s, stop, Durability::Sync).await
}

async fn run_with<T: Store + Leases>(
    store: Arc<T>,
    s: &Setup,
    stop: Stop,
    durability: Durability,
) -> RunSummary {
    try_run_with(store, s, stop, durability).await.unwrap()
}

/// A run at concurrency 4 over `store`.
async fn try_run_with<T: Store + Leases>(
    store: Arc<T>,
    s: &Setup,
    stop: Stop,
    durability: Durability,
) -> Result<RunSummary, EngineError> {
    let handler = Arc::new(HttpHandler::new(s.spec.work.request().unwrap()).unwrap());
    let opts = RunOptions {
        concurrency: 4,
        progress_interval: Duration::ZERO,
        durability,
        ..RunOptions::default()
    };
    run(
        store,
        s.spec.clone(),
        handler,
        &opts,
        Arc::new(Counters::default()),
        stop,
    )
    .await
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("e-{i}")).collect()
}

/// A run stopped once the API has seen `calls` calls.
async fn stopped_after(s: &Setup, calls: u64, durability: Durability) -> RunSummary {
    let (handle, stop) = stop_pair();
    let api = s.api.clone();
    let stopper = tokio::spawn(async move {
        while api.total_calls() < calls {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        handle.stop();
    });
    let summary = run_with(s.store.clone(), s, stop, durability).await;
    stopper.await.unwrap();
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_commits_every_bucket_and_calls_each_id_once() {
    let ids = ids(2500);
    let s = setup(&ids, 100, ApiConfig::fast()).await;
    let summary = run_once(&s, stop_pair().1).await;
    assert!(summary.job.finished());
    assert_eq!((summary.job.ok, summary.job.failed), (2500, 0));
    assert_eq!(summary.job.buckets_committed, 25);
    assert_eq!(s.api.total_calls(), 2500);
    assert_eq!(s.api.distinct_ids(), 2500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_calls_only_items_without_a_final_result() {
    let ids = ids(300);
    let s = setup(&ids, 100, ApiConfig::fast()).await;
    // Plan everything ahead as a crashed run would have, and finish some items of bucket 1.
    let reader = InputReader::open(&s.spec.input, Default::default()).unwrap();
    let mut planner = Planner::new(reader, Default::default(), 100, false, s.spec.fingerprint);
    let batch = planner.next_batch(&*s.store, 1000).await.unwrap();
    s.store.plan(&batch, &planner.state()).await.unwrap();
    let mut done = Vec::new();
    for (row, id) in batch[1].items.iter().take(60) {
        let mut r = ItemRecord::pending(*row, 1);
        r.status = ItemStatus::Ok;
        r.attempts = 1;
        r.body = Some(serde_json::value::to_raw_value(&"earlier").unwrap());
        done.push((id.clone(), r));
    }
    s.store.record(&done).await.unwrap();
    s.store.sync().await.unwrap();

    let summary = run_once(&s, stop_pair().1).await;
    assert!(summary.job.finished());
    assert_eq!(summary.job.ok, 300);
    assert_eq!(
        s.api.total_calls(),
        240,
        "the 60 finished items are not called again"
    );
    for (id, _) in &done {
        assert_eq!(s.api.calls(id), 0);
    }
    let items = s.store.bucket_items(&batch[1].offset).await.unwrap();
    assert_eq!(
        items[0].1.body.as_ref().unwrap().get(),
        "\"earlier\"",
        "replays keep earlier results"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_leaves_a_consistent_store_that_resumes() {
    let ids = ids(3000);
    let config = ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(2),
        ..ApiConfig::fast()
    };
    let s = setup(&ids, 50, config).await;
    let first = stopped_after(&s, 500, Durability::Sync).await;
    assert!(first.interrupted);
    assert!(!first.job.finished());
    assert_eq!(
        first.job.ok, first.run.ok,
        "every result this run reported is in the store"
    );
    let second = run_once(&s, stop_pair().1).await;
    assert!(second.job.finished());
    assert_eq!(second.job.ok, 3000);
    assert_eq!(s.api.distinct_ids(), 3000);
    assert!(s.api.total_calls() <= 3000 + max_unsynced_items(4) as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_handler_runs_a_job_under_the_same_retries_and_store() {
    use crate::failure::{ErrorClass, Failure};
    use std::sync::Mutex;
    let ids = ids(600);
    let s = setup(&ids, 50, ApiConfig::fast()).await;
    let calls = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let handler = {
        let calls = calls.clone();
        move |id: String| {
            let calls = calls.clone();
            async move {
                let n: u64 = id[2..].parse().unwrap();
                let attempt = {
                    let mut calls = calls.lock().unwrap();
                    let c = calls.entry(id.clone()).or_default();
                    *c += 1;
                    *c
                };
                match n % 10 {
                    0 => Err(Failure::permanent(format!("{id} is refused"))),
                    1 if attempt < 3 => Err(Failure::retry("not yet")),
                    2 if attempt < 2 => Err(Failure::too_many("busy", None).status(429)),
                    _ => Ok(serde_json::json!({ "id": id, "double": n * 2 })),
                }
            }
        }
    };
    let opts = RunOptions {
        concurrency: 8,
        progress_interval: Duration::ZERO,
        ..RunOptions::default()
    };
    let mut spec = (*s.spec).clone();
    spec.retry.initial = Duration::from_millis(1);
    spec.retry.max_interval = Duration::from_millis(2);
    let summary = run(
        s.store.clone(),
        Arc::new(spec),
        Arc::new(handler),
        &opts,
        Arc::new(Counters::default()),
        stop_pair().1,
    )
    .await
    .unwrap();
    assert!(summary.job.finished());
    assert_eq!((summary.job.ok, summary.job.failed), (540, 60));
    assert_eq!(s.api.total_calls(), 0, "the closure did the work");
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls["e-10"], 1, "a permanent failure is not retried");
    assert_eq!(calls["e-11"], 3);
    assert_eq!(calls["e-12"], 2);
    assert_eq!(calls["e-13"], 1);
    let offset = s.store.offset(0).await.unwrap().unwrap();
    let items: HashMap<_, _> = s
        .store
        .bucket_items(&offset)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let failed = &items["e-10"];
    assert_eq!(failed.status, ItemStatus::Failed);
    assert_eq!(failed.class, Some(ErrorClass::Handler));
    assert_eq!(failed.error.as_deref(), Some("e-10 is refused"));
    let ok = &items["e-12"];
    assert_eq!(
        ok.body.as_ref().unwrap().get(),
        r#"{"double":24,"id":"e-12"}"#
    );
    assert_eq!(
        (ok.attempts, ok.attempt_errors[0].http_status),
        (2, Some(429))
    );
}

#[tokio::test]
async fn a_panicking_worker_halts_the_run_and_an_aborted_one_counts_its_item_abandoned() {
    let (handle, stop) = stop_pair();
    let halt = Arc::new(Halt::new(handle));
    let panicking = tokio::spawn({
        let halt = halt.clone();
        async move {
            let _guard = HaltOnPanic(&halt);
            panic!("a bug in an item");
        }
    });
    assert!(panicking.await.unwrap_err().is_panic());
    assert!(stop.is_stopping(), "the panic stopped the run");
    let halted = halt.reason().unwrap();
    assert!(halted.reason.contains("panicked"));
    assert_eq!(halted.kind, crate::progress::HaltKind::Internal);
    // A worker ending normally halts nothing.
    let (handle, stop) = stop_pair();
    let calm = Halt::new(handle);
    drop(HaltOnPanic(&calm));
    assert!(!stop.is_stopping());

    let counters = Counters::default();
    let mut finished = Abandon(Some(&counters), 1);
    finished.0 = None;
    drop(finished);
    drop(Abandon(Some(&counters), 1));
    assert_eq!(counters.snapshot().abandoned, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failures_are_recorded_and_committed() {
    let ids = ids(1000);
    let config = ApiConfig {
        not_found_per_mille: 50,
        ..ApiConfig::fast()
    };
    let s = setup(&ids, 100, config).await;
    let summary = run_once(&s, stop_pair().1).await;
    let not_found = ids
        .iter()
        .filter(|id| s.api.fault(id) == Fault::NotFound)
        .count() as u64;
    assert!(not_found > 0);
    assert_eq!(summary.job.failed, not_found);
    assert_eq!(summary.job.ok + summary.job.failed, 1000);
    assert!(summary.job.finished());
}

async fn audited_run(bucket_size: u64, durability: Durability) {
    let ids = ids(3000);
    let config = ApiConfig {
        latency_min: Duration::from_micros(200),
        latency_max: Duration::from_millis(2),
        not_found_per_mille: 20,
        ..ApiConfig::fast()
    };
    let s = setup(&ids, bucket_size, config).await;
    let audit = Arc::new(Audit::new(s.store.clone(), false));
    let summary = run_with(audit.clone(), &s, stop_pair().1, durability).await;
    assert!(summary.job.finished());
    assert_eq!(summary.job.ok + summary.job.failed, 3000);
    assert_eq!(s.api.total_calls(), 3000);
    let (commits, syncs) = audit.check();
    assert_eq!(commits as u64, 3000_u64.div_ceil(bucket_size));
    assert!(syncs >= 2, "{syncs} syncs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_writer_stops_the_calls_and_fails_the_run() {
    for durability in [
        Durability::Sync,
        Durability::Async {
            interval: Duration::from_millis(50),
        },
    ] {
        // One bucket of 3000: nothing at a bucket boundary would notice the writer.
        let ids = ids(3000);
        let s = setup(&ids, 3000, ApiConfig::fast()).await;
        let audit = Arc::new(Audit::new(s.store.clone(), true));
        let result = try_run_with(audit, &s, stop_pair().1, durability).await;
        let err = result.expect_err("the run fails");
        assert!(err.to_string().contains("injected write failure"), "{err}");
        // The calls stop soon after the first failed write: at most what was in flight,
        // queued for the writer or queued for the workers by then.
        let calls = s.api.total_calls();
        let bound = (max_unsynced_items(4) + work_queue(4)) as u64;
        assert!(
            calls <= bound,
            "{durability:?}: {calls} calls after the writer failed (bound {bound})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_progress_keeps_the_write_ahead_and_commit_order() {
    audited_run(1, Durability::Sync).await;
    audited_run(100, Durability::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_progress_keeps_the_write_ahead_and_commit_order() {
    let durability = Durability::Async {
        interval: Duration::from_millis(20),
    };
    audited_run(1, durability).await;
    audited_run(100, durability).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_progress_stopped_midway_resumes_in_sync_mode() {
    let ids = ids(3000);
    let config = ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(2),
        ..ApiConfig::fast()
    };
    let s = setup(&ids, 10, config).await;
    let durability = Durability::Async {
        interval: Duration::from_secs(3600),
    };
    let first = stopped_after(&s, 700, durability).await;
    assert!(first.interrupted && !first.job.finished());
    assert_eq!(
        first.job.ok, first.run.ok,
        "a stop makes every result durable"
    );
    assert!(
        first.job.buckets_committed >= first.run.ok / 10 - 4,
        "a stop commits the finished buckets even before the first checkpoint: {:?}",
        first.job
    );
    let second = run_once(&s, stop_pair().1).await;
    assert!(second.job.finished());
    assert_eq!(second.job.ok, 3000);
    assert_eq!(s.api.distinct_ids(), 3000);
    assert!(s.api.total_calls() <= 3000 + max_unsynced_items(4) as u64);
}

/// A worker that panics holding the halt's lock poisons it; the run's halt (by the writer,
/// the controller, or the other workers) goes on instead of panicking in turn.
#[test]
fn a_halt_works_on_after_a_panic_poisoned_its_lock() {
    let (stop, watched) = stop_pair();
    let halt = Halt::new(stop);
    std::thread::scope(|s| {
        let _ = s
            .spawn(|| {
                let _guard = halt.reason.lock();
                panic!("a worker panics holding the halt's lock");
            })
            .join();
    });
    assert!(halt.reason.is_poisoned());
    halt.halt(crate::progress::HaltKind::Outage, "the API is out".into());
    assert_eq!(
        halt.reason().map(|h| h.reason).as_deref(),
        Some("the API is out")
    );
    assert!(watched.is_stopping());
}

/// A handler whose credential is refused on each ID's first attempt (renewed: retried at
/// once, free), and rejected outright for the IDs in `rejected`.
async fn run_with_refusals(s: &Setup, rejected: &'static [&'static str]) -> RunSummary {
    use crate::failure::{Failure, Next};
    let refused = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let handler = Arc::new(move |id: String| {
        let first = refused.lock().unwrap().insert(id.clone());
        async move {
            let refusal = |next| Failure {
                next,
                ..Failure::permanent("HTTP 401").status(401)
            };
            if rejected.contains(&id.as_str()) {
                return Err(refusal(Next::CredentialRejected));
            }
            if first {
                return Err(refusal(Next::Renewed));
            }
            Ok(serde_json::json!({ "id": id }))
        }
    });
    let mut spec = (*s.spec).clone();
    // One attempt, no retry time: a renewed credential's retry must use neither.
    spec.retry.max_attempts = 1;
    spec.retry.max_elapsed = Duration::ZERO;
    let opts = RunOptions {
        concurrency: 4,
        progress_interval: Duration::ZERO,
        ..RunOptions::default()
    };
    run(
        s.store.clone(),
        Arc::new(spec),
        handler,
        &opts,
        Arc::new(Counters::default()),
        stop_pair().1,
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_credential_is_retried_using_no_attempt() {
    let ids = ids(200);
    let s = setup(&ids, 50, ApiConfig::fast()).await;
    let summary = run_with_refusals(&s, &[]).await;
    assert!(summary.halted.is_none(), "{:?}", summary.halted);
    assert_eq!((summary.job.ok, summary.job.failed), (200, 0));
    assert_eq!(summary.run.attempts, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_credential_halts_the_run_and_fails_no_id() {
    let ids = ids(200);
    let s = setup(&ids, 50, ApiConfig::fast()).await;
    let summary = run_with_refusals(&s, &["e-120"]).await;
    let halted = summary.halted.expect("the run halted");
    assert_eq!(halted.kind, crate::progress::HaltKind::CredentialRejected);
    assert!(halted.reason.contains("HTTP 401"), "{}", halted.reason);
    assert!(!summary.job.finished());
    assert_eq!(summary.job.failed, 0);
    assert!(summary.job.pending > 0);
    let record = s.store.item("e-120").await.unwrap();
    assert!(
        record.as_ref().is_none_or(|r| !r.is_final()),
        "e-120 stays pending: {record:?}"
    );
}

/// An API out of credit from `e-120` on (a 402 to it and to every later call): the run
/// halts as out of credit, no ID fails, and `e-120` is left to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_out_of_credit_halts_the_run_and_fails_no_id() {
    use crate::failure::Failure;
    use std::sync::atomic::{AtomicBool, Ordering};
    let ids = ids(200);
    let s = setup(&ids, 50, ApiConfig::fast()).await;
    let spent = Arc::new(AtomicBool::new(false));
    let handler = Arc::new(move |id: String| {
        let spent = spent.clone();
        async move {
            if id == "e-120" {
                spent.store(true, Ordering::SeqCst);
            }
            if spent.load(Ordering::SeqCst) {
                return Err(Failure::out_of_credit("HTTP 402 Payment Required").status(402));
            }
            Ok(serde_json::json!({ "id": id }))
        }
    });
    let opts = RunOptions {
        concurrency: 4,
        progress_interval: Duration::ZERO,
        ..RunOptions::default()
    };
    let summary = run(
        s.store.clone(),
        s.spec.clone(),
        handler,
        &opts,
        Arc::new(Counters::default()),
        stop_pair().1,
    )
    .await
    .unwrap();
    let halted = summary.halted.expect("the run halted");
    assert_eq!(halted.kind, crate::progress::HaltKind::OutOfCredit);
    assert!(halted.reason.contains("out of credit"), "{}", halted.reason);
    assert!(halted.reason.contains("HTTP 402"), "{}", halted.reason);
    assert_eq!(summary.job.failed, 0);
    assert!(summary.job.pending > 0);
    let record = s.store.item("e-120").await.unwrap();
    assert!(
        record.as_ref().is_none_or(|r| !r.is_final()),
        "e-120 stays pending: {record:?}"
    );
}
