//! The language-model API's meter ([`Meter`]): one fixed window counting requests and tokens,
//! the account's credit, and what they granted and refused, for the tests and the bench to
//! read.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::config::LlmConfig;

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The window is at its request limit (`tokens: false`) or the prompt would take it above
    /// its token limit (`tokens: true`): retry after `retry_after_secs`.
    Rate { tokens: bool, retry_after_secs: u64 },
    /// The credit is spent.
    Credit,
}

/// Where the window stands at one instant: what the headers announce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Standing {
    pub(crate) requests_limit: u64,
    pub(crate) requests_remaining: u64,
    pub(crate) tokens_limit: u64,
    pub(crate) tokens_remaining: u64,
    /// When the window ends, in milliseconds since the epoch.
    pub(crate) end_ms: u64,
}

/// The window's counts and the credit, under one lock.
pub(crate) struct Meter {
    config: LlmConfig,
    state: Mutex<State>,
}

struct State {
    /// The index `k` of the window the counts belong to (`[k * length, (k + 1) * length)`).
    index: u64,
    requests: u64,
    tokens: u64,
    /// Tokens counted per window, by window index.
    granted: BTreeMap<u64, u64>,
    credit: Option<u64>,
    rate_refusals: u64,
    credit_refusals: u64,
}

impl Meter {
    pub(crate) fn new(config: LlmConfig) -> Meter {
        Meter {
            state: Mutex::new(State {
                index: 0,
                requests: 0,
                tokens: 0,
                granted: BTreeMap::new(),
                credit: config.credit,
                rate_refusals: 0,
                credit_refusals: 0,
            }),
            config,
        }
    }

    pub(crate) fn config(&self) -> &LlmConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn length_ms(&self) -> u64 {
        u64::try_from(self.config.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Moves `state` to the window holding `now_ms`, empty if it is a new one.
    fn roll(&self, state: &mut State, now_ms: u64) {
        let index = now_ms / self.length_ms();
        if index != state.index {
            state.index = index;
            state.requests = 0;
            state.tokens = 0;
        }
    }

    /// Counts a request whose prompt is `prompt_tokens` arriving at `now_ms`, or refuses it
    /// (counting it nowhere).
    pub(crate) fn admit(&self, now_ms: u64, prompt_tokens: u64) -> Result<(), Refusal> {
        let mut state = self.lock();
        if state.credit == Some(0) {
            state.credit_refusals += 1;
            return Err(Refusal::Credit);
        }
        self.roll(&mut state, now_ms);
        let full_requests = state.requests >= self.config.requests_per_window;
        let full_tokens =
            state.tokens.saturating_add(prompt_tokens) > self.config.tokens_per_window;
        if full_requests || full_tokens {
            state.rate_refusals += 1;
            let end = (state.index + 1).saturating_mul(self.length_ms());
            let retry_after_secs = end.saturating_sub(now_ms).div_ceil(1000).max(1);
            return Err(Refusal::Rate {
                tokens: !full_requests,
                retry_after_secs,
            });
        }
        state.requests += 1;
        Self::count(&mut state, prompt_tokens);
        Ok(())
    }

    /// Counts the completion tokens of an answer leaving at `now_ms`.
    pub(crate) fn settle(&self, now_ms: u64, completion_tokens: u64) {
        let mut state = self.lock();
        self.roll(&mut state, now_ms);
        Self::count(&mut state, completion_tokens);
    }

    fn count(state: &mut State, tokens: u64) {
        state.tokens = state.tokens.saturating_add(tokens);
        *state.granted.entry(state.index).or_insert(0) += tokens;
        if let Some(credit) = &mut state.credit {
            *credit = credit.saturating_sub(tokens);
        }
    }

    /// The window's standing at `now_ms`.
    pub(crate) fn standing(&self, now_ms: u64) -> Standing {
        let mut state = self.lock();
        self.roll(&mut state, now_ms);
        Standing {
            requests_limit: self.config.requests_per_window,
            requests_remaining: self
                .config
                .requests_per_window
                .saturating_sub(state.requests),
            tokens_limit: self.config.tokens_per_window,
            tokens_remaining: self.config.tokens_per_window.saturating_sub(state.tokens),
            end_ms: (state.index + 1).saturating_mul(self.length_ms()),
        }
    }

    /// Adds `tokens` to the credit (nothing without a credit limit).
    pub(crate) fn add_credit(&self, tokens: u64) {
        if let Some(credit) = &mut self.lock().credit {
            *credit = credit.saturating_add(tokens);
        }
    }

    /// The credit left (`None`: no limit).
    pub(crate) fn credit(&self) -> Option<u64> {
        self.lock().credit
    }

    /// Tokens counted in each window that counted any, by the window's start (milliseconds
    /// since the epoch), in order.
    pub(crate) fn granted(&self) -> Vec<(u64, u64)> {
        let length = self.length_ms();
        self.lock()
            .granted
            .iter()
            .map(|(&index, &tokens)| (index.saturating_mul(length), tokens))
            .collect()
    }

    /// Requests refused for the window's limits.
    pub(crate) fn rate_refusals(&self) -> u64 {
        self.lock().rate_refusals
    }

    /// Requests refused for want of credit.
    pub(crate) fn credit_refusals(&self) -> u64 {
        self.lock().credit_refusals
    }
}
