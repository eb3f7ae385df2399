//! The embedded store: one state directory holding a sled database.
//!
//! Layout of a state directory:
//!
//! ```text
//! DIR/highwater.json   marker: {"format":"highwater-state","version":4}, written first
//! DIR/lock             advisory lock (flock) held by the running process; holds its pid
//! DIR/results.log      the items' final records, appended (see [`super::results_log`])
//! DIR/positions        input row → the row's current record in results.log
//! DIR/ids.idx          ID → row of its first occurrence (see [`super::id_index`])
//! DIR/ids.log          the segments' and reruns' ID lists (see [`super::id_lists`])
//! DIR/sled/            the sled database, trees:
//!     meta     "version" → u32, "job" → JobSpec JSON, "planner" → PlannerState JSON,
//!              "results" → what of results.log is durable ([`Durable`]),
//!              "indexed" → u64 BE: buckets whose IDs are durable in ids.idx
//!     offsets  first bucket (u64 BE) → segment JSON       (the offset log, see below)
//!     commits  first bucket (u64 BE) → JSON array of CommitRecords of consecutive buckets
//!              committed together                   (the commit log, see below)
//!     ids      first bucket (u64 BE) → where the segment's list of unique IDs with their
//!              rows (in input order, bucket after bucket; binary: per ID, row u64 LE, length
//!              u32 LE, UTF-8) is in DIR/ids.log ([`ListRef`]; formats 1-2 kept the list here)
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
//! are synced before their buckets' commit records are written. A sync makes the results log
//! and the ID index durable first, then records in sled how far they are durable, then
//! flushes sled: so a commit record (written after a sync) never names results that are not
//! on disk, and an open knows where to replay the results log from and which buckets' IDs to
//! index again.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::id_index::IdIndex;
use super::id_lists::{IdLists, ListRef};
use super::results_log::{Durable, LogError, ResultsLog};
use super::*;

pub const MARKER: &str = "highwater.json";

/// The ID index's file in a state directory.
pub const INDEX_FILE: &str = "ids.idx";

/// Store formats this build opens: the current one; format 3 (rerun ID lists in sled, still
/// read there; it only marks the store format 4); format 2 (results in sled) and format 1
/// (also one offset record per bucket), which it upgrades in place.
const READS_VERSIONS: [u32; 4] = [1, 2, 3, FORMAT_VERSION];

/// The first format with results and the job's ID lists out of sled: older ones are upgraded
/// by moving them.
const FILES_SINCE: u32 = 3;
const MARKER_FORMAT: &str = "highwater-state";

/// Default sled page cache: small, because the working set is the tail of the logs.
pub const DEFAULT_CACHE_BYTES: u64 = 32 << 20;

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
    /// The segments' ID lists.
    id_lists: IdLists,
    /// When the index was last made durable (see [`INDEX_SYNC_EVERY`]).
    indexed_at: std::sync::Mutex<std::time::Instant>,
    /// Rows below this were noted in the index by [`Store::first_row`].
    noted: AtomicU64,
    /// The last lease token granted (see [`Leases`]), and the one held now (0: none).
    tokens: AtomicU64,
    lease: AtomicU64,
    /// Held for the store's lifetime; the flock goes with it.
    _lock: File,
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Marker {
    format: String,
    version: u32,
    /// What was durable in the database when the marker was last written: on open, the
    /// database must still hold it, or it lost data (truncated, emptied, replaced files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checkpoint: Option<Checkpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    job_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_planned_bucket: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_committed_bucket: Option<u64>,
    at_ms: u64,
}

/// How long an open waits for sled's own file lock (see [`SledStore::open`]).
const SLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often (at most) a sync makes the ID index durable; an open after a crash indexes again
/// the IDs of the buckets planned since.
const INDEX_SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// How often the marker's checkpoint is rewritten during a run.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// sled 0.34 writes its snapshot (the page table that recovery starts from) only when the
/// database is opened, and an open replays every log entry written since the last snapshot
/// (`snapshot_after_ops` does nothing in 0.34; see sled issue #926). A job that ran for hours
/// since its last start would replay all of it at the next start: about 0.3 s per million
/// results here, so a resume after a kill -9 waited seconds for its first request. After this
/// many bytes written since the last open, or [`REOPEN_SHARE`] of the store's size on disk if
/// that is more, a sync reopens the database, which writes a new snapshot; the replay after a
/// crash is then bounded by that many bytes.
pub const REOPEN_AFTER_BYTES: u64 = 64 << 20;

/// An open itself costs time and memory in proportion to the store (reading the snapshot:
/// about 0.7 s and 370 MB at 10M results), so a large store is reopened less often: after
/// 1/`REOPEN_SHARE` of its size written. The replay after a crash then adds at most a small
/// fraction to the time any open takes, and reopening costs a few percent of the run.
const REOPEN_SHARE: u64 = 32;

