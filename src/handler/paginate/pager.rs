//! The pager ([`Pager`]): a [`PaginateSpec`] compiled, which reads a page ([`PageSeen`]) for
//! its items and the request for the next page, or says the page was the last; a next URL
//! is joined to the request that got the page and refused on another origin than the first
//! request's ([`NextError`]).

use reqwest::Url;
use serde_json::Value;

use super::spec::{scalar_text, NextRequest, PageStyle, PaginateError, PaginateSpec};
use crate::answer::{PageProgram, PageVars};
use crate::handler::link::next_link;
use crate::setting::Setting;

/// Why a page's next request could not be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NextError {
    /// A program errored on the page: jq's message.
    #[error("{what} {program:?} failed on the page: {reason}")]
    Program {
        /// Which program.
        what: Setting,
        /// The program as written.
        program: String,
        /// jq's message.
        reason: String,
    },
    /// A program gave something that is not a next request.
    #[error("{what} {program:?} gave {given}: {reason}")]
    Malformed {
        /// Which program.
        what: Setting,
        /// The program as written.
        program: String,
        /// What it gave, as JSON.
        given: String,
        /// What was wanted.
        reason: String,
    },
    /// A next URL that is not a URL, even joined to the request's.
    #[error("the next page's URL {url:?} is not a URL: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// The parser's message.
        reason: String,
    },
    /// A next URL on another origin than the first request's.
    #[error(
        "the next page's URL {url} is on another origin than the first request's ({origin}): \
         the job's headers are not sent to another host"
    )]
    OtherOrigin {
        /// The next URL.
        url: String,
        /// The first request's origin.
        origin: String,
    },
}

/// One page as the pager sees it.
#[derive(Debug, Clone, Copy)]
pub struct PageSeen<'a> {
    /// The URL of the request that got the page: relative next URLs are joined to it.
    pub request_url: &'a Url,
    /// The page's HTTP status.
    pub status: u16,
    /// The page's headers, as received.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The page's body, parsed.
    pub body: &'a Value,
    /// The page's number, from 0.
    pub page: u32,
    /// The items kept of the earlier pages.
    pub items_before: u64,
}

/// A [`PaginateSpec`] compiled: its programs ready to run.
#[derive(Debug)]
pub struct Pager {
    spec: PaginateSpec,
    items: PageProgram,
    next: Option<PageProgram>,
}

impl Pager {
    /// Compile `spec`'s programs; a program that is not jq, or no page allowed, is refused.
    pub fn compile(spec: &PaginateSpec) -> Result<Pager, PaginateError> {
        if spec.max_pages == 0 {
            return Err(PaginateError::Zero {
                setting: Setting::MaxPages,
            });
        }
        let items = PageProgram::compile(Setting::Items, &spec.items)?;
        let next = match &spec.style {
            PageStyle::NextUrl { program }
            | PageStyle::Cursor { program, .. }
            | PageStyle::Jq { program } => Some(PageProgram::compile(Setting::Paginate, program)?),
            PageStyle::Link | PageStyle::Page { .. } | PageStyle::Offset { .. } => None,
        };
        Ok(Pager {
            spec: spec.clone(),
            items,
            next,
        })
    }

    /// The spec compiled.
    pub fn spec(&self) -> &PaginateSpec {
        &self.spec
    }

    /// The items kept of a page: each output of the items program, in order.
    pub fn items(&self, page: &PageSeen<'_>) -> Result<Vec<Value>, NextError> {
        self.items
            .outputs(page.body, vars(page, None))
            .map_err(|reason| NextError::Program {
                what: Setting::Items,
                program: self.items.source().to_string(),
                reason,
            })
    }

    /// The request for the page after `page`, of which `count` items were kept; none when
    /// `page` is the last. `first_url` is the URL of the ID's first request: a next URL on
    /// another origin is refused.
    pub fn next(
        &self,
        first_url: &Url,
        page: &PageSeen<'_>,
        count: u32,
    ) -> Result<Option<NextRequest>, NextError> {
        let next = match &self.spec.style {
            PageStyle::Link => page
                .headers
                .iter()
                .filter(|(name, _)| name.eq_ignore_ascii_case("link"))
                .find_map(|(_, value)| next_link(&String::from_utf8_lossy(value)))
                .map(NextRequest::Url),
            PageStyle::NextUrl { .. } => match self.one_output(page, count)? {
                None => None,
                Some(Value::String(url)) => Some(NextRequest::Url(url)),
                Some(other) => return Err(self.malformed(&other, "not a URL string")),
            },
            PageStyle::Cursor { param, .. } => match self.one_output(page, count)? {
                None => None,
                Some(v @ (Value::String(_) | Value::Number(_))) => {
                    Some(param.next(Value::String(scalar_text(&v))))
                }
                Some(other) => {
                    return Err(self.malformed(&other, "not a cursor (a string or a number)"))
                }
            },
            PageStyle::Page { param, start, size } => {
                if last_by_count(count, *size) {
                    None
                } else {
                    Some(param.next(Value::from(start + u64::from(page.page) + 1)))
                }
            }
            PageStyle::Offset { param, size } => {
                if last_by_count(count, *size) {
                    None
                } else {
                    Some(param.next(Value::from(page.items_before + u64::from(count))))
                }
            }
            PageStyle::Jq { .. } => match self.one_output(page, count)? {
                None => None,
                Some(Value::String(url)) => Some(NextRequest::Url(url)),
                Some(Value::Object(object)) => Some(self.jq_object(object)?),
                Some(other) => {
                    return Err(self.malformed(
                        &other,
                        "not null, a URL string or an object of url, query or body",
                    ))
                }
            },
        };
        match next {
            Some(NextRequest::Url(url)) => {
                let joined = join(page.request_url, &url)?;
                check_origin(first_url, &joined)?;
                Ok(Some(NextRequest::Url(joined.to_string())))
            }
            other => Ok(other),
        }
    }

