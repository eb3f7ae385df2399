use std::time::Duration;

use tokio_postgres::Client;

use crate::store::postgres::keys::{JobId, WorkerId};
use crate::store::postgres::session::*;
use crate::store::postgres::test_db::{add_buckets, expire, with_job, worker};
use crate::store::Log;
use rand::{Rng, SeedableRng};

const TTL: Duration = Duration::from_secs(30);

async fn beat(client: &mut Client, job: JobId, me: &WorkerId) -> Heartbeat {
    heartbeat(client, job, me, TTL, &serde_json::json!({"ok": 1}), false)
        .await
        .unwrap()
}

fn share(h: &Heartbeat) -> f64 {
    match h {
        Heartbeat::Renewed(g) => g.rate_share.unwrap(),
        Heartbeat::Expired => panic!("expected a renewal"),
    }
}

/// The live sessions' shares, summed.
async fn live_sum(client: &Client, job: JobId) -> f64 {
    client
        .query_one(
            "SELECT coalesce(sum(rate_share), 0) FROM hw_worker
             WHERE job_id = $1 AND expires_at > clock_timestamp()",
            &[&job.0],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_heartbeat_renews_in_database_time_and_stores_stats() {
    let (_db, mut client, job) = with_job().await;
    let me = worker(&client, job).await;
    assert!(matches!(
        beat(&mut client, job, &me).await,
        Heartbeat::Renewed(_)
    ));
    let row = client
        .query_one(
            "SELECT extract(epoch FROM expires_at - heartbeat_at)::float8, stats
             FROM hw_worker WHERE worker_id = $1::text::uuid",
            &[&me.0],
        )
        .await
        .unwrap();
    let ttl: f64 = row.get(0);
    assert!(
        (30.0..31.0).contains(&ttl),
        "expires_at = heartbeat_at + ttl, got {ttl}"
    );
    assert_eq!(
        row.get::<_, serde_json::Value>(1),
        serde_json::json!({"ok": 1})
    );
}

#[tokio::test]
async fn a_heartbeat_after_expiry_says_so_and_renews_nothing() {
    let (_db, mut client, job) = with_job().await;
    let me = worker(&client, job).await;
    expire(&client, job, &me).await;
    assert_eq!(beat(&mut client, job, &me).await, Heartbeat::Expired);
    let alive: bool = client
        .query_one(
            "SELECT expires_at > now() FROM hw_worker WHERE worker_id = $1::text::uuid",
            &[&me.0],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!alive, "an expired session stays expired");
    assert!(
        !in_transaction(&client).await,
        "a heartbeat ends its transaction"
    );
    let unknown = WorkerId("00000000-0000-0000-0000-000000000000".into());
    assert_eq!(beat(&mut client, job, &unknown).await, Heartbeat::Expired);
    assert!(!in_transaction(&client).await);
}

/// Whether `client`'s connection is inside a transaction: a savepoint can be set only there.
async fn in_transaction(client: &Client) -> bool {
    let inside = client.batch_execute("SAVEPOINT hw_probe").await.is_ok();
    if inside {
        client
            .batch_execute("RELEASE SAVEPOINT hw_probe")
            .await
            .unwrap();
    }
    inside
}

#[tokio::test]
async fn a_renewal_is_one_transaction_ended_on_its_connection() {
    let (db, mut client, job) = with_job().await;
    let me = worker(&client, job).await;
    assert!(matches!(
        beat(&mut client, job, &me).await,
        Heartbeat::Renewed(_)
    ));
    assert!(!in_transaction(&client).await, "committed, not left open");
    // The renewal is durable: another connection sees it.
    let other = db.connect().await;
    let stats: serde_json::Value = other
        .query_one(
            "SELECT stats FROM hw_worker WHERE worker_id = $1::text::uuid",
            &[&me.0],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stats, serde_json::json!({"ok": 1}));
}

#[tokio::test]
async fn shares_come_from_free_capacity_and_converge_to_fair() {
    let (_db, mut client, job) = with_job().await;
    let a = worker(&client, job).await;
    assert_eq!(share(&beat(&mut client, job, &a).await), 100.0);
    let b = worker(&client, job).await;
    // Fair is 50, but A still holds 100: nothing is free yet.
    assert_eq!(share(&beat(&mut client, job, &b).await), 0.0);
    assert_eq!(share(&beat(&mut client, job, &a).await), 50.0);
    assert_eq!(share(&beat(&mut client, job, &b).await), 50.0);
    // A crashed session's share frees with the session.
    expire(&client, job, &a).await;
    assert_eq!(share(&beat(&mut client, job, &b).await), 100.0);
    // Draining gives the share back at once.
    let c = worker(&client, job).await;
    drain(&client, job, &b).await.unwrap();
    match beat(&mut client, job, &b).await {
        Heartbeat::Renewed(g) => {
            assert!(g.draining);
            assert_eq!(g.rate_share, Some(0.0));
            assert_eq!(g.burst, Some(0));
        }
        Heartbeat::Expired => panic!("draining is not expired"),
    }
    match beat(&mut client, job, &c).await {
        Heartbeat::Renewed(g) => {
            assert_eq!(g.rate_share, Some(100.0));
            assert_eq!(g.burst, Some(10));
        }
        Heartbeat::Expired => panic!("c is live"),
    }
}

#[tokio::test]
async fn shares_never_sum_above_the_rate_as_workers_join_beat_drain_and_expire() {
    let (db, mut client, job) = with_job().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut live: Vec<WorkerId> = Vec::new();
    for step in 0..300 {
        match rng.random_range(0..10) {
            0 | 1 => live.push(worker(&client, job).await),
            2 if !live.is_empty() => {
                let w = live.swap_remove(rng.random_range(0..live.len()));
                expire(&client, job, &w).await;
            }
            3 if !live.is_empty() => {
                let w = &live[rng.random_range(0..live.len())];
                drain(&client, job, w).await.unwrap();
            }
            _ if !live.is_empty() => {
                let w = live[rng.random_range(0..live.len())].clone();
                beat(&mut client, job, &w).await;
            }
            _ => {}
        }
        let sum = live_sum(&client, job).await;
        assert!(sum <= 100.0 + 1e-9, "step {step}: shares sum to {sum}");
    }
    // Concurrent heartbeats of many workers, from their own connections.
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let mut c = db.connect().await;
        let me = worker(&c, job).await;
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                heartbeat(&mut c, job, &me, TTL, &serde_json::json!({}), false)
                    .await
                    .unwrap();
            }
        }));
    }
    let watcher = db.connect().await;
    for t in tasks {
        let sum = live_sum(&watcher, job).await;
        assert!(sum <= 100.0 + 1e-9, "shares sum to {sum}");
        t.await.unwrap();
    }
    assert!(live_sum(&watcher, job).await <= 100.0 + 1e-9);
}

