//! A language-model API's token windows, announced in OpenAI's or Anthropic's headers, are
//! kept: each call takes of them what it is expected to cost and settles what it spent, so
//! the job spends the windows with almost no call refused, and every ID is answered once.
//! What each answer cost is kept with its result and adds up to what the API counted.

use std::time::Duration;

use highwater::demo::api::{ApiConfig, LlmConfig, LlmHeaders};

use crate::harness::*;

/// Rows to do.
const ROWS: usize = 150;
/// Tokens a window allows.
const TOKENS: u64 = 5_000;
/// Completion tokens an answer writes at most.
const MOST_WRITTEN: u64 = 120;
/// Calls at once.
const CONCURRENCY: u64 = 8;

fn api(headers: LlmHeaders) -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(20),
        latency_max: Duration::from_millis(60),
        llm: Some(LlmConfig {
            headers,
            completion_tokens: (20, MOST_WRITTEN),
            // The requests never bind: the tokens do (about 200 a call, 25 calls a window).
            ..LlmConfig::new(TOKENS, 1000, Duration::from_secs(2))
        }),
        ..ApiConfig::fast()
    }
}

/// Texts of 200 to 800 bytes (50 to 200 prompt tokens).
fn rows() -> Vec<(String, String)> {
    (0..ROWS)
        .map(|i| {
            let id = format!("t{i:03}");
            let text = format!(
                "ticket {i}: {}",
                "the printer is on fire. ".repeat(8 + i % 25)
            );
            (id, text)
        })
        .collect()
}

fn token_windows_are_kept(headers: LlmHeaders, anthropic: bool) {
    let h = Harness::new(api(headers));
    let rows = rows();
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["id", "text"]).unwrap();
    for (id, text) in &rows {
        w.write_record([id, text]).unwrap();
    }
    let input = h.file("tickets.csv", w.into_inner().unwrap());
    let (url, body) = if anthropic {
        (
            h.api.messages_url(),
            r#"{"model": "claude-test", "max_tokens": 300, "messages": [{"role": "user", "content": {text:json}}], "metadata": {"user_id": "{id}"}}"#,
        )
    } else {
        (
            h.api.chat_completions_url(),
            r#"{"model": "gpt-test", "max_tokens": 300, "messages": [{"role": "user", "content": {text:json}}], "user": "{id}"}"#,
        )
    };
    let state = h.state();
    let concurrency = CONCURRENCY.to_string();
    let extra = [
        "--id-column",
        "id",
        "--method",
        "POST",
        "--body",
        body,
        "--concurrency",
        &concurrency,
    ];
    h.run_new(&state, &input, &url, &extra).expect_code(0);

    // Every ID answered once.
    let export = h.export(&state);
    assert_eq!(export.len(), ROWS);
    for (id, _) in &rows {
        assert_eq!(h.api.admitted_calls(id), 1, "{id} answered once");
    }
    // Almost no call refused: the job kept to the windows the API announced.
    let refused = h.api.llm_rate_refusals();
    let calls = ROWS as u64 + refused;
    assert!(
        refused * 50 <= calls,
        "{refused} of {calls} calls refused (more than 2%): {:?}",
        h.api.tokens_per_window()
    );
    // No window counted more than it allows, but for completions of calls in flight at its
    // end (the API counts a completion when it answers it).
    for (start, tokens) in h.api.tokens_per_window() {
        assert!(
            tokens <= TOKENS + CONCURRENCY * MOST_WRITTEN,
            "the window at {start} counted {tokens} tokens"
        );
    }
    // What each answer said it cost adds up to what the API counted.
    let counted: u64 = h.api.tokens_per_window().iter().map(|(_, t)| t).sum();
    let usage = &h.status(&state)["stats"]["usage"];
    let kept = usage["input"].as_u64().unwrap() + usage["output"].as_u64().unwrap();
    assert_eq!(kept, counted, "{usage}");
}

#[test]
fn token_windows_announced_in_openai_headers_are_kept() {
    token_windows_are_kept(LlmHeaders::OpenAi, false);
}

#[test]
fn token_windows_announced_in_anthropic_headers_are_kept() {
    token_windows_are_kept(LlmHeaders::Anthropic, true);
}

