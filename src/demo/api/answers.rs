//! What the fake API answers: the item body of a success (deterministic from the ID), and
//! the error and 429 answers.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

pub(super) type Resp = Response<Full<Bytes>>;

/// Prefix of IDs that answer a `text/plain` body instead of JSON.
pub(super) const TEXT_PREFIX: &str = "text:";

/// Tags an item body picks from.
const TAGS: [&str; 8] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
];

/// The JSON body a successful answer for `id` carries; deterministic from the ID alone
/// (not from the seed). For IDs starting with `text:` this is the string `plain <id>`,
/// which is served as a `text/plain` body.
pub fn expected_body(id: &str) -> serde_json::Value {
    if id.starts_with(TEXT_PREFIX) {
        return serde_json::Value::String(plain_body(id));
    }
    serde_json::to_value(Item::new(id, xxh3_64(id.as_bytes()))).unwrap_or(serde_json::Value::Null)
}

#[derive(Serialize)]
pub(super) struct Item<'a> {
    id: &'a str,
    name: String,
    score: u32,
    tags: Vec<&'static str>,
}

impl<'a> Item<'a> {
    fn new(id: &'a str, id_hash: u64) -> Self {
        let count = 1 + (id_hash >> 40) % 3;
        let start = (id_hash >> 48) as usize;
        // A stride coprime with TAGS.len() picks distinct tags.
        let tags = (0..count as usize)
            .map(|i| TAGS[(start + 3 * i) % TAGS.len()])
            .collect();
        Item {
            id,
            name: format!("item-{id_hash:016x}"),
            score: ((id_hash >> 16) as u32) % 100_000,
            tags,
        }
    }
}

pub(super) fn plain_body(id: &str) -> String {
    format!("plain {id}")
}

pub(super) fn success(id: &str, id_hash: u64) -> Resp {
    if id.starts_with(TEXT_PREFIX) {
        return response(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Bytes::from(plain_body(id)),
        );
    }
    match serde_json::to_vec(&Item::new(id, id_hash)) {
        Ok(body) => response(StatusCode::OK, "application/json", Bytes::from(body)),
        Err(_) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

/// 429 `{"error":"<message>"}`, with a `Retry-After: <secs>` header if `retry_after`.
pub(super) fn too_many_requests(message: &'static str, retry_after: Option<u64>) -> Resp {
    let mut resp = error_response(StatusCode::TOO_MANY_REQUESTS, message);
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

pub(super) fn bad_request() -> Resp {
    error_response(StatusCode::BAD_REQUEST, "bad request")
}

pub(super) fn payload_too_large() -> Resp {
    error_response(StatusCode::PAYLOAD_TOO_LARGE, "payload too large")
}

pub(super) fn error_response(status: StatusCode, message: &'static str) -> Resp {
    let body = match message {
        "not found" => Bytes::from_static(br#"{"error":"not found"}"#),
        "unavailable" => Bytes::from_static(br#"{"error":"unavailable"}"#),
        "no route" => Bytes::from_static(br#"{"error":"no route"}"#),
        "bad request" => Bytes::from_static(br#"{"error":"bad request"}"#),
        "rate limited" => Bytes::from_static(br#"{"error":"rate limited"}"#),
        "throttled" => Bytes::from_static(br#"{"error":"throttled"}"#),
        "quota exceeded" => Bytes::from_static(br#"{"error":"quota exceeded"}"#),
        _ => Bytes::from(serde_json::json!({ "error": message }).to_string()),
    };
    response(status, "application/json", body)
}

/// 200 with `value` as its JSON body.
pub(super) fn json_response(value: &serde_json::Value) -> Resp {
    match serde_json::to_vec(value) {
        Ok(body) => response(StatusCode::OK, "application/json", Bytes::from(body)),
        Err(_) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

pub(super) fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> Resp {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
