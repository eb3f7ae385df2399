//! The embedded store: one state directory holding a sled database.
//!
//! Layout of a state directory:
//!
//! ```text
//! DIR/highwater.json   marker: {"format":"highwater-state","version":6}, written first
//! DIR/lock             advisory lock (flock) held by the running process; holds its pid
//! DIR/results.log      the items' final records, appended in groups (see [`results_log`]
//!                      and [`log_groups`]; each record binary with its body compressed, see
//!                      [`item_codec`])
//! DIR/results.dict     the zstd dictionary of the bodies, once trained (see [`compression`])
//! DIR/positions        input row → the row's current record in results.log
//! DIR/pages.log        the pages of paginated IDs, created with the first (see [`pages_log`]
//!                      and [`page_codec`])
//! DIR/page_heads       input row → the row's last page in pages.log
//! DIR/ids.idx          ID → row of its first occurrence (see [`id_index`])
//! DIR/ids.log          the segments' and reruns' ID lists (see [`id_lists`])
//! DIR/sled/            the sled database, trees:
//!     meta     "version" → u32, "job" → the job spec's bytes (opaque: `StoredJob::spec`; a
//!              JobSpec JSON in every store so far), "job_id" → its id (UTF-8), "job_version"
//!              → its encoding version (u32 BE; both absent before: version 1, id read from
//!              the JSON), "lease" → u64 BE: the last lease token granted (absent: none),
//!              "planner" → PlannerState JSON,
//!              "results" → what of results.log is durable ([`Durable`]),
//!              "pages" → what of pages.log is durable ([`Durable`]; absent: no pages.log,
//!              or none of it durable yet),
//!              "indexed" → u64 BE: buckets whose IDs are durable in ids.idx,
//!              "quotas" → the job's quota usage (QuotaLedger JSON; absent: none used),
//!              "learned" → the windows learnt from the API's refusals (JSON array of
//!              `KeptLimit`s; absent: none),
//!              "dict" → which results.dict the records need ([`compression::DictRecord`];
//!              absent: none yet), written durably before any record uses it
//!     offsets  first bucket (u64 BE) → segment JSON       (the offset log, see below)
//!     commits  first bucket (u64 BE) → JSON array of CommitRecords of consecutive buckets
//!              committed together                   (the commit log, see below)
//!     ids      first bucket (u64 BE) → where the segment's list of unique IDs with their
//!              rows (in input order, bucket after bucket; binary, see `encode_ids`) is in
//!              DIR/ids.log ([`ListRef`]; formats 1-2 kept the list here)
//!     items    (formats 1 and 2 only) ID bytes → ItemRecord JSON; moved to results.log
//!              when such a store is opened
//!     bad      row (u64 BE) → BadLine JSON
//!     reruns         rerun (u32 BE) → RerunRecord JSON
//!     rerun_offsets  rerun (u32 BE) ++ bucket (u64 BE) → RerunOffset JSON (a rerun's offset log)
//!     rerun_ids      same key → where the rerun bucket's IDs with their rows (as in `ids`)
//!                    are in DIR/ids.log ([`ListRef`]; format 3 kept the list here)
//!     rerun_commits  same key → CommitRecord JSON                (a rerun's commit log)
//! ```
//!
//! The offset log holds one record per planner batch, a **segment**: a run of consecutive
//! buckets cut from the same input, with the row range and counts of each (`Segment`). The
//! planner writes a batch of about 1,000 rows at a time, so a job with one-row buckets pays one
//! offset write per 1,000 buckets, not one per bucket; with buckets of 1,000 rows or more a
//! segment is one bucket. Format 1 stored one `OffsetRecord` per bucket; such a record reads as
//! a segment of one bucket, so a format 1 store opens (and is marked format 2).
//!
//! The commit log likewise holds one record per **run** of consecutive buckets committed by
//! the same write (a group commit, or one background checkpoint), keyed by its first bucket.
//! Runs never overlap and hold at most 256 buckets: a bucket is committed once, and a commit
//! of a bucket already in the log is dropped. A rerun that moves a bucket's counts rewrites the
//! run holding it. Format 1's one record per bucket reads as a run of one.
//!
//! Stores written before reruns existed simply have these trees empty; item records without
//! the newer fields (attempt times, rerun) read with those fields unset.
//!
//! Results are not kept in sled: one sled key per ID made sled's page table (held in memory,
//! and rebuilt at every open) grow by about 35 bytes per ID, so a 10M-ID job held ~370 MB and
//! took 0.7 s to open. sled holds what is per bucket; the per-ID data lives in files read with
//! `pread` (the page cache holds them, not the process).
//!
//! Durability: sled flushes on its own every 500 ms, but nothing here relies on that. A plan
//! write is one multi-tree transaction (all of a batch of buckets or none). Callers order the
//! writes with [`Store::sync`]: plans are synced before their items are dispatched; results
//! are synced before their buckets' commit records are written. A sync makes the pages log,
//! then the results log and the ID index durable first, then records in sled how far they
//! are durable, then flushes sled: so a commit record (written after a sync) never names
//! results that are not on disk, and an open knows where to replay the logs from and which
//! buckets' IDs to index again. A record that counts pages is appended only once the pages
//! log is durable (see `pages.rs`).