/// Called between closing and opening the database in a reopen (see
/// [`set_release_memory_hook`]).
static RELEASE_MEMORY: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Give the store a function that returns freed memory to the system (an allocator's purge),
/// called after a reopen closed the database and before it opens it again: the closed page
/// table is freed on one thread and the new one built on another, and an allocator that
/// keeps freed pages per thread for a while would otherwise hold both. The binary sets one
/// for jemalloc; the first call wins.
pub fn set_release_memory_hook(release: fn()) {
    let _ = RELEASE_MEMORY.set(release);
}

/// How long a reopen waits for other users of the database to let go of it before it gives up
/// (it tries again at a later sync).
const REOPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The open sled database and its trees.
struct Trees {
    db: sled::Db,
    meta: sled::Tree,
    offsets: sled::Tree,
    commits: sled::Tree,
    ids: sled::Tree,
    items: sled::Tree,
    bad: sled::Tree,
    reruns: sled::Tree,
    rerun_offsets: sled::Tree,
    rerun_ids: sled::Tree,
    rerun_commits: sled::Tree,
}

impl Trees {
    /// Open the database in `path` (`DIR/sled`), waiting briefly for sled's own file lock.
    fn open(path: &Path, cache_bytes: u64) -> Result<Trees, StoreError> {
        // sled locks its own file as well, and its background threads can keep a dropped
        // handle's lock for a moment. We hold the directory's lock, so such a holder can only
        // be this process's previous handle of the store, finishing: wait for it, briefly.
        let deadline = std::time::Instant::now() + SLED_LOCK_WAIT;
        let db = loop {
            match open_sled(path, cache_bytes) {
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => break other,
            }
        };
        let db = db.map_err(|e| match e {
            sled::Error::Io(source) => StoreError::at(path.display(), StoreError::Io(source)),
            other => StoreError::at(
                path.display(),
                StoreError::Corrupt {
                    reason: other.to_string(),
                },
            ),
        })?;
        let tree = |name: &str| db.open_tree(name).map_err(|e| backend(path, e));
        Ok(Trees {
            meta: tree("meta")?,
            offsets: tree("offsets")?,
            commits: tree("commits")?,
            ids: tree("ids")?,
            items: tree("items")?,
            bad: tree("bad")?,
            reruns: tree("reruns")?,
            rerun_offsets: tree("rerun_offsets")?,
            rerun_ids: tree("rerun_ids")?,
            rerun_commits: tree("rerun_commits")?,
            db,
        })
    }
}

/// The highest bucket written, and the highest known durable, as `bucket + 1` (0: none).
#[derive(Default)]
struct Watermarks {
    planned: AtomicU64,
    committed: AtomicU64,
}

struct MarkerState {
    written: Option<Checkpoint>,
    at: std::time::Instant,
}

/// How to open a state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// It must already be a highwater state directory.
    Existing,
    /// Create it if it does not exist or is empty; otherwise it must be a state directory.
    CreateIfMissing,
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
                if mode == OpenMode::Existing {
                    return Err(not_store("it does not exist"));
                }
                fs::create_dir_all(path).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
            Ok(m) if !m.is_dir() => return Err(not_store("it is not a directory")),
            Ok(_) => {}
        }
        if !marker_path.exists() {
            let empty = fs::read_dir(path).map_err(io)?.next().is_none();
            match (mode, empty) {
                (OpenMode::Existing, _) => return Err(not_store(&format!("it has no {MARKER}"))),
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
        let lock = lock(path)?;
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
            id_lists,
            indexed_at: std::sync::Mutex::new(std::time::Instant::now()),
            noted: AtomicU64::new(0),
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
                trees.db.flush().map_err(sled_err)?;
            }
            Some(_) if upgrading => store.upgrade()?,
            Some(version) => {
                store.index_again()?;
                if version < FORMAT_VERSION {
                    // Format 3: nothing to move (its reruns' inline lists are read where
                    // they are); from now on an older build must refuse the store.
                    trees
                        .meta
                        .insert("version", &FORMAT_VERSION.to_be_bytes())
                        .map_err(sled_err)?;
                    trees.db.flush().map_err(sled_err)?;
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
        drop(trees);
        Ok(store)
    }

    /// The open database, for one operation (or one iterator's life).
    fn t(&self) -> Result<Arc<Trees>, StoreError> {
        self.trees
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                StoreError::at(
                    self.path.display(),
                    StoreError::Backend {
                        reason: "the database could not be reopened after a checkpoint (see the \
                         error logged then); stop this run and resume it"
                            .into(),
                    },
                )
            })
    }

    /// Close the database and open it again, so sled writes a snapshot and a later open
    /// (after a crash) replays only what was written since. Waits up to [`REOPEN_WAIT`] for
    /// other users to let go of the current handle; returns false if they did not (nothing
    /// changed then). Writes made before the reopen are flushed first.
    fn reopen(&self) -> Result<bool, StoreError> {
        let mut slot = self
            .trees
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deadline = std::time::Instant::now() + REOPEN_WAIT;
        loop {
            match slot.as_ref() {
                None => return Ok(false),
                Some(t) if Arc::strong_count(t) == 1 => break,
                Some(_) if std::time::Instant::now() >= deadline => return Ok(false),
                Some(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        // Flush before letting go: if it fails, the store keeps its open handle.
        let open = slot.as_ref().expect("checked above");
        open.db.flush().map_err(|e| self.err(e))?;
        drop(slot.take());
        if let Some(release) = RELEASE_MEMORY.get() {
            release();
        }
        let trees = Trees::open(&self.path.join("sled"), self.cache_bytes)?;
        self.size_at_open
            .store(log_size(&self.path.join("sled")), Ordering::Release);
        *slot = Some(Arc::new(trees));
        self.written_since_open.store(0, Ordering::Release);
        self.reopens.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Reopen after at least `bytes` written instead of [`REOPEN_AFTER_BYTES`] (still at
    /// least [`REOPEN_SHARE`] of the store's size).
    pub fn set_reopen_after(&self, bytes: u64) {
        self.reopen_after.store(bytes, Ordering::Relaxed);
    }

    /// How many times a sync reopened the database since this handle was opened.
    pub fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
    }

    /// Count bytes written since the last open (see [`REOPEN_AFTER_BYTES`]).
    fn wrote(&self, bytes: usize) {
        self.written_since_open
            .fetch_add(bytes as u64, Ordering::AcqRel);
    }

    /// Record in the marker what is durable now (after a flush), at most every
    /// [`CHECKPOINT_EVERY`] unless `force`.
    fn write_checkpoint(
        &self,
        planned: u64,
        committed: u64,
        force: bool,
    ) -> Result<(), StoreError> {
        let mut state = self
            .marker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(job) = self.read_job()? else {
            return Ok(());
        };
        let last = state.written.as_ref();
        let checkpoint = Checkpoint {
            job_id: job.id,
            last_planned_bucket: planned
                .checked_sub(1)
                .max(last.and_then(|c| c.last_planned_bucket)),
            last_committed_bucket: committed
                .checked_sub(1)
                .max(last.and_then(|c| c.last_committed_bucket)),
            at_ms: crate::job::now_ms(),
        };
        let changed = state
            .written
            .as_ref()
            .map(|c| (&c.job_id, c.last_planned_bucket, c.last_committed_bucket))
            != Some((
                &checkpoint.job_id,
                checkpoint.last_planned_bucket,
                checkpoint.last_committed_bucket,
            ));
        if !changed || (!force && state.at.elapsed() < CHECKPOINT_EVERY) {
            return Ok(());
        }
        let marker = Marker {
            format: MARKER_FORMAT.into(),
            version: FORMAT_VERSION,
            checkpoint: Some(checkpoint.clone()),
        };
        write_atomically(
            &self.path.join(MARKER),
            &serde_json::to_vec(&marker).expect("marker serializes"),
        )
        .map_err(|source| {
            StoreError::at(self.path.join(MARKER).display(), StoreError::Io(source))
        })?;
        state.written = Some(checkpoint);
        state.at = std::time::Instant::now();
        Ok(())
    }

    /// Flush, then checkpoint what the flush made durable.
    fn flush_and_checkpoint(&self, force: bool) -> Result<(), StoreError> {
        let planned = self.written.planned.load(Ordering::Acquire);
        let committed = self.written.committed.load(Ordering::Acquire);
        let t = self.t()?;
        self.sync_side_files(&t, planned, force)?;
        t.db.flush().map_err(|e| self.err(e))?;
        self.write_checkpoint(planned, committed, force)
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: sled::Error) -> StoreError {
        backend(&self.path, e)
    }

    /// Corruption found in this state directory.
    fn corrupt(&self, reason: impl Into<String>) -> StoreError {
        StoreError::at(self.path.display(), StoreError::corrupt(reason))
    }

    fn decode<T: DeserializeOwned>(&self, what: &str, bytes: &[u8]) -> Result<T, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!("undecodable {what} record: {e}"),
                },
            )
        })
    }

    fn get<T: DeserializeOwned>(
        &self,
        tree: &sled::Tree,
        key: &[u8],
        what: &str,
    ) -> Result<Option<T>, StoreError> {
        match tree.get(key).map_err(|e| self.err(e))? {
            None => Ok(None),
            Some(bytes) => self.decode(what, &bytes).map(Some),
        }
    }

    /// The offset log's segments, in bucket order.
    fn segments(
        &self,
    ) -> Result<impl Iterator<Item = Result<Segment, StoreError>> + '_, StoreError> {
        let t = self.t()?;
        let entries = t.offsets.iter();
        Ok(entries.map(move |entry| {
            // The handle stays with the iterator, so no reopen happens under it.
            let _open = &t;
            let (key, value) = entry.map_err(|e| self.err(e))?;
            self.segment(&key, &value)
        }))
    }

    fn segment(&self, key: &[u8], value: &[u8]) -> Result<Segment, StoreError> {
        let corrupt =
            |reason: String| StoreError::at(self.path.display(), StoreError::Corrupt { reason });
        let segment = match serde_json::from_slice::<OffsetValue>(value) {
            Ok(OffsetValue::Segment(s)) => s,
            Ok(OffsetValue::Bucket(o)) => Segment::of_record(o),
            // Say what is wrong with it as a segment (untagged enums only say "no variant").
            Err(_) => self.decode::<Segment>("offset", value)?,
        };
        if segment.buckets.is_empty() || key != segment.first.to_be_bytes() {
            return Err(corrupt(format!(
                "the offset record under key {key:02x?} is for buckets {}..{}",
                segment.first,
                segment.first + segment.buckets.len() as u64
            )));
        }
        Ok(segment)
    }

    /// The segment holding `bucket`, if it was planned.
    fn segment_of(&self, bucket: u64) -> Result<Option<Arc<Segment>>, StoreError> {
        if let Some(s) = &self.cache().segment {
            if s.contains(bucket) {
                return Ok(Some(s.clone()));
            }
        }
        let Some(entry) = self.t()?.offsets.range(..=bucket.to_be_bytes()).next_back() else {
            return Ok(None);
        };
        let (key, value) = entry.map_err(|e| self.err(e))?;
        let segment = Arc::new(self.segment(&key, &value)?);
        if !segment.contains(bucket) {
            return Ok(None);
        }
        // Segments are written once (the planner never plans a bucket twice).
        self.cache().segment = Some(segment.clone());
        Ok(Some(segment))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, ReadCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The commit records of a segment's buckets, by bucket.
    fn commits_of(&self, segment: &Segment) -> Result<BTreeMap<u64, CommitRecord>, StoreError> {
        let t = self.t()?;
        let mut out = BTreeMap::new();
        let mut take = |run: Vec<CommitRecord>| {
            out.extend(
                run.into_iter()
                    .filter(|c| segment.contains(c.bucket))
                    .map(|c| (c.bucket, c)),
            )
        };
        // A run starting before the segment may reach into it.
        if let Some(entry) = t.commits.range(..segment.first.to_be_bytes()).next_back() {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            take(self.commit_run(&key, &value)?.1);
        }
        let range = segment.first.to_be_bytes()..=segment.last().to_be_bytes();
        for entry in t.commits.range(range) {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            take(self.commit_run(&key, &value)?.1);
        }
        Ok(out)
    }

    /// Decode a commit log entry: its first bucket and the records of its run.
    fn commit_run(&self, key: &[u8], value: &[u8]) -> Result<(u64, Vec<CommitRecord>), StoreError> {
        let corrupt =
            |reason: String| StoreError::at(self.path.display(), StoreError::Corrupt { reason });
        let first = <[u8; 8]>::try_from(key)
            .map(u64::from_be_bytes)
            .map_err(|_| corrupt(format!("a commit record has the key {key:02x?}")))?;
        let run = match serde_json::from_slice::<CommitValue>(value) {
            Ok(CommitValue::Run(run)) => run,
            Ok(CommitValue::Bucket(c)) => vec![c],
            Err(_) => self.decode::<Vec<CommitRecord>>("commit", value)?,
        };
        let consecutive = run
            .iter()
            .zip(first..)
            .all(|(c, bucket)| c.bucket == bucket);
        if run.is_empty() || !consecutive {
            return Err(corrupt(format!(
                "the commit record under bucket {first} is not a run of buckets from {first}"
            )));
        }
        Ok((first, run))
    }

    /// The commit log run holding `bucket`, if it is committed.
    fn commit_run_of(&self, bucket: u64) -> Result<Option<(u64, Run)>, StoreError> {
        let t = self.t()?;
        // An odd generation: a rerun is rewriting runs right now, so neither trust nor fill
        // the cache (what is read now may be replaced any moment).
        let generation = self.runs_rewritten.load(Ordering::Acquire);
        let steady = generation % 2 == 0;
        if let Some((g, first, run)) = &self.cache().run {
            if steady && *g == generation && (*first..*first + run.len() as u64).contains(&bucket) {
                return Ok(Some((*first, run.clone())));
            }
        }
        let Some(entry) = t.commits.range(..=bucket.to_be_bytes()).next_back() else {
            return Ok(None);
        };
        let (key, value) = entry.map_err(|e| self.err(e))?;
        // The run found may be the cached one even when it does not hold `bucket` (a bucket
        // not committed yet, just after it): then it need not be decoded again.
        let cached = match &self.cache().run {
            Some((g, first, run)) if steady && *g == generation && key == first.to_be_bytes() => {
                Some((*first, run.clone()))
            }
            _ => None,
        };
        let (first, run) = match cached {
            Some(hit) => hit,
            None => {
                let (first, run) = self.commit_run(&key, &value)?;
                let run = Arc::new(run);
                // New commits only add runs; a run changes only when a rerun rewrites it,
                // which bumps the generation: a run read across such a rewrite is not kept.
                if steady && self.runs_rewritten.load(Ordering::Acquire) == generation {
                    self.cache().run = Some((generation, first, run.clone()));
                }
                (first, run)
            }
        };
        Ok((bucket < first + run.len() as u64).then_some((first, run)))
    }

    /// Whether any of `buckets` (a range) is in the commit log.
    fn any_committed(&self, first: u64, last: u64) -> Result<bool, StoreError> {
        let t = self.t()?;
        if let Some(entry) = t
            .commits
            .range(first.to_be_bytes()..=last.to_be_bytes())
            .next()
        {
            entry.map_err(|e| self.err(e))?;
            return Ok(true);
        }
        Ok(self.commit_run_of(first)?.is_some())
    }

    /// A segment's unique IDs with their rows, bucket by bucket, in input order.
    fn segment_ids(&self, segment: &Segment) -> Result<Arc<SegmentIds>, StoreError> {
        if let Some((first, ids)) = &self.cache().ids {
            if *first == segment.first {
                return Ok(ids.clone());
            }
        }
        let ids = Arc::new(self.read_segment_ids(segment)?);
        self.cache().ids = Some((segment.first, ids.clone()));
        Ok(ids)
    }

    fn read_segment_ids(&self, segment: &Segment) -> Result<SegmentIds, StoreError> {
        let t = self.t()?;
        let corrupt = |reason: &str| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!(
                        "the IDs of buckets {}..={} {reason}",
                        segment.first,
                        segment.last()
                    ),
                },
            )
        };
        let value = t
            .ids
            .get(segment.first.to_be_bytes())
            .map_err(|e| self.err(e))?
            .ok_or_else(|| corrupt("are missing"))?;
        let list =
            ListRef::from_bytes(&value).ok_or_else(|| corrupt("have no place in ids.log"))?;
        let blob = self.id_lists.read(list).map_err(|e| self.log_err(e))?;
        let mut ids = decode_ids(&blob)
            .ok_or_else(|| corrupt("are undecodable"))?
            .into_iter();
        let mut out = Vec::with_capacity(segment.buckets.len());
        for offset in segment.offsets() {
            let bucket: Vec<_> = ids.by_ref().take(offset.items as usize).collect();
            if bucket.len() as u64 != offset.items {
                return Err(corrupt(&format!(
                    "are fewer than their offset records count ({} in bucket {})",
                    offset.items, offset.bucket
                )));
            }
            out.push(bucket);
        }
        if ids.next().is_some() {
            return Err(corrupt("are more than their offset records count"));
        }
        Ok(out)
    }

    /// A bucket's items: each ID with its final record, or a pending one.
    fn items_of(&self, offset: &OffsetRecord) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let segment = self.segment_of(offset.bucket)?.ok_or_else(|| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!("bucket {} has no offset record", offset.bucket),
                },
            )
        })?;
        let ids = self.segment_ids(&segment)?;
        self.records(offset, &ids[(offset.bucket - segment.first) as usize])
    }

    /// Each of a bucket's IDs with its final record, or a pending one.
    fn records(
        &self,
        offset: &OffsetRecord,
        ids: &[(u64, String)],
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let rows: Vec<(u64, &str)> = ids.iter().map(|(row, id)| (*row, id.as_str())).collect();
        let found = self.results.get_many(&rows).map_err(|e| self.log_err(e))?;
        let mut out = Vec::with_capacity(ids.len());
        for ((row, id), found) in ids.iter().zip(found) {
            let record = match found {
                Some(bytes) => self.decode("item", &bytes)?,
                None => ItemRecord::pending(*row, offset.bucket),
            };
            out.push((id.clone(), record));
        }
        Ok(out)
    }
}

