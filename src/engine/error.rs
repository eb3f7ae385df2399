//! What stops a run: [`EngineError`].

use crate::plan::PlanError;
use crate::store::StoreError;

/// Errors that stop a run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Reading the input or writing the plan failed.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A task of the run failed (a worker panicked, the writer stopped).
    #[error("internal error: {0}")]
    Internal(String),
}
