//! The state directory as a directory: its marker file (format, version and the checkpoint of
//! what was durable, checked at open), its advisory lock, and atomic file replacement.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::sync::atomic::Ordering;

use super::*;

/// The file that marks a state directory: its format, store version and last checkpoint.
pub(crate) const MARKER: &str = "highwater.json";

pub(super) const MARKER_FORMAT: &str = "highwater-state";

#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Marker {
    pub(super) format: String,
    pub(super) version: u32,
    /// What was durable in the database when the marker was last written: on open, the
    /// database must still hold it, or it lost data (truncated, emptied, replaced files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) checkpoint: Option<Checkpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Checkpoint {
    pub(super) job_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) last_planned_bucket: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) last_committed_bucket: Option<u64>,
    pub(super) at_ms: u64,
}

/// How often the marker's checkpoint is rewritten during a run.
pub(super) const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

pub(super) struct MarkerState {
    pub(super) written: Option<Checkpoint>,
    pub(super) at: std::time::Instant,
}

/// How long a lock recorded as this process's own is waited for (see [`lock`]).
const OWN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a lock held by a reader ([`OpenMode::Read`]: the dashboard, for the moment of
/// a reading) is waited for.
const READER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the lock file says after the pid of a reader.
const READER_MARK: &str = "reader";

/// Take the directory's advisory lock, or say who holds it. The lock file holds the
/// holder's pid, followed by [`READER_MARK`] for a `reader`.
pub(super) fn lock(dir: &Path, reader: bool) -> Result<File, StoreError> {
    let path = dir.join("lock");
    let io = |source| StoreError::at(path.display(), StoreError::Io(source));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    // A lock recorded as this process's own, on a store this process let go of, is a
    // child's copy of the descriptor between its fork and its exec (an exec handler's
    // process, spawned by any thread): gone within moments, so it is waited for, briefly.
    // A reader holds it for a moment only: it is waited for too.
    let start = std::time::Instant::now();
    loop {
        if crate::os::try_lock_exclusive(&file).map_err(io)? {
            break;
        }
        let mut text = String::new();
        file.rewind().map_err(io)?;
        let _ = file.read_to_string(&mut text);
        let mut words = text.split_whitespace();
        let pid: Option<u32> = words.next().and_then(|w| w.parse().ok());
        let wait = if words.next() == Some(READER_MARK) {
            READER_WAIT
        } else if pid == Some(std::process::id()) {
            OWN_LOCK_WAIT
        } else {
            std::time::Duration::ZERO
        };
        if start.elapsed() >= wait {
            return Err(StoreError::at(dir.display(), StoreError::Busy { pid }));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    if reader {
        writeln!(file, "{} {READER_MARK}", std::process::id()).map_err(io)?;
    } else {
        writeln!(file, "{}", std::process::id()).map_err(io)?;
    }
    Ok(file)
}

/// Write `bytes` to `path` through a temp file and a rename, synced: the file and then its
/// directory, so the new name survives a power cut.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_synced(path, bytes, true)
}

/// [`write_atomically`], never in place of an existing file (an error then).
pub(super) fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_synced(path, bytes, false)
}

fn write_synced(path: &Path, bytes: &[u8], replace: bool) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    if replace {
        tmp.persist(path).map_err(|e| e.error)?;
    } else {
        tmp.persist_noclobber(path).map_err(|e| e.error)?;
    }
    File::open(dir)?.sync_all()
}

/// `create_dir_all`, then sync the parent of each directory it made, so the new directory
/// survives a power cut (its own entries are synced by whoever fills it).
pub(super) fn create_dir_durably(path: &Path) -> std::io::Result<()> {
    // The directories to be made, deepest first.
    let missing: Vec<&Path> = path
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .collect();
    std::fs::create_dir_all(path)?;
    for made in missing.iter().rev() {
        let parent = match made.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

pub(super) fn format_ms(ms: u64) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

impl SledStore {
    /// Record in the marker what is durable now (after a flush), at most every
    /// [`CHECKPOINT_EVERY`] unless `force`.
    pub(super) fn write_checkpoint(
        &self,
        planned: u64,
        committed: u64,
        force: bool,
    ) -> Result<(), StoreError> {
        let mut state = self
            .marker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Not due yet: nothing to write, so nothing to read (the stored job is read only for
        // its id, three sled reads and a copy of the spec: too much for every group commit).
        if !force && state.at.elapsed() < CHECKPOINT_EVERY {
            return Ok(());
        }
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
            at_ms: crate::store::now_ms(),
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
        if !changed {
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
    pub(super) fn flush_and_checkpoint(&self, force: bool) -> Result<(), StoreError> {
        let planned = self.written.planned.load(Ordering::Acquire);
        let committed = self.written.committed.load(Ordering::Acquire);
        let t = self.t()?;
        self.sync_side_files(&t, planned, force)?;
        t.flush().map_err(|e| self.err(e))?;
        self.write_checkpoint(planned, committed, force)
    }
}
