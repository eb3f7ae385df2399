//! The dashboard: `serve` follows a job while it runs and after it ends, across a kill and
//! a resume, and `report` writes the same page as one file; neither ever shows a secret. A
//! paginated job's pages show on both, and only a paginated job's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use highwater::demo::api::ApiConfig;
use serde_json::Value;

use crate::harness::*;

/// The token the job's header names; its value must never reach a page.
const TOKEN: &str = "sekrit-token-value-6c1f";

/// A dashboard server started on a free loopback port (or one a run serves).
struct Dashboard {
    child: Option<Child>,
    addr: String,
}

impl Dashboard {
    fn start(h: &Harness, state: &Path) -> Dashboard {
        Dashboard::start_with(h, &["--state", p(state)])
    }

    /// `serve` with `args` (the job) on a free loopback port.
    fn start_with(h: &Harness, args: &[&str]) -> Dashboard {
        let mut serve = vec!["serve", "--addr", "127.0.0.1:0"];
        serve.extend_from_slice(args);
        let mut child = h
            .cmd(&serve)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve starts");
        // It says where it listens (after what it logs while opening the job).
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        let addr = loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                panic!("serve did not say where it listens: {seen}");
            }
            seen.push_str(&line);
            if let Some(rest) = line.split("http://").nth(1) {
                break rest.split('/').next().unwrap().to_string();
            }
        };
        // The rest of its log is read away, so that it never waits on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Dashboard {
            child: Some(child),
            addr,
        }
    }

    /// The dashboard a run of the job in `state` serves (`--dashboard`), where its
    /// snapshot says it is (60 s at most to say it).
    fn of_run(state: &Path) -> Dashboard {
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            let live = std::fs::read_to_string(state.join("live.json")).unwrap_or_default();
            let served = serde_json::from_str::<Value>(&live)
                .ok()
                .and_then(|v| v["dashboard"].as_str().map(str::to_string));
            if let Some(addr) = served {
                break addr;
            }
            assert!(
                Instant::now() < deadline,
                "the run never said where its dashboard is"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Dashboard { child: None, addr }
    }

    /// GET `path`: the status code and the body.
    fn get(&self, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
        let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(!body.contains(TOKEN), "{path} shows the secret: {body}");
        (code, body.to_string())
    }

    fn json(&self, path: &str) -> Value {
        let (code, body) = self.get(path);
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// Poll `path` until `ok` holds of its answer (60 s at most).
    fn wait_for(&self, path: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.json(path);
            if ok(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: never; last {path}: {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn samples(v: &Value) -> u64 {
    v["samples"].as_u64().unwrap()
}

#[test]
fn the_dashboard_follows_a_job_across_a_kill_and_a_resume_and_never_shows_its_secret() {
    // 404s (class http) and connections dropped on every attempt (class connection).
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(1),
        latency_max: Duration::from_millis(3),
        not_found_per_mille: 30,
        drop_per_mille: 20,
        transient_attempts: 100,
        ..ApiConfig::fast()
    });
    let input = h.ids_file("ids.txt", &ids(3000));
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    let job_flags = [
        "--history-interval",
        "1s",
        "--bucket-size",
        "50",
        "--max-attempts",
        "2",
        "--rate",
        "250",
        "--header",
        "Authorization: Bearer ${HW_DASH_TOKEN}",
    ];
    args.extend(job_flags);
    let mut job = h.cmd(&args);
    job.env("HW_DASH_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut job = job.spawn().unwrap();
    // serve shows a job once there is one.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !state.join("highwater.json").exists() {
        assert!(Instant::now() < deadline, "the job never created its state");
        std::thread::sleep(Duration::from_millis(10));
    }
    let dash = Dashboard::start(&h, &state);

    // While it runs: the history grows, the figures come from the run's snapshot, and the
    // parts only the store holds say so.
    let first = dash.wait_for("/api/history", "two samples", |v| samples(v) >= 2);
    dash.wait_for("/api/history", "more samples", |v| {
        samples(v) > samples(&first)
    });
    let live = dash.wait_for("/api/summary", "the live runner", |v| v["runner"] == "live");
    assert_eq!(live["store_read"], false);
    assert!(live["note"].as_str().unwrap().contains("a run holds"));
    assert_eq!(live["spec"]["bucket_size"], 50);
    let map = dash.json("/api/buckets");
    assert_eq!(map["available"], false);
    assert_eq!(dash.json("/api/failures")["available"], false);
    assert_eq!(dash.json("/api/workers")["workers"][0]["state"], "alive");

    // kill -9, then resume to the end.
    signal(&job, libc::SIGKILL);
    let _ = job.wait();
    let resumed = h.run_env(
        &["run", "--state", p(&state), "--history-interval", "1s"],
        &[("HW_DASH_TOKEN", TOKEN)],
        &[],
    );
    assert!(resumed.code == 0 || resumed.code == 3, "{resumed:?}");

    // After: the whole job across both runs, the restart marked.
    let summary = dash.wait_for("/api/summary", "the finished job", |v| {
        v["finished"] == true
    });
    assert_eq!(summary["store_read"], true);
    assert_eq!(summary["runs"].as_array().unwrap().len(), 2);
    let history = dash.json("/api/history?points=5");
    assert_eq!(history["runs"].as_array().unwrap().len(), 2);
    assert!(history["t"].as_array().unwrap().len() <= 5);
    assert!(samples(&history) >= 3);
    let done = history["done"].as_array().unwrap();
    assert_eq!(done.last().unwrap().as_f64(), Some(3000.0));
    let stats = &summary["stats"];
    assert_eq!(
        stats["ok"].as_u64().unwrap() + stats["failed"].as_u64().unwrap(),
        3000
    );

    // The bucket map adds up to the job's buckets, whatever the cells.
    let buckets = stats["buckets_planned"].as_u64().unwrap();
    assert_eq!(buckets, 60);
    for cells in [1, 7, 60, 1000] {
        let map = dash.json(&format!("/api/buckets?cells={cells}"));
        let sum = |k: &str| -> u64 {
            map["cells"][k]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
                .sum()
        };
        let all = sum("committed") + sum("with_failures") + sum("open") + sum("pending");
        assert_eq!(all, buckets, "cells={cells}: {map}");
        assert_eq!(sum("open") + sum("pending"), 0);
        assert!(map["cells"]["first"].as_array().unwrap().len() as u64 <= cells);
    }

    // Failures: filtered by class and by bucket, as the store holds them.
    let failed = stats["failed"].as_u64().unwrap();
    let all = dash.json("/api/failures?limit=5000");
    assert_eq!(all["matched"].as_u64(), Some(failed));
    let by_class = all["by_class"].as_object().unwrap();
    assert!(
        by_class.contains_key("http") && by_class.contains_key("connection"),
        "{by_class:?}"
    );
    for (class, n) in by_class {
        let only = dash.json(&format!("/api/failures?class={class}&limit=5000"));
        assert_eq!(only["matched"], *n);
        assert!(only["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["class"] == *class));
    }
    let bucket = all["rows"][0]["bucket"].as_u64().unwrap();
    let one = dash.json(&format!("/api/failures?bucket={bucket}"));
    let rows = one["rows"].as_array().unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|r| r["bucket"] == bucket));
    let range = dash.json("/api/failures?bucket=10-19&limit=5000");
    let expected = all["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| (10..=19).contains(&r["bucket"].as_u64().unwrap()))
        .count();
    assert_eq!(range["matched"].as_u64(), Some(expected as u64));

    // The page itself, and read-only, bad requests refused with a reason.
    let (code, page) = dash.get("/");
    assert_eq!(code, 200);
    assert!(page.contains("uPlot") && page.contains("api/summary"));
    assert_eq!(dash.get("/api/failures?class=nope").0, 400);
    assert_eq!(dash.get("/api/history?points=x").0, 400);
    assert_eq!(dash.get("/nothing").0, 404);
    let mut stream = TcpStream::connect(&dash.addr).unwrap();
    write!(stream, "POST /api/summary HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.0 405"), "{text}");

    // The report: the same page with the data in it, and no secret either.
    let out = h.path("run.html");
    h.run(&["report", "--state", p(&state), "--output", p(&out)])
        .expect_code(0);
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(!html.contains(TOKEN));
    assert!(html.contains("\"finished\":true") && html.contains("uPlot"));
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    // The spec shows the header as its reference; the history keeps no value either.
    assert!(html.contains("${HW_DASH_TOKEN}"));
    let history = std::fs::read_to_string(state.join("history.log")).unwrap();
    assert!(history.contains("${HW_DASH_TOKEN}") && !history.contains(TOKEN));
}

#[test]
fn serve_and_report_refuse_what_they_cannot_show_with_a_reason() {
    let h = Harness::new(ApiConfig::fast());
    let (_, state) = h.finished_job(&ids(10), &[]);
    // The address is taken: said with the flag, exit 1.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    h.run(&["serve", "--state", p(&state), "--addr", &addr])
        .expect_refused(1, &["--addr", &addr, "cannot listen"]);
    h.run(&["serve", "--state", p(&state), "--addr", "nowhere"])
        .expect_refused(2, &["--addr"]);
    let missing = h.path("missing");
    h.run(&["serve", "--state", p(&missing)])
        .expect_refused(1, &["not a highwater state directory"]);
    h.run(&[
        "report",
        "--state",
        p(&missing),
        "--output",
        p(&h.path("r.html")),
    ])
    .expect_refused(1, &["not a highwater state directory"]);
    h.run(&[
        "report",
        "--state",
        p(&state),
        "--output",
        p(&h.path("no/such/dir/r.html")),
    ])
    .expect_refused(1, &["--output", "cannot write the report"]);
}

/// The headless browser the rendering test drives: `HIGHWATER_CHROMIUM`, else `chromium`
/// (`.ci/test` installs it when missing).
fn chromium() -> String {
    std::env::var("HIGHWATER_CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

/// Headless Chromium's flags that leave it no network: every name fails to resolve and every
/// request goes to a proxy that is not there.
const OFFLINE: [&str; 2] = [
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=127.0.0.1:9",
];

/// The DOM of `url` after its scripts ran (a virtual five seconds), from headless Chromium
/// (given `extra` flags).
fn rendered_dom(url: &str, extra: &[&str]) -> String {
    chromium_run(url, extra, "--dump-dom")
}

/// A screenshot of `url` after its scripts ran, as PNG bytes.
fn screenshot(url: &str, extra: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("page.png");
    chromium_run(url, extra, &format!("--screenshot={}", png.display()));
    std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot of {url}: {e}"))
}

/// Run headless Chromium on `url` with `extra` flags and `what` (`--dump-dom`, a
/// `--screenshot`): its standard output.
fn chromium_run(url: &str, extra: &[&str], what: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(chromium())
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--virtual-time-budget=5000",
            "--window-size=1280,1800",
        ])
        .args(extra)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(what)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{} cannot be started ({e}): install Chromium (.ci/test does) or set HIGHWATER_CHROMIUM",
                chromium()
            )
        });
    let mut dom = String::new();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let _ = out.read_to_string(&mut dom);
        dom
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not render {url} within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.join().unwrap()
}

