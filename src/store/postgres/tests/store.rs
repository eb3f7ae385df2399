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

/// A lease and its buckets' items in two flights: each leased bucket comes with the items
/// [`Store::bucket_items`] (the job's log) or [`Store::rerun_bucket_items`] (a rerun's)
/// read for it, and what one acquisition took the next does not take again.
#[tokio::test]
async fn acquire_work_gives_each_leased_bucket_with_its_items() {
    use crate::store::{Fleet, LeaseScope, Store};

    let db = migrated().await;
    let open = PgOpen {
        create: true,
        ..PgOpen::new("work")
    };
    let store = PgStore::open(&db.target, &open).await.unwrap();
    let job = store.inner.job;
    let admin = db.connect().await;
    add_buckets(&admin, job, 3).await;
    let ids = |items: &[(String, crate::store::ItemRecord)]| {
        items
            .iter()
            .map(|(id, r)| (id.clone(), r.row, r.bucket))
            .collect::<Vec<_>>()
    };
    let expected = |b: u64| {
        (0..3)
            .map(|i| (format!("b{b}-{i}"), b * 3 + i, b))
            .collect::<Vec<_>>()
    };
    let bucket_of = |scope: &LeaseScope| match scope {
        LeaseScope::Bucket { bucket, .. } => *bucket,
        LeaseScope::Job => panic!("a job-wide lease from acquire_work"),
    };

    let first = store.acquire_work(Log::Job, 2).await.unwrap();
    let got: Vec<u64> = first.iter().map(|w| bucket_of(&w.lease.scope)).collect();
    assert_eq!(got, [0, 1]);
    for w in &first {
        let b = bucket_of(&w.lease.scope);
        assert_eq!(ids(&w.items), expected(b));
        assert!(store.holds(&w.lease));
    }
    let second = store.acquire_work(Log::Job, 2).await.unwrap();
    let got: Vec<u64> = second.iter().map(|w| bucket_of(&w.lease.scope)).collect();
    assert_eq!(got, [2]);
    assert_eq!(ids(&second[0].items), expected(2));
    assert!(store.acquire_work(Log::Job, 2).await.unwrap().is_empty());

    // A rerun's bucket: its own items, read through hw_rerun_item.
    admin
        .batch_execute(&format!(
            "INSERT INTO hw_rerun (job_id, number, selection, buckets, ids)
                 VALUES ({j}, 1, '{{}}', 1, 2);
             INSERT INTO hw_bucket (job_id, rerun, bucket, offset_record, items)
                 VALUES ({j}, 1, 0, '{{}}', 2);
             INSERT INTO hw_rerun_item (job_id, rerun, bucket, \"row\", id)
                 VALUES ({j}, 1, 0, 0, 'b2-1'), ({j}, 1, 0, 1, 'b0-2');",
            j = job.0
        ))
        .await
        .unwrap();
    let rerun = store.acquire_work(Log::Rerun(1), 2).await.unwrap();
    assert_eq!(rerun.len(), 1);
    assert_eq!(
        rerun[0].lease.scope,
        LeaseScope::Bucket {
            log: Log::Rerun(1),
            bucket: 0
        }
    );
    assert_eq!(
        ids(&rerun[0].items),
        [("b2-1".to_string(), 7, 2), ("b0-2".to_string(), 2, 0)]
    );
    let read = store
        .rerun_bucket_items(&crate::store::RerunOffset {
            rerun: 1,
            bucket: 0,
            items: 2,
            before: Vec::new(),
            planned_at_ms: 0,
        })
        .await;
    assert_eq!(ids(&read.unwrap()), ids(&rerun[0].items));
}

/// A worker that leases a bucket after holding none is back from idle: its fleet rate says
/// when (the others count it again only at their next heartbeats); one that never held none
/// is not.
#[tokio::test]
async fn a_lease_after_holding_none_is_a_return_from_idle() {
    use crate::store::Fleet;

    let db = migrated().await;
    let open = PgOpen {
        create: true,
        ..PgOpen::new("idle")
    };
    let store = PgStore::open(&db.target, &open).await.unwrap();
    let job = store.inner.job;
    assert!(store.acquire_work(Log::Job, 2).await.unwrap().is_empty());
    assert_eq!(store.fleet_rate().rejoined, None, "idle is no return");
    let admin = db.connect().await;
    add_buckets(&admin, job, 3).await;
    let before = tokio::time::Instant::now();
    assert_eq!(store.acquire_work(Log::Job, 2).await.unwrap().len(), 2);
    let back = store.fleet_rate().rejoined.expect("a return from idle");
    assert!(back >= before);
    // Leasing more while it holds buckets is no new return.
    assert_eq!(store.acquire_work(Log::Job, 2).await.unwrap().len(), 1);
    assert_eq!(store.fleet_rate().rejoined, Some(back));
}
