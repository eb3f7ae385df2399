//! The echo mode ([`super::FakeApi::echo_requests`]): an answer outside 2xx quotes the request
//! it answers (method, target with its query as sent, every header), as some real APIs quote
//! the request in their errors, so a test checks that what a client expanded into its request
//! (an API key, a token) is masked wherever it keeps or shows that error.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::CONTENT_TYPE;
use hyper::http::HeaderValue;
use hyper::Request;

use super::answers::Resp;

/// A request as its echo quotes it.
pub(super) struct Echo {
    method: String,
    target: String,
    headers: serde_json::Map<String, serde_json::Value>,
}

impl Echo {
    pub(super) fn of<B>(req: &Request<B>) -> Echo {
        let headers = req
            .headers()
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.to_string(), serde_json::Value::String(value))
            })
            .collect();
        Echo {
            method: req.method().to_string(),
            target: req
                .uri()
                .path_and_query()
                .map_or_else(String::new, |p| p.to_string()),
            headers,
        }
    }

    /// `resp` as is if it is a success, else with a body quoting the request:
    /// `{"error": "<reason>: <METHOD> <target>", "headers": {...}}`.
    pub(super) fn answer(&self, resp: Resp) -> Resp {
        let status = resp.status();
        if status.is_success() {
            return resp;
        }
        let body = serde_json::json!({
            "error": format!(
                "{}: {} {}",
                status.canonical_reason().unwrap_or("error").to_lowercase(),
                self.method,
                self.target
            ),
            "headers": self.headers,
        });
        let (mut parts, _) = resp.into_parts();
        parts
            .headers
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        parts.headers.remove(hyper::header::CONTENT_LENGTH);
        hyper::Response::from_parts(parts, Full::new(Bytes::from(body.to_string())))
    }
}
