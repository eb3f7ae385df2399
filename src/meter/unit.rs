//! [`Unit`]: what an API's limit counts: calls, or tokens (all of them, or only those read or
//! written), and how much of it a call takes ([`Unit::of`]).

use super::Usage;

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
        }
    }

    /// Its name, for messages: "calls", "tokens", "input tokens", "output tokens".
    pub fn name(self) -> &'static str {
        match self {
            Unit::Calls => "calls",
            Unit::Tokens => "tokens",
            Unit::InputTokens => "input tokens",
            Unit::OutputTokens => "output tokens",
        }
    }
}
