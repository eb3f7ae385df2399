//! The conformance suite: what every backend must do, asserted once.
//!
//! [`run_all`](suite::run_all) takes a [`Backend`](backend::Backend) (a factory that
//! creates a store, "crashes" it and opens it again, and damages it) and checks the
//! contract written on [`crate::store::backend`]: plans are durable once synced (the
//! offset record is there before any item is dispatched), results replace by ID and a
//! replay finds only pending IDs, commits are final and fenced by their lease, reruns move
//! the job's counts once, a grown input plans on without calling old IDs again, damage is
//! refused and never read as less data, and the real engine over the backend runs, stops,
//! resumes and ends with every ID exactly once, every write and sync it made logged by
//! [`crate::engine::audit::Audit`], which checks the engine's invariants 1 (an offset
//! record is durable before its items are called) and 2 (a commit only after its results
//! are durable). The sled backend, [`crate::store::mem::MemStore`], the in-memory store of
//! a fleet ([`crate::store::mem::SharedMem`]) and PostgreSQL run it in `cargo test`; a new
//! backend adds one test that calls [`run_all`](suite::run_all) with its factory.
//!
//! It lives above the store (it drives the engine, the job and the HTTP handler against
//! the fake API), one file per kind of check: [`log`] (plans, results, commits, a grown
//! input), [`reruns`], [`damage`], [`engine`] (the engine's invariants), [`quota`] (quota
//! usage); the backends it runs against are in [`backends`]; [`backend`] says what the
//! suite needs of one, [`fixtures`] holds the records the checks build, [`suite`] runs
//! them all.

mod backend;
mod backends;
mod damage;
mod engine;
mod fixtures;
mod log;
mod quota;
mod reruns;
mod suite;
mod tests;
