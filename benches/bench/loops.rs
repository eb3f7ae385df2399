//! Bare client loops, nothing stored: a hyper client (the most the machine does) and
//! highwater's own HTTP handler (the most any engine on it could do), each `concurrency`
//! tasks pulling IDs until `n` were fetched.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use highwater::demo::api::FakeApi;
use highwater::handler::http::HttpHandler;

use crate::in_process::request;
use crate::machine::process_cpu;
use crate::scratch::id_of;

/// Wall time and CPU time (whole process, the in-process fake API included) of one run.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub elapsed: Duration,
    pub cpu: Duration,
}

/// highwater's own HTTP client (`HttpHandler::attempt`: reqwest, the URL template, the body
/// parse) in a bare loop of `concurrency` tasks, nothing stored: the ceiling any engine built
/// on this client could reach.
pub async fn reqwest_run(api: &FakeApi, n: u64, concurrency: usize) -> Result<Measured> {
    reqwest_loop(api.url_template(), n, concurrency).await
}

/// [`reqwest_run`] against any URL template.
pub async fn reqwest_loop(url: String, n: u64, concurrency: usize) -> Result<Measured> {
    let handler = Arc::new(HttpHandler::new(&request(url)).context("building the handler")?);
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let cpu = process_cpu();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (handler, next, errors) = (handler.clone(), next.clone(), errors.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                if handler.attempt(&id_of(i)).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| anyhow!("reqwest client task: {e}"))?;
    }
    let measured = Measured {
        elapsed: started.elapsed(),
        cpu: process_cpu().saturating_sub(cpu),
    };
    let errors = errors.load(Ordering::Relaxed);
    if errors > 0 {
        bail!("the reqwest loop had {errors} failed requests");
    }
    Ok(measured)
}

pub type RawClient = Client<HttpConnector, Empty<Bytes>>;

pub fn raw_client(concurrency: usize) -> RawClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true); // as highwater's reqwest client
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .build(connector)
}

/// `concurrency` tasks pulling indices until `n` IDs were fetched; returns the time taken
/// and the body bytes read.
pub async fn raw_run(
    client: &RawClient,
    api: &FakeApi,
    n: u64,
    concurrency: usize,
) -> Result<(Measured, u64)> {
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let base = format!("http://{}/items/", api.addr());
    let cpu = process_cpu();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next, errors, base) =
            (client.clone(), next.clone(), errors.clone(), base.clone());
        tasks.spawn(async move {
            let mut body_bytes = 0u64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let uri: hyper::Uri = match format!("{base}{}", id_of(i)).parse() {
                    Ok(u) => u,
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                match client.get(uri).await {
                    Ok(resp) => {
                        let ok = resp.status() == 200;
                        match resp.into_body().collect().await {
                            Ok(b) if ok => body_bytes += b.to_bytes().len() as u64,
                            _ => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            body_bytes
        });
    }
    let mut body_bytes = 0;
    while let Some(done) = tasks.join_next().await {
        body_bytes += done.map_err(|e| anyhow!("raw client task: {e}"))?;
    }
    let measured = Measured {
        elapsed: started.elapsed(),
        cpu: process_cpu().saturating_sub(cpu),
    };
    let errors = errors.load(Ordering::Relaxed);
    if errors > 0 {
        bail!("the raw client had {errors} failed requests");
    }
    Ok((measured, body_bytes))
}
