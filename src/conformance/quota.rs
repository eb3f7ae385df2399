//! Quota usage: reservations are durable when they return, concurrent ones never grant more
//! than a limit leaves, calls given back are free again, quotas of other units count apart,
//! and the ledger reads back after a crash.

use super::backend::Backend;
use crate::quota::{Quota, QuotaWant};
use crate::store::*;

pub(super) async fn quota_reservations_are_durable_and_never_exceed_a_limit<B: Backend>(b: &mut B) {
    let s = b.create();
    // Windows no test outlives: a rolling hour and the job's budget.
    let hourly: Quota = "50/1h,rolling".parse().unwrap();
    let budget: Quota = "80/job".parse().unwrap();
    let want = |quota, calls| QuotaWant::new(quota, calls);
    let now = now_ms();
    let g = s
        .reserve_quota(&[want(hourly, 30), want(budget, 30)], now)
        .await
        .unwrap();
    assert_eq!((g[0].calls, g[0].used), (30, 30));
    assert_eq!((g[1].calls, g[1].used, g[1].frees_at_ms), (30, 30, None));
    // Ten reservers at once, wanting 10 each: 20 are left of the hour, 50 of the budget.
    let racing = futures_util::future::join_all((0..10).map(|_| {
        let s = &s;
        async move {
            s.reserve_quota(&[want(hourly, 10), want(budget, 10)], now_ms())
                .await
                .unwrap()
        }
    }))
    .await;
    let (mut hour, mut job) = (0, 0);
    for g in racing {
        hour += g[0].calls;
        job += g[1].calls;
    }
    assert_eq!(hour, 20, "the hour's limit, never more");
    assert_eq!(job, 50, "what the budget left, never more");
    // No sync: a reservation is durable when it returns.
    let s = b.crash(s);
    let ledger = s.quota_ledger().await.unwrap();
    assert_eq!(ledger.used(&hourly, now_ms()), 50);
    assert_eq!(ledger.used(&budget, now_ms()), 80);
    let g = s.reserve_quota(&[want(hourly, 1)], now_ms()).await.unwrap();
    assert_eq!(g[0].calls, 0);
    assert!(g[0].frees_at_ms.is_some_and(|at| at > now));
    // Calls given back (a run ending with calls in hand) are free again, durably; a quota of
    // tokens over the same window counts apart.
    let back = QuotaWant {
        give_back: Some(crate::quota::SlotUse {
            start_ms: 0,
            used: 25,
        }),
        ..want(budget, 5)
    };
    let tokens: Quota = "1000tokens/job".parse().unwrap();
    let g = s
        .reserve_quota(&[back, want(tokens, 700)], now_ms())
        .await
        .unwrap();
    assert_eq!((g[0].calls, g[0].used), (5, 60), "25 given back, 5 taken");
    assert_eq!((g[1].calls, g[1].used), (700, 700));
    let s = b.crash(s);
    let ledger = s.quota_ledger().await.unwrap();
    assert_eq!(ledger.used(&budget, now_ms()), 60);
    assert_eq!(ledger.used(&tokens, now_ms()), 700);
}

/// The windows learnt from refusals: none kept at first; what is kept reads back whole,
/// replaced by the next keep, and outlives a crash once the store synced.
pub(super) async fn learnt_limits_are_kept_and_replaced<B: Backend>(b: &mut B) {
    use crate::quota::KeptLimit;
    let s = b.create();
    assert_eq!(s.learned_limits().await.unwrap(), Vec::new());
    let kept = |limit, length_ms| KeptLimit {
        limit,
        length_ms,
        reset_unix_ms: 1_700_000_002_000,
        refusals: 3,
        changed_unix_ms: 1_700_000_001_000,
    };
    s.keep_learned_limits(&[kept(50, 2000), kept(200, 10_000)])
        .await
        .unwrap();
    assert_eq!(
        s.learned_limits().await.unwrap(),
        vec![kept(50, 2000), kept(200, 10_000)]
    );
    s.keep_learned_limits(&[kept(45, 2000)]).await.unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    assert_eq!(s.learned_limits().await.unwrap(), vec![kept(45, 2000)]);
}
