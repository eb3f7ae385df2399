//! The schema's migrations: `migrations/NNNN_name.sql`, embedded in the binary, applied at
//! start in one transaction under `pg_advisory_xact_lock` (so concurrent workers serialize
//! and all but the first find nothing to do), and recorded in `hw_schema` with each file's
//! sha256. A recorded migration whose checksum differs from the embedded file, or a
//! database with a version this build does not know, is refused before anything is changed.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::error::PgError;

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// The file's sha256, lowercase hex.
    pub fn sha256(&self) -> String {
        Sha256::digest(self.sql.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// This build's migrations, in version order (one per file in `migrations/`).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../../migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "fleet_burst_idle",
        sql: include_str!("../../../migrations/0002_fleet_burst_idle.sql"),
    },
    Migration {
        version: 3,
        name: "quota_usage",
        sql: include_str!("../../../migrations/0003_quota_usage.sql"),
    },
    Migration {
        version: 4,
        name: "row_values",
        sql: include_str!("../../../migrations/0004_row_values.sql"),
    },
    Migration {
        version: 5,
        name: "history",
        sql: include_str!("../../../migrations/0005_history.sql"),
    },
];

/// The advisory lock key all highwater migration runners take ("hw_schem").
const LOCK_KEY: i64 = 0x6877_5f73_6368_656d;

/// Bring the database's schema to this build's [`MIGRATIONS`]. Returns the versions applied
/// now (empty: it was up to date).
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, PgError> {
    migrate_with(client, MIGRATIONS).await
}

/// [`migrate`] with a given list (tests give changed or shorter lists).
pub(crate) async fn migrate_with(
    client: &mut Client,
    migrations: &[Migration],
) -> Result<Vec<i32>, PgError> {
    let tx = client
        .transaction()
        .await
        .map_err(PgError::sql("starting the migration transaction"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await
        .map_err(PgError::sql("taking the migration lock"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS hw_schema (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             sha256     text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(PgError::sql("creating hw_schema"))?;
    let applied = tx
        .query(
            "SELECT version, name, sha256 FROM hw_schema ORDER BY version",
            &[],
        )
        .await
        .map_err(PgError::sql("reading hw_schema"))?;
    let supported = migrations.last().map_or(0, |m| m.version);
    let mut done = std::collections::BTreeSet::new();
    for row in &applied {
        let version: i32 = row.get(0);
        let name: String = row.get(1);
        let sha: String = row.get(2);
        let Some(embedded) = migrations.iter().find(|m| m.version == version) else {
            return Err(PgError::SchemaNewer {
                found: applied.last().map_or(version, |r| r.get(0)),
                supported,
            });
        };
        let embedded_sha = embedded.sha256();
        if sha != embedded_sha {
            return Err(PgError::ChecksumMismatch {
                version,
                name,
                applied: sha,
                embedded: embedded_sha,
            });
        }
        done.insert(version);
    }
    let mut now = Vec::new();
    for m in migrations.iter().filter(|m| !done.contains(&m.version)) {
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| PgError::Migration {
                version: m.version,
                name: m.name.into(),
                cause: super::error::PgCause(e),
            })?;
        tx.execute(
            "INSERT INTO hw_schema (version, name, sha256) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &m.sha256()],
        )
        .await
        .map_err(PgError::sql("recording a migration"))?;
        now.push(m.version);
    }
    tx.commit()
        .await
        .map_err(PgError::sql("committing the migrations"))?;
    Ok(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::test_db;

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
        let expected: Vec<(i32, String)> =
            MIGRATIONS.iter().map(|m| (m.version, m.sha256())).collect();
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
}
