//! The throttle's unit tests: the rate limiter's schedule and bursts, the control law and
//! its pushback filter, adaptive concurrency, and outage detection with its probes.

use std::num::NonZeroU32;

use super::controller::*;
use super::outage::*;
use super::rate::*;
use super::*;
use crate::failure::{ErrorClass, Failure, Next};
use crate::handler::Output;

/// Ticks of 200 ms with `attempts` each and pushback at a steady `share` (carried over
/// between ticks, so the counts are whole): how many ticks the filter calls overloaded.
fn overloaded_ticks(ticks: usize, attempts: u64, share: f64) -> usize {
    let mut filter = PushbackFilter::default();
    let mut owed = 0.0;
    (0..ticks)
        .filter(|_| {
            owed += attempts as f64 * share;
            let pushback = owed.floor() as u64;
            owed -= pushback as f64;
            filter.filter(Duration::from_millis(200), attempts, pushback) > 0
        })
        .count()
}

#[test]
fn a_steady_few_percent_of_pushback_is_not_overload_at_any_volume() {
    for attempts in [2, 5, 20, 150, 2_000] {
        assert_eq!(
            overloaded_ticks(200, attempts, 0.02),
            0,
            "{attempts} attempts a tick"
        );
    }
}

#[test]
fn an_api_refusing_what_is_too_much_is_overloaded_at_once_and_while_it_refuses() {
    let mut filter = PushbackFilter::default();
    // nginx limit_req at 200/s against 2,000/s: nine in ten refused, from the first tick.
    assert_eq!(filter.filter(Duration::from_millis(200), 400, 360), 360);
    // A share a few times the tolerated one counts too, at every volume but a handful.
    for attempts in [50, 150, 2_000] {
        assert!(overloaded_ticks(50, attempts, 0.10) >= 40, "{attempts}");
    }
    // One refusal among a second's worth of 20 attempts is no evidence; three are.
    let mut filter = PushbackFilter::default();
    for _ in 0..10 {
        filter.filter(Duration::from_millis(200), 4, 0);
    }
    assert_eq!(filter.filter(Duration::from_millis(200), 4, 1), 0);
    let mut filter = PushbackFilter::default();
    for _ in 0..10 {
        filter.filter(Duration::from_millis(200), 4, 0);
    }
    assert!(filter.filter(Duration::from_millis(200), 4, 3) > 0);
}

/// The demo's API answers 503 to 2% of IDs once: before the filter, every tick had a
/// refusal and the controller ground the rate from ~700/s down to a few per second.
#[test]
fn the_rate_holds_against_an_api_that_refuses_a_steady_two_percent() {
    let tick = Duration::from_millis(200);
    let mut filter = PushbackFilter::default();
    let mut controller = RateController::new(ControlSettings::new(0.1, 10_000.0), 700.0);
    let mut owed = 0.0;
    for _ in 0..300 {
        // The job can use at most 700/s (its concurrency over the API's latency).
        let attempts = (controller.rate.min(700.0) * tick.as_secs_f64()).round() as u64;
        owed += attempts as f64 * 0.02;
        let pushback = owed.floor() as u64;
        owed -= pushback as f64;
        controller.update(&TickSignals {
            elapsed: tick,
            attempts,
            pushback: filter.filter(tick, attempts, pushback),
            min_latency: Some(Duration::from_millis(20)),
        });
    }
    assert!(controller.rate >= 700.0, "rate {}", controller.rate);
}

/// An API that refuses a steady share at any rate, above the base tolerance (the crash
/// tests' flaky API: 3% of IDs answer 503 twice and 1% time out twice, about 6% of attempts):
/// before the filter learned, the rate was cut tick after tick down to its floor and a job
/// crawled at 1 item/s. Now the first cuts show that the refusals fall with the rate and
/// what is accepted falls too; the share is learned and the rate climbs back.
#[test]
fn a_share_refused_at_any_rate_is_learned_and_the_rate_climbs_back() {
    for share in [0.06, 0.12] {
        let tick = Duration::from_millis(200);
        let mut filter = PushbackFilter::default();
        let mut controller = RateController::new(ControlSettings::new(1.0, 10_000.0), 700.0);
        let mut owed = 0.0;
        let mut lowest = f64::MAX;
        for _ in 0..600 {
            // The job can use at most 700/s (its concurrency over the API's latency).
            let attempts = (controller.rate.min(700.0) * tick.as_secs_f64()).round() as u64;
            owed += attempts as f64 * share;
            let pushback = owed.floor() as u64;
            owed -= pushback as f64;
            controller.update(&TickSignals {
                elapsed: tick,
                attempts,
                pushback: filter.filter(tick, attempts, pushback),
                min_latency: Some(Duration::from_millis(20)),
            });
            lowest = lowest.min(controller.rate);
        }
        assert!(
            filter.tolerated() > share,
            "{share}: learned {}",
            filter.tolerated()
        );
        assert!(
            lowest >= 0.3 * 700.0,
            "{share}: the rate fell to {lowest:.1}/s"
        );
        assert!(
            controller.rate >= 700.0,
            "{share}: rate {:.1}/s",
            controller.rate
        );
    }
}

