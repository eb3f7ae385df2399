//! Credential: a secret value that renews itself during a run (an OAuth2 access token, the
//! output of `gh auth token`), read by the handlers for every request.
//!
//! A [`Credential`] holds its current value, numbered by a *generation*, and renews it from its
//! source ([`CredentialSource`]: a command, [`command`], or an OAuth2 client-credentials grant,
//! [`oauth2`]):
//!
//! - **before it expires**: a value is due for renewal at its `expires_in` minus a margin (the
//!   smaller of 10% and [`MAX_EXPIRY_MARGIN`]), or after the interval the job gives, whichever
//!   comes first; the first request that finds it due renews it ([`Credential::get`]), and
//!   if that fails for now while the value has not expired, the value stays in use and the
//!   renewal is tried again after a backoff;
//! - **when the other side refuses it** ([`Credential::refused`]): a request made with
//!   generation `g` that got a 401 asks for a renewal from `g`. Renewals are single flight:
//!   however many requests saw `g` refused, one renewal happens, and a refusal of an older
//!   generation causes none (the value was renewed since: retry with it).
//!
//! A refusal of a value that was itself renewed because of a refusal, before any request
//! succeeded with it, means the renewal did not help: the credential is rejected
//! ([`Refusal::Rejected`]), and the run stops rather than fail IDs for it. So does a token
//! endpoint that refuses the client ([`CredentialError::Rejected`]). A source that fails for
//! now (a command exiting non-zero, a token endpoint answering 5xx or out of reach) is
//! [`CredentialError::Unavailable`]: the attempt that needed the value is retried like one
//! that found the API out of reach, so the run's backoff and outage limit apply to it.
//!
//! A library program's own handler holds a credential the same way the HTTP and exec handlers
//! do: [`Credential::get`] before each request, [`Credential::after_refusal`] when the other
//! side refuses it, [`Credential::accepted`] otherwise.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use highwater::credential::{command::CommandSource, Credential, CredentialSource};
//! use highwater::failure::Failure;
//!
//! # async fn call(id: &str, token: &str) -> u16 { 200 }
//! let gh = CommandSource::new(vec!["gh".into(), "auth".into(), "token".into()], Duration::from_secs(30));
//! let token = Arc::new(Credential::new("TOKEN", CredentialSource::Command(gh.unwrap()), None));
//! let handler = move |id: String| {
//!     let token = token.clone();
//!     async move {
//!         let value = token.get().await.map_err(|e| e.into_failure())?;
//!         if call(&id, value.expose()).await == 401 {
//!             // Renewed and retried at once, or the run stops: the credential is rejected.
//!             return Err(token.after_refusal(&value, Failure::permanent("HTTP 401")).await);
//!         }
//!         token.accepted(&value);
//!         Ok(serde_json::json!({ "id": id }))
//!     }
//! };
//! # let _ = handler;
//! ```
//!
//! Secrets: the value and the OAuth2 client secret live only in memory. `Debug` output,
//! errors and logs never show them; [`Credential::redact`] masks them (every value the
//! credential ever had, not only the current one) in any text that came from elsewhere (an
//! answer body, a command's standard error), and [`Credential::secrets`] hands them, renewals
//! included as they arrive, to a job's masker ([`crate::secrets`]).

pub mod command;
mod error;
mod fetched;
pub mod oauth2;
mod renewal;
mod source;
mod spec;

pub use error::CredentialError;
pub use fetched::{Fetched, REDACTED};
pub use renewal::{due_in, Credential, CredentialValue, Refusal, MAX_EXPIRY_MARGIN};
pub use source::CredentialSource;
pub use spec::{CredentialKind, CredentialSpec};

#[cfg(test)]
mod tests;
