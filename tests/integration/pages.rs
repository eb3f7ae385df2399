//! Paginated jobs (`--paginate`): every page of every ID followed in each style, its items
//! joined in order into the ID's result; a page that fails, or whose answer trips a check, is
//! retried alone; each page is a request of the rate limit and the quota; a loop, a page
//! parameter the API ignores and too many pages fail their ID alone; a run killed mid-ID, in
//! any style, resumes each ID after its stored pages, with every ID's items exactly once; an
//! ID of 80 MB runs and exports in bounded memory; flags of paging that do not fit are
//! refused.

use std::path::Path;
use std::time::Duration;

use highwater::demo::api::ApiConfig;
use serde_json::Value;

use crate::harness::*;

/// Items a full page holds in these tests (the fake API's default too).
const SIZE: u64 = 50;

/// The flags of a job paging by the fake API's cursor, in the query.
const CURSOR: [&str; 6] = [
    "--paginate",
    "cursor=.next_cursor",
    "--page-param",
    "cursor",
    "--items",
    ".data[]",
];

/// The fake API's cursor route, [`SIZE`] items a page.
fn cursor_url(h: &Harness) -> String {
    format!("{}?limit={SIZE}", h.api.pages_cursor_url_template())
}

/// IDs of every shape of list: empty, one item, one full page, a short last page, 40 pages,
/// the default count (120), and one that needs encoding in a URL.
fn shapes() -> Vec<String> {
    [
        "p0-a",
        "p1-b",
        "p50-c",
        "p120-d",
        "p2000-e",
        "plain",
        "odd/é ?#&=",
    ]
    .map(String::from)
    .to_vec()
}

/// The items the fake API holds for `id` (its count from a `p<count>-` prefix, else 120).
fn count_of(id: &str) -> u64 {
    id.strip_prefix('p')
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(120)
}

/// A style's name, its URL, its flags and the requests an ID of so many items makes.
type Case<'a> = (&'a str, &'a str, Vec<&'a str>, &'a dyn Fn(u64) -> u64);

/// Each ID's record is ok and its body every item of its list, in order.
#[track_caller]
fn check_items(h: &Harness, export: &[Value], ids: &[String]) {
    let exported: Vec<&str> = export.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let want: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(exported, want, "every ID once, in input order");
    for record in export {
        let id = record["id"].as_str().unwrap();
        assert_eq!(record["status"], "ok", "{record}");
        let body = record["body"]
            .as_array()
            .expect("a paged result is an array");
        let want = h.api.page_items(id);
        assert_eq!(body.len(), want.len(), "{id}: items");
        assert!(body == &want, "{id}: the items are the list's, in order");
    }
}

#[test]
fn every_page_of_every_id_is_followed_in_each_style_and_its_items_kept_in_order() {
    let h = Harness::new(ApiConfig::fast());
    let ids = shapes();
    let input = h.ids_file("ids.txt", &ids);
    let link = format!("{}?per_page={SIZE}", h.api.pages_link_url_template());
    let cursor = cursor_url(&h);
    let cursor_post = h.api.pages_cursor_url_template();
    let offset = format!("{}?limit={SIZE}", h.api.pages_offset_url_template());
    let size = SIZE.to_string();
    // Requests an ID makes: while a next is found; a counted style asks past a full page.
    let by_next = |c: u64| c.div_ceil(SIZE).max(1);
    let by_count = |c: u64| c / SIZE + 1;
    let cases: [Case; 6] = [
        (
            "link",
            &link,
            vec!["--paginate", "link", "--items", ".[]"],
            &by_next,
        ),
        ("cursor", &cursor, CURSOR.to_vec(), &by_next),
        (
            "cursor in the body",
            &cursor_post,
            vec![
                "--method",
                "POST",
                "--body",
                r#"{"limit": 50, "user": "{id}"}"#,
                "--paginate",
                "cursor=.next_cursor",
                "--page-param",
                "body:cursor",
                "--items",
                ".data[]",
            ],
            &by_next,
        ),
        (
            "jq",
            &cursor,
            vec![
                "--paginate",
                "jq=if .has_more then {query: {cursor: .next_cursor}} else null end",
                "--items",
                ".data[]",
            ],
            &by_next,
        ),
        (
            "page",
            &link,
            vec![
                "--paginate",
                "page",
                "--page-param",
                "page",
                "--page-size",
                &size,
                "--items",
                ".[]",
            ],
            &by_count,
        ),
        (
            "offset",
            &offset,
            vec![
                "--paginate",
                "offset",
                "--page-param",
                "offset",
                "--page-size",
                &size,
                "--items",
                ".[]",
            ],
            &by_count,
        ),
    ];
    let mut calls_before = 0;
    for (style, url, flags, requests) in cases {
        let state = h.path(&format!("state-{}", style.replace(' ', "-")));
        let run = h.run_new(&state, &input, url, &flags);
        run.expect_code(0);
        check_items(&h, &h.export(&state), &ids);
        let want: u64 = ids.iter().map(|id| requests(count_of(id))).sum();
        run.expect_stderr(&format!("attempts (0 retries), {want} pages"));
        let calls = h.api.total_calls() - calls_before;
        assert_eq!(calls, want, "{style}: one request per page, none again");
        calls_before = h.api.total_calls();
        let status = h.status(&state);
        assert_eq!(status["stats"]["ok"], ids.len(), "{style}: {status}");
    }
}

