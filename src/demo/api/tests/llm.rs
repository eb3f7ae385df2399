//! The language-model routes: the window of requests and tokens, the providers' headers (read
//! back with [`crate::quota::announced`]), the credit and its three refusals, and the calls
//! they count.

use std::time::SystemTime;

use super::super::llm::{go_duration, Meter, Refusal};
use super::*;
use crate::quota::announced::{parse_duration, parse_rfc3339, read_announced};

/// A window so long that no test crosses its end.
const LONG: Duration = Duration::from_secs(3600 * 24 * 365);

fn llm(tokens: u64, requests: u64) -> LlmConfig {
    LlmConfig {
        completion_tokens: (10, 10),
        ..LlmConfig::new(tokens, requests, LONG)
    }
}

async fn start(llm: LlmConfig) -> FakeApi {
    FakeApi::start(ApiConfig {
        llm: Some(llm),
        ..ApiConfig::fast()
    })
    .await
    .unwrap()
}

/// POSTs `body` to `url`: status, headers and the JSON body.
async fn post(
    url: &str,
    body: serde_json::Value,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let resp = client()
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = serde_json::from_slice(&resp.bytes().await.unwrap()).expect("a JSON body");
    (status, headers, body)
}

fn chat(id: &str, text: &str) -> serde_json::Value {
    serde_json::json!({
        "model": "gpt-test",
        "messages": [{"role": "user", "content": text}],
        "user": id,
    })
}

fn message(id: &str, text: &str) -> serde_json::Value {
    serde_json::json!({
        "model": "claude-test",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "metadata": {"user_id": id},
    })
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
        .to_str()
        .unwrap()
}

#[test]
fn resets_are_go_durations_that_read_back() {
    for (ms, text) in [
        (0, "0s"),
        (120, "120ms"),
        (999, "999ms"),
        (1000, "1s"),
        (59_500, "59.5s"),
        (1_250, "1.25s"),
        (360_000, "6m0s"),
        (61_005, "1m1.005s"),
        (3_600_000, "1h0m0s"),
    ] {
        let d = Duration::from_millis(ms);
        assert_eq!(go_duration(d), text);
        assert_eq!(parse_duration(text), Some(d), "{text}");
    }
}

#[test]
fn the_window_refuses_requests_and_tokens_above_its_limits_until_its_end() {
    let meter = Meter::new(LlmConfig::new(100, 3, Duration::from_secs(10)));
    // Window 1 covers [10 000, 20 000) ms.
    assert_eq!(meter.admit(10_000, 40), Ok(()));
    // A prompt that would take the tokens above the limit is refused, a smaller one is not.
    assert_eq!(
        meter.admit(12_500, 61),
        Err(Refusal::Rate {
            tokens: true,
            retry_after_secs: 8
        })
    );
    assert_eq!(meter.admit(12_500, 60), Ok(()));
    // Completions count when answered, above the limit too: the window is spent.
    meter.settle(13_000, 30);
    assert_eq!(meter.standing(13_000).tokens_remaining, 0);
    assert_eq!(
        meter.admit(19_999, 1),
        Err(Refusal::Rate {
            tokens: true,
            retry_after_secs: 1
        })
    );
    // A new window: empty. Its third request fills the request limit.
    for _ in 0..3 {
        assert_eq!(meter.admit(20_000, 1), Ok(()));
    }
    assert_eq!(
        meter.admit(20_001, 1),
        Err(Refusal::Rate {
            tokens: false,
            retry_after_secs: 10
        })
    );
    let standing = meter.standing(25_000);
    assert_eq!(
        (
            standing.requests_remaining,
            standing.tokens_remaining,
            standing.end_ms
        ),
        (0, 97, 30_000)
    );
    assert_eq!(meter.granted(), [(10_000, 130), (20_000, 3)]);
    assert_eq!(meter.rate_refusals(), 3);
    assert_eq!(meter.credit_refusals(), 0);
}