#[tokio::test]
async fn a_pause_is_shared_and_never_shortened() {
    let (_db, mut client, job) = with_job().await;
    let a = worker(&client, job).await;
    let left = crate::store::postgres::rate::pause(&client, job, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(left > Duration::from_secs(50) && left <= Duration::from_secs(60));
    let shorter = crate::store::postgres::rate::pause(&client, job, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        shorter > Duration::from_secs(50),
        "a shorter pause does not shorten it"
    );
    match beat(&mut client, job, &a).await {
        Heartbeat::Renewed(g) => {
            let p = g.paused_for.expect("paused");
            assert!(p > Duration::from_secs(50) && p <= Duration::from_secs(60));
        }
        Heartbeat::Expired => panic!("a is live"),
    }
}

#[tokio::test]
async fn a_lower_rate_resets_every_share() {
    let (_db, mut client, job) = with_job().await;
    let a = worker(&client, job).await;
    assert_eq!(share(&beat(&mut client, job, &a).await), 100.0);
    crate::store::postgres::rate::set_rate(&mut client, job, Some(10.0), Some(2))
        .await
        .unwrap();
    assert_eq!(live_sum(&client, job).await, 0.0);
    assert_eq!(share(&beat(&mut client, job, &a).await), 10.0);
}

#[tokio::test]
async fn ending_a_session_releases_its_leases_and_deletes_it() {
    let (_db, mut client, job) = with_job().await;
    add_buckets(&client, job, 3).await;
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    crate::store::postgres::buckets::acquire(&client, job, &a, Log::Job, 2)
        .await
        .unwrap();
    assert!(
        crate::store::postgres::planner::acquire_planner(&client, job, &a)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(end(&client, job, &a).await.unwrap(), 2);
    assert_eq!(beat(&mut client, job, &a).await, Heartbeat::Expired);
    let got = crate::store::postgres::buckets::acquire(&client, job, &b, Log::Job, 10)
        .await
        .unwrap();
    assert_eq!(got.len(), 3, "released buckets are open at once");
    assert!(
        crate::store::postgres::planner::acquire_planner(&client, job, &b)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn an_idle_worker_gives_its_share_to_the_busy_ones() {
    let (_db, mut client, job) = with_job().await;
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    assert_eq!(share(&beat(&mut client, job, &a).await), 50.0);
    assert_eq!(share(&beat(&mut client, job, &b).await), 50.0);
    // B has no bucket left: its next heartbeat gives its share back, and A's fair
    // share is the whole rate.
    let h = heartbeat(&mut client, job, &b, TTL, &serde_json::json!({}), true)
        .await
        .unwrap();
    assert_eq!(share(&h), 0.0);
    assert_eq!(share(&beat(&mut client, job, &a).await), 100.0);
    assert!(live_sum(&client, job).await <= 100.0 + 1e-9);
    // Work again: B asks for its part and gets it as A gives up its excess.
    assert_eq!(share(&beat(&mut client, job, &b).await), 0.0);
    assert_eq!(share(&beat(&mut client, job, &a).await), 50.0);
    assert_eq!(share(&beat(&mut client, job, &b).await), 50.0);
}
