//! The demo: a local fake API with injected faults, and the IDs of a ready-made job against it
//! (feature `demo`; the tests and the bench use the fake API too).
//!
//! `highwater demo` (the CLI's `demo_command`) starts [`api::FakeApi`] on 127.0.0.1 inside the
//! process (realistic latency, some 503s, dropped connections, slow answers and 404s), writes
//! an input of IDs and runs a real job with the same engine and store as `highwater run`. The job's URL template
//! is `http://${HIGHWATER_DEMO_API}/items/{id}`: the stored spec keeps the variable, and each
//! demo start points it at the fresh server, so `highwater demo --dir DIR` also resumes.

pub mod api;

/// The variable the demo's URL template names.
pub const API_VAR: &str = "HIGHWATER_DEMO_API";

/// The demo's IDs: mostly plain, a few with characters that need encoding, a few repeated.
pub fn demo_ids(n: u64) -> impl Iterator<Item = String> {
    (0..n).map(|i| match i {
        i if i % 1000 == 999 => format!("user-{:06}", i - 500),
        i if i % 1000 == 500 => format!("team/{i} é?#%"),
        i => format!("user-{i:06}"),
    })
}
