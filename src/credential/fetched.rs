//! What a source hands over: a fresh secret value ([`Fetched`]), which messages only ever
//! show as [`REDACTED`].

use std::fmt;
use std::time::Duration;

/// Text that stands for a secret in messages.
pub const REDACTED: &str = "<redacted>";

/// A fresh value from a source, and how long it lives if the source said so.
pub struct Fetched {
    /// The secret itself: never logged (its `Debug` shows [`REDACTED`]).
    pub value: String,
    /// How long the value lives, if the source said (OAuth2's `expires_in`); none: until refused.
    pub expires_in: Option<Duration>,
}

impl fmt::Debug for Fetched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetched")
            .field("value", &REDACTED)
            .field("expires_in", &self.expires_in)
            .finish()
    }
}
