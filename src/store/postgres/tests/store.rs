use std::time::{Duration, Instant};

use crate::store::postgres::test_db::{add_buckets, expire, migrated};
use crate::store::postgres::{PgOpen, PgStore};
use crate::store::Log;

/// A worker stopped in the middle of a transaction (SIGSTOP, a partition) holds
/// its bucket rows' locks; once its session expires, the others take its buckets over
/// within the TTL and a few seconds, not when the server's default idle timeout (60 s)
/// would end that transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_inside_a_transaction_does_not_keep_its_buckets() {
    let db = migrated().await;
    let open = PgOpen {
        create: true,
        ttl: Duration::from_secs(2),
        ..PgOpen::new("stalled")
    };
    let stalled = PgStore::open(&db.target, &open).await.unwrap();
    let job = stalled.inner.job;
    let admin = db.connect().await;
    add_buckets(&admin, job, 2).await;
    let held = stalled.acquire_buckets(Log::Job, 1).await.unwrap();
    assert_eq!(held.len(), 1);
    let bucket = held[0].lease.bucket as i64;
    // It stops: no heartbeat, and its connection idle inside a transaction that locks
    // its bucket's row (as a commit does).
    stalled.heartbeat.abort();
    {
        let conn = stalled.inner.client().await.unwrap();
        let c = conn.as_ref().unwrap();
        c.batch_execute("BEGIN").await.unwrap();
        c.execute(
            "SELECT 1 FROM hw_bucket WHERE job_id = $1 AND bucket = $2 FOR UPDATE",
            &[&job.0, &bucket],
        )
        .await
        .unwrap();
    }
    expire(&admin, job, &stalled.worker()).await;
    let other = PgStore::open(
        &db.target,
        &PgOpen {
            create: false,
            ..open
        },
    )
    .await
    .unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    let mut taken = false;
    while !taken && Instant::now() < deadline {
        let got = other.acquire_buckets(Log::Job, 2).await.unwrap();
        taken = got.iter().any(|a| a.lease.bucket as i64 == bucket);
        if !taken {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        taken,
        "bucket {bucket} of the expired session not taken over within {:?}",
        started.elapsed()
    );
}
