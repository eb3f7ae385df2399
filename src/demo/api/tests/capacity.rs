//! The fake API's hidden capacity: its token bucket, 429s, Retry-After and rate changes.

use super::*;

#[test]
fn bucket_refills_and_switches_rates() {
    let t0 = tokio::time::Instant::now();
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
