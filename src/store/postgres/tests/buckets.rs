use crate::store::postgres::buckets::*;
use crate::store::postgres::keys::Lease;
use crate::store::postgres::test_db::{add_buckets, expire, with_job, worker};
use crate::store::Log;

fn buckets(acquired: &[Acquired]) -> Vec<u64> {
    acquired.iter().map(|a| a.lease.bucket).collect()
}

#[tokio::test]
async fn acquire_skips_rows_another_transaction_holds() {
    let (db, client, job) = with_job().await;
    add_buckets(&client, job, 3).await;
    let a = worker(&client, job).await;
    let mut other = db.connect().await;
    let locker = other.transaction().await.unwrap();
    locker
        .execute(
            "SELECT 1 FROM hw_bucket WHERE job_id = $1 AND bucket = 0 FOR UPDATE",
            &[&job.0],
        )
        .await
        .unwrap();
    let got = acquire(&client, job, &a, Log::Job, 10).await.unwrap();
    assert_eq!(
        buckets(&got),
        vec![1, 2],
        "bucket 0 is locked: skipped, not waited for"
    );
    locker.rollback().await.unwrap();
    let got = acquire(&client, job, &a, Log::Job, 10).await.unwrap();
    assert_eq!(buckets(&got), vec![0]);
    assert!(acquire(&client, job, &a, Log::Job, 10)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn concurrent_acquirers_never_get_the_same_bucket() {
    let (db, client, job) = with_job().await;
    add_buckets(&client, job, 200).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = db.connect().await;
        let me = worker(&c, job).await;
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = acquire(&c, job, &me, Log::Job, 3).await.unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(buckets(&got));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(
        all,
        (0..200).collect::<Vec<u64>>(),
        "each bucket exactly once"
    );
}

#[tokio::test]
async fn expired_owners_buckets_are_taken_with_fresh_tokens_and_counted_switches() {
    let (_db, client, job) = with_job().await;
    add_buckets(&client, job, 5).await;
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    let first = acquire(&client, job, &a, Log::Job, 3).await.unwrap();
    assert_eq!(buckets(&first), vec![0, 1, 2]);
    assert!(first.iter().all(|x| !x.taken_over && x.owner_switches == 0));
    // A live owner's buckets are not taken: B gets only the open ones.
    let second = acquire(&client, job, &b, Log::Job, 10).await.unwrap();
    assert_eq!(buckets(&second), vec![3, 4]);
    assert!(acquire(&client, job, &b, Log::Job, 10)
        .await
        .unwrap()
        .is_empty());

    expire(&client, job, &a).await;
    let taken = acquire(&client, job, &b, Log::Job, 10).await.unwrap();
    assert_eq!(buckets(&taken), vec![0, 1, 2]);
    let newest = first
        .iter()
        .chain(&second)
        .map(|x| x.lease.token)
        .max()
        .unwrap();
    for x in &taken {
        assert!(x.taken_over);
        assert_eq!(x.owner_switches, 1);
        assert!(x.lease.token > newest, "a fresh token from the sequence");
    }
    let owners: i64 = client
        .query_one(
            "SELECT count(*) FROM hw_bucket WHERE job_id = $1 AND owner = $2::text::uuid",
            &[&job.0, &b.0],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owners, 5);
}

#[tokio::test]
async fn an_expired_or_draining_session_acquires_nothing() {
    let (_db, client, job) = with_job().await;
    add_buckets(&client, job, 2).await;
    let a = worker(&client, job).await;
    expire(&client, job, &a).await;
    assert!(acquire(&client, job, &a, Log::Job, 10)
        .await
        .unwrap()
        .is_empty());
    let b = worker(&client, job).await;
    crate::store::postgres::session::drain(&client, job, &b)
        .await
        .unwrap();
    assert!(acquire(&client, job, &b, Log::Job, 10)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn released_buckets_are_taken_at_once_and_stale_tokens_release_nothing() {
    let (_db, client, job) = with_job().await;
    add_buckets(&client, job, 2).await;
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    let held = acquire(&client, job, &a, Log::Job, 2).await.unwrap();
    let stale = Lease {
        token: held[0].lease.token - 1,
        ..held[0].lease
    };
    assert_eq!(release(&client, job, &a, &[stale]).await.unwrap(), 0);
    assert_eq!(
        release(&client, job, &b, &[held[0].lease]).await.unwrap(),
        0,
        "not B's"
    );
    assert_eq!(
        release(&client, job, &a, &[held[0].lease]).await.unwrap(),
        1
    );
    // No TTL to wait for: B takes it now, as a switch of owner.
    let got = acquire(&client, job, &b, Log::Job, 10).await.unwrap();
    assert_eq!(buckets(&got), vec![0]);
    assert_eq!(got[0].owner_switches, 1);
    assert!(!got[0].taken_over);
    assert_eq!(release_all(&client, job, &a).await.unwrap(), 1);
}
