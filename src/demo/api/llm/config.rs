//! A language-model API's configuration ([`LlmConfig`]): its window's limits, its headers
//! ([`LlmHeaders`]), its credit and how it says the credit is spent ([`OutOfCredit`]).

use std::time::Duration;

/// A language-model API's limits, headers and credit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmConfig {
    /// Tokens (prompt and completion together) counted per window.
    pub tokens_per_window: u64,
    /// Requests counted per window.
    pub requests_per_window: u64,
    /// The window's length (fixed windows aligned to the Unix epoch; at least 1 ms).
    pub window: Duration,
    /// The rate-limit headers of every answer.
    pub headers: LlmHeaders,
    /// The range completion tokens are drawn from (inclusive; `max_tokens` caps them).
    pub completion_tokens: (u64, u64),
    /// The account's balance in tokens: `None` never runs out.
    pub credit: Option<u64>,
    /// How a request is refused once the credit is spent.
    pub out_of_credit: OutOfCredit,
}

impl LlmConfig {
    /// `tokens` and `requests` per `window`, OpenAI's headers and refusals, completions of
    /// 20 to 200 tokens, no credit limit.
    pub fn new(tokens: u64, requests: u64, window: Duration) -> LlmConfig {
        LlmConfig {
            tokens_per_window: tokens,
            requests_per_window: requests,
            window,
            headers: LlmHeaders::OpenAi,
            completion_tokens: (20, 200),
            credit: None,
            out_of_credit: OutOfCredit::OpenAi,
        }
    }
}

/// The rate-limit headers of a language-model API's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmHeaders {
    /// None.
    None,
    /// OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go
    /// durations (`1s`, `6m0s`, `59.5s`, `120ms`).
    OpenAi,
    /// Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
    /// remaining,reset}`, resets as RFC 3339 times. The one token window stands for all three
    /// token families.
    Anthropic,
}

/// How a language-model API refuses a request once the account's credit is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfCredit {
    /// A credit-metered API's 402 `{"error": "payment required: out of credit"}`.
    PaymentRequired,
    /// OpenAI's 429 with error type and code `insufficient_quota`.
    OpenAi,
    /// Anthropic's 400 `invalid_request_error` "Your credit balance is too low...".
    Anthropic,
}
