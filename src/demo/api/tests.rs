//! The fake API's tests: routes, faults, the outage switch, the hidden capacity, call counts.

use super::calls::{max_in_window, CallCounter};
use super::capacity::Bucket;
use super::faults::mix64;
use super::routes::MAX_BODY;
use super::*;
use hyper::header::{CONTENT_TYPE, RETRY_AFTER};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .retry(reqwest::retry::never())
        .build()
        .expect("client")
}

fn item_url(api: &FakeApi, id: &str) -> String {
    api.url_template().replace(
        "{id}",
        &utf8_percent_encode(id, NON_ALPHANUMERIC).to_string(),
    )
}

/// The first ID of the form `{prefix}{n}` with the given fault.
fn id_with(config: &ApiConfig, prefix: &str, fault: Fault) -> String {
    (0..100_000)
        .map(|n| format!("{prefix}{n}"))
        .find(|id| config.fault(id) == fault)
        .expect("an ID with that fault")
}

async fn get_json(client: &reqwest::Client, url: &str) -> (u16, serde_json::Value) {
    let resp = client.get(url).send().await.expect("request");
    let status = resp.status().as_u16();
    let body = resp.bytes().await.expect("body");
    (status, serde_json::from_slice(&body).expect("json body"))
}

#[tokio::test]
async fn success_body_equals_expected_body() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    for id in ["a", "42", "item-7"] {
        let resp = c.get(item_url(&api, id)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()[CONTENT_TYPE].to_str().unwrap(),
            "application/json"
        );
        let body: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert_eq!(body, api.expected_body(id));
        assert_eq!(body["id"], id);
        assert!(body["name"].as_str().unwrap().starts_with("item-"));
        assert!(body["score"].is_u64());
        assert!(!body["tags"].as_array().unwrap().is_empty());
    }
    // Deterministic from the ID alone, not the seed.
    assert_eq!(expected_body("a"), api.expected_body("a"));
    assert_ne!(expected_body("a"), expected_body("b"));
    api.shutdown().await;
}

#[tokio::test]
async fn awkward_ids_round_trip_in_path() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let ids = [
        "a/b",
        "with space",
        "what?",
        "hash#tag",
        "100%",
        "café",
        "/?#% é+&=",
        "日本",
    ];
    for id in ids {
        let (status, body) = get_json(&c, &item_url(&api, id)).await;
        assert_eq!(status, 200, "{id}");
        assert_eq!(body, api.expected_body(id), "{id}");
        assert_eq!(api.calls(id), 1, "{id}");
    }
    assert_eq!(api.distinct_ids(), ids.len());
    api.shutdown().await;
}

#[tokio::test]
async fn query_form() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let id = "a b/c?d#e%f+g é";
    let url = api.query_url_template().replace(
        "{id}",
        &utf8_percent_encode(id, NON_ALPHANUMERIC).to_string(),
    );
    let (status, body) = get_json(&c, &url).await;
    assert_eq!(status, 200);
    assert_eq!(body, api.expected_body(id));
    // `+` is a space, other parameters are ignored.
    let url = format!("http://{}/items?x=1&id=two+words&y", api.addr());
    let (status, body) = get_json(&c, &url).await;
    assert_eq!(status, 200);
    assert_eq!(body, api.expected_body("two words"));
    // Missing id.
    let url = format!("http://{}/items?x=1", api.addr());
    let (status, body) = get_json(&c, &url).await;
    assert_eq!(
        (status, body),
        (400, serde_json::json!({"error": "bad request"}))
    );
    assert_eq!(api.total_calls(), 2);
    api.shutdown().await;
}

