//! [`JobPlace`]: what every place a job is kept in does, whatever its backend, and what it
//! gives back: its names ([`PlaceNames`]), one look at it ([`Look`]), its history.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use crate::history::file::HistoryReadError;
use crate::history::Record;
use crate::live::LiveSnapshot;
use crate::store::{Leases, Store, StoreError};

/// Where a job is kept: see the module's documentation.
pub trait JobPlace: Send + Sync {
    /// The store a job kept here is opened as.
    type Store: Store + Leases;
    /// What an open made, for [`JobPlace::discard`] to undo.
    type Made: Send;

    /// How messages name the place and its job.
    fn names(&self) -> PlaceNames;

    /// The directory beside the store, if the place has one: a run publishes `live.json`
    /// there, and the library writes the IDs it is given there.
    fn dir(&self) -> Option<&Path> {
        None
    }

    /// Open the store to run the job, creating it when `create` and it is missing; with
    /// it, what this open made, if it made it (nothing was there before).
    fn open(
        &self,
        create: bool,
    ) -> impl Future<Output = Result<OpenedStore<Self::Store, Self::Made>, StoreError>> + Send;

    /// Undo the open that made `store`: the place is left as it was before.
    fn discard(
        &self,
        store: Arc<Self::Store>,
        made: Self::Made,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Close `store`, opened to run the job, when its run is over or its job was refused: a
    /// database's worker session ends at once instead of expiring. Dropping it is enough
    /// by default.
    fn close(&self, store: Arc<Self::Store>) -> impl Future<Output = ()> + Send {
        drop(store);
        async {}
    }

    /// Whether a process without the job's input joins it as one more worker instead of
    /// resuming it (a job several workers share; a joining worker does not read the input).
    fn joinable(&self) -> bool {
        false
    }

    /// Whether `e`, an open's error, says only that the place holds no job of this name (a
    /// job its user creates), rather than that the place itself is missing or broken.
    fn no_such_job(&self, e: &StoreError) -> bool {
        let _ = e;
        false
    }

    /// Open the store for a reader that may take its time (an export): nothing is created,
    /// and no run's session is registered. A store a run holds is the store's error.
    fn open_reader(&self) -> impl Future<Output = Result<Arc<Self::Store>, StoreError>> + Send;

    /// One look at the job, for a moment (`status`, the dashboard): its store, or, while a
    /// run holds it, what that run publishes.
    fn look(&self) -> impl Future<Output = Result<Look<Self::Store>, StoreError>> + Send;

    /// The job's history, oldest first: kept beside the store, or by `store` (the one
    /// [`JobPlace::look`] found free) when it keeps it itself.
    fn history(
        &self,
        store: Option<&Self::Store>,
    ) -> impl Future<Output = Result<Vec<Record>, HistoryError>> + Send {
        async move {
            let Some(store) = store else {
                return Ok(Vec::new());
            };
            Ok(store
                .history()
                .await?
                .into_iter()
                .filter_map(|r| serde_json::from_value(r).ok())
                .collect())
        }
    }

    /// One look at the job while this process runs it on `store` (the run's own
    /// dashboard): the run's store itself, read beside the run (a store shared between
    /// threads is read while it is written), with the snapshot the run publishes in the
    /// place's directory. A place whose look never waits on a run may look as usual.
    fn look_running(
        &self,
        store: &Arc<Self::Store>,
    ) -> impl Future<Output = Result<Look<Self::Store>, StoreError>> + Send {
        let live = self
            .dir()
            .and_then(crate::live::read)
            .filter(|s| s.pid == std::process::id() && !s.finished);
        let store = store.clone();
        async move { Ok(Look::Running { store, live }) }
    }

    /// The workers sharing the job and where its planning stands, for a job several
    /// workers share; none for a job one run at a time holds.
    #[cfg(feature = "postgres")]
    fn crew(
        &self,
        store: &Self::Store,
    ) -> impl Future<Output = Result<Option<Crew>, StoreError>> + Send {
        let _ = store;
        async { Ok(None) }
    }
}

/// A store a place opened, and what the open made, if it made it.
pub type OpenedStore<S, M> = (Arc<S>, Option<M>);

/// How messages name a place and the job it holds, in the place's own words (no flag of
/// any command line).
#[derive(Debug, Clone)]
pub struct PlaceNames {
    /// The place alone, as a page heads it: the directory, or `job "j" of postgres://host/db`
    /// (a URL never with its password).
    pub shown: String,
    /// The job, in a sentence: `the job in DIR`, `the job "j" of postgres://host/db`.
    pub job: String,
    /// The place when there is no job in it: `DIR holds no job`, `there is no job "j" of ...`.
    pub absent: String,
    /// The place when its job's first run stopped before storing the job: `DIR holds no job
    /// yet (...)`.
    pub unmade: String,
    /// Where the job is kept: the directory, or the database's URL.
    pub state: String,
    /// [`PlaceNames::state`] as one word of a shell command.
    pub state_word: String,
    /// The job's name, as one word of a shell command, where the place holds several jobs.
    pub job_word: Option<String>,
}

/// What one look at a job finds ([`JobPlace::look`]).
pub enum Look<S> {
    /// No run holds the store: it is open for reading, with the snapshot the last run left,
    /// if any (one not marked finished says that run died).
    Free {
        /// The store, opened for the moment of the look.
        store: Arc<S>,
        /// The last run's `live.json`.
        last: Option<LiveSnapshot>,
    },
    /// A run holds the store: only what it publishes can be read (and, when that run
    /// serves its own dashboard, its address is in the snapshot).
    Held {
        /// The run's process id, when the store records it.
        pid: Option<u32>,
        /// That run's snapshot, once it has published one.
        live: Option<LiveSnapshot>,
    },
    /// This process runs the job ([`JobPlace::look_running`]): its store, read beside the
    /// run, and the snapshot the run publishes, once it has published one.
    Running {
        /// The run's own store.
        store: Arc<S>,
        /// The run's snapshot.
        live: Option<LiveSnapshot>,
    },
}

/// A job's history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The history file beside the store.
    #[error(transparent)]
    File(#[from] HistoryReadError),
    /// The store that keeps the history.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The workers of a job several share, and where its planning stands.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone)]
pub struct Crew {
    /// Every worker session, expired ones included.
    pub workers: Vec<crate::store::postgres::WorkerRow>,
    /// Where planning the input stands.
    pub planning: crate::store::postgres::Planning,
}

#[cfg(feature = "postgres")]
impl Crew {
    /// Whether a worker's session is alive: the job is being run.
    pub fn running(&self) -> bool {
        self.workers.iter().any(|w| w.state != "expired")
    }
}
