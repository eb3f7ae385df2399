//! Tests of the throttle as the workers use it: what is pushback, outage evidence per ID,
//! waiting for grants, the fleet share and pause, and locks a panicking worker poisoned.

use super::super::controller::*;
use super::super::outage::*;
use super::super::rate::*;
use super::super::*;
use crate::failure::{ErrorClass, Failure, Next};
use crate::handler::Output;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn run_throttle(ceiling: f64, initial: f64) -> Throttle {
    let options = ThrottleOptions {
        rate: Rate::new(ceiling),
        initial_rate: Rate::new(initial),
        ..ThrottleOptions::default()
    };
    Throttle::new(options, Arc::new(tokio::sync::Semaphore::new(64)), 64)
}

/// A failure as the HTTP handler classifies it.
fn failure(class: ErrorClass, status: Option<u16>) -> Result<Output, Failure> {
    let next = match (class, status) {
        (_, Some(status)) => crate::handler::http::classify_status(status, None),
        (ErrorClass::Timeout, None) => Next::TimedOut,
        (ErrorClass::Connect | ErrorClass::Connection, None) => Next::Unreachable { after: None },
        _ => Next::Permanent,
    };
    Err(Failure {
        next,
        class,
        status,
        message: String::new(),
    })
}

fn success() -> Result<Output, Failure> {
    Ok(Output::from(
        serde_json::value::RawValue::from_string("1".into()).unwrap(),
    ))
}

#[test]
fn a_503_is_pushback_from_an_api_that_answers() {
    use ErrorClass::*;
    let with_retry_after = Err(Failure {
        next: crate::handler::http::classify_status(503, Some(Duration::from_secs(1))),
        ..failure(Http, Some(503)).unwrap_err()
    });
    for (result, observed) in [
        (failure(Http, Some(503)), Observed::Pushback),
        (with_retry_after, Observed::Pushback),
        (failure(Http, Some(529)), Observed::Pushback),
        (failure(Http, Some(429)), Observed::TooMany),
        (failure(Timeout, None), Observed::Timeout),
        (failure(Connect, None), Observed::Unreachable),
        (failure(Connection, None), Observed::Down),
        (failure(Http, Some(502)), Observed::Unreachable),
        (failure(Http, Some(500)), Observed::Down),
        (failure(Http, Some(404)), Observed::Answered),
        (success(), Observed::Success(Duration::from_millis(1))),
    ] {
        assert_eq!(
            Observed::of(&result, Duration::from_millis(1)),
            observed,
            "{result:?}"
        );
    }
    // nginx's limit_req at a tenth of the rate: a third of the attempts answered 503.
    let t = run_throttle(2000.0, 2000.0);
    for _ in 0..10 {
        for i in 0..300 {
            let result = if i % 3 == 0 {
                failure(Http, Some(503))
            } else {
                success()
            };
            let verdict = t.record(
                Observed::of(&result, Duration::from_micros(300)),
                false,
                false,
            );
            assert!(matches!(verdict, Verdict::Counted), "an answer counts");
        }
        t.on_tick(Duration::from_millis(200));
    }
    assert!(t.rate().unwrap() < 1000.0, "slowed down: {:?}", t.rate());
    // However many in a row, 503s are answers: the API is not out.
    for _ in 0..10 * OUTAGE_AFTER_FAILURES {
        t.record(
            Observed::of(&failure(Http, Some(503)), Duration::ZERO),
            false,
            false,
        );
    }
    assert_eq!(t.outage(), None);
}

#[test]
fn client_side_delay_of_some_attempts_is_not_pushback() {
    let t = run_throttle(200.0, 100.0);
    let tick = |latencies: &[(u64, usize)]| {
        for &(us, n) in latencies {
            for _ in 0..n {
                t.record(
                    Observed::of(&success(), Duration::from_micros(us)),
                    false,
                    false,
                );
            }
        }
        t.on_tick(Duration::from_millis(200));
        t.rate().unwrap()
    };
    let start = tick(&[(300, 20)]);
    // A busy machine: a quarter of the attempts waited 60 ms for our own runtime to run
    // them (a mean of 15 ms), the others took the API's 0.3 ms.
    let busy = tick(&[(300, 15), (60_000, 5)]);
    assert!(busy > start, "the rate keeps climbing: {start} -> {busy}");
    // An API that queues: every attempt is slower.
    let queueing = tick(&[(30_000, 20)]);
    assert!(queueing < busy, "the rate brakes: {busy} -> {queueing}");
}

/// Whether `charge` gives its verdict without waiting: polled once.
fn at_once(t: &Throttle, observed: Observed, history: &ItemHistory) -> Option<bool> {
    use std::future::Future;
    let charge = std::pin::pin!(t.charge(observed, false, history));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match charge.poll(&mut cx) {
        std::task::Poll::Ready(counts) => Some(counts),
        std::task::Poll::Pending => None,
    }
}

