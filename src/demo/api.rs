//! The fake HTTP API that highwater jobs run against in demos, tests and benchmarks.
//!
//! This module owns a small HTTP/1.1 server ([`FakeApi`]) bound to `127.0.0.1` on a
//! random port. It runs as tasks on the *current* tokio runtime, so it lives as long as
//! the process (and runtime) that started it: integration tests start it in the test
//! process, run the real `highwater` binary as a subprocess against it, and the server
//! (with its call counters) survives the subprocess being SIGKILLed.
//!
//! It also owns the fault model ([`ApiConfig`], [`Fault`]): every ID is assigned exactly
//! one fault by a seeded xxh3 hash, so a test can predict the outcome of every request
//! ([`FakeApi::fault`], [`FakeApi::expected_body`]) and check it afterwards
//! ([`FakeApi::calls`]).
//!
//! # Routes
//!
//! * `GET /items/{id}`: the ID is the rest of the path, percent-decoded (must be UTF-8).
//! * `GET /items?id={id}`: the ID is the `id` query parameter (percent-decoded, `+` is a space).
//! * `POST /items` with a JSON body `{"id": "..."}` (other fields ignored; body capped at
//!   64 KiB, larger answers 413).
//! * anything else: 404 `{"error":"no route"}`.
//!
//! Malformed requests (400, 413, 404 no route) are not counted as calls for any ID.
//! A successful answer is 200 with `application/json` body [`expected_body`]; IDs that
//! start with `text:` instead answer 200 `text/plain` `plain <id>`.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::percent_decode_str;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Largest request body accepted (`POST /items`); larger bodies answer 413.
const MAX_BODY: usize = 64 * 1024;
/// Number of independently locked shards of the call counter.
const SHARDS: usize = 32;
/// Prefix of IDs that answer a `text/plain` body instead of JSON.
const TEXT_PREFIX: &str = "text:";
/// Tags an item body picks from.
const TAGS: [&str; 8] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
];

/// How the fake API behaves: latency and the share of faulty IDs.
///
/// The four fault shares are consecutive ranges of one per-mille space (in the order
/// not-found, unavailable, drop, slow), so they are mutually exclusive per ID; if they
/// add up to more than 1000 the later ones are truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Uniform per-request latency range added before answering, drawn deterministically
    /// from a hash of (id, attempt). Zero = answer at once.
    pub latency_min: Duration,
    pub latency_max: Duration,
    /// Per-mille of IDs (chosen by a seeded xxh3 hash of the ID) that always answer 404
    /// `{"error":"not found"}`: permanent failures.
    pub not_found_per_mille: u32,
    /// Per-mille of IDs whose first `transient_attempts` attempts answer 503
    /// `{"error":"unavailable"}` (with no Retry-After header), then heal.
    pub unavailable_per_mille: u32,
    /// Per-mille of IDs whose first `transient_attempts` attempts get their connection
    /// dropped without any answer, then heal.
    pub drop_per_mille: u32,
    /// Per-mille of IDs whose first `transient_attempts` attempts answer (successfully)
    /// only after `slow_delay` instead of the usual latency, then heal.
    pub slow_per_mille: u32,
    pub slow_delay: Duration,
    pub transient_attempts: u32,
    /// Seed for the fault hash, so different tests can pick different faulty IDs.
    pub seed: u64,
}

impl ApiConfig {
    /// No latency, no faults: for benchmarks.
    pub fn fast() -> Self {
        ApiConfig {
            latency_min: Duration::ZERO,
            latency_max: Duration::ZERO,
            not_found_per_mille: 0,
            unavailable_per_mille: 0,
            drop_per_mille: 0,
            slow_per_mille: 0,
            slow_delay: Duration::ZERO,
            transient_attempts: 0,
            seed: 0,
        }
    }

