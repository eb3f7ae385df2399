//! Batch endpoints: up to `--batch-size` IDs per request, the answer split by `--split` and
//! matched to the IDs by value; IDs the answer leaves out asked again alone; a batch refused
//! with a 400 split until the one bad ID fails alone; exactly once through SIGKILLs.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use highwater::demo::api::ApiConfig;
use serde_json::Value;

use crate::harness::*;

const SPLIT: &str = ".results[] | {key: .id, value: .data}";

fn batch_args<'a>(state: &'a str, input: &'a str, url: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--state",
        state,
        "--input",
        input,
        "--url",
        url,
        "--batch-size",
        "100",
        "--split",
        SPLIT,
        "--bucket-size",
        "1000",
        "--concurrency",
        "4",
    ];
    args.extend(QUICK);
    args
}

/// How many IDs each request the server saw for `id` held (from its `ids=` query).
fn batch_sizes(h: &Harness, id: &str) -> Vec<usize> {
    h.api
        .seen(id)
        .iter()
        .map(|s| {
            let q = s.target.split_once("ids=").map_or("", |(_, q)| q);
            q.split('&').next().unwrap_or("").split(',').count()
        })
        .collect()
}

#[test]
fn a_batch_api_gives_every_id_once_through_kills_with_bad_and_omitted_ids_alone() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(6),
        batch_omit_per_mille: 10,
        batch_poison_per_mille: 2,
        seed: 5,
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let ids = ids(100_000);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.api.batch_url_template();
    let args = batch_args(p(&state), p(&input), &url);

    // Ten SIGKILLs at points spread over the job, each after more IDs were asked.
    let mut kills = 0;
    for k in 1..=10u64 {
        let mut child = h.spawn(&args);
        if h.wait_for_calls(&mut child, k * 9_000) {
            signal(&child, libc::SIGKILL);
            kills += 1;
        }
        finish(child);
    }
    assert_eq!(kills, 10, "the job finished before its tenth kill");
    let resume = ["run", "--state", p(&state), "--progress-interval", "0"];
    let last = h.run(&resume);
    let export = h.export(&state);

    // Every ID exactly once, in input order; only the bad IDs failed, each alone with 400.
    let exported: Vec<&str> = export.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let expected: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(exported, expected, "every ID once, in input order");
    let mut failed = 0;
    for record in &export {
        let id = record["id"].as_str().unwrap();
        if h.api.batch_poison(id) {
            failed += 1;
            assert_eq!(record["status"], "failed", "{record}");
            assert_eq!(record["http_status"], 400, "{record}");
            assert!(
                batch_sizes(&h, id).contains(&1),
                "{id} was asked alone before it failed"
            );
        } else {
            assert_eq!(record["status"], "ok", "{record}");
            assert_eq!(
                record["body"],
                highwater::demo::api::expected_body(id),
                "{record}"
            );
        }
        if h.api.batch_omits(id) && !h.api.batch_poison(id) {
            assert!(
                batch_sizes(&h, id).contains(&1),
                "{id} was asked again alone"
            );
        }
    }
    assert!(failed > 100, "the bad IDs are there: {failed}");
    last.expect_code(3);

    // Requests: a hundred IDs each, plus what the bad and the omitted IDs cost. A bad ID's
    // batch is halved until it stands alone (at most 2 requests per halving: 14 for 100);
    // an omitted one is asked once more alone; each kill repeats at most what was in flight.
    let requests = h.api.batch_requests();
    let base = ids.len() as u64 / 100;
    let poisoned: HashSet<&str> = expected
        .iter()
        .copied()
        .filter(|id| h.api.batch_poison(id))
        .collect();
    let omitted = expected
        .iter()
        .filter(|id| h.api.batch_omits(id) && !poisoned.contains(**id))
        .count() as u64;
    let bound = base * 13 / 10 + 14 * poisoned.len() as u64 + omitted + kills * 8;
    eprintln!(
        "{requests} requests for {} IDs: {base} full batches, {} bad IDs, {omitted} omitted; bound {bound}",
        ids.len(),
        poisoned.len()
    );
    assert!(requests <= bound, "{requests} requests; bound {bound}");
}

#[test]
fn a_post_batch_sends_a_json_array_and_checks_apply_per_id() {
    let h = Harness::new(ApiConfig::fast());
    h.api.keep_requests();
    let ids: Vec<String> = (0..250).map(|i| format!("id {i}/é")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = format!("http://{}/batch", h.api.addr());
    let mut args = vec![
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--url",
        &url,
        "--method",
        "POST",
        "--body",
        "{ids}",
        "--batch-size",
        "40",
        "--split",
        SPLIT,
        "--fail-if",
        ".score % 7 == 0",
        "--extract",
        "{score}",
    ];
    args.extend(QUICK);
    let run = h.run(&args);
    let export = h.export(&state);
    assert_eq!(export.len(), ids.len());
    let mut by_id: HashMap<&str, &Value> = HashMap::new();
    for r in &export {
        by_id.insert(r["id"].as_str().unwrap(), r);
    }
    let mut failed = 0;
    for id in &ids {
        let body = highwater::demo::api::expected_body(id);
        let score = body["score"].as_u64().unwrap();
        let r = by_id[id.as_str()];
        if score % 7 == 0 {
            failed += 1;
            assert_eq!(r["status"], "failed", "{r}");
            assert_eq!(r["error_class"], "invalid", "{r}");
        } else {
            assert_eq!(r["body"], serde_json::json!({"score": score}), "{r}");
        }
        let seen = h.api.seen(id);
        let sent: Vec<String> = serde_json::from_str(&seen[0].body).unwrap();
        assert!(sent.contains(id), "the body is a JSON array of the IDs");
    }
    run.expect_code(if failed > 0 { 3 } else { 0 });
    assert_eq!(h.api.batch_requests(), 7, "250 IDs in batches of 40");

    // A batch job's templates write {ids}: {id} is refused before anything is created.
    let other = h.path("other");
    let bad_url = format!("http://{}/batch?ids={{id}}", h.api.addr());
    let mut args = batch_args(p(&other), p(&input), &bad_url);
    args.truncate(13);
    h.run(&args).expect_refused(2, &["{ids}"]);
    assert!(!other.exists());
    let mut args = batch_args(p(&other), p(&input), &url);
    args.retain(|a| *a != "--split" && *a != SPLIT);
    h.run(&args).expect_refused(2, &["--split"]);
}
