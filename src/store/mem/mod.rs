//! In-memory stores: nothing is written anywhere, a store lives as long as the process.
//! Tests use them, and they are the reference a new backend is compared with by the
//! conformance suite.
//!
//! - [`MemStore`] (`alone`): one holder at a time, like the sled backend; a crash
//!   ([`MemStore::crash`]) forgets what was not synced.
//! - [`SharedMem`] (`fleet`): a job several workers share, like a database: each
//!   [`MemWorker`] is one worker's session, and implements [`crate::store::Fleet`], so the
//!   fleet's engine tests and the conformance suite run without PostgreSQL.
//!
//! Both keep the job's `records` the same way.

mod alone;
mod fleet;
mod records;

pub use alone::MemStore;
pub use fleet::{MemWorker, SharedMem};
