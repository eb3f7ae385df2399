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
//!
//! # Faults
//!
//! Per ID, by per-mille share ([`ApiConfig`]): permanent 404s, and transient faults that
//! heal after `transient_attempts` attempts: 503s, dropped connections, slow answers and
//! 429s with a `Retry-After` header ([`Fault::Throttled`]).
//!
//! # Test controls
//!
//! * **Call timestamps**: the instant of every counted call (the first
//!   [`MAX_CALL_TIMES`]) is kept: [`FakeApi::call_times`], [`FakeApi::calls_per_id_times`]
//!   and [`FakeApi::max_calls_in_window`] (to check a client's rate).
//! * **Outage switch**: [`FakeApi::set_down`] closes the listener (connections are refused)
//!   and every open connection, then binds the same port again when brought back up.
//! * **Hidden capacity**: [`FakeApi::set_capacity`] puts a token bucket in front of every
//!   ID (to test adaptive rate control): requests finding no token answer 429
//!   `{"error":"rate limited"}`, optionally with a `Retry-After`
//!   ([`FakeApi::set_retry_after_on_429`]); [`FakeApi::accepted`] and
//!   [`FakeApi::rejected_429`] count the outcomes.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::percent_decode_str;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Largest request body accepted (`POST /items`); larger bodies answer 413.
const MAX_BODY: usize = 64 * 1024;
/// Number of independently locked shards of the call counter.
const SHARDS: usize = 32;
/// Prefix of IDs that answer a `text/plain` body instead of JSON.
const TEXT_PREFIX: &str = "text:";
/// At most this many call timestamps are kept (those of the first `MAX_CALL_TIMES`
/// counted calls; later calls are still counted but not timestamped). Each costs 16
/// bytes, so the cap bounds that memory to 80 MB.
pub const MAX_CALL_TIMES: usize = 5_000_000;
/// Backlog of the listener bound again by [`FakeApi::set_down`]`(false)` (tokio's default).
const LISTEN_BACKLOG: u32 = 1024;
/// Tags an item body picks from.
const TAGS: [&str; 8] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
];

/// How the fake API behaves: latency and the share of faulty IDs.
///
/// The five fault shares are consecutive ranges of one per-mille space (in the order
/// not-found, unavailable, drop, slow, throttled), so they are mutually exclusive per ID;
/// if they add up to more than 1000 the later ones are truncated.
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
    /// Per-mille of IDs whose first `transient_attempts` attempts answer 429
    /// `{"error":"throttled"}` with a `Retry-After: <retry_after_secs>` header, then heal.
    /// 0 in every constructor.
    pub throttled_per_mille: u32,
    /// The `Retry-After` (in seconds) of [`Fault::Throttled`] answers. 1 in every constructor.
    pub retry_after_secs: u64,
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
            throttled_per_mille: 0,
            retry_after_secs: 1,
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
            throttled_per_mille: 0,
            retry_after_secs: 1,
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
            throttled_per_mille: 0,
            retry_after_secs: 1,
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
            (self.throttled_per_mille, Fault::Throttled),
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
    /// The first `transient_attempts` attempts answer 429 `{"error":"throttled"}` with
    /// `Retry-After: <retry_after_secs>` (after the usual latency), then 200.
    Throttled,
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
    /// Set while the server is down ([`FakeApi::set_down`]): requests that still arrive
    /// on an open connection get it dropped, uncounted.
    down: AtomicBool,
    /// The hidden capacity ([`FakeApi::set_capacity`]).
    limiter: Limiter,
    /// Calls answered 200.
    accepted: AtomicU64,
    /// Calls answered 429 because the hidden capacity was exhausted.
    rejected_429: AtomicU64,
}

/// Owned only by `FakeApi` clones: dropping the last one drops `shutdown`, which stops
/// the accept loop.
struct Control {
    shutdown: watch::Sender<bool>,
    accept_task: Mutex<Option<JoinHandle<()>>>,
    /// Outage switch requests to the accept loop, each acknowledged once applied.
    set_down: mpsc::UnboundedSender<SetDown>,
}

/// Asks the accept loop to go down (close the listener, abort every connection) or up
/// (bind the same address again); `done` is sent once that is done.
struct SetDown {
    down: bool,
    done: oneshot::Sender<()>,
}