/// An API at its capacity (nginx's `limit_req`) refuses the excess: cutting the rate leaves
/// what it accepts where it was, so its refusals are never learned as the API's weather,
/// however far above or just above its capacity the job starts.
#[test]
fn an_api_at_its_capacity_is_never_learned_as_refusing_at_any_rate() {
    let tick = Duration::from_millis(200);
    for (start, capacity) in [(2_000.0, 200.0), (210.0, 200.0), (5_000.0, 1_000.0)] {
        let mut filter = PushbackFilter::default();
        let mut controller = RateController::new(ControlSettings::new(1.0, 10_000.0), start);
        let (mut attempted, mut accepted) = (0.0, 0.0);
        for t in 0..600 {
            let attempts = (controller.rate * tick.as_secs_f64()).round() as u64;
            let room = (capacity * tick.as_secs_f64()).round() as u64;
            let refused = attempts.saturating_sub(room);
            if t >= 300 {
                attempted += attempts as f64;
                accepted += (attempts - refused) as f64;
            }
            controller.update(&TickSignals {
                elapsed: tick,
                attempts,
                pushback: filter.filter(tick, attempts, refused),
                min_latency: Some(Duration::from_millis(20)),
            });
        }
        assert_eq!(
            filter.tolerated(),
            TOLERATED_PUSHBACK,
            "{start} against {capacity}"
        );
        let goodput = accepted / (300.0 * tick.as_secs_f64()) / capacity;
        let refused = 1.0 - accepted / attempted;
        assert!(
            goodput >= 0.9,
            "{start} against {capacity}: goodput {goodput:.3}"
        );
        assert!(
            refused <= 0.05,
            "{start} against {capacity}: {:.1}% refused",
            refused * 100.0
        );
    }
}

#[test]
fn rates_parse() {
    assert_eq!("50".parse::<Rate>().unwrap().per_second(), 50.0);
    assert_eq!("50/s".parse::<Rate>().unwrap().per_second(), 50.0);
    assert_eq!("3000/min".parse::<Rate>().unwrap().per_second(), 50.0);
    assert_eq!("0.5/s".parse::<Rate>().unwrap().per_second(), 0.5);
    assert_eq!("7200/h".parse::<Rate>().unwrap().per_second(), 2.0);
    for bad in ["", "0", "-1", "x/s", "5/fortnight", "inf", "NaN"] {
        assert!(bad.parse::<Rate>().is_err(), "{bad}");
    }
}

/// A simulated API that accepts `capacity` requests per second and refuses the rest.
fn tick(rate: f64, capacity: f64) -> TickSignals {
    let attempts = rate.round() as u64;
    let refused = (rate - capacity).max(0.0).round() as u64;
    TickSignals {
        elapsed: Duration::from_secs(1),
        attempts,
        pushback: refused.min(attempts),
        min_latency: Some(Duration::from_millis(10)),
    }
}

#[test]
fn the_rate_settles_just_under_capacity_and_follows_steps() {
    let mut c = RateController::new(ControlSettings::new(1.0, 2000.0), 2000.0);
    for (capacity, label) in [(500.0, "down"), (1500.0, "up"), (200.0, "down again")] {
        let mut accepted = 0.0;
        let mut attempted = 0.0;
        for t in 0..60 {
            let s = tick(c.rate, capacity);
            if t >= 20 {
                attempted += s.attempts as f64;
                accepted += (s.attempts - s.pushback) as f64;
            }
            c.update(&s);
        }
        let goodput = accepted / 40.0 / capacity;
        let refused = 1.0 - accepted / attempted;
        assert!(goodput >= 0.9, "{label}: goodput {goodput:.3} of capacity");
        assert!(refused <= 0.05, "{label}: {:.1}% refused", refused * 100.0);
    }
}

