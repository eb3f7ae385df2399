//! The handle to a running fake API ([`FakeApi`]): starts the server, switches its faults,
//! capacity, windows and outage, and reads its counters.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use xxhash_rust::xxh3::xxh3_64;

use super::answers::expected_body;
use super::auth::Auth;
use super::batch;
use super::calls::{duration_nanos, max_in_window, CallCounter};
use super::capacity::Limiter;
use super::faults::{ApiConfig, Fault};
use super::llm::Meter;
use super::lock::lock;
use super::pages;
use super::seen::{Seen, SeenRequest};
use super::server::accept_loop;
use super::shared::{Control, SetDown, Shared};
use super::windows::{Announce, ApiWindow, Windows};
use crate::clock::Clock;

/// A running fake API server.
///
/// `FakeApi` is cheap to clone: clones share the same server and counters (it is an
/// `Arc` inside). The server stops when [`FakeApi::shutdown`] is called on any clone, or
/// when the last clone is dropped (the accept loop then stops and aborts the open
/// connections on its own), or when the runtime it was started on shuts down.
#[derive(Clone)]
pub struct FakeApi {
    pub(super) shared: Arc<Shared>,
    control: Arc<Control>,
    addr: SocketAddr,
}

impl FakeApi {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime, on the system's clock.
    pub async fn start(config: ApiConfig) -> io::Result<FakeApi> {
        FakeApi::start_with_clock(config, Clock::system()).await
    }

    /// [`FakeApi::start`] with its quota windows, the resets it announces and its tokens'
    /// expiry in `clock`'s wall time (its waits and token lifetimes are in tokio's time
    /// anyway): a run in simulated time gives it a [`crate::clock::SimulatedClock`]'s, the
    /// run's own or one of its own (whose jumps the run's clock does not make).
    pub async fn start_with_clock(config: ApiConfig, clock: Clock) -> io::Result<FakeApi> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            llm: config.llm.clone().map(Meter::new),
            windows: Windows::new(&config.windows, config.announce),
            calls: CallCounter::new(config.numbered_ids),
            config,
            down: AtomicBool::new(false),
            limiter: Limiter::new(),
            accepted: AtomicU64::new(0),
            rejected_429: AtomicU64::new(0),
            auth: Auth::new(clock.clone()),
            seen: Seen::default(),
            batch_requests: AtomicU64::new(0),
            echo: AtomicBool::new(false),
            pages_refused: Mutex::new(Default::default()),
            pages_pending: Mutex::new(Default::default()),
            clock,
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

    /// From now on (`true`) every answer outside 2xx but the token endpoint's quotes the
    /// request it answers: `{"error": "<reason>: <METHOD> <target>", "headers": {...}}`, the
    /// target with its query as sent and every header as received (an API key, a bearer
    /// token), as some APIs do in their errors.
    pub fn echo_requests(&self, on: bool) {
        self.shared.echo.store(on, Ordering::Relaxed);
    }

    /// Keep every request's method, target and body from now on, by ID ([`FakeApi::seen`]).
    pub fn keep_requests(&self) {
        self.shared.seen.keep(true);
    }

    /// The requests kept for `id`, oldest first.
    pub fn seen(&self, id: &str) -> Vec<SeenRequest> {
        self.shared.seen.of(id)
    }

    /// Requests to the batch endpoint (`/batch`) so far.
    pub fn batch_requests(&self) -> u64 {
        self.shared.batch_requests.load(Ordering::Relaxed)
    }

    /// The batch endpoint's URL for `{ids}` in the query (`http://127.0.0.1:PORT/batch?ids={ids}`).
    pub fn batch_url_template(&self) -> String {
        format!("http://{}/batch?ids={{ids}}", self.addr)
    }

    /// The paginated route with a `Link` header, for `{id}`
    /// (`http://127.0.0.1:PORT/pages/link/{id}`): `page` from 1, `per_page` items a page.
    pub fn pages_link_url_template(&self) -> String {
        format!("http://{}/pages/link/{{id}}", self.addr)
    }

    /// The paginated route with a cursor in the body, for `{id}`
    /// (`http://127.0.0.1:PORT/pages/cursor/{id}`): `cursor` from the last page, `limit` items
    /// a page.
    pub fn pages_cursor_url_template(&self) -> String {
        format!("http://{}/pages/cursor/{{id}}", self.addr)
    }

    /// The paginated route by offset, for `{id}` (`http://127.0.0.1:PORT/pages/offset/{id}`):
    /// `offset` items skipped, `limit` items a page.
    pub fn pages_offset_url_template(&self) -> String {
        format!("http://{}/pages/offset/{{id}}", self.addr)
    }

