//! The request templates compiled ([`Compiled`]): the method, the URL (its part before the
//! path parsed once: [`UrlTemplate`]), the headers and the body, checked before a job is
//! stored ([`check_templates`], [`check_batch`]) and when a handler is built.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::handler::batch::{splitter, BatchSpec};
use crate::handler::error::HandlerError;
use crate::handler::template::{IdEncoding, Piece, Template};
use crate::serde_millis;
use crate::setting::Setting;

/// The request made for each ID, as templates (stored in the job's spec as written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// HTTP method, upper case.
    pub method: String,
    /// URL template: `{id}` percent-encoded for its place, `${VAR}` from the environment.
    pub url: String,
    /// Header templates, `Name: value`, in order.
    pub headers: Vec<String>,
    /// Body template: `{id}` JSON-escaped, `${VAR}` from the environment.
    pub body: Option<String>,
    /// TCP connect timeout.
    #[serde(with = "serde_millis")]
    pub connect_timeout: Duration,
    /// Whole-request timeout (connect, send, receive the body); for an exec job, the
    /// process's.
    #[serde(with = "serde_millis")]
    pub timeout: Duration,
}

/// The URL template, with its constant part before the path parsed once.
///
/// Parsing a whole URL (scheme, host, port) is the costliest step of building a request, and
/// the part before the path never depends on the ID when `{id}` stands only after it: then a
/// request's URL is the parsed base with its path, query and fragment set. The unit tests
/// check it gives the same URL as parsing the whole rendered text.
pub(super) struct UrlTemplate {
    pub(super) template: Template,
    /// The parsed `scheme://authority` and its length in every rendered URL.
    pub(super) base: Option<(reqwest::Url, usize)>,
}

