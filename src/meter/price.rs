//! Money: what a job's calls cost in the user's currency ([`Money`], kept exactly, in
//! pico-units), and the prices that turn a [`Usage`] into it ([`Prices`]: input and output
//! priced apart, as language-model APIs bill).
//!
//! Prices are written as an API's price list gives them, per million tokens (`2.50`,
//! `2.50/1M`), or per thousand (`0.0025/1K`) or per token (`0.0000025/token`); amounts in
//! units of the currency (`25`, `12.50`). No currency is named: the job's figures are in the
//! one its prices are in. A pico-unit per token is the finest price kept (0.000001 per
//! million tokens); a job's spend is kept up to 18 million units.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Usage;

/// Pico-units in a unit of the currency.
const PICO: u64 = 1_000_000_000_000;

/// An amount of money, in pico-units of the job's currency (exact: sums never round).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Money(pub u64);

/// The prices of a job's calls: per input (prompt) token and per output token, in
/// pico-units of the currency (which is the currency's units per million tokens, times a
/// million).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Prices {
    /// Per input token, in pico-units.
    pub input: Price,
    /// Per output token, in pico-units.
    pub output: Price,
}

/// A price per token, in pico-units of the currency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Price(pub u64);

impl Prices {
    /// What `usage` costs.
    pub fn cost(&self, usage: Usage) -> Money {
        Money(
            usage
                .input
                .saturating_mul(self.input.0)
                .saturating_add(usage.output.saturating_mul(self.output.0)),
        )
    }

    /// Whether nothing is priced.
    pub fn is_free(&self) -> bool {
        self.input.0 == 0 && self.output.0 == 0
    }
}

impl Money {
    /// `self` less `other`, never below nothing.
    pub fn saturating_sub(self, other: Money) -> Money {
        Money(self.0.saturating_sub(other.0))
    }

    /// The amount in units of the currency (for display and JSON; sums are kept exact).
    pub fn units(self) -> f64 {
        self.0 as f64 / PICO as f64
    }
}

/// Why a price or an amount was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}: {reason}")]
pub struct MoneyParseError {
    text: String,
    reason: String,
}

/// `text`, a decimal number, times `scale` (a power of ten), exactly.
fn scaled(text: &str, scale: u64) -> Option<u64> {
    let text = text.trim().replace('_', "");
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut value = whole.checked_mul(scale)?;
    let mut place = scale;
    for digit in fraction.bytes() {
        place /= 10;
        let d = u64::from(digit - b'0');
        if place == 0 {
            // Finer than a pico-unit: only zeros may follow.
            if d != 0 {
                return None;
            }
            continue;
        }
        value = value.checked_add(d * place)?;
    }
    Some(value)
}

impl FromStr for Money {
    type Err = MoneyParseError;

    fn from_str(s: &str) -> Result<Money, MoneyParseError> {
        let amount = scaled(s, PICO).ok_or_else(|| MoneyParseError {
            text: s.into(),
            reason: "not an amount (write e.g. 25 or 12.50, in the currency of the prices; at \
                     most 18 million, at most 12 decimals)"
                .into(),
        })?;
        Ok(Money(amount))
    }
}

impl FromStr for Price {
    type Err = MoneyParseError;

    fn from_str(s: &str) -> Result<Price, MoneyParseError> {
        let err = |reason: &str| MoneyParseError {
            text: s.into(),
            reason: format!(
                "{reason} (write the price per million tokens, e.g. 2.50 or 2.50/1M; or per \
                 thousand, 0.0025/1K; or per token, 0.0000025/token)"
            ),
        };
        let (number, per) = s.split_once('/').unwrap_or((s, "1M"));
        // Pico-units per token for a price of 1 per `per`.
        let scale = match per.trim() {
            "1M" | "M" | "1m" | "m" | "1000000" => 1_000_000,
            "1K" | "K" | "1k" | "k" | "1000" => 1_000_000_000,
            "token" | "1" | "tok" => PICO,
            _ => return Err(err("unknown quantity after the /")),
        };
        scaled(number, scale)
            .map(Price)
            .ok_or_else(|| err("not a price, or finer than a pico-unit per token"))
    }
}

impl fmt::Display for Money {
    /// Two decimals, or four below 10 (a small job's spend is still seen), rounded half up
    /// from the exact amount.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let decimals: u32 = if self.0 >= 10 * PICO { 2 } else { 4 };
        let step = PICO / 10u64.pow(decimals);
        let shown = self.0 / step + u64::from(self.0 % step >= step / 2);
        let scale = 10u64.pow(decimals);
        write!(
            f,
            "{}.{:0width$}",
            shown / scale,
            shown % scale,
            width = decimals as usize
        )
    }
}

impl fmt::Display for Price {
    /// Per million tokens, as price lists give it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, rest) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if rest == 0 {
            write!(f, "{whole}/1M")
        } else {
            let fraction = format!("{rest:06}");
            write!(f, "{whole}.{}/1M", fraction.trim_end_matches('0'))
        }
    }
}

impl Serialize for Money {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Money {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Money, D::Error> {
        u64::deserialize(d).map(Money)
    }
}

impl Serialize for Price {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Price {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Price, D::Error> {
        u64::deserialize(d).map(Price)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_read_as_price_lists_write_them_and_cost_exactly() {
        let p = |s: &str| s.parse::<Price>().unwrap();
        assert_eq!(p("2.50"), Price(2_500_000));
        assert_eq!(p("2.50/1M"), p("0.0025/1K"));
        assert_eq!(p("0.0000025/token"), p("2.5"));
        assert_eq!(p("0.075"), Price(75_000));
        assert_eq!(p(".5").to_string(), "0.5/1M");
        assert_eq!(p("10").to_string(), "10/1M");
        for bad in ["", "x", "-1", "1/fortnight", "0.0000001", "1.2.3", "1e3"] {
            let e = bad.parse::<Price>().unwrap_err().to_string();
            assert!(e.contains("per million tokens"), "{bad}: {e}");
        }
        let prices = Prices {
            input: p("2.50"),
            output: p("10"),
        };
        // A million in, 100k out: 2.50 + 1.00.
        let cost = prices.cost(Usage {
            input: 1_000_000,
            output: 100_000,
        });
        assert_eq!(cost, "3.5".parse().unwrap());
        assert_eq!(cost.to_string(), "3.5000");
        assert_eq!(Money(25 * PICO).to_string(), "25.00");
        // Rounded from the exact amount, never through a float.
        assert_eq!("9.99996".parse::<Money>().unwrap().to_string(), "10.0000");
        assert_eq!("9.99994".parse::<Money>().unwrap().to_string(), "9.9999");
        assert_eq!("0.00005".parse::<Money>().unwrap().to_string(), "0.0001");
        assert_eq!(
            "12345678.905".parse::<Money>().unwrap().to_string(),
            "12345678.91"
        );
        // Sums of many small costs stay exact.
        let one = prices.cost(Usage {
            input: 7,
            output: 3,
        });
        assert_eq!(
            Money(one.0 * 1000),
            prices.cost(Usage {
                input: 7000,
                output: 3000
            })
        );
    }

    #[test]
    fn amounts_are_exact_and_bounded() {
        assert_eq!("12.50".parse::<Money>().unwrap(), Money(12_500_000_000_000));
        assert_eq!("0".parse::<Money>().unwrap(), Money(0));
        for bad in ["", "-3", "abc", "99999999999", "0.0000000000001"] {
            assert!(bad.parse::<Money>().is_err(), "{bad}");
        }
    }
}
