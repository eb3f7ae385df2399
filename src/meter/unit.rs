//! [`Unit`]: what a limit counts: calls, tokens (all of them, or only those read or
//! written), or money by the job's prices, and how much of it a call takes ([`Unit::of`]).

use super::{Prices, Usage};

/// What a limit counts.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Calls (requests).
    #[default]
    Calls,
    /// Tokens read and written.
    Tokens,
    /// Tokens read (the prompt).
    InputTokens,
    /// Tokens written (the answer).
    OutputTokens,
    /// Money, in pico-units of the currency, as these prices value a call's tokens: a job's
    /// budget (an API never announces one).
    Money(Prices),
}

impl Unit {
    /// How much of this unit a call costing `cost` takes; a call of unknown cost takes no
    /// tokens (a token limit then holds calls only once it is spent).
    pub fn of(self, cost: Option<Usage>) -> u64 {
        match (self, cost) {
            (Unit::Calls, _) => 1,
            (_, None) => 0,
            (Unit::Tokens, Some(c)) => c.total(),
            (Unit::InputTokens, Some(c)) => c.input,
            (Unit::OutputTokens, Some(c)) => c.output,
            (Unit::Money(prices), Some(c)) => prices.cost(c).0,
        }
    }

    /// Whether the unit is settled by what calls cost (all but calls).
    pub fn is_metered(self) -> bool {
        self != Unit::Calls
    }

    /// The word a quota's text gives the unit after its number (`90000tokens/min`); none
    /// for calls, which a quota counts unless told otherwise.
    pub fn quota_word(self) -> Option<&'static str> {
        match self {
            Unit::Calls => None,
            Unit::Tokens => Some("tokens"),
            Unit::InputTokens => Some("input-tokens"),
            Unit::OutputTokens => Some("output-tokens"),
            Unit::Money(_) => Some("money"),
        }
    }

    /// The unit a quota's text names (money is never written as a quota: it is a budget).
    pub fn from_quota_word(word: &str) -> Option<Unit> {
        Some(match word {
            "calls" => Unit::Calls,
            "tokens" => Unit::Tokens,
            "input-tokens" => Unit::InputTokens,
            "output-tokens" => Unit::OutputTokens,
            _ => return None,
        })
    }

    /// Its name, for messages: "calls", "tokens", "input tokens", "output tokens", "money".
    pub fn name(self) -> &'static str {
        match self {
            Unit::Calls => "calls",
            Unit::Tokens => "tokens",
            Unit::InputTokens => "input tokens",
            Unit::OutputTokens => "output tokens",
            Unit::Money(_) => "money",
        }
    }
}