impl UrlTemplate {
    pub(super) fn new(template: Template) -> UrlTemplate {
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

    /// The URL of a rendered template; an error says why the text is not a URL.
    pub(super) fn url(&self, full: &str) -> Result<reqwest::Url, String> {
        let Some((base, len)) = &self.base else {
            return reqwest::Url::parse(full).map_err(|e| e.to_string());
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
pub(super) struct Compiled {
    pub(super) method: Method,
    pub(super) url: UrlTemplate,
    pub(super) headers: Vec<(HeaderName, Template)>,
    pub(super) body: Option<Template>,
    pub(super) json_body: bool,
    /// `{id}` stands as a whole path segment, where `.` and `..` would change the path.
    pub(super) id_is_path_segment: bool,
}

impl Compiled {
    pub(super) fn new(
        spec: &RequestSpec,
        env: &dyn Fn(&str) -> Option<String>,
        credentials: &[&str],
    ) -> Result<Compiled, HandlerError> {
        let method =
            Method::from_bytes(spec.method.as_bytes()).map_err(|_| HandlerError::Invalid {
                what: Setting::Method,
                reason: format!("{:?} is not an HTTP method", spec.method),
            })?;
        let url =
            Template::parse_with(&spec.url, &Setting::Url, IdEncoding::Url, env, credentials)?;
        let probe = url.render("id");
        let parsed = reqwest::Url::parse(&probe).map_err(|e| HandlerError::Invalid {
            what: Setting::Url,
            reason: format!("not a valid URL once filled in ({e})"),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(HandlerError::Invalid {
                what: Setting::Url,
                reason: format!("scheme {:?} is not http or https", parsed.scheme()),
            });
        }
        let mut headers = Vec::new();
        let mut json_body = true;
        for h in &spec.headers {
            let (name, value) = h.split_once(':').ok_or_else(|| HandlerError::Invalid {
                what: Setting::Header(None),
                reason: format!("{:?} is not of the form 'Name: value'", redact_value(h)),
            })?;
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                HandlerError::Invalid {
                    what: Setting::Header(None),
                    reason: format!("{:?} is not a valid header name", name.trim()),
                }
            })?;
            let value = Template::parse_with(
                value.trim(),
                &Setting::Header(Some(name.to_string())),
                IdEncoding::Raw,
                env,
                credentials,
            )?;
            if HeaderValue::from_str(&value.render("id")).is_err() {
                return Err(HandlerError::Invalid {
                    what: Setting::Header(Some(name.to_string())),
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
            .map(|b| Template::parse_with(b, &Setting::Body, IdEncoding::Json, env, credentials))
            .transpose()?;
        let url = UrlTemplate::new(url);
        let has = |t: &Template| t.has_id() || t.has_ids();
        let anywhere = has(&url.template)
            || body.as_ref().is_some_and(has)
            || headers.iter().any(|(_, v)| has(v));
        if !anywhere {
            return Err(HandlerError::Invalid {
                what: Setting::Url,
                reason: format!(
                    "{{id}} appears in none of {}, {}, {}: every request would be the same",
                    Setting::Url,
                    Setting::Body,
                    Setting::Header(None)
                ),
            });
        }
        let used = url.template.has_credential()
            || body.as_ref().is_some_and(Template::has_credential)
            || headers.iter().any(|(_, v)| v.has_credential());
        if !credentials.is_empty() && !used {
            return Err(HandlerError::Invalid {
                what: Setting::Credential(credentials.join(", ")),
                reason: format!(
                    "no ${{NAME}} of a credential appears in {}, {} or {}: it would never be sent",
                    Setting::Url,
                    Setting::Body,
                    Setting::Header(None)
                ),
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
/// what must hold before a job is stored. `credentials`: the names of the job's credentials.
pub(crate) fn check_templates(
    spec: &RequestSpec,
    credentials: &[&str],
) -> Result<(), HandlerError> {
    let compiled = Compiled::new(spec, &|_| Some("x".into()), credentials)?;
    let batch = compiled.url.template.has_ids()
        || compiled.body.as_ref().is_some_and(Template::has_ids)
        || compiled.headers.iter().any(|(_, t)| t.has_ids());
    if batch {
        return Err(HandlerError::Invalid {
            what: Setting::BatchSize,
            reason: "{ids} and {rows} write a batch's IDs: give the batch size".into(),
        });
    }
    Ok(())
}

/// A batch job's templates: `{ids}` or `{rows}` somewhere, and no `{id}` or `{column}`,
/// which stand for one ID.
pub(super) fn check_batch_templates(r: &Compiled) -> Result<(), HandlerError> {
    let templates = std::iter::once((Setting::Url, &r.url.template))
        .chain(
            r.headers
                .iter()
                .map(|(name, t)| (Setting::Header(Some(name.to_string())), t)),
        )
        .chain(r.body.iter().map(|t| (Setting::Body, t)));
    let mut any = false;
    for (what, t) in templates {
        if t.has_single() {
            return Err(HandlerError::Invalid {
                what,
                reason: "{id} and {column} stand for one ID; a batch request writes its IDs \
                         with {ids} (or {rows} in the body)"
                    .into(),
            });
        }
        any |= t.has_ids();
    }
    if !any {
        return Err(HandlerError::Invalid {
            what: Setting::BatchSize,
            reason: "a batch request needs {ids} in the URL, a header or the body (or {rows} \
                     in the body)"
                .into(),
        });
    }
    Ok(())
}

/// Check a batch job's request and split program (without the environment).
pub(crate) fn check_batch(
    spec: &RequestSpec,
    batch: &BatchSpec,
    credentials: &[&str],
) -> Result<(), HandlerError> {
    let compiled = Compiled::new(spec, &|_| Some("x".into()), credentials)?;
    splitter(&batch.split)?;
    check_batch_templates(&compiled)
}

fn redact_value(header: &str) -> String {
    match header.split_once(':') {
        Some((name, _)) => format!("{name}: <redacted>"),
        None => "<redacted>".into(),
    }
}
