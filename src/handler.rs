//! Handler: turning an ID into one HTTP attempt and its answer into a result.
//!
//! Owns the templates (`{id}` placed and encoded for where it stands, `${VAR}` expanded from
//! the environment once, when the handler is built), the one shared reqwest client (rustls,
//! keep-alive pool, explicit timeouts), and the reading of an answer into a
//! [`Success`](crate::retry::Success) or an [`AttemptError`]: the HTTP status first, then,
//! for a 2xx answer, the job's answer checks ([`crate::answer`]). Whether to try again is
//! not decided here but in [`crate::retry`].
//!
//! Secrets: expanded values live only inside [`Handler`]; its `Debug` output and every error
//! message it makes leave them out (reqwest errors are stripped of their URL).

use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::Method;

use crate::answer::Answer;
use crate::job::RequestSpec;
use crate::retry::{parse_retry_after, AttemptError, ErrorClass, Success};

/// Largest answer body we keep; a larger one fails the attempt.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Everything but RFC 3986 unreserved characters is encoded: safe in a path segment (where
/// `/` must be encoded) and in a query value (where `&`, `=`, `+`, `#` must be).
const ID_IN_URL: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Errors found while building the handler, before any request.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("{what}: environment variable {name} is not set")]
    MissingVar { what: String, name: String },
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// How `{id}` is written where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdEncoding {
    /// Percent-encoded (URL path segment or query value).
    Url,
    /// JSON string content, without the quotes.
    Json,
    /// As is (header values).
    Raw,
}

#[derive(Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Id,
}

/// A template with `${VAR}` already expanded: text and `{id}` slots.
#[derive(Clone)]
struct Template {
    pieces: Vec<Piece>,
    encoding: IdEncoding,
}

impl Template {
    /// Parse `source`, expanding `${VAR}` with `env`. `what` names the flag for messages.
    fn parse(
        source: &str,
        what: &str,
        encoding: IdEncoding,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Template, HandlerError> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = source;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("{id}") {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
                pieces.push(Piece::Id);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("${") {
                let (value, after) = expand_var(after, what, env)?;
                text.push_str(&value);
                rest = after;
            } else {
                let c = rest.chars().next().expect("rest is not empty");
                text.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        pieces.push(Piece::Text(text));
        pieces.retain(|p| p != &Piece::Text(String::new()));
        Ok(Template { pieces, encoding })
    }

    fn has_id(&self) -> bool {
        self.pieces.contains(&Piece::Id)
    }

    /// Whether some `{id}` of this URL template is a whole path segment (`/items/{id}/x`),
    /// where the IDs `.` and `..` would be resolved away by URL normalisation.
    fn id_is_path_segment(&self) -> bool {
        let mut in_path = true;
        for (i, piece) in self.pieces.iter().enumerate() {
            match piece {
                Piece::Text(t) => {
                    if t.contains(['?', '#']) {
                        in_path = false;
                    }
                }
                Piece::Id if in_path => {
                    let before = i.checked_sub(1).map(|j| &self.pieces[j]);
                    let after = self.pieces.get(i + 1);
                    let starts = matches!(before, Some(Piece::Text(t)) if t.ends_with('/'));
                    let ends = match after {
                        None => true,
                        Some(Piece::Text(t)) => t.starts_with(['/', '?', '#']),
                        Some(Piece::Id) => false,
                    };
                    if starts && ends {
                        return true;
                    }
                }
                Piece::Id => {}
            }
        }
        false
    }

    fn render(&self, id: &str) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Id => match self.encoding {
                    IdEncoding::Url => out.extend(utf8_percent_encode(id, ID_IN_URL)),
                    IdEncoding::Raw => out.push_str(id),
                    IdEncoding::Json => {
                        let quoted = serde_json::to_string(id).expect("a string always serializes");
                        out.push_str(&quoted[1..quoted.len() - 1]);
                    }
                },
            }
        }
        out
    }
}

