//! What a paginated job shows and survives, seen from outside: the pages it answered on the
//! metrics endpoint, the progress line and the run's summary; a token that expires between
//! two pages of one ID, renewed, the ID going on from the page it was on; and a `Link` header
//! whose next page is one the ID fetched already (an earlier next page, or its first page),
//! failing that ID alone.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use highwater::demo::api::{ApiConfig, CLIENT_ID, CLIENT_SECRET};
use serde_json::Value;

use crate::harness::*;

/// Items a page in these tests (the fake API's default too).
const SIZE: u64 = 50;

/// The flags of a job paging by the fake API's `Link` headers.
const LINK: [&str; 4] = ["--paginate", "link", "--items", ".[]"];

/// The fake API's `Link` route, [`SIZE`] items a page.
fn link_url(h: &Harness) -> String {
    format!("{}?per_page={SIZE}", h.api.pages_link_url_template())
}

/// An API slow enough (2 to 4 ms a call) for a test to act while an ID is mid-way.
fn api() -> Harness {
    Harness::new(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(4),
        ..ApiConfig::fast()
    })
}

/// The pages (from 0) of `id` the API answered, in the order they were asked for, read
/// from the `Link` route's `page=N` (from 1; none is the first page).
fn pages_asked(h: &Harness, id: &str) -> Vec<u64> {
    h.api
        .seen(id)
        .iter()
        .map(|r| {
            let query = r.target.split_once('?').map_or("", |(_, q)| q);
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix("page="))
                .map_or(0, |n| n.parse::<u64>().expect("a page number") - 1)
        })
        .collect()
}

/// `id`'s record is ok and its body every item of its list, once each, in order.
#[track_caller]
fn check_complete(h: &Harness, export: &[Value], id: &str) {
    let record = export
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("{id} is exported"));
    assert_eq!(record["status"], "ok", "{record}");
    let body = record["body"]
        .as_array()
        .expect("a paged result is an array");
    let want = h.api.page_items(id);
    assert_eq!(body.len(), want.len(), "{id}: its items");
    assert!(body == &want, "{id}: its items, once each, in order");
}

/// The lines a child writes to its stderr, read as they come (so it never blocks on them).
fn stderr_lines(child: &mut Child) -> Receiver<String> {
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The next line of `lines` for which `pick` gives something (60 s at most); every line
/// read on the way is kept in `seen`.
fn next_line<T>(
    lines: &Receiver<String>,
    seen: &mut Vec<String>,
    what: &str,
    pick: impl Fn(&str) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no line {what}; read:\n{}", seen.join("\n")));
        seen.push(line);
        if let Some(found) = pick(seen.last().unwrap()) {
            return found;
        }
    }
}

/// The pages a progress line or a run's summary counts (`, N pages`); none when it says
/// nothing of pages.
fn pages_said(line: &str) -> Option<u64> {
    let before = line
        .split(" pages")
        .next()
        .filter(|b| b.len() < line.len())?;
    before.rsplit(", ").next()?.parse().ok()
}

