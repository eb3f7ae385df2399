//! The fake HTTP API that highwater jobs run against in demos, tests and benchmarks.
//!
//! This module owns a small HTTP/1.1 server ([`FakeApi`]) bound to `127.0.0.1` on a
//! random port. It runs as tasks on the *current* tokio runtime, so it lives as long as
//! the process (and runtime) that started it: integration tests start it in the test
//! process, run the real `highwater` binary as a subprocess against it, and the server
//! (with its call counters) survives the subprocess being SIGKILLed.
//!
//! It also owns the fault model ([`ApiConfig`], [`Fault`]): every ID is assigned exactly
//! one fault by a seeded xxh3 hash, so a test can predict the outcome of every request
//! ([`FakeApi::fault`], [`FakeApi::expected_body`]) and check it afterwards
//! ([`FakeApi::calls`]).
//!
//! # Routes
//!
//! * `GET /items/{id}`: the ID is the rest of the path, percent-decoded (must be UTF-8).
//! * `GET /items?id={id}`: the ID is the `id` query parameter (percent-decoded, `+` is a space).
//! * `POST /items` with a JSON body `{"id": "..."}` (other fields ignored; body capped at
//!   64 KiB, larger answers 413).
//! * `POST /oauth/token`: an OAuth2 token endpoint (client credentials grant; see
//!   [`FakeApi::require_token`]).
//! * `POST /v1/chat/completions` and `POST /v1/messages`: a language-model API, OpenAI's and
//!   Anthropic's shapes, metered in requests and tokens per window, with the providers'
//!   rate-limit headers and a credit that can run out ([`ApiConfig::llm`], [`LlmConfig`]; the
//!   ID is the `id` query parameter, OpenAI's `user` or Anthropic's `metadata.user_id`).
//!   Requests refused for their window or credit are calls of the ID, but not admitted ones
//!   ([`FakeApi::admitted_calls`]); [`FakeApi::add_credit`] tops the credit up.
//! * `GET /pages/link/{id}?page=N&per_page=M`, `GET /pages/cursor/{id}?cursor=C&limit=M` and
//!   `GET /pages/offset/{id}?offset=N&limit=M`: one ID's items, page by page, as APIs
//!   paginate them (a `Link` header, a cursor in the body, an offset); see `pages`.
//! * anything else: 404 `{"error":"no route"}`.
//!
//! Malformed requests (400, 413, 404 no route) are not counted as calls for any ID.
//! A successful answer is 200 with `application/json` body [`expected_body`]; IDs that
//! start with `text:` instead answer 200 `text/plain` `plain <id>`.
//!
//! # Faults
//!
//! Per ID, by per-mille share ([`ApiConfig`]): permanent 404s, and transient faults that
//! heal after `transient_attempts` attempts: 503s, dropped connections, slow answers and
//! 429s with a `Retry-After` header ([`Fault::Throttled`]).
//!
//! # Test controls
//!
//! * **Call timestamps**: the instant of every counted call (the first
//!   [`MAX_CALL_TIMES`]) is kept: [`FakeApi::call_times`], [`FakeApi::calls_per_id_times`]
//!   and [`FakeApi::max_calls_in_window`] (to check a client's rate).
//! * **Large jobs**: [`ApiConfig::numbered_ids`] counts the calls of the numbered IDs the
//!   bench writes in a byte each, so a job of 100 million IDs can be checked for IDs called
//!   twice ([`FakeApi::repeated_ids`]) without 10 GB of counters.
//! * **Outage switch**: [`FakeApi::set_down`] closes the listener (connections are refused)
//!   and every open connection, then binds the same port again when brought back up.
//! * **Hidden capacity**: [`FakeApi::set_capacity`] puts a token bucket in front of every
//!   ID (to test adaptive rate control): requests finding no token answer 429
//!   `{"error":"rate limited"}`, optionally with a `Retry-After`
//!   ([`FakeApi::set_retry_after_on_429`]); [`FakeApi::accepted`] and
//!   [`FakeApi::rejected_429`] count the outcomes.
//! * **Quota windows**: [`ApiConfig::windows`] (or [`FakeApi::set_windows`]) enforces fixed
//!   windows aligned to the Unix epoch, as real APIs count per minute, hour or day: a
//!   request above any window's limit answers 429 `{"error":"quota exceeded"}` with the
//!   `Retry-After` of that window's reset. They come before the hidden capacity and are
//!   counted apart ([`FakeApi::window_refusals`], [`FakeApi::window_peaks`]).
//!   [`ApiConfig::announce`] (or [`FakeApi::set_announce`]) announces them in the headers
//!   of every answer for an ID ([`Announce`]: the IETF draft's `RateLimit`, or GitHub's
//!   `X-RateLimit-*`).
//! * **Echoed requests**: [`FakeApi::echo_requests`] makes every answer outside 2xx quote
//!   the request (target, query and headers), secrets and all, as some APIs' errors do.
//! * **Expiring credentials**: [`FakeApi::require_token`] makes every item request need a
//!   bearer token that has not expired (from the token endpoint, [`FakeApi::token_url`], or
//!   a command, [`FakeApi::command_token_prefix`]), else it answers 401;
//!   [`FakeApi::revoke_client_secret`] makes the token endpoint refuse the client;
//!   [`FakeApi::tokens_issued`] and [`FakeApi::refused_401`] count.
//!
//! # Files
//!
//! `faults` (the configuration and each ID's fault), `routes` (a request to its ID and
//! answer), `answers` (the bodies), `profile` (the realistic answer of
//! [`ApiConfig::profiles`]), `server` (accepting, the outage switch's listener), `calls`
//! (call counts and timestamps), `numbered` (the numbered IDs' counts, a byte each:
//! [`ApiConfig::numbered_ids`]), `capacity` (the hidden capacity's token bucket), `windows`
//! (the quota windows and their headers), `auth` (the token endpoint and the token check),
//! `llm` (the language-model API: its configuration, meter, headers and bodies),
//! `llm_route` (its routes), `seen` (the requests kept for a test to check), `echo` (errors
//! quoting the request), `batch` (the batch endpoint), `pages` (the paginated routes), `request` (the body cap and
//! percent-decoding every route shares), `shared` (the state the server's tasks share),
//! `lock` (locking it despite a panicked task) and `fake_api` (the [`FakeApi`] handle).

mod answers;
mod auth;
mod batch;
mod calls;
mod capacity;
mod echo;
mod fake_api;
mod faults;
mod llm;
mod llm_route;
mod lock;
mod numbered;
mod pages;
mod profile;
mod request;
mod routes;
mod seen;
mod server;
mod shared;
#[cfg(test)]
mod tests;
mod windows;

pub use answers::expected_body;
pub use auth::{TokenClientAuth, CLIENT_ID, CLIENT_SECRET};
pub use calls::MAX_CALL_TIMES;
pub use fake_api::FakeApi;
pub use faults::{ApiConfig, Fault};
pub use llm::{llm_content, LlmConfig, LlmHeaders, OutOfCredit, LABELS};
pub use profile::profile_body;
pub use seen::SeenRequest;
pub use windows::{Announce, ApiWindow};