mod cache;
mod codec;
mod compression;
mod dir;
mod handle;
pub(crate) mod id_index;
pub(crate) mod id_lists;
mod id_rows;
mod item_codec;
mod leases;
mod log_groups;
mod logs;
mod page_codec;
mod pages;
pub(crate) mod pages_log;
mod reruns;
pub(crate) mod results_log;
mod side_files;
mod sled_files;
#[cfg(test)]
mod tests;
mod upgrade;
mod varint;

use cache::*;
use codec::*;
use dir::*;
use handle::*;
use logs::*;
use pages_log::{PagesLog, PagesSlot};
use side_files::*;
use sled_files::SledFiles;
use upgrade::*;

pub(crate) use dir::{write_atomically, MARKER};
pub(crate) use handle::REOPEN_AFTER_BYTES;
pub use handle::{set_release_memory_hook, DEFAULT_CACHE_BYTES};

use super::*;
use crate::input::{Cursor, Fingerprint};
use crate::quota::{KeptLimit, QuotaGrant, QuotaLedger, QuotaWant};
use crate::watchdog;
use compression::{Compression, DictRecord, DICT_META_KEY};
use id_index::IdIndex;
use id_lists::{IdLists, ListRef};
use results_log::{Durable, LogError, ResultsLog};
use serde::Deserialize;
use sled::transaction::ConflictableTransactionError;
use sled::Transactional;
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The ID index's file in a state directory.
pub(crate) const INDEX_FILE: &str = "ids.idx";

