//! What makes sled's writes durable: its flush, then an `fdatasync` of its files.
//!
//! sled 0.34's `flush` writes its buffers and calls `sync_file_range` on Linux (sled issue
//! #1452), which flushes no disk write cache and writes no metadata (a grown file's size): a
//! flush that returned is durable only once sled's background flusher next calls `fsync`, up
//! to 500 ms later. Through a kill -9 that never showed (the kernel still writes the pages),
//! but a power cut in that window lost a new job's spec, commit records and quota
//! reservations that a sync had reported durable. So every flush here is sled's flush
//! followed by an `fdatasync` of sled's log through a descriptor of our own (a sync of any
//! descriptor writes back the file's pages), and an `fsync` of each blob file sled wrote
//! since (values too large for the log; sled never syncs them) and of their directory.
//!
//! At each open, sled's configuration file and the directories whose entries sled or the
//! store created or renamed (its snapshot, the blob directory, `DIR/sled` itself) are synced
//! once: sled writes the configuration without a sync, and renames its snapshot into place
//! without syncing the directory.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::watchdog;

/// The files of one open sled database that its flush leaves unsynced.
pub(super) struct SledFiles {
    /// `DIR/sled/db`, sled's log, opened read-only: `fdatasync` needs no write access.
    log: File,
    /// `DIR/sled/blobs`.
    blobs: PathBuf,
    /// Blob files already synced (a blob is written once and never changes).
    synced_blobs: Mutex<BTreeSet<OsString>>,
}

impl SledFiles {
    /// After sled opened the database in `dir`: sync what the open wrote (its configuration,
    /// a snapshot renamed into place, blobs) and the directories holding them.
    pub(super) fn open(dir: &Path) -> io::Result<Arc<SledFiles>> {
        let files = SledFiles {
            log: File::open(dir.join("db"))?,
            blobs: dir.join("blobs"),
            synced_blobs: Mutex::new(BTreeSet::new()),
        };
        match File::open(dir.join("conf")) {
            Ok(conf) => conf.sync_all()?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        files.log.sync_all()?;
        files.sync_blobs()?;
        sync_dir(dir)?;
        Ok(Arc::new(files))
    }

    /// Make durable what sled's flush (just returned) wrote: its log, and new blob files.
    pub(super) fn sync(&self) -> io::Result<()> {
        self.log.sync_data()?;
        self.sync_blobs()
    }

    /// `fsync` each blob file not synced yet, then their directory if there was one.
    fn sync_blobs(&self) -> io::Result<()> {
        let entries = match std::fs::read_dir(&self.blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut synced = self
            .synced_blobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut new = false;
        let mut present = BTreeSet::new();
        for entry in entries {
            let name = entry?.file_name();
            if !synced.contains(&name) {
                match File::open(self.blobs.join(&name)) {
                    Ok(blob) => blob.sync_all()?,
                    // Removed by sled's cleanup since it was listed.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                new = true;
            }
            present.insert(name);
        }
        // Removals are durable with the directory too: sync it when the set changed.
        if new || present.len() != synced.len() {
            sync_dir(&self.blobs)?;
        }
        *synced = present;
        Ok(())
    }
}

/// `fsync` a directory: makes the entries created, renamed or removed in it durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The database's flush made durable: sled's flush, then [`SledFiles::sync`].
pub(super) fn flush(db: &sled::Db, files: &SledFiles) -> sled::Result<()> {
    let _watch = watchdog::watch("sled's flush");
    db.flush()?;
    files.sync().map_err(sled::Error::Io)
}

/// [`flush`] for async callers, on tokio's blocking pool: sled's flush and the `fdatasync`.
///
/// Not sled's own `flush_async`: that runs the flush on sled's small IO thread pool, where
/// it waits for a log buffer whose write is queued on the same pool. Enough flushes at once
/// (several stores in one process, as in a test suite or a library program) occupy the
/// pool's seven resident threads, and sled adds a thread only once more than seven tasks
/// are queued: the write they wait for is never run, and every flush hangs (users of sled
/// report `flush_async` deadlocks, sled issues #1308 and #1412). Eight databases flushing
/// at once hang within a second that way; on tokio's blocking pool, where the flush waits
/// for that write without holding a thread it needs, sixteen finish (`tests/flush.rs`). Whatever hangs still
/// is the [watchdog](crate::watchdog)'s to report.
pub(super) async fn flush_async(db: &sled::Db, files: &Arc<SledFiles>) -> sled::Result<()> {
    let (db, files) = (db.clone(), files.clone());
    tokio::task::spawn_blocking(move || flush(&db, &files))
        .await
        .map_err(|e| sled::Error::Io(io::Error::other(e)))?
}
