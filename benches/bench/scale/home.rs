//! Where a `scale` job lives ([`Home`]): a state directory (sled) or a job of a throwaway
//! PostgreSQL cluster; the arguments that name it to the binary, the disk it may take (a
//! bound per ID, stated with its reasons), the calls a kill -9 may repeat, and its size on
//! disk part by part.

use std::path::{Path, PathBuf};

use anyhow::Result;

use highwater::engine;

use crate::args::Store;
use crate::child::State;
use crate::numbers::size;
use crate::pg::{start_cluster, table_sizes, PgCluster, TestDb, JOB};
use crate::scratch::{dir_size, files_of};

/// A sled state directory takes at most this many bytes per ID. The `rss` bench measured
/// 403 allocated bytes per ID at 10M IDs keeping whole 91-byte answers; with `--extract`
/// keeping a number the fixed cost is about 60 bytes per ID (`storage` at 1M IDs). 400 is
/// a bound with room for the ID index doubling and the results log before a compaction.
pub const SLED_BYTES_PER_ID: u64 = 400;

/// A PostgreSQL job's tables take at most this many bytes per ID: the `pg` bench measured
/// 685 bytes per ID as a run left them at 1M IDs keeping whole 91-byte answers (dead row
/// versions included); 1,000 leaves room for more of those.
pub const PG_BYTES_PER_ID: u64 = 1_000;

/// And the cluster beside the tables: its WAL (up to `max_wal_size`, 1 GB by default, and
/// more between checkpoints) and its catalogs.
pub const PG_FIXED_BYTES: u64 = 3 << 30;

/// One part of the state on disk: a file or folder of the state directory, a table of the
/// job's schema, or the cluster's WAL.
pub struct Part {
    pub name: String,
    /// Allocated bytes (what `du` counts), or `pg_total_relation_size` of a table.
    pub bytes: u64,
    /// Whether it is the job's own (counted per ID), not the cluster's.
    pub job: bool,
}

/// Where the job lives.
pub enum Home {
    Dir(PathBuf),
    Pg { cluster: PgCluster, db: TestDb },
}

impl Home {
    /// A fresh home for a job: a state directory under `tmp` (created by the first run), or
    /// a new schema of a throwaway, durable cluster started now.
    pub fn new(store: Store, tmp: &Path) -> Home {
        match store {
            Store::Sled => Home::Dir(tmp.join("state")),
            Store::Pg => {
                let cluster = start_cluster(true);
                let db = cluster.create_db();
                Home::Pg { cluster, db }
            }
        }
    }

    /// A sentence saying what it is.
    pub fn describe(&self) -> String {
        match self {
            Home::Dir(dir) => format!("a sled state directory, {}", dir.display()),
            Home::Pg { cluster, db } => format!(
                "PostgreSQL, a throwaway cluster in {} (fsync, synchronous_commit and \
                 full_page_writes on), schema {} of database {}, job `{JOB}`",
                cluster.socket_dir().display(),
                db.schema,
                db.name
            ),
        }
    }

    pub fn state(&self) -> State<'_> {
        match self {
            Home::Dir(dir) => State::Dir(dir),
            Home::Pg { db, .. } => State::Pg {
                url: &db.url,
                job: JOB,
            },
        }
    }

    /// `COMMAND --state ...` (and `--job` for PostgreSQL): a command of the binary on the job.
    pub fn command(&self, command: &str) -> Vec<String> {
        let mut args = vec![command.to_string(), "--state".into()];
        match self.state() {
            State::Dir(dir) => args.push(dir.display().to_string()),
            State::Pg { url, job } => args.extend([url.to_string(), "--job".into(), job.into()]),
        }
        args
    }

    /// Where its bytes go on disk, and at most how many for `n` IDs.
    pub fn bound(&self, n: u64, tmp: &Path) -> (PathBuf, u64) {
        match self {
            // Not created yet: its parent is on the same file system.
            Home::Dir(_) => (tmp.to_path_buf(), n * SLED_BYTES_PER_ID),
            Home::Pg { cluster, .. } => (
                cluster.socket_dir().to_path_buf(),
                n * PG_BYTES_PER_ID + PG_FIXED_BYTES,
            ),
        }
    }

    /// How [`Home::bound`] is made, for the report.
    pub fn bound_rule(&self) -> String {
        match self {
            Home::Dir(_) => format!("{SLED_BYTES_PER_ID} bytes per ID"),
            Home::Pg { .. } => format!(
                "{PG_BYTES_PER_ID} bytes per ID + {} GiB for the WAL and the catalogs",
                PG_FIXED_BYTES >> 30
            ),
        }
    }

    /// The most calls a kill -9 of a run at `concurrency` may repeat (the engine's bound).
    pub fn repeat_bound(&self, concurrency: usize) -> u64 {
        (match self {
            Home::Dir(_) => engine::max_unsynced_items(concurrency),
            Home::Pg { .. } => engine::max_unsynced_items_over_network(concurrency),
        }) as u64
    }

    /// What a reader of the resume's figures should know of this store, if anything.
    pub fn resume_note(&self) -> Option<&'static str> {
        match self {
            Home::Dir(_) => None,
            Home::Pg { .. } => Some(
                "A resumed PostgreSQL worker calls the buckets nobody holds at once, but takes \
                 over those the killed worker had leased only once their lease has expired \
                 (`--lease-ttl`, 30 s by default, docs/postgres.md): the last tenth's time \
                 holds that wait.",
            ),
        }
    }

    /// The job's bytes on disk now: the state directory's allocated bytes, or the
    /// `pg_total_relation_size` of its tables.
    pub fn size(&self) -> u64 {
        match self {
            Home::Dir(dir) => dir_size(dir).1,
            Home::Pg { cluster, db } => table_sizes(cluster, db).iter().map(|t| t.total).sum(),
        }
    }

    /// Its parts on disk, largest first: the state directory's entries (`du` of each), or
    /// the job's tables and the cluster's WAL.
    pub fn parts(&self) -> Result<Vec<Part>> {
        Ok(match self {
            Home::Dir(dir) => files_of(dir)?
                .into_iter()
                .map(|(name, bytes)| Part {
                    name,
                    bytes,
                    job: true,
                })
                .collect(),
            Home::Pg { cluster, db } => {
                let mut parts: Vec<Part> = table_sizes(cluster, db)
                    .into_iter()
                    .map(|t| Part {
                        name: format!(
                            "table {} (heap {}, the rest indexes and TOAST)",
                            t.name,
                            size(t.table)
                        ),
                        bytes: t.total,
                        job: true,
                    })
                    .collect();
                parts.push(Part {
                    name: "the cluster's WAL (pg_wal, not the job's alone)".into(),
                    bytes: dir_size(&cluster.socket_dir().join("data").join("pg_wal")).1,
                    job: false,
                });
                parts
            }
        })
    }
}
