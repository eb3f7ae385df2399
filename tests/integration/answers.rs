//! Answers you can trust: `--expect json`, `--fail-if`, `--retry-if` and `--extract` against
//! an API that answers 200 with all kinds of bodies.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::harness::{new_job_args, p, Harness};
use highwater::demo::api::ApiConfig;

/// A loopback API answering `GET /items/{id}` with 200 and a body chosen by the ID's prefix:
///
/// - `ok-N`: `{"value": N, "padding": ...}`
/// - `err-N`: `{"error": "quota exceeded"}`
/// - `html-N`: an HTML error page
/// - `trunc-N`: a JSON document cut short
/// - `pending-N`: `{"status": "pending"}` on the first two calls, then as `ok-N`
/// - `str-N`: `{"a": "text"}` (indexing `.a.b` errors)
pub struct AnswerApi {
    pub url: String,
    calls: Arc<Mutex<HashMap<String, u32>>>,
}

impl AnswerApi {
    pub fn start(h: &Harness) -> AnswerApi {
        let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let listener = h
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}/items/{{id}}", listener.local_addr().unwrap());
        let counted = calls.clone();
        h.block_on(async move {
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let calls = counted.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                            let id = req.uri().path().trim_start_matches("/items/").to_string();
                            let n = {
                                let mut calls = calls.lock().unwrap();
                                let n = calls.entry(id.clone()).or_default();
                                *n += 1;
                                *n
                            };
                            async move {
                                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body(
                                    &id, n,
                                )))))
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        AnswerApi { url, calls }
    }

    fn calls(&self, id: &str) -> u32 {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

pub fn number(id: &str) -> u64 {
    id.rsplit('-').next().unwrap().parse().unwrap()
}

/// The body of the `n`th call for `id` (see [`AnswerApi`]).
fn body(id: &str, n: u32) -> String {
    let ok = |id: &str| {
        format!(
            r#"{{"value":{},"name":"item {id}","padding":"{}"}}"#,
            number(id),
            "x".repeat(100)
        )
    };
    match id.split('-').next().unwrap() {
        "ok" => ok(id),
        "err" => r#"{"error":"quota exceeded"}"#.into(),
        "html" => "<html><body><h1>502 Bad Gateway</h1></body></html>".into(),
        "trunc" => r#"{"value":1,"name":"cut sho"#.into(),
        "pending" if n <= 2 => r#"{"status":"pending"}"#.into(),
        "pending" => ok(id),
        "str" => r#"{"a":"text"}"#.into(),
        other => panic!("no such kind of ID: {other}"),
    }
}

const KINDS: [&str; 5] = ["ok", "err", "html", "trunc", "pending"];

const CHECKS: [&str; 6] = [
    "--expect",
    "json",
    "--fail-if",
    ".error != null",
    "--retry-if",
    r#".status == "pending""#,
];

fn records(h: &Harness) -> HashMap<String, Value> {
    h.export(&h.state())
        .into_iter()
        .map(|r| (r["id"].as_str().unwrap().to_string(), r))
        .collect()
}

fn failures_table(h: &Harness, class: Option<&str>) -> String {
    let state = h.state();
    let mut args = vec!["failures", "--state", p(&state)];
    if let Some(class) = class {
        args.extend(["--class", class]);
    }
    let out = h.run(&args);
    out.expect_code(0);
    out.stdout
}

#[test]
fn every_kind_of_answer_ends_as_it_should_and_the_error_table_says_why() {
    let h = Harness::new(ApiConfig::default());
    let api = AnswerApi::start(&h);
    let ids: Vec<String> = (0..20)
        .map(|i| format!("{}-{i}", KINDS[i % KINDS.len()]))
        .collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let mut args = new_job_args(&state, &input, &api.url);
    args.extend(CHECKS);
    args.extend(["--max-attempts", "4"]);
    h.run(&args).expect_code(3);
    let records = records(&h);
    assert_eq!(records.len(), ids.len());
    for id in &ids {
        let r = &records[id];
        let kind = id.split('-').next().unwrap();
        let calls = api.calls(id);
        match kind {
            "ok" | "pending" => {
                assert_eq!(r["status"], "ok", "{r}");
                assert_eq!(r["body"]["value"], number(id), "{r}");
                assert_eq!(calls, if kind == "ok" { 1 } else { 3 }, "{id}");
                assert_eq!(r["attempts"], calls, "{r}");
            }
            "err" => {
                assert_eq!(r["status"], "failed", "{r}");
                assert_eq!(r["error_class"], "invalid", "{r}");
                assert_eq!(calls, 1, "fail-if is permanent: {id}");
                let error = r["error"].as_str().unwrap();
                assert!(
                    error.contains("fail-if") && error.contains("quota exceeded"),
                    "{r}"
                );
            }
            "html" | "trunc" => {
                assert_eq!(r["status"], "failed", "{r}");
                assert_eq!(r["error_class"], "body", "{r}");
                assert_eq!(calls, 4, "not JSON is retried: {id}");
                let error = r["error"].as_str().unwrap();
                assert!(error.contains("expect json"), "{r}");
            }
            _ => unreachable!(),
        }
    }
    // The error table says why for each, and --class invalid picks the fail-if ones.
    let table = failures_table(&h, None);
    for id in ids
        .iter()
        .filter(|id| !id.starts_with("ok") && !id.starts_with("pending"))
    {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id} is not in the table:\n{table}"));
        let why = if id.starts_with("err") {
            "fail-if"
        } else {
            "expect json"
        };
        assert!(line.contains(why), "{line}");
    }
    let invalid = failures_table(&h, Some("invalid"));
    let listed: Vec<&str> = invalid
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.contains('-'))
        .collect();
    let expected: Vec<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|id| id.starts_with("err"))
        .collect();
    assert_eq!(listed, expected, "{invalid}");
}

