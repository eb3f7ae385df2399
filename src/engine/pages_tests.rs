//! The engine's paginated jobs over a store that keeps pages (the memory store): each page is
//! written as it comes, the final record counts them, and a run stopped mid-ID, its unsynced
//! writes lost, continues each ID at the page after its last durable one.

use std::sync::Arc;
use std::time::Duration;

use super::tests::url_job;
use super::*;
use crate::demo::api::{ApiConfig, FakeApi};
use crate::handler::http::HttpHandler;
use crate::handler::paginate::{PageStyle, PaginateSpec, ParamPlace};
use crate::spec::Work;
use crate::store::mem::MemStore;
use crate::store::{ItemStatus, JobView, Store};

/// Items a page.
const SIZE: u64 = 10;

struct Paged {
    _dir: tempfile::TempDir,
    store: Arc<MemStore>,
    spec: Arc<JobSpec>,
    api: FakeApi,
}

/// A job over `ids` asking the fake API's cursor route, `SIZE` items a page.
async fn paged(ids: &[String], config: ApiConfig) -> Paged {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.txt");
    std::fs::write(&input, ids.join("\n")).unwrap();
    let api = FakeApi::start(config).await.unwrap();
    let store = Arc::new(MemStore::new());
    let url = format!("{}?limit={SIZE}", api.pages_cursor_url_template());
    let mut spec = url_job(&*store, input, url, 10).await;
    let request = spec.work.request().unwrap().clone();
    spec.work = Work::Paged {
        request,
        paginate: PaginateSpec {
            style: PageStyle::Cursor {
                program: ".next_cursor".into(),
                param: ParamPlace::Query("cursor".into()),
            },
            items: ".data[]".into(),
            max_pages: 1000,
        },
    };
    store.put_job(&spec.to_stored()).await.unwrap();
    Paged {
        _dir: dir,
        store,
        spec: Arc::new(spec),
        api,
    }
}

/// A run at concurrency 4, stopped once the API has seen `stop_at` calls (none: to its end).
async fn run_paged(p: &Paged, stop_at: Option<u64>) -> RunSummary {
    let Work::Paged { request, paginate } = &p.spec.work else {
        unreachable!("a paged job");
    };
    let handler = HttpHandler::new(request)
        .unwrap()
        .with_pagination(paginate)
        .unwrap();
    let opts = RunOptions {
        concurrency: 4,
        progress_interval: Duration::ZERO,
        ..RunOptions::default()
    };
    let (handle, stop) = stop_pair();
    let stopper = stop_at.map(|calls| {
        let api = p.api.clone();
        tokio::spawn(async move {
            while api.total_calls() < calls {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            handle.stop();
        })
    });
    let summary = run(
        p.store.clone(),
        p.spec.clone(),
        Arc::new(handler),
        &opts,
        Arc::new(Counters::default()),
        stop,
    )
    .await
    .unwrap();
    // A run that ended before its stop: the stopper waits no longer.
    if let Some(stopper) = stopper {
        stopper.abort();
    }
    summary
}

/// Every ID's record is ok, counts its pages, and reads back as its items in order.
async fn check_items(p: &Paged, ids: &[String]) {
    let mut seen = Vec::new();
    let mut records = Vec::new();
    p.store
        .for_each_final(&mut |id, r| {
            seen.push(id.to_string());
            records.push((id.to_string(), r.clone()));
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(seen, ids, "every ID once, in input order");
    for (id, r) in records {
        assert_eq!(r.status, ItemStatus::Ok, "{id}: {r:?}");
        let want = p.api.page_items(&id);
        assert_eq!(
            r.pages,
            Some((want.len() as u64).div_ceil(SIZE).max(1) as u32),
            "{id}: its pages"
        );
        let body: Vec<serde_json::Value> =
            serde_json::from_str(r.body.as_ref().expect("the items, joined").get()).unwrap();
        assert!(body == want, "{id}: the list's items, in order");
    }
    let stored = p.store.item(&ids[0]).await.unwrap().unwrap();
    assert!(stored.body.is_none(), "the record itself holds no body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_page_is_stored_and_the_record_counts_them() {
    let ids: Vec<String> = ["p0-a", "p9-b", "p10-c", "p95-d"]
        .map(String::from)
        .to_vec();
    let p = paged(&ids, ApiConfig::fast()).await;
    let summary = run_paged(&p, None).await;
    assert!(summary.job.finished());
    check_items(&p, &ids).await;
    // One request per page: 1 + 1 + 1 + 10.
    assert_eq!(p.api.total_calls(), 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_mid_id_continues_each_id_after_its_last_durable_page() {
    let ids: Vec<String> = (0..8).map(|i| format!("p400-{i}")).collect();
    let config = ApiConfig {
        latency_min: Duration::from_millis(1),
        latency_max: Duration::from_millis(2),
        ..ApiConfig::fast()
    };
    let p = paged(&ids, config).await;
    p.api.keep_requests();
    let first = run_paged(&p, Some(120)).await;
    assert!(first.interrupted && !first.job.finished());
    // What a kill -9 would leave: only what was synced.
    p.store.crash();
    let second = run_paged(&p, None).await;
    assert!(second.job.finished());
    check_items(&p, &ids).await;
    // 8 IDs of 40 pages: every page once, but those in flight at the stop.
    let clean = 8 * 40;
    let calls = p.api.total_calls();
    assert!(
        (clean..=clean + 4).contains(&calls),
        "{calls} calls for {clean} pages: a stopped run's pages are not asked again"
    );
    for id in &ids {
        let first_pages = p
            .api
            .seen(id)
            .iter()
            .filter(|r| !r.target.contains("cursor="))
            .count();
        assert_eq!(first_pages, 1, "{id}: its first page was asked for once");
    }
}
