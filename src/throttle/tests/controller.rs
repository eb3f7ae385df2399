//! Tests of the control law: the pushback filter, the rate controller's steps and floor.

use super::super::controller::*;
use std::time::Duration;

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

/// A client starved of CPU (a loaded machine) sends in bursts after each stall, and a
/// `limit_req` with a small burst allowance refuses a large share of them at any average
/// rate, so what it accepts falls with what is sent after a cut, as with a flaky API. A share
/// that large (here 60%) is never learned: the rate stays cut.
#[test]
fn a_large_share_refused_after_a_cut_is_never_learned() {
    let tick = Duration::from_millis(200);
    let mut filter = PushbackFilter::default();
    // Sent 290/s, accepted 115/s: acted on.
    for _ in 0..10 {
        filter.filter(tick, 58, 35);
    }
    // Cut: sent 150/s, accepted 60/s, the same share refused.
    for _ in 0..20 {
        filter.filter(tick, 30, 18);
    }
    assert_eq!(filter.tolerated(), TOLERATED_PUSHBACK);
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

/// Latency that rises while the API pushes nothing back brakes a little each tick, never
/// down to what the tick accepted: a run bound by its concurrency accepts less when latency
/// rises however much rate it has left (a fleet worker's 200/s share once fell to 6/s so).
#[test]
fn rising_latency_alone_brakes_gently_not_to_what_was_accepted() {
    let mut c = RateController::new(ControlSettings::new(2.0, 200.0), 200.0);
    let tick = |attempts, ms| TickSignals {
        elapsed: Duration::from_millis(200),
        attempts,
        pushback: 0,
        min_latency: Some(Duration::from_millis(ms)),
    };
    c.update(&tick(30, 100));
    // Four times the latency, and one answer in the tick (a worker just starting).
    let after = c.update(&tick(1, 400));
    assert!(after < 200.0, "it brakes: {after}");
    assert!(after >= 0.95 * 200.0, "gently: {after}");
    // A second of it: about 10% less, not the 5/s accepted.
    for _ in 0..4 {
        c.update(&tick(1, 400));
    }
    assert!(c.rate > 150.0 && c.rate < 200.0, "{}", c.rate);
    // Pushback still cuts towards what was accepted.
    let cut = c.update(&TickSignals {
        pushback: 10,
        ..tick(20, 100)
    });
    assert!(cut < 0.6 * 200.0, "pushback cuts: {cut}");
}

/// A worker of a fleet that cuts its rate sees what it is accepted fall with what it sends:
/// the other workers take the capacity it left. Its refusals then look like an API refusing
/// a share at any rate. Answered 503, that share is learned (a flaky API); answered 429 ("too
/// many requests"), never: the filter keeps acting on it.
#[test]
fn refusals_answered_429_are_never_learned_as_the_apis_weather() {
    let tick = Duration::from_millis(200);
    for (too_many, learned) in [(false, true), (true, false)] {
        let mut filter = PushbackFilter::default();
        let mut feed = |attempts: u64, refused: u64| {
            let of_them_429 = if too_many { refused } else { 0 };
            filter.filter_with_429s(tick, attempts, refused, of_them_429)
        };
        // Sent 100/s, 10% refused: acted on.
        for _ in 0..10 {
            assert!(feed(20, 2) > 0 || !too_many);
        }
        // Cut to half: accepted fell with it, 10% still refused.
        let mut acted = 0;
        for _ in 0..20 {
            if feed(10, 1) > 0 {
                acted += 1;
            }
        }
        assert_eq!(
            filter.tolerated() > TOLERATED_PUSHBACK,
            learned,
            "429s: {too_many}, tolerated {}",
            filter.tolerated()
        );
        if too_many {
            assert!(acted >= 10, "acted on {acted} of 20 ticks of 10% 429s");
        }
    }
}