#[test]
fn spent_credit_refuses_until_topped_up() {
    let meter = Meter::new(LlmConfig {
        credit: Some(100),
        ..LlmConfig::new(1_000_000, 1_000, LONG)
    });
    assert_eq!(meter.admit(0, 30), Ok(()));
    meter.settle(0, 50);
    assert_eq!(meter.credit(), Some(20));
    // Credit left admits a request even if its answer takes it below zero: held at zero.
    assert_eq!(meter.admit(0, 15), Ok(()));
    meter.settle(0, 50);
    assert_eq!(meter.credit(), Some(0));
    assert_eq!(meter.admit(0, 1), Err(Refusal::Credit));
    assert_eq!(meter.admit(0, 1), Err(Refusal::Credit));
    meter.add_credit(10);
    assert_eq!(meter.admit(0, 1), Ok(()));
    assert_eq!(meter.credit_refusals(), 2);
    // No limit: adding does nothing, nothing runs out.
    let unlimited = Meter::new(LlmConfig::new(1_000_000, 1_000, LONG));
    unlimited.add_credit(5);
    assert_eq!(unlimited.credit(), None);
}

#[tokio::test]
async fn openai_route_answers_a_completion_with_its_usage_and_headers() {
    let api = start(LlmConfig {
        completion_tokens: (7, 7),
        ..LlmConfig::new(1000, 10, LONG)
    })
    .await;
    // 9 bytes: 3 prompt tokens.
    let (status, headers, body) =
        post(&api.chat_completions_url(), chat("row-1", "cats purr")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["index"], 0);
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content, llm_content("row-1", "cats purr"));
    let parsed: serde_json::Value = serde_json::from_str(content).unwrap();
    assert_eq!(parsed["id"], "row-1");
    assert!(LABELS.contains(&parsed["label"].as_str().unwrap()));
    assert_eq!(
        body["usage"],
        serde_json::json!({"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10})
    );
    assert_eq!(header(&headers, "x-ratelimit-limit-requests"), "10");
    assert_eq!(header(&headers, "x-ratelimit-limit-tokens"), "1000");
    assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "9");
    assert_eq!(header(&headers, "x-ratelimit-remaining-tokens"), "990");
    let reset = parse_duration(header(&headers, "x-ratelimit-reset-tokens")).unwrap();
    assert!(reset <= LONG, "{reset:?}");
    assert_eq!(
        header(&headers, "x-ratelimit-reset-requests"),
        header(&headers, "x-ratelimit-reset-tokens")
    );
    // highwater reads both families: the requests', and the tokens'.
    let announced = read_announced(&headers, SystemTime::now());
    assert_eq!(announced.len(), 2, "{announced:?}");
    assert_eq!(
        (announced[0].policy.as_str(), announced[0].remaining),
        ("requests", 9)
    );
    assert_eq!(
        (announced[1].policy.as_str(), announced[1].remaining),
        ("tokens", 990)
    );
    // The same prompt, the same answer; the ID from the query wins over `user`.
    let url = format!("{}?id=from%20query", api.chat_completions_url());
    let (_, _, again) = post(&url, chat("row-1", "cats purr")).await;
    assert_eq!(again["usage"], body["usage"]);
    assert_eq!(api.calls("from query"), 1);
    assert_eq!((api.calls("row-1"), api.admitted_calls("row-1")), (1, 1));
    assert_eq!(api.tokens_per_window().iter().map(|w| w.1).sum::<u64>(), 20);
    // Not a messages request: 400, no call.
    let (status, _, _) = post(
        &api.chat_completions_url(),
        serde_json::json!({"model": "m"}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(api.total_calls(), 2);
    api.shutdown().await;
}

#[tokio::test]
async fn anthropic_route_answers_a_message_capped_by_max_tokens() {
    let api = start(LlmConfig {
        headers: LlmHeaders::Anthropic,
        completion_tokens: (50, 60),
        ..LlmConfig::new(1000, 10, LONG)
    })
    .await;
    let (status, headers, body) = post(&api.messages_url(), message("row-2", "dogs bark!")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["content"][0]["type"], "text");
    assert_eq!(
        body["content"][0]["text"],
        llm_content("row-2", "dogs bark!")
    );
    // 10 bytes: 3 tokens; max_tokens 5 caps the 50 to 60 drawn.
    assert_eq!(
        body["usage"],
        serde_json::json!({"input_tokens": 3, "output_tokens": 5})
    );
    for family in ["requests", "tokens", "input-tokens", "output-tokens"] {
        let name = |part| format!("anthropic-ratelimit-{family}-{part}");
        let reset = header(&headers, &name("reset"));
        assert!(
            parse_rfc3339(reset).is_some_and(|t| t > SystemTime::now()),
            "{reset}"
        );
    }
    assert_eq!(
        header(&headers, "anthropic-ratelimit-requests-remaining"),
        "9"
    );
    assert_eq!(
        header(&headers, "anthropic-ratelimit-tokens-remaining"),
        "992"
    );
    assert_eq!(header(&headers, "anthropic-ratelimit-tokens-limit"), "1000");
    let announced = read_announced(&headers, SystemTime::now());
    assert_eq!(announced[0].policy, "anthropic-requests");
    api.shutdown().await;
}

#[tokio::test]
async fn a_full_window_refuses_with_retry_after_in_the_routes_shape() {
    let api = start(llm(1000, 1)).await;
    assert_eq!(
        post(&api.chat_completions_url(), chat("a", "x")).await.0,
        200
    );
    let (status, headers, body) = post(&api.chat_completions_url(), chat("b", "x")).await;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "requests");
    assert!(header(&headers, "retry-after").parse::<u64>().unwrap() >= 1);
    assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "0");
    let (status, _, body) = post(&api.messages_url(), message("b", "x")).await;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["type"], "rate_limit_error");
    // Refused calls are calls of the ID, not admitted ones.
    assert_eq!((api.calls("b"), api.admitted_calls("b")), (2, 0));
    assert_eq!(api.llm_rate_refusals(), 2);
    assert_eq!(api.accepted(), 1);
    api.shutdown().await;
}

