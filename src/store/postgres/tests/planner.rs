use crate::input::Cursor;
use crate::store::postgres::planner::*;
use crate::store::postgres::test_db::{expire, with_job, worker};
use crate::store::postgres::PgError;
use crate::store::{BadLine, PlannerState};

fn ids(bucket: u64, first_row: u64, ids: &[&str]) -> PlanBucket {
    PlanBucket {
        bucket,
        items: ids
            .iter()
            .enumerate()
            .map(|(i, id)| (first_row + i as u64, id.to_string()))
            .collect(),
        values: Vec::new(),
    }
}

fn position(next_bucket: u64, row: u64, exhausted: bool) -> PlannerState {
    PlannerState {
        next_bucket,
        cursor: Cursor {
            byte: row * 2,
            line: row + 1,
            row,
        },
        exhausted,
    }
}

fn record(c: &BucketCounts) -> String {
    format!(
        r#"{{"bucket":{},"items":{},"duplicates":{}}}"#,
        c.bucket, c.items, c.duplicates
    )
}

#[tokio::test]
async fn the_planner_lease_is_exclusive_and_moves_only_when_its_session_expires() {
    let (_db, client, job) = with_job().await;
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    let t = acquire_planner(&client, job, &a)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(acquire_planner(&client, job, &b).await.unwrap(), None);
    assert_eq!(
        acquire_planner(&client, job, &a).await.unwrap(),
        Some(t),
        "kept"
    );
    expire(&client, job, &a).await;
    let t2 = acquire_planner(&client, job, &b)
        .await
        .unwrap()
        .expect("taken over");
    assert!(t2 > t);
    assert_eq!(acquire_planner(&client, job, &a).await.unwrap(), None);
}

#[tokio::test]
async fn concurrent_candidates_get_one_planner() {
    let (db, client, job) = with_job().await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let c = db.connect().await;
        let me = worker(&c, job).await;
        tasks.push(tokio::spawn(async move {
            acquire_planner(&c, job, &me).await.unwrap()
        }));
    }
    let mut won = 0;
    for t in tasks {
        won += usize::from(t.await.unwrap().is_some());
    }
    assert_eq!(won, 1);
    drop(client);
}

#[tokio::test]
async fn a_plan_finds_duplicates_by_key_and_writes_buckets_and_position_together() {
    let (_db, client, job) = with_job().await;
    let a = worker(&client, job).await;
    let buckets = [ids(0, 0, &["x", "y", "x", "z"]), ids(1, 4, &["z", "w"])];
    let bad = [BadLine {
        row: 6,
        line: 7,
        reason: "empty".into(),
    }];
    let batch = Plan {
        buckets: &buckets,
        bad_lines: &bad,
        position: position(2, 7, false),
    };
    let counts = plan(&client, job, &a, &batch, record, None).await.unwrap();
    assert_eq!(
        counts,
        vec![
            BucketCounts {
                bucket: 0,
                items: 3,
                duplicates: 1
            },
            BucketCounts {
                bucket: 1,
                items: 1,
                duplicates: 1
            },
        ]
    );
    // Across batches too: "y" was planned before.
    let more = [ids(2, 7, &["y", "v"])];
    let batch2 = Plan {
        buckets: &more,
        bad_lines: &[],
        position: position(3, 9, true),
    };
    let counts = plan(&client, job, &a, &batch2, record, None).await.unwrap();
    assert_eq!(
        counts,
        vec![BucketCounts {
            bucket: 2,
            items: 1,
            duplicates: 1
        }]
    );

    let rows = client
        .query(
            "SELECT bucket, items, offset_record->>'duplicates', state FROM hw_bucket
             WHERE job_id = $1 ORDER BY bucket",
            &[&job.0],
        )
        .await
        .unwrap();
    let got: Vec<(i64, i64, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 3, "1".into(), "open".into()),
            (1, 1, "1".into(), "open".into()),
            (2, 1, "1".into(), "open".into()),
        ]
    );
    // An ID keeps the bucket and row of its first occurrence.
    let z = client
        .query_one(
            "SELECT bucket, \"row\" FROM hw_item WHERE job_id = $1 AND id = 'z'",
            &[&job.0],
        )
        .await
        .unwrap();
    assert_eq!((z.get::<_, i64>(0), z.get::<_, i64>(1)), (0, 3));
    assert_eq!(
        planner_state(&client, job).await.unwrap(),
        position(3, 9, true)
    );
    // Planned to its end: no planner lease to take any more.
    let b = worker(&client, job).await;
    expire(&client, job, &a).await;
    assert_eq!(acquire_planner(&client, job, &b).await.unwrap(), None);
}

#[tokio::test]
async fn a_planner_that_lost_its_lease_writes_nothing() {
    let (_db, client, job) = with_job().await;
    let a = worker(&client, job).await;
    let b = worker(&client, job).await;
    acquire_planner(&client, job, &a).await.unwrap().unwrap();
    expire(&client, job, &a).await;
    acquire_planner(&client, job, &b).await.unwrap().unwrap();
    let buckets = [ids(0, 0, &["x"])];
    let batch = Plan {
        buckets: &buckets,
        bad_lines: &[],
        position: position(1, 1, false),
    };
    let err = plan(&client, job, &a, &batch, record, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PgError::PlannerLeaseLost { .. }), "{err:?}");
    let n: i64 = client
        .query_one("SELECT count(*) FROM hw_item WHERE job_id = $1", &[&job.0])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    assert_eq!(
        planner_state(&client, job).await.unwrap(),
        PlannerState::default()
    );
    plan(&client, job, &b, &batch, record, None).await.unwrap();
    assert_eq!(
        planner_state(&client, job).await.unwrap(),
        position(1, 1, false)
    );
}

#[tokio::test]
async fn a_stale_plan_is_rolled_back_and_its_connection_plans_on() {
    // Its first flight leaves the transaction open when the position is found stale: the
    // plan rolls it back, so the same connection's next statements are not inside it.
    let (_db, client, job) = with_job().await;
    let a = worker(&client, job).await;
    let buckets = [ids(0, 0, &["x"])];
    let batch = Plan {
        buckets: &buckets,
        bad_lines: &[],
        position: position(1, 1, false),
    };
    plan(&client, job, &a, &batch, record, None).await.unwrap();
    // Bucket 0 again: planned already, the job's next bucket is 1.
    let again = [ids(0, 0, &["y"])];
    let stale = Plan {
        buckets: &again,
        bad_lines: &[],
        position: position(1, 2, false),
    };
    let err = plan(&client, job, &a, &stale, record, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PgError::PlannerLeaseLost { .. }), "{err:?}");
    // Outside a transaction, each statement runs in one of its own: a second one sees a
    // later transaction start.
    let started = "SELECT to_char(now(), 'HH24:MI:SS.US')";
    let first: String = client.query_one(started, &[]).await.unwrap().get(0);
    let second: String = client.query_one(started, &[]).await.unwrap().get(0);
    assert_ne!(
        first, second,
        "the connection is still inside a transaction"
    );
    let y: i64 = client
        .query_one(
            "SELECT count(*) FROM hw_item WHERE job_id = $1 AND id = 'y'",
            &[&job.0],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(y, 0, "the stale plan's items were rolled back");
    let next = [ids(1, 1, &["y"])];
    let on = Plan {
        buckets: &next,
        bad_lines: &[],
        position: position(2, 2, true),
    };
    plan(&client, job, &a, &on, record, None).await.unwrap();
    assert_eq!(
        planner_state(&client, job).await.unwrap(),
        position(2, 2, true)
    );
}
