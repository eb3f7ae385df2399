//! Why a credential could not be had ([`CredentialError`]), and the failed attempt that
//! makes.

use crate::failure::{ErrorClass, Failure, Next};

/// Why a credential could not be had. Messages never hold the value or the client secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The source failed for now (a command exiting non-zero, a token endpoint answering
    /// 5xx or out of reach): try again later.
    #[error("credential {name}: {message}")]
    Unavailable {
        /// The credential's name.
        name: String,
        /// What the source said.
        message: String,
    },
    /// The source refused (a token endpoint refusing the client), or the other side refused
    /// a value just renewed: only a fix by the user helps.
    #[error("credential {name} was rejected: {message}")]
    Rejected {
        /// The credential's name.
        name: String,
        /// Who refused, and what they said.
        message: String,
    },
}

impl CredentialError {
    /// The failed attempt this error makes: out of reach (retried, evidence of an outage,
    /// class `connect`) or rejected ([`Next::CredentialRejected`]: the run stops).
    pub fn into_failure(self) -> Failure {
        let message = self.to_string();
        match self {
            CredentialError::Unavailable { .. } => {
                Failure::unreachable(message).class(ErrorClass::Connect)
            }
            CredentialError::Rejected { .. } => Failure {
                next: Next::CredentialRejected,
                ..Failure::permanent(message)
            },
        }
    }
}
