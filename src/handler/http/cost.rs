//! What an HTTP call is expected to cost, and may cost at the most, judged before it is made
//! from the request it will send: for the quotas of tokens and the budget in money
//! ([`crate::handler::Handler::estimate`], [`crate::handler::Handler::most`]).

use super::{Fill, HttpHandler};
use crate::handler::template::row_values;

impl HttpHandler {
    /// The job's estimate program over the request's body, if it has one; else the body
    /// (its URL when it has none) at four bytes a token, read; and as written, what the last
    /// answers wrote, within the body's `max_tokens` (or `max_completion_tokens`,
    /// `max_output_tokens`) if it says (at most 256 before any answer said). The credentials
    /// are left out: a secret is never rendered for an estimate.
    pub(super) fn expected_cost(&self, id: &str, row: Option<&str>) -> Option<crate::meter::Usage> {
        let sent = self.sent_for_cost(id, row)?;
        if self.answer.has_estimate() {
            return self.answer.estimate(&sent);
        }
        Some(crate::meter::Usage {
            input: (sent.len() as u64).div_ceil(4).max(1),
            output: self.limits.output_estimate(most_written(&sent)),
        })
    }

    /// Read: a token per byte of the request's body (its URL when it has none), which a
    /// byte-level tokenizer (every language-model API's) never exceeds; written: the body's
    /// `max_tokens` (or `max_completion_tokens`, `max_output_tokens`), which the API never
    /// exceeds, or without one four times what the last answers wrote (at least 4,096): a
    /// guess, since nothing then bounds an answer.
    pub(super) fn most_cost(&self, id: &str, row: Option<&str>) -> Option<crate::meter::Usage> {
        let sent = self.sent_for_cost(id, row)?;
        // The job's own estimate is its word for the most too.
        if self.answer.has_estimate() {
            return self.answer.estimate(&sent);
        }
        let output = most_written(&sent).unwrap_or_else(|| {
            self.limits
                .output_estimate(None)
                .saturating_mul(4)
                .max(4096)
        });
        Some(crate::meter::Usage {
            input: (sent.len() as u64).max(1),
            output,
        })
    }

    /// What a call's cost is judged by before it is made: the request's body as sent (its
    /// URL when it has none), rendered without credentials (a secret is never rendered for
    /// an estimate); none when the row's values cannot be read.
    fn sent_for_cost(&self, id: &str, row: Option<&str>) -> Option<String> {
        let row = row_values(row).ok()?;
        let fill = Fill::One(id, row.as_ref());
        let r = &self.request;
        Some(match &r.body {
            Some(body) => fill.render(body, &[]),
            None => fill.render(&r.url.template, &[]),
        })
    }
}

/// What a language-model request's JSON body says it may write at most, if it says.
fn most_written(body: &str) -> Option<u64> {
    if !body.contains("max_") {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Most {
        max_tokens: Option<u64>,
        max_completion_tokens: Option<u64>,
        max_output_tokens: Option<u64>,
    }
    let most: Most = serde_json::from_str(body).ok()?;
    most.max_tokens
        .or(most.max_completion_tokens)
        .or(most.max_output_tokens)
}
