//! What a successful attempt makes ([`Output`]: the result to store, and the HTTP status
//! of its answer), and how long an attempt took in whole milliseconds ([`millis`]).

use std::time::Duration;

use serde_json::value::RawValue;

use crate::failure::{ErrorClass, Failure};

/// A successful attempt: the result to store.
#[derive(Debug, Clone)]
pub struct Output {
    /// The result as one JSON document.
    pub result: Box<RawValue>,
    /// The HTTP status of the answer, when there was one.
    pub status: Option<u16>,
    /// What the call cost, when its answer says ([`crate::meter::usage_of`]).
    pub usage: Option<crate::meter::Usage>,
}

impl Output {
    /// A result from any value that serializes.
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Output, Failure> {
        serde_json::value::to_raw_value(value)
            .map(Output::from)
            .map_err(|e| {
                Failure::permanent(format!("the result does not serialize: {e}"))
                    .class(ErrorClass::Body)
            })
    }

    /// A result from text that must be one JSON document.
    pub fn json_text(text: &str) -> Result<Output, Failure> {
        RawValue::from_string(text.trim().to_owned())
            .map(Output::from)
            .map_err(|e| {
                Failure::permanent(format!("the result is not JSON: {e}")).class(ErrorClass::Body)
            })
    }

    /// Text or bytes stored as JSON when they are one JSON document, else as a JSON string
    /// (invalid UTF-8 replaced).
    pub fn text_or_json(bytes: Vec<u8>) -> Output {
        Output::from(crate::answer::body_as_json(bytes))
    }
}

impl From<Box<RawValue>> for Output {
    fn from(result: Box<RawValue>) -> Output {
        Output {
            result,
            status: None,
            usage: None,
        }
    }
}

impl From<serde_json::Value> for Output {
    fn from(value: serde_json::Value) -> Output {
        Output::from(serde_json::value::to_raw_value(&value).expect("a Value always serializes"))
    }
}

/// How long an attempt took, in whole milliseconds, for records.
pub(crate) fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_from_text() {
        assert_eq!(
            Output::json_text(" [1, 2] ").unwrap().result.get(),
            "[1, 2]"
        );
        assert!(Output::json_text("{").is_err());
        assert_eq!(
            Output::text_or_json(b"hi\n".to_vec()).result.get(),
            "\"hi\\n\""
        );
        assert_eq!(Output::json(&vec![1]).unwrap().result.get(), "[1]");
    }
}
