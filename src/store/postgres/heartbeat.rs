//! The session's heartbeat: renewed in the background every third of its TTL (at most
//! every [`SHARE_FOLLOW`]: [`heartbeat_every`]) on a
//! connection of its own, its grant (rate share, shared pause) kept for the worker. A
//! renewal that finds the session expired drops every lease and registers a new session.

use std::sync::Weak;
use std::time::{Duration, Instant};

use super::connect::{connect, opened, Connecting};
use super::keys::WorkerId;
use super::session::{heartbeat, register_here, Grant, Heartbeat};
use super::state::{Inner, Session};

/// Renew the session every third of its TTL until the store is dropped, on the
/// connection opened for it ahead (`first`), then on one of its own.
pub(super) async fn keep_alive(inner: Weak<Inner>, first: Option<Connecting>) {
    let mut client = match first {
        Some(connecting) => opened(connecting).await.and_then(Result::ok),
        None => None,
    };
    // Results recorded at the last heartbeat, and when: for items/s in `status`.
    let mut last = (0u64, Instant::now());
    loop {
        let Some(store) = inner.upgrade() else { return };
        if client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            client = connect(&store.target, &store.options).await.ok();
        }
        if let Some(c) = client.as_mut() {
            let sent = Instant::now();
            let me = store.me();
            let (recorded, idle) = {
                let local = store.local();
                (local.recorded, local.idle)
            };
            let secs = last.1.elapsed().as_secs_f64().max(1e-3);
            let stats = serde_json::json!({
                "items": recorded,
                "items_per_s": (recorded - last.0) as f64 / secs,
            });
            last = (recorded, Instant::now());
            match heartbeat(c, store.job, &me, store.ttl, &stats, idle).await {
                Ok(Heartbeat::Renewed(grant)) => {
                    take_grant(&store, &me, sent, grant);
                }
                Ok(Heartbeat::Expired) => {
                    tracing::warn!(worker = %me, "the worker's session expired: its leases are void");
                    {
                        let mut local = store.local();
                        local.held.clear();
                        local.job_lease = None;
                    }
                    if let Ok(new) = register_here(c, store.job, store.ttl).await {
                        let mut local = store.local();
                        local.session = Session::new(new, sent + store.ttl);
                    }
                }
                Err(e) => {
                    tracing::warn!("the worker's heartbeat failed: {e}");
                    client = None;
                }
            }
        }
        // After the renewal: a worker's first grant tells it whether the job has a rate (a
        // joiner that waited ttl/3 with a share of 0 left the fleet a worker short for 10 s).
        let every = heartbeat_every(store.ttl);
        let wake = store.wake.clone();
        drop(store);
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = wake.notified() => {}
        }
    }
}

/// Keep what a renewal sent at `sent` granted `me` (unless the session changed meanwhile).
pub(super) fn take_grant(store: &Inner, me: &WorkerId, sent: Instant, grant: Grant) {
    let received = Instant::now();
    let mut local = store.local();
    // A renewal sent before the one whose grant is kept (the background heartbeat racing
    // the one after a rate change) grants nothing newer.
    if local.session.me != *me || local.session.granted_sent.is_some_and(|t| sent < t) {
        return;
    }
    local.session.deadline = sent + store.ttl;
    if let Some(p) = grant.paused_for {
        // Counted from the answer: the pause is never cut short.
        let until = received + p;
        local.session.paused_until =
            Some(local.session.paused_until.map_or(until, |u| u.max(until)));
    }
    local.session.grant = Some(grant);
    local.session.granted_sent = Some(sent);
}

/// How long to wait between two heartbeats of a session living `ttl`: a third of it, and at
/// most [`SHARE_FOLLOW`], so that what the fleet shares follows workers joining and leaving
/// within a second or so rather than a third of the TTL: rate shares (at the default 30 s, a
/// newcomer waited 10 s with a share of 0 for the others to give up their excess) and the
/// parts of the API's announced windows (a worker not yet counting a newcomer takes all that
/// remains of a window the newcomer spends too; see `quota::pacer::JOIN_SETTLE`).
pub(super) fn heartbeat_every(ttl: Duration) -> Duration {
    (ttl / 3).min(SHARE_FOLLOW)
}

/// The longest wait between two heartbeats.
pub(super) const SHARE_FOLLOW: Duration = Duration::from_secs(1);
