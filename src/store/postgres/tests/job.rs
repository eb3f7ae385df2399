use std::time::Duration;

use crate::store::postgres::job::{open_row, NewJob};
use crate::store::postgres::keys::WorkerId;
use crate::store::postgres::session::WorkerInfo;
use crate::store::postgres::test_db::{migrated, with_job};
use crate::store::postgres::{PgOpen, PgStore};
use crate::store::{Fleet, JobView, Store, StoredJob};

fn new_job(name: &str) -> NewJob<'_> {
    NewJob {
        name,
        spec: &serde_json::Value::Null,
        input_fingerprint: None,
        bucket_size: 1,
        rate_per_s: None,
        burst: None,
    }
}

const INFO: WorkerInfo<'static> = WorkerInfo {
    host: "test",
    pid: 7,
    version: "test",
};

/// The sessions registered on the job named `name`.
async fn sessions(client: &tokio_postgres::Client, name: &str) -> Vec<WorkerId> {
    client
        .query(
            "SELECT w.worker_id::text FROM hw_worker w JOIN hw_job j USING (job_id)
             WHERE j.name = $1",
            &[&name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| WorkerId(r.get(0)))
        .collect()
}

#[tokio::test]
async fn the_open_finds_or_creates_the_job_and_registers_its_session_in_one_statement() {
    let (db, client, job) = with_job().await;
    let ttl = Duration::from_secs(30);

    // An existing job: found, not created, its spec as stored, a session on it.
    let found = open_row(&client, &new_job("j"), true, Some((&INFO, ttl)))
        .await
        .unwrap()
        .expect("the job exists");
    assert_eq!(found.job, job);
    assert!(!found.created);
    assert_eq!(
        found.spec,
        serde_json::json!({"url": "http://127.0.0.1:9/{id}?k=${TOKEN}"})
    );
    assert_eq!(sessions(&client, "j").await, vec![found.me.unwrap()]);

    // No job of that name, not to be created: nothing made, nothing registered.
    let none = open_row(&client, &new_job("k"), false, Some((&INFO, ttl)))
        .await
        .unwrap();
    assert!(none.is_none());
    let jobs: i64 = client
        .query_one("SELECT count(*) FROM hw_job", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 1);

    // To be created: made, with no spec yet, and the session on the new job.
    let made = open_row(&client, &new_job("k"), true, Some((&INFO, ttl)))
        .await
        .unwrap()
        .expect("created");
    assert!(made.created);
    assert_ne!(made.job, job);
    assert!(made.spec.is_null());
    assert_eq!(sessions(&client, "k").await, vec![made.me.unwrap()]);

    // Opened without a session (status, export): found, nobody registered.
    let reader = open_row(&client, &new_job("k"), false, None)
        .await
        .unwrap()
        .expect("found");
    assert_eq!(
        (reader.job, reader.created, reader.me),
        (made.job, false, None)
    );
    assert_eq!(sessions(&client, "k").await.len(), 1);
    drop(db);
}

#[tokio::test]
async fn the_spec_read_at_the_open_answers_the_first_read_and_never_one_after_a_write() {
    let db = migrated().await;
    let open = PgOpen {
        create: true,
        ..PgOpen::new("spec")
    };
    let store = PgStore::open(&db.target, &open).await.unwrap();
    assert!(store.created_job());
    assert_eq!(store.job().await.unwrap(), None, "a new job has no spec");
    let first = StoredJob {
        id: "spec".into(),
        version: 1,
        spec: b"{\"first\":true}".to_vec(),
    };
    store.put_job(&first).await.unwrap();
    assert_eq!(store.job().await.unwrap(), Some(first.clone()));

    // A second worker's open reads the spec with its session; a write by another worker
    // after that read is seen by every read after the first, which the open answered.
    let other = PgStore::open(&db.target, &PgOpen::new("spec"))
        .await
        .unwrap();
    let second = StoredJob {
        spec: b"{\"second\":true}".to_vec(),
        ..first.clone()
    };
    store.put_job(&second).await.unwrap();
    assert_eq!(other.job().await.unwrap(), Some(first.clone()), "as opened");
    assert_eq!(
        other.job().await.unwrap(),
        Some(second.clone()),
        "read again"
    );

    // A worker that writes the spec before reading it reads its own write.
    let third = PgStore::open(&db.target, &PgOpen::new("spec"))
        .await
        .unwrap();
    let written = StoredJob {
        spec: b"{\"third\":true}".to_vec(),
        ..first
    };
    third.put_job(&written).await.unwrap();
    assert_eq!(third.job().await.unwrap(), Some(written));
    assert!(!other.created_job() && !third.created_job());
    for s in [store, other, third] {
        s.close().await.unwrap();
    }
}

#[tokio::test]
async fn taking_the_planner_lease_says_where_planning_stands() {
    let db = migrated().await;
    let open = PgOpen {
        create: true,
        ..PgOpen::new("plan")
    };
    let a = PgStore::open(&db.target, &open).await.unwrap();
    let b = PgStore::open(&db.target, &PgOpen::new("plan"))
        .await
        .unwrap();
    let mut moved = a.planner().await.unwrap();
    moved.next_bucket = 3;
    moved.cursor.row = 3000;
    moved.cursor.byte = 12_345;
    a.set_planner(&moved).await.unwrap();
    assert_eq!(a.take_planner().await.unwrap(), Some(moved));
    assert_eq!(b.take_planner().await.unwrap(), None, "a plans");
    a.close().await.unwrap();
    b.close().await.unwrap();
}