#[test]
fn rising_latency_brakes_and_the_floor_holds() {
    let mut c = RateController::new(ControlSettings::new(5.0, 100.0), 100.0);
    let fast = TickSignals {
        elapsed: Duration::from_secs(1),
        attempts: 100,
        pushback: 0,
        min_latency: Some(Duration::from_millis(10)),
    };
    c.update(&fast);
    let slow = TickSignals {
        min_latency: Some(Duration::from_millis(100)),
        ..fast
    };
    let before = c.rate;
    assert!(c.update(&slow) < before);
    // Jitter far below a millisecond on a fast API is not the API slowing down.
    let mut c = RateController::new(ControlSettings::new(5.0, 200.0), 100.0);
    let quick = |us| TickSignals {
        min_latency: Some(Duration::from_micros(us)),
        ..fast
    };
    c.update(&quick(200));
    let before = c.rate;
    assert!(
        c.update(&quick(2_000)) > before,
        "2 ms after 0.2 ms still climbs"
    );
    let before = c.rate;
    assert!(
        c.update(&quick(20_000)) < before,
        "20 ms after 0.2 ms brakes"
    );
    for _ in 0..200 {
        c.update(&TickSignals {
            pushback: 100,
            ..fast
        });
    }
    assert_eq!(c.rate, 5.0);
}

#[test]
fn the_granted_burst_keeps_room_for_arrival_jitter() {
    let g = |rate: f64, burst: u32| granted_burst(rate, NonZeroU32::new(burst).unwrap()).get();
    assert_eq!(g(2000.0, 20), 10, "5 ms at 2000/s is 10 requests");
    assert_eq!(g(200.0, 20), 19);
    assert_eq!(g(100.0, 1), 1, "never below one");
    assert_eq!(g(2000.0, 5), 1);
    assert_eq!(g(10.0, 3), 2);
}

#[test]
fn the_default_burst_is_two_at_low_rates_and_about_5_ms_at_high_ones() {
    let d = |rate: f64| default_grants(rate).get();
    assert_eq!(d(0.1), 2);
    assert_eq!(d(5.0), 2);
    assert_eq!(d(50.0), 2);
    assert_eq!(d(300.0), 3);
    assert_eq!(d(2000.0), 12);
    assert_eq!(d(20000.0), 102);
    assert_eq!(d(UNLIMITED), 1);
}

/// A waiter that sleeps until each grant is due and wakes late by up to `late`, then
/// hands over to the next (who finds the next grant due or not), driving `s` until
/// `until`. The grant times, from `t0`.
fn drive(
    s: &mut Schedule,
    t0: tokio::time::Instant,
    from: Duration,
    until: Duration,
    late: Duration,
    rng: &mut rand::rngs::StdRng,
) -> Vec<Duration> {
    use rand::Rng;
    let mut now = t0 + from;
    let mut grants = Vec::new();
    while now < t0 + until {
        match s.grant(now) {
            Ok(()) => {
                grants.push(now - t0);
                // The hand-over to the next waiter.
                now += Duration::from_micros(2);
            }
            Err(due) => {
                // Timers fire on a 1 ms tick, and later on a busy machine.
                let ms = (due - t0).as_nanos().div_ceil(1_000_000) as u32;
                let rounded = Duration::from_millis(1) * ms;
                let extra = late.mul_f64(rng.random::<f64>());
                now = (t0 + rounded + extra).max(due);
            }
        }
    }
    grants
}

/// The most of `times` (sorted) within any half-open window `[t, t + w)`.
fn most_in(times: &[Duration], w: Duration) -> usize {
    let (mut most, mut a) = (0, 0);
    for b in 0..times.len() {
        while times[b] - times[a] >= w {
            a += 1;
        }
        most = most.max(b - a + 1);
    }
    most
}

/// Arrivals at the API: each grant delayed on its way by up to [`SEND_JITTER`].
fn arrivals(grants: &[Duration], rng: &mut rand::rngs::StdRng) -> Vec<Duration> {
    use rand::Rng;
    let mut a: Vec<Duration> = grants
        .iter()
        .map(|g| *g + SEND_JITTER.mul_f64(rng.random::<f64>()))
        .collect();
    a.sort_unstable();
    a
}

fn assert_within_bounds(rate: f64, arrivals: &[Duration], what: &str) {
    let s1 = most_in(arrivals, Duration::from_secs(1));
    let s01 = most_in(arrivals, Duration::from_millis(100));
    assert!(
        s1 as f64 <= 1.01 * rate + 2.0,
        "{what}: {s1} in a second at {rate}/s"
    );
    assert!(
        s01 as f64 <= 0.1 * rate + (0.01 * rate).max(2.0) + 1.0,
        "{what}: {s01} in 100 ms at {rate}/s"
    );
}

