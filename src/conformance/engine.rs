//! The engine's invariants over a backend: the real engine runs, stops, resumes and ends
//! with every ID exactly once, every write and sync it made logged by
//! [`crate::engine::audit::Audit`], which checks invariants 1 and 2 on that log.

use std::sync::Arc;

use super::backend::Backend;
use super::fixtures::finals;
use crate::engine::audit::Audit;

pub(super) async fn the_engine_stops_and_resumes_every_id_exactly_once<B: Backend>(b: &mut B) {
    use crate::demo::api::{ApiConfig, FakeApi};
    use crate::engine;
    use crate::handler::http::HttpHandler;
    use crate::input::{InputFormat, InputSpec};
    use crate::job::{open_job, JobRequest, RunOptions};
    use crate::progress::Counters;
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..1500).map(|i| format!("c-{i}")).collect();
    let input = dir.path().join("ids.txt");
    // Some IDs twice: duplicates are not called.
    let mut rows = ids.clone();
    rows.extend(ids[..100].iter().cloned());
    std::fs::write(&input, rows.join("\n")).unwrap();
    let config = ApiConfig {
        latency_min: std::time::Duration::from_micros(200),
        latency_max: std::time::Duration::from_millis(1),
        not_found_per_mille: 30,
        ..ApiConfig::fast()
    };
    let api = FakeApi::start(config).await.unwrap();
    let s = b.create();
    let request = JobRequest {
        input: Some(InputSpec {
            path: input,
            format: InputFormat::Text,
        }),
        url: Some(api.url_template()),
        bucket_size: Some(7),
        ..JobRequest::default()
    };
    let spec = Arc::new(open_job(&*s, &request).await.unwrap());
    let handler = Arc::new(HttpHandler::new(spec.work.request().unwrap()).unwrap());
    let opts = RunOptions {
        concurrency: 8,
        progress_interval: std::time::Duration::ZERO,
        durability: crate::job::Durability::Async {
            interval: std::time::Duration::from_millis(20),
        },
        ..RunOptions::default()
    };
    let (stop_handle, stop) = engine::stop_pair();
    let watcher = tokio::spawn({
        let api = api.clone();
        async move {
            while api.total_calls() < 600 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            stop_handle.stop();
        }
    });
    // The write-ahead and commit order (engine invariants 1 and 2) checked on the log of
    // every write and sync the store saw.
    let audit = Arc::new(Audit::new(s.clone(), false));
    let first = engine::run(
        audit.clone(),
        spec.clone(),
        handler.clone(),
        &opts,
        Arc::new(Counters::default()),
        stop,
    )
    .await
    .unwrap();
    watcher.await.unwrap();
    let (commits, _) = audit.check();
    assert!(commits > 0, "the stopped run committed buckets");
    drop(audit);
    assert!(
        first.interrupted && !first.job.finished(),
        "{:?}",
        first.job
    );
    assert_eq!(
        first.job.ok + first.job.failed,
        first.run.ok + first.run.failed
    );
    let s = b.crash(s);
    // The resume in the other durability mode (a log only checks the runs that planned).
    let sync_progress = RunOptions {
        durability: crate::job::Durability::Sync,
        ..opts
    };
    let second = engine::run(
        s.clone(),
        spec,
        handler,
        &sync_progress,
        Arc::new(Counters::default()),
        engine::stop_pair().1,
    )
    .await
    .unwrap();
    assert!(second.job.finished(), "{:?}", second.job);
    assert_eq!(second.job.ok + second.job.failed, 1500);
    assert_eq!(second.job.duplicates, 100);
    assert_eq!(api.distinct_ids(), 1500);
    let unsynced = engine::max_unsynced_items_of(&*s, 8);
    let bound = 1500 + unsynced as u64;
    assert!(api.total_calls() <= bound, "{} calls", api.total_calls());
    let exported = finals(&*s).await.unwrap();
    let mut seen: Vec<&str> = exported.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(seen.len(), 1500, "every ID once, in input order");
    assert!(seen.iter().zip(&ids).all(|(a, b)| a == b));
    seen.dedup();
    assert_eq!(seen.len(), 1500);
}