/// A state directory, opened and locked for this process.
pub struct SledStore {
    path: PathBuf,
    /// The open database. Every operation takes a clone of the `Arc` for its duration (an
    /// iterator keeps it while it lives); [`SledStore::reopen`] swaps in a new handle once
    /// nobody holds the old one. `None` only after a reopen failed: the store is unusable.
    trees: std::sync::RwLock<Option<Arc<Trees>>>,
    cache_bytes: u64,
    /// Bytes of keys and values written since the database was last opened: what the next
    /// open has to replay from sled's log (see [`REOPEN_AFTER_BYTES`]).
    written_since_open: AtomicU64,
    /// [`REOPEN_AFTER_BYTES`], or less in tests.
    reopen_after: AtomicU64,
    /// The length of sled's log file when it was last opened (see [`REOPEN_SHARE`]).
    size_at_open: AtomicU64,
    /// How many times the database was reopened during this handle's life.
    reopens: AtomicU64,
    /// Held by a sync for its flush and the reopen that may follow it.
    sync_gate: tokio::sync::Mutex<()>,
    /// Highest buckets written to the offset and commit logs.
    written: Watermarks,
    /// The last segment, segment IDs and commit run read (see [`ReadCache`]).
    cache: std::sync::Mutex<ReadCache>,
    /// Bumped around every rewrite of an existing commit run (reruns), so a run read before
    /// it is never cached after it.
    runs_rewritten: AtomicU64,
    marker: std::sync::Mutex<MarkerState>,
    /// Every unique ID planned, with its row.
    index: Arc<IdIndex>,
    /// The items' final records.
    results: Arc<ResultsLog>,
    /// The pages of paginated IDs, once there are any.
    pages: PagesSlot,
    /// The bodies' compression (and its dictionary).
    bodies: Arc<Compression>,
    /// The segments' ID lists.
    id_lists: IdLists,
    /// When the index was last made durable (see [`INDEX_SYNC_EVERY`]).
    indexed_at: std::sync::Mutex<std::time::Instant>,
    /// Rows below this were noted in the index by [`Store::first_row`].
    noted: AtomicU64,
    /// What the ID index's check of a row reads (see [`id_rows`]).
    id_rows: std::sync::Mutex<id_rows::IdRows>,
    /// The last lease token granted (see [`Leases`]), and the one held now (0: none).
    tokens: AtomicU64,
    lease: AtomicU64,
    /// Held for the store's lifetime; the flock goes with it.
    _lock: File,
}

/// How to open a state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// It must already be a highwater state directory.
    Existing,
    /// Create it if it does not exist or is empty; otherwise it must be a state directory.
    CreateIfMissing,
    /// It must already be a state directory, opened for a moment by a reader (the
    /// dashboard): a run that finds the lock held by a reader waits for it to let go
    /// (10 s at most) instead of refusing to start.
    Read,
}

