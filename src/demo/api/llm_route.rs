//! The language-model routes (`POST /v1/chat/completions`, `POST /v1/messages`): a request
//! read, counted as a call of its ID, metered ([`super::llm`]: the window and the credit),
//! answered after the configured latency, and every answer given the window's headers.

use std::sync::atomic::Ordering;
use tokio::time::Instant;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, StatusCode};
use xxhash_rust::xxh3::xxh3_64;

use super::answers::{error_response, payload_too_large, Resp};
use super::llm::{announce, malformed, out_of_credit, rate_refused, Prompt, Refusal, Shape};
use super::request::MAX_BODY;
use super::seen::SeenRequest;
use super::shared::Shared;

/// Whether `path` is one of the language-model routes.
pub(super) fn is_llm(path: &str) -> bool {
    path.starts_with("/v1/")
}

/// The answer to a request for a language-model route; `None` to drop the connection (its
/// body could not be read, or the server is going down).
pub(super) async fn handle(shared: &Shared, req: Request<Incoming>) -> Option<Resp> {
    let shape = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => Shape::OpenAi,
        (&Method::POST, "/v1/messages") => Shape::Anthropic,
        _ => return Some(error_response(StatusCode::NOT_FOUND, "no route")),
    };
    let Some(meter) = &shared.llm else {
        return Some(error_response(StatusCode::NOT_FOUND, "no route"));
    };
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(String::new, |p| p.to_string());
    let query = req.uri().query().map(String::from);
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return Some(payload_too_large())
        }
        Err(e) => {
            tracing::debug!("fake API: reading request body failed: {e}");
            return None;
        }
    };
    let Some(prompt) = Prompt::read(shape, query.as_deref(), &bytes, meter.config()) else {
        return Some(malformed(shape));
    };
    if shared.seen.is_on() {
        let body = String::from_utf8_lossy(&bytes).into_owned();
        let seen = SeenRequest {
            method: Method::POST.to_string(),
            target,
            body,
        };
        shared.seen.record(&prompt.id, seen);
    }
    if shared.down.load(Ordering::Relaxed) {
        return None;
    }
    let id_hash = xxh3_64(prompt.id.as_bytes());
    let admitted = meter.admit(shared.clock.now_ms(), prompt.prompt_tokens);
    let attempt = shared
        .calls
        .record(&prompt.id, id_hash, admitted.is_ok(), Instant::now());
    let mut resp = match admitted {
        Err(Refusal::Credit) => out_of_credit(meter.config().out_of_credit),
        Err(Refusal::Rate {
            tokens,
            retry_after_secs,
        }) => {
            let mut resp = rate_refused(shape, tokens);
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
            resp
        }
        Ok(()) => {
            let latency = shared.config.latency(id_hash, attempt);
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            meter.settle(shared.clock.now_ms(), prompt.completion_tokens);
            shared.accepted.fetch_add(1, Ordering::Relaxed);
            prompt.answer(shape)
        }
    };
    let now_ms = shared.clock.now_ms();
    announce(
        resp.headers_mut(),
        meter.config().headers,
        meter.standing(now_ms),
        now_ms,
    );
    Some(resp)
}
