//! An HTTP enrichment job built with the library: one GET per ID against a loopback API
//! (the `demo` feature's fake API, started here: nothing leaves the machine), some of whose
//! IDs are missing (404: failed for good) or briefly unavailable (503: retried).

use std::time::Duration;

use highwater::demo::api::{ApiConfig, FakeApi, Fault};
use highwater::handler::http::{HttpHandler, RequestSpec};
use highwater::{Job, Results, RetryPolicy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let api = FakeApi::start(ApiConfig {
        not_found_per_mille: 50,
        unavailable_per_mille: 50,
        transient_attempts: 1,
        ..ApiConfig::fast()
    })
    .await?;
    let handler = HttpHandler::new(&RequestSpec {
        method: "GET".into(),
        url: api.url_template(),
        headers: vec!["Accept: application/json".into()],
        body: None,
        connect_timeout: Duration::from_secs(5),
        timeout: Duration::from_secs(10),
    })?;
    let state = tempfile::tempdir()?;
    let ids: Vec<String> = (0..500).map(|n| format!("user-{n}")).collect();
    let summary = Job::new(handler)
        .name("user-lookup")
        .ids(ids.clone())
        .state_dir(state.path())
        .concurrency(32)
        .retry(RetryPolicy {
            initial: Duration::from_millis(10),
            max_interval: Duration::from_millis(50),
            ..RetryPolicy::default()
        })
        .run()
        .await?;
    println!("ok {} failed {}", summary.job.ok, summary.job.failed);

    // Each stored answer is the API's body; each failure is one of its missing IDs.
    let records = Results::open(state.path())?
        .all::<serde_json::Value>()
        .await?;
    let answers_match = records
        .iter()
        .filter_map(|r| r.result.as_ref().map(|body| (r, body)))
        .all(|(r, body)| *body == api.expected_body(&r.id));
    let missing = ids
        .iter()
        .filter(|id| matches!(api.fault(id), Fault::NotFound))
        .count();
    let failed: Vec<_> = records.iter().filter(|r| r.result.is_none()).collect();
    let failures_are_404s =
        failed.len() == missing && failed.iter().all(|r| r.http_status == Some(404));
    println!("records {}", records.len());
    println!("answers match the API: {answers_match}");
    println!("failures are its {missing} missing IDs: {failures_are_404s}");
    println!(
        "API calls {} for {} IDs",
        api.total_calls(),
        api.distinct_ids()
    );
    Ok(())
}
