//! The fake API's quota windows: counting and refusing on the clock, their `Retry-After`, the
//! headers that announce them (read back with [`crate::quota::announced::read_announced`]),
//! and how they stand apart from the hidden capacity.

use super::super::windows::Windows;
use super::*;
use crate::quota::announced::{read_announced, Announced};

fn window(limit: u64, length_ms: u64) -> ApiWindow {
    ApiWindow {
        limit,
        length: Duration::from_millis(length_ms),
    }
}

/// The headers `windows` announces at `now_ms`.
fn announced_at(windows: &Windows, now_ms: u64) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    windows.announce(&mut headers, now_ms);
    headers
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

#[test]
fn a_window_refuses_above_its_limit_until_its_boundary() {
    let w = Windows::new(&[window(3, 2000)], Announce::None);
    // Window 5 covers [10 000, 12 000) ms.
    assert_eq!(
        (0..3).map(|_| w.admit(10_000)).collect::<Vec<_>>(),
        [Ok(()); 3]
    );
    assert_eq!(w.admit(10_000), Err(2));
    assert_eq!(w.admit(11_000), Err(1));
    assert_eq!(w.admit(11_001), Err(1));
    assert_eq!(w.admit(11_999), Err(1));
    // The boundary: a new, empty window.
    assert_eq!(w.admit(12_000), Ok(()));
    assert_eq!(w.refusals(), 4);
    assert_eq!(w.peaks(), [3]);
    // Refusals did not count: the new window holds one.
    assert_eq!(w.admit(13_999), Ok(()));
    assert_eq!(w.admit(13_999), Ok(()));
    assert_eq!(w.admit(13_999), Err(1));
    // A window skipped entirely, then a fractional length: 1.5 s windows.
    assert_eq!(w.admit(100_000), Ok(()));
    w.set_windows(&[window(1, 1500)]);
    assert_eq!(w.peaks(), [0]);
    assert_eq!(w.admit(1_500), Ok(()));
    assert_eq!(w.admit(2_999), Err(1));
    assert_eq!(w.admit(3_000), Ok(()));
    assert_eq!(w.admit(3_001), Err(2));
    // A limit of zero refuses everything; no windows refuse nothing.
    w.set_windows(&[window(0, 1000)]);
    assert_eq!(w.admit(0), Err(1));
    w.set_windows(&[]);
    assert_eq!(w.admit(0), Ok(()));
    assert!(w.peaks().is_empty());
}

#[test]
fn several_windows_count_together_and_the_last_reset_is_waited_for() {
    let w = Windows::new(&[window(2, 1000), window(3, 10_000)], Announce::None);
    assert_eq!(w.admit(0), Ok(()));
    assert_eq!(w.admit(500), Ok(()));
    // The 1 s window is full.
    assert_eq!(w.admit(600), Err(1));
    // The 10 s one fills in the next second.
    assert_eq!(w.admit(1_000), Ok(()));
    assert_eq!(w.admit(1_000), Err(9));
    assert_eq!(w.admit(1_001), Err(9));
    assert_eq!(w.peaks(), [2, 3]);
    // Both full: the one resetting last.
    let w = Windows::new(&[window(2, 1000), window(2, 10_000)], Announce::None);
    assert_eq!(w.admit(0), Ok(()));
    assert_eq!(w.admit(0), Ok(()));
    assert_eq!(w.admit(1), Err(10));
    assert_eq!(w.admit(9_001), Err(1));
    assert_eq!(w.admit(10_000), Ok(()));
}

