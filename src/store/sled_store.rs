//! The embedded store: one state directory holding a sled database.
//!
//! Layout of a state directory:
//!
//! ```text
//! DIR/highwater.json   marker: {"format":"highwater-state","version":1}, written first
//! DIR/lock             advisory lock (flock) held by the running process; holds its pid
//! DIR/sled/            the sled database, trees:
//!     meta     "version" → u32, "job" → JobSpec JSON, "planner" → PlannerState JSON
//!     offsets  bucket (u64 BE) → OffsetRecord JSON      (the offset log)
//!     commits  bucket (u64 BE) → CommitRecord JSON      (the commit log)
//!     ids      bucket (u64 BE) → the bucket's unique IDs with their rows, in input order
//!              (binary: per ID, row u64 LE, length u32 LE, UTF-8 bytes)
//!     items    ID bytes → ItemRecord JSON, written once the item is final
//!     bad      row (u64 BE) → BadLine JSON
//!     reruns         rerun (u32 BE) → RerunRecord JSON
//!     rerun_offsets  rerun (u32 BE) ++ bucket (u64 BE) → RerunOffset JSON (a rerun's offset log)
//!     rerun_ids      same key → the rerun bucket's IDs with their rows (as in `ids`)
//!     rerun_commits  same key → CommitRecord JSON                (a rerun's commit log)
//! ```
//!
//! Stores written before reruns existed simply have these trees empty; item records without
//! the newer fields (attempt times, rerun) read with those fields unset.
//!
//! Durability: sled flushes on its own every 500 ms, but nothing here relies on that. A plan
//! write is one multi-tree transaction (all of a batch of buckets or none). Callers order the
//! writes with [`Store::sync`]: plans are synced before their items are dispatched; results
//! are synced before their buckets' commit records are written.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::*;

pub const MARKER: &str = "highwater.json";
const MARKER_FORMAT: &str = "highwater-state";

/// Default sled page cache: small, because the working set is the tail of the logs.
pub const DEFAULT_CACHE_BYTES: u64 = 32 << 20;

/// A state directory, opened and locked for this process.
pub struct SledStore {
    path: PathBuf,
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
    /// Highest buckets written to the offset and commit logs.
    written: Watermarks,
    marker: std::sync::Mutex<MarkerState>,
    /// Held for the store's lifetime; the flock goes with it.
    _lock: File,
}

#[derive(serde::Serialize, serde::Deserialize)]
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