    /// Every item the paginated routes give for `id`, in order.
    pub fn page_items(&self, id: &str) -> Vec<serde_json::Value> {
        let count = pages::item_count(&self.shared.config, id);
        (0..count).map(|k| self.page_item(id, k)).collect()
    }

    /// Item `k` (from 0) of the items the paginated routes give for `id`.
    pub fn page_item(&self, id: &str, k: u64) -> serde_json::Value {
        pages::item(&self.shared.config, id, k)
    }

    /// Whether the batch endpoint leaves `id` out of answers to several IDs.
    pub fn batch_omits(&self, id: &str) -> bool {
        batch::omitted(&self.shared.config, id)
    }

    /// Whether `id` makes its whole batch answer 400.
    pub fn batch_poison(&self, id: &str) -> bool {
        batch::poison(&self.shared.config, id)
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

    /// The configuration the server was started with (the windows and their announcing may
    /// have changed since: [`FakeApi::set_windows`], [`FakeApi::set_announce`]).
    pub fn config(&self) -> &ApiConfig {
        &self.shared.config
    }

    /// The fault of `id`: a pure function of the config and the ID.
    pub fn fault(&self, id: &str) -> Fault {
        self.shared.config.fault(id)
    }

    /// The exact body a successful answer for `id` carries (see [`expected_body`], and
    /// [`super::profile_body`] under [`ApiConfig::profiles`]).
    pub fn expected_body(&self, id: &str) -> serde_json::Value {
        if self.shared.config.profiles && !id.starts_with(super::answers::TEXT_PREFIX) {
            return super::profile_body(id);
        }
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

    /// Number of different IDs requested more than once.
    pub fn repeated_ids(&self) -> usize {
        self.shared.calls.repeated()
    }

    /// A copy of the per-ID call counts.
    pub fn calls_snapshot(&self) -> HashMap<String, u64> {
        self.shared.calls.snapshot()
    }

    /// The instants of the counted calls (every call [`FakeApi::total_calls`] counts,
    /// including capacity and quota 429s), sorted. Only the first
    /// [`MAX_CALL_TIMES`](super::MAX_CALL_TIMES) calls are timestamped. A call's instant is
    /// taken when its request has been routed to an ID, before any latency.
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
    /// [`MAX_CALL_TIMES`](super::MAX_CALL_TIMES) cap as [`FakeApi::call_times`]). Calls are
    /// told apart by the 64-bit xxh3 hash of their ID, so two IDs with the same hash (odds
    /// 2^-64 per pair) would share their timestamps.
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
        self.shared
            .limiter
            .set_capacity(per_second, tokio::time::Instant::now());
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

    /// Replaces the quota windows ([`ApiConfig::windows`]); their counts, and
    /// [`FakeApi::window_peaks`], start again from zero. An empty list lifts them.
    pub fn set_windows(&self, windows: Vec<ApiWindow>) {
        self.shared.windows.set_windows(&windows);
    }

    /// Changes how the quota windows are announced ([`ApiConfig::announce`]).
    pub fn set_announce(&self, announce: Announce) {
        self.shared.windows.set_announce(announce);
    }

    /// Calls answered 429 `{"error":"quota exceeded"}` because a quota window was full
    /// (neither [`FakeApi::rejected_429`]'s nor [`Fault::Throttled`]'s). Such a call is a
    /// call of its ID, but it does not use up one of the ID's `transient_attempts`.
    pub fn window_refusals(&self) -> u64 {
        self.shared.windows.refusals()
    }

    /// When the windows' refusals ([`FakeApi::window_refusals`]) were made, in order (the
    /// first 100,000).
    pub fn window_refusal_times(&self) -> Vec<Instant> {
        self.shared.windows.refusal_times()
    }

    /// For each quota window definition (in the order of [`ApiConfig::windows`] or the
    /// last [`FakeApi::set_windows`]), the most requests any one of its windows accepted:
    /// never above its limit.
    pub fn window_peaks(&self) -> Vec<u64> {
        self.shared.windows.peaks()
    }

    /// Calls answered 200 (counted when the answer is produced, so not yet counted during
    /// the latency before it).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// From now on every item request needs `Authorization: Bearer <token>` with a token
    /// that has not expired, else it answers 401 with `WWW-Authenticate: Bearer
    /// error="invalid_token"` (not counted as a call of any ID: [`FakeApi::refused_401`]).
    /// Tokens live `lifetime`: those of the token endpoint from when they are issued (its
    /// `expires_in` says so, in whole seconds), command tokens from when first seen.
    pub fn require_token(&self, lifetime: Duration) {
        self.shared.auth.require(lifetime);
    }

    /// `http://127.0.0.1:PORT/oauth/token`: the token endpoint, which knows one client,
    /// [`CLIENT_ID`](super::CLIENT_ID) with [`CLIENT_SECRET`](super::CLIENT_SECRET) (HTTP Basic
    /// auth or form fields).
    pub fn token_url(&self) -> String {
        format!("http://{}/oauth/token", self.addr)
    }

    /// How the token endpoint reads the client's ID and secret (by default: decoded Basic
    /// auth or the form body).
    pub fn token_client_auth(&self, how: super::TokenClientAuth) {
        self.shared.auth.set_client_auth(how);
    }

    /// Every token seen or issued so far expires now (tokens issued after live their
    /// lifetime): a credential that expires at a moment the test chooses.
    pub fn expire_tokens(&self) {
        self.shared.auth.expire_all();
    }

    /// Refuse the client secret (`true`: 401 `invalid_client`) or accept it again.
    pub fn revoke_client_secret(&self, revoked: bool) {
        self.shared.auth.revoke(revoked);
    }

    /// Any token that starts with this (random per server) is valid for the lifetime from
    /// when the API first sees it: what a credential command can print with no network tool.
    pub fn command_token_prefix(&self) -> String {
        self.shared.auth.command_prefix().to_string()
    }

    /// Append every token the endpoint issues to `path`, as a line `TOKEN EXPIRY_MS` (its
    /// expiry in Unix milliseconds): for a process of an exec job to check its token.
    pub fn write_tokens_to(&self, path: std::path::PathBuf) {
        self.shared.auth.set_ledger(path);
    }

    /// Tokens the token endpoint issued.
    pub fn tokens_issued(&self) -> u64 {
        self.shared.auth.issued()
    }

    /// When the token endpoint issued each token, oldest first (in tokio's time, so a test
    /// on a paused clock reads its simulated time).
    pub fn token_issue_times(&self) -> Vec<tokio::time::Instant> {
        self.shared.auth.issue_times()
    }

    /// Item requests answered 401 for want of a live token.
    pub fn refused_401(&self) -> u64 {
        self.shared.auth.refused()
    }

    /// Every token seen or issued so far (to check none leaked anywhere).
    pub fn tokens(&self) -> Vec<String> {
        self.shared.auth.tokens()
    }

    /// `http://127.0.0.1:PORT/v1/chat/completions`: the OpenAI-shaped route ([`ApiConfig::llm`]).
    pub fn chat_completions_url(&self) -> String {
        format!("http://{}/v1/chat/completions", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1/messages`: the Anthropic-shaped route ([`ApiConfig::llm`]).
    pub fn messages_url(&self) -> String {
        format!("http://{}/v1/messages", self.addr)
    }

    /// Calls for `id` that were let through (answered, or being answered): [`FakeApi::calls`]
    /// without those the hidden capacity or the language-model routes refused (their window
    /// or their credit).
    pub fn admitted_calls(&self, id: &str) -> u64 {
        self.shared.calls.admitted(id)
    }

    /// Adds `tokens` to the language-model routes' credit ([`super::LlmConfig::credit`]):
    /// requests refused for want of credit are answered again once it is above zero. Nothing
    /// without a credit limit.
    pub fn add_credit(&self, tokens: u64) {
        if let Some(meter) = &self.shared.llm {
            meter.add_credit(tokens);
        }
    }

    /// The language-model routes' credit left, in tokens (`None`: no limit, or no such routes).
    pub fn credit(&self) -> Option<u64> {
        self.shared.llm.as_ref().and_then(Meter::credit)
    }

    /// Tokens the language-model routes counted (prompts and completions) in each window that
    /// counted any: (the window's start in milliseconds since the Unix epoch, its tokens), in
    /// order.
    pub fn tokens_per_window(&self) -> Vec<(u64, u64)> {
        self.shared
            .llm
            .as_ref()
            .map_or_else(Vec::new, Meter::granted)
    }

    /// Language-model requests refused 429 because their window was at its request or token
    /// limit.
    pub fn llm_rate_refusals(&self) -> u64 {
        self.shared.llm.as_ref().map_or(0, Meter::rate_refusals)
    }

    /// Language-model requests refused because the credit was spent.
    pub fn credit_refusals(&self) -> u64 {
        self.shared.llm.as_ref().map_or(0, Meter::credit_refusals)
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