#[tokio::test]
async fn post_form() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let id = "posted/é?#";
    let body = serde_json::json!({"id": id, "extra": [1, 2]}).to_string();
    let resp = c
        .post(api.post_url())
        .header(CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(got, api.expected_body(id));
    assert_eq!(api.calls(id), 1);

    for bad in ["not json", "{}", r#"{"id": 5}"#, "[]", ""] {
        let resp = c.post(api.post_url()).body(bad).send().await.unwrap();
        assert_eq!(resp.status(), 400, "{bad:?}");
        let got: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert_eq!(got, serde_json::json!({"error": "bad request"}));
    }

    let huge = format!(r#"{{"id": "x", "pad": "{}"}}"#, "x".repeat(MAX_BODY));
    let resp = c.post(api.post_url()).body(huge).send().await.unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(api.total_calls(), 1);
    api.shutdown().await;
}

#[tokio::test]
async fn not_found_fault_is_permanent() {
    let config = ApiConfig::faulty();
    let id = id_with(&config, "nf-", Fault::NotFound);
    let api = FakeApi::start(config).await.unwrap();
    assert_eq!(api.fault(&id), Fault::NotFound);
    let c = client();
    for _ in 0..4 {
        let (status, body) = get_json(&c, &item_url(&api, &id)).await;
        assert_eq!(
            (status, body),
            (404, serde_json::json!({"error": "not found"}))
        );
    }
    assert_eq!(api.calls(&id), 4);
    api.shutdown().await;
}

#[tokio::test]
async fn unavailable_fault_heals() {
    let config = ApiConfig::faulty();
    let id = id_with(&config, "un-", Fault::Unavailable);
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    for attempt in 1..=api.config().transient_attempts {
        let resp = c.get(item_url(&api, &id)).send().await.unwrap();
        assert_eq!(resp.status(), 503, "attempt {attempt}");
        assert!(resp.headers().get("retry-after").is_none());
    }
    let (status, body) = get_json(&c, &item_url(&api, &id)).await;
    assert_eq!(status, 200);
    assert_eq!(body, api.expected_body(&id));
    assert_eq!(api.calls(&id), 3);
    api.shutdown().await;
}

#[tokio::test]
async fn drop_fault_heals() {
    let config = ApiConfig::faulty();
    let id = id_with(&config, "dr-", Fault::Drop);
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    for attempt in 1..=2 {
        let err = c.get(item_url(&api, &id)).send().await;
        assert!(err.is_err(), "attempt {attempt}: {err:?}");
    }
    let (status, body) = get_json(&c, &item_url(&api, &id)).await;
    assert_eq!(status, 200);
    assert_eq!(body, api.expected_body(&id));
    assert_eq!(api.calls(&id), 3);
    api.shutdown().await;
}

#[tokio::test]
async fn slow_fault_heals() {
    let config = ApiConfig {
        slow_per_mille: 1000,
        slow_delay: Duration::from_millis(500),
        transient_attempts: 1,
        ..ApiConfig::fast()
    };
    let api = FakeApi::start(config).await.unwrap();
    assert_eq!(api.fault("s"), Fault::Slow);
    let c = reqwest::Client::builder()
        .no_proxy()
        .retry(reqwest::retry::never())
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let err = c.get(item_url(&api, "s")).send().await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let (status, body) = get_json(&c, &item_url(&api, "s")).await;
    assert_eq!(status, 200);
    assert_eq!(body, api.expected_body("s"));
    assert_eq!(api.calls("s"), 2);
    api.shutdown().await;
}

#[tokio::test]
async fn text_ids_answer_plain_text() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let id = "text:hello world";
    let resp = c.get(item_url(&api, id)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()[CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    assert_eq!(resp.text().await.unwrap(), "plain text:hello world");
    assert_eq!(
        api.expected_body(id),
        serde_json::Value::String("plain text:hello world".into())
    );
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_are_counted_under_concurrency() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let mut tasks = JoinSet::new();
    for t in 0..16 {
        let (c, api) = (c.clone(), api.clone());
        tasks.spawn(async move {
            for n in 0..200 {
                let id = format!("id-{}", n % 100);
                let resp = c.get(item_url(&api, &id)).send().await.unwrap();
                assert_eq!(resp.status(), 200, "task {t}");
                resp.bytes().await.unwrap();
            }
        });
    }
    while let Some(res) = tasks.join_next().await {
        res.unwrap();
    }
    assert_eq!(api.total_calls(), 16 * 200);
    assert_eq!(api.distinct_ids(), 100);
    let snapshot = api.calls_snapshot();
    assert_eq!(snapshot.len(), 100);
    assert!(snapshot.values().all(|&n| n == 32));
    assert_eq!(api.calls("id-7"), 32);
    assert_eq!(api.calls("never"), 0);
    api.shutdown().await;
}

#[tokio::test]
async fn bad_requests_do_not_break_the_server() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    // Not UTF-8 once decoded.
    let (status, _) = get_json(&c, &format!("http://{}/items/%FF%FE", api.addr())).await;
    assert_eq!(status, 400);
    let (status, _) = get_json(&c, &format!("http://{}/items?id=%C3", api.addr())).await;
    assert_eq!(status, 400);
    // Empty ID.
    let (status, _) = get_json(&c, &format!("http://{}/items/", api.addr())).await;
    assert_eq!(status, 400);
    // No route.
    for path in ["/", "/itemsx", "/other/1", "/items-/1"] {
        let (status, body) = get_json(&c, &format!("http://{}{path}", api.addr())).await;
        assert_eq!(
            (status, body),
            (404, serde_json::json!({"error": "no route"})),
            "{path}"
        );
    }
    let resp = c.delete(item_url(&api, "a")).send().await.unwrap();
    assert_eq!(resp.status(), 404);

    // Raw garbage and an oversized chunked body over plain TCP.
    let mut s = TcpStream::connect(api.addr()).await.unwrap();
    s.write_all(b"\xff\xfe\x00garbage\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;

    let mut s = TcpStream::connect(api.addr()).await.unwrap();
    s.write_all(b"POST /items HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = vec![b'x'; 70_000];
    s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(&chunk).await.unwrap();
    s.write_all(b"\r\n0\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = s.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 413"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );

    // A client that goes away mid-body.
    let mut s = TcpStream::connect(api.addr()).await.unwrap();
    s.write_all(b"POST /items HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"id\"")
        .await
        .unwrap();
    drop(s);

    // Still serving, and none of the above counted.
    let (status, _) = get_json(&c, &item_url(&api, "fine")).await;
    assert_eq!(status, 200);
    assert_eq!(api.total_calls(), 1);
    api.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_listening() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let addr = api.addr();
    let c = client();
    let (status, _) = get_json(&c, &item_url(&api, "x")).await;
    assert_eq!(status, 200);
    let clone = api.clone();
    api.shutdown().await;
    assert!(TcpStream::connect(addr).await.is_err());
    // Pooled keep-alive connection was closed too.
    assert!(c.get(item_url(&clone, "x")).send().await.is_err());
    assert_eq!(clone.calls("x"), 1);
}

#[tokio::test]
async fn latency_is_applied() {
    let config = ApiConfig {
        latency_min: Duration::from_millis(30),
        latency_max: Duration::from_millis(40),
        ..ApiConfig::fast()
    };
    for attempt in 1..50 {
        let l = config.latency(xxh3_64(b"x"), attempt);
        assert!(l >= config.latency_min && l <= config.latency_max);
    }
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    let started = std::time::Instant::now();
    let (status, _) = get_json(&c, &item_url(&api, "x")).await;
    assert_eq!(status, 200);
    assert!(started.elapsed() >= Duration::from_millis(30));
    api.shutdown().await;
}

#[test]
fn fault_distribution_matches_per_mille() {
    fn count(config: &ApiConfig) -> HashMap<&'static str, u32> {
        let mut counts = HashMap::new();
        for n in 0..10_000 {
            let name = match config.fault(&format!("id-{n}")) {
                Fault::None => "none",
                Fault::NotFound => "not_found",
                Fault::Unavailable => "unavailable",
                Fault::Drop => "drop",
                Fault::Slow => "slow",
                Fault::Throttled => "throttled",
            };
            *counts.entry(name).or_insert(0) += 1;
        }
        counts
    }
    for config in [
        ApiConfig::faulty(),
        ApiConfig::demo(),
        ApiConfig {
            seed: 12345,
            ..ApiConfig::faulty()
        },
        ApiConfig {
            throttled_per_mille: 40,
            ..ApiConfig::faulty()
        },
    ] {
        let counts = count(&config);
        for (name, per_mille) in [
            ("not_found", config.not_found_per_mille),
            ("unavailable", config.unavailable_per_mille),
            ("drop", config.drop_per_mille),
            ("slow", config.slow_per_mille),
            ("throttled", config.throttled_per_mille),
        ] {
            let expected = f64::from(per_mille) * 10.0;
            let got = f64::from(counts.get(name).copied().unwrap_or(0));
            let tolerance = 4.0 * expected.sqrt() + 5.0;
            assert!(
                (got - expected).abs() <= tolerance,
                "{name}: got {got}, expected {expected} ± {tolerance} ({config:?})"
            );
        }
    }
    // No faults at all in fast mode.
    assert_eq!(count(&ApiConfig::fast())["none"], 10_000);
    // Everything faulty when the shares fill the space; truncated past 1000.
    let all = ApiConfig {
        not_found_per_mille: 600,
        unavailable_per_mille: 600,
        ..ApiConfig::fast()
    };
    let counts = count(&all);
    assert!(!counts.contains_key("none"));
    assert!(!counts.contains_key("drop"));
    // Throttled comes last in the per-mille space.
    let all = ApiConfig {
        slow_per_mille: 900,
        throttled_per_mille: 300,
        ..ApiConfig::fast()
    };
    let counts = count(&all);
    assert!(!counts.contains_key("none"));
    let throttled = f64::from(counts["throttled"]);
    assert!(
        (throttled - 1000.0).abs() < 4.0 * 1000f64.sqrt() + 5.0,
        "{throttled}"
    );
    // Different seeds pick different faulty IDs.
    let a = ApiConfig::faulty();
    let b = ApiConfig {
        seed: 99,
        ..ApiConfig::faulty()
    };
    let differ = (0..1000)
        .map(|n| format!("id-{n}"))
        .filter(|id| a.fault(id) != b.fault(id))
        .count();
    assert!(differ > 20, "{differ}");
}

// -----------------------------------------------------------------------
// Call timestamps

#[tokio::test]
async fn call_times_are_recorded() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    assert!(api.call_times().is_empty());
    assert_eq!(api.max_calls_in_window(Duration::from_secs(1)), 0);
    let before = Instant::now();
    for id in ["a", "b", "a", "c", "a"] {
        let (status, _) = get_json(&c, &item_url(&api, id)).await;
        assert_eq!(status, 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Uncounted requests are not timestamped.
    let (status, _) = get_json(&c, &format!("http://{}/nope", api.addr())).await;
    assert_eq!(status, 404);
    let after = Instant::now();
    let times = api.call_times();
    assert_eq!(times.len(), 5);
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert!(times[0] >= before && times[4] <= after);
    // Spaced by the 20 ms sleeps.
    assert!(times
        .windows(2)
        .all(|w| w[1] - w[0] >= Duration::from_millis(20)));

    let a = api.calls_per_id_times("a");
    assert_eq!(a.len(), 3);
    assert_eq!(a, vec![times[0], times[2], times[4]]);
    assert_eq!(api.calls_per_id_times("b"), vec![times[1]]);
    assert_eq!(api.calls_per_id_times("c"), vec![times[3]]);
    assert!(api.calls_per_id_times("never").is_empty());

    assert_eq!(api.max_calls_in_window(Duration::from_secs(10)), 5);
    assert_eq!(api.max_calls_in_window(Duration::from_nanos(1)), 1);
    assert_eq!(api.max_calls_in_window(Duration::ZERO), 0);
    assert_eq!(
        api.max_calls_in_window(times[4] - times[0]),
        4,
        "half-open window"
    );
    assert_eq!(
        api.max_calls_in_window(times[4] - times[0] + Duration::from_nanos(1)),
        5
    );
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn call_times_under_concurrency() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let mut tasks = JoinSet::new();
    for _ in 0..8 {
        let (c, api) = (c.clone(), api.clone());
        tasks.spawn(async move {
            for n in 0..50 {
                let resp = c.get(item_url(&api, &format!("k{}", n % 10))).send().await;
                resp.unwrap().bytes().await.unwrap();
            }
        });
    }
    while let Some(res) = tasks.join_next().await {
        res.unwrap();
    }
    assert_eq!(api.call_times().len(), 400);
    for n in 0..10 {
        let id = format!("k{n}");
        assert_eq!(api.calls_per_id_times(&id).len() as u64, api.calls(&id));
    }
    assert_eq!(api.max_calls_in_window(Duration::from_secs(3600)), 400);
    api.shutdown().await;
}

#[test]
fn max_in_window_sweeps() {
    assert_eq!(max_in_window(&[], 10), 0);
    assert_eq!(max_in_window(&[5], 0), 0);
    assert_eq!(max_in_window(&[5], 1), 1);
    assert_eq!(max_in_window(&[5, 5, 5], 1), 3);
    let t = [0, 1, 2, 10, 11, 12, 13, 30];
    assert_eq!(max_in_window(&t, 1), 1);
    assert_eq!(max_in_window(&t, 3), 3);
    assert_eq!(max_in_window(&t, 4), 4);
    assert_eq!(max_in_window(&t, 12), 5); // [2, 14)
    assert_eq!(max_in_window(&t, 14), 7); // [0, 14)
    assert_eq!(max_in_window(&t, 31), 8);
    // Against brute force.
    let mut x = 1u64;
    let mut v: Vec<u64> = (0..300)
        .map(|_| {
            x = mix64(x);
            x % 1000
        })
        .collect();
    v.sort_unstable();
    for window in [0, 1, 7, 50, 333, 1000, 5000] {
        let brute = v
            .iter()
            .map(|&s| v.iter().filter(|&&t| t >= s && t - s < window).count())
            .max()
            .unwrap();
        assert_eq!(max_in_window(&v, window), brute, "{window}");
    }
}

#[test]
fn call_times_are_capped() {
    let counter = CallCounter::with_time_cap(3);
    let now = Instant::now();
    for n in 0..5u32 {
        let id = if n % 2 == 0 { "x" } else { "y" };
        let at = now + Duration::from_millis(u64::from(n));
        counter.record(id, xxh3_64(id.as_bytes()), true, at);
    }
    assert_eq!(counter.total(), 5);
    assert_eq!(counter.get("x"), 3);
    let mut all = counter.all_times();
    all.sort_unstable();
    let all = counter.to_instants(all);
    assert_eq!(all.len(), 3);
    assert_eq!(all[0], now);
    assert_eq!(all[2], now + Duration::from_millis(2));
    assert_eq!(counter.id_times(xxh3_64(b"x")).len(), 2);
    assert_eq!(counter.id_times(xxh3_64(b"y")).len(), 1);
}

// -----------------------------------------------------------------------
// Outage switch

#[tokio::test]
async fn outage_refuses_connections_then_recovers() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let url = item_url(&api, "o");
    let pooled = reqwest::Client::builder()
        .no_proxy()
        .retry(reqwest::retry::never())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (status, _) = get_json(&pooled, &url).await;
    assert_eq!(status, 200);
    // A raw keep-alive connection with a request answered.
    let mut raw = TcpStream::connect(api.addr()).await.unwrap();
    raw.write_all(b"GET /items/r HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = raw.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    assert!(!api.is_down());

    api.set_down(true).await;
    assert!(api.is_down());
    // The open connection was closed.
    let read = tokio::time::timeout(Duration::from_secs(2), raw.read(&mut buf))
        .await
        .expect("closed, not hanging");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // New connections are refused.
    let err = TcpStream::connect(api.addr()).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    let err = client().get(&url).send().await.unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    // The pooled client fails too (its connection was closed), without hanging.
    let started = Instant::now();
    assert!(pooled.get(&url).send().await.is_err());
    assert!(started.elapsed() < Duration::from_secs(2));
    // Idempotent.
    api.set_down(true).await;
    assert!(api.is_down());

    api.set_down(false).await;
    assert!(!api.is_down());
    let (status, body) = get_json(&client(), &api.url_template().replace("{id}", "o")).await;
    assert_eq!(status, 200);
    assert_eq!(body, api.expected_body("o"));
    let (status, _) = get_json(&pooled, &url).await;
    assert_eq!(status, 200);
    api.set_down(false).await;
    assert!(!api.is_down());
    // Only answered requests were counted.
    assert_eq!(api.calls("o"), 3);
    assert_eq!(api.total_calls(), 4);

    // Down again, and shutting down while down.
    api.set_down(true).await;
    let clone = api.clone();
    api.shutdown().await;
    assert!(TcpStream::connect(clone.addr()).await.is_err());
    clone.set_down(false).await; // nothing to bring up: returns
}

#[tokio::test]
async fn requests_racing_an_outage_get_their_connection_dropped() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let mut raw = TcpStream::connect(api.addr()).await.unwrap();
    // As if set_down(true) had set the flag but not yet closed the connections.
    api.shared.down.store(true, Ordering::SeqCst);
    raw.write_all(b"GET /items/r HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(2), raw.read_to_end(&mut buf))
        .await
        .expect("dropped, not hanging");
    assert!(
        read.is_err() || buf.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&buf)
    );
    assert_eq!(api.total_calls(), 0);
    api.shutdown().await;
}

#[tokio::test]
async fn in_flight_requests_fail_when_going_down() {
    let config = ApiConfig {
        latency_min: Duration::from_secs(30),
        latency_max: Duration::from_secs(30),
        ..ApiConfig::fast()
    };
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    let url = item_url(&api, "slowpoke");
    let request = tokio::spawn(async move { c.get(url).send().await });
    while api.total_calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    api.set_down(true).await;
    let result = tokio::time::timeout(Duration::from_secs(2), request)
        .await
        .expect("no hang")
        .unwrap();
    assert!(result.is_err(), "{result:?}");
    api.shutdown().await;
}

// -----------------------------------------------------------------------
// Hidden capacity

#[test]
fn bucket_refills_and_switches_rates() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut b = Bucket::new(t0);
    // Unlimited.
    assert!((0..1000).all(|_| b.try_take(t0)));
    // 100/s: burst 10, starting full.
    b.set_rate(Some(100.0), t0);
    assert_eq!(b.burst, 10.0);
    assert_eq!((0..20).filter(|_| b.try_take(t0)).count(), 10);
    // 50 ms later: 5 tokens.
    assert_eq!((0..20).filter(|_| b.try_take(at(50))).count(), 5);
    // A `now` older than the last update adds nothing.
    assert!(!b.try_take(at(40)));
    // Refilled at the old rate up to the switch: 30 ms at 100/s = 3 tokens, then
    // 1/s (burst 1) caps them at 1.
    b.set_rate(Some(1.0), at(80));
    assert_eq!(b.burst, 1.0);
    assert_eq!((0..5).filter(|_| b.try_take(at(80))).count(), 1);
    assert!(!b.try_take(at(500)));
    assert!(b.try_take(at(1080)));
    // Back to a higher rate: keeps the (empty) bucket, does not refill it at once.
    b.set_rate(Some(1000.0), at(1080));
    assert!(!b.try_take(at(1080)));
    assert_eq!((0..500).filter(|_| b.try_take(at(1090))).count(), 10);
    // Never more than the burst.
    assert_eq!((0..500).filter(|_| b.try_take(at(60_000))).count(), 100);
    // Unlimited again, then limited again starts full.
    b.set_rate(None, at(60_000));
    assert!((0..1000).all(|_| b.try_take(at(60_000))));
    b.set_rate(Some(20.0), at(60_000));
    assert_eq!((0..10).filter(|_| b.try_take(at(60_000))).count(), 2);
    // Odd rates.
    b.set_rate(Some(f64::NAN), at(60_000));
    assert_eq!(b.rate, Some(0.0));
    b.set_rate(Some(-5.0), at(60_000));
    assert_eq!(b.rate, Some(0.0));
    assert!(!b.try_take(at(120_000)));
    b.set_rate(Some(f64::INFINITY), at(120_000));
    assert_eq!(b.rate, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capacity_limits_accepted_calls() {
    const RATE: f64 = 50.0;
    const TASKS: usize = 8;
    const PER_TASK: usize = 50;
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    api.set_capacity(Some(RATE));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let (c, api) = (c.clone(), api.clone());
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            // 8 tasks x 25 requests/s = 200/s offered for ~2 s.
            let mut tick = tokio::time::interval(Duration::from_millis(40));
            for n in 0..PER_TASK {
                tick.tick().await;
                let resp = c
                    .get(item_url(&api, &format!("t{t}-{n}")))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                if status == 429 {
                    assert!(resp.headers().get(RETRY_AFTER).is_none());
                    let body: serde_json::Value =
                        serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
                    assert_eq!(body, serde_json::json!({"error": "rate limited"}));
                } else {
                    resp.bytes().await.unwrap();
                }
                statuses.push(status);
            }
            statuses
        });
    }
    let mut ok = 0u64;
    let mut limited = 0u64;
    while let Some(res) = tasks.join_next().await {
        for status in res.unwrap() {
            match status {
                200 => ok += 1,
                429 => limited += 1,
                other => panic!("status {other}"),
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total = (TASKS * PER_TASK) as u64;
    let burst = (RATE / 10.0).max(1.0);
    let slack = 10.0;
    let accepted = api.accepted() as f64;
    assert!(
        accepted >= RATE * elapsed - slack && accepted <= RATE * elapsed + burst + slack,
        "accepted {accepted} in {elapsed:.2} s"
    );
    assert_eq!(api.accepted(), ok);
    assert_eq!(api.rejected_429(), limited);
    assert_eq!(ok + limited, total);
    assert_eq!(api.total_calls(), total);
    assert_eq!(api.call_times().len() as u64, total);
    // A rejected call is a call of its ID.
    assert!(api.calls_snapshot().values().all(|&n| n == 1));
    // In any second, no more than the rate plus the burst were accepted; with the
    // 429s, far more calls came.
    assert!(api.max_calls_in_window(Duration::from_secs(1)) > 100);
    api.shutdown().await;
}

#[tokio::test]
async fn capacity_retry_after_and_changes() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    // Burst 1 at 1/s: the second request at once is rejected.
    api.set_capacity(Some(1.0));
    api.set_retry_after_on_429(Some(3));
    let (status, _) = get_json(&c, &item_url(&api, "a")).await;
    assert_eq!(status, 200);
    let resp = c.get(item_url(&api, "a")).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()[RETRY_AFTER], "3");
    api.set_retry_after_on_429(None);
    let resp = c.get(item_url(&api, "a")).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get(RETRY_AFTER).is_none());
    assert_eq!((api.accepted(), api.rejected_429()), (1, 2));
    assert_eq!(api.calls("a"), 3);
    // Unlimited again.
    api.set_capacity(None);
    for _ in 0..20 {
        let (status, _) = get_json(&c, &item_url(&api, "b")).await;
        assert_eq!(status, 200);
    }
    assert_eq!((api.accepted(), api.rejected_429()), (21, 2));
    api.shutdown().await;
}

