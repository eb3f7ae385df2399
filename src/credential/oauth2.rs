//! A credential from an OAuth2 client-credentials grant (RFC 6749, section 4.4): `POST` to
//! the token URL with `grant_type=client_credentials` (and `scope` if given), the client ID
//! and secret as HTTP Basic auth (`client_secret_basic`) or in the form body
//! (`client_secret_post`); the answer's `access_token` is the value and its `expires_in`
//! (seconds) how long it lives.
//!
//! For Basic auth the ID and secret are form-encoded first (RFC 6749 2.3.1 and appendix B),
//! exactly as the form serializer encodes them: letters, digits and `*-._` unchanged, a
//! space as `+`, every other byte as `%XX`. Servers are asked to decode them, and many do
//! not; with that encoding the common IDs (letters, digits, dashes: UUIDs) go out as they
//! are, so such a server accepts them too.
//!
//! | the token endpoint | means |
//! |---|---|
//! | 2xx with an `access_token` | the value |
//! | 400 (`invalid_client`, `unauthorized_client`, `invalid_scope`, ...), 401, 403, other 4xx | rejected: the client is refused, only the user can fix it |
//! | 408, 429, 5xx, no answer, an answer without `access_token` | unavailable for now |
//!
//! A message quotes the endpoint's status and `error`/`error_description` (or the start of
//! its body), never the client secret or a token.

use std::fmt;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde::Deserialize;

use super::error::CredentialError;
use super::fetched::{Fetched, REDACTED};
use crate::secrets::Secrets;

/// How to ask for tokens.
#[derive(Clone)]
pub struct OAuth2Config {
    /// The token endpoint's URL.
    pub token_url: String,
    /// The client ID, expanded.
    pub client_id: String,
    /// The client secret, expanded: never logged.
    pub client_secret: String,
    /// The scope asked for, if any.
    pub scope: Option<String>,
    /// How the client authenticates to the token endpoint.
    pub client_auth: ClientAuth,
}

/// How an OAuth2 client authenticates to the token endpoint (RFC 6749 2.3.1; the names are
/// OpenID Connect's `token_endpoint_auth_method`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// HTTP Basic auth (`client_secret_basic`): what every server must accept.
    #[default]
    Basic,
    /// `client_id` and `client_secret` in the form body (`client_secret_post`).
    Post,
}

impl ClientAuth {
    /// The default: left out of a stored spec, so specs stored before it read the same.
    pub fn is_basic(&self) -> bool {
        *self == ClientAuth::Basic
    }
}

/// `text` form-encoded as the `application/x-www-form-urlencoded` serializer does.
pub(crate) fn form_encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

impl fmt::Debug for OAuth2Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuth2Config")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &REDACTED)
            .field("scope", &self.scope)
            .field("client_auth", &self.client_auth)
            .finish()
    }
}

/// A token endpoint and the client asking it.
pub struct OAuth2Source {
    config: OAuth2Config,
    client: reqwest::Client,
}

impl fmt::Debug for OAuth2Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuth2Source")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    expires_in: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: Option<String>,
    error_description: Option<String>,
}

impl OAuth2Source {
    /// Ask `config.token_url` for tokens, with these timeouts. The error says why the HTTP
    /// client cannot be built.
    pub fn new(
        config: OAuth2Config,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Result<OAuth2Source, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .timeout(timeout)
            .retry(reqwest::retry::never())
            .user_agent(concat!("highwater/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(OAuth2Source { config, client })
    }

    pub(super) fn client_secret(&self) -> &str {
        &self.config.client_secret
    }

    /// The Basic authorization's credentials as the token endpoint gets them (base64 of
    /// `id:secret`, each form-encoded first, RFC 6749 2.3.1), to mask where it is echoed.
    pub(super) fn basic_auth(&self) -> String {
        let c = &self.config;
        base64(
            format!(
                "{}:{}",
                form_encode(&c.client_id),
                form_encode(&c.client_secret)
            )
            .as_bytes(),
        )
    }

    pub(super) async fn fetch(
        &self,
        name: &str,
        secrets: &Secrets,
    ) -> Result<Fetched, CredentialError> {
        let unavailable = |message: String| CredentialError::Unavailable {
            name: name.to_string(),
            message,
        };
        let c = &self.config;
        // The serializer is not `Send`: it must be gone before the first await.
        let mut request = self.client.post(&c.token_url);
        let form = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "client_credentials");
            if let Some(scope) = &c.scope {
                form.append_pair("scope", scope);
            }
            match c.client_auth {
                ClientAuth::Basic => {
                    request = request.basic_auth(
                        form_encode(&c.client_id),
                        Some(form_encode(&c.client_secret)),
                    );
                }
                ClientAuth::Post => {
                    form.append_pair("client_id", &c.client_id);
                    form.append_pair("client_secret", &c.client_secret);
                }
            }
            form.finish()
        };
        let answer = request
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ACCEPT, "application/json")
            .body(form)
            .send()
            .await
            .map_err(|e| unavailable(format!("token endpoint: {}", transport(e))))?;
        let status = answer.status();
        let body = answer
            .bytes()
            .await
            .map_err(|e| unavailable(format!("token endpoint: {}", transport(e))))?;
        if !status.is_success() {
            let message = format!(
                "token endpoint answered HTTP {status}{}",
                describe(&body, secrets)
            );
            return Err(match status.as_u16() {
                408 | 429 | 500..=599 => unavailable(message),
                _ => CredentialError::Rejected {
                    name: name.to_string(),
                    message,
                },
            });
        }
        let token: TokenAnswer = serde_json::from_slice(&body).map_err(|_| {
            unavailable(format!(
                "token endpoint answered HTTP {status} without a JSON token"
            ))
        })?;
        let value = token
            .access_token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                unavailable(format!(
                    "token endpoint answered HTTP {status} without an access_token{}",
                    describe(&body, secrets)
                ))
            })?;
        // A number, or a number in a string (some servers send "3600").
        let expires_in = match token.expires_in {
            Some(serde_json::Value::Number(n)) => n.as_f64(),
            Some(serde_json::Value::String(s)) => s.trim().parse().ok(),
            _ => None,
        }
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| Duration::from_secs_f64(s.min(1e9)));
        Ok(Fetched { value, expires_in })
    }
}

/// What a token endpoint's refusal says: its `error` and `error_description`, or the start
/// of its body (never a token: a refusal holds none).
fn describe(body: &[u8], secrets: &Secrets) -> String {
    if let Ok(e) = serde_json::from_slice::<ErrorAnswer>(body) {
        let parts: Vec<String> = [e.error, e.error_description]
            .into_iter()
            .flatten()
            .collect();
        if !parts.is_empty() {
            return format!(": {}", parts.join(": "));
        }
    }
    // Masked before it is cut, so that no part of a secret is left at the cut.
    let window = body.len().min(200 + secrets.longest());
    let text = secrets.mask_prefix(&String::from_utf8_lossy(&body[..window]), 200);
    let text = text.trim();
    if text.is_empty() || text.contains("access_token") {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// A transport error without its URL (which may hold a secret), with its causes.
fn transport(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut out = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Standard base64, padded (what a Basic authorization carries).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_pads_as_basic_authorization_does() {
        assert_eq!(
            super::base64(b"Aladdin:open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(super::base64(b"ab"), "YWI=");
        assert_eq!(super::base64(b"abc"), "YWJj");
        assert_eq!(super::base64(b""), "");
    }
}
