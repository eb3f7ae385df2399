//! Stopping a run: the stop pair (a cloneable [`StopHandle`] that asks, a [`Stop`] the run
//! listens on), and the run stopping itself ([`Halt`]: a panicking worker, a failing writer,
//! `--max-failures`, an outage past `--max-outage`, a rejected credential), with its
//! [`HaltKind`] and why.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};

use tokio::sync::Notify;

use crate::progress::{HaltKind, Halted};

/// Asks a run to stop. Cloneable; `stop` is idempotent.
#[derive(Clone)]
pub struct StopHandle(Arc<Flag>);

/// A run's view of stop requests.
///
/// Every item's attempt waits on it beside its work (several times per item), so a wait
/// costs no shared write unless it has to sleep: a flag and a [`Notify`], not a `watch`
/// channel, whose waits cloned a receiver (two shared counters) and took its lock each time.
#[derive(Clone)]
pub(crate) struct Stop(Arc<Flag>);

struct Flag {
    stopping: AtomicBool,
    changed: Notify,
}

/// A connected pair: the handle asks, the run listens.
pub(crate) fn stop_pair() -> (StopHandle, Stop) {
    let flag = Arc::new(Flag {
        stopping: AtomicBool::new(false),
        changed: Notify::new(),
    });
    (StopHandle(flag.clone()), Stop(flag))
}

impl StopHandle {
    /// Ask the run to stop: it dispatches nothing more and lets calls in flight finish.
    pub fn stop(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

impl Stop {
    /// Whether a stop was asked for.
    pub(crate) fn is_stopping(&self) -> bool {
        self.0.stopping.load(Ordering::SeqCst)
    }

    /// Resolves once a stop was asked for.
    pub(crate) async fn stopping(&self) {
        // Created before the flag is read, so a stop in between is not missed: a
        // `notify_waiters` after this point completes it.
        let changed = self.0.changed.notified();
        if self.is_stopping() {
            return;
        }
        changed.await;
    }
}

/// Stops the run if dropped while it holds the stop handle.
pub(super) struct StopOnDrop<'a>(pub(super) Option<&'a StopHandle>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(stop) = self.0 {
            stop.stop();
        }
    }
}

pub(super) struct HaltOnPanic<'a>(pub(super) &'a Halt);

impl Drop for HaltOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.halt(
                HaltKind::Internal,
                "internal error: an item worker panicked".into(),
            );
        }
    }
}

/// A run stopping itself, and why.
pub(super) struct Halt {
    pub(super) stop: StopHandle,
    pub(super) reason: std::sync::Mutex<Option<Halted>>,
}

impl Halt {
    pub(super) fn new(stop: StopHandle) -> Halt {
        Halt {
            stop,
            reason: std::sync::Mutex::new(None),
        }
    }

    /// The first halt's kind and reason, if the run halted.
    pub(super) fn reason(&self) -> Option<Halted> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stop the run for `reason`; the first halt is the one reported.
    pub(super) fn halt(&self, kind: HaltKind, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if r.is_none() {
            tracing::error!("{reason}");
            *r = Some(Halted { kind, reason });
        }
        self.stop.stop();
    }
}