impl SledStore {
    /// The final record of the ID at `row`, if it has one.
    fn result(&self, row: u64, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        match self.results.get(row, id).map_err(|e| self.log_err(e))? {
            Some(bytes) => self.decode("item", &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn log_err(&self, e: LogError) -> StoreError {
        log_error(&self.path, e)
    }

    fn index_err(&self, e: std::io::Error) -> StoreError {
        match e.kind() {
            std::io::ErrorKind::InvalidData => StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: e.to_string(),
                },
            ),
            _ => StoreError::at(self.path.join(INDEX_FILE).display(), StoreError::Io(e)),
        }
    }

    /// Make the results log and the ID index durable, and write into sled how far they are
    /// (durable with sled's next flush). `planned`: the planned-bucket watermark read before
    /// (every bucket below it had its IDs indexed before it was planned).
    fn sync_side_files(&self, t: &Trees, planned: u64, force: bool) -> Result<(), StoreError> {
        let index_due = self.index_due(planned, force);
        let (durable, indexed) = side_sync(&self.results, &self.index, index_due, force);
        self.note_side_files(t, planned, durable, indexed)
    }

    /// Whether a sync should make the ID index durable: it can always be rebuilt from the
    /// offset log's ID lists, so only now and then (an open indexes again the buckets planned
    /// since).
    fn index_due(&self, planned: u64, force: bool) -> bool {
        planned > 0
            && (force
                || self
                    .indexed_at
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .elapsed()
                    >= INDEX_SYNC_EVERY)
    }

    /// Write into sled how far the side files are durable (after [`side_sync`]).
    fn note_side_files(
        &self,
        t: &Trees,
        planned: u64,
        durable: Result<Durable, LogError>,
        indexed: Option<std::io::Result<()>>,
    ) -> Result<(), StoreError> {
        let durable = durable.map_err(|e| self.log_err(e))?;
        let mut batch = sled::Batch::default();
        batch.insert("results", &durable.to_bytes());
        if let Some(indexed) = indexed {
            indexed.map_err(|e| self.index_err(e))?;
            batch.insert("indexed", &planned.to_be_bytes());
            *self
                .indexed_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = std::time::Instant::now();
        }
        t.meta.apply_batch(batch).map_err(|e| self.err(e))
    }

    /// The offset log's segments from the one holding `bucket` on, in bucket order.
    fn segments_from(
        &self,
        bucket: u64,
    ) -> Result<impl Iterator<Item = Result<Segment, StoreError>> + '_, StoreError> {
        let t = self.t()?;
        let start = match t.offsets.range(..=bucket.to_be_bytes()).next_back() {
            Some(entry) => entry.map_err(|e| self.err(e))?.0.to_vec(),
            None => bucket.to_be_bytes().to_vec(),
        };
        let entries = t.offsets.range(start..);
        Ok(entries.map(move |entry| {
            let _open = &t;
            let (key, value) = entry.map_err(|e| self.err(e))?;
            self.segment(&key, &value)
        }))
    }

    /// Index again the IDs of buckets planned after the index was last made durable (a crash
    /// may have lost them; inserting is idempotent), or all of them if the index was lost.
    fn index_again(&self) -> Result<(), StoreError> {
        let t = self.t()?;
        let mut from = match t.meta.get("indexed").map_err(|e| self.err(e))? {
            Some(v) => <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| {
                    StoreError::at(
                        self.path.display(),
                        StoreError::Corrupt {
                            reason: "its record of the ID index is undecodable".into(),
                        },
                    )
                })?,
            None => 0,
        };
        if self.index.is_empty() && from > 0 {
            tracing::warn!(
                path = %self.path.display(),
                "the ID index was empty: building it again from the offset log"
            );
            from = 0;
        }
        let mut ids = 0;
        for segment in self.segments_from(from)? {
            let segment = segment?;
            let lists = self.read_segment_ids(&segment)?;
            for (offset, list) in segment.offsets().zip(&lists) {
                if offset.bucket < from {
                    continue;
                }
                ids += list.len();
                self.index
                    .insert_all(list.iter().map(|(row, id)| (*row, id.as_str())))
                    .map_err(|e| self.index_err(e))?;
            }
        }
        tracing::debug!(from, ids, "indexed the IDs planned after the last sync");
        Ok(())
    }

    /// Write inline ID lists (key, list) to ids.log and point the offset log at them.
    fn move_lists(&self, t: &Trees, lists: Vec<(sled::IVec, Vec<u8>)>) -> Result<(), StoreError> {
        let blobs: Vec<Vec<u8>> = lists.iter().map(|(_, l)| l.clone()).collect();
        let refs = self.id_lists.append(&blobs).map_err(|e| self.log_err(e))?;
        let mut batch = sled::Batch::default();
        for ((key, _), list) in lists.iter().zip(refs) {
            batch.insert(key, &list.to_bytes());
        }
        t.ids.apply_batch(batch).map_err(|e| self.err(e))?;
        t.db.flush().map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Move a format 1 or 2 store's results out of sled (see the module doc). An upgrade that
    /// stops half way starts over at the next open: the database says format 2 until the end.
    fn upgrade(&self) -> Result<(), StoreError> {
        let t = self.t()?;
        self.results.clear().map_err(|e| self.log_err(e))?;
        // ID lists kept inline in sled move to ids.log (lists moved by an upgrade that
        // stopped half way are references already).
        let mut inline = Vec::new();
        for entry in t.ids.iter() {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            if ListRef::from_bytes(&value).is_none() {
                inline.push((key, value.to_vec()));
            }
            if inline.len() == 256 {
                self.move_lists(&t, std::mem::take(&mut inline))?;
            }
        }
        self.move_lists(&t, inline)?;
        let mut planned = 0;
        let mut moved = 0u64;
        for segment in self.segments()? {
            let segment = segment?;
            planned = segment.last() + 1;
            let lists = self.read_segment_ids(&segment)?;
            for list in &lists {
                self.index
                    .insert_all(list.iter().map(|(row, id)| (*row, id.as_str())))
                    .map_err(|e| self.index_err(e))?;
                let mut found = Vec::new();
                for (row, id) in list {
                    if let Some(value) = t.items.get(id.as_bytes()).map_err(|e| self.err(e))? {
                        // Check it decodes before it is moved.
                        let _: ItemRecord = self.decode("item", &value)?;
                        found.push((*row, id.as_str(), value));
                    }
                }
                moved += found.len() as u64;
                self.results
                    .append(found.iter().map(|(row, id, v)| (*row, *id, v.as_ref())))
                    .map_err(|e| self.log_err(e))?;
            }
        }
        self.sync_side_files(&t, planned, true)?;
        t.meta
            .insert("version", &FORMAT_VERSION.to_be_bytes())
            .map_err(|e| self.err(e))?;
        t.db.flush().map_err(|e| self.err(e))?;
        t.items.clear().map_err(|e| self.err(e))?;
        t.db.flush().map_err(|e| self.err(e))?;
        tracing::info!(
            path = %self.path.display(),
            results = moved,
            "upgraded the store to format {FORMAT_VERSION}: results moved out of sled"
        );
        Ok(())
    }
}

/// Marks a rewrite of existing commit runs: the generation moves when it starts (to odd) and
/// again when it ends (to even). Readers use and fill the run cache only at an even generation
/// that did not move while they read, so no run read before or during a rewrite is served
/// after it.
struct Rewriting<'a>(&'a AtomicU64);

impl<'a> Rewriting<'a> {
    fn start(generation: &'a AtomicU64) -> Self {
        generation.fetch_add(1, Ordering::AcqRel);
        Rewriting(generation)
    }
}

impl Drop for Rewriting<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// A commit run's records, shared with the read cache.
type Run = Arc<Vec<CommitRecord>>;

/// A segment's IDs with their rows, one list per bucket.
type SegmentIds = Vec<Vec<(u64, String)>>;

/// What the store read last, kept for the next call: replays, failure summaries and reruns
/// look at buckets one at a time in bucket order, and one segment (up to 1,000 buckets) or
/// commit run (up to 256) serves many such calls instead of being decoded for each.
#[derive(Default)]
struct ReadCache {
    segment: Option<Arc<Segment>>,
    /// The IDs of the segment starting at this bucket.
    ids: Option<(u64, Arc<SegmentIds>)>,
    /// A commit run: the generation it was read at, its first bucket, its records.
    run: Option<(u64, u64, Run)>,
}

/// The most buckets one commit log record holds: readers decode a whole run to find one
/// bucket, and a background checkpoint can commit tens of thousands of one-row buckets.
const MAX_COMMIT_RUN: usize = 256;

/// A commit log value: a run of consecutive buckets, or a format 1 record of one bucket.
#[derive(Deserialize)]
#[serde(untagged)]
enum CommitValue {
    Run(Vec<CommitRecord>),
    Bucket(CommitRecord),
}

/// One offset log record (format 2): consecutive buckets planned together from one input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Segment {
    first: u64,
    input: Fingerprint,
    planned_at_ms: u64,
    /// Where the first bucket's first row starts.
    start: Cursor,
    /// Per bucket, in order: where the row after it starts (byte, line, row), then its unique
    /// IDs, duplicate rows and bad lines.
    buckets: Vec<[u64; 6]>,
}

/// An offset log value: a segment, or a format 1 record of one bucket.
#[derive(Deserialize)]
#[serde(untagged)]
enum OffsetValue {
    Segment(Segment),
    Bucket(OffsetRecord),
}

impl Segment {
    /// Split planned buckets into runs that can share a segment: consecutive bucket numbers,
    /// each starting where the one before ended, from the same input.
    fn runs(buckets: &[PlannedBucket]) -> impl Iterator<Item = &[PlannedBucket]> {
        buckets.chunk_by(|a, b| {
            b.offset.bucket == a.offset.bucket + 1
                && b.offset.start == a.offset.end
                && b.offset.input == a.offset.input
        })
    }

