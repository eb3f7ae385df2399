//! A job priced by the tokens it spends: its spend and projection shown, and a budget in
//! money that stops the run (exit 5, every result kept, nothing failed) within one call's
//! most of the cap and never above it, and goes on when raised, every ID answered once.

use std::time::Duration;

use highwater::demo::api::{ApiConfig, LlmConfig, LlmHeaders};

use crate::harness::*;

/// Rows to do.
const ROWS: usize = 60;
/// Completion tokens an answer writes at most (the body's `max_tokens`).
const MAX_TOKENS: u64 = 100;
/// Prices per million tokens, as given on the command line, and per token.
const PRICE_IN: &str = "2";
const PRICE_OUT: &str = "8";
const PER_IN: f64 = 2e-6;
const PER_OUT: f64 = 8e-6;
/// The first budget: about a quarter of what the job costs.
const BUDGET: f64 = 0.012;

fn api() -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(5),
        latency_max: Duration::from_millis(20),
        llm: Some(LlmConfig {
            headers: LlmHeaders::None,
            completion_tokens: (20, MAX_TOKENS),
            // No window binds: only the budget stops the job.
            ..LlmConfig::new(100_000_000, 1_000_000, Duration::from_secs(60))
        }),
        ..ApiConfig::fast()
    }
}

/// Texts of 100 to 600 bytes.
fn rows() -> Vec<(String, String)> {
    (0..ROWS)
        .map(|i| {
            let id = format!("m{i:02}");
            let text = format!("product {i}: {}", "a lamp of brass. ".repeat(6 + i % 30));
            (id, text)
        })
        .collect()
}

const BODY: &str = r#"{"model": "gpt-test", "max_tokens": 100, "messages": [{"role": "user", "content": {text:json}}], "user": "{id}"}"#;

/// What the job spent by the status's usage.
fn spent(status: &serde_json::Value) -> f64 {
    let usage = &status["stats"]["usage"];
    usage["input"].as_u64().unwrap_or(0) as f64 * PER_IN
        + usage["output"].as_u64().unwrap_or(0) as f64 * PER_OUT
}

