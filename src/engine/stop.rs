//! Stopping a run: the stop pair (a cloneable [`StopHandle`] that asks, a [`Stop`] the run
//! listens on), and the run stopping itself ([`Halt`]: a panicking worker, a failing writer,
//! `--max-failures`, an outage past `--max-outage`), with why.

use std::sync::{Arc, PoisonError};

use tokio::sync::watch;

/// Asks a run to stop. Cloneable; `stop` is idempotent.
#[derive(Clone)]
pub struct StopHandle(Arc<watch::Sender<bool>>);

/// A run's view of stop requests.
#[derive(Clone)]
pub struct Stop(watch::Receiver<bool>);

/// A connected pair: the handle asks, the run listens.
pub fn stop_pair() -> (StopHandle, Stop) {
    let (tx, rx) = watch::channel(false);
    (StopHandle(Arc::new(tx)), Stop(rx))
}

impl StopHandle {
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

impl Stop {
    pub fn is_stopping(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once a stop was asked for.
    pub async fn stopping(&self) {
        let mut rx = self.0.clone();
        let _ = rx.wait_for(|stop| *stop).await;
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
            self.0
                .halt("internal error: an item worker panicked".into());
        }
    }
}

/// A run stopping itself, and why.
pub(super) struct Halt {
    pub(super) stop: StopHandle,
    pub(super) reason: std::sync::Mutex<Option<String>>,
}

impl Halt {
    pub(super) fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn halt(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if r.is_none() {
            tracing::error!("{reason}");
            *r = Some(reason);
        }
        self.stop.stop();
    }
}