#[tokio::test]
async fn an_id_that_failed_while_others_answered_counts_its_failures_at_once() {
    let t = run_throttle(1000.0, 1000.0);
    let poisoned = ItemHistory::default();
    let answer = || t.record(Observed::Answered, false, false);
    // Its first failure waits for evidence; another ID's answer shows it its own.
    let first = t.charge(Observed::Down, false, &poisoned);
    let (counts, ()) = tokio::join!(first, async {
        tokio::task::yield_now().await;
        answer();
    });
    assert!(counts && poisoned.fails_alone());
    assert_eq!(t.evidence_waits.load(Relaxed), 1);
    // Its later failures count at once: no wait for evidence (the tail of a run, where
    // nothing else answers any more), and however many in a row, no outage.
    for _ in 0..2 * OUTAGE_AFTER_FAILURES {
        assert_eq!(at_once(&t, Observed::Down, &poisoned), Some(true));
    }
    assert_eq!(t.evidence_waits.load(Relaxed), 1);
    assert_eq!(t.outage(), None);
    // A connection refused is never the ID's doing: it waits, whatever the ID did.
    assert_eq!(at_once(&t, Observed::Unreachable, &poisoned), None);
    // An ID not shown failing still waits: it may be the API going down.
    assert_eq!(at_once(&t, Observed::Down, &ItemHistory::default()), None);
    // Twenty of those in a row are an outage: the next is free at once.
    let fresh: Vec<ItemHistory> = (0..OUTAGE_AFTER_FAILURES)
        .map(|_| ItemHistory::default())
        .collect();
    for h in &fresh[1..] {
        t.record(Observed::Down, false, h.fails_alone());
    }
    assert_eq!(at_once(&t, Observed::Down, &fresh[0]), Some(false));
    assert!(t.outage().is_some());
}

