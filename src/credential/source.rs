//! Where a credential's values come from ([`CredentialSource`]): a command or an OAuth2
//! client-credentials grant.

use super::command::CommandSource;
use super::error::CredentialError;
use super::fetched::Fetched;
use super::oauth2::OAuth2Source;
use crate::secrets::Secrets;

/// Where a credential's values come from.
pub enum CredentialSource {
    /// A command whose standard output (trimmed) is the value.
    Command(CommandSource),
    /// An OAuth2 client-credentials grant.
    OAuth2(OAuth2Source),
}

impl CredentialSource {
    /// A fresh value; what an error quotes is cut without leaving part of one of `secrets`.
    pub(super) async fn fetch(
        &self,
        name: &str,
        secrets: &Secrets,
    ) -> Result<Fetched, CredentialError> {
        match self {
            CredentialSource::Command(c) => c.fetch(name, secrets).await,
            CredentialSource::OAuth2(o) => o.fetch(name, secrets).await,
        }
    }

    /// Secrets of the source itself (an OAuth2 client secret, and the Basic authorization
    /// it is sent in), to keep out of messages.
    pub(super) fn secrets(&self) -> Vec<String> {
        match self {
            CredentialSource::Command(_) => Vec::new(),
            CredentialSource::OAuth2(o) => vec![o.client_secret().to_string(), o.basic_auth()],
        }
    }
}