/// Expand one `${NAME}`: `after` is the text after `${`. Returns the value and the text
/// after the closing `}`. `what` names the setting for messages (never the value).
fn expand_var<'a>(
    after: &'a str,
    what: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, &'a str), HandlerError> {
    let end = after.find('}').ok_or_else(|| HandlerError::Invalid {
        what: what.into(),
        reason: "unclosed ${ (write ${NAME})".into(),
    })?;
    let name = &after[..end];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(HandlerError::Invalid {
            what: what.into(),
            reason: format!("invalid variable name ${{{name}}}"),
        });
    }
    let value = env(name).ok_or_else(|| HandlerError::MissingVar {
        what: what.into(),
        name: name.into(),
    })?;
    Ok((value, &after[end + 1..]))
}

/// Expand every `${NAME}` of `source` with `env`, as the templates do (for settings that
/// are not templates, such as a database URL). Errors name `what` and the variable only.
pub fn expand_env(
    source: &str,
    what: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, HandlerError> {
    let mut out = String::new();
    let mut rest = source;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let (value, after) = expand_var(&rest[at + 2..], what, env)?;
        out.push_str(&value);
        rest = after;
    }
    out.push_str(rest);
    Ok(out)
}

/// Makes one attempt for an ID. Cheap to share behind an `Arc`.
pub struct Handler {
    client: reqwest::Client,
    request: Compiled,
    /// The job's checks of a 2xx answer and what of it is kept.
    answer: Answer,
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handler")
            .field("method", &self.request.method)
            .finish_non_exhaustive()
    }
}

impl Handler {
    /// Build from the stored spec, expanding `${VAR}` from the process environment.
    pub fn new(spec: &RequestSpec) -> Result<Handler, HandlerError> {
        Self::with_env(spec, &|name| std::env::var(name).ok())
    }

