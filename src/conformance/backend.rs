//! What the suite needs of a backend under test ([`Backend`]): a factory that creates a
//! store, "crashes" it and opens it again, and damages it.

use std::sync::Arc;

use crate::store::{Leases, Store, StoreError};

/// A backend under test.
pub(crate) trait Backend {
    type S: Store + Leases;
    /// A new, empty store.
    fn create(&mut self) -> Arc<Self::S>;
    /// Close `store` (the caller holds its only reference) as abruptly as the backend can be
    /// closed in a test, and open it again: everything synced must be there.
    fn crash(&mut self, store: Arc<Self::S>) -> Arc<Self::S>;
    /// Damage the durable result of `id` in `store` (closed) and open it again: the error the
    /// open gave, or the store.
    fn damage_result(&mut self, store: Arc<Self::S>, id: &str) -> Result<Arc<Self::S>, StoreError>;
}