/// `n` as the page writes it (en-US thousands separators).
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The rendered page shows the job's figures, its four charts and the bucket map.
fn check_rendered(dom: &str, ok: u64, failed: u64, what: &str) {
    assert!(!dom.contains(TOKEN));
    // What the page shows: everything before its scripts (its data and code).
    let shown = &dom[..dom.find("<script").unwrap_or(dom.len())];
    let charts = shown.matches("class=\"uplot").count();
    assert_eq!(charts, 4, "{what}: uPlot charts drawn: {charts}\n{shown}");
    assert!(
        shown.matches("<canvas").count() >= 5,
        "{what}: canvases\n{shown}"
    );
    for (n, label) in [(ok, "ok"), (failed, "failed")] {
        let fig = format!("<b>{}</b><span>{label}</span>", thousands(n));
        assert!(shown.contains(&fig), "{what}: lacks {fig}\n{shown}");
    }
    assert!(shown.contains("committed of"), "{what}\n{shown}");
    assert!(
        shown.contains("aria-label=\"bucket map of "),
        "{what}: the bucket map not drawn\n{shown}"
    );
    assert!(!shown.contains("cannot reach"), "{what}\n{shown}");
}

#[test]
fn the_page_served_and_the_report_opened_offline_render_their_charts_in_a_browser() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 50,
        ..ApiConfig::fast()
    });
    let input = h.ids_file("ids.txt", &ids(1500));
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend([
        "--history-interval",
        "1s",
        "--header",
        "Authorization: Bearer ${HW_DASH_TOKEN}",
    ]);
    let run = h.run_env(&args, &[("HW_DASH_TOKEN", TOKEN)], &[]);
    assert!(run.code == 0 || run.code == 3, "{run:?}");
    let stats = h.status(&state)["stats"].clone();
    let (ok, failed) = (
        stats["ok"].as_u64().unwrap(),
        stats["failed"].as_u64().unwrap(),
    );
    assert!(failed > 0);

    let dash = Dashboard::start(&h, &state);
    let page = format!("http://{}/", dash.addr);
    let dom = rendered_dom(&page, &[]);
    // What a user sees: a screenshot of the page, a PNG of some size (the charts drawn).
    let png = screenshot(&page, &[]);
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    assert!(
        png.len() > 20_000,
        "a page with charts, not a blank one: {} bytes",
        png.len()
    );
    check_rendered(&dom, ok, failed, "the served page");
    assert!(
        !shown(&dom).contains("pages answered"),
        "a job that does not paginate shows no pages"
    );
    // The failures table is filled from the store.
    assert!(dom.contains(&format!("{failed} failed item(s) match")));

    let out = h.path("run.html");
    h.run(&["report", "--state", p(&state), "--output", p(&out)])
        .expect_code(0);
    drop(dash);
    // Opened from the file, with no server and no network: everything it needs is in it.
    let dom = rendered_dom(&format!("file://{}", out.display()), &OFFLINE);
    check_rendered(&dom, ok, failed, "the report");
    assert!(dom.contains("report made"));
    assert!(!shown(&dom).contains("pages answered"));
}

