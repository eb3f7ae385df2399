//! The fake API's credentials: an OAuth2 token endpoint (`POST /oauth/token`, client
//! credentials grant) issuing tokens that expire, and, once switched on, the check that
//! every item request carries `Authorization: Bearer <a token that has not expired>`.
//!
//! Tokens come from two places: the token endpoint (the client authenticated with HTTP Basic
//! auth or `client_id`/`client_secret` in the form body), and "command tokens", any token
//! that starts with [`FakeApi::command_token_prefix`], which a shell command can make with no
//! network tool (a counter in a file): such a token starts to live when the API first sees
//! it. Either lives [`FakeApi::require_token`]'s lifetime, or until
//! [`FakeApi::expire_tokens`] ends every token at once; an item request without a live token
//! answers 401 with `WWW-Authenticate: Bearer error="invalid_token"`.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use tokio::time::Instant;

use crate::clock::Clock;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use hyper::{Method, Request, StatusCode};

use super::answers::{error_response, response, Resp};
use super::lock::lock;
use super::request::decode;

/// The client ID the token endpoint knows.
pub const CLIENT_ID: &str = "highwater-test-client";
/// The client secret the token endpoint accepts (unless revoked).
pub const CLIENT_SECRET: &str = "client-secret-9f2c41";

/// How the token endpoint reads a client's credentials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TokenClientAuth {
    /// HTTP Basic auth with the ID and secret form-decoded (RFC 6749 2.3.1), or the form
    /// body's `client_id` and `client_secret`.
    #[default]
    Lenient,
    /// HTTP Basic auth only, compared as sent: a server that does not decode.
    BasicVerbatim,
    /// The form body only (`client_secret_post`); Basic auth is refused.
    PostOnly,
}

/// The token endpoint's and the token check's state.
pub(super) struct Auth {
    /// How client credentials are read.
    client_auth: Mutex<TokenClientAuth>,
    /// Item requests need a live token.
    required: AtomicBool,
    /// How long a token lives.
    lifetime: Mutex<Duration>,
    /// The client secret is refused.
    revoked: AtomicBool,
    /// Live and expired tokens, with when each expires.
    tokens: Mutex<HashMap<String, Instant>>,
    /// Prefix of command tokens (random per server).
    command_prefix: String,
    issued: AtomicU64,
    /// When each token was issued (tokio's time).
    issued_at: Mutex<Vec<Instant>>,
    refused: AtomicU64,
    /// A file each issued token is appended to, as `TOKEN EXPIRY_MS` (Unix ms), for a child
    /// process that checks tokens on its own.
    ledger: Mutex<Option<PathBuf>>,
    /// The server's wall clock: the ledger's expiry times.
    clock: Clock,
}

impl Auth {
    pub(super) fn new(clock: Clock) -> Auth {
        Auth {
            clock,
            client_auth: Mutex::new(TokenClientAuth::Lenient),
            required: AtomicBool::new(false),
            lifetime: Mutex::new(Duration::from_secs(3600)),
            revoked: AtomicBool::new(false),
            tokens: Mutex::new(HashMap::new()),
            command_prefix: format!("cmdtok-{:08x}-", rand::random::<u32>()),
            issued: AtomicU64::new(0),
            issued_at: Mutex::default(),
            refused: AtomicU64::new(0),
            ledger: Mutex::new(None),
        }
    }

    pub(super) fn require(&self, lifetime: Duration) {
        *lock(&self.lifetime) = lifetime;
        self.required.store(true, Ordering::SeqCst);
    }

    pub(super) fn set_client_auth(&self, how: TokenClientAuth) {
        *lock(&self.client_auth) = how;
    }

    /// Every token seen or issued so far expires now.
    pub(super) fn expire_all(&self) {
        let now = Instant::now();
        for expiry in lock(&self.tokens).values_mut() {
            *expiry = (*expiry).min(now);
        }
    }

    pub(super) fn revoke(&self, revoked: bool) {
        self.revoked.store(revoked, Ordering::SeqCst);
    }

    pub(super) fn set_ledger(&self, path: PathBuf) {
        *lock(&self.ledger) = Some(path);
    }

    pub(super) fn command_prefix(&self) -> &str {
        &self.command_prefix
    }

