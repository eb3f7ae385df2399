//! The PostgreSQL store's tests that need a database: each file tests the module of its name
//! against a fresh database of the test cluster ([`super::test_db`]). They sit above
//! everything they test, so the modules under test never depend on the test helpers.

mod buckets;
mod connect;
mod history;
mod job;
mod migrate;
mod planner;
mod results;
mod session;
mod stats;
mod store;
