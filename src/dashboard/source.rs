//! One read of a job ([`read`]), wherever it is kept: what a look at its place finds.
//!
//! Owns [`Reading`]: what one look at the job finds. The job's place ([`JobPlace::look`])
//! decides what can be read: while a run holds a state directory's store (sled cannot be
//! opened by a second process), the reading holds only what the run publishes without the
//! lock (`live.json` and the history file), unless it is the run's own dashboard reading
//! ([`crate::job::RunningPlace`]: the run's store, read beside it); once no run holds it,
//! the store is opened as a reader for the moment of the reading (spec, counts, the bucket
//! map) and let go at once. A
//! PostgreSQL job, its history included, is read through a session-less reader, never in
//! the way of its workers.

use serde::Serialize;

use crate::history::Record;
use crate::job::{HistoryError, JobPlace, Look};
use crate::live::{LiveSnapshot, Runner};
use crate::store::{BucketState, JobView, Store, StoreError, StoreStats};

/// Reading a job failed.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The history could not be read.
    #[error(transparent)]
    History(#[from] HistoryError),
    /// The reading's task panicked or was cancelled.
    #[error("the reading stopped: {0}")]
    Aborted(String),
    /// The place holds no job yet (the place's words for it).
    #[error("{0}")]
    NoJob(String),
}

/// What a reading should take beyond the job's figures.
#[derive(Debug, Clone, Default)]
pub(crate) struct Wants {
    /// Every bucket's state (the bucket map).
    pub buckets: bool,
    /// Failed items.
    pub failures: Option<FailureQuery>,
}

/// Which failed items to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FailureQuery {
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
pub(crate) struct FailureRow {
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
pub(crate) struct Failures {
    /// Failed items the query matched, listed or not.
    pub matched: u64,
    /// The listed ones, at most the query's `limit`.
    pub rows: Vec<FailureRow>,
}

/// What one look at the job found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reading {
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
    /// The API limits the job learnt from refusals, as kept, if the store was read.
    pub learned: Vec<crate::quota::KeptLimit>,
}

/// One look at the job at `place`.
pub(crate) async fn read<P: JobPlace>(place: &P, wants: &Wants) -> Result<Reading, DashboardError> {
    let names = place.names();
    let mut reading = Reading {
        shown: names.shown,
        ..Reading::default()
    };
    let store = match place.look().await? {
        Look::Free { store, last } => {
            // No run holds the store: a snapshot not marked finished is a runner that died.
            reading.runner = last.as_ref().map(|s| {
                if s.finished {
                    Runner::Finished
                } else {
                    Runner::Died
                }
            });
            reading.live = last;
            read_store(&*store, &mut reading, wants, &names.unmade, None).await?;
            #[cfg(feature = "postgres")]
            if let Some(crew) = place.crew(&store).await? {
                reading.runner = Some(if crew.running() {
                    Runner::Live
                } else {
                    Runner::Finished
                });
                reading.workers = Some(serde_json::to_value(&crew.workers).unwrap_or_default());
            }
            Some(store)
        }
        Look::Running { store, live } => {
            // This process runs the job: its store is read beside the run.
            reading.runner = Some(Runner::Live);
            // The run's own figures, current to its last snapshot: no walk of the store.
            let stats = live.as_ref().map(LiveSnapshot::stats);
            reading.live = live;
            read_store(&*store, &mut reading, wants, &names.unmade, stats).await?;
            #[cfg(feature = "postgres")]
            if let Some(crew) = place.crew(&store).await? {
                reading.workers = Some(serde_json::to_value(&crew.workers).unwrap_or_default());
            }
            Some(store)
        }
        Look::Held { live, .. } => {
            let now = crate::store::now_ms();
            reading.runner = live.as_ref().map(|s| s.runner(now));
            reading.stats = live.as_ref().map(LiveSnapshot::stats);
            reading.live = live;
            None
        }
    };
    reading.history = place.history(store.as_deref()).await?;
    drop(store);
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

/// Everything of `wants` from an opened store; its figures are `stats` when given (a run
/// reading its own store has them), else the store's.
async fn read_store<S: Store>(
    store: &S,
    reading: &mut Reading,
    wants: &Wants,
    unmade: &str,
    stats: Option<StoreStats>,
) -> Result<(), DashboardError> {
    let spec = crate::job::stored_job(store)
        .await?
        .ok_or_else(|| DashboardError::NoJob(unmade.to_string()))?;
    reading.store_read = true;
    reading.bucket_size = Some(spec.bucket_size);
    reading.spec = Some(serde_json::to_value(&spec).unwrap_or_default());
    reading.stats = Some(match stats {
        Some(s) => s,
        None => store.stats().await?,
    });
    reading.learned = store.learned_limits().await?;
    if wants.buckets {
        // The bucket list is read once, for the map and the failures by class.
        let mut all = Vec::new();
        let mut from = 0;
        loop {
            let page = store.buckets(from, crate::store::view::PAGE).await?;
            let Some(last) = page.last() else { break };
            from = last.offset.bucket + 1;
            all.extend(page);
        }
        let summary = crate::sink::FailureSummary::of_buckets(store, &all, 0)
            .await
            .map_err(export_error)?;
        reading.failed_by_class = Some(summary.by_class);
        reading.buckets = Some(all);
    } else {
        let summary = crate::sink::FailureSummary::of(store, 0)
            .await
            .map_err(export_error)?;
        reading.failed_by_class = Some(summary.by_class);
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
