//! Quotas: the calls an API allows over windows longer than a second (`10000/h`,
//! `15000/day`, a budget for the whole job), kept across runs, workers and crashes.
//!
//! The parts, one file each: `spec` (a [`Quota`]: its text and its windows' arithmetic),
//! `ledger` (the usage stored with the job, and the reservation that is the only way it
//! changes), `state` (where each quota stands, for reports), `announced` (the limits a
//! server announces in its answers' headers), `learned` (the windows nobody announces,
//! learnt from the API's refusals), `kept` (those windows as kept with the job, shared by a
//! fleet) and `pacer` (spreading what an announced or learnt
//! window has left until its reset). The engine's gate (`engine::quotas`) makes every
//! attempt take a call from each quota before it starts, and waits while a window is
//! spent; the job's budget, once spent, stops the run.

pub(crate) mod announced;
mod kept;
pub(crate) mod learned;
mod ledger;
pub(crate) mod pacer;
pub use pacer::{AnnouncedLimits, PolicyState};
mod spec;
mod state;

pub use kept::{merge as merge_kept, KeptLimit};
pub use ledger::{chunk, QuotaGrant, QuotaLedger, QuotaWant, SlotUse};
pub use spec::{Quota, QuotaParseError, Window, MIN_WINDOW, ROLLING_SLOTS};
pub use state::{least_wait, QuotaState};
