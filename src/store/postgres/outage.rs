//! Waiting out a database outage: a restarting server, refused or lost connections. A
//! step of the store that meets one is tried again, on a new connection, with backoff, for
//! up to [`OUTAGE_LIMIT`]; what it was writing stays in memory meanwhile (results wait in
//! the store's buffer, the workers in the engine's bounded queues), so nothing is lost, and
//! every write being idempotent under its lease, nothing is doubled.

use std::time::{Duration, Instant};

use super::error::PgError;

/// How long a step waits out a database outage before it fails.
pub(crate) const OUTAGE_LIMIT: Duration = Duration::from_secs(300);

/// Backoff through a database outage: 100 ms doubling to 5 s, for [`OUTAGE_LIMIT`].
#[derive(Default)]
pub(crate) struct Outage {
    started: Option<Instant>,
    wait: Duration,
}

impl Outage {
    /// If `e` is an outage and the limit is not reached: wait, then true (try again).
    pub(crate) async fn wait(&mut self, e: &PgError) -> bool {
        if !is_outage(e) {
            return false;
        }
        let started = *self.started.get_or_insert_with(Instant::now);
        if started.elapsed() >= OUTAGE_LIMIT {
            return false;
        }
        self.wait = (self.wait * 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
        tracing::warn!(
            "the database is unreachable ({e}); trying again in {:?}",
            self.wait
        );
        tokio::time::sleep(self.wait).await;
        true
    }
}

/// Whether `e` says the database could not be reached or went away (not that it refused a
/// statement): a lost or refused connection, an I/O error, a server shutting down.
pub(crate) fn is_outage(e: &PgError) -> bool {
    match e {
        PgError::Connect { .. } => true,
        PgError::Sql { cause, .. } => {
            let io = std::error::Error::source(&cause.0)
                .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some());
            let code = cause.code().map(|c| c.code());
            cause.0.is_closed()
                || io
                || code.is_some_and(|c| c.starts_with("08") || c.starts_with("57P"))
        }
        _ => false,
    }
}
