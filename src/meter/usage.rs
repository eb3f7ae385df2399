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

    /// A cost as a user's program gives it: a number of units (counted as input), or an
    /// object of `input` and `output` numbers (either may be left out); null for none.
    /// Fractions are rounded to whole units.
    pub fn from_json(value: &serde_json::Value) -> Result<Option<Usage>, String> {
        let units = |v: &serde_json::Value, what: &str| -> Result<u64, String> {
            match v.as_f64() {
                Some(n) if n >= 0.0 && n.is_finite() => Ok(n.round() as u64),
                _ => Err(format!("{what} is {v}, not a number of units of 0 or more")),
            }
        };
        match value {
            serde_json::Value::Null => Ok(None),
            serde_json::Value::Number(_) => Ok(Some(Usage {
                input: units(value, "the cost")?,
                output: 0,
            })),
            serde_json::Value::Object(o)
                if o.keys().all(|k| k == "input" || k == "output") && !o.is_empty() =>
            {
                let field = |k: &str| o.get(k).map_or(Ok(0), |v| units(v, k));
                Ok(Some(Usage {
                    input: field("input")?,
                    output: field("output")?,
                }))
            }
            other => Err(format!(
                "it gave {other}, not a number or an object of input and output"
            )),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_programs_cost_is_a_number_or_input_and_output() {
        let u = |i, o| {
            Some(Usage {
                input: i,
                output: o,
            })
        };
        assert_eq!(Usage::from_json(&json!(12)), Ok(u(12, 0)));
        assert_eq!(Usage::from_json(&json!(2.6)), Ok(u(3, 0)));
        assert_eq!(
            Usage::from_json(&json!({"input": 5, "output": 7})),
            Ok(u(5, 7))
        );
        assert_eq!(Usage::from_json(&json!({"output": 7})), Ok(u(0, 7)));
        assert_eq!(Usage::from_json(&json!(null)), Ok(None));
        for bad in [
            json!(-1),
            json!("12"),
            json!({"in": 1}),
            json!({}),
            json!([1]),
        ] {
            assert!(Usage::from_json(&bad).is_err(), "{bad}");
        }
    }
}