/// README's language-model job, word for word but for the API's address: every ticket's
/// label kept as JSON, its tokens counted.
#[test]
fn the_readme_language_model_job_runs_as_written() {
    let h = Harness::new(api(LlmHeaders::OpenAi));
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("## A language-model job")
        .nth(1)
        .expect("README has a language-model job");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    let command: String = block
        .lines()
        .filter(|l| !l.starts_with("export "))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(command.starts_with("highwater run "), "{command}");
    let command = command.replacen("highwater", BIN, 1).replace(
        "https://api.openai.com/v1/chat/completions",
        &h.api.chat_completions_url(),
    );
    let rows = rows();
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["id", "text"]).unwrap();
    for (id, text) in &rows {
        w.write_record([id, text]).unwrap();
    }
    let dir = h.path("readme");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tickets.csv"), w.into_inner().unwrap()).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .current_dir(&dir)
        .env("OPENAI_API_KEY", "sk-test-readme")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = dir.join("tickets");
    let export = h.export(&state);
    assert_eq!(export.len(), ROWS);
    for ((id, text), record) in rows.iter().zip(&export) {
        let expected: serde_json::Value =
            serde_json::from_str(&highwater::demo::api::llm_content(id, text)).unwrap();
        assert_eq!(record["body"], expected, "{record}");
        assert!(record["usage"]["output"].as_u64().unwrap() > 0, "{record}");
    }
    let status = h.run(&["status", "--state", p(&state)]);
    assert!(status.stdout.contains("usage:"), "{}", status.stdout);
}

/// The job's part of a token window, given as a quota (the API announces nothing): each
/// call takes its expected tokens and settles what it spent, so no call is refused.
fn token_quota_job(h: &Harness, state: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let rows = rows();
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["id", "text"]).unwrap();
    for (id, text) in &rows {
        w.write_record([id, text]).unwrap();
    }
    let input = h.file("tickets.csv", w.into_inner().unwrap());
    let url = h.api.chat_completions_url();
    let mut args = new_job_args(state, &input, &url);
    let quota = format!("{TOKENS}tokens/2s");
    let concurrency = CONCURRENCY.to_string();
    args.extend([
        "--id-column",
        "id",
        "--method",
        "POST",
        "--body",
        r#"{"model": "gpt-test", "max_tokens": 300, "messages": [{"role": "user", "content": {text:json}}], "user": "{id}"}"#,
        "--concurrency",
        &concurrency,
        "--quota",
        &quota,
    ]);
    args.extend_from_slice(extra);
    args.into_iter().map(String::from).collect()
}

#[test]
fn a_token_quota_with_no_headers_gives_no_429() {
    let h = Harness::new(api(LlmHeaders::None));
    let state = h.state();
    let args = token_quota_job(&h, &state, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    h.run(&args).expect_code(0);
    assert_eq!(h.export(&state).len(), ROWS);
    for (id, _) in &rows() {
        assert_eq!(h.api.admitted_calls(id), 1, "{id} answered once");
    }
    assert_eq!(
        h.api.llm_rate_refusals(),
        0,
        "{:?}",
        h.api.tokens_per_window()
    );
    let status = h.status(&state);
    assert_eq!(status["quotas"][0]["quota"], "5000tokens/2s", "{status}");
}

/// Killed twice in the middle of a window and resumed at once: the token quota is kept
/// with the job, so no resume spends again what the killed run had taken of the window.
#[test]
fn two_kills_mid_window_and_resumes_never_exceed_a_token_window() {
    let h = Harness::new(api(LlmHeaders::None));
    let state = h.state();
    let args = token_quota_job(&h, &state, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for kill in [20, 45] {
        let mut child = h.spawn(&args);
        assert!(h.wait_for_calls(&mut child, kill), "the run ended early");
        signal(&child, libc::SIGKILL);
        finish(child);
    }
    h.run(&args).expect_code(0);
    let rows = rows();
    let export = h.export(&state);
    assert_eq!(export.len(), ROWS);
    for ((id, _), record) in rows.iter().zip(&export) {
        assert_eq!(record["id"], id.as_str());
        assert_eq!(record["status"], "ok");
    }
    assert_eq!(
        h.api.llm_rate_refusals(),
        0,
        "{:?}",
        h.api.tokens_per_window()
    );
    for (start, tokens) in h.api.tokens_per_window() {
        assert!(
            tokens <= TOKENS,
            "the window at {start} counted {tokens} tokens"
        );
    }
}