/// What a rendered page shows: everything before its scripts (its data and code).
fn shown(dom: &str) -> &str {
    &dom[..dom.find("<script").unwrap_or(dom.len())]
}

/// The rendered page shows its figure `label` as `value`.
#[track_caller]
fn check_figure(dom: &str, label: &str, value: u64, what: &str) {
    let shown = shown(dom);
    let fig = format!("<b>{}</b><span>{label}</span>", thousands(value));
    assert!(shown.contains(&fig), "{what}: lacks {fig}\n{shown}");
}

#[test]
fn a_paginated_jobs_pages_show_on_its_live_page_and_in_its_report() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(1),
        latency_max: Duration::from_millis(2),
        ..ApiConfig::fast()
    });
    // 4 IDs of 50 pages, and a quota of 30 calls in 10 minutes: the run answers 30 pages,
    // none of its IDs finished, and waits, its figures still.
    let ids: Vec<String> = (0..4).map(|i| format!("p2500-{i}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = format!("{}?per_page=50", h.api.pages_link_url_template());
    let paging = ["--paginate", "link", "--items", ".[]", "--concurrency", "2"];
    let mut args = new_job_args(&state, &input, &url);
    args.extend(paging);
    args.extend([
        "--quota",
        "30/10min,rolling",
        "--dashboard",
        "127.0.0.1:0",
        "--history-interval",
        "1s",
    ]);
    let run = h
        .cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let own = Dashboard::of_run(&state);
    let summary = own.wait_for("/api/summary", "30 pages answered", |v| {
        v["pages"]["answered"] == 30
    });
    assert_eq!(summary["pages"]["this_run"], 30, "{summary}");
    assert_eq!(
        summary["stats"]["ok"], 0,
        "IDs of 50 pages: none done: {summary}"
    );
    let dom = rendered_dom(&format!("http://{}/", own.addr), &[]);
    check_figure(&dom, "pages answered", 30, "the live page");
    check_figure(&dom, "pages answered (this run)", 30, "the live page");
    assert!(
        shown(&dom).contains("<span>pages/s (last 10 min)</span>"),
        "{dom}"
    );
    signal(&run, libc::SIGTERM);
    assert_eq!(finish(run).code, 130);

    // Resumed with room for every page: the job's pages are both runs', each page once.
    let mut resume = paging.to_vec();
    resume.extend(["--quota", "1000/10min,rolling"]);
    h.resume(&state, &resume).expect_code(0);
    assert_eq!(
        h.api.total_calls(),
        200,
        "every page once across the two runs"
    );
    let served = Dashboard::start(&h, &state);
    let summary = served.json("/api/summary");
    assert_eq!(summary["pages"]["answered"], 200, "{summary}");
    assert!(
        summary["pages"]["this_run"].is_null(),
        "no run goes on: {summary}"
    );
    drop(served);
    let out = h.path("pages.html");
    h.run(&["report", "--state", p(&state), "--output", p(&out)])
        .expect_code(0);
    let dom = rendered_dom(&format!("file://{}", out.display()), &OFFLINE);
    check_rendered(&dom, 4, 0, "the report");
    check_figure(&dom, "pages answered", 200, "the report");
    assert!(
        !shown(&dom).contains("pages answered (this run)"),
        "the report: no run goes on"
    );
}

#[cfg(feature = "postgres")]
#[test]
fn a_fleets_dashboard_lists_its_workers_and_charts_them_together() {
    use crate::pg_cluster;
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(1),
        latency_max: Duration::from_millis(3),
        not_found_per_mille: 30,
        ..ApiConfig::fast()
    });
    let db = pg_cluster::fresh_db();
    let url = db.url.clone();
    let input = h.ids_file("ids.txt", &ids(2000));
    let api = h.url();
    let worker = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--state",
            &url,
            "--job",
            "dash",
            "--progress-interval",
            "0",
            "--history-interval",
            "1s",
        ];
        args.extend_from_slice(extra);
        h.spawn(&args)
    };
    let first = worker(&[
        "--input",
        p(&input),
        "--url",
        &api,
        "--bucket-size",
        "20",
        "--rate",
        "200",
    ]);
    // Wait until the job exists (the first worker created it), then a second worker joins.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !h
        .run(&["status", "--state", &url, "--job", "dash"])
        .stdout
        .contains("workers:")
    {
        assert!(Instant::now() < deadline, "the job was never created");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dash = Dashboard::start_with(&h, &["--state", &url, "--job", "dash"]);
    let second = worker(&[]);
    let workers = dash.wait_for("/api/workers", "two workers", |v| {
        v["workers"]
            .as_array()
            .is_some_and(|w| w.iter().filter(|w| w["state"] == "alive").count() == 2)
    });
    assert_eq!(workers["fleet"], true);
    for w in workers["workers"].as_array().unwrap() {
        assert!(w["host"].as_str().is_some_and(|h| !h.is_empty()), "{w}");
    }
    // Both workers write the job's history.
    dash.wait_for("/api/history", "both workers' samples", |v| {
        v["runs"].as_array().is_some_and(|r| r.len() == 2) && samples(v) >= 4
    });
    finish(first);
    finish(second);
    let summary = dash.wait_for("/api/summary", "the finished job", |v| {
        v["finished"] == true
    });
    assert_eq!(summary["store_read"], true);
    let stats = &summary["stats"];
    assert_eq!(
        stats["ok"].as_u64().unwrap() + stats["failed"].as_u64().unwrap(),
        2000
    );
    let history = dash.json("/api/history");
    assert!(history["workers"].is_null());
    let last_done = history["done"].as_array().unwrap().last().unwrap().as_f64();
    assert!(last_done.is_some_and(|d| d > 0.0));
    let map = dash.json("/api/buckets?cells=9");
    let sum = |k: &str| -> u64 {
        map["cells"][k]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum()
    };
    assert_eq!(sum("committed") + sum("with_failures"), 100, "{map}");
    let failures = dash.json("/api/failures?class=http&limit=5000");
    assert_eq!(failures["matched"], stats["failed"]);
}