    /// Build with an explicit environment (tests, embedding).
    pub fn with_env(
        spec: &RequestSpec,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Handler, HandlerError> {
        let request = Compiled::new(spec, env)?;
        let client = reqwest::Client::builder()
            .connect_timeout(spec.connect_timeout)
            .timeout(spec.timeout)
            // Every idle connection was opened by a call in flight, so the pool never
            // holds more than --concurrency: a cap below that (it was 1024) closes
            // connections that the next calls open again, at 4,000 in flight.
            .pool_max_idle_per_host(usize::MAX)
            .tcp_nodelay(true)
            // Retries are ours (crate::retry): one attempt per call, counted.
            .retry(reqwest::retry::never())
            .user_agent(concat!("highwater/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HandlerError::Client(e.to_string()))?;
        Ok(Handler {
            client,
            request,
            answer: Answer::default(),
        })
    }

    /// Judge every 2xx answer with `answer` (the job's answer checks) before it counts as
    /// a success.
    pub fn with_answer(mut self, answer: Answer) -> Handler {
        self.answer = answer;
        self
    }

    /// One attempt for `id`.
    pub async fn attempt(&self, id: &str) -> Result<Success, AttemptError> {
        let r = &self.request;
        if r.id_is_path_segment && (id == "." || id == "..") {
            return Err(AttemptError {
                class: ErrorClass::Request,
                http_status: None,
                message: format!(
                    "the ID {id:?} cannot stand as a URL path segment (it would name another path)"
                ),
                retry_after: None,
                verdict: None,
            });
        }
        let started = Instant::now();
        let url = r.url.url(id).map_err(|e| AttemptError {
            class: ErrorClass::Request,
            http_status: None,
            message: format!("the ID makes an invalid URL ({e})"),
            retry_after: None,
            verdict: None,
        })?;
        let mut request = self.client.request(r.method.clone(), url);
        for (name, value) in &r.headers {
            let value = HeaderValue::from_str(&value.render(id)).map_err(|_| AttemptError {
                class: ErrorClass::Request,
                http_status: None,
                message: format!("the ID makes an invalid value for header {name}"),
                retry_after: None,
                verdict: None,
            })?;
            request = request.header(name.clone(), value);
        }
        if let Some(body) = &r.body {
            if r.json_body {
                request = request.header(CONTENT_TYPE, "application/json");
            }
            request = request.body(body.render(id));
        }
        let mut response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
            if bytes.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(AttemptError {
                    class: ErrorClass::Body,
                    http_status: Some(status.as_u16()),
                    message: format!("answer body is larger than {MAX_BODY_BYTES} bytes"),
                    retry_after: None,
                    verdict: None,
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let snippet = String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                .trim()
                .to_string();
            return Err(AttemptError {
                class: ErrorClass::Http,
                http_status: Some(status.as_u16()),
                message: if snippet.is_empty() {
                    format!("HTTP {status}")
                } else {
                    format!("HTTP {status}: {snippet}")
                },
                retry_after,
                verdict: None,
            });
        }
        let headers = response.headers();
        let body = self.answer.judge(
            status.as_u16(),
            || headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
            bytes,
        )?;
        Ok(Success {
            http_status: status.as_u16(),
            body,
            latency: started.elapsed(),
        })
    }
}

/// The URL template, with its constant part before the path parsed once.
///
/// Parsing a whole URL (scheme, host, port) is the costliest step of building a request, and
/// the part before the path never depends on the ID when `{id}` stands only after it: then a
/// request's URL is the parsed base with its path, query and fragment set. The unit tests
/// check it gives the same URL as parsing the whole rendered text.
struct UrlTemplate {
    template: Template,
    /// The parsed `scheme://authority` and its length in every rendered URL.
    base: Option<(reqwest::Url, usize)>,
}

impl UrlTemplate {
    fn new(template: Template) -> UrlTemplate {
        let base = match template.pieces.first() {
            Some(Piece::Text(head)) => head.find("://").and_then(|scheme_end| {
                let after = scheme_end + 3;
                let end = head[after..]
                    .find(['/', '\\', '?', '#'])
                    .map(|i| after + i)?;
                let url = reqwest::Url::parse(&head[..end]).ok()?;
                // Only a base that keeps the parser's behaviour: http(s), nothing after the
                // authority that the parser would have moved.
                (matches!(url.scheme(), "http" | "https") && url.path() == "/")
                    .then_some((url, end))
            }),
            _ => None,
        };
        UrlTemplate { template, base }
    }

    /// The URL for `id`; an error says why the rendered text is not a URL.
    fn url(&self, id: &str) -> Result<reqwest::Url, String> {
        let full = self.template.render(id);
        let Some((base, len)) = &self.base else {
            return reqwest::Url::parse(&full).map_err(|e| e.to_string());
        };
        let rest = &full[*len..];
        let (rest, fragment) = match rest.split_once('#') {
            Some((r, f)) => (r, Some(f)),
            None => (rest, None),
        };
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let mut url = base.clone();
        url.set_path(path);
        url.set_query(query);
        url.set_fragment(fragment);
        Ok(url)
    }
}

/// The request templates, parsed and checked, without a client.
struct Compiled {
    method: Method,
    url: UrlTemplate,
    headers: Vec<(HeaderName, Template)>,
    body: Option<Template>,
    json_body: bool,
    /// `{id}` stands as a whole path segment, where `.` and `..` would change the path.
    id_is_path_segment: bool,
}

impl Compiled {
    fn new(
        spec: &RequestSpec,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Compiled, HandlerError> {
        let method =
            Method::from_bytes(spec.method.as_bytes()).map_err(|_| HandlerError::Invalid {
                what: "--method".into(),
                reason: format!("{:?} is not an HTTP method", spec.method),
            })?;
        let url = Template::parse(&spec.url, "--url", IdEncoding::Url, env)?;
        let probe = url.render("id");
        let parsed = reqwest::Url::parse(&probe).map_err(|e| HandlerError::Invalid {
            what: "--url".into(),
            reason: format!("not a valid URL once filled in ({e})"),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(HandlerError::Invalid {
                what: "--url".into(),
                reason: format!("scheme {:?} is not http or https", parsed.scheme()),
            });
        }
        let mut headers = Vec::new();
        let mut json_body = true;
        for h in &spec.headers {
            let what = "--header";
            let (name, value) = h.split_once(':').ok_or_else(|| HandlerError::Invalid {
                what: what.into(),
                reason: format!("{:?} is not of the form 'Name: value'", redact_value(h)),
            })?;
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                HandlerError::Invalid {
                    what: what.into(),
                    reason: format!("{:?} is not a valid header name", name.trim()),
                }
            })?;
            let value = Template::parse(
                value.trim(),
                &format!("--header {name}"),
                IdEncoding::Raw,
                env,
            )?;
            if HeaderValue::from_str(&value.render("id")).is_err() {
                return Err(HandlerError::Invalid {
                    what: format!("--header {name}"),
                    reason: "the value is not a valid header value once filled in".into(),
                });
            }
            if name == CONTENT_TYPE {
                json_body = false;
            }
            headers.push((name, value));
        }
        let body = spec
            .body
            .as_deref()
            .map(|b| Template::parse(b, "--body", IdEncoding::Json, env))
            .transpose()?;
        let url = UrlTemplate::new(url);
        let anywhere = url.template.has_id()
            || body.as_ref().is_some_and(Template::has_id)
            || headers.iter().any(|(_, v)| v.has_id());
        if !anywhere {
            return Err(HandlerError::Invalid {
                what: "--url".into(),
                reason: "{id} appears nowhere (not in --url, --body or a --header): every request would be the same".into(),
            });
        }
        let id_is_path_segment = url.template.id_is_path_segment();
        Ok(Compiled {
            method,
            url,
            headers,
            body,
            json_body,
            id_is_path_segment,
        })
    }
}

/// Check the request templates' syntax (method, URL, headers, body) without the environment:
/// what must hold before a job is stored.
pub fn check_templates(spec: &RequestSpec) -> Result<(), HandlerError> {
    Compiled::new(spec, &|_| Some("x".into())).map(|_| ())
}

fn transport_error(e: reqwest::Error) -> AttemptError {
    let class = if e.is_timeout() {
        ErrorClass::Timeout
    } else if e.is_connect() {
        ErrorClass::Connect
    } else if e.is_body() || e.is_decode() {
        ErrorClass::Body
    } else if e.is_builder() {
        ErrorClass::Request
    } else {
        ErrorClass::Connection
    };
    AttemptError {
        class,
        http_status: None,
        message: error_chain(&e.without_url()),
        retry_after: None,
        verdict: None,
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

fn redact_value(header: &str) -> String {
    match header.split_once(':') {
        Some((name, _)) => format!("{name}: <redacted>"),
        None => "<redacted>".into(),
    }
}

/// How long an attempt took, in whole milliseconds, for records.
pub fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "HOST" => Some("127.0.0.1:9".into()),
            _ => None,
        }
    }

    fn spec(url: &str) -> RequestSpec {
        RequestSpec {
            method: "GET".into(),
            url: url.into(),
            headers: vec![],
            body: None,
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn url_id_is_percent_encoded_in_path_and_query() {
        let t = Template::parse(
            "http://${HOST}/a/{id}?q={id}&k=${TOKEN}",
            "--url",
            IdEncoding::Url,
            &env,
        )
        .unwrap();
        assert_eq!(
            t.render("a/b c?d#e%f&g=h+é"),
            "http://127.0.0.1:9/a/a%2Fb%20c%3Fd%23e%25f%26g%3Dh%2B%C3%A9?q=a%2Fb%20c%3Fd%23e%25f%26g%3Dh%2B%C3%A9&k=s3cret"
        );
    }

    #[test]
    fn env_values_are_not_templates_and_ids_are_not_expanded() {
        let t =
            Template::parse("x{id}y", "--url", IdEncoding::Raw, &|_| Some("{id}".into())).unwrap();
        assert_eq!(t.render("${TOKEN}"), "x${TOKEN}y");
    }

    #[test]
    fn body_id_is_json_escaped() {
        let t = Template::parse(r#"{"id":"{id}"}"#, "--body", IdEncoding::Json, &env).unwrap();
        let body = t.render("a\"b\\c\nd");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["id"], "a\"b\\c\nd");
    }

    #[test]
    fn missing_variable_is_named() {
        let err = Handler::with_env(&spec("http://x/{id}?k=${NOPE}"), &env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("NOPE") && err.contains("--url"), "{err}");
        let mut s = spec("http://x/{id}");
        s.headers = vec!["Authorization: Bearer ${MISSING}".into()];
        let err = Handler::with_env(&s, &env).unwrap_err().to_string();
        assert!(
            err.contains("MISSING") && err.contains("authorization"),
            "{err}"
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        assert!(Handler::with_env(&spec("http://x/y"), &env).is_err());
        assert!(Handler::with_env(&spec("ftp://x/{id}"), &env).is_err());
        assert!(Handler::with_env(&spec("http://x/{id}${"), &env).is_err());
        let mut s = spec("http://x/{id}");
        s.headers = vec!["NoColon".into()];
        assert!(Handler::with_env(&s, &env).is_err());
        s.method = "BAD METHOD".into();
        assert!(Handler::with_env(&s, &env).is_err());
    }

    #[test]
    fn id_may_stand_in_the_body_or_a_header_only() {
        let mut s = spec("http://x/items");
        s.method = "POST".into();
        s.body = Some(r#"{"id":"{id}"}"#.into());
        assert!(check_templates(&s).is_ok());
        s.body = None;
        s.headers = vec!["X-Id: {id}".into()];
        assert!(check_templates(&s).is_ok());
        s.headers = vec![];
        let err = check_templates(&s).unwrap_err().to_string();
        assert!(err.contains("appears nowhere"), "{err}");
    }

    #[test]
    fn check_templates_needs_no_environment() {
        assert!(check_templates(&spec("http://${HOST}/{id}?k=${UNSET_ANYWHERE}")).is_ok());
        assert!(check_templates(&spec("http://x/{id}${")).is_err());
    }

    #[tokio::test]
    async fn dot_ids_are_refused_where_they_would_change_the_path() {
        let h = Handler::with_env(&spec("http://127.0.0.1:9/items/{id}"), &env).unwrap();
        for id in [".", ".."] {
            let err = h.attempt(id).await.unwrap_err();
            assert_eq!(err.class, ErrorClass::Request, "{id}");
        }
        let whole = |t: &str| {
            Template::parse(t, "--url", IdEncoding::Url, &env)
                .unwrap()
                .id_is_path_segment()
        };
        assert!(whole("http://h/a/{id}"));
        assert!(whole("http://h/a/{id}/b"));
        assert!(whole("http://h/a/{id}?q=1"));
        assert!(!whole("http://h/a/x{id}"));
        assert!(!whole("http://h/a/{id}.json"));
        assert!(!whole("http://h/a?id={id}"));
    }

    #[test]
    fn debug_does_not_show_secrets() {
        let mut s = spec("http://x/{id}?k=${TOKEN}");
        s.headers = vec!["Authorization: Bearer ${TOKEN}".into()];
        let h = Handler::with_env(&s, &env).unwrap();
        assert!(!format!("{h:?}").contains("s3cret"));
    }

    #[tokio::test]
    async fn transport_errors_do_not_leak_the_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let h = Handler::with_env(
            &spec(&format!("http://127.0.0.1:{port}/{{id}}?k=${{TOKEN}}")),
            &env,
        )
        .unwrap();
        let err = h.attempt("x").await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Connect);
        assert!(!err.message.contains("s3cret"), "{}", err.message);
    }

    #[test]
    fn urls_from_the_parsed_base_equal_parsing_the_whole_text() {
        let templates = [
            "http://h/items/{id}",
            "http://127.0.0.1:8080/items/{id}",
            "http://h:81/a/{id}?x={id}&y=1#f{id}",
            "https://user:pw@h/{id}/x/../y",
            "http://h?q={id}",
            "http://h#{id}",
            "http://h/{id}\\x",
            "http://H.example/%7E/{id}/./z",
            "http://h/a b/{id}",
            "http://h/é/{id}?é={id}",
            "HTTP://h:80/{id}",
            "http://h/{id}?",
            "http://h/{id}#",
            "http://[::1]:9/{id}",
            "{id}",
            "http://{id}.example/x",
        ];
        let ids = ["a", ".", "..", "x y", "é", "a/b?c#d%", "", "%2e", "\\"];
        for t in templates {
            let template = Template::parse(t, "--url", IdEncoding::Url, &|_| None).unwrap();
            let url = UrlTemplate::new(template);
            let expect_base = !t.starts_with("{id}") && !t.contains("://{id}");
            assert_eq!(url.base.is_some(), expect_base, "{t}");
            for id in ids {
                let whole =
                    reqwest::Url::parse(&url.template.render(id)).map_err(|e| e.to_string());
                assert_eq!(url.url(id), whole, "template {t:?}, id {id:?}");
            }
        }
    }
}
