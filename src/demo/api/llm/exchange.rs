//! Reading a language-model request ([`Prompt::read`]: its ID, prompt and token counts) and
//! the bodies of the answers: a completion in OpenAI's or Anthropic's shape, their 429s, and
//! the three ways of saying the credit is spent.

use hyper::body::Bytes;
use hyper::StatusCode;
use serde_json::{json, Value};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::super::answers::{response, Resp};
use super::super::request::decode;
use super::config::{LlmConfig, OutOfCredit};

/// The labels a completion's content picks from (by a hash of the prompt).
pub const LABELS: [&str; 4] = ["positive", "negative", "neutral", "mixed"];

/// The content of the completion for the request of `id` whose prompt text is `prompt`: the
/// JSON text of `{"label": L, "id": ID}`, `L` one of [`LABELS`] by a hash of the prompt.
pub fn llm_content(id: &str, prompt: &str) -> String {
    let label = LABELS[(xxh3_64(prompt.as_bytes()) % LABELS.len() as u64) as usize];
    json!({"label": label, "id": id}).to_string()
}

/// Which provider's shape a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
}

/// A request read: its ID, what it counts, and the content of its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prompt {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
    pub(crate) content: String,
}

impl Prompt {
    /// Reads a request of `shape` (its query and body) under `config`; `None` if it is not
    /// a request of that shape.
    pub(crate) fn read(
        shape: Shape,
        query: Option<&str>,
        body: &[u8],
        config: &LlmConfig,
    ) -> Option<Prompt> {
        let request: Value = serde_json::from_slice(body).ok()?;
        let mut text = String::new();
        if shape == Shape::Anthropic {
            if let Some(system) = request.get("system") {
                push_text(&mut text, system)?;
            }
        }
        for message in request.get("messages")?.as_array()? {
            push_text(&mut text, message.get("content")?)?;
        }
        let max_tokens = ["max_tokens", "max_completion_tokens"]
            .iter()
            .find_map(|key| request.get(*key).and_then(Value::as_u64));
        let from_body = match shape {
            Shape::OpenAi => request.get("user"),
            Shape::Anthropic => request.get("metadata").and_then(|m| m.get("user_id")),
        };
        let id = query
            .and_then(id_in_query)
            .or_else(|| from_body.and_then(Value::as_str).map(String::from))
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| format!("{:016x}", xxh3_64(text.as_bytes())));
        let (low, high) = config.completion_tokens;
        let span = high.saturating_sub(low).saturating_add(1);
        let drawn = low + xxh3_64_with_seed(text.as_bytes(), COMPLETION_SEED) % span;
        Some(Prompt {
            model: request
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or("fake-model")
                .to_string(),
            prompt_tokens: (text.len() as u64).div_ceil(4).max(1),
            completion_tokens: max_tokens.map_or(drawn, |max| drawn.min(max)),
            content: llm_content(&id, &text),
            id,
        })
    }

    /// The 200 answer in `shape`.
    pub(crate) fn answer(&self, shape: Shape) -> Resp {
        let (p, c) = (self.prompt_tokens, self.completion_tokens);
        let id = format!("{:016x}", xxh3_64(self.id.as_bytes()));
        let body = match shape {
            Shape::OpenAi => json!({
                "id": format!("chatcmpl-{id}"),
                "object": "chat.completion",
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": self.content},
                    "finish_reason": "stop",
                }],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
            }),
            Shape::Anthropic => json!({
                "id": format!("msg_{id}"),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [{"type": "text", "text": self.content}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": p, "output_tokens": c},
            }),
        };
        json_answer(StatusCode::OK, &body)
    }
}

/// The seed of the hash that draws a completion's length (apart from the label's).
const COMPLETION_SEED: u64 = 0x636f_6d70_6c65_7465; // "complete"

/// The `id` query parameter, percent-decoded (`+` a space), if any and UTF-8.
fn id_in_query(query: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|pair| pair.strip_prefix("id="))
        .find_map(|value| decode(value, true))
}

/// Appends the text of a message's `content` (a string, or an array of text parts).
fn push_text(text: &mut String, content: &Value) -> Option<()> {
    match content {
        Value::String(s) => text.push_str(s),
        Value::Array(parts) => {
            for part in parts {
                text.push_str(part.get("text")?.as_str()?);
            }
        }
        _ => return None,
    }
    Some(())
}

/// 429 in `shape` for a window full of requests or of tokens (`tokens`).
pub(crate) fn rate_refused(shape: Shape, tokens: bool) -> Resp {
    let what = if tokens { "tokens" } else { "requests" };
    let message = format!("Rate limit reached for {what} per window. Please try again later.");
    let body = match shape {
        Shape::OpenAi => json!({"error": {
            "message": message, "type": what, "param": null, "code": "rate_limit_exceeded",
        }}),
        Shape::Anthropic => json!({"type": "error", "error": {
            "type": "rate_limit_error", "message": message,
        }}),
    };
    json_answer(StatusCode::TOO_MANY_REQUESTS, &body)
}

/// The refusal of a request once the credit is spent, as `style` says it.
pub(crate) fn out_of_credit(style: OutOfCredit) -> Resp {
    let (status, body) = match style {
        OutOfCredit::PaymentRequired => (
            StatusCode::PAYMENT_REQUIRED,
            json!({"error": "payment required: out of credit"}),
        ),
        OutOfCredit::OpenAi => (
            StatusCode::TOO_MANY_REQUESTS,
            json!({"error": {
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "type": "insufficient_quota",
                "param": null,
                "code": "insufficient_quota",
            }}),
        ),
        OutOfCredit::Anthropic => (
            StatusCode::BAD_REQUEST,
            json!({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
            }}),
        ),
    };
    json_answer(status, &body)
}

/// 400 in `shape` for a body that is not a request of it.
pub(crate) fn malformed(shape: Shape) -> Resp {
    let message = "the body is not a messages request";
    let body = match shape {
        Shape::OpenAi => json!({"error": {
            "message": message, "type": "invalid_request_error", "param": null, "code": null,
        }}),
        Shape::Anthropic => json!({"type": "error", "error": {
            "type": "invalid_request_error", "message": message,
        }}),
    };
    json_answer(StatusCode::BAD_REQUEST, &body)
}

fn json_answer(status: StatusCode, body: &Value) -> Resp {
    response(status, "application/json", Bytes::from(body.to_string()))
}
