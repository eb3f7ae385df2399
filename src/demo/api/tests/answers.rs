//! The fake API's answers: routes, forms, the fault kinds and their healing, bad requests, shutdown, latency.

use super::*;

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
