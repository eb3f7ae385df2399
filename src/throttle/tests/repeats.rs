//! Refusals bound to IDs against refusals of the rate: the window's estimate (unit) and the
//! throttle's rate under each (the same attempts as workers make them).

use std::sync::Arc;
use std::time::Duration;

use super::super::repeats::*;
use super::super::*;

const TICK: Duration = Duration::from_millis(200);

/// A tick of `attempts`, `fresh_refused` of the fresh ones refused and `repeats` attempts of
/// IDs refused before, `repeats_refused` of them refused again.
fn tick(attempts: u64, fresh_refused: u64, repeats: u64, repeats_refused: u64) -> TickRefusals {
    TickRefusals {
        attempts,
        refused: fresh_refused + repeats_refused,
        repeats,
        repeats_refused,
    }
}

#[test]
fn ids_refused_every_time_are_not_the_rates() {
    let mut r = RepeatRefusals::default();
    // 300 attempts/s: 10% of fresh IDs refused, and their retries refused every time.
    let mut counted = 0;
    for _ in 0..100 {
        counted += r.of_the_rate(TICK, tick(60, 4, 17, 17));
    }
    assert!(
        counted <= 5,
        "{counted} of 2,100 refusals counted as the rate's"
    );
    let share = r.bound_share();
    assert!((0.08..0.14).contains(&share), "bound share {share}");
}

#[test]
fn before_the_retries_tell_only_a_large_share_counts() {
    let mut r = RepeatRefusals::default();
    // The first ticks of a run: 10% refused, no retry yet.
    assert_eq!(r.of_the_rate(TICK, tick(60, 6, 0, 0)), 0);
    assert_eq!(r.of_the_rate(TICK, tick(60, 6, 0, 0)), 0);
    // An API refusing 90% (a rate limiter at ten times its limit) counts at once.
    let mut r = RepeatRefusals::default();
    assert!(r.of_the_rate(TICK, tick(400, 360, 0, 0)) >= 250);
}

#[test]
fn unproven_refusals_count_once_the_proof_is_overdue() {
    // No retries at all (one attempt per ID): after the wait, 10% refused is the rate's.
    let mut r = RepeatRefusals::default();
    let ticks = (PROOF_WAIT.as_millis() / TICK.as_millis()) as usize;
    for _ in 0..ticks {
        assert_eq!(r.of_the_rate(TICK, tick(60, 6, 0, 0)), 0);
    }
    assert_eq!(r.of_the_rate(TICK, tick(60, 6, 0, 0)), 6);
}

#[test]
fn refusals_at_random_are_the_rates() {
    // An overloaded API: 30% of attempts refused whatever the ID, its retries alike (less,
    // as here, once the rate came down).
    let mut r = RepeatRefusals::default();
    let mut counted = 0;
    for _ in 0..50 {
        counted += r.of_the_rate(TICK, tick(100, 24, 20, 5));
    }
    assert!(counted >= 50 * 29 - 5, "{counted} of {} counted", 50 * 29);
    assert_eq!(r.bound_share(), 0.0);
}

#[test]
fn an_overload_on_top_of_refused_ids_counts_at_once() {
    let mut r = RepeatRefusals::default();
    for _ in 0..100 {
        r.of_the_rate(TICK, tick(60, 2, 8, 8));
    }
    // The API goes over its capacity: 40% of fresh attempts refused in this tick.
    let counted = r.of_the_rate(TICK, tick(60, 21, 8, 8));
    assert!(counted >= 14, "{counted} of the 19 beyond the IDs' counted");
}

fn throttle(rate: f64) -> Throttle {
    let options = ThrottleOptions {
        rate: Rate::new(rate),
        ..ThrottleOptions::default()
    };
    Throttle::new(options, Arc::new(tokio::sync::Semaphore::new(64)), 64)
}

