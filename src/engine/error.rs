//! What stops a run: [`EngineError`].

use crate::plan::PlanError;
use crate::store::StoreError;

/// Errors that stop a run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}
