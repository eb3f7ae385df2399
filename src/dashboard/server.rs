//! The dashboard's HTTP server: `GET /` the page, `GET /api/*` its data as JSON; nothing
//! else (read-only: every other method is refused).
//!
//! While another process's run holds the job's state directory and serves the job's
//! dashboard itself (its address is in `live.json`), every `/api/*` request is relayed to
//! that run, which reads its own store: the page is the same, every panel live. If the run
//! cannot be reached (it has just ended), the request is answered here.
//!
//! Readings are shared between requests for a moment ([`FRESH_LIVE`] while a run is active,
//! [`FRESH_IDLE`] otherwise), and taken one at a time: the page's figures, charts and
//! bucket map open a free state directory's store at most once in [`FRESH_IDLE`]; a
//! failures query (a filter changed, or the page's refresh of its table) opens it once more.
//! Each time only for as long as the reading takes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use super::data;
use super::source::{DashboardError, FailureQuery, Reading, Wants};
use crate::job::JobPlace;

/// How long a reading serves requests while a run is active.
pub(crate) const FRESH_LIVE: Duration = Duration::from_secs(1);
/// How long a failures reading serves the same query while a run is active (an open page
/// refreshes its table about once a minute; a failures walk reads every bucket not
/// committed yet).
pub(crate) const FRESH_FAILURES_LIVE: Duration = Duration::from_secs(5);

/// How long a reading serves requests while no run is active.
pub(crate) const FRESH_IDLE: Duration = Duration::from_secs(10);

/// Connections served at once; more are closed at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// Failed items a failures answer lists at most.
pub(crate) const MAX_FAILURES_LISTED: usize = 5000;

pub use crate::listen::{bind, BindError};

/// What the server's requests share.
struct Shared<P> {
    /// Where the job is.
    place: P,
    /// The last reading (with the bucket map), and when it was taken.
    last: Mutex<Option<(Instant, Arc<Reading>)>>,
    /// The last failures reading, its query, and when it was taken.
    last_failures: Mutex<Option<(Instant, FailureQuery, Arc<Reading>)>>,
    /// The client that relays requests to a run serving the job's dashboard, once needed.
    relay_client: std::sync::OnceLock<reqwest::Client>,
}

/// How long a relayed request may take.
pub(crate) const RELAY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the run that published `live` serves its dashboard, as this machine reaches it (an
/// unspecified address, the run listening on every interface, is reached on loopback).
fn run_dashboard(live: &crate::live::LiveSnapshot) -> Option<std::net::SocketAddr> {
    let mut addr: std::net::SocketAddr = live.dashboard.as_deref()?.parse().ok()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    Some(addr)
}

/// Serve the dashboard of the job at `place` on `listener` until the task is aborted.
pub async fn serve<P: JobPlace + Clone + 'static>(listener: TcpListener, place: P) {
    let shared = Arc::new(Shared {
        place,
        last: Mutex::new(None),
        last_failures: Mutex::new(None),
        relay_client: std::sync::OnceLock::new(),
    });
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors and the like: give other tasks time to free some.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if conns.len() >= MAX_CONNECTIONS {
                    drop(stream);
                    continue;
                }
                let shared = shared.clone();
                conns.spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(answer(&req, &shared).await) }
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

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("cache-control", "no-store")
        .header("x-content-type-options", "nosniff")
        .body(Full::new(body.into()))
        .expect("a valid response")
}

fn text(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", message + "\n")
}

async fn answer<P: JobPlace + Clone + 'static>(
    req: &Request<Incoming>,
    shared: &Shared<P>,
) -> Response<Full<Bytes>> {
    if req.method() != hyper::Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the dashboard is read-only: GET only".into(),
        );
    }
    let query = Query::parse(req.uri().query().unwrap_or(""));
    let path = req.uri().path();
    if path == "/" || path == "/index.html" {
        return reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            super::page::live(),
        );
    }
    if path.starts_with("/api/") {
        if let Some(relayed) = shared.relay(req.uri()).await {
            return relayed;
        }
    }
    let result = match path {
        "/api/summary" => shared.reading().await.map(|r| data::summary(&r)),
        "/api/history" => match query.number("points", data::DEFAULT_POINTS) {
            Ok(points) => shared.reading().await.map(|r| data::history(&r, points)),
            Err(e) => return text(StatusCode::BAD_REQUEST, e),
        },
        "/api/buckets" => match query.number("cells", data::DEFAULT_CELLS) {
            Ok(cells) => shared.reading().await.map(|r| data::buckets(&r, cells)),
            Err(e) => return text(StatusCode::BAD_REQUEST, e),
        },
        "/api/workers" => shared.reading().await.map(|r| data::workers(&r)),
        "/api/failures" => match query.failures() {
            Ok(q) => shared.failures(q).await.map(|r| data::failures(&r)),
            Err(e) => return text(StatusCode::BAD_REQUEST, e),
        },
        _ => return text(StatusCode::NOT_FOUND, format!("{path}: no such page")),
    };
    match result {
        Ok(value) => reply(StatusCode::OK, "application/json", value.to_string()),
        Err(e) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the job: {e}"),
        ),
    }
}

