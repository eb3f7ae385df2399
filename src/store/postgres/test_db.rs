//! Test support for the PostgreSQL store's unit tests: a fresh database in the test
//! binary's throwaway cluster (`tests/support/pg_cluster.rs`, shared with the integration
//! tests), and connections to it.

// Shared with the integration tests, which reach its items from another module: `pub` there.
#[allow(unreachable_pub)]
#[path = "../../../tests/support/pg_cluster.rs"]
mod pg_cluster;

pub(crate) use pg_cluster::{shared, PgCluster, TestDb};
use tokio_postgres::Client;

use super::connect::{connect, ConnectOptions, PgTarget};
use super::job::{create_job, NewJob};
use super::keys::{JobId, WorkerId};
use super::migrate::migrate;
use super::session::{register, WorkerInfo};

/// A fresh schema of the shared cluster's test database.
pub(crate) struct Db {
    pub db: TestDb,
    pub target: PgTarget,
}

/// A fresh, empty schema (no tables).
pub(crate) async fn fresh() -> Db {
    let db = tokio::task::spawn_blocking(pg_cluster::fresh_db)
        .await
        .expect("create a test database");
    let target = PgTarget::parse_with_env(&db.url, &|_| None).expect("the test URL parses");
    Db { db, target }
}

/// A fresh database with the schema applied.
pub(crate) async fn migrated() -> Db {
    let db = fresh().await;
    migrate(&mut db.connect().await)
        .await
        .expect("migrations apply");
    db
}

impl Db {
    pub(crate) async fn connect(&self) -> Client {
        connect(&self.target, &ConnectOptions::default())
            .await
            .expect("connect to the test database")
    }

    /// Run SQL as the superuser (roles, settings a test needs).
    pub(crate) fn psql(&self, sql: &str) -> String {
        shared().psql(&self.db.name, sql)
    }
}

/// A migrated database with one job ("j", rate 100/s, burst 10) and a connection to it.
pub(crate) async fn with_job() -> (Db, Client, JobId) {
    let db = migrated().await;
    let client = db.connect().await;
    let spec = serde_json::json!({"url": "http://127.0.0.1:9/{id}?k=${TOKEN}"});
    let (job, created) = create_job(
        &client,
        &NewJob {
            name: "j",
            spec: &spec,
            input_fingerprint: None,
            bucket_size: 10,
            rate_per_s: Some(100.0),
            burst: Some(10),
        },
    )
    .await
    .expect("create the job");
    assert!(created);
    (db, client, job)
}

/// A new worker session with a 30 s TTL.
pub(crate) async fn worker(client: &Client, job: JobId) -> WorkerId {
    let info = WorkerInfo {
        host: "test",
        pid: std::process::id(),
        version: "test",
    };
    register(client, job, &info, std::time::Duration::from_secs(30))
        .await
        .expect("register a worker")
}

/// End a session's life now, as if it stopped heartbeating a TTL ago (no sleeping).
pub(crate) async fn expire(client: &Client, job: JobId, worker: &WorkerId) {
    let n = client
        .execute(
            "UPDATE hw_worker SET expires_at = now() - interval '1 second'
             WHERE job_id = $1 AND worker_id = $2::text::uuid",
            &[&job.0, &worker.0],
        )
        .await
        .expect("expire a session");
    assert_eq!(n, 1);
}

/// `n` open buckets of the job's log (0..n), each with IDs "b{bucket}-{i}", i < 3.
pub(crate) async fn add_buckets(client: &Client, job: JobId, n: i64) {
    client
        .execute(
            "INSERT INTO hw_bucket (job_id, bucket, offset_record, items)
             SELECT $1, b, '{}', 3 FROM generate_series(0, $2::bigint - 1) AS b",
            &[&job.0, &n],
        )
        .await
        .expect("insert buckets");
    client
        .execute(
            "INSERT INTO hw_item (job_id, id, bucket, \"row\")
             SELECT $1, 'b' || b || '-' || i, b, b * 3 + i
             FROM generate_series(0, $2::bigint - 1) AS b, generate_series(0, 2) AS i",
            &[&job.0, &n],
        )
        .await
        .expect("insert items");
}

#[cfg(test)]
mod tests {
    use super::PgCluster;

    #[test]
    fn a_cluster_is_stopped_and_removed_when_a_test_panics() {
        let dir = std::sync::Mutex::new(None);
        let unwound = std::panic::catch_unwind(|| {
            let cluster = PgCluster::start();
            assert_eq!(cluster.psql("postgres", "SELECT 1"), "1");
            *dir.lock().unwrap() = Some(cluster.socket_dir().to_path_buf());
            panic!("the test fails while its cluster runs");
        });
        assert!(unwound.is_err());
        let dir = dir.lock().unwrap().clone().unwrap();
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }
}
