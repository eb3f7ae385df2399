//! What a job stores of its credentials: their definitions as written (`${VAR}` templates
//! unexpanded), never a value.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::oauth2::ClientAuth;

/// One credential of a job, as stored in its spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialSpec {
    /// The name templates use it by: `${NAME}`.
    pub name: String,
    /// Where its values come from.
    pub kind: CredentialKind,
    /// Renew at least this often (besides before expiry and when refused).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::serde_millis::option"
    )]
    pub every: Option<Duration>,
    /// Renew on HTTP 403 too, not only on 401.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub renew_on_403: bool,
}

/// Where a credential's values come from, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    /// A command printing the value, split like an exec job's command (`${VAR}` expanded
    /// when the run starts).
    Command {
        /// The command line as written.
        command: String,
    },
    /// An OAuth2 client-credentials grant. The client ID and secret are templates
    /// (`${CLIENT_SECRET}`), expanded from the environment when the run starts.
    #[serde(rename = "oauth2")]
    OAuth2 {
        /// The token endpoint's URL.
        token_url: String,
        /// The client ID (a template).
        client_id: String,
        /// The client secret (a template: `${VAR}`, never the value).
        client_secret: String,
        /// The scope asked for, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
        /// How the client authenticates (absent in a spec stored before it: Basic).
        #[serde(default, skip_serializing_if = "ClientAuth::is_basic")]
        client_auth: ClientAuth,
    },
}

impl std::fmt::Display for CredentialSpec {
    /// One line for messages and the spec's history (templates as written, so no secret).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            CredentialKind::Command { command } => {
                write!(f, "{} from command {command:?}", self.name)
            }
            CredentialKind::OAuth2 {
                token_url,
                client_id,
                scope,
                client_auth,
                ..
            } => {
                write!(f, "{} from OAuth2 {token_url} as {client_id:?}", self.name)?;
                if let Some(scope) = scope {
                    write!(f, " scope {scope:?}")?;
                }
                if *client_auth == ClientAuth::Post {
                    f.write_str(" (client_secret_post)")?;
                }
                Ok(())
            }
        }?;
        if let Some(every) = self.every {
            write!(f, ", renewed every {}", humantime::format_duration(every))?;
        }
        if self.renew_on_403 {
            f.write_str(", renewed on 403")?;
        }
        Ok(())
    }
}