    /// The segment of a run (from [`Segment::runs`], so never empty).
    fn of(run: &[PlannedBucket]) -> Segment {
        let first = &run[0].offset;
        Segment {
            first: first.bucket,
            input: first.input,
            planned_at_ms: first.planned_at_ms,
            start: first.start,
            buckets: run
                .iter()
                .map(|b| {
                    let o = &b.offset;
                    [
                        o.end.byte,
                        o.end.line,
                        o.end.row,
                        o.items,
                        o.duplicates,
                        o.bad_lines,
                    ]
                })
                .collect(),
        }
    }

    fn of_record(o: OffsetRecord) -> Segment {
        Segment {
            first: o.bucket,
            input: o.input,
            planned_at_ms: o.planned_at_ms,
            start: o.start,
            buckets: vec![[
                o.end.byte,
                o.end.line,
                o.end.row,
                o.items,
                o.duplicates,
                o.bad_lines,
            ]],
        }
    }

    fn last(&self) -> u64 {
        self.first + self.buckets.len() as u64 - 1
    }

    fn contains(&self, bucket: u64) -> bool {
        (self.first..=self.last()).contains(&bucket)
    }

    /// Each bucket's offset record.
    fn offsets(&self) -> impl Iterator<Item = OffsetRecord> + '_ {
        let mut start = self.start;
        self.buckets
            .iter()
            .zip(self.first..)
            .map(move |(b, bucket)| {
                let [byte, line, row, items, duplicates, bad_lines] = *b;
                let end = Cursor { byte, line, row };
                let offset = OffsetRecord {
                    bucket,
                    start,
                    end,
                    items,
                    duplicates,
                    bad_lines,
                    input: self.input,
                    planned_at_ms: self.planned_at_ms,
                };
                start = end;
                offset
            })
    }

    /// The offset record of `bucket`, which the segment [contains](Segment::contains).
    fn offset(&self, bucket: u64) -> OffsetRecord {
        self.offsets()
            .nth((bucket - self.first) as usize)
            .expect("the segment contains the bucket")
    }
}

fn rerun_key(rerun: u32, bucket: u64) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&rerun.to_be_bytes());
    key[4..].copy_from_slice(&bucket.to_be_bytes());
    key
}

impl SledStore {
    /// A rerun bucket's IDs with their current records (every ID of a rerun has one).
    fn rerun_items(&self, offset: &RerunOffset) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let t = self.t()?;
        let corrupt = |reason: &str| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!(
                        "the IDs of bucket {} of rerun {} {reason}",
                        offset.bucket, offset.rerun
                    ),
                },
            )
        };
        let value = t
            .rerun_ids
            .get(rerun_key(offset.rerun, offset.bucket))
            .map_err(|e| self.err(e))?
            .ok_or_else(|| corrupt("are missing"))?;
        // In ids.log; inline in sled for a rerun created by format 3 (never 12 bytes long,
        // see `ListRef::from_bytes`).
        let blob = match ListRef::from_bytes(&value) {
            Some(list) => self.id_lists.read(list).map_err(|e| self.log_err(e))?,
            None => value.to_vec(),
        };
        let ids = decode_ids(&blob).ok_or_else(|| corrupt("are undecodable"))?;
        let mut out = Vec::with_capacity(ids.len());
        for (row, id) in ids {
            let record = self
                .result(row, &id)?
                .ok_or_else(|| corrupt(&format!("include {id:?}, which has no record")))?;
            out.push((id, record));
        }
        Ok(out)
    }

    fn decode_all<T: DeserializeOwned>(
        &self,
        iter: sled::Iter,
        what: &str,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        for entry in iter {
            let (_, v) = entry.map_err(|e| self.err(e))?;
            out.push(self.decode(what, &v)?);
        }
        Ok(out)
    }
}

fn encode_ids<'a>(items: impl IntoIterator<Item = &'a (u64, String)> + Clone) -> Vec<u8> {
    let size = items.clone().into_iter().map(|(_, id)| 12 + id.len()).sum();
    let mut out = Vec::with_capacity(size);
    for (row, id) in items {
        out.extend_from_slice(&row.to_le_bytes());
        out.extend_from_slice(&(id.len() as u32).to_le_bytes());
        out.extend_from_slice(id.as_bytes());
    }
    out
}

fn decode_ids(mut blob: &[u8]) -> Option<Vec<(u64, String)>> {
    let mut out = Vec::new();
    while !blob.is_empty() {
        let row = u64::from_le_bytes(blob.get(..8)?.try_into().ok()?);
        let len = u32::from_le_bytes(blob.get(8..12)?.try_into().ok()?) as usize;
        let id = std::str::from_utf8(blob.get(12..12 + len)?).ok()?;
        out.push((row, id.to_owned()));
        blob = &blob[12 + len..];
    }
    Some(out)
}

/// Make the results log durable (and the ID index, if `index_due`): the blocking part of a
/// sync. The index's result is there only if it was synced.
fn side_sync(
    results: &ResultsLog,
    index: &IdIndex,
    index_due: bool,
    force: bool,
) -> (Result<Durable, LogError>, Option<std::io::Result<()>>) {
    let durable = results.sync(force);
    let indexed = (durable.is_ok() && index_due).then(|| index.sync());
    (durable, indexed)
}

fn log_error(path: &Path, e: LogError) -> StoreError {
    match e {
        LogError::Io { path, source } => StoreError::at(path.display(), StoreError::Io(source)),
        LogError::Damaged { path: file, reason } => StoreError::at(
            path.display(),
            StoreError::Corrupt {
                reason: format!("{}: {reason}", file.display()),
            },
        ),
    }
}

fn backend(path: &Path, e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(source) => StoreError::at(path.display(), StoreError::Io(source)),
        sled::Error::Corruption { .. } => StoreError::at(
            path.display(),
            StoreError::Corrupt {
                reason: e.to_string(),
            },
        ),
        other => StoreError::at(
            path.display(),
            StoreError::Backend {
                reason: other.to_string(),
            },
        ),
    }
}

/// sled can panic on some damaged files instead of returning an error; turn that into one.
fn open_sled(path: &Path, cache_bytes: u64) -> Result<sled::Db, sled::Error> {
    let config = sled::Config::new()
        .path(path)
        .cache_capacity(cache_bytes)
        .mode(sled::Mode::LowSpace);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || config.open()));
    std::panic::set_hook(previous);
    match opened {
        Ok(result) => result,
        Err(panic) => {
            let reason = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "sled failed while opening".into());
            Err(sled::Error::Unsupported(reason))
        }
    }
}

/// The length of sled's log file (`DIR/sled/db`), 0 if unknown: the store's size for
/// [`REOPEN_SHARE`]. One stat; sled's own `size_on_disk` also lists and stats every blob file.
fn log_size(sled_dir: &Path) -> u64 {
    fs::metadata(sled_dir.join("db"))
        .map(|m| m.len())
        .unwrap_or(0)
}

/// Take the directory's advisory lock, or say who holds it.
fn lock(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join("lock");
    let io = |source| StoreError::at(path.display(), StoreError::Io(source));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(StoreError::at(
                dir.display(),
                StoreError::Busy {
                    pid: text.trim().parse().ok(),
                },
            ));
        }
        return Err(io(err));
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    Ok(file)
}

/// Write `bytes` to `path` through a temp file and a rename, synced.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

impl Drop for SledStore {
    /// Leave the marker's checkpoint current, so damage found at the next open is precise.
    fn drop(&mut self) {
        if let Err(e) = self.flush_and_checkpoint(true) {
            tracing::warn!("closing the store: {e}");
        }
    }
}

fn format_ms(ms: u64) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("store records always serialize")
}

impl SledStore {
    /// Write planned buckets and the planner position (see [`Store::plan`]).
    fn write_plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> Result<(), StoreError> {
        let t = self.t()?;
        // The index first (IDs the planner noted through `first_row` are there already): an
        // ID indexed for a plan that then fails is planned again at the same row (planning is
        // deterministic), which the index takes as already there.
        let noted = self.noted.load(Ordering::Acquire);
        self.index
            .insert_all(
                buckets
                    .iter()
                    .flat_map(|b| &b.items)
                    .filter(|(row, _)| *row >= noted)
                    .map(|(row, id)| (*row, id.as_str())),
            )
            .map_err(|e| self.index_err(e))?;
        let mut offsets = sled::Batch::default();
        let mut ids = sled::Batch::default();
        let mut bad = sled::Batch::default();
        let mut bytes = 0;
        // The ID lists go to ids.log, durable before the offset records that point at them.
        let runs: Vec<&[PlannedBucket]> = Segment::runs(buckets).collect();
        let lists: Vec<Vec<u8>> = runs
            .iter()
            .map(|run| encode_ids(run.iter().flat_map(|b| &b.items)))
            .collect();
        let refs = self.id_lists.append(&lists).map_err(|e| self.log_err(e))?;
        for (run, list) in runs.iter().zip(refs) {
            let segment = Segment::of(run);
            let key = segment.first.to_be_bytes();
            let value = json(&segment);
            bytes += value.len() + ListRef::SIZE;
            offsets.insert(&key, value);
            ids.insert(&key, &list.to_bytes());
            for line in run.iter().flat_map(|b| &b.bad_lines) {
                let value = json(line);
                bytes += value.len();
                bad.insert(&line.row.to_be_bytes(), value);
            }
        }
        let planner = json(planner);
        let highest = buckets
            .iter()
            .map(|b| b.offset.bucket + 1)
            .max()
            .unwrap_or(0);
        let result = (&t.offsets, &t.ids, &t.bad, &t.meta)
            .transaction(|(o, i, b, m)| {
                o.apply_batch(&offsets)?;
                i.apply_batch(&ids)?;
                b.apply_batch(&bad)?;
                m.insert("planner", planner.as_slice())?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                TransactionError::Storage(e) => self.err(e),
                TransactionError::Abort(()) => StoreError::at(
                    self.path.display(),
                    StoreError::Backend {
                        reason: "plan aborted".into(),
                    },
                ),
            });
        self.written.planned.fetch_max(highest, Ordering::AcqRel);
        self.wrote(bytes);
        result
    }

    /// The stored job (see [`Store::job`]).
    fn read_job(&self) -> Result<Option<StoredJob>, StoreError> {
        let t = self.t()?;
        let Some(spec) = t.meta.get("job").map_err(|e| self.err(e))? else {
            return Ok(None);
        };
        let version = match t.meta.get("job_version").map_err(|e| self.err(e))? {
            Some(v) => <[u8; 4]>::try_from(v.as_ref())
                .map(u32::from_be_bytes)
                .map_err(|_| self.corrupt("its job record's version is undecodable"))?,
            // Stores written before the spec was opaque hold version 1.
            None => 1,
        };
        let id = match t.meta.get("job_id").map_err(|e| self.err(e))? {
            Some(id) => String::from_utf8(id.to_vec())
                .map_err(|_| self.corrupt("its job id is not UTF-8"))?,
            // Before, the id was only inside the spec (version 1: JSON with a `job_id`).
            None => {
                #[derive(Deserialize)]
                struct Id {
                    job_id: String,
                }
                self.decode::<Id>("job", &spec)?.job_id
            }
        };
        Ok(Some(StoredJob {
            id,
            version,
            spec: spec.to_vec(),
        }))
    }

