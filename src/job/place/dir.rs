//! [`StateDirPlace`]: a job kept in a state directory (the sled store), the one place that
//! opens a state directory's store.
//!
//! A run holds the directory's lock for as long as it runs, and sled cannot be opened by a
//! second process meanwhile; the run publishes `live.json` instead ([`crate::live`]). The
//! rule for reading a directory a run holds is [`StateDirPlace::look`]'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::job_place::{HistoryError, JobPlace, Look, PlaceNames};
use crate::console::shell_path;
use crate::history::Record;
use crate::live::{self, LiveSnapshot};
use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES, REOPEN_AFTER_BYTES};
use crate::store::StoreError;

/// The sled page cache of a reader (a look, an export): small, it reads what it needs once.
pub(crate) const READ_CACHE_BYTES: u64 = 16 << 20;

/// A state directory (the sled store).
#[derive(Debug, Clone)]
pub struct StateDirPlace {
    /// The directory.
    pub dir: PathBuf,
    /// The store's cache when it is opened to run the job, in bytes.
    pub cache_bytes: u64,
    /// Reopen the store after this many bytes written (see [`SledStore::set_reopen_after`]);
    /// 0 never.
    pub reopen_after: u64,
}

/// What opening a state directory made.
#[derive(Debug)]
pub enum MadeDir {
    /// This directory, the outermost of the state directory and its parents that was missing.
    Created(PathBuf),
    /// The state directory's entries: it was there, empty.
    Filled,
}

impl StateDirPlace {
    /// The state directory `dir`, with the store's default cache and reopen policy.
    pub fn new(dir: impl Into<PathBuf>) -> StateDirPlace {
        StateDirPlace {
            dir: dir.into(),
            cache_bytes: DEFAULT_CACHE_BYTES,
            reopen_after: REOPEN_AFTER_BYTES,
        }
    }

    /// The store, for a reader that may take its time (see [`JobPlace::open_reader`]).
    pub fn open_reader_now(&self) -> Result<SledStore, StoreError> {
        self.store(OpenMode::Existing, READ_CACHE_BYTES)
    }

    /// The directory's store, opened as `mode` with a cache of `cache_bytes`: the one open
    /// of a state directory.
    fn store(&self, mode: OpenMode, cache_bytes: u64) -> Result<SledStore, StoreError> {
        SledStore::open(&self.dir, mode, cache_bytes)
    }
}

impl JobPlace for StateDirPlace {
    type Store = SledStore;
    type Made = MadeDir;

    fn names(&self) -> PlaceNames {
        let dir = self.dir.display();
        PlaceNames {
            shown: dir.to_string(),
            job: format!("the job in {dir}"),
            absent: format!("{dir} holds no job"),
            unmade: format!("{dir} holds no job yet (its first run stopped before creating one)"),
            state: dir.to_string(),
            state_word: shell_path(&self.dir),
            job_word: None,
        }
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    async fn open(&self, create: bool) -> Result<(Arc<SledStore>, Option<MadeDir>), StoreError> {
        let missing = self
            .dir
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .last()
            .map(Path::to_path_buf);
        let empty = std::fs::read_dir(&self.dir).is_ok_and(|mut d| d.next().is_none());
        let mode = if create {
            OpenMode::CreateIfMissing
        } else {
            OpenMode::Existing
        };
        let store = self.store(mode, self.cache_bytes)?;
        store.set_reopen_after(self.reopen_after);
        let made = match (create, missing) {
            (false, _) => None,
            (true, Some(dir)) => Some(MadeDir::Created(dir)),
            (true, None) => empty.then_some(MadeDir::Filled),
        };
        Ok((Arc::new(store), made))
    }

    async fn discard(&self, store: Arc<SledStore>, made: MadeDir) -> Result<(), StoreError> {
        // Closed first: its files are removed below.
        drop(store);
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |e: std::io::Error| StoreError::at(path.display(), e.into())
        };
        match made {
            MadeDir::Created(dir) => std::fs::remove_dir_all(&dir).map_err(at(&dir)),
            MadeDir::Filled => {
                for entry in std::fs::read_dir(&self.dir).map_err(at(&self.dir))? {
                    let path = entry.map_err(at(&self.dir))?.path();
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path).map_err(at(&path))?;
                    } else {
                        std::fs::remove_file(&path).map_err(at(&path))?;
                    }
                }
                Ok(())
            }
        }
    }

    async fn open_reader(&self) -> Result<Arc<SledStore>, StoreError> {
        self.open_reader_now().map(Arc::new)
    }

    /// The store, opened as a reader for the moment of the look (a run that starts
    /// meanwhile waits for it); or, while a run holds it, the snapshot that run publishes.
    ///
    /// The snapshot is read after the lock was found held, and is the holder's only if it
    /// names the holder's pid and is not marked finished: a runner marks its snapshot
    /// finished before it lets go of the lock, and writes its pid as soon as it holds it,
    /// so any other snapshot is an earlier run's. Once the store is free, a snapshot not
    /// marked finished means the last runner died (kill -9, a crash, a power cut),
    /// whatever process has its pid now.
    async fn look(&self) -> Result<Look<SledStore>, StoreError> {
        match self.store(OpenMode::Read, READ_CACHE_BYTES) {
            Ok(store) => Ok(Look::Free {
                store: Arc::new(store),
                last: live::read(&self.dir),
            }),
            Err(e) => match e.root() {
                StoreError::Busy { pid } => {
                    let pid = *pid;
                    let live = live::read(&self.dir).filter(|s| held_by(s, pid));
                    Ok(Look::Held { pid, live })
                }
                _ => Err(e),
            },
        }
    }

    /// The history file beside the store: readable while a run holds it.
    async fn history(&self, _store: Option<&SledStore>) -> Result<Vec<Record>, HistoryError> {
        Ok(crate::history::file::read(&self.dir)?)
    }
}

/// Whether `snapshot` is the one the run holding the store (`pid`, if known) publishes.
fn held_by(snapshot: &LiveSnapshot, pid: Option<u32>) -> bool {
    Some(snapshot.pid) == pid && !snapshot.finished
}