/// `highwater_pages_total` and the items this run finished ok, scraped from `addr`.
fn scrape(addr: &str) -> (u64, u64) {
    let (status, body) = http_get(addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    let samples = parse_metrics(&body);
    let pages = sample(&samples, "highwater_pages_total");
    let ok = sample(&samples, r#"highwater_run_items_total{status="ok"}"#);
    (pages as u64, ok as u64)
}

#[test]
fn a_paginated_run_counts_its_pages_on_the_metrics_endpoint_the_progress_line_and_its_summary() {
    let h = api();
    // 4 IDs of 50 pages, and a quota of 30 calls in 10 minutes: the run answers 30 pages, none of
    // its IDs finished, and waits, its figures still, until it is stopped.
    const CALLS: u64 = 30;
    let ids: Vec<String> = (0..4).map(|i| format!("p2500-{i}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let url = link_url(&h);
    let state = h.state();
    let quota = format!("{CALLS}/10min,rolling");
    let mut args = new_job_args(&state, &input, &url);
    args.extend(LINK);
    args.extend([
        "--concurrency",
        "2",
        "--quota",
        &quota,
        "--metrics-addr",
        "127.0.0.1:0",
        "--progress-interval",
        "50ms",
    ]);
    let mut child = h.spawn(&args);
    let lines = stderr_lines(&mut child);
    let mut seen = Vec::new();
    let addr = next_line(&lines, &mut seen, "saying where the metrics are", |l| {
        let rest = l.split("metrics on http://").nth(1)?;
        Some(rest.split('/').next()?.to_string())
    });

    // While the run goes: the counter grows, a page at a time, never past the calls made.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = 0;
    let (pages, ok) = loop {
        let (pages, ok) = scrape(&addr);
        assert!(pages >= last, "a counter: {pages} after {last}");
        assert!(
            pages <= h.api.total_calls(),
            "{pages} pages, more than the calls"
        );
        last = pages;
        if pages == CALLS {
            break (pages, ok);
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended at {pages} pages"
        );
        assert!(Instant::now() < deadline, "{pages} pages, never {CALLS}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ok, 0, "IDs of 50 pages: none finished in {pages} pages");
    assert_eq!(h.api.total_calls(), CALLS, "a page is a call");

    // The progress line says the same.
    next_line(&lines, &mut seen, "of progress with 30 pages", |l| {
        (l.contains("progress: ") && pages_said(l) == Some(CALLS)).then_some(())
    });
    // And the run's summary, once it is stopped.
    signal(&child, libc::SIGTERM);
    let status = child.wait().unwrap();
    seen.extend(lines.iter());
    let summary = seen
        .iter()
        .find(|l| l.starts_with("this run:"))
        .unwrap_or_else(|| panic!("no summary ({status}):\n{}", seen.join("\n")));
    assert_eq!(pages_said(summary), Some(CALLS), "{summary}");
    let progress: Vec<u64> = seen
        .iter()
        .filter(|l| l.contains("progress: "))
        .filter_map(|l| pages_said(l))
        .collect();
    assert!(
        progress.windows(2).all(|w| w[0] <= w[1]),
        "the progress lines' pages never go down: {progress:?}"
    );
}

/// The flags of an OAuth2 credential `TOKEN` from the fake API's token endpoint, sent as a
/// bearer token.
fn oauth2(h: &Harness) -> Vec<String> {
    [
        "--header",
        "Authorization: Bearer ${TOKEN}",
        "--credential-oauth2",
        &format!("TOKEN={}", h.api.token_url()),
        "--oauth2-client-id",
        CLIENT_ID,
        "--oauth2-client-secret",
        "${CLIENT_SECRET}",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn a_token_that_expires_between_two_pages_of_an_id_is_renewed_and_the_id_goes_on_from_that_page() {
    let h = api();
    // Tokens that would live an hour: only the test ends them, mid-ID.
    h.api.require_token(Duration::from_secs(3600));
    h.api.keep_requests();
    // One ID of 100 pages, one page at a time.
    let id = "p5000-long";
    let input = h.ids_file("ids.txt", &[id.to_string()]);
    let url = link_url(&h);
    let state = h.state();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(LINK);
    args.extend(["--concurrency", "1"]);
    let credential = oauth2(&h);
    args.extend(credential.iter().map(String::as_str));
    let mut child = h
        .cmd(&args)
        .env("CLIENT_SECRET", CLIENT_SECRET)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the binary starts");
    assert!(h.wait_for_calls(&mut child, 10), "the run ended early");
    h.api.expire_tokens();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the job finishes");

    assert!(
        h.api.refused_401() >= 1,
        "the token expired between two pages of the ID"
    );
    assert_eq!(h.api.tokens_issued(), 2, "the token was renewed once");
    // Every page answered once, in order: the renewed token went on from the page the ID
    // was on, never from its first.
    let asked = pages_asked(&h, id);
    assert_eq!(asked, (0..100).collect::<Vec<u64>>(), "pages asked for");
    check_complete(&h, &h.export(&state), id);
}

#[test]
fn a_link_header_whose_next_page_was_fetched_already_fails_its_id_alone_naming_the_loop() {
    let h = api();
    h.api.keep_requests();
    // The looping ID's page 5 links to page 2 as its next; the other's page 3 to page 1.
    let ids: Vec<String> = ["p1000-a", "p1000-loop-b", "p300-c", "p1000-back-d"]
        .map(String::from)
        .to_vec();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    h.run_new(&state, &input, &link_url(&h), &LINK)
        .expect_code(3);
    let export = h.export(&state);
    let record = export
        .iter()
        .find(|r| r["id"] == "p1000-loop-b")
        .expect("the looping ID is exported");
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["error_class"], "pagination", "{record}");
    let error = record["error"].as_str().unwrap();
    for says in [
        "page 5's next page",
        "page=2",
        "already followed after page 1",
        "the pages loop",
    ] {
        assert!(error.contains(says), "{error:?} should say {says:?}");
    }
    // Caught the first time it comes round: pages 1 to 5, and no page after.
    assert_eq!(pages_asked(&h, "p1000-loop-b"), vec![0, 1, 2, 3, 4]);

    // A link back to page 1, which the first request got without naming it: a URL not
    // followed yet, so page 1 is asked for once more, and its next link is the loop.
    let record = export
        .iter()
        .find(|r| r["id"] == "p1000-back-d")
        .expect("the ID looping back is exported");
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["error_class"], "pagination", "{record}");
    let error = record["error"].as_str().unwrap();
    for says in [
        "page 4's next page",
        "page=2",
        "after page 1",
        "the pages loop",
    ] {
        assert!(error.contains(says), "{error:?} should say {says:?}");
    }
    assert_eq!(pages_asked(&h, "p1000-back-d"), vec![0, 1, 2, 0]);
    check_complete(&h, &export, "p1000-a");
    check_complete(&h, &export, "p300-c");
}