impl SledStore {
    /// Open (or create) the state directory at `path`.
    pub fn open(path: &Path, mode: OpenMode, cache_bytes: u64) -> Result<SledStore, StoreError> {
        let io = |source| StoreError::at(path.display(), StoreError::Io(source));
        let not_store = |reason: &str| {
            StoreError::at(
                path.display(),
                StoreError::NotAStore {
                    kind: "state directory",
                    reason: reason.to_owned(),
                },
            )
        };
        let marker_path = path.join(MARKER);
        match fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if mode != OpenMode::CreateIfMissing {
                    return Err(not_store("it does not exist"));
                }
                create_dir_durably(path).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
            Ok(m) if !m.is_dir() => return Err(not_store("it is not a directory")),
            Ok(_) => {}
        }
        if !marker_path.exists() {
            let empty = fs::read_dir(path).map_err(io)?.next().is_none();
            match (mode, empty) {
                (OpenMode::Existing | OpenMode::Read, _) => {
                    return Err(not_store(&format!("it has no {MARKER}")))
                }
                (OpenMode::CreateIfMissing, false) => {
                    return Err(not_store(&format!(
                        "it already holds other files and no {MARKER}; refusing to write into it"
                    )))
                }
                (OpenMode::CreateIfMissing, true) => {
                    let marker = Marker {
                        format: MARKER_FORMAT.into(),
                        version: FORMAT_VERSION,
                        checkpoint: None,
                    };
                    write_atomically(
                        &marker_path,
                        &serde_json::to_vec(&marker).expect("marker serializes"),
                    )
                    .map_err(io)?;
                }
            }
        }
        let marker: Marker = fs::read(&marker_path).map_err(io).and_then(|b| {
            serde_json::from_slice(&b)
                .map_err(|e| not_store(&format!("{MARKER} is unreadable: {e}")))
        })?;
        if marker.format != MARKER_FORMAT {
            return Err(not_store(&format!(
                "{MARKER} names format {:?}",
                marker.format
            )));
        }
        if !READS_VERSIONS.contains(&marker.version) {
            return Err(StoreError::at(
                path.display(),
                StoreError::Version {
                    found: marker.version,
                    supported: FORMAT_VERSION,
                },
            ));
        }
        let lock = lock(path, mode == OpenMode::Read)?;
        let trees = Arc::new(Trees::open(&path.join("sled"), cache_bytes)?);
        let corrupt =
            |reason: String| StoreError::at(path.display(), StoreError::Corrupt { reason });
        let lost = |what: String| {
            corrupt(format!(
                "{what}, although it was durable at {} (files truncated, emptied or replaced); \
                 restore the state directory from a backup or start a new one",
                marker
                    .checkpoint
                    .as_ref()
                    .map(|c| format_ms(c.at_ms))
                    .unwrap_or_default()
            ))
        };
        let sled_err = |e| backend(path, e);
        let stored_version = match trees.meta.get("version").map_err(sled_err)? {
            None if marker.checkpoint.is_some() => {
                return Err(lost("the database holds no highwater data".into()))
            }
            None => None,
            Some(v) => {
                let found = <[u8; 4]>::try_from(v.as_ref())
                    .map(u32::from_be_bytes)
                    .unwrap_or(0);
                if !READS_VERSIONS.contains(&found) {
                    return Err(StoreError::at(
                        path.display(),
                        StoreError::Version {
                            found,
                            supported: FORMAT_VERSION,
                        },
                    ));
                }
                Some(found)
            }
        };
        let upgrading = stored_version.is_some_and(|v| v < FILES_SINCE);
        let durable = match trees.meta.get("results").map_err(sled_err)? {
            Some(bytes) if !upgrading => Durable::from_bytes(&bytes)
                .ok_or_else(|| corrupt("its record of the results log is undecodable".into()))?,
            _ => Durable::default(),
        };
        let results = ResultsLog::open(path, durable).map_err(|e| log_error(path, e))?;
        let pages_durable = match trees.meta.get(pages_log::META_KEY).map_err(sled_err)? {
            Some(bytes) => Durable::from_bytes(&bytes)
                .ok_or_else(|| corrupt("its record of the pages log is undecodable".into()))?,
            None => Durable::default(),
        };
        let pages = PagesLog::open(path, pages_durable, false).map_err(|e| log_error(path, e))?;
        // Where the last ID list the offset log points at ends (in an upgrade, some lists may
        // still be inline in sled: look at all of them). A rerun's lists are appended when it
        // is created, in bucket order, after every list before them: the last one of the
        // latest rerun ends after all other reruns' (a format 3 rerun's lists are inline).
        let mut lists_end = 0;
        let last = if upgrading {
            Box::new(trees.ids.iter())
                as Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>>
        } else {
            Box::new(trees.ids.iter().next_back().into_iter())
        };
        if let Some(entry) = trees.rerun_ids.iter().next_back() {
            let (_, value) = entry.map_err(sled_err)?;
            if let Some(list) = ListRef::from_bytes(&value) {
                lists_end = list.end();
            }
        }
        for entry in last {
            let (_, value) = entry.map_err(sled_err)?;
            if let Some(list) = ListRef::from_bytes(&value) {
                lists_end = lists_end.max(list.end());
            } else if !upgrading {
                return Err(corrupt("an offset record has no place in ids.log".into()));
            }
        }
        let id_lists = IdLists::open(path, lists_end).map_err(|e| log_error(path, e))?;
        let dict = match trees.meta.get(DICT_META_KEY).map_err(sled_err)? {
            Some(bytes) => Some(DictRecord::from_bytes(&bytes).ok_or_else(|| {
                corrupt("its record of the results' dictionary is undecodable".into())
            })?),
            None => None,
        };
        let bodies = Compression::open(path, dict).map_err(|e| {
            StoreError::at(e.path.display(), StoreError::Corrupt { reason: e.reason })
        })?;
        let index_path = path.join(INDEX_FILE);
        let index_io = |source| StoreError::at(index_path.display(), StoreError::Io(source));
        let index = match IdIndex::open(&index_path) {
            // Derived data: the offset log holds every ID, so a damaged index is built again
            // (`index_again` sees it empty).
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                tracing::warn!("{e}: building the ID index again from the offset log");
                fs::remove_file(&index_path).map_err(index_io)?;
                IdIndex::open(&index_path).map_err(index_io)?
            }
            other => other.map_err(index_io)?,
        };
        let tokens = match trees.meta.get("lease").map_err(sled_err)? {
            Some(v) => <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| corrupt("its last lease token is undecodable".into()))?,
            None => 0,
        };
        let store = SledStore {
            path: path.to_owned(),
            trees: std::sync::RwLock::new(Some(trees.clone())),
            cache_bytes,
            written_since_open: AtomicU64::new(0),
            reopen_after: AtomicU64::new(REOPEN_AFTER_BYTES),
            size_at_open: AtomicU64::new(log_size(&path.join("sled"))),
            reopens: AtomicU64::new(0),
            sync_gate: tokio::sync::Mutex::new(()),
            written: Watermarks::default(),
            cache: Default::default(),
            runs_rewritten: AtomicU64::new(0),
            marker: std::sync::Mutex::new(MarkerState {
                written: marker.checkpoint.clone(),
                at: std::time::Instant::now(),
            }),
            index: Arc::new(index),
            results: Arc::new(results),
            pages: PagesSlot::new(pages),
            bodies,
            id_lists,
            indexed_at: std::sync::Mutex::new(std::time::Instant::now()),
            noted: AtomicU64::new(0),
            id_rows: Default::default(),
            tokens: AtomicU64::new(tokens),
            lease: AtomicU64::new(0),
            _lock: lock,
        };
        if let Some(c) = &marker.checkpoint {
            match store.read_job()? {
                Some(job) if job.id == c.job_id => {}
                _ => return Err(lost(format!("the database lost job {}", c.job_id))),
            }
            if let Some(b) = c.last_planned_bucket {
                if store.segment_of(b)?.is_none() {
                    return Err(lost(format!("the offset log lost bucket {b}")));
                }
            }
            if let Some(b) = c.last_committed_bucket {
                if store.commit_run_of(b)?.is_none() {
                    return Err(lost(format!("the commit log lost bucket {b}")));
                }
            }
        }
        match stored_version {
            None => {
                trees
                    .meta
                    .insert("version", &FORMAT_VERSION.to_be_bytes())
                    .map_err(sled_err)?;
                trees.flush().map_err(sled_err)?;
            }
            Some(_) if upgrading => store.upgrade()?,
            Some(version) => {
                store.index_again()?;
                if version < FORMAT_VERSION {
                    // Formats 3 to 5: nothing to move (format 3's reruns' inline lists, format
                    // 4's JSON records and format 5's results log entries of one record are
                    // read where they are); from now on an older build must refuse the store
                    // (it would take a group entry for damage).
                    trees
                        .meta
                        .insert("version", &FORMAT_VERSION.to_be_bytes())
                        .map_err(sled_err)?;
                    trees.flush().map_err(sled_err)?;
                }
            }
        }
        if marker.version != FORMAT_VERSION {
            // The database is the current format now (upgraded above, maybe by an earlier
            // open that stopped before this): so is the marker.
            let upgraded = Marker {
                version: FORMAT_VERSION,
                ..marker.clone()
            };
            write_atomically(
                &marker_path,
                &serde_json::to_vec(&upgraded).expect("marker serializes"),
            )
            .map_err(io)?;
        }
        // A dictionary written before a crash, and not recorded yet: record it now.
        store.record_dictionary_blocking()?;
        drop(trees);
        // The entries this open created (the files beside sled's) are durable with their
        // directory: a power cut must not leave the marker without the files it describes.
        sled_files::sync_dir(path).map_err(io)?;
        Ok(store)
    }

    /// Record a newly written results' dictionary in `meta`, durably, then use it: no record
    /// compressed with it reaches the disk before the store's record of it does (see
    /// [`compression`]).
    async fn record_dictionary(&self) -> Result<(), StoreError> {
        let Some(new) = self.bodies.take_unrecorded() else {
            return Ok(());
        };
        let t = self.t()?;
        t.meta
            .insert(DICT_META_KEY, &new.record.to_bytes())
            .map_err(|e| self.err(e))?;
        let (db, files) = (t.db.clone(), t.files.clone());
        drop(t);
        sled_files::flush_async(&db, &files)
            .await
            .map_err(|e| self.err(e))?;
        self.use_dictionary(&new.dict)
    }

    /// [`SledStore::record_dictionary`], blocking (at open).
    fn record_dictionary_blocking(&self) -> Result<(), StoreError> {
        let Some(new) = self.bodies.take_unrecorded() else {
            return Ok(());
        };
        let t = self.t()?;
        t.meta
            .insert(DICT_META_KEY, &new.record.to_bytes())
            .map_err(|e| self.err(e))?;
        t.flush().map_err(|e| self.err(e))?;
        self.use_dictionary(&new.dict)
    }

    fn use_dictionary(&self, dict: &[u8]) -> Result<(), StoreError> {
        self.bodies.install(dict).map_err(|e| {
            self.corrupt(format!(
                "{}: zstd refuses the dictionary: {e}",
                compression::DICT_FILE
            ))
        })
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Corruption found in this state directory.
    pub(super) fn corrupt(&self, reason: impl Into<String>) -> StoreError {
        StoreError::at(self.path.display(), StoreError::corrupt(reason))
    }
}