    /// Buckets from `from` on with their commit records (see [`Store::buckets`]).
    fn read_buckets(&self, from: u64, limit: usize) -> Result<Vec<BucketState>, StoreError> {
        let mut out = Vec::new();
        if limit == 1 {
            // A point lookup: through the read cache, not a segment's whole commit log.
            if let Some(segment) = self.segment_of(from)? {
                let commit = self
                    .commit_run_of(from)?
                    .map(|(first, run)| run[(from - first) as usize].clone());
                out.push(BucketState {
                    offset: segment.offset(from),
                    commit,
                });
                return Ok(out);
            }
        }
        if limit == 0 {
            return Ok(out);
        }
        for segment in self.segments_from(from)? {
            let segment = segment?;
            if segment.last() < from {
                continue;
            }
            let mut committed = self.commits_of(&segment)?;
            for offset in segment.offsets().filter(|o| o.bucket >= from) {
                let commit = committed.remove(&offset.bucket);
                out.push(BucketState { offset, commit });
                if out.len() == limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// A rerun's buckets from `from` on (see [`Store::rerun_buckets`]).
    fn read_rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        let t = self.t()?;
        let mut out = Vec::new();
        let range = rerun_key(rerun, from)..=rerun_key(rerun, u64::MAX);
        for entry in t.rerun_offsets.range(range).take(limit) {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            let commit = self.get(&t.rerun_commits, &key, "rerun commit")?;
            out.push(RerunBucketState {
                offset: self.decode("rerun offset", &value)?,
                commit,
            });
        }
        Ok(out)
    }

    /// Write the commit records of job buckets (a bucket committed already keeps its record).
    fn commit_job(&self, commits: &[CommitRecord]) -> Result<(), StoreError> {
        let t = self.t()?;
        let generation = self.runs_rewritten.load(Ordering::Acquire);
        let mut sorted: Vec<&CommitRecord> = commits.iter().collect();
        sorted.sort_by_key(|c| c.bucket);
        sorted.dedup_by_key(|c| c.bucket);
        let mut batch = sled::Batch::default();
        // The last run written: its first bucket and length.
        let mut last: Option<(u64, usize)> = None;
        let mut bytes = 0;
        let mut write = |run: &[&CommitRecord]| {
            for part in run.chunks(MAX_COMMIT_RUN) {
                let value = json(&part);
                bytes += value.len();
                batch.insert(&part[0].bucket.to_be_bytes(), value);
                last = Some((part[0].bucket, part.len()));
            }
        };
        for run in sorted.chunk_by(|a, b| b.bucket == a.bucket + 1) {
            let (first, last) = (run[0].bucket, run[run.len() - 1].bucket);
            if !self.any_committed(first, last)? {
                write(run);
                continue;
            }
            // Some are committed already: a commit is final, so those stay as they are.
            let mut fresh = Vec::new();
            for c in run {
                if self.commit_run_of(c.bucket)?.is_none() {
                    fresh.push(*c);
                }
            }
            for part in fresh.chunk_by(|a, b| b.bucket == a.bucket + 1) {
                write(part);
            }
        }
        t.commits.apply_batch(batch).map_err(|e| self.err(e))?;
        self.wrote(bytes);
        // The next commit checks the run before its buckets: usually this one. Keep it, as
        // `commit_run_of` would (new runs never change an existing one).
        if let Some((first, len)) = last {
            let steady =
                generation % 2 == 0 && self.runs_rewritten.load(Ordering::Acquire) == generation;
            if let (true, Ok(at)) = (steady, sorted.binary_search_by_key(&first, |c| c.bucket)) {
                let run: Vec<CommitRecord> =
                    sorted[at..at + len].iter().map(|c| (*c).clone()).collect();
                self.cache().run = Some((generation, first, Arc::new(run)));
            }
        }
        let highest = commits.iter().map(|c| c.bucket + 1).max().unwrap_or(0);
        self.written.committed.fetch_max(highest, Ordering::AcqRel);
        Ok(())
    }

    /// Write commit records of rerun buckets and the job buckets' records their counts moved
    /// (rewriting the commit log runs that hold them), atomically.
    fn commit_rerun(
        &self,
        rerun: u32,
        buckets: &[CommitRecord],
        moved: &[CommitRecord],
    ) -> Result<(), StoreError> {
        let t = self.t()?;
        let mut batch = sled::Batch::default();
        for c in buckets {
            batch.insert(&rerun_key(rerun, c.bucket), json(c));
        }
        // The commit log runs holding the moved buckets, rewritten whole.
        let mut runs: BTreeMap<u64, Vec<CommitRecord>> = BTreeMap::new();
        for moved in moved {
            let bucket = moved.bucket;
            let held = runs
                .range(..=bucket)
                .next_back()
                .is_some_and(|(first, run)| bucket < first + run.len() as u64);
            if !held {
                if let Some((first, run)) = self.commit_run_of(bucket)? {
                    runs.insert(first, Arc::unwrap_or_clone(run));
                }
            }
            let found = runs
                .range_mut(..=bucket)
                .next_back()
                .and_then(|(first, run)| run.get_mut((bucket - first) as usize));
            if let Some(c) = found.filter(|c| c.bucket == bucket) {
                *c = moved.clone();
            }
        }
        let mut job = sled::Batch::default();
        for (first, run) in &runs {
            job.insert(&first.to_be_bytes(), json(run));
        }
        let _rewriting = (!runs.is_empty()).then(|| Rewriting::start(&self.runs_rewritten));
        (&t.rerun_commits, &t.commits)
            .transaction(|(r, c)| {
                r.apply_batch(&batch)?;
                c.apply_batch(&job)?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| self.tx_err(e, "rerun commit aborted"))
    }

    /// Refuse a lease this store does not hold (see [`Leases`]).
    fn check_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        if self.lease.load(Ordering::Acquire) == lease.token.0 {
            return Ok(());
        }
        Err(StoreError::at(
            self.path.display(),
            StoreError::LeaseLost {
                scope: format!("{:?}", lease.scope),
                token: lease.token.0,
            },
        ))
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
        t.db.flush().map_err(|e| self.err(e))?;
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
            let first = self.index.insert(id, row).map_err(|e| self.index_err(e))?;
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
        self.write_plan(buckets, planner)
    }

    async fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        let values: Vec<Vec<u8>> = results.iter().map(|(_, r)| json(r)).collect();
        self.results
            .append(
                results
                    .iter()
                    .zip(&values)
                    .map(|((id, r), v)| (r.row, id.as_str(), v.as_slice())),
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
        let (durable, indexed) =
            tokio::task::spawn_blocking(move || side_sync(&results, &index, index_due, false))
                .await
                .map_err(|e| {
                    StoreError::at(
                        self.path.display(),
                        StoreError::backend(format!("syncing the results log: {e}")),
                    )
                })?;
        let t = self.t()?;
        self.note_side_files(&t, planned, durable, indexed)?;
        let db = t.db.clone();
        drop(t);
        db.flush_async().await.map_err(|e| self.err(e))?;
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
        match self.index.get(id).map_err(|e| self.index_err(e))? {
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
        let lists: Vec<Vec<u8>> = buckets.iter().map(|b| encode_ids(&b.items)).collect();
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

/// The state directory's flock is the lease: one process works on the job, so every scope
/// is granted, under one token per acquisition (stored in sled, so tokens only grow across
/// runs: the run number). A newer acquisition supersedes the older lease, whose commits are
/// refused from then on, as are those of a released one.
impl Leases for SledStore {
    async fn acquire(&self, scope: LeaseScope) -> Result<Option<Lease>, StoreError> {
        let t = self.t()?;
        let token = self.tokens.fetch_add(1, Ordering::AcqRel) + 1;
        t.meta
            .insert("lease", &token.to_be_bytes())
            .map_err(|e| self.err(e))?;
        self.lease.store(token, Ordering::Release);
        Ok(Some(Lease {
            scope,
            token: LeaseToken(token),
        }))
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.check_lease(lease)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let _ = self
            .lease
            .compare_exchange(lease.token.0, 0, Ordering::AcqRel, Ordering::Acquire);
        Ok(())
    }

    async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), StoreError> {
        self.check_lease(lease)?;
        match commit {
            Commit::Job(commits) => self.commit_job(commits),
            Commit::Rerun {
                rerun,
                buckets,
                moved,
            } => self.commit_rerun(rerun, buckets, moved),
        }
    }
}

impl SledStore {
    fn tx_err(&self, e: TransactionError<()>, what: &str) -> StoreError {
        match e {
            TransactionError::Storage(e) => self.err(e),
            TransactionError::Abort(()) => StoreError::at(
                self.path.display(),
                StoreError::Backend {
                    reason: what.into(),
                },
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commit job buckets under a lease, as a run does.
    async fn commit(s: &SledStore, commits: &[CommitRecord]) {
        let lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
        s.commit(&lease, Commit::Job(commits)).await.unwrap();
    }

    /// Commit rerun buckets under a lease, with the counts they move.
    async fn commit_rerun(s: &SledStore, rerun: u32, commits: &[CommitRecord]) {
        let lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
        super::super::view::commit(s, &lease, Log::Rerun(rerun), commits)
            .await
            .unwrap();
    }

    async fn first_row(s: &SledStore, id: &str, row: u64) -> Option<u64> {
        s.first_rows(&[(row, id)]).await.unwrap()[0]
    }

    fn offset(bucket: u64, start: u64, end: u64, items: u64) -> OffsetRecord {
        OffsetRecord {
            bucket,
            start: Cursor {
                row: start,
                line: start + 1,
                byte: start * 2,
            },
            end: Cursor {
                row: end,
                line: end + 1,
                byte: end * 2,
            },
            items,
            duplicates: 0,
            bad_lines: 0,
            input: Fingerprint { len: 10, xxh3: 1 },
            planned_at_ms: 0,
        }
    }

    fn planned(bucket: u64, ids: &[(u64, &str)], end: u64) -> PlannedBucket {
        let start = ids.first().map(|i| i.0).unwrap_or(end);
        PlannedBucket {
            offset: offset(bucket, start, end, ids.len() as u64),
            items: ids.iter().map(|(r, i)| (*r, i.to_string())).collect(),
            bad_lines: vec![],
        }
    }

    /// Buckets 0..n of one row each, holding the IDs "id0", "id1", ...
    fn one_row_buckets(n: u64) -> Vec<PlannedBucket> {
        (0..n)
            .map(|i| planned(i, &[(i, &format!("id{i}"))], i + 1))
            .collect()
    }

    /// A new store with [`one_row_buckets`]`(n)` planned.
    async fn store_of_one_row_buckets(n: u64) -> (tempfile::TempDir, SledStore) {
        let dir = tempfile::tempdir().unwrap();
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        s.plan(&one_row_buckets(n), &PlannerState::default())
            .await
            .unwrap();
        (dir, s)
    }

    fn done(row: u64, bucket: u64, ok: bool) -> ItemRecord {
        let mut r = ItemRecord::pending(row, bucket);
        r.status = if ok {
            ItemStatus::Ok
        } else {
            ItemStatus::Failed
        };
        r.attempts = 1;
        if ok {
            r.body = Some(serde_json::value::to_raw_value(&serde_json::json!({"v": row})).unwrap());
        } else {
            r.error = Some("HTTP 404".into());
        }
        r
    }

    /// Past the threshold a sync closes and reopens sled (so it writes a snapshot): every
    /// write before and after is kept, in this handle and after a new open; while someone
    /// still holds the database the reopen gives up and nothing changes.
    #[tokio::test]
    async fn a_sync_past_the_threshold_reopens_the_database_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let ok = |b: u64| b % 3 != 0;
        // Results and ID lists no longer go to sled, offset and commit records do: plans of
        // 2,000 one-row buckets each, every one past the threshold (at least 1/32 of the
        // store's size on disk) while the store stays small.
        let id = |b: u64| format!("id{b}");
        let bucket = |b: u64| planned(b, &[(b, &id(b))], b + 1);
        let n = 12_000;
        let round = 2_000;
        let planner = |b: u64| PlannerState {
            next_bucket: b,
            cursor: Cursor {
                byte: b,
                line: b + 1,
                row: b,
            },
            exhausted: false,
        };
        {
            let s = SledStore::open(&path, OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
            s.sync().await.unwrap();
            assert_eq!(
                s.reopens(),
                0,
                "nothing written yet past the default threshold"
            );
            s.set_reopen_after(1);

            // A reader holding the database: the reopen waits for it, then gives up.
            let before = s.reopens();
            let held = s.t().unwrap();
            let first: Vec<_> = (0..round).map(bucket).collect();
            s.plan(&first, &planner(round)).await.unwrap();
            s.sync().await.unwrap();
            assert_eq!(s.reopens(), before, "reopened under a reader");
            assert!(held.offsets.contains_key(0u64.to_be_bytes()).unwrap());
            drop(held);
            // The same writes, nobody holding the database now: this sync reopens it.
            s.sync().await.unwrap();
            assert_eq!(s.reopens(), before + 1);

            for b in (round..n).step_by(round as usize) {
                let next: Vec<_> = (b..b + round).map(bucket).collect();
                s.plan(&next, &planner(b + round)).await.unwrap();
                s.sync().await.unwrap();
            }
            let results: Vec<_> = (0..n).map(|b| (id(b), done(b, b, ok(b)))).collect();
            s.record(&results).await.unwrap();
            s.sync().await.unwrap();
            let mut commits = Vec::new();
            for b in 0..n {
                let mut tally = Tally::default();
                tally.add(&done(b, b, ok(b)));
                commits.push(CommitRecord::new(b, tally));
            }
            commit(&s, &commits).await;
            s.sync().await.unwrap();
            assert!(s.reopens() >= before + 5, "{} reopens", s.reopens());
            for b in 0..n {
                let r = s.item(&id(b)).await.unwrap().expect("kept across reopens");
                assert_eq!((r.row, r.is_final()), (b, true));
            }
        }
        let s = SledStore::open(&path, OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
        let stats = s.stats().await.unwrap();
        let oks = (0..n).filter(|b| ok(*b)).count() as u64;
        assert_eq!(
            (
                stats.buckets_committed,
                stats.ok,
                stats.failed,
                stats.pending
            ),
            (n, oks, n - oks, 0)
        );
        let mut seen = Vec::new();
        s.for_each_final(&mut |id, r| {
            seen.push((id.to_string(), r.row));
            Ok(())
        })
        .await
        .unwrap();
        let expected: Vec<_> = (0..n).map(|b| (id(b), b)).collect();
        assert_eq!(seen, expected);
    }

    #[tokio::test]
    async fn plan_record_commit_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        {
            let s = SledStore::open(&path, OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
            let p = PlannerState {
                next_bucket: 2,
                cursor: Cursor {
                    row: 4,
                    line: 5,
                    byte: 8,
                },
                exhausted: true,
            };
            s.plan(
                &[
                    planned(0, &[(0, "a"), (1, "b")], 2),
                    planned(1, &[(2, "c"), (3, "d")], 4),
                ],
                &p,
            )
            .await
            .unwrap();
            s.sync().await.unwrap();
            assert!(s.item("c").await.unwrap().is_none());
            // Planned IDs are noted with their first rows: a repeat is a duplicate.
            assert_eq!(first_row(&s, "c", 7).await, Some(2));
            assert_eq!(first_row(&s, "c", 2).await, None, "the same row again");
            assert_eq!(first_row(&s, "new", 8).await, None);
            assert_eq!(first_row(&s, "new", 9).await, Some(8));
            s.record(&[
                ("a".into(), done(0, 0, true)),
                ("b".into(), done(1, 0, false)),
            ])
            .await
            .unwrap();
            s.sync().await.unwrap();
            assert!(s.item("a").await.unwrap().is_some_and(|r| r.is_final()));
            commit(
                &s,
                &[CommitRecord {
                    bucket: 0,
                    ok: 1,
                    failed: 1,
                    ..CommitRecord::default()
                }],
            )
            .await;
            s.record(&[("d".into(), done(3, 1, true))]).await.unwrap();
            s.sync().await.unwrap();
        }
        let s = SledStore::open(&path, OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
        let open = s.open_buckets().await.unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].bucket, 1);
        let items = s.bucket_items(&open[0]).await.unwrap();
        assert_eq!(
            items.iter().map(|i| i.0.as_str()).collect::<Vec<_>>(),
            vec!["c", "d"]
        );
        assert!(!items[0].1.is_final());
        assert!(items[1].1.is_final());
        let stats = s.stats().await.unwrap();
        assert_eq!((stats.ok, stats.failed, stats.pending), (2, 1, 1));
        assert_eq!(
            (
                stats.buckets_planned,
                stats.buckets_committed,
                stats.buckets_in_flight
            ),
            (2, 1, 1)
        );
        assert!(!stats.finished());
        let mut seen = vec![];
        s.for_each_final(&mut |id, r| {
            seen.push((id.to_string(), r.status));
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(
            seen,
            vec![
                ("a".into(), ItemStatus::Ok),
                ("b".into(), ItemStatus::Failed),
                ("d".into(), ItemStatus::Ok)
            ]
        );
    }

    /// Buckets planned together share one offset record; every reader sees each bucket.
    #[tokio::test]
    async fn one_row_buckets_share_a_segment() {
        let dir = tempfile::tempdir().unwrap();
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        // Rows 0..5, one per bucket; row 2 repeats row 0's ID (no items); bucket 7 follows a
        // gap in the bucket numbers, so it starts a segment of its own.
        let mut first: Vec<PlannedBucket> = ["a", "b", "", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let i = i as u64;
                if id.is_empty() {
                    let mut b = planned(i, &[], i + 1);
                    b.offset.start = offset(i, i, i + 1, 0).start;
                    b.offset.duplicates = 1;
                    b
                } else {
                    planned(i, &[(i, id)], i + 1)
                }
            })
            .collect();
        first.push(planned(7, &[(9, "z")], 10));
        let p = PlannerState::default();
        s.plan(&first, &p).await.unwrap();
        s.plan(
            &[planned(5, &[(5, "e")], 6), planned(6, &[(6, "f")], 7)],
            &p,
        )
        .await
        .unwrap();
        assert_eq!(s.t().unwrap().offsets.len(), 3, "segments: 0..=4, 7, 5..=6");
        for b in first.iter().chain([&planned(5, &[(5, "e")], 6)]) {
            assert_eq!(
                s.offset(b.offset.bucket).await.unwrap().as_ref(),
                Some(&b.offset)
            );
        }
        assert_eq!(s.offset(8).await.unwrap(), None);
        assert_eq!(s.offset(70).await.unwrap(), None);
        let open: Vec<u64> = s
            .open_buckets()
            .await
            .unwrap()
            .iter()
            .map(|o| o.bucket)
            .collect();
        assert_eq!(open, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        s.record(&[
            ("c".into(), done(3, 3, true)),
            ("f".into(), done(6, 6, false)),
        ])
        .await
        .unwrap();
        commit(
            &s,
            &[CommitRecord {
                bucket: 3,
                ok: 1,
                ..CommitRecord::default()
            }],
        )
        .await;
        commit(
            &s,
            &[CommitRecord {
                bucket: 2,
                ..CommitRecord::default()
            }],
        )
        .await;
        let open: Vec<u64> = s
            .open_buckets()
            .await
            .unwrap()
            .iter()
            .map(|o| o.bucket)
            .collect();
        assert_eq!(open, vec![0, 1, 4, 5, 6, 7]);
        let items = s
            .bucket_items(&s.offset(4).await.unwrap().unwrap())
            .await
            .unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!((items[0].0.as_str(), items[0].1.row), ("d", 4));
        assert!(s
            .bucket_items(&s.offset(2).await.unwrap().unwrap())
            .await
            .unwrap()
            .is_empty());
        let stats = s.stats().await.unwrap();
        assert_eq!(
            (
                stats.buckets_planned,
                stats.buckets_committed,
                stats.buckets_in_flight
            ),
            (8, 2, 6)
        );
        assert_eq!(
            (stats.ids_planned, stats.ok, stats.failed, stats.pending),
            (7, 1, 1, 5)
        );
        assert_eq!(stats.duplicates, 1);
        let mut seen = vec![];
        s.for_each_final(&mut |id, _| {
            seen.push(id.to_string());
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(seen, vec!["c", "f"]);
        let mut failed = vec![];
        s.for_each_failure(None, &mut |id, r| {
            failed.push((id.to_string(), r.bucket));
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(failed, vec![("f".to_string(), 6)]);
    }

    /// Buckets committed by one write share a commit record per consecutive run; a bucket is
    /// committed once.
    #[tokio::test]
    async fn commits_are_stored_in_runs_and_are_final() {
        let (_dir, s) = store_of_one_row_buckets(8).await;
        let c = |bucket: u64, ok: u64| CommitRecord {
            bucket,
            ok,
            failed: 1 - ok,
            ..CommitRecord::default()
        };
        commit(&s, &[c(3, 1), c(1, 1), c(2, 0), c(5, 1), c(3, 1)]).await;
        assert_eq!(s.t().unwrap().commits.len(), 2, "runs 1..=3 and 5");
        assert_eq!(s.commit_record(2).await.unwrap(), Some(c(2, 0)));
        assert_eq!(s.commit_record(4).await.unwrap(), None);
        assert_eq!(s.commit_record(0).await.unwrap(), None);
        // 2 is committed already and keeps its record; 4 joins the log.
        commit(&s, &[c(2, 1), c(4, 1)]).await;
        assert_eq!(s.commit_record(2).await.unwrap(), Some(c(2, 0)));
        assert_eq!(s.commit_record(4).await.unwrap(), Some(c(4, 1)));
        commit(&s, &[c(0, 1), c(1, 1), c(6, 1), c(7, 1)]).await;
        assert_eq!(s.commit_record(1).await.unwrap(), Some(c(1, 1)));
        let mut committed = Vec::new();
        for b in 0..9 {
            if s.commit_record(b).await.unwrap().is_some() {
                committed.push(b);
            }
        }
        assert_eq!(committed, (0..8).collect::<Vec<_>>());
        assert!(s.open_buckets().await.unwrap().is_empty());
        let failed: Vec<u64> = s
            .failed_buckets()
            .await
            .unwrap()
            .iter()
            .map(|c| c.bucket)
            .collect();
        assert_eq!(failed, vec![2]);
        let stats = s.stats().await.unwrap();
        assert_eq!((stats.buckets_committed, stats.ok, stats.failed), (8, 7, 1));
    }

    /// The run cache is neither used nor filled while a rewrite of runs is in progress (an
    /// odd generation), and what was cached before it is not served after it.
    #[tokio::test]
    async fn the_run_cache_never_serves_a_run_across_a_rewrite() {
        let (_dir, s) = store_of_one_row_buckets(2).await;
        let c = |bucket: u64, ok: u64| CommitRecord {
            bucket,
            ok,
            ..CommitRecord::default()
        };
        commit(&s, &[c(0, 1), c(1, 1)]).await;
        assert_eq!(s.commit_record(1).await.unwrap().unwrap().ok, 1); // cached now
                                                                      // A rewrite starts; sled gets the new run while it is in progress.
        let rewriting = Rewriting::start(&s.runs_rewritten);
        s.t()
            .unwrap()
            .commits
            .insert(0u64.to_be_bytes(), json(&[c(0, 7), c(1, 7)]))
            .unwrap();
        assert_eq!(s.commit_record(1).await.unwrap().unwrap().ok, 7);
        s.t()
            .unwrap()
            .commits
            .insert(0u64.to_be_bytes(), json(&[c(0, 8), c(1, 8)]))
            .unwrap();
        assert_eq!(
            s.commit_record(0).await.unwrap().unwrap().ok,
            8,
            "nothing cached mid-rewrite"
        );
        drop(rewriting);
        assert_eq!(s.commit_record(1).await.unwrap().unwrap().ok, 8);
        assert_eq!(s.commit_record(0).await.unwrap().unwrap().ok, 8);
    }

    /// A long run of commits is split into records of at most [`MAX_COMMIT_RUN`] buckets.
    #[tokio::test]
    async fn long_commit_runs_are_split() {
        let n = 2 * MAX_COMMIT_RUN as u64 + 88;
        let (_dir, s) = store_of_one_row_buckets(n).await;
        assert_eq!(s.t().unwrap().offsets.len(), 1);
        let commits: Vec<CommitRecord> = (0..n)
            .map(|bucket| CommitRecord {
                bucket,
                ok: 1,
                ..CommitRecord::default()
            })
            .collect();
        commit(&s, &commits).await;
        assert_eq!(s.t().unwrap().commits.len(), 3);
        for b in [0, 255, 256, 511, 512, n - 1] {
            assert_eq!(s.commit_record(b).await.unwrap().map(|c| c.bucket), Some(b));
        }
        assert_eq!(s.commit_record(n).await.unwrap(), None);
        assert!(s.open_buckets().await.unwrap().is_empty());
        assert_eq!(s.stats().await.unwrap().ok, n);
    }

    /// A segment whose ID list disagrees with its counts is reported as corrupt.
    #[tokio::test]
    async fn a_segment_with_missing_ids_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        s.plan(
            &[planned(0, &[(0, "a")], 1), planned(1, &[(1, "b")], 2)],
            &PlannerState::default(),
        )
        .await
        .unwrap();
        let short = s
            .id_lists
            .append(&[encode_ids(&[(0, "a".to_string())])])
            .unwrap()[0];
        s.t()
            .unwrap()
            .ids
            .insert(0u64.to_be_bytes(), &short.to_bytes())
            .unwrap();
        let err = s
            .bucket_items(&s.offset(1).await.unwrap().unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(err.root(), StoreError::Corrupt { .. })
                && err.to_string().contains("buckets 0..=1"),
            "{err}"
        );
        assert!(s.stats().await.is_err());
        assert!(s.for_each_final(&mut |_, _| Ok(())).await.is_err());
    }

    /// A format 1 store (one offset record per bucket, results in sled) opens, is upgraded to
    /// the current format (its results moved to the results log), and reads.
    #[tokio::test]
    async fn format_1_stores_open_and_read() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES)
                .unwrap();
            for b in [
                planned(0, &[(0, "a"), (1, "b")], 2),
                planned(1, &[(2, "c")], 3),
                planned(2, &[(3, "d")], 4),
            ] {
                let key = b.offset.bucket.to_be_bytes();
                s.t().unwrap().offsets.insert(key, json(&b.offset)).unwrap();
                s.t()
                    .unwrap()
                    .ids
                    .insert(key, encode_ids(&b.items))
                    .unwrap();
            }
            let commit = CommitRecord {
                bucket: 2,
                ok: 1,
                ..CommitRecord::default()
            };
            s.t()
                .unwrap()
                .commits
                .insert(2u64.to_be_bytes(), json(&commit))
                .unwrap();
            // Format 1 and 2 kept each result in sled, under its ID.
            let items = &s.t().unwrap().items;
            items.insert("d", json(&done(3, 2, true))).unwrap();
            s.t()
                .unwrap()
                .meta
                .insert("version", &1u32.to_be_bytes())
                .unwrap();
            items.insert("a", json(&done(0, 0, true))).unwrap();
            s.sync().await.unwrap();
        }
        // What an upgrade that stopped half way left: it starts over.
        fs::write(
            dir.path().join(super::super::results_log::LOG_FILE),
            b"half an upgrade",
        )
        .unwrap();
        let marker = dir.path().join(MARKER);
        let text = fs::read_to_string(&marker).unwrap();
        let current = format!("\"version\":{FORMAT_VERSION}");
        fs::write(&marker, text.replace(&current, "\"version\":1")).unwrap();
        assert!(fs::read_to_string(&marker)
            .unwrap()
            .contains("\"version\":1"));
        let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
        assert!(fs::read_to_string(&marker).unwrap().contains(&current));
        assert!(s.t().unwrap().items.is_empty(), "moved out of sled");
        assert!(s.item("a").await.unwrap().is_some() && s.item("b").await.unwrap().is_none());
        assert_eq!(first_row(&s, "b", 9).await, Some(1), "the IDs were indexed");
        assert_eq!(s.item("d").await.unwrap().map(|r| r.row), Some(3));
        assert_eq!(
            s.t()
                .unwrap()
                .meta
                .get("version")
                .unwrap()
                .unwrap()
                .as_ref(),
            FORMAT_VERSION.to_be_bytes()
        );
        let open: Vec<u64> = s
            .open_buckets()
            .await
            .unwrap()
            .iter()
            .map(|o| o.bucket)
            .collect();
        assert_eq!(open, vec![0, 1]);
        let items = s
            .bucket_items(&s.offset(0).await.unwrap().unwrap())
            .await
            .unwrap();
        assert_eq!(
            items
                .iter()
                .map(|(id, r)| (id.as_str(), r.is_final()))
                .collect::<Vec<_>>(),
            vec![("a", true), ("b", false)]
        );
        assert_eq!(s.commit_record(2).await.unwrap().map(|c| c.ok), Some(1));
        let stats = s.stats().await.unwrap();
        assert_eq!(
            (stats.ids_planned, stats.ok, stats.buckets_committed),
            (4, 2, 1)
        );
        // New plans and commits are written as segments and runs beside the old records.
        s.plan(
            &[planned(3, &[(4, "e")], 5), planned(4, &[(5, "f")], 6)],
            &PlannerState::default(),
        )
        .await
        .unwrap();
        commit(
            &s,
            &[CommitRecord {
                bucket: 3,
                ..CommitRecord::default()
            }],
        )
        .await;
        let open: Vec<u64> = s
            .open_buckets()
            .await
            .unwrap()
            .iter()
            .map(|o| o.bucket)
            .collect();
        assert_eq!(open, vec![0, 1, 4]);
        // An upgrade that stopped between the database and the marker is finished.
        drop(s);
        let text = fs::read_to_string(&marker).unwrap();
        fs::write(&marker, text.replace(&current, "\"version\":1")).unwrap();
        drop(SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap());
        assert!(fs::read_to_string(&marker).unwrap().contains(&current));
    }

    /// sled's own file lock, still held for a moment by the threads of a handle just dropped,
    /// does not fail the next open: it waits for it.
    #[tokio::test]
    async fn an_open_waits_for_sleds_lock_to_be_let_go() {
        let dir = tempfile::tempdir().unwrap();
        drop(SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap());
        let db = File::open(dir.path().join("sled").join("db")).unwrap();
        // SAFETY: flock on a file descriptor we own.
        assert_eq!(unsafe { libc::flock(db.as_raw_fd(), libc::LOCK_EX) }, 0);
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(db);
        });
        let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES);
        release.join().unwrap();
        assert!(s.is_ok(), "{:?}", s.err());
    }

    #[tokio::test]
    async fn second_open_is_busy_and_names_the_pid() {
        let dir = tempfile::tempdir().unwrap();
        let _s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        let err = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES)
            .err()
            .unwrap();
        match err.root() {
            StoreError::Busy { pid, .. } => assert_eq!(*pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn foreign_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = SledStore::open(
            &dir.path().join("nope"),
            OpenMode::Existing,
            DEFAULT_CACHE_BYTES,
        )
        .err()
        .unwrap();
        assert!(matches!(err.root(), StoreError::NotAStore { .. }), "{err}");
        fs::write(dir.path().join("file.txt"), "x").unwrap();
        let err = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES)
            .err()
            .unwrap();
        assert!(matches!(err.root(), StoreError::NotAStore { .. }), "{err}");
        let err = SledStore::open(
            &dir.path().join("file.txt"),
            OpenMode::CreateIfMissing,
            DEFAULT_CACHE_BYTES,
        )
        .err()
        .unwrap();
        assert!(matches!(err.root(), StoreError::NotAStore { .. }), "{err}");
    }

    #[tokio::test]
    async fn unknown_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap());
        fs::write(
            dir.path().join(MARKER),
            r#"{"format":"highwater-state","version":99}"#,
        )
        .unwrap();
        let err = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES)
            .err()
            .unwrap();
        assert!(
            matches!(err.root(), StoreError::Version { found: 99, .. }),
            "{err}"
        );
    }

    fn unknown(n: u64) -> std::collections::BTreeMap<String, u64> {
        [("unknown".to_string(), n)].into()
    }

    /// Rerun 1 (`--failed`) of one rerun bucket holding `items` (row, ID, job bucket), each
    /// failed before.
    fn failed_rerun(items: &[(u64, &str, u64)]) -> (RerunRecord, RerunBucket) {
        let n = items.len() as u64;
        let rerun = RerunRecord {
            number: 1,
            selection: RerunSelection::Failed,
            buckets: 1,
            ids: n,
            created_at_ms: 0,
        };
        let bucket = RerunBucket {
            offset: RerunOffset {
                rerun: 1,
                bucket: 0,
                items: n,
                before: items
                    .iter()
                    .map(|(_, _, bucket)| JobBucketShare {
                        bucket: *bucket,
                        ok: 0,
                        failed: 1,
                        failed_by_class: unknown(1),
                    })
                    .collect(),
                planned_at_ms: 0,
            },
            items: items
                .iter()
                .map(|(r, id, _)| (*r, id.to_string()))
                .collect(),
        };
        (rerun, bucket)
    }

    /// A rerun's ID lists go to ids.log, not sled; a reopen followed by more planning (a grown
    /// input) does not write over them; a format 3 rerun's inline lists still read, and
    /// opening such a store marks it format 4.
    #[tokio::test]
    async fn rerun_id_lists_live_in_ids_log_and_survive_a_reopen_and_more_planning() {
        let dir = tempfile::tempdir().unwrap();
        async fn rerun_ids(s: &SledStore) -> Vec<String> {
            let offset = s.rerun_open_buckets(1).await.unwrap().remove(0);
            s.rerun_bucket_items(&offset)
                .await
                .unwrap()
                .into_iter()
                .map(|(id, _)| id)
                .collect()
        }
        let log_len = || {
            fs::metadata(dir.path().join(super::super::id_lists::FILE))
                .unwrap()
                .len()
        };
        {
            let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES)
                .unwrap();
            let plan = vec![planned(0, &[(0, "a"), (1, "b")], 2)];
            s.plan(&plan, &PlannerState::default()).await.unwrap();
            let failed: Vec<(String, ItemRecord)> = [(0u64, "a"), (1, "b")]
                .iter()
                .map(|(row, id)| (id.to_string(), done(*row, 0, false)))
                .collect();
            s.record(&failed).await.unwrap();
            commit(
                &s,
                &[CommitRecord {
                    bucket: 0,
                    failed: 2,
                    failed_by_class: unknown(2),
                    ..CommitRecord::default()
                }],
            )
            .await;
            s.sync().await.unwrap();
            let before = log_len();
            let (rerun, bucket) = failed_rerun(&[(0, "a", 0), (1, "b", 0)]);
            s.create_rerun(&rerun, &[bucket]).await.unwrap();
            assert!(log_len() > before, "the list went to ids.log");
            let value = s
                .t()
                .unwrap()
                .rerun_ids
                .get(rerun_key(1, 0))
                .unwrap()
                .unwrap();
            assert_eq!(
                value.len(),
                ListRef::SIZE,
                "sled holds where it is, not the list"
            );
            s.sync().await.unwrap();
        }
        {
            let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
            // The input grew: a new bucket is planned after the rerun's list.
            let plan = vec![planned(1, &[(2, "c"), (3, "d")], 4)];
            s.plan(&plan, &PlannerState::default()).await.unwrap();
            s.sync().await.unwrap();
            assert_eq!(rerun_ids(&s).await, ["a", "b"]);
            // What format 3 wrote: the list inline in sled, the store marked 3.
            let t = s.t().unwrap();
            t.rerun_ids
                .insert(
                    rerun_key(1, 0),
                    encode_ids(&[(0, "a".to_string()), (1, "b".to_string())]),
                )
                .unwrap();
            t.meta.insert("version", &3u32.to_be_bytes()).unwrap();
            t.db.flush().unwrap();
        }
        let marker = dir.path().join(MARKER);
        let text = fs::read_to_string(&marker).unwrap();
        fs::write(
            &marker,
            text.replace(&format!("\"version\":{FORMAT_VERSION}"), "\"version\":3"),
        )
        .unwrap();
        let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
        assert_eq!(rerun_ids(&s).await, ["a", "b"]);
        let version = s.t().unwrap().meta.get("version").unwrap().unwrap();
        assert_eq!(version.as_ref(), FORMAT_VERSION.to_be_bytes());
        assert!(fs::read_to_string(&marker)
            .unwrap()
            .contains(&format!("\"version\":{FORMAT_VERSION}")));
        let items: Vec<String> = s
            .bucket_items(&s.offset(1).await.unwrap().unwrap())
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(items, ["c", "d"]);
    }

    /// A rerun that heals IDs of several buckets of one commit run rewrites that run once,
    /// moving each bucket's counts and keeping the others.
    #[tokio::test]
    async fn a_rerun_rewrites_the_commit_run_holding_its_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        let ids = ["a", "b", "c", "d"];
        let plan: Vec<PlannedBucket> = (0..4u64)
            .map(|i| planned(i, &[(i, ids[i as usize])], i + 1))
            .collect();
        s.plan(&plan, &PlannerState::default()).await.unwrap();
        let results: Vec<(String, ItemRecord)> = (0..4u64)
            .map(|i| (ids[i as usize].to_string(), done(i, i, i == 3)))
            .collect();
        s.record(&results).await.unwrap();
        let commits: Vec<CommitRecord> = (0..4u64)
            .map(|i| CommitRecord {
                bucket: i,
                ok: (i == 3) as u64,
                failed: (i != 3) as u64,
                committed_at_ms: 0,
                failed_by_class: if i == 3 { BTreeMap::new() } else { unknown(1) },
            })
            .collect();
        commit(&s, &commits).await;
        assert_eq!(s.t().unwrap().commits.len(), 1);
        assert_eq!(s.commit_record(1).await.unwrap().unwrap().failed, 1);
        // Rerun bucket 0 holds a and c (buckets 0 and 2); both heal.
        let (rerun, bucket) = failed_rerun(&[(0, "a", 0), (2, "c", 2)]);
        s.create_rerun(&rerun, &[bucket]).await.unwrap();
        let healed: Vec<(String, ItemRecord)> = [(0u64, "a"), (2, "c")]
            .iter()
            .map(|(row, id)| {
                let mut r = done(*row, *row, true);
                r.rerun = Some(1);
                (id.to_string(), r)
            })
            .collect();
        s.record(&healed).await.unwrap();
        commit_rerun(
            &s,
            1,
            &[CommitRecord {
                bucket: 0,
                ok: 2,
                ..CommitRecord::default()
            }],
        )
        .await;
        assert_eq!(
            s.t().unwrap().commits.len(),
            1,
            "the run was rewritten in place"
        );
        let mut counts: Vec<(u64, u64)> = Vec::new();
        for b in 0..4 {
            let c = s.commit_record(b).await.unwrap().unwrap();
            counts.push((c.ok, c.failed));
        }
        assert_eq!(counts, vec![(1, 0), (0, 1), (1, 0), (1, 0)]);
        let failed: Vec<u64> = s
            .failed_buckets()
            .await
            .unwrap()
            .iter()
            .map(|c| c.bucket)
            .collect();
        assert_eq!(failed, vec![1]);
        let stats = s.stats().await.unwrap();
        assert_eq!((stats.ok, stats.failed), (3, 1));
    }

    #[tokio::test]
    async fn a_rerun_commit_moves_the_job_counts_once() {
        let dir = tempfile::tempdir().unwrap();
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        s.plan(
            &[
                planned(0, &[(0, "a"), (1, "b")], 2),
                planned(1, &[(2, "c"), (3, "d")], 4),
            ],
            &PlannerState::default(),
        )
        .await
        .unwrap();
        s.record(&[
            ("a".into(), done(0, 0, true)),
            ("b".into(), done(1, 0, false)),
            ("c".into(), done(2, 1, false)),
            ("d".into(), done(3, 1, false)),
        ])
        .await
        .unwrap();
        commit(
            &s,
            &[
                CommitRecord {
                    bucket: 0,
                    ok: 1,
                    failed: 1,
                    committed_at_ms: 0,
                    failed_by_class: unknown(1),
                },
                CommitRecord {
                    bucket: 1,
                    ok: 0,
                    failed: 2,
                    committed_at_ms: 0,
                    failed_by_class: unknown(2),
                },
            ],
        )
        .await;
        let mut failed = vec![];
        s.for_each_failure(None, &mut |id, _| {
            failed.push(id.to_string());
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(failed, ["b", "c", "d"]);
        assert_eq!(s.failed_buckets().await.unwrap().len(), 2);

        let (rerun, bucket) = failed_rerun(&[(1, "b", 0), (2, "c", 1)]);
        s.create_rerun(&rerun, &[bucket]).await.unwrap();
        assert_eq!(s.reruns().await.unwrap(), vec![rerun]);
        let open = s.rerun_open_buckets(1).await.unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(s.rerun_bucket_items(&open[0]).await.unwrap().len(), 2);
        assert!(!s.rerun_stats(1).await.unwrap().finished());

        // b heals, c fails again.
        let mut b = done(1, 0, true);
        b.rerun = Some(1);
        let mut c = done(2, 1, false);
        c.rerun = Some(1);
        s.record(&[("b".into(), b), ("c".into(), c)]).await.unwrap();
        let commit = CommitRecord {
            bucket: 0,
            ok: 1,
            failed: 1,
            ..CommitRecord::default()
        };
        commit_rerun(&s, 1, std::slice::from_ref(&commit)).await;
        commit_rerun(&s, 1, &[commit]).await; // a repeat moves nothing
        let stats = s.stats().await.unwrap();
        assert_eq!((stats.ok, stats.failed), (2, 2));
        let (c0, c1) = (
            s.commit_record(0).await.unwrap().unwrap(),
            s.commit_record(1).await.unwrap().unwrap(),
        );
        assert_eq!((c0.failed, c0.failed_by_class.len()), (0, 0));
        assert_eq!((c1.failed, c1.failed_by_class.clone()), (2, unknown(2)));
        assert!(c0.classes_complete() && c1.classes_complete());
        assert_eq!(s.failed_buckets().await.unwrap().len(), 1);
        let r = s.rerun_stats(1).await.unwrap();
        assert!(r.finished());
        assert_eq!((r.ok, r.failed, r.pending), (1, 1, 0));
        assert!(s.rerun_open_buckets(1).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn records_written_before_the_newer_fields_still_load() {
        let old = r#"{"bucket":4,"ok":9,"failed":1,"committed_at_ms":5}"#;
        let c: CommitRecord = serde_json::from_str(old).unwrap();
        assert!(c.failed_by_class.is_empty() && !c.classes_complete());
        let old = r#"{"row":3,"bucket":0,"status":"failed","http_status":404,"class":"http","error":"HTTP 404","attempts":1}"#;
        let r: ItemRecord = serde_json::from_str(old).unwrap();
        assert_eq!(r.status, ItemStatus::Failed);
        assert_eq!(
            (r.first_attempt_ms, r.last_attempt_ms, r.rerun),
            (None, None, None)
        );
    }
}
