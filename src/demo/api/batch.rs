//! The fake API's batch endpoint: `GET /batch?ids=a,b,c` (each ID percent-encoded, joined by
//! `,`) or `POST /batch` with a JSON array of IDs (or of objects with an `id`). It answers
//! `{"results": [{"id": ..., "data": <the ID's body>}, ...]}` in an order of its own (never
//! the request's), leaves out the IDs [`ApiConfig::batch_omit_per_mille`] picks unless they
//! are asked alone, and answers the whole request 400 when it holds an ID that
//! [`ApiConfig::batch_poison_per_mille`] picks. Each ID asked counts as a call of that ID;
//! [`super::FakeApi::batch_requests`] counts the requests.

use std::sync::atomic::Ordering;
use tokio::time::Instant;

use http_body_util::{BodyExt, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, StatusCode};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::answers::{
    bad_request, error_response, expected_body, response, too_many_requests, Resp,
};
use super::faults::ApiConfig;
use super::request::{decode, MAX_BODY};
use super::seen::SeenRequest;
use super::shared::Shared;

/// Whether `id` is one of those a batch answer leaves out (asked with other IDs).
pub(super) fn omitted(config: &ApiConfig, id: &str) -> bool {
    pick(config, id, 1) < u64::from(config.batch_omit_per_mille)
}

/// Whether `id` makes its whole batch answer 400.
pub(super) fn poison(config: &ApiConfig, id: &str) -> bool {
    pick(config, id, 2) < u64::from(config.batch_poison_per_mille)
}

fn pick(config: &ApiConfig, id: &str, salt: u64) -> u64 {
    xxh3_64_with_seed(id.as_bytes(), config.seed ^ (salt << 32)) % 1000
}

/// Answer a request to `/batch`.
pub(super) async fn handle(shared: &Shared, req: Request<Incoming>) -> Resp {
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(String::new, |p| p.to_string());
    let method = req.method().clone();
    let (ids, body) = match method {
        Method::GET => {
            let query = req.uri().query().unwrap_or("");
            let raw = query
                .split('&')
                .find_map(|p| p.strip_prefix("ids="))
                .unwrap_or("");
            let ids: Option<Vec<String>> = raw
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| decode(s, true))
                .collect();
            (ids, Bytes::new())
        }
        Method::POST => {
            let Ok(bytes) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
                return bad_request();
            };
            let bytes = bytes.to_bytes();
            let ids = serde_json::from_slice::<Vec<serde_json::Value>>(&bytes)
                .ok()
                .and_then(|values| {
                    values
                        .into_iter()
                        .map(|v| match v {
                            serde_json::Value::String(s) => Some(s),
                            serde_json::Value::Object(o) => {
                                o.get("id").and_then(|i| i.as_str()).map(String::from)
                            }
                            _ => None,
                        })
                        .collect()
                });
            (ids, bytes)
        }
        _ => return error_response(StatusCode::METHOD_NOT_ALLOWED, "GET or POST"),
    };
    let Some(ids) = ids.filter(|ids| !ids.is_empty()) else {
        return bad_request();
    };
    shared.batch_requests.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    if let Err(retry_after) = shared.windows.admit(shared.clock.now_ms()) {
        return too_many_requests("quota exceeded", Some(retry_after));
    }
    for id in &ids {
        shared.calls.record(id, xxh3_64(id.as_bytes()), true, now);
        if shared.seen.is_on() {
            shared.seen.record(
                id,
                SeenRequest {
                    method: method.to_string(),
                    target: target.clone(),
                    body: String::from_utf8_lossy(&body).into_owned(),
                },
            );
        }
    }
    let config = &shared.config;
    let latency = config.latency(xxh3_64(ids[0].as_bytes()), 1);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if ids.iter().any(|id| poison(config, id)) {
        return error_response(StatusCode::BAD_REQUEST, "a bad ID in the batch");
    }
    let alone = ids.len() == 1;
    let mut results: Vec<serde_json::Value> = ids
        .iter()
        .filter(|id| alone || !omitted(config, id))
        .map(|id| serde_json::json!({"id": id, "data": expected_body(id)}))
        .collect();
    // An order of the API's own: by a hash of the ID, never the request's.
    results.sort_by_key(|r| xxh3_64(r["id"].as_str().unwrap_or("").as_bytes()));
    shared
        .accepted
        .fetch_add(results.len() as u64, Ordering::Relaxed);
    let body = serde_json::json!({ "results": results }).to_string();
    response(StatusCode::OK, "application/json", Bytes::from(body))
}
