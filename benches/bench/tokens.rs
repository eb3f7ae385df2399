//! `tokens`: a language-model API that limits tokens as well as requests. The fake API's
//! OpenAI-shaped route allows 20,000 tokens and 60 requests per 10 s window (fixed windows on
//! the epoch, 429 with `Retry-After` above either), answers after 100 to 300 ms with 20 to
//! 250 completion tokens, and announces the window in OpenAI's headers, in Anthropic's (on
//! its Anthropic-shaped route) or not at all. The input is a CSV of texts from 200 to 2,000
//! bytes (50 to 500 prompt tokens), sent in a JSON body made by the job's row template; the
//! run has no flag beyond the defaults, but in the last case, where the API announces nothing
//! and the job is given the window as a quota of tokens (`--quota 20000tokens/10s`). Each run
//! starts on a window's boundary. Per case:
//! token goodput (the tokens the API granted in the windows the run spanned whole, against
//! the 20,000 each allows) and the share of calls refused.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use highwater::demo::api::{ApiConfig, FakeApi, LlmConfig, LlmHeaders};

use super::{binary, finish_temp, loadavg, logged_run_args, median, temp_dir, Args, Proc};

/// Tokens per window.
const TOKENS: u64 = 20_000;
/// Requests per window.
const REQUESTS: u64 = 60;
/// The window's length in seconds.
const WINDOW_SECS: u64 = 10;

/// Which route a case calls.
#[derive(Clone, Copy)]
enum Route {
    OpenAi,
    Anthropic,
}

/// The cases: the headers the API announces, the route (and body shape) called, and the
/// job's flags beyond the defaults.
const CASES: [(&str, LlmHeaders, Route, &[&str]); 4] = [
    ("OpenAI headers", LlmHeaders::OpenAi, Route::OpenAi, &[]),
    (
        "Anthropic headers",
        LlmHeaders::Anthropic,
        Route::Anthropic,
        &[],
    ),
    ("no headers", LlmHeaders::None, Route::OpenAi, &[]),
    (
        "no headers, --quota 20000tokens/10s",
        LlmHeaders::None,
        Route::OpenAi,
        &["--quota", "20000tokens/10s"],
    ),
];

fn config(headers: LlmHeaders) -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(100),
        latency_max: Duration::from_millis(300),
        llm: Some(LlmConfig {
            headers,
            completion_tokens: (20, 250),
            ..LlmConfig::new(TOKENS, REQUESTS, Duration::from_secs(WINDOW_SECS))
        }),
        ..ApiConfig::fast()
    }
}

/// The URL and the body template of `route`.
fn request(api: &FakeApi, route: Route) -> (String, &'static str) {
    match route {
        Route::OpenAi => (
            api.chat_completions_url(),
            r#"{"model": "gpt-4o-mini", "max_tokens": 300, "messages": [{"role": "user", "content": {text:json}}], "user": "{id}"}"#,
        ),
        Route::Anthropic => (
            api.messages_url(),
            r#"{"model": "claude-haiku", "max_tokens": 300, "messages": [{"role": "user", "content": {text:json}}], "metadata": {"user_id": "{id}"}}"#,
        ),
    }
}

/// `n` rows `id,text`, the texts from 200 to 2,000 bytes.
fn write_rows(path: &Path, n: u64) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(["id", "text"])?;
    for i in 0..n {
        let len = 200 + (i * 7919 % 1801) as usize;
        let mut text = format!("Classify review {i}: ");
        while text.len() < len {
            text.push_str("the service was fine, ");
        }
        text.truncate(len);
        w.write_record([format!("r{i:06}"), text])?;
    }
    w.flush()?;
    Ok(())
}

/// One run: token goodput against the window's allowance, and the share of calls refused.
struct Run {
    goodput: f64,
    refused: f64,
    calls: u64,
    /// The tokens granted in each window the run spanned whole.
    whole: Vec<u64>,
}

/// Milliseconds since the Unix epoch.
fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sleeps until the next window boundary (fixed windows on the epoch, as the API counts).
fn wait_for_a_window() {
    let window_ms = WINDOW_SECS * 1000;
    let now = epoch_ms(SystemTime::now());
    std::thread::sleep(Duration::from_millis(window_ms - now % window_ms));
}

