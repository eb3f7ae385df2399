//! Metering: what a call cost, counted in the API's own units (a language model's input and
//! output tokens, a metered API's credits).
//!
//! [`Unit`] is what an API's limit counts (calls, or tokens), and how much of it a call of
//! a given cost takes. [`Usage`] is a cost: kept with each result, added up per bucket in its commit record and
//! over the job in its figures. [`usage_of`] finds it in an answer: the `usage` an OpenAI-shaped
//! or Anthropic-shaped answer carries, with nothing to configure. [`Prices`] turn usage into
//! [`Money`], what a job's calls cost in the user's currency.

mod price;
mod read;
mod spend;
mod unit;
mod usage;

pub use price::{Money, MoneyParseError, Price, Prices};

pub use read::usage_of;
pub use spend::Spend;
pub use unit::Unit;
pub use usage::Usage;
