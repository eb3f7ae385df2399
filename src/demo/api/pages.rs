//! The fake API's paginated routes: one ID's items, page by page, in the three ways APIs
//! paginate a list.
//!
//! An ID has [`item_count`] items, `{"id": "<id>", "k": k}` for `k` from 0 (with a `pad`
//! string of [`ApiConfig::page_item_pad`] bytes when it is not 0): the number an ID starting
//! `p<count>-` names (`p2000-a` has 2,000), else [`ApiConfig::page_items`]. A page
//! holds [`DEFAULT_PAGE_SIZE`] items unless the request says otherwise (at most
//! [`MAX_PAGE_SIZE`]).
//!
//! - `GET /pages/link/{id}?page=N&per_page=M` (`page` from 1): a JSON array, with a `Link`
//!   header whose links are relative: `rel="next"` to the next page (none on the last page)
//!   and `rel="last"`, each with the request's other query parameters.
//! - `GET /pages/cursor/{id}?cursor=C&limit=M`: `{"data": [...], "has_more": b,
//!   "next_cursor": C'}`, `next_cursor` `""` on the last page; no cursor is the first page.
//!   `POST` takes the cursor and the size in a JSON body instead: `{"cursor": C, "limit": M}`.
//! - `GET /pages/offset/{id}?offset=N&limit=M`: a JSON array; the last page is short, or
//!   empty when the items fill whole pages.
//!
//! Faults, by the ID's name after its count (`p1000-loop-a`): a name starting `loop-` loops:
//! page 5's next page is page 2 again (its `Link`, its cursor); a name starting `back-` loops
//! back to the start: page 3's next page is page 1 (`page=1`, cursor `k0`), the page the
//! first request, which named none, got; a name starting `same-` has the offset route ignore
//! its offset (every page is the first). By the configuration:
//! [`ApiConfig::page_unavailable_once`] answers one page of every ID 503 once, and
//! [`ApiConfig::page_pending_once`] answers one 200 with `{"status": "pending"}` once.
//!
//! Each request is a call of its ID (counted and kept like one of `/items`), under the quota
//! windows, answered after the configured latency ([`ApiConfig::latency_min`] to
//! [`ApiConfig::latency_max`]). A malformed request answers 400 and is no call.

use tokio::time::Instant;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, LINK};
use hyper::{Method, Request, StatusCode};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use xxhash_rust::xxh3::xxh3_64;

use super::answers::{bad_request, error_response, json_response, too_many_requests, Resp};
use super::faults::ApiConfig;
use super::request::decode;
use super::seen::SeenRequest;
use super::shared::Shared;

/// The paths of the paginated routes start with this.
pub(super) const PREFIX: &str = "/pages/";

/// Items a page when the request does not say.
pub(super) const DEFAULT_PAGE_SIZE: u64 = 50;

/// The most items a page holds, whatever the request asks.
pub(super) const MAX_PAGE_SIZE: u64 = 1000;

/// How many items `id` has: the count of a `p<count>-` prefix, else the configured default.
pub(super) fn item_count(config: &ApiConfig, id: &str) -> u64 {
    id.strip_prefix('p')
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(config.page_items)
}

/// `id`'s name after its `p<count>-` prefix (all of it without one).
fn name(id: &str) -> &str {
    id.strip_prefix('p')
        .and_then(|rest| rest.split_once('-'))
        .filter(|(n, _)| n.parse::<u64>().is_ok())
        .map_or(id, |(_, name)| name)
}

/// Item `k` of `id`, with a `pad` of [`ApiConfig::page_item_pad`] bytes when it is not 0.
pub(super) fn item(config: &ApiConfig, id: &str, k: u64) -> serde_json::Value {
    if config.page_item_pad == 0 {
        return serde_json::json!({"id": id, "k": k});
    }
    let pad = char::from(b'a' + (k % 26) as u8)
        .to_string()
        .repeat(config.page_item_pad);
    serde_json::json!({"id": id, "k": k, "pad": pad})
}

/// How a route names a page.
enum Style {
    Link,
    Cursor,
    Offset,
}