/// How often the marker's checkpoint is rewritten during a run.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

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
        let io = |source| StoreError::Io {
            path: path.to_owned(),
            source,
        };
        let not_store = |reason: &str| StoreError::NotAStore {
            path: path.to_owned(),
            reason: reason.to_owned(),
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
        if marker.version != FORMAT_VERSION {
            return Err(StoreError::Version {
                path: path.to_owned(),
                found: marker.version,
                supported: FORMAT_VERSION,
            });
        }
        let lock = lock(path)?;
        let db = open_sled(&path.join("sled"), cache_bytes).map_err(|e| match e {
            sled::Error::Io(source) => StoreError::Io {
                path: path.to_owned(),
                source,
            },
            other => StoreError::Corrupt {
                path: path.to_owned(),
                reason: other.to_string(),
            },
        });
        let db = db?;
        let tree = |name: &str| db.open_tree(name).map_err(|e| backend(path, e));
        let store = SledStore {
            path: path.to_owned(),
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
            written: Watermarks::default(),
            marker: std::sync::Mutex::new(MarkerState {
                written: marker.checkpoint.clone(),
                at: std::time::Instant::now(),
            }),
            _lock: lock,
        };
        let lost = |what: String| {
            StoreError::Corrupt {
            path: path.to_owned(),
            reason: format!(
                "{what}, although it was durable at {} (sled files truncated, emptied or replaced); \
                 restore the state directory from a backup or start a new one",
                marker.checkpoint.as_ref().map(|c| format_ms(c.at_ms)).unwrap_or_default()
            ),
        }
        };
        match store.meta.get("version").map_err(|e| store.err(e))? {
            None if marker.checkpoint.is_some() => {
                return Err(lost("the database holds no highwater data".into()))
            }
            None => {
                store
                    .meta
                    .insert("version", &FORMAT_VERSION.to_be_bytes())
                    .map_err(|e| store.err(e))?;
                store.db.flush().map_err(|e| store.err(e))?;
            }
            Some(v) if v.as_ref() == FORMAT_VERSION.to_be_bytes() => {}
            Some(v) => {
                let found = <[u8; 4]>::try_from(v.as_ref())
                    .map(u32::from_be_bytes)
                    .unwrap_or(0);
                return Err(StoreError::Version {
                    path: path.to_owned(),
                    found,
                    supported: FORMAT_VERSION,
                });
            }
        }
        if let Some(c) = &marker.checkpoint {
            match store.job()? {
                Some(job) if job.job_id == c.job_id => {}
                _ => return Err(lost(format!("the database lost job {}", c.job_id))),
            }
            if let Some(b) = c.last_planned_bucket {
                if !store
                    .offsets
                    .contains_key(b.to_be_bytes())
                    .map_err(|e| store.err(e))?
                {
                    return Err(lost(format!("the offset log lost bucket {b}")));
                }
            }
            if let Some(b) = c.last_committed_bucket {
                if !store
                    .commits
                    .contains_key(b.to_be_bytes())
                    .map_err(|e| store.err(e))?
                {
                    return Err(lost(format!("the commit log lost bucket {b}")));
                }
            }
        }
        Ok(store)
    }

    /// Record in the marker what is durable now (after a flush), at most every
    /// [`CHECKPOINT_EVERY`] unless `force`.
    fn write_checkpoint(
        &self,
        planned: u64,
        committed: u64,
        force: bool,
    ) -> Result<(), StoreError> {
        let mut state = self.marker.lock().expect("never poisoned");
        let Some(job) = self.job()? else {
            return Ok(());
        };
        let last = state.written.as_ref();
        let checkpoint = Checkpoint {
            job_id: job.job_id,
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
        .map_err(|source| StoreError::Io {
            path: self.path.join(MARKER),
            source,
        })?;
        state.written = Some(checkpoint);
        state.at = std::time::Instant::now();
        Ok(())
    }

    /// Flush, then checkpoint what the flush made durable.
    fn flush_and_checkpoint(&self, force: bool) -> Result<(), StoreError> {
        let planned = self.written.planned.load(Ordering::Acquire);
        let committed = self.written.committed.load(Ordering::Acquire);
        self.db.flush().map_err(|e| self.err(e))?;
        self.write_checkpoint(planned, committed, force)
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: sled::Error) -> StoreError {
        backend(&self.path, e)
    }

    fn decode<T: DeserializeOwned>(&self, what: &str, bytes: &[u8]) -> Result<T, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
            path: self.path.clone(),
            reason: format!("undecodable {what} record: {e}"),
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

    /// The unique IDs of a bucket with their rows, in input order.
    fn bucket_ids(&self, bucket: u64) -> Result<Vec<(u64, String)>, StoreError> {
        let blob = self
            .ids
            .get(bucket.to_be_bytes())
            .map_err(|e| self.err(e))?;
        let corrupt = |reason: &str| StoreError::Corrupt {
            path: self.path.clone(),
            reason: format!("the IDs of bucket {bucket} {reason}"),
        };
        let blob = blob.ok_or_else(|| corrupt("are missing"))?;
        decode_ids(&blob).ok_or_else(|| corrupt("are undecodable"))
    }

    /// A bucket's items: each ID with its final record, or a pending one.
    fn items_of(&self, offset: &OffsetRecord) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let ids = self.bucket_ids(offset.bucket)?;
        if ids.len() as u64 != offset.items {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                reason: format!(
                    "bucket {} should hold {} IDs, its ID list has {}",
                    offset.bucket,
                    offset.items,
                    ids.len()
                ),
            });
        }
        let mut out = Vec::with_capacity(ids.len());
        for (row, id) in ids {
            let record = self
                .get(&self.items, id.as_bytes(), "item")?
                .unwrap_or_else(|| ItemRecord::pending(row, offset.bucket));
            out.push((id, record));
        }
        Ok(out)
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
        let corrupt = |reason: &str| StoreError::Corrupt {
            path: self.path.clone(),
            reason: format!(
                "the IDs of bucket {} of rerun {} {reason}",
                offset.bucket, offset.rerun
            ),
        };
        let blob = self
            .rerun_ids
            .get(rerun_key(offset.rerun, offset.bucket))
            .map_err(|e| self.err(e))?
            .ok_or_else(|| corrupt("are missing"))?;
        let ids = decode_ids(&blob).ok_or_else(|| corrupt("are undecodable"))?;
        let mut out = Vec::with_capacity(ids.len());
        for (row, id) in ids {
            let record: ItemRecord = self
                .get(&self.items, id.as_bytes(), "item")?
                .ok_or_else(|| corrupt(&format!("include {id:?}, which has no record")))?;
            debug_assert_eq!(record.row, row);
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

fn encode_ids(items: &[(u64, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.iter().map(|(_, id)| 12 + id.len()).sum());
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

fn backend(path: &Path, e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(source) => StoreError::Io {
            path: path.to_owned(),
            source,
        },
        sled::Error::Corruption { .. } => StoreError::Corrupt {
            path: path.to_owned(),
            reason: e.to_string(),
        },
        other => StoreError::Backend {
            path: path.to_owned(),
            reason: other.to_string(),
        },
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

/// Take the directory's advisory lock, or say who holds it.
fn lock(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join("lock");
    let io = |source| StoreError::Io {
        path: path.clone(),
        source,
    };
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
            return Err(StoreError::Busy {
                path: dir.to_owned(),
                pid: text.trim().parse().ok(),
            });
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

impl Store for SledStore {
    fn job(&self) -> Result<Option<JobSpec>, StoreError> {
        self.get(&self.meta, b"job", "job")
    }

    fn put_job(&self, spec: &JobSpec) -> Result<(), StoreError> {
        self.meta
            .insert("job", json(spec))
            .map_err(|e| self.err(e))?;
        self.db.flush().map_err(|e| self.err(e))?;
        Ok(())
    }

    fn planner(&self) -> Result<PlannerState, StoreError> {
        Ok(self
            .get(&self.meta, b"planner", "planner")?
            .unwrap_or_default())
    }

    fn has_result(&self, id: &str) -> Result<bool, StoreError> {
        self.items
            .contains_key(id.as_bytes())
            .map_err(|e| self.err(e))
    }

    fn plan(&self, buckets: &[PlannedBucket], planner: &PlannerState) -> Result<(), StoreError> {
        let mut offsets = sled::Batch::default();
        let mut ids = sled::Batch::default();
        let mut bad = sled::Batch::default();
        for b in buckets {
            let key = b.offset.bucket.to_be_bytes();
            offsets.insert(&key, json(&b.offset));
            ids.insert(&key, encode_ids(&b.items));
            for line in &b.bad_lines {
                bad.insert(&line.row.to_be_bytes(), json(line));
            }
        }
        let planner = json(planner);
        let highest = buckets
            .iter()
            .map(|b| b.offset.bucket + 1)
            .max()
            .unwrap_or(0);
        let result = (&self.offsets, &self.ids, &self.bad, &self.meta)
            .transaction(|(o, i, b, m)| {
                o.apply_batch(&offsets)?;
                i.apply_batch(&ids)?;
                b.apply_batch(&bad)?;
                m.insert("planner", planner.as_slice())?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                TransactionError::Storage(e) => self.err(e),
                TransactionError::Abort(()) => StoreError::Backend {
                    path: self.path.clone(),
                    reason: "plan aborted".into(),
                },
            });
        self.written.planned.fetch_max(highest, Ordering::AcqRel);
        result
    }

    fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (id, record) in results {
            batch.insert(id.as_bytes(), json(record));
        }
        self.items.apply_batch(batch).map_err(|e| self.err(e))
    }

    fn commit(&self, commits: &[CommitRecord]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for c in commits {
            batch.insert(&c.bucket.to_be_bytes(), json(c));
        }
        self.commits.apply_batch(batch).map_err(|e| self.err(e))?;
        let highest = commits.iter().map(|c| c.bucket + 1).max().unwrap_or(0);
        self.written.committed.fetch_max(highest, Ordering::AcqRel);
        Ok(())
    }

    async fn sync(&self) -> Result<(), StoreError> {
        let planned = self.written.planned.load(Ordering::Acquire);
        let committed = self.written.committed.load(Ordering::Acquire);
        self.db.flush_async().await.map_err(|e| self.err(e))?;
        self.write_checkpoint(planned, committed, false)
    }

    fn open_buckets(&self) -> Result<Vec<OffsetRecord>, StoreError> {
        let mut open = Vec::new();
        for entry in self.offsets.iter() {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            if !self.commits.contains_key(&key).map_err(|e| self.err(e))? {
                open.push(self.decode("offset", &value)?);
            }
        }
        Ok(open)
    }

    fn bucket_items(&self, bucket: &OffsetRecord) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.items_of(bucket)
    }

    fn for_each_final(
        &self,
        f: &mut dyn FnMut(&str, &ItemRecord) -> std::io::Result<()>,
    ) -> Result<(), ExportError> {
        for entry in self.offsets.iter() {
            let (_, value) = entry.map_err(|e| self.err(e))?;
            let offset: OffsetRecord = self.decode("offset", &value)?;
            for (id, record) in self.items_of(&offset)? {
                if record.is_final() {
                    f(&id, &record)?;
                }
            }
        }
        Ok(())
    }

    fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError> {
        let mut out = Vec::new();
        for entry in self.bad.iter().take(limit) {
            let (_, v) = entry.map_err(|e| self.err(e))?;
            out.push(self.decode("bad line", &v)?);
        }
        Ok(out)
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        let planner = self.planner()?;
        let mut s = StoreStats {
            input_exhausted: planner.exhausted,
            rows_read: planner.cursor.row,
            input_bytes_read: planner.cursor.byte,
            ..StoreStats::default()
        };
        for entry in self.offsets.iter() {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            let offset: OffsetRecord = self.decode("offset", &value)?;
            s.buckets_planned += 1;
            s.ids_planned += offset.items;
            s.duplicates += offset.duplicates;
            s.bad_lines += offset.bad_lines;
            match self.commits.get(&key).map_err(|e| self.err(e))? {
                Some(c) => {
                    let commit: CommitRecord = self.decode("commit", &c)?;
                    s.buckets_committed += 1;
                    s.ok += commit.ok;
                    s.failed += commit.failed;
                }
                None => {
                    s.buckets_in_flight += 1;
                    for (_, record) in self.items_of(&offset)? {
                        match record.status {
                            ItemStatus::Ok => s.ok += 1,
                            ItemStatus::Failed => s.failed += 1,
                            ItemStatus::Pending => {}
                        }
                    }
                }
            }
        }
        s.pending = s.ids_planned.saturating_sub(s.ok + s.failed);
        Ok(s)
    }

    fn item(&self, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        self.get(&self.items, id.as_bytes(), "item")
    }

    fn offset(&self, bucket: u64) -> Result<Option<OffsetRecord>, StoreError> {
        self.get(&self.offsets, &bucket.to_be_bytes(), "offset")
    }

    fn commit_record(&self, bucket: u64) -> Result<Option<CommitRecord>, StoreError> {
        self.get(&self.commits, &bucket.to_be_bytes(), "commit")
    }

    fn failed_buckets(&self) -> Result<Vec<CommitRecord>, StoreError> {
        let all: Vec<CommitRecord> = self.decode_all(self.commits.iter(), "commit")?;
        Ok(all.into_iter().filter(|c| c.failed > 0).collect())
    }

    fn for_each_failure(
        &self,
        bucket: Option<u64>,
        f: &mut dyn FnMut(&str, &ItemRecord) -> std::io::Result<()>,
    ) -> Result<(), ExportError> {
        let offsets: Vec<OffsetRecord> = match bucket {
            Some(b) => self.offset(b)?.into_iter().collect(),
            None => self.decode_all(self.offsets.iter(), "offset")?,
        };
        for offset in offsets {
            if let Some(c) = self.commit_record(offset.bucket)? {
                if c.failed == 0 {
                    continue;
                }
            }
            for (id, record) in self.items_of(&offset)? {
                if record.status == ItemStatus::Failed {
                    f(&id, &record)?;
                }
            }
        }
        Ok(())
    }

    fn set_planner(&self, planner: &PlannerState) -> Result<(), StoreError> {
        self.plan(&[], planner)
    }

    fn reruns(&self) -> Result<Vec<RerunRecord>, StoreError> {
        self.decode_all(self.reruns.iter(), "rerun")
    }

    fn create_rerun(&self, rerun: &RerunRecord, buckets: &[RerunBucket]) -> Result<(), StoreError> {
        let mut offsets = sled::Batch::default();
        let mut ids = sled::Batch::default();
        for b in buckets {
            let key = rerun_key(b.offset.rerun, b.offset.bucket);
            offsets.insert(&key, json(&b.offset));
            ids.insert(&key, encode_ids(&b.items));
        }
        let record = json(rerun);
        (&self.reruns, &self.rerun_offsets, &self.rerun_ids)
            .transaction(|(r, o, i)| {
                o.apply_batch(&offsets)?;
                i.apply_batch(&ids)?;
                r.insert(&rerun.number.to_be_bytes(), record.as_slice())?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| self.tx_err(e, "rerun creation aborted"))
    }

    fn rerun_open_buckets(&self, rerun: u32) -> Result<Vec<RerunOffset>, StoreError> {
        let mut out = Vec::new();
        for entry in self.rerun_offsets.scan_prefix(rerun.to_be_bytes()) {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            if !self
                .rerun_commits
                .contains_key(&key)
                .map_err(|e| self.err(e))?
            {
                out.push(self.decode("rerun offset", &value)?);
            }
        }
        Ok(out)
    }

    fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        self.rerun_items(offset)
    }

    fn commit_rerun(&self, rerun: u32, commits: &[CommitRecord]) -> Result<(), StoreError> {
        // What each commit moves in the job's commit log: per job bucket, the statuses of the
        // rerun bucket's IDs now against before the rerun.
        #[derive(Default)]
        struct Moved {
            ok: i64,
            failed: i64,
            classes: std::collections::BTreeMap<String, i64>,
        }
        let mut moved: std::collections::BTreeMap<u64, Moved> = Default::default();
        let mut batch = sled::Batch::default();
        for c in commits {
            let key = rerun_key(rerun, c.bucket);
            if self
                .rerun_commits
                .contains_key(key)
                .map_err(|e| self.err(e))?
            {
                continue; // already committed: its move is already applied
            }
            let offset: RerunOffset = self
                .get(&self.rerun_offsets, &key, "rerun offset")?
                .ok_or_else(|| StoreError::Corrupt {
                    path: self.path.clone(),
                    reason: format!("rerun {rerun} commits bucket {} it never planned", c.bucket),
                })?;
            for share in &offset.before {
                let m = moved.entry(share.bucket).or_default();
                m.ok -= share.ok as i64;
                m.failed -= share.failed as i64;
                for (class, n) in &share.failed_by_class {
                    *m.classes.entry(class.clone()).or_default() -= *n as i64;
                }
            }
            for (_, record) in self.rerun_items(&offset)? {
                let m = moved.entry(record.bucket).or_default();
                match record.status {
                    ItemStatus::Ok => m.ok += 1,
                    ItemStatus::Failed => {
                        m.failed += 1;
                        *m.classes.entry(class_name(&record)).or_default() += 1;
                    }
                    ItemStatus::Pending => {}
                }
            }
            batch.insert(&key, json(c));
        }
        let mut job = sled::Batch::default();
        for (bucket, m) in moved {
            if m.ok == 0 && m.failed == 0 && m.classes.values().all(|n| *n == 0) {
                continue;
            }
            if let Some(mut c) = self.commit_record(bucket)? {
                c.ok = (c.ok as i64 + m.ok).max(0) as u64;
                c.failed = (c.failed as i64 + m.failed).max(0) as u64;
                for (class, n) in m.classes {
                    let count = c.failed_by_class.entry(class.clone()).or_default();
                    *count = (*count as i64 + n).max(0) as u64;
                    if *count == 0 {
                        c.failed_by_class.remove(&class);
                    }
                }
                job.insert(&bucket.to_be_bytes(), json(&c));
            }
        }
        (&self.rerun_commits, &self.commits)
            .transaction(|(r, c)| {
                r.apply_batch(&batch)?;
                c.apply_batch(&job)?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| self.tx_err(e, "rerun commit aborted"))
    }

    fn rerun_stats(&self, rerun: u32) -> Result<RerunStats, StoreError> {
        let record: Option<RerunRecord> = self.get(&self.reruns, &rerun.to_be_bytes(), "rerun")?;
        let Some(record) = record else {
            return Ok(RerunStats {
                number: rerun,
                ..RerunStats::default()
            });
        };
        let mut s = RerunStats {
            number: rerun,
            buckets: record.buckets,
            ids: record.ids,
            ..RerunStats::default()
        };
        for entry in self.rerun_offsets.scan_prefix(rerun.to_be_bytes()) {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            match self.rerun_commits.get(&key).map_err(|e| self.err(e))? {
                Some(c) => {
                    let c: CommitRecord = self.decode("rerun commit", &c)?;
                    s.buckets_committed += 1;
                    s.ok += c.ok;
                    s.failed += c.failed;
                }
                None => {
                    let offset: RerunOffset = self.decode("rerun offset", &value)?;
                    for (_, r) in self.rerun_items(&offset)? {
                        if r.rerun == Some(rerun) {
                            match r.status {
                                ItemStatus::Ok => s.ok += 1,
                                ItemStatus::Failed => s.failed += 1,
                                ItemStatus::Pending => {}
                            }
                        }
                    }
                }
            }
        }
        s.pending = s.ids.saturating_sub(s.ok + s.failed);
        Ok(s)
    }
}

impl SledStore {
    fn tx_err(&self, e: TransactionError<()>, what: &str) -> StoreError {
        match e {
            TransactionError::Storage(e) => self.err(e),
            TransactionError::Abort(()) => StoreError::Backend {
                path: self.path.clone(),
                reason: what.into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .unwrap();
            s.sync().await.unwrap();
            assert!(!s.has_result("c").unwrap());
            s.record(&[
                ("a".into(), done(0, 0, true)),
                ("b".into(), done(1, 0, false)),
            ])
            .unwrap();
            s.sync().await.unwrap();
            assert!(s.has_result("a").unwrap());
            s.commit(&[CommitRecord {
                bucket: 0,
                ok: 1,
                failed: 1,
                ..CommitRecord::default()
            }])
            .unwrap();
            s.record(&[("d".into(), done(3, 1, true))]).unwrap();
            s.sync().await.unwrap();
        }
        let s = SledStore::open(&path, OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
        let open = s.open_buckets().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].bucket, 1);
        let items = s.bucket_items(&open[0]).unwrap();
        assert_eq!(
            items.iter().map(|i| i.0.as_str()).collect::<Vec<_>>(),
            vec!["c", "d"]
        );
        assert!(!items[0].1.is_final());
        assert!(items[1].1.is_final());
        let stats = s.stats().unwrap();
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

    #[test]
    fn second_open_is_busy_and_names_the_pid() {
        let dir = tempfile::tempdir().unwrap();
        let _s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        match SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES) {
            Err(StoreError::Busy { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{:?}", other.err()),
        }
    }

    #[test]
    fn foreign_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            SledStore::open(
                &dir.path().join("nope"),
                OpenMode::Existing,
                DEFAULT_CACHE_BYTES
            ),
            Err(StoreError::NotAStore { .. })
        ));
        fs::write(dir.path().join("file.txt"), "x").unwrap();
        let err = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES)
            .err()
            .unwrap();
        assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
        let err = SledStore::open(
            &dir.path().join("file.txt"),
            OpenMode::CreateIfMissing,
            DEFAULT_CACHE_BYTES,
        )
        .err()
        .unwrap();
        assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    }

    #[test]
    fn unknown_version_is_refused() {
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
            matches!(err, StoreError::Version { found: 99, .. }),
            "{err}"
        );
    }

    fn unknown(n: u64) -> std::collections::BTreeMap<String, u64> {
        [("unknown".to_string(), n)].into()
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
        .unwrap();
        s.record(&[
            ("a".into(), done(0, 0, true)),
            ("b".into(), done(1, 0, false)),
            ("c".into(), done(2, 1, false)),
            ("d".into(), done(3, 1, false)),
        ])
        .unwrap();
        s.commit(&[
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
        ])
        .unwrap();
        let mut failed = vec![];
        s.for_each_failure(None, &mut |id, _| {
            failed.push(id.to_string());
            Ok(())
        })
        .unwrap();
        assert_eq!(failed, ["b", "c", "d"]);
        assert_eq!(s.failed_buckets().unwrap().len(), 2);

        let rerun = RerunRecord {
            number: 1,
            selection: RerunSelection::Failed,
            buckets: 1,
            ids: 2,
            created_at_ms: 0,
        };
        let bucket = RerunBucket {
            offset: RerunOffset {
                rerun: 1,
                bucket: 0,
                items: 2,
                before: vec![
                    JobBucketShare {
                        bucket: 0,
                        ok: 0,
                        failed: 1,
                        failed_by_class: unknown(1),
                    },
                    JobBucketShare {
                        bucket: 1,
                        ok: 0,
                        failed: 1,
                        failed_by_class: unknown(1),
                    },
                ],
                planned_at_ms: 0,
            },
            items: vec![(1, "b".into()), (2, "c".into())],
        };
        s.create_rerun(&rerun, &[bucket]).unwrap();
        assert_eq!(s.reruns().unwrap(), vec![rerun]);
        let open = s.rerun_open_buckets(1).unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(s.rerun_bucket_items(&open[0]).unwrap().len(), 2);
        assert!(!s.rerun_stats(1).unwrap().finished());

        // b heals, c fails again.
        let mut b = done(1, 0, true);
        b.rerun = Some(1);
        let mut c = done(2, 1, false);
        c.rerun = Some(1);
        s.record(&[("b".into(), b), ("c".into(), c)]).unwrap();
        let commit = CommitRecord {
            bucket: 0,
            ok: 1,
            failed: 1,
            ..CommitRecord::default()
        };
        s.commit_rerun(1, std::slice::from_ref(&commit)).unwrap();
        s.commit_rerun(1, &[commit]).unwrap(); // a repeat moves nothing
        let stats = s.stats().unwrap();
        assert_eq!((stats.ok, stats.failed), (2, 2));
        let (c0, c1) = (
            s.commit_record(0).unwrap().unwrap(),
            s.commit_record(1).unwrap().unwrap(),
        );
        assert_eq!((c0.failed, c0.failed_by_class.len()), (0, 0));
        assert_eq!((c1.failed, c1.failed_by_class.clone()), (2, unknown(2)));
        assert!(c0.classes_complete() && c1.classes_complete());
        assert_eq!(s.failed_buckets().unwrap().len(), 1);
        let r = s.rerun_stats(1).unwrap();
        assert!(r.finished());
        assert_eq!((r.ok, r.failed, r.pending), (1, 1, 0));
        assert!(s.rerun_open_buckets(1).unwrap().is_empty());
    }

    #[test]
    fn records_written_before_the_newer_fields_still_load() {
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
