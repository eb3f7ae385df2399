//! Errors found while building a handler from a job's spec ([`HandlerError`]).

use crate::setting::Setting;

/// Errors found while building a handler from a job's spec, before any attempt. `what`
/// names the setting.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("{what}: environment variable {name} is not set")]
    MissingVar { what: Setting, name: String },
    #[error("{what}: {reason}")]
    Invalid { what: Setting, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}
