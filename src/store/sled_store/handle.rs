//! The open sled database and its reopen policy: the handle every operation borrows, the open
//! that waits for sled's own lock and turns sled's panics on damaged files into errors, and the
//! reopen after enough writes so sled writes a snapshot (bounding the replay after a crash).

use std::fs::{self};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sled::transaction::TransactionError;

use super::*;

/// Default sled page cache: small, because the working set is the tail of the logs.
pub const DEFAULT_CACHE_BYTES: u64 = 32 << 20;

/// How long an open waits for sled's own file lock (see [`SledStore::open`]).
pub(super) const SLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// sled 0.34 writes its snapshot (the page table that recovery starts from) only when the
/// database is opened, and an open replays every log entry written since the last snapshot
/// (`snapshot_after_ops` does nothing in 0.34; see spacejam/sled#926). A job that ran for
/// hours since its last start would replay all of it at the next start: about 0.3 s per
/// million results here, so a resume after a kill -9 would wait seconds for its first
/// request. After this many bytes written since the last open, or `REOPEN_SHARE` of the
/// store's size on disk if that is more, a sync reopens the database, which writes a new
/// snapshot; the replay after a crash is then bounded by that many bytes.
pub(crate) const REOPEN_AFTER_BYTES: u64 = 64 << 20;

/// An open itself costs time and memory in proportion to the store (reading the snapshot:
/// about 0.7 s and 370 MB at 10M results), so a large store is reopened less often: after
/// 1/`REOPEN_SHARE` of its size written. The replay after a crash then adds at most a small
/// fraction to the time any open takes, and reopening costs a few percent of the run.
pub(super) const REOPEN_SHARE: u64 = 32;

/// Called between closing and opening the database in a reopen (see
/// [`set_release_memory_hook`]).
pub(super) static RELEASE_MEMORY: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

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
pub(super) const REOPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The open sled database and its trees.
pub(super) struct Trees {
    pub(super) db: sled::Db,
    pub(super) meta: sled::Tree,
    pub(super) offsets: sled::Tree,
    pub(super) commits: sled::Tree,
    pub(super) ids: sled::Tree,
    pub(super) items: sled::Tree,
    pub(super) bad: sled::Tree,
    pub(super) reruns: sled::Tree,
    pub(super) rerun_offsets: sled::Tree,
    pub(super) rerun_ids: sled::Tree,
    pub(super) rerun_commits: sled::Tree,
    /// What makes a flush durable (see [`sled_files`]).
    pub(super) files: Arc<SledFiles>,
}

impl Trees {
    /// Open the database in `path` (`DIR/sled`), waiting briefly for sled's own file lock.
    pub(super) fn open(path: &Path, cache_bytes: u64) -> Result<Trees, StoreError> {
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
        let files =
            SledFiles::open(path).map_err(|e| StoreError::at(path.display(), StoreError::Io(e)))?;
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
            files,
        })
    }

    /// Flush the database and make the flush durable (sled's flush alone is not: see
    /// [`sled_files`]). Every flush of the store goes through here or [`Trees::flush_async`].
    pub(super) fn flush(&self) -> sled::Result<()> {
        sled_files::flush(&self.db, &self.files)
    }

    /// [`Trees::flush`] for async callers.
    pub(super) async fn flush_async(&self) -> sled::Result<()> {
        sled_files::flush_async(&self.db, &self.files).await
    }
}

/// sled can panic on some damaged files instead of returning an error; turn that into one.
pub(super) fn open_sled(path: &Path, cache_bytes: u64) -> Result<sled::Db, sled::Error> {
    // sled takes a lock on its file; a reopen in a process that spawns children (an exec
    // handler's processes) can find it still held by a child's copy of the descriptor between
    // fork and exec: gone within moments, so a refused lock is tried again, briefly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match open_sled_once(path, cache_bytes) {
            Err(sled::Error::Io(e))
                if e.to_string().starts_with("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            other => return other,
        }
    }
}

/// One attempt of [`open_sled`].
fn open_sled_once(path: &Path, cache_bytes: u64) -> Result<sled::Db, sled::Error> {
    let config = sled::Config::new()
        .path(path)
        .cache_capacity(cache_bytes)
        .mode(sled::Mode::LowSpace);
    quiet_panics_of(SLED_OPEN_THREAD);
    // On a thread of its own, so a panic is this open's error and says nothing on stderr,
    // while a panic anywhere else in the process is reported as usual.
    let opened = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name(SLED_OPEN_THREAD.into())
            .spawn_scoped(scope, move || config.open())
            .map(|thread| thread.join())
    });
    match opened {
        Err(spawn) => Err(sled::Error::Io(spawn)),
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => {
            let reason = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "sled failed while opening".into());
            Err(sled::Error::Unsupported(reason))
        }
    }
}

/// The name of the thread [`open_sled`] opens sled on.
const SLED_OPEN_THREAD: &str = "highwater-sled-open";

/// Leave out of the panic report (once, for the process's life) the panics of threads named
/// `name`, passing every other panic to the hook that was there. Installed once rather than
/// swapped around each open: a swap would also silence a panic of any other thread during
/// the open, and two opens at once could leave the silent hook in place.
fn quiet_panics_of(name: &'static str) {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(name) {
                previous(info);
            }
        }));
    });
}

/// The length of sled's log file (`DIR/sled/db`), 0 if unknown: the store's size for
/// [`REOPEN_SHARE`]. One stat; sled's own `size_on_disk` also lists and stats every blob file.
pub(super) fn log_size(sled_dir: &Path) -> u64 {
    fs::metadata(sled_dir.join("db"))
        .map(|m| m.len())
        .unwrap_or(0)
}

pub(super) fn backend(path: &Path, e: sled::Error) -> StoreError {
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

impl SledStore {
    /// The open database, for one operation (or one iterator's life).
    pub(super) fn t(&self) -> Result<Arc<Trees>, StoreError> {
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
    pub(super) fn reopen(&self) -> Result<bool, StoreError> {
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
        open.flush().map_err(|e| self.err(e))?;
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

    /// Reopen after at least `bytes` written instead of `REOPEN_AFTER_BYTES` (still at
    /// least `REOPEN_SHARE` of the store's size).
    pub fn set_reopen_after(&self, bytes: u64) {
        self.reopen_after.store(bytes, Ordering::Relaxed);
    }

    /// How many times a sync reopened the database since this handle was opened.
    pub fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
    }

    /// Count bytes written since the last open (see [`REOPEN_AFTER_BYTES`]).
    pub(super) fn wrote(&self, bytes: usize) {
        self.written_since_open
            .fetch_add(bytes as u64, Ordering::AcqRel);
    }

    pub(super) fn err(&self, e: sled::Error) -> StoreError {
        backend(&self.path, e)
    }

    pub(super) fn tx_err(&self, e: TransactionError<()>, what: &str) -> StoreError {
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
