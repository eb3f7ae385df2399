//! The fake API's outage switch: refused connections, dropped and failed requests, recovery.

use super::*;

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