impl<P: JobPlace + Clone + 'static> Shared<P> {
    /// The shared reading, taken again once it is no longer fresh.
    async fn reading(&self) -> Result<Arc<Reading>, DashboardError> {
        let mut last = self.last.lock().await;
        if let Some((at, r)) = &*last {
            let running = matches!(
                r.runner,
                Some(crate::live::Runner::Live | crate::live::Runner::Stale)
            );
            let fresh = if running { FRESH_LIVE } else { FRESH_IDLE };
            if at.elapsed() < fresh {
                return Ok(r.clone());
            }
        }
        let wants = Wants {
            buckets: true,
            failures: None,
        };
        let reading = Arc::new(read(&self.place, wants).await?);
        *last = Some((Instant::now(), reading.clone()));
        Ok(reading)
    }

    /// The run's own answer to `uri`, when another process's run holds the job and serves its
    /// dashboard (the last reading says so); none when there is no such run or it cannot be
    /// reached.
    async fn relay(&self, uri: &hyper::Uri) -> Option<Response<Full<Bytes>>> {
        let reading = self.reading().await.ok()?;
        let live = reading.live.as_ref().filter(|_| {
            !reading.store_read && matches!(reading.runner, Some(crate::live::Runner::Live))
        })?;
        let addr = run_dashboard(live)?;
        let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
        let client = self.relay_client.get_or_init(|| {
            reqwest::Client::builder()
                .timeout(RELAY_TIMEOUT)
                .no_proxy()
                .build()
                .unwrap_or_default()
        });
        let answer = match client.get(format!("http://{addr}{path}")).send().await {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!("the run's dashboard at {addr} cannot be reached: {e}");
                return None;
            }
        };
        let status = StatusCode::from_u16(answer.status().as_u16()).ok()?;
        let content_type = answer
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        let body = answer.bytes().await.ok()?;
        Some(reply(status, &content_type, body))
    }

    /// A reading with the failures `q` asks for (taken one at a time with the others; while
    /// a run is active, the same query is answered from the last for a moment).
    async fn failures(&self, q: FailureQuery) -> Result<Arc<Reading>, DashboardError> {
        let mut cached = self.last_failures.lock().await;
        if let Some((at, query, r)) = &*cached {
            let running = matches!(r.runner, Some(crate::live::Runner::Live));
            if running && *query == q && at.elapsed() < FRESH_FAILURES_LIVE {
                return Ok(r.clone());
            }
        }
        let _one_at_a_time = self.last.lock().await;
        let wants = Wants {
            buckets: false,
            failures: Some(q.clone()),
        };
        let reading = Arc::new(read(&self.place, wants).await?);
        *cached = Some((Instant::now(), q, reading.clone()));
        Ok(reading)
    }
}

/// A reading of the job at `place`. The failures' walk calls back into the reading's task
/// (its future is not `Send`), so a reading runs on a blocking thread of its own.
async fn read<P: JobPlace + Clone + 'static>(
    place: &P,
    wants: Wants,
) -> Result<Reading, DashboardError> {
    let place = place.clone();
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || handle.block_on(super::source::read(&place, &wants)))
        .await
        .unwrap_or_else(|e| Err(DashboardError::Aborted(e.to_string())))
}

/// A request's query string, decoded.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: &str) -> Query {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        Query(
            query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (decode(k), decode(v)),
                    None => (decode(p), String::new()),
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// A positive count, `default` when absent.
    fn number(&self, key: &str, default: usize) -> Result<usize, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .ok_or_else(|| format!("{key}={v:?}: a count from 1 to 1000000 is expected")),
        }
    }

    /// `class`, `bucket` (N or A-B) and `limit` of a failures request.
    fn failures(&self) -> Result<FailureQuery, String> {
        let class = self.get("class").map(str::to_string);
        if let Some(c) = &class {
            let names = crate::failure::ErrorClass::ALL.map(|c| c.name());
            if !names.contains(&c.as_str()) {
                return Err(format!(
                    "class={c:?} is not an error class (one of: {})",
                    names.join(", ")
                ));
            }
        }
        let buckets = match self.get("bucket") {
            None => None,
            Some(v) => {
                let bad = || format!("bucket={v:?}: a bucket number N or a range A-B is expected");
                let (a, b) = v.split_once('-').unwrap_or((v, v));
                let a: u64 = a.trim().parse().map_err(|_| bad())?;
                let b: u64 = b.trim().parse().map_err(|_| bad())?;
                if b < a {
                    return Err(bad());
                }
                Some((a, b))
            }
        };
        let limit = self.number("limit", 500)?.min(MAX_FAILURES_LISTED);
        Ok(FailureQuery {
            class,
            buckets,
            limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Query;

    #[test]
    fn a_failures_query_reads_class_bucket_or_range_and_refuses_anything_else() {
        let q = Query::parse("class=timeout&bucket=3-7&limit=10")
            .failures()
            .unwrap();
        assert_eq!(
            (q.class.as_deref(), q.buckets, q.limit),
            (Some("timeout"), Some((3, 7)), 10)
        );
        let q = Query::parse("bucket=%204").failures().unwrap();
        assert_eq!(q.buckets, Some((4, 4)));
        for bad in [
            "class=nope",
            "bucket=x",
            "bucket=5-2",
            "limit=0",
            "limit=-1",
        ] {
            assert!(Query::parse(bad).failures().is_err(), "{bad}");
        }
        assert_eq!(Query::parse("").number("points", 7), Ok(7));
    }
}