#[tokio::test]
async fn the_limiter_holds_its_rate() {
    let limiter = RateLimiter::new(Rate::new(200.0).unwrap(), None);
    let start = std::time::Instant::now();
    for _ in 0..21 {
        limiter.until_ready().await;
    }
    // 21 permits at 200/s: the first is free, the other 20 take at least 100 ms.
    assert!(
        start.elapsed() >= Duration::from_millis(95),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_one_at_a_time_and_a_change_wakes_them() {
    let limiter = Arc::new(RateLimiter::new(Rate::new(0.5).unwrap(), None));
    // The first grant is free; the next would be due in 2 s.
    limiter.until_ready().await;
    let granted = Arc::new(AtomicU64::new(0));
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (limiter, granted) = (limiter.clone(), granted.clone());
        waiters.spawn(async move {
            limiter.until_ready().await;
            granted.fetch_add(1, Relaxed);
        });
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(granted.load(Relaxed), 0, "nothing is due yet");
    let changed = std::time::Instant::now();
    limiter.set_rate(Rate::new(UNLIMITED).unwrap());
    while waiters.join_next().await.is_some() {}
    assert_eq!(granted.load(Relaxed), 8);
    assert!(
        changed.elapsed() < Duration::from_secs(1),
        "the change woke the waiters"
    );
}

fn throttle_at(rate: f64) -> Arc<Throttle> {
    let options = ThrottleOptions {
        rate: Rate::new(rate),
        ..ThrottleOptions::default()
    };
    Arc::new(Throttle::new(
        options,
        Arc::new(tokio::sync::Semaphore::new(4)),
        4,
    ))
}

/// A tick in which every one of `n` attempts got `observed`.
fn fleet_tick(throttle: &Throttle, observed: Observed, n: usize) {
    for _ in 0..n {
        let _ = throttle.record(observed, false, false);
    }
    throttle.on_tick(Duration::from_millis(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_share_is_the_ceiling_and_a_share_of_0_waits() {
    let throttle = throttle_at(600.0);
    // A newcomer: no share yet.
    throttle.follow_fleet(Some(0.0), None, None);
    let waiter = tokio::spawn({
        let t = throttle.clone();
        async move { t.before_attempt().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "a share of 0 starts nothing");
    // A lone worker's first grant is the whole rate, at once.
    throttle.follow_fleet(Some(600.0), None, None);
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("a grant releases the waiter")
        .unwrap();
    assert_eq!(throttle.rate(), Some(600.0));
    // Others joined: the share shrinks, and calm ticks never climb above it.
    throttle.follow_fleet(Some(200.0), None, None);
    assert_eq!(throttle.rate(), Some(200.0));
    for _ in 0..20 {
        fleet_tick(&throttle, Observed::Success(Duration::from_millis(1)), 10);
    }
    assert_eq!(throttle.rate(), Some(200.0));
    // Pushback brings the rate down inside the share; a larger share is a higher
    // ceiling, not a jump: the rate climbs back by the control law, up to the share.
    fleet_tick(&throttle, Observed::Pushback, 30);
    let pushed = throttle.rate().unwrap();
    assert!(pushed < 200.0, "{pushed}");
    throttle.follow_fleet(Some(300.0), None, None);
    assert_eq!(throttle.rate(), Some(pushed));
    for _ in 0..60 {
        fleet_tick(&throttle, Observed::Success(Duration::from_millis(1)), 10);
        assert!(throttle.rate().unwrap() <= 300.0);
    }
    assert_eq!(throttle.rate(), Some(300.0));
    // No fleet limit (the job has no rate): the share stops binding, the rate stays.
    throttle.follow_fleet(None, None, None);
    throttle.before_attempt().await;
}

#[test]
fn a_controller_ceiling_moves_with_the_share_and_keeps_its_floor_under_it() {
    let mut c = RateController::new(ControlSettings::new(6.0, 600.0), 600.0);
    assert_eq!(
        c.set_ceiling(200.0),
        200.0,
        "at the ceiling: follows it down"
    );
    assert_eq!(c.set_ceiling(300.0), 300.0, "and up");
    assert_eq!(
        c.set_ceiling(2.0),
        2.0,
        "the floor never lifts it above the share"
    );
    assert_eq!(c.settings.min_rate, 2.0);
    c.set_ceiling(600.0);
    assert_eq!(c.settings.min_rate, 6.0, "the floor asked for comes back");
}

#[tokio::test]
async fn a_pause_holds_every_attempt_until_it_ends() {
    let throttle = throttle_at(1000.0);
    assert!(throttle.pause_for(Duration::from_millis(300)), "news");
    assert!(
        !throttle.pause_for(Duration::from_millis(100)),
        "a shorter pause is no news"
    );
    let start = std::time::Instant::now();
    throttle.before_attempt().await;
    assert!(start.elapsed() >= Duration::from_millis(290));
    // A pause learned from the fleet holds too.
    let until = tokio::time::Instant::now() + Duration::from_millis(300);
    throttle.follow_fleet(Some(1000.0), None, Some(until));
    throttle.before_attempt().await;
    assert!(tokio::time::Instant::now() >= until);
}

/// Poison `lock` as a worker that panics while holding it would.
fn poison<T: Send>(lock: &Mutex<T>) {
    std::thread::scope(|s| {
        let _ = s
            .spawn(|| {
                let _guard = lock.lock();
                panic!("a worker panics holding the throttle's lock");
            })
            .join();
    });
    assert!(lock.is_poisoned());
}

/// The engine survives a worker's panic, so must the throttle it shares: a lock poisoned by
/// the panicking worker does not make every other worker panic in turn.
#[tokio::test]
async fn the_throttle_works_on_after_a_worker_panicked_holding_its_locks() {
    let throttle = throttle_at(600.0);
    poison(&throttle.controller);
    poison(&throttle.pushback_filter);
    poison(&throttle.outage);
    poison(&throttle.fleet);
    throttle.follow_fleet(Some(300.0), None, None);
    assert!(throttle.pause_for(Duration::from_millis(1)));
    let probe = tokio::time::timeout(Duration::from_secs(5), throttle.before_attempt())
        .await
        .expect("an attempt may start");
    assert!(!probe);
    assert!(
        throttle
            .charge(Observed::Answered, probe, &ItemHistory::default())
            .await
    );
    fleet_tick(&throttle, Observed::Pushback, 10);
    assert_eq!(throttle.outage(), None);
    assert!(throttle.rate().unwrap() < 300.0, "{:?}", throttle.rate());
}

/// A worker back from idle in a fleet takes nothing of what the API announces until the
/// others count it again (`JOIN_SETTLE` after it leased); alone, or for the same return
/// told twice, it is not held (again).
#[tokio::test(start_paused = true)]
async fn a_return_from_idle_holds_the_rejoin_gate_until_the_others_count_it() {
    use crate::quota::pacer::JOIN_SETTLE;
    let throttle = throttle_at(600.0);
    // Alone: no one else divided the windows.
    throttle.count_fleet(1);
    throttle.follow_rejoin(Some(tokio::time::Instant::now()));
    let start = tokio::time::Instant::now();
    throttle.rejoin_gate().await;
    assert_eq!(start.elapsed(), Duration::ZERO, "alone: not held");
    // Idle again, then back, with two others.
    tokio::time::sleep(Duration::from_millis(10)).await;
    throttle.count_fleet(3);
    let back = tokio::time::Instant::now();
    throttle.follow_rejoin(Some(back));
    let gate = tokio::spawn({
        let t = throttle.clone();
        async move { t.rejoin_gate().await }
    });
    tokio::time::sleep(JOIN_SETTLE - Duration::from_millis(1)).await;
    assert!(!gate.is_finished(), "held until the others count it");
    gate.await.unwrap();
    assert!(back.elapsed() >= JOIN_SETTLE);
    // The same return, told again by the next look at the fleet: not held again.
    throttle.follow_rejoin(Some(back));
    let again = tokio::time::Instant::now();
    throttle.rejoin_gate().await;
    assert_eq!(again.elapsed(), Duration::ZERO);
    // No return from idle at all: never held.
    throttle.follow_rejoin(None);
    throttle.rejoin_gate().await;
    assert_eq!(again.elapsed(), Duration::ZERO);
    // The fleet's own gate (pause, share) never waits for a return from idle.
    tokio::time::sleep(Duration::from_millis(10)).await;
    throttle.follow_rejoin(Some(tokio::time::Instant::now()));
    throttle.fleet_gate().await;
    assert_eq!(again.elapsed(), Duration::from_millis(10));
}
