//! The suite run against every backend, and the tests that show it can fail.

use super::backends::*;
use std::sync::Arc;

use super::backend::Backend;
use super::suite::run_all;
use crate::store::mem::MemStore;
use crate::store::*;

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_conforms() {
    run_all(&mut PgBackend::new(false)).await.unwrap();
}

/// The suite can fail on PostgreSQL too: a job whose crash loses its commits is caught.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_that_loses_commits_fails_the_suite() {
    let failed = run_all(&mut PgBackend::new(true)).await;
    assert!(
        failed.is_err(),
        "the suite passed a PostgreSQL store that loses commits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sled_store_conforms() {
    run_all(&mut SledBackend::new()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_conforms() {
    run_all(&mut MemBackend).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_of_a_fleet_conforms() {
    run_all(&mut SharedMemBackend::new()).await.unwrap();
}

/// The suite can fail: a store that forgets its commits on a crash is caught, and the
/// check that caught it named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_loses_synced_commits_fails_the_suite() {
    struct Forgetful;
    impl Backend for Forgetful {
        type S = MemStore;
        fn create(&mut self) -> Arc<MemStore> {
            Arc::new(MemStore::new())
        }
        fn crash(&mut self, store: Arc<MemStore>) -> Arc<MemStore> {
            store.forget_commits();
            store
        }
        fn damage_result(
            &mut self,
            store: Arc<MemStore>,
            id: &str,
        ) -> Result<Arc<MemStore>, StoreError> {
            MemBackend.damage_result(store, id)
        }
    }
    let failed = run_all(&mut Forgetful)
        .await
        .expect_err("the suite passed a store that loses commits");
    assert_eq!(
        failed.check, "commits_are_final_and_fenced_by_their_lease",
        "{failed}"
    );
}