    /// The next program's one output, none for null, `""`, `false` or no output at all.
    fn one_output(&self, page: &PageSeen<'_>, count: u32) -> Result<Option<Value>, NextError> {
        let program = self
            .next
            .as_ref()
            .expect("a style that reads has its program");
        let mut outputs = program
            .outputs(page.body, vars(page, Some(count)))
            .map_err(|reason| NextError::Program {
                what: Setting::Paginate,
                program: program.source().to_string(),
                reason,
            })?;
        if outputs.len() > 1 {
            let given = Value::Array(outputs).to_string();
            return Err(NextError::Malformed {
                what: Setting::Paginate,
                program: program.source().to_string(),
                given,
                reason: "more than one output (a next request is one)".into(),
            });
        }
        Ok(match outputs.pop() {
            None | Some(Value::Null) | Some(Value::Bool(false)) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(v) => Some(v),
        })
    }

    /// The jq form's object: exactly one of `url`, `query` (an object of parameters, their
    /// values strings or numbers) and `body` (an object of dotted paths and values).
    fn jq_object(&self, object: serde_json::Map<String, Value>) -> Result<NextRequest, NextError> {
        let whole = Value::Object(object.clone());
        let one_of = "an object with one of url, query or body";
        let mut entries = object.into_iter();
        let (Some((key, value)), None) = (entries.next(), entries.next()) else {
            return Err(self.malformed(&whole, one_of));
        };
        match (key.as_str(), value) {
            ("url", Value::String(url)) if !url.is_empty() => Ok(NextRequest::Url(url)),
            ("url", _) => Err(self.malformed(&whole, "its url is not a URL string")),
            ("query", Value::Object(params)) if !params.is_empty() => {
                let mut pairs = Vec::with_capacity(params.len());
                for (name, value) in params {
                    match value {
                        Value::String(_) | Value::Number(_) | Value::Bool(_) => {
                            pairs.push((name, scalar_text(&value)))
                        }
                        _ => {
                            return Err(self.malformed(
                                &whole,
                                "a query parameter's value is a string, a number or a boolean",
                            ))
                        }
                    }
                }
                Ok(NextRequest::Query(pairs))
            }
            ("query", _) => Err(self.malformed(&whole, "its query is not an object of parameters")),
            ("body", Value::Object(fields)) if !fields.is_empty() => {
                if fields.keys().any(|p| p.split('.').any(str::is_empty)) {
                    return Err(self.malformed(&whole, "a body path has an empty part"));
                }
                Ok(NextRequest::Body(fields.into_iter().collect()))
            }
            ("body", _) => Err(self.malformed(&whole, "its body is not an object of fields")),
            _ => Err(self.malformed(&whole, one_of)),
        }
    }

    fn malformed(&self, given: &Value, reason: &str) -> NextError {
        let program = self.next.as_ref().map_or("", |p| p.source());
        NextError::Malformed {
            what: Setting::Paginate,
            program: program.to_string(),
            given: given.to_string(),
            reason: reason.to_string(),
        }
    }
}

fn vars<'a>(page: &PageSeen<'a>, count: Option<u32>) -> PageVars<'a> {
    PageVars {
        status: page.status,
        headers: page.headers,
        page: page.page,
        count,
    }
}

/// Whether a page of `count` items is the last by its count: empty, or short of a full page.
fn last_by_count(count: u32, size: Option<u32>) -> bool {
    count == 0 || size.is_some_and(|size| count < size)
}

/// `url` joined to `base` (itself when absolute).
fn join(base: &Url, url: &str) -> Result<Url, NextError> {
    base.join(url.trim()).map_err(|e| NextError::BadUrl {
        url: url.to_string(),
        reason: e.to_string(),
    })
}

/// Refuse `next` unless its origin (scheme, host, port) is `first`'s.
pub fn check_origin(first: &Url, next: &Url) -> Result<(), NextError> {
    if first.origin() == next.origin() {
        Ok(())
    } else {
        Err(NextError::OtherOrigin {
            url: next.to_string(),
            origin: first.origin().ascii_serialization(),
        })
    }
}
