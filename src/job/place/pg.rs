//! [`PgPlace`]: a job of a PostgreSQL database, one of the many it may hold, shared by any
//! number of workers. A run opens it as a worker's session; a reader (an export, a look,
//! the dashboard) through a session-less store, never in the way of the workers, kept for
//! the looks that follow. Its history is kept by the database.

use std::sync::Arc;

use tokio::sync::Mutex;

use super::job_place::{Crew, JobPlace, Look, PlaceNames};
use crate::console::shell_path;
use crate::store::postgres::{redact_url, PgError, PgOpen, PgStore, PgTarget};
use crate::store::StoreError;

/// A job of a PostgreSQL database.
#[derive(Clone)]
pub struct PgPlace {
    /// The database.
    pub target: PgTarget,
    /// The database's URL as given (`${VAR}`s not expanded), for messages: shown without
    /// its password.
    pub url: String,
    /// The job's name and how a run's session is opened (`create` is set by the open).
    pub open: PgOpen,
    /// The session-less store of the readers, once opened.
    reader: Arc<Mutex<Option<Arc<PgStore>>>>,
}

impl PgPlace {
    /// The job `job` of the database at `url` (its `${VAR}`s expanded from the
    /// environment), opened by a run as a worker with [`PgOpen::new`]'s session.
    pub fn new(url: &str, job: &str) -> Result<PgPlace, PgError> {
        Ok(PgPlace::at(
            PgTarget::parse(url)?,
            url.to_string(),
            PgOpen::new(job),
        ))
    }

    /// The job `open.job` of the database `target`, named `url` in messages.
    pub fn at(target: PgTarget, url: String, open: PgOpen) -> PgPlace {
        PgPlace {
            target,
            url,
            open,
            reader: Arc::default(),
        }
    }
}

impl JobPlace for PgPlace {
    type Store = PgStore;
    type Made = ();

    fn names(&self) -> PlaceNames {
        let url = redact_url(&self.url);
        let shown = format!("job {:?} of {url}", self.open.job);
        PlaceNames {
            job: format!("the {shown}"),
            absent: format!("there is no {shown}"),
            unmade: format!("{shown} has no spec yet (its first run stopped before creating it)"),
            shown,
            state_word: url.clone(),
            state: url,
            job_word: Some(shell_path(std::path::Path::new(&self.open.job))),
        }
    }

    async fn open(&self, create: bool) -> Result<(Arc<PgStore>, Option<()>), StoreError> {
        let open = PgOpen {
            create,
            ..self.open.clone()
        };
        let store = PgStore::open(&self.target, &open).await?;
        let made = store.created_job().then_some(());
        Ok((Arc::new(store), made))
    }

    async fn discard(&self, store: Arc<PgStore>, (): ()) -> Result<(), StoreError> {
        match Arc::into_inner(store) {
            Some(store) => store.discard_created_job().await,
            None => Err(StoreError::Backend {
                reason: "the refused job's store is still in use: it is left in the database"
                    .into(),
            }),
        }
    }

    async fn close(&self, store: Arc<PgStore>) {
        match Arc::into_inner(store) {
            Some(store) => {
                if let Err(e) = store.close().await {
                    tracing::warn!("cannot end the worker's session (it expires by itself): {e}");
                }
            }
            None => tracing::warn!("the worker's session is left to expire by itself"),
        }
    }

    fn joinable(&self) -> bool {
        true
    }

    fn no_such_job(&self, e: &StoreError) -> bool {
        matches!(e.root(), StoreError::NotAStore { .. })
    }

    async fn open_reader(&self) -> Result<Arc<PgStore>, StoreError> {
        let mut reader = self.reader.lock().await;
        if let Some(store) = &*reader {
            return Ok(store.clone());
        }
        let open = PgOpen {
            worker: false,
            ..PgOpen::new(self.open.job.clone())
        };
        let store = Arc::new(PgStore::open(&self.target, &open).await?);
        *reader = Some(store.clone());
        Ok(store)
    }

    /// A database's job is never held by one run: its store is always free to read.
    async fn look(&self) -> Result<Look<PgStore>, StoreError> {
        Ok(Look::Free {
            store: self.open_reader().await?,
            last: None,
        })
    }

    /// Read through the job's session-less reader, not the run's own connections.
    async fn look_running(&self, _store: &Arc<PgStore>) -> Result<Look<PgStore>, StoreError> {
        self.look().await
    }

    async fn crew(&self, store: &PgStore) -> Result<Option<Crew>, StoreError> {
        Ok(Some(Crew {
            workers: store.workers().await?,
            planning: store.planning().await?,
        }))
    }
}