#[test]
fn late_wake_ups_cost_no_rate_and_the_api_never_sees_more_than_the_bound() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    for rate in [0.1, 5.0, 50.0, 300.0, 2000.0, 8000.0, 20000.0] {
        let t0 = tokio::time::Instant::now();
        let mut s = Schedule::new(rate, default_grants(rate), t0);
        let run = Duration::from_secs_f64((8.0f64).max(40.0 / rate));
        // Late by up to 2 ms beyond the 1 ms timer tick.
        let grants = drive(
            &mut s,
            t0,
            Duration::ZERO,
            run,
            Duration::from_millis(2),
            &mut rng,
        );
        assert_eq!(grants[0], Duration::ZERO, "the first request goes at once");
        let achieved = grants.len() as f64 / (grants.last().unwrap().as_secs_f64() + 1.0 / rate);
        assert!(
            achieved >= 0.99 * rate,
            "{rate}/s: achieved {:.4} of R",
            achieved / rate
        );
        assert_within_bounds(rate, &arrivals(&grants, &mut rng), &format!("{rate}/s"));
        // A stall far past the tolerance loses rate, but never breaks the bound.
        let stalled = drive(
            &mut s,
            t0,
            run + Duration::from_millis(300),
            run * 2,
            Duration::from_millis(2),
            &mut rng,
        );
        let all: Vec<Duration> = grants.iter().chain(&stalled).copied().collect();
        assert_within_bounds(
            rate,
            &arrivals(&all, &mut rng),
            &format!("{rate}/s, stalled"),
        );
    }
}

#[test]
fn after_a_rate_change_the_new_rate_holds_within_a_second_without_a_burst() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let steps = [2000.0, 1000.0, 8000.0, 300.0, 20000.0, 50.0, 5000.0];
    let t0 = tokio::time::Instant::now();
    let mut s = Schedule::new(steps[0], default_grants(steps[0]), t0);
    let step = Duration::from_secs(3);
    let late = Duration::from_millis(2);
    let mut all = Vec::new();
    for (i, &rate) in steps.iter().enumerate() {
        let from = step * i as u32;
        if i > 0 {
            s.set_rate(rate, default_grants(rate), t0 + from);
        }
        let grants = drive(&mut s, t0, from, from + step, late, &mut rng);
        let first_second = grants
            .iter()
            .filter(|g| **g < from + Duration::from_secs(1))
            .count() as f64;
        assert!(
            (first_second - rate).abs() <= 0.02 * rate + 1.0,
            "{rate}/s after a change: {first_second} in the first second"
        );
        all.extend(grants);
    }
    // Around every change, no more than the higher of the two rates allows.
    let arrivals = arrivals(&all, &mut rng);
    for (i, pair) in steps.windows(2).enumerate() {
        let change = step * (i as u32 + 1);
        let near: Vec<Duration> = arrivals
            .iter()
            .copied()
            .filter(|a| {
                *a + Duration::from_secs(1) > change && *a < change + Duration::from_secs(1)
            })
            .collect();
        assert_within_bounds(
            pair[0].max(pair[1]),
            &near,
            &format!("change to {}", pair[1]),
        );
    }
}

/// The adaptive controller changes the rate every tick (200 ms), by up to 10% up or by a
/// cut down: from every change on, the grants of the next second are what the rates in
/// force over that second allow, within 2% (issue 18: "after a change, the achieved rate
/// follows the new value within 2% within one second").
#[test]
fn under_a_rate_changed_every_tick_each_second_grants_what_its_rates_allow() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(1818);
    let tick = Duration::from_millis(200);
    let ticks = 100;
    // A controller's path: climbs of up to 10% a tick, cuts to 60-90%, in [300, 20000].
    let mut rates = vec![2000.0];
    for _ in 1..ticks {
        let last: f64 = *rates.last().unwrap();
        let next = if rng.random::<f64>() < 0.2 {
            last * rng.random_range(0.6..0.9)
        } else {
            last * rng.random_range(1.0..1.1)
        };
        rates.push(next.clamp(300.0, 20000.0));
    }
    let t0 = tokio::time::Instant::now();
    let mut s = Schedule::new(rates[0], default_grants(rates[0]), t0);
    let mut grants = Vec::new();
    for (k, &rate) in rates.iter().enumerate() {
        let from = tick * k as u32;
        if k > 0 {
            s.set_rate(rate, default_grants(rate), t0 + from);
        }
        let late = Duration::from_millis(2);
        grants.extend(drive(&mut s, t0, from, from + tick, late, &mut rng));
    }
    let per_tick = tick.as_secs_f64();
    let second = (1.0 / tick.as_secs_f64()).round() as usize;
    for k in 1..=ticks - second {
        let from = tick * k as u32;
        let until = from + Duration::from_secs(1);
        let allowed: f64 = rates[k..k + second].iter().map(|r| r * per_tick).sum();
        let granted = grants.iter().filter(|g| **g >= from && **g < until).count() as f64;
        assert!(
            (granted - allowed).abs() <= 0.02 * allowed + 1.0,
            "the second after the change at {from:?} to {:.0}/s: {granted} granted, {allowed:.0} allowed",
            rates[k]
        );
    }
}

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
        (failure(Http, Some(429)), Observed::Pushback),
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
