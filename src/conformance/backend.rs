//! What the suite needs of a backend under test ([`Backend`]): a factory that creates a
//! store, "crashes" it and opens it again, and damages it.

use std::sync::Arc;

use crate::store::{Leases, Store, StoreError};

/// A backend under test: makes fresh stores of one kind, and crashes and damages them the
/// way the kind can be crashed and damaged in a test.
pub trait Backend {
    /// The store under test.
    type S: Store + Leases;
    /// A new, empty store (of a new job: nothing of an earlier store is seen through it).
    fn create(&mut self) -> Arc<Self::S>;
    /// Close `store` (the caller holds its only reference) as abruptly as the backend can be
    /// closed in a test, and open it again: everything synced must be there.
    fn crash(&mut self, store: Arc<Self::S>) -> Arc<Self::S>;
    /// Damage the durable result of `id` in `store` (closed) and open it again: the error the
    /// open gave, or the store. The suite checks the damage is refused, never read as less
    /// data.
    fn damage_result(&mut self, store: Arc<Self::S>, id: &str) -> Result<Arc<Self::S>, StoreError>;
}
