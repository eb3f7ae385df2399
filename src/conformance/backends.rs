//! The backends the suite runs against: sled (a state directory in a temp dir), memory (run
//! alone, and shared by a fleet), and PostgreSQL (a job in a fresh database of the test
//! cluster).

use std::sync::Arc;

use super::backend::Backend;
use crate::store::mem::{MemStore, MemWorker, SharedMem};
use crate::store::sled_store::{OpenMode, DEFAULT_CACHE_BYTES};
use crate::store::*;

/// The sled backend: a state directory in a temp dir.
pub(crate) struct SledBackend {
    dirs: Vec<tempfile::TempDir>,
}

impl SledBackend {
    pub(crate) fn new() -> SledBackend {
        SledBackend { dirs: Vec::new() }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dirs.last().expect("created").path().join("state")
    }

    fn open(&self) -> Result<Arc<SledStore>, StoreError> {
        SledStore::open(&self.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).map(Arc::new)
    }
}

impl Backend for SledBackend {
    type S = SledStore;

    fn create(&mut self) -> Arc<SledStore> {
        self.dirs.push(tempfile::tempdir().unwrap());
        let store = SledStore::open(&self.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES);
        Arc::new(store.unwrap())
    }

    /// sled cannot be killed inside a test process: the store is dropped (which flushes), so
    /// this checks what a reopen reads, and the kill -9 tests of the binary check the rest.
    fn crash(&mut self, store: Arc<SledStore>) -> Arc<SledStore> {
        drop(Arc::into_inner(store).expect("the only reference"));
        self.open().unwrap()
    }

    /// Cut the results log to its first entry's length: the second result is gone.
    fn damage_result(
        &mut self,
        store: Arc<SledStore>,
        _id: &str,
    ) -> Result<Arc<SledStore>, StoreError> {
        drop(Arc::into_inner(store).expect("the only reference"));
        let log = self
            .path()
            .join(crate::store::sled_store::results_log::LOG_FILE);
        let len = std::fs::metadata(&log).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        file.set_len(len / 2).unwrap();
        self.open()
    }
}

/// The in-memory backend: a crash forgets what was not synced.
pub(crate) struct MemBackend;

impl Backend for MemBackend {
    type S = MemStore;

    fn create(&mut self) -> Arc<MemStore> {
        Arc::new(MemStore::new())
    }

    fn crash(&mut self, store: Arc<MemStore>) -> Arc<MemStore> {
        store.crash();
        store
    }

    fn damage_result(
        &mut self,
        store: Arc<MemStore>,
        id: &str,
    ) -> Result<Arc<MemStore>, StoreError> {
        assert!(store.lose_result(id));
        Ok(store)
    }
}

/// The in-memory store of a fleet: a worker of a job in memory. A crash loses what the
/// worker had not synced and lets its session expire; the job is opened again by a new
/// worker.
pub(crate) struct SharedMemBackend {
    job: SharedMem,
}

impl SharedMemBackend {
    pub(crate) fn new() -> SharedMemBackend {
        SharedMemBackend {
            job: SharedMem::new(),
        }
    }
}

impl Backend for SharedMemBackend {
    type S = MemWorker;

    fn create(&mut self) -> Arc<MemWorker> {
        self.job = SharedMem::new();
        Arc::new(self.job.worker())
    }

    fn crash(&mut self, store: Arc<MemWorker>) -> Arc<MemWorker> {
        // Not `Arc::into_inner`: a task of the engine run just ended (aborted, dropped a
        // moment later) may still hold it.
        store.crash();
        Arc::new(self.job.worker())
    }

    fn damage_result(
        &mut self,
        store: Arc<MemWorker>,
        id: &str,
    ) -> Result<Arc<MemWorker>, StoreError> {
        let store = self.crash(store);
        assert!(self.job.lose_result(id));
        Ok(store)
    }
}

/// The PostgreSQL backend: a job in a fresh database of the test cluster. A crash drops the
/// store without ending its session and lets the session expire (as a TTL passing would),
/// then opens the job again in a new session.
#[cfg(feature = "postgres")]
pub(crate) struct PgBackend {
    db: Option<postgres::test_db::Db>,
    /// A broken backend, to show the suite can fail: a crash also loses the commits.
    forget_commits: bool,
}

#[cfg(feature = "postgres")]
impl PgBackend {
    pub(crate) fn new(forget_commits: bool) -> PgBackend {
        PgBackend {
            db: None,
            forget_commits,
        }
    }

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
    }

    fn open(&self) -> Arc<postgres::PgStore> {
        let db = self.db.as_ref().expect("created");
        let open = postgres::PgOpen {
            create: true,
            ..postgres::PgOpen::new("conformance")
        };
        Arc::new(Self::block(postgres::PgStore::open(&db.target, &open)).unwrap())
    }

    /// Drop `store` as a crash would (its session expires), then run `sql` on its database.
    fn down(&self, store: Arc<postgres::PgStore>, sql: &str) {
        drop(Arc::into_inner(store).expect("the only reference"));
        let db = self.db.as_ref().expect("created");
        let sql = format!(
            "SET search_path TO {}; \
             UPDATE hw_worker SET expires_at = now() - interval '1 second'; {sql}",
            db.db.schema
        );
        db.psql(&sql);
    }
}

#[cfg(feature = "postgres")]
impl Backend for PgBackend {
    type S = postgres::PgStore;

    fn create(&mut self) -> Arc<postgres::PgStore> {
        self.db = Some(Self::block(postgres::test_db::migrated()));
        self.open()
    }

    fn crash(&mut self, store: Arc<postgres::PgStore>) -> Arc<postgres::PgStore> {
        let lose = if self.forget_commits {
            "UPDATE hw_bucket SET state = 'open', owner = NULL, committed_at = NULL \
             WHERE state = 'committed';"
        } else {
            ""
        };
        self.down(store, lose);
        self.open()
    }

    fn damage_result(
        &mut self,
        store: Arc<postgres::PgStore>,
        id: &str,
    ) -> Result<Arc<postgres::PgStore>, StoreError> {
        let lose = format!(
            "UPDATE hw_item SET status = 'pending', record = NULL, body = NULL WHERE id = '{id}';"
        );
        self.down(store, &lose);
        Ok(self.open())
    }
}