    pub(super) fn issued(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    pub(super) fn issue_times(&self) -> Vec<Instant> {
        lock(&self.issued_at).clone()
    }

    pub(super) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(super) fn tokens(&self) -> Vec<String> {
        lock(&self.tokens).keys().cloned().collect()
    }

    /// `None` when `req` may go on to its item; else the 401 to answer.
    pub(super) fn check<B>(&self, req: &Request<B>) -> Option<Resp> {
        if !self.required.load(Ordering::SeqCst) {
            return None;
        }
        let token = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let now = Instant::now();
        let live = token.is_some_and(|t| {
            let mut tokens = lock(&self.tokens);
            if t.starts_with(&self.command_prefix) && !tokens.contains_key(t) {
                tokens.insert(t.to_string(), now + *lock(&self.lifetime));
            }
            tokens.get(t).is_some_and(|expiry| now < *expiry)
        });
        if live {
            return None;
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        let mut resp = error_response(StatusCode::UNAUTHORIZED, "invalid token");
        resp.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Bearer error="invalid_token""#),
        );
        Some(resp)
    }

    /// `POST /oauth/token`.
    pub(super) async fn token(&self, req: Request<Incoming>) -> Resp {
        if req.method() != Method::POST {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        }
        let how = *lock(&self.client_auth);
        let basic = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| base64_decode(b.trim()))
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|pair| {
                let (id, secret) = pair.split_once(':')?;
                match how {
                    TokenClientAuth::Lenient => Some((decode(id, true)?, decode(secret, true)?)),
                    TokenClientAuth::BasicVerbatim => Some((id.to_string(), secret.to_string())),
                    TokenClientAuth::PostOnly => None,
                }
            });
        let body = match Limited::new(req.into_body(), 16 * 1024).collect().await {
            Ok(c) => c.to_bytes(),
            Err(_) => return error_response(StatusCode::BAD_REQUEST, "invalid_request"),
        };
        let form: HashMap<String, String> = String::from_utf8_lossy(&body)
            .split('&')
            .filter_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                Some((decode(k, true)?, decode(v, true)?))
            })
            .collect();
        if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
            return oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type");
        }
        let client = basic.or_else(|| {
            if how == TokenClientAuth::BasicVerbatim {
                return None;
            }
            Some((
                form.get("client_id")?.clone(),
                form.get("client_secret")?.clone(),
            ))
        });
        let valid = client.is_some_and(|(id, secret)| {
            id == CLIENT_ID && secret == CLIENT_SECRET && !self.revoked.load(Ordering::SeqCst)
        });
        if !valid {
            let mut resp = oauth_error(StatusCode::UNAUTHORIZED, "invalid_client");
            resp.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
            return resp;
        }
        let n = self.issued.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.issued_at).push(Instant::now());
        let token = format!("tok-{:016x}-{n}", rand::random::<u64>());
        let lifetime = *lock(&self.lifetime);
        lock(&self.tokens).insert(token.clone(), Instant::now() + lifetime);
        if let Some(path) = lock(&self.ledger).as_ref() {
            let expiry = self.clock.now() + lifetime;
            let ms = expiry
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            let line = format!("{token} {ms}\n");
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(e) = written {
                tracing::warn!("fake API: cannot append to the token ledger: {e}");
            }
        }
        let body = serde_json::json!({
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": lifetime.as_secs().max(1),
        });
        response(
            StatusCode::OK,
            "application/json",
            hyper::body::Bytes::from(body.to_string()),
        )
    }
}

fn oauth_error(status: StatusCode, error: &'static str) -> Resp {
    let body = serde_json::json!({ "error": error }).to_string();
    response(status, "application/json", hyper::body::Bytes::from(body))
}

/// Standard base64 (with or without padding); `None` if it is not.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut bits = 0u32;
    let mut count = 0;
    for c in text.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes() {
        assert_eq!(
            super::base64_decode("aGlnaHdhdGVyOnMzY3JldA==").unwrap(),
            b"highwater:s3cret"
        );
        assert_eq!(super::base64_decode("YQ").unwrap(), b"a");
        assert!(super::base64_decode("a b").is_none());
    }
}