/// The limits a job learnt from the API's refusals are on its page: the report of a
/// finished job run against a window nobody announced lists what the job keeps, with the
/// refusals it was learnt from, as it renders in a browser.
#[test]
fn the_page_lists_the_limits_the_job_learnt() {
    let h = Harness::new(ApiConfig {
        windows: vec![highwater::demo::api::ApiWindow {
            limit: 30,
            length: std::time::Duration::from_secs(1),
        }],
        ..ApiConfig::fast()
    });
    let input = h.ids_file("ids.txt", &ids(200));
    let state = h.state();
    let url = h.url();
    h.run(&new_job_args(&state, &input, &url)).expect_code(0);
    let kept = h.status(&state)["learned_limits"].clone();
    assert!(
        kept.as_array().is_some_and(|k| !k.is_empty()),
        "nothing learnt: {kept}"
    );
    let out = h.path("run.html");
    h.run(&["report", "--state", p(&state), "--output", p(&out)])
        .expect_code(0);
    let dom = rendered_dom(&format!("file://{}", out.display()), &OFFLINE);
    assert!(dom.contains("<h3>Limits</h3>"), "{dom}");
    assert!(
        dom.contains("<li>kept with the job: API limit ") && dom.contains(" refusals</li>"),
        "{dom}"
    );
}