pub fn tokens(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let bin = binary(args)?;
    let (guard, tmp) = temp_dir(args.keep)?;
    let per_sec = TOKENS as f64 / WINDOW_SECS as f64;
    println!("# tokens: {command}");
    println!(
        "# {} rows, --concurrency {}; API: 200 after 100-300 ms with 20-250 completion tokens, \
         {TOKENS} tokens and {REQUESTS} requests per {WINDOW_SECS} s ({per_sec} tokens/s), \
         prompts of 50-500 tokens; load {}",
        args.ids,
        args.concurrency,
        loadavg()
    );
    let input = tmp.join("rows.csv");
    write_rows(&input, args.ids)?;
    let bins: Vec<(&str, &Path)> = std::iter::once(("after", bin.as_path()))
        .chain(args.before.as_deref().map(|b| ("before", b)))
        .collect();
    let mut rows = String::new();
    for (case, (name, headers, route, flags)) in CASES.into_iter().enumerate() {
        let mut cells = Vec::new();
        for (label, bin) in &bins {
            let mut goodputs = Vec::new();
            let mut refused = Vec::new();
            for round in 0..args.repeat {
                let state = tmp.join(format!("{case}-{label}-{round}"));
                let r = run(rt, bin, args, (headers, route, flags), &input, &state)?;
                eprintln!(
                    "{name}, {label}: token goodput {:.3} of {TOKENS} per window, {:.2}% of \
                     calls refused ({} calls; tokens in the whole windows {:?})",
                    r.goodput,
                    100.0 * r.refused,
                    r.calls,
                    r.whole
                );
                goodputs.push(r.goodput);
                refused.push(r.refused);
            }
            cells.push(format!(
                "**{:.3}**, {:.2}% refused",
                median(&goodputs),
                100.0 * median(&refused)
            ));
        }
        let _ = writeln!(rows, "| {name} | {} |", cells.join(" | "));
    }
    println!();
    let header: Vec<String> = bins
        .iter()
        .map(|(label, _)| format!("{label}: token goodput ÷ limit, calls refused (median)"))
        .collect();
    println!("| the API's headers | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(bins.len()));
    print!("{rows}");
    finish_temp(guard, &tmp);
    Ok(())
}

/// Runs the binary over `input` against a fresh fake API to its end.
fn run(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    args: &Args,
    (headers, route, flags): (LlmHeaders, Route, &[&str]),
    input: &Path,
    state: &Path,
) -> Result<Run> {
    let api = rt
        .block_on(FakeApi::start(config(headers)))
        .context("starting the fake API")?;
    let (url, body) = request(&api, route);
    let mut cmd = logged_run_args(input, &url, state, args.concurrency);
    cmd.extend(
        ["--id-column", "id", "--method", "POST", "--body", body]
            .iter()
            .chain(flags)
            .map(|s| s.to_string()),
    );
    let log = state.with_extension("log");
    wait_for_a_window();
    let started_ms = epoch_ms(SystemTime::now());
    let mut proc = Proc::spawn(bin, &cmd, &log)?;
    let exit = loop {
        if let Some(e) = proc.reap(false)? {
            break e;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if exit.code != Some(0) {
        bail!(
            "{} {}: {}",
            bin.display(),
            exit.describe(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    // The last call on the wall clock: the windows are the epoch's.
    let Some(&last) = api.call_times().last() else {
        bail!("no calls");
    };
    let last_ms = epoch_ms(SystemTime::now() - Instant::now().saturating_duration_since(last));
    let window_ms = WINDOW_SECS * 1000;
    let whole: Vec<u64> = api
        .tokens_per_window()
        .into_iter()
        .filter(|&(start, _)| start >= started_ms - started_ms % window_ms)
        .filter(|&(start, _)| start + window_ms <= last_ms)
        .map(|(_, tokens)| tokens)
        .collect();
    if whole.is_empty() {
        bail!("the run spanned no whole window: give it more --ids");
    }
    let calls = api.total_calls();
    Ok(Run {
        goodput: whole.iter().sum::<u64>() as f64 / (whole.len() as u64 * TOKENS) as f64,
        refused: api.llm_rate_refusals() as f64 / calls.max(1) as f64,
        calls,
        whole,
    })
}