impl FakeApi {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime.
    pub async fn start(config: ApiConfig) -> io::Result<FakeApi> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            calls: CallCounter::new(),
            down: AtomicBool::new(false),
            limiter: Limiter::new(),
            accepted: AtomicU64::new(0),
            rejected_429: AtomicU64::new(0),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (set_down, set_down_rx) = mpsc::unbounded_channel();
        let accept_task = tokio::spawn(accept_loop(
            listener,
            addr,
            shared.clone(),
            shutdown_rx,
            set_down_rx,
        ));
        Ok(FakeApi {
            shared,
            control: Arc::new(Control {
                shutdown,
                accept_task: Mutex::new(Some(accept_task)),
                set_down,
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

    /// The instants of the counted calls (every call [`FakeApi::total_calls`] counts,
    /// including capacity 429s), sorted. Only the first [`MAX_CALL_TIMES`] calls are
    /// timestamped. A call's instant is taken when its request has been routed to an ID,
    /// before any latency.
    pub fn call_times(&self) -> Vec<Instant> {
        let mut times = self.shared.calls.all_times();
        times.sort_unstable();
        self.shared.calls.to_instants(times)
    }

    /// The largest number of counted calls whose timestamps fall within one window
    /// `[t, t + window)` (half-open, so a zero window holds none), over every start `t`.
    /// For checking a client's rate: e.g. at most `rate + burst` calls in any second.
    pub fn max_calls_in_window(&self, window: Duration) -> usize {
        let mut times = self.shared.calls.all_times();
        times.sort_unstable();
        max_in_window(&times, duration_nanos(window))
    }

    /// The instants of the counted calls for `id`, sorted (within the same
    /// [`MAX_CALL_TIMES`] cap as [`FakeApi::call_times`]). Calls are told apart by the
    /// 64-bit xxh3 hash of their ID, so two IDs with the same hash (odds 2^-64 per pair)
    /// would share their timestamps.
    pub fn calls_per_id_times(&self, id: &str) -> Vec<Instant> {
        let mut times = self.shared.calls.id_times(xxh3_64(id.as_bytes()));
        times.sort_unstable();
        self.shared.calls.to_instants(times)
    }

    /// The outage switch. `set_down(true)` closes the listening socket (new connections
    /// are refused at the TCP level) and closes every open connection, keep-alive or
    /// in flight (their requests get no answer, so clients see connection errors rather
    /// than hangs); a request that still arrives on an open connection while down gets its
    /// connection dropped and is not counted. `set_down(false)` binds a new listener on
    /// the same address (with `SO_REUSEADDR`), so [`FakeApi::url_template`] works again.
    /// Returns once the change is in effect; setting the current state again does nothing.
    ///
    /// Should binding the port again fail (another process took it meanwhile), it is
    /// retried for about 5 s, after which the server stays down ([`FakeApi::is_down`]) and
    /// an error is logged. After [`FakeApi::shutdown`] this only sets the flag.
    pub async fn set_down(&self, down: bool) {
        if down {
            // At once, so requests racing with the switch are dropped.
            self.shared.down.store(true, Ordering::SeqCst);
        }
        let (done, done_rx) = oneshot::channel();
        if self.control.set_down.send(SetDown { down, done }).is_ok() {
            let _ = done_rx.await;
        } else if !down {
            // The accept loop is gone (shut down): there is nothing to bring up.
            tracing::debug!("fake API: set_down(false) after shutdown");
        }
    }

    /// Whether the server is down ([`FakeApi::set_down`]).
    pub fn is_down(&self) -> bool {
        self.shared.down.load(Ordering::SeqCst)
    }

    /// Sets the hidden capacity: a token bucket refilled at `per_second` tokens a second
    /// holding at most `max(1, per_second / 10)` tokens. Each counted request takes one;
    /// a request finding none answers 429 `{"error":"rate limited"}` at once (no latency;
    /// see [`FakeApi::set_retry_after_on_429`]) before its ID's own fault applies. Such a
    /// 429 is a call ([`FakeApi::calls`], [`FakeApi::total_calls`], the timestamps) and is
    /// also counted by [`FakeApi::rejected_429`], but it does not use up one of the ID's
    /// `transient_attempts`: the attempt number that drives faults and latency counts only
    /// the calls the capacity let through.
    ///
    /// `None` (the default) is unlimited. The capacity can change at any time: tokens are
    /// refilled at the old rate up to now, then capped at the new burst; going from
    /// unlimited to limited starts with a full bucket. A NaN or negative `per_second` is 0
    /// (only the one initial token is ever granted), an infinite one is `None`.
    pub fn set_capacity(&self, per_second: Option<f64>) {
        self.shared.limiter.set_capacity(per_second, Instant::now());
    }

    /// The `Retry-After` header (in seconds) of capacity 429s; `None` (the default) sends
    /// none. Does not affect [`Fault::Throttled`] answers (see
    /// [`ApiConfig::retry_after_secs`]).
    pub fn set_retry_after_on_429(&self, secs: Option<u64>) {
        lock(&self.shared.limiter.bucket).retry_after = secs;
    }

    /// Calls answered 429 because the hidden capacity was exhausted (not those answered
    /// 429 by [`Fault::Throttled`]).
    pub fn rejected_429(&self) -> u64 {
        self.shared.rejected_429.load(Ordering::Relaxed)
    }

    /// Calls answered 200 (counted when the answer is produced, so not yet counted during
    /// the latency before it).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
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
    addr: SocketAddr,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    mut set_down: mpsc::UnboundedReceiver<SetDown>,
) {
    // `None` while down.
    let mut listener = Some(listener);
    let mut conns = JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.keep_alive(true);
    loop {
        tokio::select! {
            biased;
            // Ok (true was sent) or Err (every FakeApi was dropped): stop either way.
            _ = shutdown.changed() => break,
            Some(SetDown { down, done }) = set_down.recv() => {
                if down {
                    shared.down.store(true, Ordering::SeqCst);
                    // Closing the listening socket makes new connections refused (and
                    // resets those still in its backlog); aborting the connection tasks
                    // closes their sockets.
                    listener = None;
                    conns.shutdown().await;
                } else if listener.is_none() {
                    listener = rebind_retrying(addr, &mut shutdown).await;
                    if listener.is_some() {
                        shared.down.store(false, Ordering::SeqCst);
                    }
                }
                let _ = done.send(());
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = accept(listener.as_ref()) => match accepted {
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

/// Accepts on `listener`, or never completes if there is none (the server is down).
async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// A new listener on `addr` (the port the server had), with `SO_REUSEADDR` so the
/// connections just closed (in TIME_WAIT) do not prevent it.
fn rebind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// [`rebind`], retried every 10 ms for about 5 s; `None` if that failed or the server is
/// being shut down.
async fn rebind_retrying(
    addr: SocketAddr,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<TcpListener> {
    let mut last_error = None;
    for _ in 0..500 {
        match rebind(addr) {
            Ok(listener) => return Some(listener),
            Err(e) => last_error = Some(e),
        }
        tokio::select! {
            _ = shutdown.changed() => return None,
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
    if let Some(e) = last_error {
        tracing::error!("fake API: binding {addr} again failed, staying down: {e}");
    }
    None
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
    if shared.down.load(Ordering::Relaxed) {
        // A request on a connection opened before the outage, racing with its closing.
        return Err(DropConnection);
    }
    let config = &shared.config;
    let id_hash = xxh3_64(id.as_bytes());
    let now = Instant::now();
    let admitted = shared.limiter.try_acquire(now);
    let attempt = shared.calls.record(&id, id_hash, admitted.is_ok(), now);
    if let Err(retry_after) = admitted {
        shared.rejected_429.fetch_add(1, Ordering::Relaxed);
        return Ok(too_many_requests("rate limited", retry_after));
    }
    let transient = attempt <= u64::from(config.transient_attempts);
    let fault = config.fault(&id);
    if fault == Fault::Slow && transient {
        tokio::time::sleep(config.slow_delay).await;
        return Ok(shared.success(&id, id_hash));
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
        Fault::Throttled if transient => {
            too_many_requests("throttled", Some(config.retry_after_secs))
        }
        _ => shared.success(&id, id_hash),
    })
}

impl Shared {
    /// [`success`], counted by [`FakeApi::accepted`].
    fn success(&self, id: &str, id_hash: u64) -> Resp {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        success(id, id_hash)
    }
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

/// 429 `{"error":"<message>"}`, with a `Retry-After: <secs>` header if `retry_after`.
fn too_many_requests(message: &'static str, retry_after: Option<u64>) -> Resp {
    let mut resp = error_response(StatusCode::TOO_MANY_REQUESTS, message);
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
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
        "rate limited" => Bytes::from_static(br#"{"error":"rate limited"}"#),
        "throttled" => Bytes::from_static(br#"{"error":"throttled"}"#),
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

/// Per-ID call counts and call timestamps, sharded by ID hash so concurrent connections
/// rarely contend.
struct CallCounter {
    shards: Box<[Mutex<Shard>]>,
    total: AtomicU64,
    /// Timestamps are nanoseconds since this instant.
    base: Instant,
    /// Only the first `time_cap` calls are timestamped ([`MAX_CALL_TIMES`]).
    time_cap: u64,
}

#[derive(Default)]
struct Shard {
    /// Calls per ID.
    counts: HashMap<String, u64>,
    /// Calls per ID rejected by the hidden capacity; empty unless one was.
    rejected: HashMap<String, u64>,
    /// (ID hash, nanoseconds since `base`) of the calls of this shard's IDs, unsorted.
    times: Vec<(u64, u64)>,
}

impl CallCounter {
    fn new() -> Self {
        Self::with_time_cap(MAX_CALL_TIMES)
    }

    fn with_time_cap(time_cap: usize) -> Self {
        CallCounter {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            total: AtomicU64::new(0),
            base: Instant::now(),
            time_cap: time_cap as u64,
        }
    }

    fn shard(&self, id_hash: u64) -> MutexGuard<'_, Shard> {
        lock(&self.shards[(id_hash % SHARDS as u64) as usize])
    }

    /// Counts one call made at `at` (`admitted` = it passed the hidden capacity) and
    /// returns its attempt number: the number of admitted calls for the ID so far,
    /// including this one if admitted (1 for the first call when there is no capacity).
    fn record(&self, id: &str, id_hash: u64, admitted: bool, at: Instant) -> u64 {
        let index = self.total.fetch_add(1, Ordering::Relaxed);
        let nanos = duration_nanos(at.saturating_duration_since(self.base));
        let mut shard = self.shard(id_hash);
        if index < self.time_cap {
            shard.times.push((id_hash, nanos));
        }
        let count = match shard.counts.get_mut(id) {
            Some(count) => {
                *count += 1;
                *count
            }
            None => {
                shard.counts.insert(id.to_owned(), 1);
                1
            }
        };
        if !admitted {
            *shard.rejected.entry(id.to_owned()).or_insert(0) += 1;
        }
        if shard.rejected.is_empty() {
            count
        } else {
            count - shard.rejected.get(id).copied().unwrap_or(0)
        }
    }

    fn get(&self, id: &str) -> u64 {
        let shard = self.shard(xxh3_64(id.as_bytes()));
        shard.counts.get(id).copied().unwrap_or(0)
    }

    fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    fn distinct(&self) -> usize {
        self.shards.iter().map(|s| lock(s).counts.len()).sum()
    }

    fn snapshot(&self) -> HashMap<String, u64> {
        let mut all = HashMap::with_capacity(self.distinct());
        for shard in self.shards.iter() {
            all.extend(lock(shard).counts.iter().map(|(k, v)| (k.clone(), *v)));
        }
        all
    }

    /// Every recorded timestamp (nanoseconds since `base`), unsorted.
    fn all_times(&self) -> Vec<u64> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            all.reserve(shard.times.len());
            all.extend(shard.times.iter().map(|&(_, t)| t));
        }
        all
    }

    /// The recorded timestamps of the ID with this hash, unsorted.
    fn id_times(&self, id_hash: u64) -> Vec<u64> {
        let shard = self.shard(id_hash);
        shard
            .times
            .iter()
            .filter(|&&(h, _)| h == id_hash)
            .map(|&(_, t)| t)
            .collect()
    }

    fn to_instants(&self, nanos: Vec<u64>) -> Vec<Instant> {
        nanos
            .into_iter()
            .map(|n| self.base + Duration::from_nanos(n))
            .collect()
    }
}

/// The largest number of `sorted` values within one half-open window `[t, t + window)`.
fn max_in_window(sorted: &[u64], window: u64) -> usize {
    let mut best = 0;
    let mut start = 0;
    for (end, &t) in sorted.iter().enumerate() {
        while t - sorted[start] >= window && start < end {
            start += 1;
        }
        if t - sorted[start] < window {
            best = best.max(end + 1 - start);
        }
    }
    best
}

/// `d` in nanoseconds, saturating (at 584 years).
fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------
// Hidden capacity

/// The token bucket of [`FakeApi::set_capacity`].
struct Limiter {
    /// Whether a capacity is set: lets the unlimited (default) path skip the lock.
    limited: AtomicBool,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    /// Tokens per second; `None` = unlimited.
    rate: Option<f64>,
    /// Most tokens the bucket holds: `max(1, rate / 10)`.
    burst: f64,
    tokens: f64,
    /// When `tokens` was last brought up to date.
    last: Instant,
    /// `Retry-After` of the 429s this bucket causes.
    retry_after: Option<u64>,
}

impl Limiter {
    fn new() -> Self {
        Limiter {
            limited: AtomicBool::new(false),
            bucket: Mutex::new(Bucket::new(Instant::now())),
        }
    }

    /// `Ok` if a request arriving at `now` may go on, else `Err(retry_after)`.
    fn try_acquire(&self, now: Instant) -> Result<(), Option<u64>> {
        if !self.limited.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut bucket = lock(&self.bucket);
        if bucket.try_take(now) {
            Ok(())
        } else {
            Err(bucket.retry_after)
        }
    }

    fn set_capacity(&self, per_second: Option<f64>, now: Instant) {
        let mut bucket = lock(&self.bucket);
        bucket.set_rate(per_second, now);
        self.limited.store(bucket.rate.is_some(), Ordering::Relaxed);
    }
}

impl Bucket {
    fn new(now: Instant) -> Self {
        Bucket {
            rate: None,
            burst: 1.0,
            tokens: 1.0,
            last: now,
            retry_after: None,
        }
    }

    /// Adds the tokens earned at the current rate since `last`. `now` may be a little
    /// older than `last` (taken before the lock by another request): that adds nothing.
    fn refill(&mut self, now: Instant) {
        if let Some(rate) = self.rate {
            let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(self.burst);
        }
        self.last = self.last.max(now);
    }

    fn try_take(&mut self, now: Instant) -> bool {
        if self.rate.is_none() {
            return true;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn set_rate(&mut self, per_second: Option<f64>, now: Instant) {
        let rate = match per_second {
            Some(r) if r.is_infinite() && r > 0.0 => None,
            Some(r) if r >= 0.0 => Some(r),
            Some(_) => Some(0.0), // NaN, negative
            None => None,
        };
        let was_limited = self.rate.is_some();
        self.refill(now);
        self.rate = rate;
        if let Some(rate) = rate {
            self.burst = (rate / 10.0).max(1.0);
            self.tokens = if was_limited {
                self.tokens.min(self.burst)
            } else {
                self.burst
            };
        }
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
                    Fault::Throttled => "throttled",
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
            ApiConfig {
                throttled_per_mille: 40,
                ..ApiConfig::faulty()
            },
        ] {
            let counts = count(&config);
            for (name, per_mille) in [
                ("not_found", config.not_found_per_mille),
                ("unavailable", config.unavailable_per_mille),
                ("drop", config.drop_per_mille),
                ("slow", config.slow_per_mille),
                ("throttled", config.throttled_per_mille),
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
        // Throttled comes last in the per-mille space.
        let all = ApiConfig {
            slow_per_mille: 900,
            throttled_per_mille: 300,
            ..ApiConfig::fast()
        };
        let counts = count(&all);
        assert!(!counts.contains_key("none"));
        let throttled = f64::from(counts["throttled"]);
        assert!(
            (throttled - 1000.0).abs() < 4.0 * 1000f64.sqrt() + 5.0,
            "{throttled}"
        );
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

    // -----------------------------------------------------------------------
    // Call timestamps

    #[tokio::test]
    async fn call_times_are_recorded() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        assert!(api.call_times().is_empty());
        assert_eq!(api.max_calls_in_window(Duration::from_secs(1)), 0);
        let before = Instant::now();
        for id in ["a", "b", "a", "c", "a"] {
            let (status, _) = get_json(&c, &item_url(&api, id)).await;
            assert_eq!(status, 200);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Uncounted requests are not timestamped.
        let (status, _) = get_json(&c, &format!("http://{}/nope", api.addr())).await;
        assert_eq!(status, 404);
        let after = Instant::now();
        let times = api.call_times();
        assert_eq!(times.len(), 5);
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert!(times[0] >= before && times[4] <= after);
        // Spaced by the 20 ms sleeps.
        assert!(times
            .windows(2)
            .all(|w| w[1] - w[0] >= Duration::from_millis(20)));

        let a = api.calls_per_id_times("a");
        assert_eq!(a.len(), 3);
        assert_eq!(a, vec![times[0], times[2], times[4]]);
        assert_eq!(api.calls_per_id_times("b"), vec![times[1]]);
        assert_eq!(api.calls_per_id_times("c"), vec![times[3]]);
        assert!(api.calls_per_id_times("never").is_empty());

        assert_eq!(api.max_calls_in_window(Duration::from_secs(10)), 5);
        assert_eq!(api.max_calls_in_window(Duration::from_nanos(1)), 1);
        assert_eq!(api.max_calls_in_window(Duration::ZERO), 0);
        assert_eq!(
            api.max_calls_in_window(times[4] - times[0]),
            4,
            "half-open window"
        );
        assert_eq!(
            api.max_calls_in_window(times[4] - times[0] + Duration::from_nanos(1)),
            5
        );
        api.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn call_times_under_concurrency() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        let mut tasks = JoinSet::new();
        for _ in 0..8 {
            let (c, api) = (c.clone(), api.clone());
            tasks.spawn(async move {
                for n in 0..50 {
                    let resp = c.get(item_url(&api, &format!("k{}", n % 10))).send().await;
                    resp.unwrap().bytes().await.unwrap();
                }
            });
        }
        while let Some(res) = tasks.join_next().await {
            res.unwrap();
        }
        assert_eq!(api.call_times().len(), 400);
        for n in 0..10 {
            let id = format!("k{n}");
            assert_eq!(api.calls_per_id_times(&id).len() as u64, api.calls(&id));
        }
        assert_eq!(api.max_calls_in_window(Duration::from_secs(3600)), 400);
        api.shutdown().await;
    }

    #[test]
    fn max_in_window_sweeps() {
        assert_eq!(max_in_window(&[], 10), 0);
        assert_eq!(max_in_window(&[5], 0), 0);
        assert_eq!(max_in_window(&[5], 1), 1);
        assert_eq!(max_in_window(&[5, 5, 5], 1), 3);
        let t = [0, 1, 2, 10, 11, 12, 13, 30];
        assert_eq!(max_in_window(&t, 1), 1);
        assert_eq!(max_in_window(&t, 3), 3);
        assert_eq!(max_in_window(&t, 4), 4);
        assert_eq!(max_in_window(&t, 12), 5); // [2, 14)
        assert_eq!(max_in_window(&t, 14), 7); // [0, 14)
        assert_eq!(max_in_window(&t, 31), 8);
        // Against brute force.
        let mut x = 1u64;
        let mut v: Vec<u64> = (0..300)
            .map(|_| {
                x = mix64(x);
                x % 1000
            })
            .collect();
        v.sort_unstable();
        for window in [0, 1, 7, 50, 333, 1000, 5000] {
            let brute = v
                .iter()
                .map(|&s| v.iter().filter(|&&t| t >= s && t - s < window).count())
                .max()
                .unwrap();
            assert_eq!(max_in_window(&v, window), brute, "{window}");
        }
    }

    #[test]
    fn call_times_are_capped() {
        let counter = CallCounter::with_time_cap(3);
        let now = Instant::now();
        for n in 0..5u32 {
            let id = if n % 2 == 0 { "x" } else { "y" };
            let at = now + Duration::from_millis(u64::from(n));
            counter.record(id, xxh3_64(id.as_bytes()), true, at);
        }
        assert_eq!(counter.total(), 5);
        assert_eq!(counter.get("x"), 3);
        let mut all = counter.all_times();
        all.sort_unstable();
        let all = counter.to_instants(all);
        assert_eq!(all.len(), 3);
        assert_eq!(all[0], now);
        assert_eq!(all[2], now + Duration::from_millis(2));
        assert_eq!(counter.id_times(xxh3_64(b"x")).len(), 2);
        assert_eq!(counter.id_times(xxh3_64(b"y")).len(), 1);
    }

    // -----------------------------------------------------------------------
    // Outage switch

    #[tokio::test]
    async fn outage_refuses_connections_then_recovers() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let url = item_url(&api, "o");
        let pooled = reqwest::Client::builder()
            .no_proxy()
            .retry(reqwest::retry::never())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let (status, _) = get_json(&pooled, &url).await;
        assert_eq!(status, 200);
        // A raw keep-alive connection with a request answered.
        let mut raw = TcpStream::connect(api.addr()).await.unwrap();
        raw.write_all(b"GET /items/r HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = raw.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        assert!(!api.is_down());

        api.set_down(true).await;
        assert!(api.is_down());
        // The open connection was closed.
        let read = tokio::time::timeout(Duration::from_secs(2), raw.read(&mut buf))
            .await
            .expect("closed, not hanging");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        // New connections are refused.
        let err = TcpStream::connect(api.addr()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        let err = client().get(&url).send().await.unwrap_err();
        assert!(err.is_connect(), "{err:?}");
        // The pooled client fails too (its connection was closed), without hanging.
        let started = Instant::now();
        assert!(pooled.get(&url).send().await.is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
        // Idempotent.
        api.set_down(true).await;
        assert!(api.is_down());

        api.set_down(false).await;
        assert!(!api.is_down());
        let (status, body) = get_json(&client(), &api.url_template().replace("{id}", "o")).await;
        assert_eq!(status, 200);
        assert_eq!(body, api.expected_body("o"));
        let (status, _) = get_json(&pooled, &url).await;
        assert_eq!(status, 200);
        api.set_down(false).await;
        assert!(!api.is_down());
        // Only answered requests were counted.
        assert_eq!(api.calls("o"), 3);
        assert_eq!(api.total_calls(), 4);

        // Down again, and shutting down while down.
        api.set_down(true).await;
        let clone = api.clone();
        api.shutdown().await;
        assert!(TcpStream::connect(clone.addr()).await.is_err());
        clone.set_down(false).await; // nothing to bring up: returns
    }

    #[tokio::test]
    async fn requests_racing_an_outage_get_their_connection_dropped() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let mut raw = TcpStream::connect(api.addr()).await.unwrap();
        // As if set_down(true) had set the flag but not yet closed the connections.
        api.shared.down.store(true, Ordering::SeqCst);
        raw.write_all(b"GET /items/r HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), raw.read_to_end(&mut buf))
            .await
            .expect("dropped, not hanging");
        assert!(
            read.is_err() || buf.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&buf)
        );
        assert_eq!(api.total_calls(), 0);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn in_flight_requests_fail_when_going_down() {
        let config = ApiConfig {
            latency_min: Duration::from_secs(30),
            latency_max: Duration::from_secs(30),
            ..ApiConfig::fast()
        };
        let api = FakeApi::start(config).await.unwrap();
        let c = client();
        let url = item_url(&api, "slowpoke");
        let request = tokio::spawn(async move { c.get(url).send().await });
        while api.total_calls() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        api.set_down(true).await;
        let result = tokio::time::timeout(Duration::from_secs(2), request)
            .await
            .expect("no hang")
            .unwrap();
        assert!(result.is_err(), "{result:?}");
        api.shutdown().await;
    }

    // -----------------------------------------------------------------------
    // Hidden capacity

    #[test]
    fn bucket_refills_and_switches_rates() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = Bucket::new(t0);
        // Unlimited.
        assert!((0..1000).all(|_| b.try_take(t0)));
        // 100/s: burst 10, starting full.
        b.set_rate(Some(100.0), t0);
        assert_eq!(b.burst, 10.0);
        assert_eq!((0..20).filter(|_| b.try_take(t0)).count(), 10);
        // 50 ms later: 5 tokens.
        assert_eq!((0..20).filter(|_| b.try_take(at(50))).count(), 5);
        // A `now` older than the last update adds nothing.
        assert!(!b.try_take(at(40)));
        // Refilled at the old rate up to the switch: 30 ms at 100/s = 3 tokens, then
        // 1/s (burst 1) caps them at 1.
        b.set_rate(Some(1.0), at(80));
        assert_eq!(b.burst, 1.0);
        assert_eq!((0..5).filter(|_| b.try_take(at(80))).count(), 1);
        assert!(!b.try_take(at(500)));
        assert!(b.try_take(at(1080)));
        // Back to a higher rate: keeps the (empty) bucket, does not refill it at once.
        b.set_rate(Some(1000.0), at(1080));
        assert!(!b.try_take(at(1080)));
        assert_eq!((0..500).filter(|_| b.try_take(at(1090))).count(), 10);
        // Never more than the burst.
        assert_eq!((0..500).filter(|_| b.try_take(at(60_000))).count(), 100);
        // Unlimited again, then limited again starts full.
        b.set_rate(None, at(60_000));
        assert!((0..1000).all(|_| b.try_take(at(60_000))));
        b.set_rate(Some(20.0), at(60_000));
        assert_eq!((0..10).filter(|_| b.try_take(at(60_000))).count(), 2);
        // Odd rates.
        b.set_rate(Some(f64::NAN), at(60_000));
        assert_eq!(b.rate, Some(0.0));
        b.set_rate(Some(-5.0), at(60_000));
        assert_eq!(b.rate, Some(0.0));
        assert!(!b.try_take(at(120_000)));
        b.set_rate(Some(f64::INFINITY), at(120_000));
        assert_eq!(b.rate, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn capacity_limits_accepted_calls() {
        const RATE: f64 = 50.0;
        const TASKS: usize = 8;
        const PER_TASK: usize = 50;
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        api.set_capacity(Some(RATE));
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for t in 0..TASKS {
            let (c, api) = (c.clone(), api.clone());
            tasks.spawn(async move {
                let mut statuses = Vec::new();
                // 8 tasks x 25 requests/s = 200/s offered for ~2 s.
                let mut tick = tokio::time::interval(Duration::from_millis(40));
                for n in 0..PER_TASK {
                    tick.tick().await;
                    let resp = c
                        .get(item_url(&api, &format!("t{t}-{n}")))
                        .send()
                        .await
                        .unwrap();
                    let status = resp.status().as_u16();
                    if status == 429 {
                        assert!(resp.headers().get(RETRY_AFTER).is_none());
                        let body: serde_json::Value =
                            serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
                        assert_eq!(body, serde_json::json!({"error": "rate limited"}));
                    } else {
                        resp.bytes().await.unwrap();
                    }
                    statuses.push(status);
                }
                statuses
            });
        }
        let mut ok = 0u64;
        let mut limited = 0u64;
        while let Some(res) = tasks.join_next().await {
            for status in res.unwrap() {
                match status {
                    200 => ok += 1,
                    429 => limited += 1,
                    other => panic!("status {other}"),
                }
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        let total = (TASKS * PER_TASK) as u64;
        let burst = (RATE / 10.0).max(1.0);
        let slack = 10.0;
        let accepted = api.accepted() as f64;
        assert!(
            accepted >= RATE * elapsed - slack && accepted <= RATE * elapsed + burst + slack,
            "accepted {accepted} in {elapsed:.2} s"
        );
        assert_eq!(api.accepted(), ok);
        assert_eq!(api.rejected_429(), limited);
        assert_eq!(ok + limited, total);
        assert_eq!(api.total_calls(), total);
        assert_eq!(api.call_times().len() as u64, total);
        // A rejected call is a call of its ID.
        assert!(api.calls_snapshot().values().all(|&n| n == 1));
        // In any second, no more than the rate plus the burst were accepted; with the
        // 429s, far more calls came.
        assert!(api.max_calls_in_window(Duration::from_secs(1)) > 100);
        api.shutdown().await;
    }

    #[tokio::test]
    async fn capacity_retry_after_and_changes() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = client();
        // Burst 1 at 1/s: the second request at once is rejected.
        api.set_capacity(Some(1.0));
        api.set_retry_after_on_429(Some(3));
        let (status, _) = get_json(&c, &item_url(&api, "a")).await;
        assert_eq!(status, 200);
        let resp = c.get(item_url(&api, "a")).send().await.unwrap();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[RETRY_AFTER], "3");
        api.set_retry_after_on_429(None);
        let resp = c.get(item_url(&api, "a")).send().await.unwrap();
        assert_eq!(resp.status(), 429);
        assert!(resp.headers().get(RETRY_AFTER).is_none());
        assert_eq!((api.accepted(), api.rejected_429()), (1, 2));
        assert_eq!(api.calls("a"), 3);
        // Unlimited again.
        api.set_capacity(None);
        for _ in 0..20 {
            let (status, _) = get_json(&c, &item_url(&api, "b")).await;
            assert_eq!(status, 200);
        }
        assert_eq!((api.accepted(), api.rejected_429()), (21, 2));
        api.shutdown().await;
    }

    #[tokio::test]
    async fn capacity_comes_before_faults_and_spares_their_attempts() {
        let config = ApiConfig {
            unavailable_per_mille: 1000,
            transient_attempts: 1,
            ..ApiConfig::fast()
        };
        let api = FakeApi::start(config).await.unwrap();
        let c = client();
        api.set_capacity(Some(0.0)); // only the initial token
        let (status, body) = get_json(&c, &item_url(&api, "u")).await;
        assert_eq!(
            (status, body),
            (503, serde_json::json!({"error": "unavailable"}))
        );
        let (status, body) = get_json(&c, &item_url(&api, "v")).await;
        assert_eq!(
            (status, body),
            (429, serde_json::json!({"error": "rate limited"}))
        );
        let (status, _) = get_json(&c, &item_url(&api, "v")).await;
        assert_eq!(status, 429);
        api.set_capacity(None);
        // "v" still gets its one transient 503: the 429s did not use it up.
        let (status, _) = get_json(&c, &item_url(&api, "v")).await;
        assert_eq!(status, 503);
        let (status, body) = get_json(&c, &item_url(&api, "v")).await;
        assert_eq!((status, body), (200, api.expected_body("v")));
        assert_eq!(api.calls("v"), 4);
        assert_eq!((api.accepted(), api.rejected_429()), (1, 2));
        api.shutdown().await;
    }

    // -----------------------------------------------------------------------
    // Throttled fault

    #[tokio::test]
    async fn throttled_fault_heals() {
        let config = ApiConfig {
            retry_after_secs: 7,
            ..ApiConfig::faulty()
        };
        assert_eq!(ApiConfig::faulty().throttled_per_mille, 0);
        assert_eq!(ApiConfig::demo().throttled_per_mille, 0);
        assert_eq!(ApiConfig::fast().retry_after_secs, 1);
        let config = ApiConfig {
            throttled_per_mille: 50,
            ..config
        };
        let id = id_with(&config, "th-", Fault::Throttled);
        let api = FakeApi::start(config).await.unwrap();
        let c = client();
        for attempt in 1..=api.config().transient_attempts {
            let resp = c.get(item_url(&api, &id)).send().await.unwrap();
            assert_eq!(resp.status(), 429, "attempt {attempt}");
            assert_eq!(resp.headers()[RETRY_AFTER], "7");
            let body: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
            assert_eq!(body, serde_json::json!({"error": "throttled"}));
        }
        let (status, body) = get_json(&c, &item_url(&api, &id)).await;
        assert_eq!(status, 200);
        assert_eq!(body, api.expected_body(&id));
        assert_eq!(api.calls(&id), 3);
        // Fault 429s are not capacity 429s.
        assert_eq!((api.accepted(), api.rejected_429()), (1, 0));
        api.shutdown().await;
    }
}