/// The sum of a bucket map's cells of kind `k`.
fn cells(map: &Value, k: &str) -> u64 {
    map["cells"][k]
        .as_array()
        .unwrap_or_else(|| panic!("no {k} cells: {map}"))
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum()
}

/// A run that serves its own dashboard shows every panel while it works, the bucket map and
/// the failures included (the store it holds is read beside it), in the browser too; `serve`
/// of the state directory the run holds reaches the same through the run, and answers by
/// itself again once the run has stopped. No page ever shows the job's secret.
#[test]
fn a_run_serves_its_own_dashboard_with_every_panel_live() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 50,
        ..ApiConfig::fast()
    });
    // Far more IDs than the run can do at its rate while the test looks: it is stopped.
    let input = h.ids_file("ids.txt", &ids(100_000));
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend([
        "--dashboard",
        "127.0.0.1:0",
        "--rate",
        "300",
        "--bucket-size",
        "50",
        "--history-interval",
        "1s",
        "--header",
        "Authorization: Bearer ${HW_DASH_TOKEN}",
    ]);
    let mut run = h.cmd(&args);
    run.env("HW_DASH_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let run = run.spawn().unwrap();
    let own = Dashboard::of_run(&state);

    // Every panel, from the store the run holds, while it runs.
    let summary = own.wait_for("/api/summary", "the live runner", |v| v["runner"] == "live");
    assert_eq!(summary["store_read"], true, "{summary}");
    assert!(summary["note"].is_null(), "{summary}");
    let map = own.wait_for("/api/buckets", "committed and pending buckets", |v| {
        v["available"] == true && cells(v, "with_failures") > 0 && cells(v, "pending") > 0
    });
    let buckets = cells(&map, "committed")
        + cells(&map, "with_failures")
        + cells(&map, "open")
        + cells(&map, "pending");
    assert_eq!(buckets, 2000, "{map}");
    let failures = own.wait_for("/api/failures?class=http", "failures listed", |v| {
        v["matched"].as_u64().is_some_and(|n| n > 0)
    });
    let rows = failures["rows"].as_array().unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|r| r["class"] == "http"));
    assert_eq!(own.get("/api/failures?class=nope").0, 400);
    // The page as a browser renders it: the bucket map and the failures table filled.
    let dom = rendered_dom(&format!("http://{}/", own.addr), &[]);
    let shown = &dom[..dom.find("<script").unwrap_or(dom.len())];
    assert!(!shown.contains(TOKEN));
    assert!(shown.contains("failed item(s) match"), "{shown}");
    assert!(!shown.contains("shown once no run holds"), "{shown}");
    assert!(shown.contains("aria-label=\"bucket map of "), "{shown}");

    // serve of the state directory the run holds: the same panels, through the run.
    let other = Dashboard::start(&h, &state);
    let map = other.wait_for("/api/buckets", "the run's bucket map", |v| {
        v["available"] == true
    });
    assert!(
        cells(&map, "committed") + cells(&map, "with_failures") > 0,
        "{map}"
    );
    let listed = other.json("/api/failures?limit=5000");
    assert!(listed["matched"].as_u64().unwrap() >= failures["matched"].as_u64().unwrap());
    assert_eq!(other.json("/api/summary")["store_read"], true);
    let dom = rendered_dom(&format!("http://{}/", other.addr), &[]);
    let shown = &dom[..dom.find("<script").unwrap_or(dom.len())];
    assert!(shown.contains("failed item(s) match"), "{shown}");
    assert!(!shown.contains("shown once no run holds"), "{shown}");
    assert!(shown.contains("aria-label=\"bucket map of "), "{shown}");

    let status = h.run(&["status", "--state", p(&state)]);
    let line = format!("dashboard:  http://{}/ (served by the run)", own.addr);
    assert!(status.stdout.contains(&line), "{status:?}");

    // The run stops; its dashboard goes with it, and serve reads the store itself.
    signal(&run, libc::SIGTERM);
    let stopped = finish(run);
    assert_eq!(stopped.code, 130, "{stopped:?}");
    assert!(
        TcpStream::connect(&own.addr).is_err(),
        "the run's dashboard outlived it"
    );
    let after = other.wait_for("/api/summary", "serve reading the store", |v| {
        v["runner"] != "live" && v["store_read"] == true
    });
    assert!(after["stats"]["ok"].as_u64().unwrap() > 0);
    assert_eq!(other.json("/api/buckets")["available"], true);
    let status = h.run(&["status", "--state", p(&state)]);
    assert!(!status.stdout.contains("dashboard:"), "{status:?}");
}