#[tokio::test]
async fn capacity_comes_before_faults_and_spares_their_attempts() {
    let config = ApiConfig {
        unavailable_per_mille: 1000,
        transient_attempts: 1,
        ..ApiConfig::fast()
    };
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    api.set_capacity(Some(0.0)); // only the initial token
    let (status, body) = get_json(&c, &item_url(&api, "u")).await;
    assert_eq!(
        (status, body),
        (503, serde_json::json!({"error": "unavailable"}))
    );
    let (status, body) = get_json(&c, &item_url(&api, "v")).await;
    assert_eq!(
        (status, body),
        (429, serde_json::json!({"error": "rate limited"}))
    );
    let (status, _) = get_json(&c, &item_url(&api, "v")).await;
    assert_eq!(status, 429);
    api.set_capacity(None);
    // "v" still gets its one transient 503: the 429s did not use it up.
    let (status, _) = get_json(&c, &item_url(&api, "v")).await;
    assert_eq!(status, 503);
    let (status, body) = get_json(&c, &item_url(&api, "v")).await;
    assert_eq!((status, body), (200, api.expected_body("v")));
    assert_eq!(api.calls("v"), 4);
    assert_eq!((api.accepted(), api.rejected_429()), (1, 2));
    api.shutdown().await;
}

// -----------------------------------------------------------------------
// Throttled fault