#[test]
fn a_page_that_fails_is_retried_alone_and_the_ids_earlier_pages_are_not_asked_again() {
    let h = Harness::new(ApiConfig {
        page_unavailable_once: Some(3),
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let ids: Vec<String> = (0..6).map(|i| format!("p200-{i}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let url = format!("{}?per_page={SIZE}", h.api.pages_link_url_template());
    let state = h.state();
    h.run_new(
        &state,
        &input,
        &url,
        &["--paginate", "link", "--items", ".[]"],
    )
    .expect_code(0);
    let export = h.export(&state);
    check_items(&h, &export, &ids);
    for id in &ids {
        let targets: Vec<String> = h.api.seen(id).into_iter().map(|r| r.target).collect();
        let asked = |page: u64| {
            targets
                .iter()
                .filter(|t| {
                    let first = !t.contains("?page=");
                    (page == 1 && first) || t.contains(&format!("?page={page}&"))
                })
                .count()
        };
        assert_eq!(
            (asked(1), asked(2), asked(3), asked(4)),
            (1, 1, 2, 1),
            "{id}: only the page that failed is asked again: {targets:?}"
        );
        assert_eq!(targets.len(), 5, "{id}: {targets:?}");
    }
    for record in &export {
        assert_eq!(record["attempts"], 5, "four pages and one retry: {record}");
    }
}

#[test]
fn a_page_tripping_retry_if_is_asked_again_alone_and_one_tripping_fail_if_fails_its_id() {
    // Page 3 of every ID answers `{"status": "pending"}` the first time.
    let h = Harness::new(ApiConfig {
        page_pending_once: Some(3),
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let ids: Vec<String> = ["p200-a", "p200-bad", "p200-c"].map(String::from).to_vec();
    let input = h.ids_file("ids.txt", &ids);
    let url = cursor_url(&h);
    let state = h.state();
    let checks = [
        "--expect",
        "json",
        "--retry-if",
        r#".status == "pending""#,
        // The first item of bad's page 3.
        "--fail-if",
        r#".data[0] == {"id": "p200-bad", "k": 100}"#,
    ];
    h.run_new(&state, &input, &url, &[&CURSOR[..], &checks].concat())
        .expect_code(3);
    let export = h.export(&state);
    for (record, id) in [(&export[0], "p200-a"), (&export[2], "p200-c")] {
        assert_eq!(record["status"], "ok", "{record}");
        assert!(
            record["body"].as_array() == Some(&h.api.page_items(id)),
            "{id}"
        );
        assert_eq!(
            pages_asked(&h, id),
            [0, 1, 2, 2, 3],
            "{id}: only the page answered pending is asked again"
        );
        assert_eq!(record["attempts"], 5, "four pages and one retry: {record}");
    }
    let bad = &export[1];
    assert_eq!(
        (&bad["status"], &bad["error_class"]),
        (&Value::from("failed"), &Value::from("invalid")),
        "{bad}"
    );
    let error = bad["error"].as_str().unwrap();
    assert!(error.starts_with("page 3: "), "{error}");
    assert_eq!(
        pages_asked(&h, "p200-bad"),
        [0, 1, 2, 2],
        "page 3, pending then tripping --fail-if, is its last"
    );
}

#[test]
fn each_page_is_a_request_of_the_rate_limit() {
    let h = Harness::new(ApiConfig::fast());
    // 10 IDs of 12 pages, 8 at a time: at 40 pages a second, about 3 s. Were only an ID's
    // first page paced, the other 110 would go in a fraction of a second.
    let ids: Vec<String> = (0..10).map(|i| format!("p600-{i}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let url = cursor_url(&h);
    let state = h.state();
    let rate = [
        "--rate",
        "40/s",
        "--burst",
        "1",
        "--adaptive",
        "off",
        "--concurrency",
        "8",
    ];
    h.run_new(&state, &input, &url, &[&CURSOR[..], &rate].concat())
        .expect_code(0);
    check_items(&h, &h.export(&state), &ids);
    assert_eq!(h.api.total_calls(), 120, "a request per page");
    // At most 40 t + the burst in any window of t seconds, with room for the arrivals a
    // loaded machine bunches (the API sees a request when it arrives, not when it started).
    for ms in [500u64, 1000, 2000] {
        let most = h.api.max_calls_in_window(Duration::from_millis(ms));
        let allowed = (40 * ms / 1000) as usize * 11 / 10 + 1 + 5;
        assert!(
            most <= allowed,
            "{most} pages asked for in a {ms} ms window; at most {allowed} allowed"
        );
    }
}

#[test]
fn a_loop_an_ignored_page_parameter_and_too_many_pages_fail_their_id_alone() {
    let h = Harness::new(ApiConfig::fast());
    let cursor_url = cursor_url(&h);
    let offset_url = format!("{}?limit={SIZE}", h.api.pages_offset_url_template());
    let size = SIZE.to_string();
    let failed = |state: &Path, id: &str, says: &str| {
        let export = h.export(state);
        let record = export
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("{id} is exported"));
        assert_eq!(record["status"], "failed", "{record}");
        assert_eq!(record["error_class"], "pagination", "{record}");
        let error = record["error"].as_str().unwrap();
        assert!(error.contains(says), "{id}: {error:?} should say {says:?}");
        export
    };
    let good = |export: &[Value], id: &str| {
        let record = export.iter().find(|r| r["id"] == id).unwrap();
        assert_eq!(record["status"], "ok", "{record}");
        assert_eq!(
            record["body"].as_array().unwrap().len() as u64,
            count_of(id)
        );
    };

    // A cursor that points back to an earlier page.
    let ids: Vec<String> = ["p1000-a", "p1000-loop-b", "p300-c"]
        .map(String::from)
        .to_vec();
    let input = h.ids_file("loop.txt", &ids);
    let state = h.path("state-loop");
    let cursor = CURSOR;
    h.run_new(&state, &input, &cursor_url, &cursor)
        .expect_code(3);
    let export = failed(&state, "p1000-loop-b", "the pages loop");
    good(&export, "p1000-a");
    good(&export, "p300-c");
    // The loop is caught the first time it comes round: pages 1 to 5, then page 2 again.
    assert_eq!(h.api.calls("p1000-loop-b"), 5);

    // An offset the API ignores: every page is the first.
    let ids: Vec<String> = ["p200-same-a", "p200-b"].map(String::from).to_vec();
    let input = h.ids_file("same.txt", &ids);
    let state = h.path("state-same");
    let offset = [
        "--paginate",
        "offset",
        "--page-param",
        "offset",
        "--page-size",
        &size,
        "--items",
        ".[]",
    ];
    h.run_new(&state, &input, &offset_url, &offset)
        .expect_code(3);
    let export = failed(&state, "p200-same-a", "has the same items as page 1");
    good(&export, "p200-b");

    // More pages than the job allows.
    let ids: Vec<String> = ["p1000-x", "p100-y"].map(String::from).to_vec();
    let input = h.ids_file("many.txt", &ids);
    let state = h.path("state-many");
    let mut flags = cursor.to_vec();
    flags.extend(["--max-pages", "3"]);
    h.run_new(&state, &input, &cursor_url, &flags)
        .expect_code(3);
    let export = failed(&state, "p1000-x", "--max-pages is 3");
    good(&export, "p100-y");
    assert_eq!(
        h.api.calls("p1000-x"),
        3,
        "no page past the most is asked for"
    );
}

/// The page a request to the fake API's paginated routes asked for, from 0, read from its
/// query: `cursor=kN` and `offset=N` name the page's first item, `page=N` counts from 1, and a
/// request with none of them asks for the first page.
fn page_of(target: &str) -> u64 {
    let query = target.split_once('?').map_or("", |(_, query)| query);
    for (key, value) in query.split('&').filter_map(|pair| pair.split_once('=')) {
        let number = |text: &str| -> u64 { text.parse().expect("a page's number") };
        match key {
            "cursor" => return number(value.trim_start_matches('k')) / SIZE,
            "offset" => return number(value) / SIZE,
            "page" => return number(value) - 1,
            _ => {}
        }
    }
    0
}

/// The pages the API was asked for `id`, in the order asked (every request kept).
fn pages_asked(h: &Harness, id: &str) -> Vec<u64> {
    h.api.seen(id).iter().map(|r| page_of(&r.target)).collect()
}

/// How many pages of each of `ids` (at rows 0, 1, ...) the job in `state` holds: where a resume
/// continues each ID. Read by opening the state directory as a reader, once the run is over.
fn stored_pages(h: &Harness, state: &Path, ids: &[String]) -> Vec<u64> {
    use highwater::store::sled_store::{OpenMode, DEFAULT_CACHE_BYTES};
    use highwater::store::{PageMark, SledStore, Store};
    let store = SledStore::open(state, OpenMode::Read, DEFAULT_CACHE_BYTES).unwrap();
    let keys: Vec<(u64, &str)> = (0..).zip(ids.iter().map(String::as_str)).collect();
    let marks = h.block_on(store.page_marks(0, &keys)).unwrap();
    marks
        .iter()
        .map(|mark| mark.as_ref().map_or(0, |m| u64::from(PageMark::pages(m))))
        .collect()
}

/// What a kill left: for each ID, the requests the API had seen for it and the pages the
/// store held.
struct Kill {
    asked: Vec<usize>,
    stored: Vec<u64>,
}

/// A run of the job in `state` over `ids` with `args` is killed once the API has seen each of
/// `kills` calls (counted over the whole job), resumed each time, and resumed to the end.
/// After each kill the next run asks for no page the store held (it resumes every ID at the
/// page after its last stored one), and the pages it asks for again (served before the kill)
/// are at most what the kill could leave in flight or not yet durable: a page of each of the
/// [`CONCURRENCY`] IDs under way, and the writer's unsynced results (`max_unsynced_items`
/// counts both). Every ID's items end up in its result exactly once, in order.
#[track_caller]
fn killed_and_resumed(h: &Harness, state: &Path, ids: &[String], args: &[&str], kills: &[u64]) {
    let mut args = args.to_vec();
    let mut at_kills = Vec::new();
    for &calls in kills {
        let mut child = h.spawn(&args);
        assert!(
            h.wait_for_calls(&mut child, calls),
            "the run ended before {calls} calls"
        );
        signal(&child, libc::SIGKILL);
        finish(child);
        at_kills.push(Kill {
            asked: ids.iter().map(|id| h.api.seen(id).len()).collect(),
            stored: stored_pages(h, state, ids),
        });
        args = vec!["run", "--state", p(state)];
        args.extend(QUICK);
    }
    h.resume(state, &[]).expect_code(0);
    check_items(h, &h.export(state), ids);
    let bound = highwater::engine::max_unsynced_items(CONCURRENCY) as u64;
    for (k, kill) in at_kills.iter().enumerate() {
        let mut again = 0;
        for (i, id) in ids.iter().enumerate() {
            let asked = pages_asked(h, id);
            let until = at_kills
                .get(k + 1)
                .map_or(asked.len(), |next| next.asked[i]);
            let (before, after) = asked[..until].split_at(kill.asked[i]);
            let stored = kill.stored[i];
            assert!(
                after.iter().all(|&page| page >= stored),
                "{id}: after kill {}, {stored} of its pages stored, it asked for pages \
                 {after:?} (from 0)",
                k + 1
            );
            again += after.iter().filter(|page| before.contains(page)).count() as u64;
        }
        assert!(
            again <= bound,
            "kill {}: {again} pages asked for again, at most {bound}",
            k + 1
        );
    }
}

/// The IDs the kill tests run at once.
const CONCURRENCY: usize = 8;

/// A job of 16 IDs of 150 pages, 8 at a time, at the URL `url` gives (of the fake API's)
/// with the flags `paging`, killed twice and resumed ([`killed_and_resumed`]). Each kill
/// comes when the IDs under way have more pages behind them than a kill may leave to ask
/// again, were they asked from the first.
#[track_caller]
fn killed_twice(url: fn(&Harness) -> String, paging: &[&str]) {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(1),
        latency_max: Duration::from_millis(3),
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let ids: Vec<String> = (0..16).map(|i| format!("p7500-{i:02}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let url = url(&h);
    let state = h.state();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(paging);
    let concurrency = CONCURRENCY.to_string();
    args.extend(["--concurrency", &concurrency]);
    killed_and_resumed(&h, &state, &ids, &args, &[800, 2000]);
}

#[test]
fn a_run_killed_mid_id_resumes_with_every_ids_items_exactly_once_in_order() {
    killed_twice(cursor_url, &CURSOR);
}

#[test]
fn a_run_killed_mid_id_resumes_exactly_once_in_order_by_link_offset_and_jq_too() {
    let link = |h: &Harness| format!("{}?per_page={SIZE}", h.api.pages_link_url_template());
    killed_twice(link, &["--paginate", "link", "--items", ".[]"]);
    let size = SIZE.to_string();
    let offset = |h: &Harness| format!("{}?limit={SIZE}", h.api.pages_offset_url_template());
    killed_twice(
        offset,
        &[
            "--paginate",
            "offset",
            "--page-param",
            "offset",
            "--page-size",
            &size,
            "--items",
            ".[]",
        ],
    );
    killed_twice(
        cursor_url,
        &[
            "--paginate",
            "jq=if .has_more then {query: {cursor: .next_cursor}} else null end",
            "--items",
            ".data[]",
        ],
    );
}

#[test]
fn paging_flags_that_do_not_fit_are_usage_errors() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(3));
    let url = h.api.pages_cursor_url_template();
    for (flags, says) in [
        (
            &["--paginate", "cursor=.next_cursor", "--items", ".data[]"][..],
            "needs --page-param",
        ),
        (&["--paginate", "link"][..], "--paginate needs --items"),
        (&["--items", ".[]"][..], "--items goes with --paginate"),
        (
            &["--paginate", "link", "--items", ".[]", "--extract", ".a"][..],
            "does not go with --extract",
        ),
        (
            &["--paginate", "link", "--items", ".data["][..],
            "--items \".data[\" is not a valid jq program",
        ),
    ] {
        let state = h.path(&format!("state-{}", says.len()));
        h.run_new(&state, &input, &url, flags)
            .expect_refused(2, &[says]);
        assert!(!state.exists(), "{flags:?}");
    }
    assert_eq!(h.api.total_calls(), 0);
}

#[test]
fn status_and_the_live_snapshot_count_pages_while_a_paginated_run_goes_on() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(4),
        ..ApiConfig::fast()
    });
    // Far more pages than the run does while the test looks: it is stopped.
    let ids: Vec<String> = (0..50).map(|i| format!("p5000-{i}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let url = format!("{}?per_page=10", h.api.pages_link_url_template());
    let state = h.state();
    let mut args = new_job_args(&state, &input, &url);
    args.extend([
        "--paginate",
        "link",
        "--items",
        ".[]",
        "--concurrency",
        "2",
        "--progress-interval",
        "50ms",
    ]);
    let mut child = h.spawn(&args);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let live = loop {
        let read = std::fs::read(state.join("live.json")).ok();
        let live = read.and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        if let Some(live) = live.filter(|v| v["pages"].as_u64().unwrap_or(0) >= 20) {
            break live;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(
            std::time::Instant::now() < deadline,
            "no pages in live.json"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        live["pages"].as_u64() > live["ok"].as_u64(),
        "IDs of 500 pages: many pages an ID: {live}"
    );
    let status = h.run(&["status", "--state", p(&state)]);
    status.expect_code(0);
    assert!(
        status.stdout.contains("pages:") && status.stdout.contains("answered this run"),
        "{}",
        status.stdout
    );
    signal(&child, libc::SIGTERM);
    finish(child);
}
#[test]
fn a_40_page_id_killed_at_page_30_resumes_at_the_page_it_was_on_not_at_page_1() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(3),
        latency_max: Duration::from_millis(5),
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let id = "p2000-long".to_string();
    let input = h.ids_file("ids.txt", std::slice::from_ref(&id));
    let url = cursor_url(&h);
    let state = h.state();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(CURSOR);
    args.extend(["--concurrency", "1"]);
    let mut child = h.spawn(&args);
    assert!(
        h.wait_for_calls(&mut child, 30),
        "the run ended before page 30"
    );
    signal(&child, libc::SIGKILL);
    finish(child);
    let before = h.api.calls(&id);
    let stored = stored_pages(&h, &state, std::slice::from_ref(&id))[0];
    h.resume(&state, &[]).expect_code(0);
    check_items(&h, &h.export(&state), std::slice::from_ref(&id));
    check_resumed_after_its_last_durable_page(&h, &id, before, stored);
}

/// `id`'s 40 pages, `before` of them asked for by a run killed when `stored` of them were
/// stored, were asked for again from the page after its last stored one, not from its first:
/// every stored page once, every page from there to where the kill came twice, the rest once.
#[track_caller]
fn check_resumed_after_its_last_durable_page(h: &Harness, id: &str, before: u64, stored: u64) {
    let mut asked = vec![0u32; 40];
    for page in pages_asked(h, id) {
        asked[page as usize] += 1;
    }
    let (stored, killed_after) = (stored as usize, before as usize);
    assert!(stored > 0, "by page 30, some pages were durable: {asked:?}");
    assert!(
        asked[..stored].iter().all(|&n| n == 1)
            && asked[stored..killed_after].iter().all(|&n| n == 2)
            && asked[killed_after..].iter().all(|&n| n == 1),
        "pages asked for: {asked:?}, killed after {killed_after} with {stored} stored"
    );
}

#[test]
fn a_40_page_id_killed_at_page_30_resumes_there_in_postgresql_too() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(3),
        latency_max: Duration::from_millis(5),
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let id = "p2000-long".to_string();
    let input = h.ids_file("ids.txt", std::slice::from_ref(&id));
    let url = cursor_url(&h);
    let fleet = crate::fleet::Fleet::new(&h, "pages");
    let flags = [
        &["--url", url.as_str()][..],
        &CURSOR[..],
        &[
            "--concurrency",
            "1",
            "--lease-ttl",
            "2s",
            "--progress-interval",
            "0",
        ],
    ]
    .concat();
    let mut worker = fleet.create(&input, &flags);
    assert!(
        h.wait_for_calls(&mut worker, 30),
        "the run ended before page 30"
    );
    signal(&worker, libc::SIGKILL);
    finish(worker);
    let before = h.api.calls(&id);
    let stored: u64 = fleet
        .query("SELECT count(*) FROM hw_page WHERE generation = 0")
        .parse()
        .unwrap();
    // The killed worker's lease lapses; the next worker takes the bucket over.
    let again = finish(fleet.create(&input, &flags));
    again.expect_code(0);
    check_items(&h, &fleet.export(), std::slice::from_ref(&id));
    check_resumed_after_its_last_durable_page(&h, &id, before, stored);
}

/// The items of a JSON array read one at a time, each checked to be the API's item `k` of
/// `id`, for `k` from 0 (so an ID's items are checked without holding them all): how many.
struct ItemsInOrder<'a> {
    h: &'a Harness,
    id: &'a str,
}

impl<'de> serde::de::DeserializeSeed<'de> for ItemsInOrder<'_> {
    type Value = u64;

    fn deserialize<D: serde::Deserializer<'de>>(self, items: D) -> Result<u64, D::Error> {
        items.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ItemsInOrder<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of items")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<u64, A::Error> {
        let mut k = 0;
        while let Some(item) = items.next_element::<Value>()? {
            assert!(
                item == self.h.api.page_item(self.id, k),
                "item {k} in order"
            );
            k += 1;
        }
        Ok(k)
    }
}

#[test]
fn one_id_of_80_mb_of_items_runs_and_exports_in_under_150_mb() {
    // 80,000 items of about 1 KB, in pages of a megabyte. Held whole, they would take the
    // run from its peak with a few pages (about 105 MiB: the store's cache, the runtime, a
    // page's copies while it is read) well past 150 MiB; 80 MB rather than more keeps the
    // test within a minute in a debug build, which reads a megabyte in about a quarter of a
    // second.
    const ITEMS: u64 = 80_000;
    const MOST_MIB: u64 = 150;
    let h = Harness::new(ApiConfig {
        page_item_pad: 1000,
        ..ApiConfig::fast()
    });
    let run = |id: &str| {
        let input = h.ids_file(&format!("{id}.txt"), &[id.to_string()]);
        let url = format!("{}?limit=1000", h.api.pages_cursor_url_template());
        let state = h.path(&format!("state-{id}"));
        let run = h.run_new(&state, &input, &url, &CURSOR);
        run.expect_code(0);
        assert_eq!(h.api.calls(id), count_of(id) / 1000, "pages of 1,000");
        (state, peak_mib(&run), run.stderr)
    };
    // An ID of 5 pages, for the peak a few pages make.
    let (_, few, _) = run("p5000-few");
    let id = format!("p{ITEMS}-big");
    let (state, peak, said) = run(&id);
    assert!(
        peak < MOST_MIB && peak < few + 30,
        "the run's peak grows with its ID's items: {peak} MiB, {few} MiB for 5 pages: {said}"
    );
    let export = |format: &str| {
        let output = h.path(&format!("export.{format}"));
        let export = h.run(&[
            "export",
            "--state",
            p(&state),
            "--format",
            format,
            "--output",
            p(&output),
        ]);
        export.expect_code(0);
        assert!(
            peak_mib(&export) < MOST_MIB,
            "the {format} export: {}",
            export.stderr
        );
        std::fs::read_to_string(&output).unwrap()
    };
    let line = export("jsonl");
    let head = format!(r#"{{"id":"{id}","status":"ok","http_status":200,"body":"#);
    assert!(line.starts_with(&head), "{}", &line[..200]);
    let mut items = serde_json::Deserializer::from_str(&line[head.len()..]);
    let seed = ItemsInOrder { h: &h, id: &id };
    let count = serde::de::DeserializeSeed::deserialize(seed, &mut items).unwrap();
    assert_eq!(count, ITEMS, "every item, in order");
    let end = line
        .rfind(r#"],"attempts":"#)
        .expect("the fields after the body");
    let body = &line[head.len()..=end];
    let csv = export("csv");
    let record = csv::Reader::from_reader(csv.as_bytes())
        .records()
        .next()
        .expect("a record")
        .unwrap();
    assert_eq!((&record[0], &record[1]), (id.as_str(), "ok"));
    assert!(&record[3] == body, "the CSV's body is the JSON line's");
}

#[test]
fn a_paginated_id_that_failed_is_rerun_from_its_first_page_and_exported_whole() {
    let h = Harness::new(ApiConfig {
        page_unavailable_once: Some(3),
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let ids: Vec<String> = ["p200-a", "p20-b"].map(String::from).to_vec();
    let input = h.ids_file("ids.txt", &ids);
    let url = cursor_url(&h);
    let state = h.state();
    let flags = [&CURSOR[..], &["--max-attempts", "1"]].concat();
    // a's page 3 answers 503 once, and one attempt is all a page gets: a fails there.
    h.run_new(&state, &input, &url, &flags).expect_code(3);
    let export = h.export(&state);
    assert_eq!(export[0]["status"], "failed", "{}", export[0]);
    assert!(
        export[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("page 3: HTTP 503"),
        "{}",
        export[0]
    );
    assert_eq!(export[1]["status"], "ok");
    // The rerun asks for a's pages again from the first, in pages of its own.
    h.run(&["rerun", "--state", p(&state), "--failed"])
        .expect_code(0);
    let export = h.export(&state);
    check_items(&h, &export, &ids);
    assert_eq!(export[0]["rerun"], 1, "{}", export[0]);
    let first_pages = h
        .api
        .seen("p200-a")
        .iter()
        .filter(|r| !r.target.contains("cursor="))
        .count();
    assert_eq!(first_pages, 2, "the run's first page, and the rerun's");
    assert_eq!(h.api.calls("p200-a"), 3 + 4, "three pages, then four");
}

#[test]
fn each_page_is_a_call_of_the_jobs_quota_and_a_spent_quota_leaves_ids_mid_way() {
    let h = Harness::new(ApiConfig::fast());
    let ids: Vec<String> = (0..3).map(|i| format!("p200-{i}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let url = cursor_url(&h);
    let state = h.state();
    let paging = [&CURSOR[..], &["--concurrency", "2"]].concat();
    let mut flags = paging.to_vec();
    flags.extend(["--quota", "6/job"]);
    // Three IDs of four pages: the quota of six calls is spent mid-way.
    h.run_new(&state, &input, &url, &flags).expect_code(5);
    assert_eq!(h.api.total_calls(), 6, "a page is a call of the quota");
    let mut flags = paging.to_vec();
    flags.extend(["--quota", "100/job"]);
    h.resume(&state, &flags).expect_code(0);
    check_items(&h, &h.export(&state), &ids);
    assert_eq!(
        h.api.total_calls(),
        12,
        "the IDs left mid-way continue at their next page"
    );
}

#[test]
fn a_next_link_that_repeats_the_api_key_of_the_first_request_is_followed_and_never_stored() {
    const KEY: &str = "hw-page-key-7f3a9c";
    let h = Harness::new(ApiConfig::fast());
    h.api.keep_requests();
    let ids: Vec<String> = vec!["p130-a".into()];
    let input = h.ids_file("ids.txt", &ids);
    let url = format!(
        "{}?per_page={SIZE}&key=${{HW_PAGE_KEY}}",
        h.api.pages_link_url_template()
    );
    let state = h.state();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(["--paginate", "link", "--items", ".[]"]);
    h.run_env(&args, &[("HW_PAGE_KEY", KEY)], &[])
        .expect_code(0);
    check_items(&h, &h.export(&state), &ids);
    let targets: Vec<String> = h.api.seen("p130-a").into_iter().map(|r| r.target).collect();
    assert_eq!(targets.len(), 3, "{targets:?}");
    assert!(
        targets
            .iter()
            .all(|t| t.replace("%2D", "-").contains(&format!("key={KEY}"))),
        "every page is asked for with the key: {targets:?}"
    );
    // As written, and percent-encoded as the API's links carry it.
    let encoded = KEY.replace('-', "%2D");
    for file in files_under(&state) {
        let bytes = std::fs::read(&file).unwrap();
        for form in [KEY, encoded.as_str()] {
            assert!(
                !bytes.windows(form.len()).any(|w| w == form.as_bytes()),
                "{} holds the key ({form})",
                file.display()
            );
        }
    }
}