#[test]
fn ietf_headers_name_every_window() {
    let w = Windows::new(&[window(50, 2000), window(200, 10_000)], Announce::Ietf);
    for _ in 0..3 {
        w.admit(20_500).unwrap();
    }
    let headers = announced_at(&w, 20_600);
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        Some(r#""w0";q=50;w=2, "w1";q=200;w=10"#)
    );
    // 1.4 s and 9.4 s to the resets, rounded up.
    assert_eq!(
        header(&headers, "ratelimit"),
        Some(r#""w0";r=47;t=2, "w1";r=197;t=10"#)
    );
    assert!(header(&headers, "x-ratelimit-remaining").is_none());
    // After the first window's boundary, its remaining is whole again.
    let headers = announced_at(&w, 22_000);
    assert_eq!(
        header(&headers, "ratelimit"),
        Some(r#""w0";r=50;t=2, "w1";r=197;t=8"#)
    );
    // Fractional lengths announce whole seconds, rounded up.
    w.set_windows(&[window(5, 1500)]);
    let headers = announced_at(&w, 1_600);
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        Some(r#""w0";q=5;w=2"#)
    );
    assert_eq!(header(&headers, "ratelimit"), Some(r#""w0";r=5;t=2"#));
    // Announce::None, or no windows: nothing.
    w.set_announce(Announce::None);
    assert!(announced_at(&w, 1_600).is_empty());
    w.set_announce(Announce::Ietf);
    w.set_windows(&[]);
    assert!(announced_at(&w, 1_600).is_empty());
}

#[test]
fn x_rate_limit_headers_tell_the_tightest_window() {
    let w = Windows::new(
        &[window(10, 1000), window(5, 60_000), window(5, 3_600_000)],
        Announce::XRateLimit,
    );
    for _ in 0..2 {
        w.admit(7_200_100).unwrap();
    }
    // Remaining 8, 3, 3: of the two with 3, the hourly one resets last.
    let headers = announced_at(&w, 7_200_200);
    assert_eq!(header(&headers, "x-ratelimit-limit"), Some("5"));
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("3"));
    assert_eq!(header(&headers, "x-ratelimit-used"), Some("2"));
    assert_eq!(header(&headers, "x-ratelimit-reset"), Some("10800"));
    assert!(header(&headers, "ratelimit").is_none());
    // The reset is epoch seconds rounded up.
    w.set_windows(&[window(10, 1500)]);
    let headers = announced_at(&w, 1_600);
    assert_eq!(header(&headers, "x-ratelimit-reset"), Some("3"));
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("10"));
}

/// Sleeps until `margin_ms` after the next boundary of windows of `length_ms`.
async fn to_next_boundary(length_ms: u64, margin_ms: u64) {
    let now = crate::clock::Clock::system().now_ms();
    let next = (now / length_ms + 1) * length_ms + margin_ms;
    tokio::time::sleep(Duration::from_millis(next - now)).await;
}

/// The one limit of `policy` that `resp`'s headers announce, read as a client would.
fn announced_by(resp: &reqwest::Response, policy: &str) -> Announced {
    let found = read_announced(resp.headers(), std::time::SystemTime::now());
    let mut of_policy = found.into_iter().filter(|a| a.policy == policy);
    let announced = of_policy.next().expect("an announced limit");
    assert!(of_policy.next().is_none());
    announced
}

#[tokio::test]
async fn the_server_refuses_above_a_window_and_announces_the_truth() {
    const LENGTH_MS: u64 = 2000;
    let config = ApiConfig {
        windows: vec![window(4, LENGTH_MS)],
        announce: Announce::Ietf,
        ..ApiConfig::fast()
    };
    assert!(ApiConfig::fast().windows.is_empty());
    assert!(ApiConfig::demo().windows.is_empty());
    assert!(ApiConfig::faulty().windows.is_empty());
    assert_eq!(ApiConfig::faulty().announce, Announce::None);
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    to_next_boundary(LENGTH_MS, 50).await;
    for n in 0..4u64 {
        let resp = c
            .get(item_url(&api, &format!("a{n}")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["ratelimit-policy"], r#""w0";q=4;w=2"#);
        let announced = announced_by(&resp, "w0");
        assert_eq!(
            (announced.limit, announced.window, announced.remaining),
            (Some(4), Some(Duration::from_secs(2)), 3 - n)
        );
        assert!(announced.reset <= Duration::from_secs(2));
    }
    // Full: 429 with the seconds to the window's end (about 1.95 s), announced too.
    let resp = c.get(item_url(&api, "a0")).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()[RETRY_AFTER], "2");
    let announced = announced_by(&resp, "w0");
    assert_eq!(announced.remaining, 0);
    assert_eq!(announced.reset, Duration::from_secs(2));
    let body: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(body, serde_json::json!({"error": "quota exceeded"}));
    assert_eq!(api.window_refusals(), 1);
    // A quota 429 is a call, but no capacity 429 and no accepted call.
    assert_eq!(api.calls("a0"), 2);
    assert_eq!((api.accepted(), api.rejected_429()), (4, 0));
    // Past the boundary: accepted again, the remaining whole again less this call.
    to_next_boundary(LENGTH_MS, 50).await;
    let resp = c.get(item_url(&api, "a0")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(announced_by(&resp, "w0").remaining, 3);
    assert_eq!(api.window_peaks(), [4]);
    assert_eq!(api.window_refusals(), 1);
    api.shutdown().await;
}

#[tokio::test]
async fn every_answer_announces_in_both_styles() {
    let config = ApiConfig {
        not_found_per_mille: 300,
        unavailable_per_mille: 300,
        transient_attempts: 1,
        windows: vec![window(5, 60_000), window(1000, 3_600_000)],
        announce: Announce::XRateLimit,
        ..ApiConfig::fast()
    };
    let missing = id_with(&config, "nf-", Fault::NotFound);
    let unavailable = id_with(&config, "un-", Fault::Unavailable);
    let fine = id_with(&config, "ok-", Fault::None);
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    // Not too close to a minute's end, so the five calls share a window.
    if crate::clock::Clock::system().now_ms() % 60_000 > 55_000 {
        to_next_boundary(60_000, 50).await;
    }
    let mut statuses = Vec::new();
    for (n, id) in [&fine, &missing, &unavailable, &fine, &fine, &fine]
        .into_iter()
        .enumerate()
    {
        if n == 3 {
            api.set_announce(Announce::Ietf);
            // Its one initial token for this call; the next one gets the hidden capacity's
            // 429, which carries the headers too and counts in the windows.
            api.set_capacity(Some(0.0));
        }
        let resp = c.get(item_url(&api, id)).send().await.unwrap();
        statuses.push(resp.status().as_u16());
        let remaining = 5u64.saturating_sub(n as u64 + 1);
        let announced = if n < 3 {
            assert!(resp.headers().get("ratelimit").is_none());
            let a = announced_by(&resp, "x-ratelimit");
            assert_eq!(a.limit, Some(5));
            a
        } else {
            assert!(resp.headers().get("x-ratelimit-remaining").is_none());
            let a = announced_by(&resp, "w0");
            assert_eq!(a.window, Some(Duration::from_secs(60)));
            assert_eq!(
                announced_by(&resp, "w1").remaining,
                1000 - (n as u64 + 1).min(5)
            );
            a
        };
        assert_eq!(announced.remaining, remaining, "answer {n}");
        // Rounded up: never earlier than the truth, and not much later.
        let to_reset = 60_000 - crate::clock::Clock::system().now_ms() % 60_000;
        assert!(announced.reset + Duration::from_millis(50) >= Duration::from_millis(to_reset));
        assert!(announced.reset <= Duration::from_millis(to_reset + 1050));
    }
    // The capacity refused the fifth call, the windows the sixth.
    assert_eq!(statuses, [200, 404, 503, 200, 429, 429]);
    assert_eq!((api.window_refusals(), api.rejected_429()), (1, 1));
    assert_eq!(api.window_peaks(), [5, 5]);
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_never_exceed_a_window() {
    const LIMIT: u64 = 15;
    const TASKS: usize = 6;
    let config = ApiConfig {
        windows: vec![window(LIMIT, 500), window(25, 1000)],
        ..ApiConfig::fast()
    };
    let api = FakeApi::start(config).await.unwrap();
    let c = client();
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let (c, api) = (c.clone(), api.clone());
        tasks.spawn(async move {
            let (mut ok, mut refused) = (0u64, 0u64);
            let deadline = Instant::now() + Duration::from_millis(1600);
            let mut n = 0;
            while Instant::now() < deadline {
                let resp = c
                    .get(item_url(&api, &format!("t{t}-{n}")))
                    .send()
                    .await
                    .unwrap();
                match resp.status().as_u16() {
                    200 => ok += 1,
                    429 => {
                        assert_eq!(resp.headers()[RETRY_AFTER], "1");
                        refused += 1;
                    }
                    other => panic!("status {other}"),
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (ok, refused)
        });
    }
    let (mut ok, mut refused) = (0, 0);
    while let Some(res) = tasks.join_next().await {
        let (o, r) = res.unwrap();
        ok += o;
        refused += r;
    }
    // Every window filled (the offered load is far above both limits), none beyond.
    assert_eq!(api.window_peaks(), [LIMIT, 25]);
    assert_eq!(api.window_refusals(), refused);
    assert_eq!(api.accepted(), ok);
    assert!(refused > ok, "{ok} accepted, {refused} refused");
    // At most two one-second windows and a part of a third were crossed.
    assert!(ok <= 3 * 25, "{ok} accepted");
    api.shutdown().await;
}