    /// Realistic: latency 5..40 ms, 1% 404, 2% 503, 1% drops, 0.5% slow (3 s), each
    /// transient fault for the first attempt only.
    pub fn demo() -> Self {
        ApiConfig {
            latency_min: Duration::from_millis(5),
            latency_max: Duration::from_millis(40),
            not_found_per_mille: 10,
            unavailable_per_mille: 20,
            drop_per_mille: 10,
            slow_per_mille: 5,
            slow_delay: Duration::from_secs(3),
            transient_attempts: 1,
            seed: 0x6869_6768_7761_7465, // "highwate"
        }
    }

    /// For tests: latency 0..2 ms, 2% 404, 3% 503, 2% drops, 1% slow (2 s), each
    /// transient fault for the first two attempts.
    pub fn faulty() -> Self {
        ApiConfig {
            latency_min: Duration::ZERO,
            latency_max: Duration::from_millis(2),
            not_found_per_mille: 20,
            unavailable_per_mille: 30,
            drop_per_mille: 20,
            slow_per_mille: 10,
            slow_delay: Duration::from_secs(2),
            transient_attempts: 2,
            seed: 0,
        }
    }

    /// The fault of `id` under this configuration: a pure function of the seed, the
    /// per-mille shares and the ID.
    pub fn fault(&self, id: &str) -> Fault {
        let bucket = xxh3_64_with_seed(id.as_bytes(), self.seed) % 1000;
        let mut upper = 0u64;
        for (share, fault) in [
            (self.not_found_per_mille, Fault::NotFound),
            (self.unavailable_per_mille, Fault::Unavailable),
            (self.drop_per_mille, Fault::Drop),
            (self.slow_per_mille, Fault::Slow),
        ] {
            upper += u64::from(share);
            if bucket < upper {
                return fault;
            }
        }
        Fault::None
    }

    /// Latency for one attempt at an ID whose unseeded hash is `id_hash`.
    fn latency(&self, id_hash: u64, attempt: u64) -> Duration {
        if self.latency_max <= self.latency_min {
            return self.latency_min;
        }
        let span = (self.latency_max - self.latency_min).as_nanos() as u64;
        let draw = mix64(id_hash ^ attempt.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        self.latency_min + Duration::from_nanos(draw % span.saturating_add(1))
    }
}

impl Default for ApiConfig {
    /// Same as [`ApiConfig::fast`].
    fn default() -> Self {
        ApiConfig::fast()
    }
}

/// The fault an ID is assigned (exactly one per ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Always answers 200.
    None,
    /// Always answers 404 `{"error":"not found"}`.
    NotFound,
    /// The first `transient_attempts` attempts answer 503, then 200.
    Unavailable,
    /// The first `transient_attempts` attempts have their connection closed without an
    /// answer, then 200.
    Drop,
    /// The first `transient_attempts` attempts answer 200 only after `slow_delay`.
    Slow,
}

/// The JSON body a successful answer for `id` carries; deterministic from the ID alone
/// (not from the seed). For IDs starting with `text:` this is the string `plain <id>`,
/// which is served as a `text/plain` body.
pub fn expected_body(id: &str) -> serde_json::Value {
    if id.starts_with(TEXT_PREFIX) {
        return serde_json::Value::String(plain_body(id));
    }
    serde_json::to_value(Item::new(id, xxh3_64(id.as_bytes()))).unwrap_or(serde_json::Value::Null)
}

/// A running fake API server.
///
/// `FakeApi` is cheap to clone: clones share the same server and counters (it is an
/// `Arc` inside). The server stops when [`FakeApi::shutdown`] is called on any clone, or
/// when the last clone is dropped (the accept loop then stops and aborts the open
/// connections on its own), or when the runtime it was started on shuts down.
#[derive(Clone)]
pub struct FakeApi {
    shared: Arc<Shared>,
    control: Arc<Control>,
    addr: SocketAddr,
}

/// State the request handlers share.
struct Shared {
    config: ApiConfig,
    calls: CallCounter,
}

/// Owned only by `FakeApi` clones: dropping the last one drops `shutdown`, which stops
/// the accept loop.
struct Control {
    shutdown: watch::Sender<bool>,
    accept_task: Mutex<Option<JoinHandle<()>>>,
}

