//! Quotas: the calls an API allows over windows longer than a second (`10000/h`,
//! `15000/day`, a budget for the whole job), kept across runs, workers and crashes.
//!
//! The parts, one file each: `spec` (a [`Quota`]: its text and its windows' arithmetic),
//! `ledger` (the usage stored with the job, and the reservation that is the only way it
//! changes). The engine's gate (`engine::quotas`) makes every attempt take a call from each
//! quota before it starts, and waits while a window is spent; the job's budget, once spent,
//! stops the run.

mod ledger;
mod spec;

pub use ledger::{chunk, QuotaGrant, QuotaLedger, QuotaWant, SlotUse};
pub use spec::{Quota, QuotaParseError, Window, MIN_WINDOW, ROLLING_SLOTS};

use serde::Serialize;

/// Where one quota stands, for progress lines, `live.json` and `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuotaState {
    /// The quota as written back (`10000/1h`).
    pub quota: String,
    pub limit: u64,
    /// Calls counted in its window now, by every run and worker (as of the last
    /// reservation).
    pub used: u64,
    /// When (Unix ms) the window frees calls next; none for the job's budget.
    pub frees_at_ms: Option<u64>,
    /// Whether attempts are waiting for this window.
    pub exhausted: bool,
}
