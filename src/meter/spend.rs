//! [`Spend`]: what a job's calls cost so far by its prices, what the whole job will cost at
//! that pace, and its budget: the figure `status`, the progress line, `live.json`, the
//! metrics and the dashboard show.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Money, Prices, Usage};

/// What a job spent, its projection and its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    /// What the calls cost so far, as their answers said, by the job's prices.
    #[serde(serialize_with = "units", deserialize_with = "from_units")]
    pub spent: Money,
    /// What the whole job will cost at the spend per item done so far (none before an item
    /// is done, or while the input's size is unknown).
    #[serde(
        serialize_with = "maybe_units",
        deserialize_with = "maybe_from_units",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub projected: Option<Money>,
    /// The most the job may spend (none: no budget).
    #[serde(
        serialize_with = "maybe_units",
        deserialize_with = "maybe_from_units",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub budget: Option<Money>,
}

impl Spend {
    /// The spend of `usage` by `prices`, over `done` items of `total` (the job's, if known).
    pub fn new(
        prices: Prices,
        usage: Usage,
        done: u64,
        total: Option<u64>,
        budget: Option<Money>,
    ) -> Spend {
        let spent = prices.cost(usage);
        let projected = total.filter(|_| done > 0).map(|total| {
            let per_item = spent.0 as f64 / done as f64;
            Money((per_item * total.max(done) as f64).round() as u64)
        });
        Spend {
            spent,
            projected,
            budget,
        }
    }

    /// The human text: `3.1234 spent, 45.60 projected for the job, budget 50.00`.
    pub fn render(&self) -> String {
        let mut text = format!("{} spent", self.spent);
        if let Some(p) = self.projected {
            text.push_str(&format!(", {p} projected for the job"));
        }
        if let Some(b) = self.budget {
            text.push_str(&format!(", budget {b}"));
            if self.projected.is_some_and(|p| p > b) {
                text.push_str(" (the budget stops the job before its end)");
            }
        }
        text
    }
}

/// Money as units of the currency, for JSON readers.
fn units<S: Serializer>(m: &Money, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(m.units())
}

fn maybe_units<S: Serializer>(m: &Option<Money>, s: S) -> Result<S::Ok, S::Error> {
    match m {
        Some(m) => s.serialize_f64(m.units()),
        None => s.serialize_none(),
    }
}

fn from_units<'de, D: Deserializer<'de>>(d: D) -> Result<Money, D::Error> {
    let units = f64::deserialize(d)?;
    Ok(Money((units.max(0.0) * 1e12).round() as u64))
}

fn maybe_from_units<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Money>, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.map(|u| Money((u.max(0.0) * 1e12).round() as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_projection_is_the_spend_per_item_done_times_the_items() {
        let prices = Prices {
            input: "2.50".parse().unwrap(),
            output: "10".parse().unwrap(),
        };
        // 1,000 items done of 10,000, each 1,000 in and 100 out: 0.0035 each.
        let usage = Usage {
            input: 1_000_000,
            output: 100_000,
        };
        let s = Spend::new(prices, usage, 1000, Some(10_000), "20".parse().ok());
        assert_eq!(s.spent, "3.5".parse().unwrap());
        assert_eq!(s.projected, "35".parse().ok());
        assert_eq!(
            s.render(),
            "3.5000 spent, 35.00 projected for the job, budget 20.00 (the budget stops the job before its end)"
        );
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            serde_json::json!({"spent": 3.5, "projected": 35.0, "budget": 20.0})
        );
        let back: Spend = serde_json::from_value(serde_json::to_value(s).unwrap()).unwrap();
        assert_eq!(back, s);
        let early = Spend::new(prices, Usage::default(), 0, None, None);
        assert_eq!(early.render(), "0.0000 spent");
    }
}