impl FakeApi {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime.
    pub async fn start(config: ApiConfig) -> io::Result<FakeApi> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            calls: CallCounter::new(),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone(), shutdown_rx));
        Ok(FakeApi {
            shared,
            control: Arc::new(Control {
                shutdown,
                accept_task: Mutex::new(Some(accept_task)),
            }),
            addr,
        })
    }

    /// The address the server listens on (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/items/{id}`: highwater's URL template syntax, `{id}` is
    /// replaced by the client with the percent-encoded ID.
    pub fn url_template(&self) -> String {
        format!("http://{}/items/{{id}}", self.addr)
    }

    /// `http://127.0.0.1:PORT/items?id={id}`: the query-string form of the same route.
    pub fn query_url_template(&self) -> String {
        format!("http://{}/items?id={{id}}", self.addr)
    }

    /// `http://127.0.0.1:PORT/items`: the URL to `POST {"id": ...}` to.
    pub fn post_url(&self) -> String {
        format!("http://{}/items", self.addr)
    }

    /// The configuration the server was started with.
    pub fn config(&self) -> &ApiConfig {
        &self.shared.config
    }

    /// The fault of `id`: a pure function of the config and the ID.
    pub fn fault(&self, id: &str) -> Fault {
        self.shared.config.fault(id)
    }

    /// The exact body a successful answer for `id` carries (see [`expected_body`]).
    pub fn expected_body(&self, id: &str) -> serde_json::Value {
        expected_body(id)
    }

    /// Requests received for this ID: all attempts, including dropped, slow and failed ones.
    pub fn calls(&self, id: &str) -> u64 {
        self.shared.calls.get(id)
    }

    /// Requests received for all IDs.
    pub fn total_calls(&self) -> u64 {
        self.shared.calls.total()
    }

    /// Number of different IDs requested at least once.
    pub fn distinct_ids(&self) -> usize {
        self.shared.calls.distinct()
    }

    /// A copy of the per-ID call counts.
    pub fn calls_snapshot(&self) -> HashMap<String, u64> {
        self.shared.calls.snapshot()
    }

    /// Stops accepting, closes all connections (in-flight requests get no answer) and
    /// waits for that to be done. Stops the server for every clone.
    pub async fn shutdown(self) {
        let _ = self.control.shutdown.send(true);
        let task = lock(&self.control.accept_task).take();
        if let Some(task) = task {
            if let Err(e) = task.await {
                if e.is_panic() {
                    tracing::warn!("fake API accept loop panicked: {e}");
                }
            }
        }
    }
}

impl std::fmt::Debug for FakeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApi")
            .field("addr", &self.addr)
            .field("config", &self.shared.config)
            .field("total_calls", &self.total_calls())
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Server

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.keep_alive(true);
    loop {
        tokio::select! {
            biased;
            // Ok (true was sent) or Err (every FakeApi was dropped): stop either way.
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let conn = serve(&builder, stream, shared.clone());
                    conns.spawn(conn);
                }
                Err(e) => {
                    tracing::warn!("fake API: accept failed: {e}");
                    if !is_per_connection_error(&e) {
                        // EMFILE, ENFILE, ENOBUFS...: give other tasks time to free some.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            },
        }
    }
    drop(listener);
    conns.shutdown().await;
}

/// Errors that only concern the connection being accepted, after which the next
/// accept can be tried at once.
fn is_per_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

fn serve(
    builder: &hyper::server::conn::http1::Builder,
    stream: TcpStream,
    shared: Arc<Shared>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| handle(shared.clone(), req));
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    async move {
        if let Err(e) = conn.await {
            // Includes the connections closed on purpose by `Fault::Drop`.
            tracing::debug!("fake API: connection ended: {e}");
        }
    }
}

/// The error a handler returns to make hyper close the connection without answering.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by the fake API")]
struct DropConnection;

type Resp = Response<Full<Bytes>>;

