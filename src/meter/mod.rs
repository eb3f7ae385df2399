//! Metering: what a call cost, counted in the API's own units (a language model's input and
//! output tokens, a metered API's credits).
//!
//! [`Unit`] is what an API's limit counts (calls, or tokens), and how much of it a call of
//! a given cost takes. [`Usage`] is a cost: kept with each result, added up per bucket in its commit record and
//! over the job in its figures. [`usage_of`] finds it in an answer: the `usage` an OpenAI-shaped
//! or Anthropic-shaped answer carries, with nothing to configure.

mod read;
mod unit;
mod usage;

pub use read::usage_of;
pub use unit::Unit;
pub use usage::Usage;