#[test]
fn retry_if_counts_against_max_attempts() {
    let h = Harness::new(ApiConfig::default());
    let api = AnswerApi::start(&h);
    let input = h.ids_file("ids.txt", &["pending-1".to_string()]);
    let state = h.state();
    let mut args = new_job_args(&state, &input, &api.url);
    args.extend(CHECKS);
    args.extend(["--max-attempts", "2"]);
    h.run(&args).expect_code(3);
    let r = &records(&h)["pending-1"];
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error_class"], "invalid", "{r}");
    assert!(r["error"].as_str().unwrap().contains("retry-if"), "{r}");
    assert_eq!(api.calls("pending-1"), 2);
}

#[test]
fn a_program_that_errors_fails_its_id_and_rerun_failed_after_fixing_it_recovers() {
    let h = Harness::new(ApiConfig::default());
    let api = AnswerApi::start(&h);
    let ids = vec!["ok-1".to_string(), "str-2".to_string(), "ok-3".to_string()];
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let mut args = new_job_args(&state, &input, &api.url);
    args.extend(["--fail-if", ".a.b == 1"]);
    h.run(&args).expect_code(3);
    let r = &records(&h)["str-2"];
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error_class"], "invalid", "{r}");
    assert!(r["error"].as_str().unwrap().contains("cannot index"), "{r}");
    assert_eq!(api.calls("str-2"), 1, "a program's error is permanent");
    assert_eq!(records(&h)["ok-1"]["status"], "ok");

    // Fixing the expression is a change of what the job means: refused without the flag.
    let fixed = ".a | type == \"object\" and .b == 1";
    let rerun = |extra: &[&str]| {
        let mut args = vec![
            "rerun",
            "--state",
            p(&state),
            "--failed",
            "--fail-if",
            fixed,
        ];
        args.extend(extra);
        h.run(&args)
    };
    rerun(&[]).expect_code(1).expect_stderr("--fail-if");
    assert_eq!(api.calls("str-2"), 1);
    rerun(&["--allow-spec-change"]).expect_code(0);
    let records = records(&h);
    assert!(records.values().all(|r| r["status"] == "ok"), "{records:?}");
    assert_eq!(records["str-2"]["body"]["a"], "text");
    assert_eq!(api.calls("ok-1"), 1, "only the failed ID is called again");
    // The change is in the job's history.
    let status = h.run(&["status", "--state", p(&state)]);
    status.expect_code(0);
    assert!(status.stdout.contains("--fail-if"), "{}", status.stdout);
}

#[test]
fn a_malformed_expression_is_a_usage_error_and_creates_nothing() {
    let h = Harness::new(ApiConfig::default());
    let input = h.ids_file("ids.txt", &["ok-1".to_string()]);
    let state = h.state();
    let url = h.url();
    for (flag, program) in [
        ("--fail-if", ".error !="),
        ("--retry-if", "{a: .x"),
        ("--extract", "nosuch(1)"),
    ] {
        let mut args = new_job_args(&state, &input, &url);
        args.extend([flag, program]);
        let out = h.run(&args);
        out.expect_code(2).expect_stderr(flag).expect_stderr("jq");
        assert!(!state.exists(), "{flag}: the state directory was created");
    }
    assert_eq!(h.api.total_calls(), 0);
}

#[test]
fn extract_keeps_only_what_it_selects_and_keep_body_the_rest() {
    let h = Harness::new(ApiConfig::default());
    let api = AnswerApi::start(&h);
    let ids: Vec<String> = (0..5).map(|i| format!("ok-{i}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let mut args = new_job_args(&state, &input, &api.url);
    args.extend(["--extract", "{v: .value, s: $status}"]);
    h.run(&args).expect_code(0);
    for (id, r) in records(&h) {
        assert_eq!(
            r["body"],
            serde_json::json!({"v": number(&id), "s": 200}),
            "{r}"
        );
    }

    let h2 = Harness::new(ApiConfig::default());
    let input = h2.ids_file("ids.txt", &ids);
    let state = h2.state();
    let mut args = new_job_args(&state, &input, &api.url);
    args.extend(["--extract", ".value", "--keep-body"]);
    h2.run(&args).expect_code(0);
    for (id, r) in records(&h2) {
        assert_eq!(r["body"]["extract"], number(&id), "{r}");
        assert_eq!(r["body"]["raw"]["name"], format!("item {id}"), "{r}");
    }
}
