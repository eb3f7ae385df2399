//! Routing a request to its ID (path, query or POST body) and answering it under the ID's
//! fault, the outage switch, the quota windows and the hidden capacity.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::CONTENT_LENGTH;
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

use super::answers::{
    bad_request, error_response, json_response, payload_too_large, success, too_many_requests, Resp,
};
use super::echo::Echo;
use super::faults::Fault;
use super::request::{decode, MAX_BODY};
use super::seen::SeenRequest;
use super::shared::Shared;

/// The error a handler returns to make hyper close the connection without answering.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by the fake API")]
pub(super) struct DropConnection;

/// What routing a request produced.
pub(super) enum Routed {
    /// A request for this ID, with its body (empty without one).
    Id(String, hyper::body::Bytes),
    /// An answer that does not concern any ID (400, 404 no route, 413).
    Reply(Resp),
    /// Close the connection (the request body could not be read).
    Abort,
}

pub(super) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Resp, DropConnection> {
    if req.uri().path() == "/oauth/token" {
        return Ok(shared.auth.token(req).await);
    }
    let echo = shared.echo.load(Ordering::Relaxed).then(|| Echo::of(&req));
    let resp = item(shared, req).await?;
    Ok(match echo {
        Some(echo) => echo.answer(resp),
        None => resp,
    })
}

/// The answer to a request that is not for the token endpoint.
async fn item(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Resp, DropConnection> {
    if let Some(refused) = shared.auth.check(&req) {
        return Ok(refused);
    }
    if req.uri().path() == "/batch" {
        return Ok(super::batch::handle(&shared, req).await);
    }
    if req.uri().path().starts_with(super::pages::PREFIX) {
        return Ok(super::pages::handle(&shared, req).await);
    }
    if super::llm_route::is_llm(req.uri().path()) {
        return super::llm_route::handle(&shared, req)
            .await
            .ok_or(DropConnection);
    }
    let seen = shared.seen.is_on().then(|| SeenRequest {
        method: req.method().to_string(),
        target: req
            .uri()
            .path_and_query()
            .map_or_else(String::new, |p| p.to_string()),
        body: String::new(),
    });
    let id = match route(req).await {
        Routed::Id(id, body) => {
            if let Some(mut seen) = seen {
                seen.body = String::from_utf8_lossy(&body).into_owned();
                shared.seen.record(&id, seen);
            }
            id
        }
        Routed::Reply(resp) => return Ok(resp),
        Routed::Abort => return Err(DropConnection),
    };
    if shared.down.load(Ordering::Relaxed) {
        // A request on a connection opened before the outage, racing with its closing.
        return Err(DropConnection);
    }
    let mut resp = answer(&shared, &id).await?;
    let now = shared.clock.now_ms();
    shared.windows.announce(resp.headers_mut(), now);
    Ok(resp)
}

/// The answer for a request for `id`: the quota windows, the hidden capacity, then the ID's
/// fault.
async fn answer(shared: &Shared, id: &str) -> Result<Resp, DropConnection> {
    let config = &shared.config;
    let id_hash = xxh3_64(id.as_bytes());
    let now = Instant::now();
    let in_quota = shared.windows.admit(shared.clock.now_ms());
    let admitted = match in_quota {
        Ok(()) => shared.limiter.try_acquire(now),
        Err(_) => Err(None),
    };
    let attempt = shared.calls.record(id, id_hash, admitted.is_ok(), now);
    if let Err(retry_after) = in_quota {
        return Ok(too_many_requests("quota exceeded", Some(retry_after)));
    }
    if let Err(retry_after) = admitted {
        shared.rejected_429.fetch_add(1, Ordering::Relaxed);
        return Ok(too_many_requests("rate limited", retry_after));
    }
    let transient = attempt <= u64::from(config.transient_attempts);
    let fault = config.fault(id);
    if fault == Fault::Slow && transient {
        tokio::time::sleep(config.slow_delay).await;
        return Ok(shared.success(id, id_hash));
    }
    let refusal = match fault {
        Fault::NotFound => true,
        Fault::Unavailable => transient,
        _ => false,
    };
    let latency = if refusal && config.refusals_at_once {
        Duration::ZERO
    } else {
        config.latency(id_hash, attempt)
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    Ok(match fault {
        Fault::NotFound => error_response(StatusCode::NOT_FOUND, "not found"),
        Fault::Unavailable if transient => {
            let mut resp = error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
            if let Some(secs) = config.unavailable_retry_after_secs {
                resp.headers_mut()
                    .insert(hyper::header::RETRY_AFTER, secs.into());
            }
            resp
        }
        Fault::Drop if transient => return Err(DropConnection),
        Fault::Throttled if transient => {
            too_many_requests("throttled", Some(config.retry_after_secs))
        }
        _ => shared.success(id, id_hash),
    })
}

impl Shared {
    /// [`success`], counted by [`FakeApi::accepted`].
    fn success(&self, id: &str, id_hash: u64) -> Resp {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        if self.config.profiles && !id.starts_with(super::answers::TEXT_PREFIX) {
            return json_response(&super::profile_body(id));
        }
        success(id, id_hash)
    }
}

pub(super) async fn route(req: Request<Incoming>) -> Routed {
    let path = req.uri().path();
    if path == "/items" {
        if req.method() == Method::GET {
            return match req.uri().query().and_then(id_from_query) {
                Some(Some(id)) if !id.is_empty() => Routed::Id(id, Default::default()),
                _ => Routed::Reply(bad_request()),
            };
        }
        if req.method() == Method::POST {
            return id_from_post(req).await;
        }
    } else if let Some(rest) = path.strip_prefix("/items/") {
        if req.method() == Method::GET {
            return match decode(rest, false) {
                Some(id) if !id.is_empty() => Routed::Id(id, Default::default()),
                _ => Routed::Reply(bad_request()),
            };
        }
    }
    Routed::Reply(error_response(StatusCode::NOT_FOUND, "no route"))
}

/// `None` if there is no `id` parameter, `Some(None)` if it does not decode to UTF-8.
pub(super) fn id_from_query(query: &str) -> Option<Option<String>> {
    query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(key, _)| *key == "id")
        .map(|(_, value)| decode(value, true))
}

#[derive(Deserialize)]
pub(super) struct IdBody {
    id: String,
}

pub(super) async fn id_from_post(req: Request<Incoming>) -> Routed {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY as u64) {
        return Routed::Reply(payload_too_large());
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Routed::Reply(payload_too_large())
        }
        Err(e) => {
            tracing::debug!("fake API: reading request body failed: {e}");
            return Routed::Abort;
        }
    };
    match serde_json::from_slice::<IdBody>(&bytes) {
        Ok(body) if !body.id.is_empty() => Routed::Id(body.id, bytes),
        _ => Routed::Reply(bad_request()),
    }
}