/// What routing a request produced.
enum Routed {
    /// A request for this ID.
    Id(String),
    /// An answer that does not concern any ID (400, 404 no route, 413).
    Reply(Resp),
    /// Close the connection (the request body could not be read).
    Abort,
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Resp, DropConnection> {
    let id = match route(req).await {
        Routed::Id(id) => id,
        Routed::Reply(resp) => return Ok(resp),
        Routed::Abort => return Err(DropConnection),
    };
    let config = &shared.config;
    let id_hash = xxh3_64(id.as_bytes());
    let attempt = shared.calls.record(&id, id_hash);
    let transient = attempt <= u64::from(config.transient_attempts);
    let fault = config.fault(&id);
    if fault == Fault::Slow && transient {
        tokio::time::sleep(config.slow_delay).await;
        return Ok(success(&id, id_hash));
    }
    let latency = config.latency(id_hash, attempt);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    Ok(match fault {
        Fault::NotFound => error_response(StatusCode::NOT_FOUND, "not found"),
        Fault::Unavailable if transient => {
            error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        }
        Fault::Drop if transient => return Err(DropConnection),
        _ => success(&id, id_hash),
    })
}

async fn route(req: Request<Incoming>) -> Routed {
    let path = req.uri().path();
    if path == "/items" {
        if req.method() == Method::GET {
            return match req.uri().query().and_then(id_from_query) {
                Some(Some(id)) if !id.is_empty() => Routed::Id(id),
                _ => Routed::Reply(bad_request()),
            };
        }
        if req.method() == Method::POST {
            return id_from_post(req).await;
        }
    } else if let Some(rest) = path.strip_prefix("/items/") {
        if req.method() == Method::GET {
            return match decode(rest, false) {
                Some(id) if !id.is_empty() => Routed::Id(id),
                _ => Routed::Reply(bad_request()),
            };
        }
    }
    Routed::Reply(error_response(StatusCode::NOT_FOUND, "no route"))
}

/// `None` if there is no `id` parameter, `Some(None)` if it does not decode to UTF-8.
fn id_from_query(query: &str) -> Option<Option<String>> {
    query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(key, _)| *key == "id")
        .map(|(_, value)| decode(value, true))
}

/// Percent-decodes `raw` (with `+` as a space if `plus_is_space`); `None` if the result
/// is not UTF-8.
fn decode(raw: &str, plus_is_space: bool) -> Option<String> {
    let raw = if plus_is_space && raw.contains('+') {
        std::borrow::Cow::Owned(raw.replace('+', " "))
    } else {
        std::borrow::Cow::Borrowed(raw)
    };
    percent_decode_str(&raw)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

#[derive(Deserialize)]
struct IdBody {
    id: String,
}

async fn id_from_post(req: Request<Incoming>) -> Routed {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY as u64) {
        return Routed::Reply(payload_too_large());
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Routed::Reply(payload_too_large())
        }
        Err(e) => {
            tracing::debug!("fake API: reading request body failed: {e}");
            return Routed::Abort;
        }
    };
    match serde_json::from_slice::<IdBody>(&bytes) {
        Ok(body) if !body.id.is_empty() => Routed::Id(body.id),
        _ => Routed::Reply(bad_request()),
    }
}

#[derive(Serialize)]
struct Item<'a> {
    id: &'a str,
    name: String,
    score: u32,
    tags: Vec<&'static str>,
}

impl<'a> Item<'a> {
    fn new(id: &'a str, id_hash: u64) -> Self {
        let count = 1 + (id_hash >> 40) % 3;
        let start = (id_hash >> 48) as usize;
        // A stride coprime with TAGS.len() picks distinct tags.
        let tags = (0..count as usize)
            .map(|i| TAGS[(start + 3 * i) % TAGS.len()])
            .collect();
        Item {
            id,
            name: format!("item-{id_hash:016x}"),
            score: ((id_hash >> 16) as u32) % 100_000,
            tags,
        }
    }
}

fn plain_body(id: &str) -> String {
    format!("plain {id}")
}

