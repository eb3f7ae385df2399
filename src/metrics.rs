//! Metrics: a run's figures in the Prometheus text format, served over HTTP.
//!
//! Owns `--metrics-addr`: a small HTTP/1 server answering every GET with the text
//! exposition format (version 0.0.4), rendered on each scrape from
//! [`Counters`](crate::progress::Counters) and the store's figures at the start of the run
//! ([`RunView`]); nothing is kept between scrapes.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::monitor::RunView;
use crate::progress::LATENCY_BUCKETS;

/// The content type of the text format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(feature = "cli")]
pub(crate) use crate::listen::bind;

/// Connections served at once; more are closed at once (a scraper needs one or two).
pub(crate) const MAX_CONNECTIONS: usize = 32;

/// Serve scrapes until the task is aborted. Headers must arrive within hyper's header-read
/// timeout (30 s), so a client that opens a connection and sends nothing cannot hold it
/// forever; beyond `MAX_CONNECTIONS` new connections are closed unanswered.
pub(crate) async fn serve(listener: TcpListener, view: Arc<RunView>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors and the like: give other tasks time to free some.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                if conns.len() >= MAX_CONNECTIONS {
                    drop(stream);
                    continue;
                }
                let view = view.clone();
                conns.spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let view = view.clone();
                        async move { Ok::<_, Infallible>(answer(&req, &view)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

fn answer(req: &Request<Incoming>, view: &RunView) -> Response<Full<Bytes>> {
    let response = Response::builder();
    if req.method() != hyper::Method::GET {
        return response
            .status(405)
            .body(Full::new(Bytes::from_static(b"GET only\n")))
            .expect("a valid response");
    }
    response
        .header("content-type", CONTENT_TYPE)
        .body(Full::new(Bytes::from(render(view))))
        .expect("a valid response")
}

/// The whole exposition.
pub(crate) fn render(view: &RunView) -> String {
    let counters = &view.counters;
    let run = counters.snapshot();
    let job = view.figures(&run);
    let mut out = String::new();
    let worker = view.worker.as_deref();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let labels = with_worker(labels, worker);
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let one = |v: u64| vec![(String::new(), v as f64)];
    metric(
        "highwater_items",
        "gauge",
        "Unique IDs of the job by status (pending: planned, no final result yet).",
        &[
            (r#"{status="ok"}"#.into(), job.ok as f64),
            (r#"{status="failed"}"#.into(), job.failed as f64),
            (r#"{status="pending"}"#.into(), job.pending as f64),
        ],
    );
    metric(
        "highwater_run_items_total",
        "counter",
        "Items finished by this run, by status.",
        &[
            (r#"{status="ok"}"#.into(), run.ok as f64),
            (r#"{status="failed"}"#.into(), run.failed as f64),
        ],
    );
    metric(
        "highwater_run_usage_total",
        "counter",
        "What this run's calls cost, as their answers said (a language model's tokens), by kind.",
        &[
            (r#"{kind="input"}"#.into(), run.usage.input as f64),
            (r#"{kind="output"}"#.into(), run.usage.output as f64),
        ],
    );
    if let Some(spend) = view.spend(&job) {
        metric(
            "highwater_job_spend",
            "gauge",
            "What the job's calls cost so far by its prices, in units of its currency.",
            &[(String::new(), spend.spent.units())],
        );
        if let Some(p) = spend.projected {
            metric(
                "highwater_job_spend_projected",
                "gauge",
                "What the whole job will cost at its spend per row so far.",
                &[(String::new(), p.units())],
            );
        }
        if let Some(b) = spend.budget {
            metric(
                "highwater_job_budget",
                "gauge",
                "The most the job may spend by its prices.",
                &[(String::new(), b.units())],
            );
        }
    }
    let mut by_status: Vec<(String, f64)> = counters
        .http
        .statuses()
        .into_iter()
        .map(|(code, n)| (format!(r#"{{code="{code}"}}"#), n as f64))
        .collect();
    by_status.extend(
        counters
            .http
            .classes()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(class, n)| (format!(r#"{{code="none",class="{class}"}}"#), n as f64)),
    );
    metric(
        "highwater_requests_total",
        "counter",
        "API attempts by HTTP status; attempts without an answer by error class.",
        &by_status,
    );
    let (cumulative, count, sum) = counters.http.latency();
    let mut samples: Vec<(String, f64)> = LATENCY_BUCKETS
        .iter()
        .zip(&cumulative)
        .map(|(le, n)| (format!(r#"_bucket{{le="{le}"}}"#), *n as f64))
        .collect();
    samples.push((r#"_bucket{le="+Inf"}"#.into(), count as f64));
    samples.push(("_sum".into(), sum));
    samples.push(("_count".into(), count as f64));
    metric(
        "highwater_request_duration_seconds",
        "histogram",
        "API attempt latency.",
        &samples,
    );
    metric(
        "highwater_retries_total",
        "counter",
        "Attempts after an item's first.",
        &one(run.retries),
    );
    metric(
        "highwater_pages_total",
        "counter",
        "Pages of paginated IDs answered (each a call of its own).",
        &one(run.pages),
    );
    metric(
        "highwater_throttled_total",
        "counter",
        "Answers 429.",
        &one(run.throttled),
    );
    if let Some(rate) = counters.effective_rate() {
        metric(
            "highwater_rate_limit",
            "gauge",
            "The rate limit in force, requests per second (absent: no limit).",
            &[(String::new(), rate)],
        );
    }
    metric(
        "highwater_in_flight",
        "gauge",
        "API calls under way.",
        &one(run.in_flight),
    );
    metric(
        "highwater_buckets_committed",
        "gauge",
        "Buckets of the job with a commit record.",
        &one(job.buckets_committed),
    );
    metric(
        "highwater_buckets_planned",
        "gauge",
        "Buckets of the job with an offset record.",
        &one(job.buckets_planned),
    );
    metric(
        "highwater_input_rows_read",
        "gauge",
        "Input rows read so far (bad and duplicate rows included).",
        &one(job.rows_read),
    );
    if let Some(total) = view.total_rows() {
        metric(
            "highwater_input_rows",
            "gauge",
            "Rows in the whole input.",
            &one(total),
        );
    }
    let secs = |ns: u64| ns as f64 / 1e9;
    metric(
        "highwater_store_seconds_total",
        "counter",
        "Time spent writing to and syncing the store, by step.",
        &[
            (r#"{op="offset_write"}"#.into(), secs(run.plan_write_ns)),
            (r#"{op="offset_sync"}"#.into(), secs(run.plan_sync_ns)),
            (r#"{op="result_write"}"#.into(), secs(run.record_write_ns)),
            (r#"{op="result_sync"}"#.into(), secs(run.result_sync_ns)),
            (r#"{op="commit_write"}"#.into(), secs(run.commit_write_ns)),
        ],
    );
    metric(
        "highwater_store_syncs_total",
        "counter",
        "Store syncs (planner batches and result groups).",
        &one(run.store_syncs),
    );
    metric(
        "highwater_writer_backpressure_total",
        "counter",
        "Times a finished item found the result writer's queue full.",
        &one(run.writer_backpressure),
    );
    metric(
        "highwater_run_start_time_seconds",
        "gauge",
        "When this run started, Unix seconds.",
        &[(String::new(), view.started_ms as f64 / 1e3)],
    );
    out
}

/// A sample's name suffix and labels (`_bucket{le="0.1"}`, `{status="ok"}`, ``) with the
/// `worker` label first, for a worker of a shared job: each worker's series stay apart
/// when several are scraped into one Prometheus. Unchanged without a worker.
fn with_worker(labels: &str, worker: Option<&str>) -> String {
    let Some(worker) = worker else {
        return labels.to_string();
    };
    let label = format!("worker=\"{}\"", escape_label(worker));
    match labels.split_once('{') {
        Some((suffix, rest)) => format!("{suffix}{{{label},{rest}"),
        None => format!("{labels}{{{label}}}"),
    }
}

/// A label value as the text format writes it.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::with_worker;

    #[test]
    fn the_worker_label_goes_first_in_every_sample_and_nowhere_without_a_worker() {
        let w = Some("3f2a");
        assert_eq!(with_worker("", w), r#"{worker="3f2a"}"#);
        assert_eq!(
            with_worker(r#"{status="ok"}"#, w),
            r#"{worker="3f2a",status="ok"}"#
        );
        assert_eq!(
            with_worker(r#"_bucket{le="0.1"}"#, w),
            r#"_bucket{worker="3f2a",le="0.1"}"#
        );
        assert_eq!(with_worker("_sum", w), r#"_sum{worker="3f2a"}"#);
        assert_eq!(with_worker(r#"{status="ok"}"#, None), r#"{status="ok"}"#);
        assert_eq!(with_worker("", Some("a\"b")), r#"{worker="a\"b"}"#);
    }
}
