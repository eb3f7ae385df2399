use tokio_postgres::Client;

use crate::store::postgres::buckets::acquire;
use crate::store::postgres::keys::{JobId, Lease};
use crate::store::postgres::results::*;
use crate::store::postgres::test_db::{add_buckets, expire, with_job, worker};
use crate::store::postgres::PgError;
use crate::store::{CommitRecord, ItemStatus, Log};

fn result(lease: Lease, id: &str, body: &str) -> ResultRow {
    ResultRow {
        lease,
        id: id.into(),
        bucket: lease.bucket,
        row: 0,
        status: ItemStatus::Ok,
        http_status: Some(200),
        body: Some(body.into()),
        record: r#"{"attempts":1}"#.into(),
    }
}

fn bucket_results(lease: Lease, body: &str) -> Vec<ResultRow> {
    (0..3)
        .map(|i| result(lease, &format!("b{}-{i}", lease.bucket), body))
        .collect()
}

fn tally(ok: u64) -> CommitRecord {
    CommitRecord {
        ok,
        ..CommitRecord::default()
    }
}

async fn item(client: &Client, job: JobId, id: &str) -> (String, Option<String>, i64) {
    let r = client
        .query_one(
            "SELECT status, body::text, lease_token FROM hw_item WHERE job_id = $1 AND id = $2",
            &[&job.0, &id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

#[tokio::test]
async fn a_stale_owner_writes_nothing_and_its_commit_is_refused() {
    let (_db, mut client, job) = with_job().await;
    add_buckets(&client, job, 1).await;
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    let old = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
    expire(&client, job, &a).await;
    let new = acquire(&client, job, &b, Log::Job, 1).await.unwrap()[0].lease;
    assert!(new.token > old.token);

    // A (paused past its TTL) wakes up and flushes its bucket: nothing counts.
    let stale = bucket_results(old, r#"{"from":"a"}"#);
    let err = {
        let tx = client.transaction().await.unwrap();
        let w = write_results(&tx, job, &a, Log::Job, &stale).await.unwrap();
        assert_eq!(
            w,
            Written {
                written: 0,
                fenced: 3
            }
        );
        let err = commit_bucket(&tx, job, &a, &old, &tally(3))
            .await
            .unwrap_err();
        tx.commit().await.unwrap();
        err
    };
    assert!(
        matches!(err, PgError::LeaseLost { bucket: 0, token, .. } if token == old.token),
        "{err:?}"
    );
    assert_eq!(
        item(&client, job, "b0-0").await,
        ("pending".into(), None, 0)
    );

    // The current owner's flush counts.
    let fresh = bucket_results(new, r#"{"from": "b"}"#);
    let flushed = flush(&mut client, job, &b, Log::Job, &fresh, &[(new, tally(3))])
        .await
        .unwrap();
    assert_eq!(
        flushed.results,
        Written {
            written: 3,
            fenced: 0
        }
    );
    assert_eq!(flushed.committed, vec![new]);
    assert!(flushed.lost.is_empty());
    // Stored byte for byte (json, not jsonb), under the new token.
    assert_eq!(
        item(&client, job, "b0-0").await,
        ("ok".into(), Some(r#"{"from": "b"}"#.into()), new.token)
    );
    let row = client
        .query_one(
            "SELECT state, ok, owner::text FROM hw_bucket WHERE job_id = $1 AND bucket = 0",
            &[&job.0],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "committed");
    assert_eq!(row.get::<_, Option<i64>>(1), Some(3));
    assert_eq!(row.get::<_, Option<String>>(2), Some(b.0.clone()));
    // And A, late again, still cannot touch it.
    let late = flush(&mut client, job, &a, Log::Job, &stale, &[(old, tally(3))])
        .await
        .unwrap();
    assert_eq!(late.results.written, 0);
    assert_eq!(late.lost, vec![old]);
}

#[tokio::test]
async fn an_upsert_never_replaces_a_row_written_under_a_newer_token() {
    let (_db, client, job) = with_job().await;
    add_buckets(&client, job, 1).await;
    // Rerun 1's bucket 0 holds the job bucket's ID b0-0.
    client
        .execute(
            "INSERT INTO hw_bucket (job_id, rerun, bucket, offset_record, items)
             VALUES ($1, 1, 0, '{}', 1)",
            &[&job.0],
        )
        .await
        .unwrap();
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    let job_lease = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
    let rerun_lease = acquire(&client, job, &b, Log::Rerun(1), 1).await.unwrap()[0].lease;
    assert!(rerun_lease.token > job_lease.token);
    let mut newer = result(rerun_lease, "b0-0", r#""rerun""#);
    newer.bucket = 0;
    let w = write_results(&client, job, &b, Log::Rerun(1), &[newer])
        .await
        .unwrap();
    assert_eq!(w.written, 1);
    // A still holds the job bucket, but its token is older than the row's.
    let w = write_results(
        &client,
        job,
        &a,
        Log::Job,
        &[result(job_lease, "b0-0", r#""job""#)],
    )
    .await
    .unwrap();
    assert_eq!(
        w,
        Written {
            written: 0,
            fenced: 1
        }
    );
    assert_eq!(
        item(&client, job, "b0-0").await,
        ("ok".into(), Some(r#""rerun""#.into()), rerun_lease.token)
    );
}

#[tokio::test]
async fn a_written_lease_cannot_be_taken_before_its_transaction_ends() {
    let (db, mut client, job) = with_job().await;
    add_buckets(&client, job, 1).await;
    let a = worker(&client, job).await;
    let other = db.connect().await;
    let b = worker(&other, job).await;
    let lease = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
    let tx = client.transaction().await.unwrap();
    let w = write_results(&tx, job, &a, Log::Job, &bucket_results(lease, "1"))
        .await
        .unwrap();
    assert_eq!(w.written, 3);
    // A's session expires while its flush is in progress: B cannot take the bucket from
    // under the flush (it is share-locked), so A's commit still holds.
    expire(&other, job, &a).await;
    assert!(acquire(&other, job, &b, Log::Job, 1)
        .await
        .unwrap()
        .is_empty());
    commit_bucket(&tx, job, &a, &lease, &tally(3))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(acquire(&other, job, &b, Log::Job, 1)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_flush_loses_only_the_buckets_whose_lease_moved() {
    let (_db, mut client, job) = with_job().await;
    add_buckets(&client, job, 2).await;
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    let held = acquire(&client, job, &a, Log::Job, 2).await.unwrap();
    let (l0, l1) = (held[0].lease, held[1].lease);
    expire(&client, job, &a).await;
    let taken = acquire(&client, job, &b, Log::Job, 1).await.unwrap();
    assert_eq!(taken[0].lease.bucket, 0);
    let mut rows = bucket_results(l0, "0");
    rows.extend(bucket_results(l1, "1"));
    let flushed = flush(
        &mut client,
        job,
        &a,
        Log::Job,
        &rows,
        &[(l0, tally(3)), (l1, tally(3))],
    )
    .await
    .unwrap();
    // Bucket 1 is still A's under its token (nobody took it): that counts.
    assert_eq!(
        flushed.results,
        Written {
            written: 3,
            fenced: 3
        }
    );
    assert_eq!(flushed.committed, vec![l1]);
    assert_eq!(flushed.lost, vec![l0]);
    assert_eq!(item(&client, job, "b0-1").await.0, "pending");
    assert_eq!(item(&client, job, "b1-1").await.0, "ok");
}

#[tokio::test]
async fn a_token_from_an_earlier_lease_of_the_same_session_is_refused() {
    let (_db, mut client, job) = with_job().await;
    add_buckets(&client, job, 1).await;
    let a = worker(&client, job).await;
    let old = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
    crate::store::postgres::buckets::release(&client, job, &a, &[old])
        .await
        .unwrap();
    let new = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
    assert!(new.token > old.token);
    // Same owner, older token: a flush left over from the first lease counts for nothing.
    let late = flush(
        &mut client,
        job,
        &a,
        Log::Job,
        &bucket_results(old, "1"),
        &[(old, tally(3))],
    )
    .await
    .unwrap();
    assert_eq!(
        late.results,
        Written {
            written: 0,
            fenced: 3
        }
    );
    assert_eq!(late.lost, vec![old]);
    let now = flush(
        &mut client,
        job,
        &a,
        Log::Job,
        &bucket_results(new, "2"),
        &[(new, tally(3))],
    )
    .await
    .unwrap();
    assert_eq!(now.committed, vec![new]);
}