impl Drop for SledStore {
    /// Leave the marker's checkpoint current, so damage found at the next open is precise.
    fn drop(&mut self) {
        if let Err(e) = self.flush_and_checkpoint(true) {
            tracing::warn!("closing the store: {e}");
        }
    }
}

/// The embedded store's async methods do their work inside the future: reads are `pread`s
/// the page cache serves and sled lookups in memory, writes are appends and in-memory sled
/// batches, all cheap and what the engine's threads did before the trait was async. Only a
/// sync's fdatasync of the side files goes to the blocking pool (see [`Store::sync`] below).
impl Store for SledStore {
    async fn job(&self) -> Result<Option<StoredJob>, StoreError> {
        self.read_job()
    }

    async fn put_job(&self, job: &StoredJob) -> Result<(), StoreError> {
        let t = self.t()?;
        let mut batch = sled::Batch::default();
        batch.insert("job", job.spec.as_slice());
        batch.insert("job_version", &job.version.to_be_bytes());
        batch.insert("job_id", job.id.as_bytes());
        t.meta.apply_batch(batch).map_err(|e| self.err(e))?;
        t.flush().map_err(|e| self.err(e))?;
        Ok(())
    }

    /// A compare-and-swap update of the `quotas` key (the closure may run more than once;
    /// the grants of the run that was applied are returned), flushed before it returns.
    async fn reserve_quota(
        &self,
        wants: &[QuotaWant],
        now_ms: u64,
    ) -> Result<Vec<QuotaGrant>, StoreError> {
        let t = self.t()?;
        let mut grants = Ok(Vec::new());
        t.meta
            .update_and_fetch(b"quotas", |old| {
                let mut ledger = match old.map(|b| self.decode::<QuotaLedger>("quota usage", b)) {
                    Some(Ok(ledger)) => ledger,
                    None => QuotaLedger::default(),
                    Some(Err(e)) => {
                        grants = Err(e);
                        return old.map(<[u8]>::to_vec);
                    }
                };
                grants = Ok(ledger.reserve(wants, now_ms));
                Some(serde_json::to_vec(&ledger).expect("a ledger always serializes"))
            })
            .map_err(|e| self.err(e))?;
        let grants = grants?;
        t.flush_async().await.map_err(|e| self.err(e))?;
        Ok(grants)
    }

