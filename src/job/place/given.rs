//! A store a library program built and gave ([`crate::Job::store`]) as a place: it is open
//! already and is its program's, so an open makes nothing (a refused creation leaves in it
//! whatever the program put there), and no run ever holds it against a reader.

use std::sync::Arc;

use super::job_place::{JobPlace, Look, PlaceNames};
use crate::store::{Leases, Store, StoreError};

impl<S: Store + Leases> JobPlace for Arc<S> {
    type Store = S;
    type Made = ();

    fn names(&self) -> PlaceNames {
        let shown = "the store given".to_string();
        PlaceNames {
            job: "the job in the store given".into(),
            absent: "the store given holds no job".into(),
            unmade: "the store given holds no job yet".into(),
            state: shown.clone(),
            state_word: shown.clone(),
            shown,
            job_word: None,
        }
    }

    async fn open(&self, _create: bool) -> Result<(Arc<S>, Option<()>), StoreError> {
        Ok((self.clone(), None))
    }

    async fn discard(&self, store: Arc<S>, (): ()) -> Result<(), StoreError> {
        drop(store);
        Ok(())
    }

    async fn open_reader(&self) -> Result<Arc<S>, StoreError> {
        Ok(self.clone())
    }

    async fn look(&self) -> Result<Look<S>, StoreError> {
        Ok(Look::Free {
            store: self.clone(),
            last: None,
        })
    }
}
