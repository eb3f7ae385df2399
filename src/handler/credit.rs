//! Recognising an answer that says the account is out of credit ([`out_of_credit`]): what
//! no wait and no retry cures, only the account's owner. Each provider says it its own way:
//!
//! | who | status | body |
//! |---|---|---|
//! | credit-metered APIs (People Data Labs and the like) | 402 | any |
//! | OpenAI | 429 | `{"error": {"type": "insufficient_quota", "code": "insufficient_quota", ..}}` |
//! | Anthropic | 400 | `{"type": "error", "error": {"type": "invalid_request_error", "message": "Your credit balance is too low ..."}}` |
//!
//! OpenAI's 429 is told apart from its rate limits by the body alone, so a 429 whose body
//! names `insufficient_quota` as its error's type or code is out of credit, any other 429 the
//! rate's.

use serde_json::Value;

/// What Anthropic's refusal says (compared without case).
const CREDIT_TOO_LOW: &str = "credit balance is too low";

/// Whether an answer of `status` with `body` says the account is out of credit.
pub(crate) fn out_of_credit(status: u16, body: &[u8]) -> bool {
    match status {
        402 => true,
        429 => insufficient_quota(body),
        400 => String::from_utf8_lossy(body)
            .to_lowercase()
            .contains(CREDIT_TOO_LOW),
        _ => false,
    }
}

/// Whether `body` is an OpenAI error whose type or code is `insufficient_quota`.
fn insufficient_quota(body: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let error = &value["error"];
    ["type", "code"]
        .iter()
        .any(|key| error[key].as_str() == Some("insufficient_quota"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_providers_way_of_saying_it() {
        assert!(out_of_credit(402, b""));
        assert!(out_of_credit(402, br#"{"error":"payment required"}"#));
        let openai = br#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        assert!(out_of_credit(429, openai));
        assert!(out_of_credit(
            429,
            br#"{"error":{"code":"insufficient_quota"}}"#
        ));
        let anthropic = br#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
        assert!(out_of_credit(400, anthropic));
    }

    #[test]
    fn rate_limits_and_other_refusals_are_not() {
        let rate = br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert!(!out_of_credit(429, rate));
        assert!(!out_of_credit(429, b"insufficient_quota"));
        assert!(!out_of_credit(429, b""));
        assert!(!out_of_credit(400, br#"{"error":"bad request"}"#));
        // The same words with another status are that status's.
        assert!(!out_of_credit(403, b"Your credit balance is too low"));
        assert!(!out_of_credit(200, b"Your credit balance is too low"));
    }
}
