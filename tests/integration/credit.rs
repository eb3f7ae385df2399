//! An account out of credit, as the three kinds of API say it (a metered API's 402, OpenAI's
//! 429 `insufficient_quota`, Anthropic's 400 "credit balance is too low"): the run stops at
//! once with exit 7 and nothing failed, a resume before credit is added stops again, and the
//! same command finishes the job once credit is added, every ID answered exactly once.

use std::time::Duration;

use highwater::demo::api::{llm_content, ApiConfig, LlmConfig, LlmHeaders, OutOfCredit};
use serde_json::Value;

use crate::harness::*;

/// The exit code of a run the API stopped for want of credit.
const OUT_OF_CREDIT: i32 = 7;

/// Rows to do.
const ROWS: usize = 60;

/// An API of `style` that grants far more per minute than the job asks (its headers
/// announce so: a run paced by them is not slowed), with credit for about a third of the job
/// (a call costs its prompt's 3 to 17 tokens and 10 more).
fn api(style: OutOfCredit, headers: LlmHeaders) -> ApiConfig {
    ApiConfig {
        llm: Some(LlmConfig {
            headers,
            out_of_credit: style,
            credit: Some(400),
            completion_tokens: (10, 10),
            ..LlmConfig::new(10_000_000, 100_000, Duration::from_secs(60))
        }),
        ..ApiConfig::fast()
    }
}

/// The rows' texts, of sizes that vary (ID `r00`.. with text).
fn rows() -> Vec<(String, String)> {
    (0..ROWS)
        .map(|i| {
            let id = format!("r{i:02}");
            let text = format!("review {i}: {}", "so good, ".repeat(i % 7));
            (id, text)
        })
        .collect()
}

/// One story: the job stops when the credit runs out, and finishes once credit is added.
fn stops_for_credit_then_finishes(style: OutOfCredit, headers: LlmHeaders, anthropic: bool) {
    let h = Harness::new(api(style, headers));
    let rows = rows();
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["id", "text"]).unwrap();
    for (id, text) in &rows {
        w.write_record([id, text]).unwrap();
    }
    let input = h.file("reviews.csv", w.into_inner().unwrap());
    let (url, body) = if anthropic {
        (
            h.api.messages_url(),
            r#"{"model": "claude-test", "max_tokens": 50, "messages": [{"role": "user", "content": {text:json}}], "metadata": {"user_id": "{id}"}}"#,
        )
    } else {
        (
            h.api.chat_completions_url(),
            r#"{"model": "gpt-test", "messages": [{"role": "user", "content": {text:json}}], "user": "{id}"}"#,
        )
    };
    let state = h.state();
    let extra = [
        "--id-column",
        "id",
        "--method",
        "POST",
        "--body",
        body,
        "--concurrency",
        "4",
    ];

    let run = h.run_new(&state, &input, &url, &extra);
    run.expect_refused(OUT_OF_CREDIT, &["out of credit", "resume with"]);
    let status = h.status(&state);
    assert_eq!(status["stats"]["failed"], 0, "{status}");
    assert_eq!(status["finished"], false, "{status}");
    let done = h.export(&state);
    assert!(
        !done.is_empty() && done.len() < ROWS,
        "{} results",
        done.len()
    );
    assert!(done.iter().all(|r| r["status"] == "ok"), "no ID failed");
    // Not waited on nor retried: each ID met the refusal at most once.
    for (id, _) in &rows {
        let refused = h.api.calls(id) - h.api.admitted_calls(id);
        assert!(refused <= 1, "{id} refused {refused} times");
    }

    // Without credit, the same command stops again, at once.
    let refusals = h.api.credit_refusals();
    h.run_new(&state, &input, &url, &extra)
        .expect_refused(OUT_OF_CREDIT, &["out of credit"]);
    assert!(h.api.credit_refusals() - refusals <= 4);
    assert_eq!(h.status(&state)["stats"]["failed"], 0);

    // Credit added: the same command finishes the job, every ID answered exactly once.
    h.api.add_credit(1_000_000);
    h.run_new(&state, &input, &url, &extra).expect_code(0);
    let export = h.export(&state);
    assert_eq!(export.len(), ROWS);
    for ((id, text), record) in rows.iter().zip(&export) {
        assert_eq!(record["id"], id.as_str());
        assert_eq!(record["status"], "ok", "{record}");
        let content = if anthropic {
            &record["body"]["content"][0]["text"]
        } else {
            &record["body"]["choices"][0]["message"]["content"]
        };
        assert_eq!(content.as_str(), Some(llm_content(id, text).as_str()));
        let parsed: Value = serde_json::from_str(content.as_str().unwrap()).unwrap();
        assert_eq!(parsed["id"], id.as_str());
        assert_eq!(h.api.admitted_calls(id), 1, "{id} answered once");
    }
    assert_eq!(h.status(&state)["stats"]["failed"], 0);
}

/// A credit-metered API's 402.
#[test]
fn a_402_stops_the_job_and_it_finishes_once_credit_is_added() {
    stops_for_credit_then_finishes(OutOfCredit::PaymentRequired, LlmHeaders::None, false);
}

/// OpenAI's 429 `insufficient_quota`: not a rate limit to wait out.
#[test]
fn openai_insufficient_quota_stops_the_job_and_it_finishes_once_credit_is_added() {
    stops_for_credit_then_finishes(OutOfCredit::OpenAi, LlmHeaders::OpenAi, false);
}

/// Anthropic's 400 "credit balance is too low": not a bad request of the ID.
#[test]
fn anthropic_credit_balance_too_low_stops_the_job_and_it_finishes_once_credit_is_added() {
    stops_for_credit_then_finishes(OutOfCredit::Anthropic, LlmHeaders::Anthropic, true);
}
