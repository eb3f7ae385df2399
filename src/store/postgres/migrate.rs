//! The schema's migrations: `migrations/NNNN_name.sql`, embedded in the binary, applied at
//! start in one transaction under `pg_advisory_xact_lock` (so concurrent workers serialize
//! and all but the first find nothing to do), and recorded in `hw_schema` with each file's
//! sha256. A recorded migration whose checksum differs from the embedded file, or a
//! database with a version this build does not know, is refused before anything is changed.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::error::PgError;
use super::flight::{begin, end, rollback};
use super::typed::typed;

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    /// The migration's number: migrations apply in this order.
    pub version: i32,
    /// Its name, for messages.
    pub name: &'static str,
    /// The SQL it runs.
    pub sql: &'static str,
}

impl Migration {
    /// The file's sha256, lowercase hex.
    pub(crate) fn sha256(&self) -> String {
        Sha256::digest(self.sql.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The migration and its row in `hw_schema`, as one batch of statements.
    fn batch(&self) -> String {
        format!(
            "{}\n;\nINSERT INTO hw_schema (version, name, sha256) VALUES ({}, '{}', '{}')",
            self.sql,
            self.version,
            self.name.replace('\'', "''"),
            self.sha256()
        )
    }
}

/// This build's migrations, in version order (one per file in `migrations/`).
pub(crate) const MIGRATIONS: &[Migration] = &[
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
    Migration {
        version: 6,
        name: "learned_limits",
        sql: include_str!("../../../migrations/0006_learned_limits.sql"),
    },
    Migration {
        version: 7,
        name: "usage",
        sql: include_str!("../../../migrations/0007_usage.sql"),
    },
    Migration {
        version: 8,
        name: "pages",
        sql: include_str!("../../../migrations/0008_pages.sql"),
    },
];

/// The advisory lock key all highwater migration runners take ("hw_schem").
const LOCK_KEY: i64 = 0x6877_5f73_6368_656d;

/// Bring the database's schema to this build's [`MIGRATIONS`]. Returns the versions applied
/// now (empty: it was up to date).
pub(crate) async fn migrate(client: &mut Client) -> Result<Vec<i32>, PgError> {
    migrate_with(client, MIGRATIONS).await
}

/// [`migrate`] with a given list (tests give changed or shorter lists).
pub(crate) async fn migrate_with(
    client: &mut Client,
    migrations: &[Migration],
) -> Result<Vec<i32>, PgError> {
    let tx: &Client = client;
    // The first flight (see `flight.rs`): the transaction opened, the lock taken, the table
    // made and what it holds read.
    let (begun, locked, created, applied) = futures_util::future::join4(
        begin(tx, "starting the migration transaction"),
        async {
            tx.execute_typed("SELECT pg_advisory_xact_lock($1)", &typed![LOCK_KEY])
                .await
                .map_err(PgError::sql("taking the migration lock"))
        },
        async {
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS hw_schema (
                     version    integer PRIMARY KEY,
                     name       text NOT NULL,
                     sha256     text NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now()
                 )",
            )
            .await
            .map_err(PgError::sql("creating hw_schema"))
        },
        async {
            tx.query_typed(
                "SELECT version, name, sha256 FROM hw_schema ORDER BY version",
                &typed![],
            )
            .await
            .map_err(PgError::sql("reading hw_schema"))
        },
    )
    .await;
    let checked = (|| {
        begun?;
        locked?;
        created?;
        let applied = applied?;
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
        Ok(done)
    })();
    let done = match checked {
        Ok(done) => done,
        Err(e) => {
            // The transaction is still open on the connection: nothing of it stays.
            if let Err(r) = rollback(tx).await {
                tracing::warn!("could not roll the migration transaction back: {r}");
            }
            return Err(e);
        }
    };
    // The second flight: each migration with its row in hw_schema as one batch, then the
    // commit. A new database costs one round trip here, not two per migration. After a
    // batch that failed the others fail too and the commit rolls back (the transaction is
    // aborted): the first error is the one said.
    let pending: Vec<&Migration> = migrations
        .iter()
        .filter(|m| !done.contains(&m.version))
        .collect();
    let batches: Vec<String> = pending.iter().map(|m| m.batch()).collect();
    let (ran, ended) = futures_util::future::join(
        futures_util::future::join_all(batches.iter().map(|b| tx.batch_execute(b))),
        end(tx, "committing the migrations"),
    )
    .await;
    for (m, ran) in pending.iter().zip(ran) {
        ran.map_err(|e| PgError::Migration {
            version: m.version,
            name: m.name.into(),
            cause: super::error::PgCause(e),
        })?;
    }
    ended?;
    Ok(pending.iter().map(|m| m.version).collect())
}
