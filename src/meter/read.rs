//! Reading a call's [`Usage`] from its answer ([`usage_of`]), in the shapes language-model
//! APIs answer with:
//!
//! | shape | input | output |
//! |---|---|---|
//! | OpenAI chat completions, and the APIs that copy it | `usage.prompt_tokens` | `usage.completion_tokens` |
//! | OpenAI responses | `usage.input_tokens` | `usage.output_tokens` |
//! | Anthropic messages | `usage.input_tokens` + `usage.cache_creation_input_tokens` + `usage.cache_read_input_tokens` | `usage.output_tokens` |
//!
//! An answer without a top-level `usage` object of numbers (most APIs) has none, and costs
//! nothing to look at: the body is searched for `"usage"` before anything is parsed.

use serde::Deserialize;

use super::Usage;

/// The top level of an answer, as far as usage goes.
#[derive(Deserialize)]
struct Answer {
    usage: Option<Counts>,
}

/// Every count an answer's `usage` may hold; the others are ignored.
#[derive(Deserialize)]
struct Counts {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

/// The usage `body` (an answer, as it came) reports, if it reports one.
pub fn usage_of(body: &[u8]) -> Option<Usage> {
    if !contains(body, b"\"usage\"") {
        return None;
    }
    let answer: Answer = serde_json::from_slice(body.trim_ascii()).ok()?;
    let c = answer.usage?;
    let input = c.prompt_tokens.or(c.input_tokens);
    let output = c.completion_tokens.or(c.output_tokens);
    if input.is_none() && output.is_none() {
        return None;
    }
    let cached =
        c.cache_creation_input_tokens.unwrap_or(0) + c.cache_read_input_tokens.unwrap_or(0);
    Some(Usage {
        input: input.unwrap_or(0).saturating_add(cached),
        output: output.unwrap_or(0),
    })
}

/// Whether `needle` is in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_of_openai_and_anthropic_answers_is_read() {
        let openai = br#"{"id":"c1","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        assert_eq!(
            usage_of(openai),
            Some(Usage {
                input: 12,
                output: 5
            })
        );
        let anthropic = br#" {"type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":30,"cache_read_input_tokens":100,"output_tokens":7}}
"#;
        assert_eq!(
            usage_of(anthropic),
            Some(Usage {
                input: 130,
                output: 7
            })
        );
        let responses =
            br#"{"output":[],"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7}}"#;
        assert_eq!(
            usage_of(responses),
            Some(Usage {
                input: 3,
                output: 4
            })
        );
    }

    #[test]
    fn answers_without_a_usage_of_counts_have_none() {
        for body in [
            &b"{\"id\":1}"[..],
            b"not json \"usage\"",
            b"{\"usage\":\"free\"}",
            b"{\"usage\":{}}",
            b"{\"usage\":{\"prompt_tokens\":-1}}",
            b"{\"data\":{\"usage\":{\"prompt_tokens\":1}}}",
            b"",
        ] {
            assert_eq!(usage_of(body), None, "{}", String::from_utf8_lossy(body));
        }
    }
}
