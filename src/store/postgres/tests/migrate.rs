use tokio_postgres::Client;

use crate::store::postgres::migrate::*;
use crate::store::postgres::test_db;
use crate::store::postgres::PgError;

#[test]
fn every_file_in_migrations_is_embedded_in_order() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let embedded: Vec<String> = MIGRATIONS
        .iter()
        .map(|m| format!("{:04}_{}.sql", m.version, m.name))
        .collect();
    assert_eq!(files, embedded);
    for (i, m) in MIGRATIONS.iter().enumerate() {
        assert_eq!(
            m.version,
            i as i32 + 1,
            "versions are 1, 2, ... without gaps"
        );
        let on_disk = std::fs::read_to_string(format!("{dir}/{}", embedded[i])).unwrap();
        assert_eq!(on_disk, m.sql);
    }
}

async fn versions(client: &Client) -> Vec<(i32, String)> {
    client
        .query(
            "SELECT version, sha256 FROM hw_schema ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn migrations_apply_once_then_find_nothing_to_do() {
    let db = test_db::fresh().await;
    let mut client = db.connect().await;
    let all: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(all, (1..=MIGRATIONS.len() as i32).collect::<Vec<_>>());
    assert_eq!(migrate(&mut client).await.unwrap(), all);
    let recorded = versions(&client).await;
    let expected: Vec<(i32, String)> = MIGRATIONS.iter().map(|m| (m.version, m.sha256())).collect();
    assert_eq!(recorded, expected);
    assert!(migrate(&mut client).await.unwrap().is_empty());
    assert_eq!(versions(&client).await, recorded);
    // The schema is there.
    let n: i64 = client
        .query_one("SELECT count(*) FROM hw_bucket", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[tokio::test]
async fn concurrent_runners_serialize_and_apply_once() {
    let db = test_db::fresh().await;
    let mut runners = Vec::new();
    for _ in 0..4 {
        let mut client = db.connect().await;
        runners.push(tokio::spawn(async move { migrate(&mut client).await }));
    }
    let mut applied = Vec::new();
    for r in runners {
        applied.push(r.await.unwrap().expect("no runner fails"));
    }
    applied.sort();
    let all: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(applied, vec![vec![], vec![], vec![], all]);
    assert_eq!(versions(&db.connect().await).await.len(), MIGRATIONS.len());
}

const V1: Migration = Migration {
    version: 1,
    name: "one",
    sql: "CREATE TABLE one (a int);",
};
const V2: Migration = Migration {
    version: 2,
    name: "two",
    sql: "CREATE TABLE two (a int);",
};

#[tokio::test]
async fn a_changed_checksum_is_refused_and_nothing_is_applied() {
    let db = test_db::fresh().await;
    let mut client = db.connect().await;
    migrate_with(&mut client, &[V1]).await.unwrap();
    let edited = Migration {
        sql: "CREATE TABLE one (a bigint);",
        ..V1
    };
    let err = migrate_with(&mut client, &[edited, V2]).await.unwrap_err();
    match &err {
        PgError::ChecksumMismatch {
            version, applied, ..
        } => {
            assert_eq!(*version, 1);
            assert_eq!(*applied, V1.sha256());
        }
        other => panic!("expected ChecksumMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains("migration 1 (one)"), "{err}");
    // V2 was not applied.
    let two: Option<String> = client
        .query_one("SELECT to_regclass('two')::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(two, None);
}

#[tokio::test]
async fn a_database_newer_than_the_binary_is_refused() {
    let db = test_db::fresh().await;
    let mut client = db.connect().await;
    migrate_with(&mut client, &[V1, V2]).await.unwrap();
    let err = migrate_with(&mut client, &[V1]).await.unwrap_err();
    assert!(
        matches!(
            err,
            PgError::SchemaNewer {
                found: 2,
                supported: 1
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade highwater"), "{err}");
}

#[tokio::test]
async fn a_failing_migration_leaves_nothing_behind() {
    let db = test_db::fresh().await;
    let mut client = db.connect().await;
    let broken = Migration {
        version: 2,
        name: "broken",
        sql: "CREATE TABLE two (a int); SELECT no_such_function();",
    };
    let err = migrate_with(&mut client, &[V1, broken]).await.unwrap_err();
    assert!(
        matches!(err, PgError::Migration { version: 2, .. }),
        "{err:?}"
    );
    // One transaction: V1 is not recorded either, and hw_schema itself rolled back.
    let schema: Option<String> = client
        .query_one("SELECT to_regclass('hw_schema')::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(schema, None);
}