fn success(id: &str, id_hash: u64) -> Resp {
    if id.starts_with(TEXT_PREFIX) {
        return response(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Bytes::from(plain_body(id)),
        );
    }
    match serde_json::to_vec(&Item::new(id, id_hash)) {
        Ok(body) => response(StatusCode::OK, "application/json", Bytes::from(body)),
        Err(_) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

fn bad_request() -> Resp {
    error_response(StatusCode::BAD_REQUEST, "bad request")
}

fn payload_too_large() -> Resp {
    error_response(StatusCode::PAYLOAD_TOO_LARGE, "payload too large")
}

fn error_response(status: StatusCode, message: &'static str) -> Resp {
    let body = match message {
        "not found" => Bytes::from_static(br#"{"error":"not found"}"#),
        "unavailable" => Bytes::from_static(br#"{"error":"unavailable"}"#),
        "no route" => Bytes::from_static(br#"{"error":"no route"}"#),
        "bad request" => Bytes::from_static(br#"{"error":"bad request"}"#),
        _ => Bytes::from(serde_json::json!({ "error": message }).to_string()),
    };
    response(status, "application/json", body)
}

fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> Resp {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

// ---------------------------------------------------------------------------
// Call counting

/// Per-ID call counts, sharded by ID hash so concurrent connections rarely contend.
struct CallCounter {
    shards: Box<[Mutex<HashMap<String, u64>>]>,
    total: AtomicU64,
}

impl CallCounter {
    fn new() -> Self {
        CallCounter {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            total: AtomicU64::new(0),
        }
    }

    fn shard(&self, id_hash: u64) -> MutexGuard<'_, HashMap<String, u64>> {
        lock(&self.shards[(id_hash % SHARDS as u64) as usize])
    }

    /// Counts one call and returns its attempt number (1 for the first call).
    fn record(&self, id: &str, id_hash: u64) -> u64 {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shard(id_hash);
        match shard.get_mut(id) {
            Some(count) => {
                *count += 1;
                *count
            }
            None => {
                shard.insert(id.to_owned(), 1);
                1
            }
        }
    }

    fn get(&self, id: &str) -> u64 {
        let shard = self.shard(xxh3_64(id.as_bytes()));
        shard.get(id).copied().unwrap_or(0)
    }

    fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    fn distinct(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    fn snapshot(&self) -> HashMap<String, u64> {
        let mut all = HashMap::with_capacity(self.distinct());
        for shard in self.shards.iter() {
            all.extend(lock(shard).iter().map(|(k, v)| (k.clone(), *v)));
        }
        all
    }
}

/// Locks ignoring poisoning: the guarded data (counters, a join handle) stays valid.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// splitmix64's finalizer: a cheap, well-mixed 64-bit permutation.
fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .retry(reqwest::retry::never())
            .build()
            .expect("client")
    }

    fn item_url(api: &FakeApi, id: &str) -> String {
        api.url_template().replace(
            "{id}",
            &utf8_percent_encode(id, NON_ALPHANUMERIC).to_string(),
        )
    }

    /// The first ID of the form `{prefix}{n}` with the given fault.
    fn id_with(config: &ApiConfig, prefix: &str, fault: Fault) -> String {
        (0..100_000)
            .map(|n| format!("{prefix}{n}"))
            .find(|id| config.fault(id) == fault)
            .expect("an ID with that fault")
    }

    async fn get_json(client: &reqwest::Client, url: &str) -> (u16, serde_json::Value) {
        let resp = client.get(url).send().await.expect("request");
        let status = resp.status().as_u16();
        let body = resp.bytes().await.expect("body");
        (status, serde_json::from_slice(&body).expect("json body"))
    }

    #[tokio::test]
    async fn success_body_equals_expected_body() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        for id in ["a", "42", "item-7"] {
            let resp = c.get(item_url(&api, id)).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(
                resp.headers()[CONTENT_TYPE].to_str().unwrap(),
                "application/json"
            );
            let body: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
            assert_eq!(body, api.expected_body(id));
            assert_eq!(body["id"], id);
            assert!(body["name"].as_str().unwrap().starts_with("item-"));
            assert!(body["score"].is_u64());
            assert!(!body["tags"].as_array().unwrap().is_empty());
        }
        // Deterministic from the ID alone, not the seed.
        assert_eq!(expected_body("a"), api.expected_body("a"));
        assert_ne!(expected_body("a"), expected_body("b"));
        api.shutdown().await;
    }

    #[tokio::test]
    async fn awkward_ids_round_trip_in_path() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        let ids = [
            "a/b",
            "with space",
            "what?",
            "hash#tag",
            "100%",
            "café",
            "/?#% é+&=",
            "日本",
        ];
        for id in ids {
            let (status, body) = get_json(&c, &item_url(&api, id)).await;
            assert_eq!(status, 200, "{id}");
            assert_eq!(body, api.expected_body(id), "{id}");
            assert_eq!(api.calls(id), 1, "{id}");
        }
        assert_eq!(api.distinct_ids(), ids.len());
        api.shutdown().await;
    }

    #[tokio::test]
    async fn query_form() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        let id = "a b/c?d#e%f+g é";
        let url = api.query_url_template().replace(
            "{id}",
            &utf8_percent_encode(id, NON_ALPHANUMERIC).to_string(),
        );
        let (status, body) = get_json(&c, &url).await;
        assert_eq!(status, 200);
        assert_eq!(body, api.expected_body(id));
        // `+` is a space, other parameters are ignored.
        let url = format!("http://{}/items?x=1&id=two+words&y", api.addr());
        let (status, body) = get_json(&c, &url).await;
        assert_eq!(status, 200);
        assert_eq!(body, api.expected_body("two words"));
        // Missing id.
        let url = format!("http://{}/items?x=1", api.addr());
        let (status, body) = get_json(&c, &url).await;
        assert_eq!(
            (status, body),
            (400, serde_json::json!({"error": "bad request"}))
        );
        assert_eq!(api.total_calls(), 2);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn post_form() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        let id = "posted/é?#";
        let body = serde_json::json!({"id": id, "extra": [1, 2]}).to_string();
        let resp = c
            .post(api.post_url())
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let got: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert_eq!(got, api.expected_body(id));
        assert_eq!(api.calls(id), 1);

        for bad in ["not json", "{}", r#"{"id": 5}"#, "[]", ""] {
            let resp = c.post(api.post_url()).body(bad).send().await.unwrap();
            assert_eq!(resp.status(), 400, "{bad:?}");
            let got: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
            assert_eq!(got, serde_json::json!({"error": "bad request"}));
        }

        let huge = format!(r#"{{"id": "x", "pad": "{}"}}"#, "x".repeat(MAX_BODY));
        let resp = c.post(api.post_url()).body(huge).send().await.unwrap();
        assert_eq!(resp.status(), 413);
        assert_eq!(api.total_calls(), 1);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn not_found_fault_is_permanent() {
        let config = ApiConfig::faulty();
        let id = id_with(&config, "nf-", Fault::NotFound);
        let api = FakeApi::start(config).await.unwrap();
        assert_eq!(api.fault(&id), Fault::NotFound);
        let c = client();
        for _ in 0..4 {
            let (status, body) = get_json(&c, &item_url(&api, &id)).await;
            assert_eq!(
                (status, body),
                (404, serde_json::json!({"error": "not found"}))
            );
        }
        assert_eq!(api.calls(&id), 4);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn unavailable_fault_heals() {
        let config = ApiConfig::faulty();
        let id = id_with(&config, "un-", Fault::Unavailable);
        let api = FakeApi::start(config).await.unwrap();
        let c = client();
        for attempt in 1..=api.config().transient_attempts {
            let resp = c.get(item_url(&api, &id)).send().await.unwrap();
            assert_eq!(resp.status(), 503, "attempt {attempt}");
            assert!(resp.headers().get("retry-after").is_none());
        }
        let (status, body) = get_json(&c, &item_url(&api, &id)).await;
        assert_eq!(status, 200);
        assert_eq!(body, api.expected_body(&id));
        assert_eq!(api.calls(&id), 3);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn drop_fault_heals() {
        let config = ApiConfig::faulty();
        let id = id_with(&config, "dr-", Fault::Drop);
        let api = FakeApi::start(config).await.unwrap();
        let c = client();
        for attempt in 1..=2 {
            let err = c.get(item_url(&api, &id)).send().await;
            assert!(err.is_err(), "attempt {attempt}: {err:?}");
        }
        let (status, body) = get_json(&c, &item_url(&api, &id)).await;
        assert_eq!(status, 200);
        assert_eq!(body, api.expected_body(&id));
        assert_eq!(api.calls(&id), 3);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn slow_fault_heals() {
        let config = ApiConfig {
            slow_per_mille: 1000,
            slow_delay: Duration::from_millis(500),
            transient_attempts: 1,
            ..ApiConfig::fast()
        };
        let api = FakeApi::start(config).await.unwrap();
        assert_eq!(api.fault("s"), Fault::Slow);
        let c = reqwest::Client::builder()
            .no_proxy()
            .retry(reqwest::retry::never())
            .timeout(Duration::from_millis(100))
            .build()
            .unwrap();
        let err = c.get(item_url(&api, "s")).send().await.unwrap_err();
        assert!(err.is_timeout(), "{err:?}");
        let (status, body) = get_json(&c, &item_url(&api, "s")).await;
        assert_eq!(status, 200);
        assert_eq!(body, api.expected_body("s"));
        assert_eq!(api.calls("s"), 2);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn text_ids_answer_plain_text() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        let id = "text:hello world";
        let resp = c.get(item_url(&api, id)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain"));
        assert_eq!(resp.text().await.unwrap(), "plain text:hello world");
        assert_eq!(
            api.expected_body(id),
            serde_json::Value::String("plain text:hello world".into())
        );
        api.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn calls_are_counted_under_concurrency() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        let mut tasks = JoinSet::new();
        for t in 0..16 {
            let (c, api) = (c.clone(), api.clone());
            tasks.spawn(async move {
                for n in 0..200 {
                    let id = format!("id-{}", n % 100);
                    let resp = c.get(item_url(&api, &id)).send().await.unwrap();
                    assert_eq!(resp.status(), 200, "task {t}");
                    resp.bytes().await.unwrap();
                }
            });
        }
        while let Some(res) = tasks.join_next().await {
            res.unwrap();
        }
        assert_eq!(api.total_calls(), 16 * 200);
        assert_eq!(api.distinct_ids(), 100);
        let snapshot = api.calls_snapshot();
        assert_eq!(snapshot.len(), 100);
        assert!(snapshot.values().all(|&n| n == 32));
        assert_eq!(api.calls("id-7"), 32);
        assert_eq!(api.calls("never"), 0);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn bad_requests_do_not_break_the_server() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        // Not UTF-8 once decoded.
        let (status, _) = get_json(&c, &format!("http://{}/items/%FF%FE", api.addr())).await;
        assert_eq!(status, 400);
        let (status, _) = get_json(&c, &format!("http://{}/items?id=%C3", api.addr())).await;
        assert_eq!(status, 400);
        // Empty ID.
        let (status, _) = get_json(&c, &format!("http://{}/items/", api.addr())).await;
        assert_eq!(status, 400);
        // No route.
        for path in ["/", "/itemsx", "/other/1", "/items-/1"] {
            let (status, body) = get_json(&c, &format!("http://{}{path}", api.addr())).await;
            assert_eq!(
                (status, body),
                (404, serde_json::json!({"error": "no route"})),
                "{path}"
            );
        }
        let resp = c.delete(item_url(&api, "a")).send().await.unwrap();
        assert_eq!(resp.status(), 404);

        // Raw garbage and an oversized chunked body over plain TCP.
        let mut s = TcpStream::connect(api.addr()).await.unwrap();
        s.write_all(b"\xff\xfe\x00garbage\r\n\r\n").await.unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf).await;

        let mut s = TcpStream::connect(api.addr()).await.unwrap();
        s.write_all(b"POST /items HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        let chunk = vec![b'x'; 70_000];
        s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await
            .unwrap();
        s.write_all(&chunk).await.unwrap();
        s.write_all(b"\r\n0\r\n\r\n").await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 413"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );

        // A client that goes away mid-body.
        let mut s = TcpStream::connect(api.addr()).await.unwrap();
        s.write_all(b"POST /items HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"id\"")
            .await
            .unwrap();
        drop(s);

        // Still serving, and none of the above counted.
        let (status, _) = get_json(&c, &item_url(&api, "fine")).await;
        assert_eq!(status, 200);
        assert_eq!(api.total_calls(), 1);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn shutdown_stops_listening() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let addr = api.addr();
        let c = client();
        let (status, _) = get_json(&c, &item_url(&api, "x")).await;
        assert_eq!(status, 200);
        let clone = api.clone();
        api.shutdown().await;
        assert!(TcpStream::connect(addr).await.is_err());
        // Pooled keep-alive connection was closed too.
        assert!(c.get(item_url(&clone, "x")).send().await.is_err());
        assert_eq!(clone.calls("x"), 1);
    }

    #[tokio::test]
    async fn latency_is_applied() {
        let config = ApiConfig {
            latency_min: Duration::from_millis(30),
            latency_max: Duration::from_millis(40),
            ..ApiConfig::fast()
        };
        for attempt in 1..50 {
            let l = config.latency(xxh3_64(b"x"), attempt);
            assert!(l >= config.latency_min && l <= config.latency_max);
        }
        let api = FakeApi::start(config).await.unwrap();
        let c = client();
        let started = std::time::Instant::now();
        let (status, _) = get_json(&c, &item_url(&api, "x")).await;
        assert_eq!(status, 200);
        assert!(started.elapsed() >= Duration::from_millis(30));
        api.shutdown().await;
    }

    #[test]
    fn fault_distribution_matches_per_mille() {
        fn count(config: &ApiConfig) -> HashMap<&'static str, u32> {
            let mut counts = HashMap::new();
            for n in 0..10_000 {
                let name = match config.fault(&format!("id-{n}")) {
                    Fault::None => "none",
                    Fault::NotFound => "not_found",
                    Fault::Unavailable => "unavailable",
                    Fault::Drop => "drop",
                    Fault::Slow => "slow",
                };
                *counts.entry(name).or_insert(0) += 1;
            }
            counts
        }
        for config in [
            ApiConfig::faulty(),
            ApiConfig::demo(),
            ApiConfig {
                seed: 12345,
                ..ApiConfig::faulty()
            },
        ] {
            let counts = count(&config);
            for (name, per_mille) in [
                ("not_found", config.not_found_per_mille),
                ("unavailable", config.unavailable_per_mille),
                ("drop", config.drop_per_mille),
                ("slow", config.slow_per_mille),
            ] {
                let expected = f64::from(per_mille) * 10.0;
                let got = f64::from(counts.get(name).copied().unwrap_or(0));
                let tolerance = 4.0 * expected.sqrt() + 5.0;
                assert!(
                    (got - expected).abs() <= tolerance,
                    "{name}: got {got}, expected {expected} ± {tolerance} ({config:?})"
                );
            }
        }
        // No faults at all in fast mode.
        assert_eq!(count(&ApiConfig::fast())["none"], 10_000);
        // Everything faulty when the shares fill the space; truncated past 1000.
        let all = ApiConfig {
            not_found_per_mille: 600,
            unavailable_per_mille: 600,
            ..ApiConfig::fast()
        };
        let counts = count(&all);
        assert!(!counts.contains_key("none"));
        assert!(!counts.contains_key("drop"));
        // Different seeds pick different faulty IDs.
        let a = ApiConfig::faulty();
        let b = ApiConfig {
            seed: 99,
            ..ApiConfig::faulty()
        };
        let differ = (0..1000)
            .map(|n| format!("id-{n}"))
            .filter(|id| a.fault(id) != b.fault(id))
            .count();
        assert!(differ > 20, "{differ}");
    }
}
