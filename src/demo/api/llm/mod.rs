//! The fake API as a language-model API: an OpenAI-shaped `POST /v1/chat/completions` and an
//! Anthropic-shaped `POST /v1/messages`, metered in requests **and** tokens per window, with
//! the providers' rate-limit headers and an account that can run out of credit
//! ([`LlmConfig`], in [`super::ApiConfig::llm`]; without one these routes answer 404).
//!
//! # Requests and answers
//!
//! A request is JSON with `messages` (each `content` a string, or an array of `{"type":
//! "text", "text": ...}` parts), an optional `max_tokens` (OpenAI's `max_completion_tokens`
//! too) and, for `/v1/messages`, an optional `system`. Its **ID** (for the call counts) is
//! the `id` query parameter, else OpenAI's `user`, else Anthropic's `metadata.user_id`, else
//! the hex xxh3 of its prompt. A body that is not such JSON answers 400 and is no call.
//!
//! * **Prompt tokens**: the bytes of the prompt's text (every message's text, and `system`)
//!   divided by 4, rounded up, at least 1.
//! * **Completion tokens**: drawn from [`LlmConfig::completion_tokens`] by a hash of the
//!   prompt, never above `max_tokens`.
//! * **Content**: the JSON text of `{"label": L, "id": ID, "tokens": C}` ([`llm_content`]),
//!   `L` one of [`LABELS`] by a hash of the prompt, so a job can keep the content parsed.
//!
//! OpenAI's route answers `{"id", "object": "chat.completion", "model", "choices": [{"index":
//! 0, "message": {"role": "assistant", "content"}, "finish_reason": "stop"}], "usage":
//! {"prompt_tokens", "completion_tokens", "total_tokens"}}`; Anthropic's `{"id", "type":
//! "message", "role": "assistant", "model", "content": [{"type": "text", "text"}],
//! "stop_reason": "end_turn", "usage": {"input_tokens", "output_tokens"}}`.
//!
//! # Metering
//!
//! One window of [`LlmConfig::window`] (fixed, aligned to the Unix epoch) counts requests
//! and tokens, as providers do: a request's prompt tokens count when it arrives, its
//! completion tokens when it is answered, and tokens counted stay counted (a window spent by
//! answers above its limit is spent). A request that finds the window at its request limit,
//! or whose prompt would take the tokens above theirs, is refused 429 with a `retry-after`
//! until the window's end, in the route's shape (OpenAI: `{"error": {"type": "requests" or
//! "tokens", "code": "rate_limit_exceeded", ..}}`; Anthropic: `{"type": "error", "error":
//! {"type": "rate_limit_error", ..}}`); it counts in no window.
//!
//! # Credit
//!
//! [`LlmConfig::credit`] is the account's balance in tokens, spent as the window counts them
//! (an answer may cost more than is left: the balance is then zero). At zero every request is refused as
//! [`OutOfCredit`] says, before the window is looked at; [`super::FakeApi::add_credit`] tops
//! it up while the server runs.
//!
//! # Headers
//!
//! Every answer of these routes (2xx, 429, out of credit) carries the window's standing in
//! the style of [`LlmHeaders`], computed as it leaves.
//!
//! # Files
//!
//! `config` (what the API is configured with), `meter` (the window's counts and the credit),
//! `headers` (the two providers' headers) and `exchange` (reading a request, the answer
//! bodies and the refusals); the route that puts them together is the fake API's
//! `llm_route`, beside the server's shared state.

mod config;
mod exchange;
mod headers;
mod meter;

pub use config::{LlmConfig, LlmHeaders, OutOfCredit};
pub use exchange::{llm_content, LABELS};
pub(super) use exchange::{malformed, out_of_credit, rate_refused, Prompt, Shape};
pub(super) use headers::announce;
#[cfg(test)]
pub(super) use headers::go_duration;
pub(super) use meter::{Meter, Refusal};
