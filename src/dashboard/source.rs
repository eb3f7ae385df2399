//! Where a dashboard reads a job from, and one read of it.
//!
//! Owns [`Source`] (a state directory or a PostgreSQL job) and [`Reading`]: what one look at
//! the job finds. A state directory's store is locked by the run that holds it, and sled
//! cannot be opened by a second process: while a run is active the reading holds only what
//! the run publishes without the lock (`live.json` and the history file); once no run holds
//! the directory, the store is opened as a reader for the moment of the reading (spec,
//! counts, the bucket map) and let go at once. A PostgreSQL job, its history included, is
//! read through a session-less reader, never in the way of its workers.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::history::{self, Record};
use crate::live::{self, LiveSnapshot, Runner};
use crate::store::sled_store::{OpenMode, SledStore};
use crate::store::{BucketState, JobView, Store, StoreError, StoreStats};

/// Where the job is.
#[derive(Clone)]
pub enum Source {
    /// A state directory.
    Dir(PathBuf),
    /// A job of a PostgreSQL database (the URL's `${VAR}`s expanded when it is opened):
    /// made with [`Source::pg`].
    #[cfg(feature = "postgres")]
    Pg {
        /// The database URL, `${VAR}`s not yet expanded.
        url: String,
        /// The job's name in the database.
        job: String,
        /// The reader, once opened: kept for the readings that follow.
        opened: PgReader,
    },
}

/// A PostgreSQL job's reader, opened by the first reading.
#[cfg(feature = "postgres")]
pub type PgReader =
    std::sync::Arc<tokio::sync::Mutex<Option<std::sync::Arc<crate::store::postgres::PgStore>>>>;

