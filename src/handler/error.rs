//! Errors found while building a handler from a job's spec ([`HandlerError`]).

use crate::setting::Setting;

/// Errors found while building a handler from a job's spec, before any attempt. `what`
/// names the setting.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// A `${VAR}` names an environment variable that is not set.
    #[error("{what}: environment variable {name} is not set")]
    MissingVar {
        /// The setting holding it.
        what: Setting,
        /// The variable.
        name: String,
    },
    /// A setting's value is not valid (a template that does not parse, a malformed header).
    #[error("{what}: {reason}")]
    Invalid {
        /// The setting.
        what: Setting,
        /// Why it is not valid.
        reason: String,
    },
    /// The HTTP client could not be built (reqwest's message).
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}