#[test]
fn a_money_budget_stops_within_one_calls_most_of_its_cap_and_goes_on_when_raised() {
    let h = Harness::new(api());
    let rows = rows();
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["id", "text"]).unwrap();
    for (id, text) in &rows {
        w.write_record([id, text]).unwrap();
    }
    let input = h.file("products.csv", w.into_inner().unwrap());
    let url = h.api.chat_completions_url();
    let state = h.state();
    let budget = BUDGET.to_string();
    let base = [
        "--method",
        "POST",
        "--body",
        BODY,
        "--concurrency",
        "8",
        "--price-input",
        PRICE_IN,
        "--price-output",
        PRICE_OUT,
    ];
    // A budget needs prices to value the calls.
    let unpriced = h.state();
    h.run_new(
        &unpriced,
        &input,
        &url,
        &["--id-column", "id", "--budget", "1"],
    )
    .expect_refused(2, &["--budget", "--price-input"]);

    let mut extra = base.to_vec();
    extra.extend(["--id-column", "id", "--budget", &budget]);
    let run = h.run_new(&state, &input, &url, &extra);
    run.expect_refused(5, &["budget of 0.0120 is spent", "raise the budget"]);
    let status = h.status(&state);
    assert_eq!(status["stats"]["failed"], 0, "{status}");
    let done = h.export(&state);
    assert!(done.iter().all(|r| r["status"] == "ok"), "nothing failed");
    assert!(done.len() < ROWS, "the budget stopped the job early");
    // Never above the cap, and short of it by less than one call's most: a token per byte of
    // the largest body, and its max_tokens.
    let largest = rows.iter().map(|(_, t)| t.len()).max().unwrap() + BODY.len() + 16;
    let most = largest as f64 * PER_IN + MAX_TOKENS as f64 * PER_OUT;
    let first = spent(&status);
    assert!(
        first <= BUDGET + 1e-12 && BUDGET - first < most,
        "spent {first} of {BUDGET} (a call costs at most {most})"
    );
    // Every call answered was kept: what the API was paid for is in the results.
    let admitted: u64 = rows.iter().map(|(id, _)| h.api.admitted_calls(id)).sum();
    assert_eq!(admitted, done.len() as u64, "every paid call kept");
    // What the budget counts is what was spent, to the pico-unit: every call settled by its
    // answer's usage, and what the run held and did not spend given back at its end.
    let usage = &status["stats"]["usage"];
    let pico = usage["input"].as_u64().unwrap() * 2_000_000
        + usage["output"].as_u64().unwrap() * 8_000_000;
    assert_eq!(status["quotas"][0]["used"].as_u64(), Some(pico), "{status}");
    // The spend as `status` shows it, with its projection and the budget.
    assert!(
        (status["spend"]["spent"].as_f64().unwrap() - first).abs() < 1e-9,
        "{status}"
    );
    assert_eq!(status["spend"]["budget"].as_f64(), Some(BUDGET));
    assert!(
        status["spend"]["projected"].as_f64().unwrap() > BUDGET,
        "{status}"
    );
    let text = h.run(&["status", "--state", p(&state)]);
    assert!(
        text.stdout.contains("spend:      0.0")
            && text.stdout.contains("projected for the job, budget 0.0120"),
        "{}",
        text.stdout
    );

    // The same budget again: at most what is left, never above the cap.
    let mut again = base.to_vec();
    again.extend(["--budget", &budget]);
    h.resume(&state, &again).expect_code(5);
    let second = spent(&h.status(&state));
    assert!(second <= BUDGET + 1e-12, "spent {second} of {BUDGET}");

    // Raised: the job goes on and finishes, every ID answered once, the change kept.
    let mut raised = base.to_vec();
    raised.extend(["--budget", "1"]);
    h.resume(&state, &raised).expect_code(0);
    let export = h.export(&state);
    assert_eq!(export.len(), ROWS);
    for (id, _) in &rows {
        assert_eq!(h.api.admitted_calls(id), 1, "{id} answered once");
    }
    let status = h.status(&state);
    assert!(
        status
            .to_string()
            .contains("budget changed from 0.0120 to 1.0000"),
        "{status}"
    );
    assert!(spent(&status) <= 1.0);
    // `none` removes the budget.
    h.resume(&state, &["--budget", "none"]).expect_code(0);
    assert!(h.status(&state)["spend"]["budget"].is_null());
}

/// A budget that could not be kept is refused before anything runs: without both prices,
/// or for work whose calls' cost is not known before they are made (a command, a batch
/// request); so is a quota of tokens for them.
#[test]
fn a_budget_that_could_not_be_kept_is_refused() {
    let h = Harness::new(api());
    let input = h.ids_file("ids.txt", &ids(5));
    let url = h.api.chat_completions_url();
    let state = h.state();
    h.run_new(
        &state,
        &input,
        &url,
        &["--price-input", "2", "--budget", "1"],
    )
    .expect_refused(2, &["give both --price-input and --price-output"]);
    let priced = ["--price-input", "2", "--price-output", "8", "--budget", "1"];
    let exec = h.run(
        &[
            &["run", "--state", p(&state), "--input", p(&input)][..],
            &["--exec", "echo {id}"],
            &priced,
        ]
        .concat(),
    );
    exec.expect_refused(
        2,
        &["--budget needs what a call may cost", "a command's cost"],
    );
    let batch = h.run_new(
        &state,
        &input,
        &url,
        &[
            &["--batch-size", "5", "--split", ".[] | {key: .id, value: .}"][..],
            &["--quota", "1000tokens/min"],
        ]
        .concat(),
    );
    batch.expect_refused(
        2,
        &["--quota 1000tokens/1min needs", "a batch request's cost"],
    );
    assert!(!state.exists() || h.status(&state)["job_id"].is_null());
    assert_eq!(h.api.total_calls(), 0);
}