    async fn quota_ledger(&self) -> Result<QuotaLedger, StoreError> {
        let t = self.t()?;
        Ok(self
            .get(&t.meta, b"quotas", "quota usage")?
            .unwrap_or_default())
    }

    async fn learned_limits(&self) -> Result<Vec<KeptLimit>, StoreError> {
        let t = self.t()?;
        Ok(self
            .get(&t.meta, b"learned", "learnt limits")?
            .unwrap_or_default())
    }

    /// Written without a flush of its own: the next write of results (or sled's own
    /// periodic flush) makes it durable; a crash before loses only what a run learns again.
    async fn keep_learned_limits(&self, limits: &[KeptLimit]) -> Result<(), StoreError> {
        let t = self.t()?;
        let bytes = serde_json::to_vec(limits).expect("kept limits always serialize");
        t.meta.insert(b"learned", bytes).map_err(|e| self.err(e))?;
        Ok(())
    }

    async fn planner(&self) -> Result<PlannerState, StoreError> {
        let t = self.t()?;
        Ok(self
            .get(&t.meta, b"planner", "planner")?
            .unwrap_or_default())
    }

    async fn first_rows(&self, rows: &[(u64, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        let mut out = Vec::with_capacity(rows.len());
        for &(row, id) in rows {
            let first = self
                .index
                .insert(id, row, &mut |r, s| self.holds(r, s))
                .map_err(|e| self.index_error(e))?;
            // Its ID, until planned, is only here for the check of a repeat's fragment.
            if first.is_none_or(|first| first == row) {
                self.note_rows([(row, id)]);
            }
            self.noted.fetch_max(row + 1, Ordering::AcqRel);
            out.push(first.filter(|first| *first < row));
        }
        Ok(out)
    }

    async fn plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> Result<(), StoreError> {
        let _watch = watchdog::watch("writing the plan");
        self.write_plan(buckets, planner)
    }

    async fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        let _watch = watchdog::watch("writing results");
        self.record_dictionary().await?;
        self.pages_before_record(results).await?;
        // The group's records encoded into one buffer: no allocation per record.
        let mut encoded = Vec::with_capacity(results.len() * 256);
        let mut ends = Vec::with_capacity(results.len());
        for (id, r) in results {
            item_codec::encode(r, &self.bodies, &mut encoded).map_err(|e| {
                StoreError::at(
                    self.path.display(),
                    StoreError::backend(format!("cannot store the record of {id}: {e}")),
                )
            })?;
            ends.push(encoded.len());
        }
        let starts = std::iter::once(0).chain(ends.iter().copied());
        self.results
            .append(
                results
                    .iter()
                    .zip(starts.zip(&ends))
                    .map(|((id, r), (start, &end))| (r.row, id.as_str(), &encoded[start..end])),
            )
            .map_err(|e| self.log_err(e))
    }

    async fn sync(&self) -> Result<(), StoreError> {
        let _gate = self.sync_gate.lock().await;
        let planned = self.written.planned.load(Ordering::Acquire);
        let committed = self.written.committed.load(Ordering::Acquire);
        // fdatasync blocks: off the async workers, which serve the HTTP calls meanwhile.
        let index_due = self.index_due(planned, false);
        let (results, index) = (self.results.clone(), self.index.clone());
        let pages = self.pages.get();
        let side = watchdog::watch("syncing the results log");
        let synced = tokio::task::spawn_blocking(move || {
            side_sync(pages.as_deref(), &results, &index, index_due, false)
        })
        .await
        .map_err(|e| {
            StoreError::at(
                self.path.display(),
                StoreError::backend(format!("syncing the results log: {e}")),
            )
        })?;
        drop(side);
        let t = self.t()?;
        self.note_side_files(&t, planned, synced)?;
        let (db, files) = (t.db.clone(), t.files.clone());
        drop(t);
        sled_files::flush_async(&db, &files)
            .await
            .map_err(|e| self.err(e))?;
        drop(db);
        self.write_checkpoint(planned, committed, false)?;
        let written = self.written_since_open.load(Ordering::Acquire);
        let threshold = self
            .reopen_after
            .load(Ordering::Relaxed)
            .max(self.size_at_open.load(Ordering::Acquire) / REOPEN_SHARE);
        if written >= threshold {
            let started = std::time::Instant::now();
            let reopened = self.reopen()?;
            tracing::debug!(
                written,
                reopened,
                ms = started.elapsed().as_millis() as u64,
                "reopened the database so sled writes a snapshot"
            );
        }
        Ok(())
    }

    fn keeps_pages(&self) -> bool {
        true
    }

    async fn record_pages(&self, pages: &[(String, PageRecord)]) -> Result<(), StoreError> {
        let _watch = watchdog::watch("writing pages");
        self.record_dictionary().await?;
        self.write_pages(pages)
    }

    async fn page_marks(
        &self,
        generation: u32,
        ids: &[(u64, &str)],
    ) -> Result<Vec<Option<PageMark>>, StoreError> {
        self.read_page_marks(generation, ids)
    }

    async fn pages(
        &self,
        row: u64,
        id: &str,
        generation: u32,
        from: u32,
        count: u32,
    ) -> Result<Vec<PageRecord>, StoreError> {
        self.read_pages(row, id, generation, from, count)
    }

    async fn buckets(&self, from: u64, limit: usize) -> Result<Vec<BucketState>, StoreError> {
        self.read_buckets(from, limit)
    }

    async fn bucket_items(
        &self,
        bucket: &OffsetRecord,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.items_of(bucket)
    }

    async fn item(&self, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        let found = self.index.get(id, &mut |r, s| self.holds(r, s));
        match found.map_err(|e| self.index_error(e))? {
            Some(row) => self.result(row, id),
            None => Ok(None),
        }
    }

    async fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError> {
        let t = self.t()?;
        let mut out = Vec::new();
        for entry in t.bad.iter().take(limit) {
            let (_, v) = entry.map_err(|e| self.err(e))?;
            out.push(self.decode("bad line", &v)?);
        }
        Ok(out)
    }

    async fn reruns(&self) -> Result<Vec<RerunRecord>, StoreError> {
        let t = self.t()?;
        self.decode_all(t.reruns.iter(), "rerun")
    }

    async fn create_rerun(
        &self,
        rerun: &RerunRecord,
        buckets: &[RerunBucket],
    ) -> Result<(), StoreError> {
        let t = self.t()?;
        // The lists first, durable in ids.log before the offset records that point at them
        // (kept in sled, a rerun of millions of IDs would have sled hold them all in memory).
        let lists: Vec<Vec<u8>> = buckets
            .iter()
            .map(|b| encode_ids(&b.items, &b.values))
            .collect();
        let refs = self.id_lists.append(&lists).map_err(|e| self.log_err(e))?;
        drop(lists);
        let mut offsets = sled::Batch::default();
        let mut ids = sled::Batch::default();
        for (b, list) in buckets.iter().zip(refs) {
            let key = rerun_key(b.offset.rerun, b.offset.bucket);
            offsets.insert(&key, json(&b.offset));
            ids.insert(&key, &list.to_bytes());
        }
        let record = json(rerun);
        (&t.reruns, &t.rerun_offsets, &t.rerun_ids)
            .transaction(|(r, o, i)| {
                o.apply_batch(&offsets)?;
                i.apply_batch(&ids)?;
                r.insert(&rerun.number.to_be_bytes(), record.as_slice())?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| self.tx_err(e, "rerun creation aborted"))
    }

    async fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        self.read_rerun_buckets(rerun, from, limit)
    }

    async fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.rerun_items(offset)
    }
}
