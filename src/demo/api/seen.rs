//! The requests the fake API saw, kept when a test asks ([`super::FakeApi::keep_requests`]):
//! for each ID, every request's method, path with query (as sent, percent-encoded) and body,
//! so a test checks on the server's side what a client sent for each ID.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// One request as the API received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// The HTTP method, upper case.
    pub method: String,
    /// The path and query as sent (percent-encoded).
    pub target: String,
    /// The body as text (empty without one; lossy if not UTF-8).
    pub body: String,
}

/// The requests kept, by ID (none unless switched on).
#[derive(Default)]
pub(super) struct Seen {
    on: AtomicBool,
    by_id: Mutex<HashMap<String, Vec<SeenRequest>>>,
}

impl Seen {
    pub(super) fn keep(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    pub(super) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub(super) fn record(&self, id: &str, request: SeenRequest) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_owned())
            .or_default()
            .push(request);
    }

    pub(super) fn of(&self, id: &str) -> Vec<SeenRequest> {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .unwrap_or_default()
    }
}
