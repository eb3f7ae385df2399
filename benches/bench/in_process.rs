//! highwater in this process: a job over the fake API built with the library's front door
//! ([`Job`]: a fresh state directory, the HTTP handler), the one way the in-process modes
//! (throughput, durability, rate, capacity) set up a run; and [`timed_run`], which runs one
//! to its end and checks it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use highwater::demo::api::FakeApi;
use highwater::handler::http::HttpHandler;
use highwater::job::{Job, RequestSpec, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT};
use highwater::progress::CounterSnapshot;

use crate::machine::process_cpu;
use crate::scratch::dir_size;

/// The request of a job over `url` as the command line makes it by default (GET, the
/// default timeouts).
pub fn request(url: String) -> RequestSpec {
    RequestSpec {
        method: "GET".into(),
        url,
        headers: Vec::new(),
        body: None,
        connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        timeout: DEFAULT_TIMEOUT,
    }
}

/// A job over the IDs of `input` against `api`, kept in the state directory `state`; the
/// caller adds its options, bucket size, retry policy.
pub fn http_job(api: &FakeApi, input: &Path, state: &Path) -> Result<Job<HttpHandler>> {
    let handler =
        HttpHandler::new(&request(api.url_template())).context("building the request handler")?;
    Ok(Job::new(handler)
        .name("bench")
        .state_dir(state)
        .input_file(input))
}

/// One run of a job to its end.
pub struct HwRun {
    /// From `Job::run` (store opened, job created) to the summary.
    pub elapsed: Duration,
    /// CPU time of this whole process (the fake API included).
    pub cpu: Duration,
    /// Calls the fake API counted.
    pub calls: u64,
    /// Allocated bytes of the state directory afterwards.
    pub state_bytes: u64,
    pub counters: CounterSnapshot,
}

/// Runs `job` (over `n` IDs, against `api`, kept in `state`) and checks that it finished
/// with every ID ok; the state directory is removed afterwards unless `keep`.
pub async fn timed_run(
    job: Job<HttpHandler>,
    api: &FakeApi,
    state: &Path,
    n: u64,
    keep: bool,
) -> Result<HwRun> {
    let calls_before = api.total_calls();
    let cpu = process_cpu();
    let started = Instant::now();
    let summary = job.run().await.context("highwater run")?;
    let elapsed = started.elapsed();
    let cpu = process_cpu().saturating_sub(cpu);
    let calls = api.total_calls() - calls_before;
    if !summary.job.finished() || summary.job.ok != n || summary.run.ok != n {
        bail!(
            "the highwater run did not finish with {n} ok:\n{}",
            summary.render()
        );
    }
    let state_bytes = dir_size(state).1;
    if !keep {
        let _ = std::fs::remove_dir_all(state);
    }
    Ok(HwRun {
        elapsed,
        cpu,
        calls,
        state_bytes,
        counters: summary.run,
    })
}
