//! [`Usage`]: what one call (or a bucket's, or a job's calls) cost, in input and output units.

use serde::{Deserialize, Serialize};

/// What calls cost, in the API's units: a language model's tokens read (`input`: the prompt,
/// cached parts included) and written (`output`); an API metered in one unit counts it as
/// `input`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Units read: a language model's input (prompt) tokens.
    #[serde(default)]
    pub input: u64,
    /// Units written: a language model's output (completion) tokens.
    #[serde(default)]
    pub output: u64,
}

impl Usage {
    /// Nothing spent.
    pub fn is_zero(&self) -> bool {
        self.input == 0 && self.output == 0
    }

    /// Both kinds together.
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }

    /// Add `other` (saturating: a sum never wraps).
    pub fn add(&mut self, other: Usage) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
    }
}

impl std::ops::Add for Usage {
    type Output = Usage;

    fn add(mut self, other: Usage) -> Usage {
        Usage::add(&mut self, other);
        self
    }
}

impl std::iter::Sum for Usage {
    fn sum<I: Iterator<Item = Usage>>(iter: I) -> Usage {
        iter.fold(Usage::default(), |a, b| a + b)
    }
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} in + {} out", self.input, self.output)
    }
}