/// Attempts as the workers charge them, over `secs`: fresh IDs at `rate` per second, the
/// `refused(i)` ones answered `observed` on every attempt and retried `retries` times.
async fn run(
    t: &Throttle,
    secs: u64,
    rate: u64,
    refused: impl Fn(u64) -> bool,
    observed: Observed,
) {
    let per_tick = rate / 5;
    let mut waiting: Vec<(ItemHistory, u32)> = Vec::new();
    let mut id = 0;
    for _ in 0..secs * 5 {
        for _ in 0..per_tick {
            id += 1;
            let h = ItemHistory::default();
            if refused(id) {
                t.charge(observed, false, &h).await;
                waiting.push((h, 4));
            } else {
                t.charge(Observed::Success(Duration::from_millis(20)), false, &h)
                    .await;
            }
        }
        // Retries of the refused IDs, refused again.
        for (h, left) in waiting.iter_mut() {
            t.charge(observed, false, h).await;
            *left -= 1;
        }
        waiting.retain(|(_, left)| *left > 0);
        t.on_tick(TICK);
    }
}

#[tokio::test]
async fn ids_answering_503_every_time_do_not_lower_the_rate() {
    for share in [3, 10] {
        let t = throttle(300.0);
        run(&t, 20, 300, |i| i % 100 < share, Observed::Pushback).await;
        assert_eq!(t.rate(), Some(300.0), "{share}% refused every time");
        assert!(t.refused_ids.load(std::sync::atomic::Ordering::Relaxed) > 0);
        // A Retry-After on such a 503 is about its ID, not for everyone.
        assert!(!t.refused_for_the_rate(Observed::Pushback));
        assert!(t.refused_for_the_rate(Observed::TooMany));
    }
}

// Paused: a timeout's verdict waits for evidence of an outage (two seconds at most).
#[tokio::test(start_paused = true)]
async fn ids_timing_out_every_time_do_not_lower_the_rate() {
    let t = throttle(300.0);
    run(&t, 20, 300, |i| i % 20 == 0, Observed::Timeout).await;
    assert_eq!(t.rate(), Some(300.0));
}

#[tokio::test]
async fn refusals_that_strike_any_id_lower_the_rate() {
    // 20% of attempts refused at random, retries alike: the rate comes down.
    let t = throttle(300.0);
    let mut h = Vec::new();
    for i in 0..20u64 * 5 {
        for j in 0..60u64 {
            let item = ItemHistory::default();
            let observed = if (i * 60 + j) % 5 == 0 {
                Observed::Pushback
            } else {
                Observed::Success(Duration::from_millis(20))
            };
            t.charge(observed, false, &item).await;
            h.push(item);
        }
        t.on_tick(TICK);
    }
    assert!(t.rate().unwrap() < 270.0, "rate {:?}", t.rate());
    assert!(t.refused_for_the_rate(Observed::Pushback));
}

#[tokio::test]
async fn a_tick_of_repeats_refused_again_is_no_overload_before_the_proof() {
    // Fresh attempts pass (a few refused); then only the refused IDs' retries are left, as at
    // the end of a job, and they are refused again. Before the tick that would prove them the
    // IDs', their Retry-After must not be taken for the whole client.
    let t = throttle(300.0);
    let refused: Vec<ItemHistory> = (0..30).map(|_| ItemHistory::default()).collect();
    for (i, h) in refused.iter().enumerate() {
        for _ in 0..9 {
            t.charge(
                Observed::Success(Duration::from_millis(20)),
                false,
                &ItemHistory::default(),
            )
            .await;
        }
        t.charge(Observed::Pushback, false, h).await;
        if i == 14 {
            t.on_tick(TICK);
        }
    }
    t.on_tick(TICK);
    for h in &refused {
        t.charge(Observed::Pushback, false, h).await;
    }
    assert!(!t.refused_for_the_rate(Observed::Pushback));
    // Fresh attempts refused beyond the allowance are the rate's at once.
    for _ in 0..30 {
        t.charge(Observed::Pushback, false, &ItemHistory::default())
            .await;
    }
    assert!(t.refused_for_the_rate(Observed::Pushback));
}