#[tokio::test]
async fn throttled_fault_heals() {
    let config = ApiConfig {
        retry_after_secs: 7,
        ..ApiConfig::faulty()
    };
    assert_eq!(ApiConfig::faulty().throttled_per_mille, 0);
    assert_eq!(ApiConfig::demo().throttled_per_mille, 0);
    assert_eq!(ApiConfig::fast().retry_after_secs, 1);
    let config = ApiConfig {
        throttled_per_mille: 50,
        ..config
    };
    let id = id_with(&config, "th-", Fault::Throttled);
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    for attempt in 1..=api.config().transient_attempts {
        let resp = c.get(item_url(&api, &id)).send().await.unwrap();
        assert_eq!(resp.status(), 429, "attempt {attempt}");
        assert_eq!(resp.headers()[RETRY_AFTER], "7");
        let body: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert_eq!(body, serde_json::json!({"error": "throttled"}));
    }
    let (status, body) = get_json(&c, &item_url(&api, &id)).await;
    assert_eq!(status, 200);
    assert_eq!(body, api.expected_body(&id));
    assert_eq!(api.calls(&id), 3);
    // Fault 429s are not capacity 429s.
    assert_eq!((api.accepted(), api.rejected_429()), (1, 0));
    api.shutdown().await;
}
