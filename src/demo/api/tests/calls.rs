//! The fake API's fault distribution and its call counts and times.

use super::*;

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
    let counter = CallCounter::with_time_cap(3, 0);
    let now = tokio::time::Instant::now();
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
    assert_eq!(all[0], now.into_std());
    assert_eq!(all[2], (now + Duration::from_millis(2)).into_std());
    assert_eq!(counter.id_times(xxh3_64(b"x")).len(), 2);
    assert_eq!(counter.id_times(xxh3_64(b"y")).len(), 1);
}

// -----------------------------------------------------------------------
// Outage switch

#[test]
fn numbered_ids_are_counted_a_byte_each() {
    let counter = CallCounter::with_time_cap(0, 1000);
    let now = tokio::time::Instant::now();
    let call = |id: &str| counter.record(id, xxh3_64(id.as_bytes()), true, now);
    assert_eq!(call("id-000000007"), 1);
    assert_eq!(call("id-000000007"), 2);
    assert_eq!(call("id-000000999"), 1);
    // Past the count, another spelling, or not a number: counted by name.
    for id in [
        "id-000001000",
        "id-0000000007",
        "id-00000007",
        "id-00000000x",
        "x",
    ] {
        assert_eq!(call(id), 1, "{id}");
    }
    for _ in 0..300 {
        call("id-000000001");
    }
    assert_eq!(counter.get("id-000000007"), 2);
    assert_eq!(
        counter.get("id-000000001"),
        255,
        "a byte's count stops at 255"
    );
    assert_eq!(counter.get("id-0000000007"), 1);
    assert_eq!(counter.total(), 3 + 5 + 300);
    assert_eq!(counter.distinct(), 3 + 5);
    assert_eq!(counter.repeated(), 2);
    let snapshot = counter.snapshot();
    assert_eq!(snapshot.len(), 8);
    assert_eq!(snapshot["id-000000007"], 2);
    assert_eq!(snapshot["id-000000999"], 1);
}
