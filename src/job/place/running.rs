//! [`RunningPlace`]: the place of a job this process runs, as the run's own dashboard reads
//! it. Sled lets one process open a state directory, so only the run itself can show the
//! bucket map and the failures while it works; this place gives a reader the run's open
//! store ([`JobPlace::look_running`]) instead of a second open, and never makes, closes or
//! discards anything.

use std::path::Path;
use std::sync::Arc;

use super::job_place::{HistoryError, JobPlace, Look, PlaceNames};
use crate::history::Record;
use crate::store::StoreError;

/// The place `place` of a job this process runs on `store`.
pub struct RunningPlace<P: JobPlace> {
    place: P,
    store: Arc<P::Store>,
}

impl<P: JobPlace> RunningPlace<P> {
    /// The job at `place`, which this process runs on `store` (opened there).
    pub fn new(place: P, store: Arc<P::Store>) -> RunningPlace<P> {
        RunningPlace { place, store }
    }
}

impl<P: JobPlace + Clone> Clone for RunningPlace<P> {
    fn clone(&self) -> Self {
        RunningPlace {
            place: self.place.clone(),
            store: self.store.clone(),
        }
    }
}

impl<P: JobPlace> JobPlace for RunningPlace<P> {
    type Store = P::Store;
    type Made = ();

    fn names(&self) -> PlaceNames {
        self.place.names()
    }

    fn dir(&self) -> Option<&Path> {
        self.place.dir()
    }

    /// The run's store: it is open already, and this makes nothing.
    async fn open(&self, _create: bool) -> Result<(Arc<P::Store>, Option<()>), StoreError> {
        Ok((self.store.clone(), None))
    }

    async fn discard(&self, store: Arc<P::Store>, (): ()) -> Result<(), StoreError> {
        drop(store);
        Ok(())
    }

    async fn open_reader(&self) -> Result<Arc<P::Store>, StoreError> {
        Ok(self.store.clone())
    }

    async fn look(&self) -> Result<Look<P::Store>, StoreError> {
        self.place.look_running(&self.store).await
    }

    async fn history(&self, store: Option<&P::Store>) -> Result<Vec<Record>, HistoryError> {
        self.place.history(store).await
    }

    #[cfg(feature = "postgres")]
    async fn crew(&self, store: &P::Store) -> Result<Option<super::Crew>, StoreError> {
        self.place.crew(store).await
    }
}
