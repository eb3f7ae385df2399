//! The state the server's tasks share ([`Shared`]), what only the `FakeApi` handles own
//! ([`Control`]), and the outage switch's request to the accept loop ([`SetDown`]).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::auth::Auth;
use super::calls::CallCounter;
use super::capacity::Limiter;
use super::faults::ApiConfig;
use super::llm::Meter;
use super::seen::Seen;
use super::windows::Windows;
use crate::clock::Clock;

/// State the request handlers share.
pub(super) struct Shared {
    pub(super) config: ApiConfig,
    pub(super) calls: CallCounter,
    /// Set while the server is down ([`FakeApi::set_down`]): requests that still arrive
    /// on an open connection get it dropped, uncounted.
    pub(super) down: AtomicBool,
    /// The hidden capacity ([`FakeApi::set_capacity`]).
    pub(super) limiter: Limiter,
    /// Calls answered 200.
    pub(super) accepted: AtomicU64,
    /// Calls answered 429 because the hidden capacity was exhausted.
    pub(super) rejected_429: AtomicU64,
    /// The quota windows ([`ApiConfig::windows`], [`FakeApi::set_windows`]).
    pub(super) windows: Windows,
    /// The token endpoint and the token check.
    pub(super) auth: Auth,
    /// The requests kept ([`FakeApi::keep_requests`]).
    pub(super) seen: Seen,
    /// Requests to the batch endpoint.
    pub(super) batch_requests: AtomicU64,
    /// Answers outside 2xx quote the request ([`FakeApi::echo_requests`]).
    pub(super) echo: AtomicBool,
    /// The language-model routes' window and credit ([`ApiConfig::llm`]), if configured.
    pub(super) llm: Option<Meter>,
    /// The IDs whose page [`ApiConfig::page_unavailable_once`] answered 503 already.
    pub(super) pages_refused: Mutex<std::collections::HashSet<String>>,
    /// The IDs whose page [`ApiConfig::page_pending_once`] answered pending already.
    pub(super) pages_pending: Mutex<std::collections::HashSet<String>>,
    /// The server's wall clock: its quota windows, the resets it announces.
    pub(super) clock: Clock,
}

/// Owned only by `FakeApi` clones: dropping the last one drops `shutdown`, which stops
/// the accept loop.
pub(super) struct Control {
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) accept_task: Mutex<Option<JoinHandle<()>>>,
    /// Outage switch requests to the accept loop, each acknowledged once applied.
    pub(super) set_down: mpsc::UnboundedSender<SetDown>,
}

/// Asks the accept loop to go down (close the listener, abort every connection) or up
/// (bind the same address again); `done` is sent once that is done.
pub(super) struct SetDown {
    pub(super) down: bool,
    pub(super) done: oneshot::Sender<()>,
}
