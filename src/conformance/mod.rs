//! The store conformance suite: what every backend must do, asserted once (feature
//! `conformance`).
//!
//! A library user who writes a [`Store`](crate::store::Store) of their own (with its
//! [`Leases`](crate::store::Leases)) judges it with the same checks the crate's backends
//! pass: implement [`Backend`] (a factory that creates a fresh store, "crashes" it and opens
//! it again, and damages a result) and call [`run_all`] in a test, inside a multi-threaded
//! Tokio runtime (`#[tokio::test(flavor = "multi_thread")]`): it returns the first check
//! that failed ([`CheckFailed`]). The crate's `tests/integration/custom_store.rs` does so for
//! a store of its own, through the public API only.
//!
//! The checks follow the contract written on [`crate::store::backend`]: plans are durable
//! once synced (the offset record is there before any item is dispatched), results replace
//! by ID and a replay finds only pending IDs, commits are final and fenced by their lease,
//! reruns move the job's counts once, a grown input plans on without calling old IDs again,
//! damage is refused and never read as less data, quota usage is durable and never exceeds a
//! limit, and the real engine over the backend runs, stops, resumes and ends with every ID
//! exactly once, every write and sync it made logged by an audit that checks the engine's
//! invariants 1 (an offset record is durable before its items are called) and 2 (a commit
//! only after its results are durable). The sled backend,
//! [`MemStore`](crate::store::mem::MemStore), the in-memory store of a fleet
//! ([`SharedMem`](crate::store::mem::SharedMem)) and PostgreSQL run it in the crate's own
//! tests.
//!
//! It lives above the store (it drives the engine, the job and the HTTP handler against the
//! fake API of [`crate::demo`]), one file per kind of check: `log` (plans, results, commits, a
//! grown input), `pages` (the pages of paginated IDs, for a store that keeps them), `reruns`,
//! `damage`, `engine` (the engine's invariants), `quota` (quota usage); `backend` says what the
//! suite needs of a backend, `fixtures` holds the records the checks build, `suite` runs them
//! all; the crate's own backends are in `backends`.

mod backend;
#[cfg(test)]
mod backends;
mod damage;
mod engine;
mod fixtures;
mod log;
mod pages;
mod quota;
mod reruns;
mod suite;
#[cfg(test)]
mod tests;

pub use backend::Backend;
pub use suite::{run_all, CheckFailed};