/// Answer a request under [`PREFIX`].
pub(super) async fn handle(shared: &Shared, req: Request<Incoming>) -> Resp {
    let path = req.uri().path();
    let rest = path.strip_prefix(PREFIX).unwrap_or("");
    let (style, raw_id) = match rest.split_once('/') {
        Some(("link", id)) => (Style::Link, id),
        Some(("cursor", id)) => (Style::Cursor, id),
        Some(("offset", id)) => (Style::Offset, id),
        _ => return error_response(StatusCode::NOT_FOUND, "no route"),
    };
    let post = req.method() == Method::POST && matches!(style, Style::Cursor);
    if req.method() != Method::GET && !post {
        return error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET only (POST for a cursor)",
        );
    }
    let Some(id) = decode(raw_id, false).filter(|id| !id.is_empty()) else {
        return bad_request();
    };
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(String::new, |p| p.to_string());
    let method = req.method().to_string();
    let query = Query::of(req.uri().query().unwrap_or(""));
    let Some(mut query) = query else {
        return bad_request();
    };
    let mut body = String::new();
    if post {
        // The cursor and the page's size in the JSON body: `{"cursor": C, "limit": M}`.
        let Ok(collected) = Limited::new(req.into_body(), 1 << 20).collect().await else {
            return bad_request();
        };
        let bytes = collected.to_bytes();
        body = String::from_utf8_lossy(&bytes).into_owned();
        let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(&bytes) else {
            return bad_request();
        };
        for (name, value) in fields {
            let text = match value {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(n) => n.to_string(),
                _ => continue,
            };
            query.0.retain(|(k, _)| *k != name);
            query.0.push((name, text));
        }
    }
    let size = match query.number(if matches!(style, Style::Link) {
        "per_page"
    } else {
        "limit"
    }) {
        Ok(None) => DEFAULT_PAGE_SIZE,
        Ok(Some(n)) if (1..=MAX_PAGE_SIZE).contains(&n) => n,
        _ => return bad_request(),
    };
    let start = match style {
        Style::Link => match query.number("page") {
            Ok(None) => 0,
            Ok(Some(page)) if page >= 1 => (page - 1).saturating_mul(size),
            _ => return bad_request(),
        },
        Style::Cursor => match query.get("cursor") {
            None | Some("") => 0,
            Some(cursor) => match cursor.strip_prefix('k').and_then(|k| k.parse().ok()) {
                Some(k) => k,
                None => return bad_request(),
            },
        },
        Style::Offset => match query.number("offset") {
            Ok(_) if name(&id).starts_with("same-") => 0,
            Ok(n) => n.unwrap_or(0),
            Err(()) => return bad_request(),
        },
    };
    // The page's number, from 1, and the page a looping ID's next page is instead.
    let page = start / size + 1;
    let looped = match name(&id) {
        n if n.starts_with("loop-") && page == 5 => Some(2),
        n if n.starts_with("back-") && page == 3 => Some(1),
        _ => None,
    };
    // A call of the ID, like a request to `/items`.
    let id_hash = xxh3_64(id.as_bytes());
    let attempt = shared.calls.record(&id, id_hash, true, Instant::now());
    if shared.seen.is_on() {
        shared.seen.record(
            &id,
            SeenRequest {
                method,
                target,
                body,
            },
        );
    }
    let now = shared.clock.now_ms();
    if let Err(retry_after) = shared.windows.admit(now) {
        return too_many_requests("quota exceeded", Some(retry_after));
    }
    let latency = shared.config.latency(id_hash, attempt);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if shared.config.page_unavailable_once == Some(page) && first_time(&shared.pages_refused, &id) {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "page unavailable");
    }
    if shared.config.page_pending_once == Some(page) && first_time(&shared.pages_pending, &id) {
        return json_response(&serde_json::json!({"status": "pending"}));
    }
    let count = item_count(&shared.config, &id);
    let end = start.saturating_add(size).min(count);
    let items: Vec<serde_json::Value> = (start.min(end)..end)
        .map(|k| item(&shared.config, &id, k))
        .collect();
    let more = end < count;
    shared
        .accepted
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut resp = match style {
        Style::Link => {
            let mut resp = json_response(&serde_json::Value::Array(items));
            let last = count.div_ceil(size).max(1);
            let encoded = utf8_percent_encode(&id, NON_ALPHANUMERIC).to_string();
            // The request's other parameters are kept in the links, as many APIs keep them
            // (an API key among them).
            let others: String = query
                .0
                .iter()
                .filter(|(k, _)| k != "page" && k != "per_page")
                .map(|(k, v)| {
                    format!(
                        "&{}={}",
                        utf8_percent_encode(k, NON_ALPHANUMERIC),
                        utf8_percent_encode(v, NON_ALPHANUMERIC)
                    )
                })
                .collect();
            let at = |n: u64| format!("</pages/link/{encoded}?page={n}&per_page={size}{others}>");
            let mut links = Vec::new();
            if more {
                links.push(format!("{}; rel=\"next\"", at(looped.unwrap_or(page + 1))));
            }
            links.push(format!("{}; rel=\"last\"", at(last)));
            if let Ok(value) = HeaderValue::from_str(&links.join(", ")) {
                resp.headers_mut().insert(LINK, value);
            }
            resp
        }
        Style::Cursor => json_response(&serde_json::json!({
            "data": items,
            "has_more": more,
            "next_cursor": match (more, looped) {
                (false, _) => String::new(),
                (true, Some(to)) => format!("k{}", (to - 1) * size),
                (true, None) => format!("k{end}"),
            },
        })),
        Style::Offset => json_response(&serde_json::Value::Array(items)),
    };
    shared.windows.announce(resp.headers_mut(), now);
    resp
}

/// Whether `id` is not yet in `seen` (it is from now on).
fn first_time(seen: &std::sync::Mutex<std::collections::HashSet<String>>, id: &str) -> bool {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(id.to_string())
}

/// A request's query parameters, decoded.
struct Query(Vec<(String, String)>);

impl Query {
    /// The parameters of `raw`; none when one does not decode to UTF-8.
    fn of(raw: &str) -> Option<Query> {
        raw.split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                Some((decode(k, true)?, decode(v, true)?))
            })
            .collect::<Option<Vec<_>>>()
            .map(Query)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The parameter as a number: none when absent, an error when it is not one.
    fn number(&self, name: &str) -> Result<Option<u64>, ()> {
        self.get(name)
            .map(|v| v.parse().map_err(|_| ()))
            .transpose()
    }
}