/// Reading a job failed.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The history could not be read.
    #[error(transparent)]
    History(#[from] history::HistoryReadError),
    /// The reading's task panicked or was cancelled.
    #[error("the reading stopped: {0}")]
    Aborted(String),
    /// The state directory holds no job yet.
    #[error("{0} holds no job yet (its first run stopped before creating one)")]
    NoJob(String),
    /// The PostgreSQL job could not be opened or read.
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    Pg(#[from] crate::store::postgres::PgError),
}

impl Source {
    /// The job `job` of the PostgreSQL database at `url`.
    #[cfg(feature = "postgres")]
    pub fn pg(url: String, job: String) -> Source {
        Source::Pg {
            url,
            job,
            opened: PgReader::default(),
        }
    }

    /// How the job is named on the page: the directory, or the job and its database
    /// without a password.
    pub fn shown(&self) -> String {
        match self {
            Source::Dir(dir) => dir.display().to_string(),
            #[cfg(feature = "postgres")]
            Source::Pg { url, job, .. } => {
                format!("job {job:?} of {}", crate::store::postgres::redact_url(url))
            }
        }
    }

    /// Check that the source can be read at all (the directory is a state directory, the
    /// database and job exist), before a server starts.
    pub async fn check(&self) -> Result<(), DashboardError> {
        match self {
            // The store's own open says why not (missing, not a state directory); one a run
            // holds is one.
            Source::Dir(dir) => match SledStore::open(dir, OpenMode::Read, CACHE_BYTES) {
                Ok(_) => Ok(()),
                Err(e) if matches!(e.root(), StoreError::Busy { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            },
            #[cfg(feature = "postgres")]
            Source::Pg { .. } => self.read(&Wants::default()).await.map(|_| ()),
        }
    }

    /// One look at the job.
    pub async fn read(&self, wants: &Wants) -> Result<Reading, DashboardError> {
        match self {
            Source::Dir(dir) => read_dir(dir, wants).await,
            #[cfg(feature = "postgres")]
            Source::Pg { url, job, opened } => read_pg(self.shown(), url, job, opened, wants).await,
        }
    }
}

/// The sled page cache of a reading: small, it reads little.
const CACHE_BYTES: u64 = 8 << 20;

/// What a reading should take beyond the job's figures.
#[derive(Debug, Clone, Default)]
pub struct Wants {
    /// Every bucket's state (the bucket map).
    pub buckets: bool,
    /// Failed items.
    pub failures: Option<FailureQuery>,
}

/// Which failed items to list.
#[derive(Debug, Clone, Default)]
pub struct FailureQuery {
    /// Only this error class (its name); none: every class.
    pub class: Option<String>,
    /// Only the buckets from the first to the last (both included).
    pub buckets: Option<(u64, u64)>,
    /// Listed at most (all are counted).
    pub limit: usize,
}

/// One failed item as the page lists it (the answer's body is left out: an API may echo a
/// request's secret in it).
#[derive(Debug, Clone, Serialize)]
pub struct FailureRow {
    /// The item's ID.
    pub id: String,
    /// Its job bucket.
    pub bucket: u64,
    /// Its 0-based input row.
    pub row: u64,
    /// Its error class name; none when not recorded.
    pub class: Option<String>,
    /// The last attempt's HTTP status, if it had one.
    pub http_status: Option<u16>,
    /// The final error message.
    pub error: Option<String>,
    /// Attempts made, across reruns.
    pub attempts: u32,
    /// When it failed (ms since the Unix epoch).
    pub finished_at_ms: Option<u64>,
}

/// The failures a query matched.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Failures {
    /// Failed items the query matched, listed or not.
    pub matched: u64,
    /// The listed ones, at most the query's `limit`.
    pub rows: Vec<FailureRow>,
}

/// What one look at the job found.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// The directory or the job, as shown.
    pub shown: String,
    /// The store could be read (false: a run holds the state directory's lock).
    pub store_read: bool,
    /// The stored spec (secrets only as `${VAR}`), from the store or the history.
    pub spec: Option<serde_json::Value>,
    /// The job's figures: the store's, or the live run's.
    pub stats: Option<StoreStats>,
    /// The run's live snapshot and how its runner stands.
    pub live: Option<LiveSnapshot>,
    /// How the run that wrote `live` stands (alive, stale, died, ended).
    pub runner: Option<Runner>,
    /// The history's records, oldest first.
    pub history: Vec<Record>,
    /// Every bucket, if asked for and the store was read.
    pub buckets: Option<Vec<BucketState>>,
    /// Failed items, if asked for and the store was read.
    pub failures: Option<Failures>,
    /// By error class, every failed item of the job, if the store was read.
    pub failed_by_class: Option<std::collections::BTreeMap<String, u64>>,
    /// The job's workers (PostgreSQL), as `status --json` lists them.
    pub workers: Option<serde_json::Value>,
    /// IDs per bucket, from the spec; none when no spec was found.
    pub bucket_size: Option<u64>,
}

async fn read_dir(dir: &Path, wants: &Wants) -> Result<Reading, DashboardError> {
    let mut reading = Reading {
        shown: dir.display().to_string(),
        ..Reading::default()
    };
    let now = crate::store::now_ms();
    match SledStore::open(dir, OpenMode::Read, CACHE_BYTES) {
        Ok(store) => {
            // No run is active (we hold the lock): a snapshot not marked finished is a
            // runner that died.
            reading.live = live::read(dir);
            reading.runner = reading.live.as_ref().map(|s| {
                if s.finished {
                    Runner::Finished
                } else {
                    Runner::Died
                }
            });
            read_store(&store, &mut reading, wants).await?;
            drop(store);
        }
        Err(e) if matches!(e.root(), StoreError::Busy { .. }) => {
            let pid = match e.root() {
                StoreError::Busy { pid } => *pid,
                _ => None,
            };
            reading.live = live::read(dir).filter(|s| Some(s.pid) == pid || pid.is_none());
            reading.runner = reading.live.as_ref().map(|s| s.runner(now));
            reading.stats = reading.live.as_ref().map(LiveSnapshot::stats);
        }
        Err(e) => return Err(e.into()),
    }
    reading.history = history::file::read(dir)?;
    if reading.spec.is_none() {
        reading.spec = reading.history.iter().rev().find_map(|r| match r {
            Record::Run(r) => Some(r.spec.clone()),
            Record::Sample(_) => None,
        });
    }
    if reading.bucket_size.is_none() {
        reading.bucket_size = reading
            .spec
            .as_ref()
            .and_then(|s| s.get("bucket_size")?.as_u64());
    }
    Ok(reading)
}

/// Everything of `wants` from an opened store.
async fn read_store<S: Store>(
    store: &S,
    reading: &mut Reading,
    wants: &Wants,
) -> Result<(), DashboardError> {
    let spec = crate::job::stored_job(store)
        .await?
        .ok_or_else(|| DashboardError::NoJob(reading.shown.clone()))?;
    reading.store_read = true;
    reading.bucket_size = Some(spec.bucket_size);
    reading.spec = Some(serde_json::to_value(&spec).unwrap_or_default());
    reading.stats = Some(store.stats().await?);
    let summary = crate::sink::FailureSummary::of(store, 0)
        .await
        .map_err(export_error)?;
    reading.failed_by_class = Some(summary.by_class);
    if wants.buckets {
        let mut all = Vec::new();
        let mut from = 0;
        loop {
            let page = store.buckets(from, crate::store::view::PAGE).await?;
            let Some(last) = page.last() else { break };
            from = last.offset.bucket + 1;
            all.extend(page);
        }
        reading.buckets = Some(all);
    }
    if let Some(q) = &wants.failures {
        let mut found = Failures::default();
        let mut visit = |id: &str, r: &crate::store::ItemRecord| {
            let class = r.class.map(|c| c.name().to_string());
            if q.class
                .as_ref()
                .is_some_and(|want| Some(want) != class.as_ref())
                || q.buckets.is_some_and(|(a, b)| !(a..=b).contains(&r.bucket))
            {
                return Ok(());
            }
            found.matched += 1;
            if found.rows.len() < q.limit {
                found.rows.push(FailureRow {
                    id: id.to_string(),
                    bucket: r.bucket,
                    row: r.row,
                    class,
                    http_status: r.http_status,
                    error: r.error.clone(),
                    attempts: r.attempts,
                    finished_at_ms: r.finished_at_ms,
                });
            }
            Ok(())
        };
        // One bucket is read alone; for a range the walk goes over the job (reading only
        // the items of buckets that may hold failures) and the visitor keeps the range's.
        let one = q.buckets.filter(|(a, b)| a == b).map(|(a, _)| a);
        store
            .for_each_failure(one, &mut visit)
            .await
            .map_err(export_error)?;
        reading.failures = Some(found);
    }
    Ok(())
}

/// A walk's error: the store's own, or (never, here: the visitor does not fail) a write.
fn export_error(e: crate::store::ExportError) -> DashboardError {
    match e {
        crate::store::ExportError::Store(e) => e.into(),
        other => StoreError::corrupt(other.to_string()).into(),
    }
}

#[cfg(feature = "postgres")]
async fn read_pg(
    shown: String,
    url: &str,
    job: &str,
    opened: &PgReader,
    wants: &Wants,
) -> Result<Reading, DashboardError> {
    use crate::store::postgres::{PgOpen, PgStore, PgTarget};
    let store = {
        let mut opened = opened.lock().await;
        match &*opened {
            Some(store) => store.clone(),
            None => {
                let target = PgTarget::parse(url)?;
                let open = PgOpen {
                    worker: false,
                    ..PgOpen::new(job)
                };
                let store = std::sync::Arc::new(PgStore::open(&target, &open).await?);
                *opened = Some(store.clone());
                store
            }
        }
    };
    let store = &*store;
    let mut reading = Reading {
        shown,
        ..Reading::default()
    };
    read_store(store, &mut reading, wants).await?;
    reading.history = store
        .history()
        .await?
        .into_iter()
        .filter_map(|r| serde_json::from_value(r).ok())
        .collect();
    let workers = store.workers().await?;
    let live = workers.iter().any(|w| w.state != "expired");
    reading.runner = Some(if live { Runner::Live } else { Runner::Finished });
    reading.workers = Some(serde_json::to_value(&workers).unwrap_or_default());
    Ok(reading)
}