#[tokio::test]
async fn spent_credit_is_refused_in_each_style_until_added() {
    let quota = serde_json::json!({"error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": null,
        "code": "insufficient_quota",
    }});
    let balance = serde_json::json!({"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
    }});
    for (style, status, body) in [
        (
            OutOfCredit::PaymentRequired,
            402,
            serde_json::json!({"error": "payment required: out of credit"}),
        ),
        (OutOfCredit::OpenAi, 429, quota),
        (OutOfCredit::Anthropic, 400, balance),
    ] {
        let api = start(LlmConfig {
            credit: Some(11),
            out_of_credit: style,
            ..llm(1_000_000, 1_000)
        })
        .await;
        // 1 prompt token and 10 completion tokens spend the 11.
        assert_eq!(
            post(&api.chat_completions_url(), chat("a", "x")).await.0,
            200
        );
        assert_eq!(api.credit(), Some(0));
        for _ in 0..2 {
            let (got, headers, got_body) = post(&api.chat_completions_url(), chat("b", "x")).await;
            assert_eq!((got, &got_body), (status, &body), "{style:?}");
            assert!(headers.get("retry-after").is_none(), "{style:?}");
            assert!(headers.get("x-ratelimit-remaining-tokens").is_some());
        }
        api.add_credit(100);
        assert_eq!(
            post(&api.chat_completions_url(), chat("b", "x")).await.0,
            200
        );
        assert_eq!((api.calls("b"), api.admitted_calls("b")), (3, 1));
        assert_eq!(api.credit_refusals(), 2);
        api.shutdown().await;
    }
}

#[tokio::test]
async fn without_a_language_model_config_the_routes_are_not_found() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let (status, _, _) = post(&api.chat_completions_url(), chat("a", "x")).await;
    assert_eq!(status, 404);
    assert_eq!(api.total_calls(), 0);
    api.shutdown().await;
}
