//! Paginate: how the pages of one ID's answer are followed.
//!
//! A paginated job asks the API for one ID's answer page by page. Its [`PaginateSpec`] (stored
//! in the job's spec) says what is kept of each page (the items program, one item per output)
//! and how the request for the next page is found ([`PageStyle`]):
//!
//! - `link`: the URL of the `Link` header's link with `rel="next"` (RFC 8288);
//! - `next-url=JQ`: a URL the program reads from the body;
//! - `cursor=JQ`: a cursor the program reads from the body, written to a query parameter or
//!   a body field of the first request ([`ParamPlace`]);
//! - `page`: a page number, counted from a start;
//! - `offset`: the number of items seen so far;
//! - `jq=PROGRAM`: the general form, whose one output is a URL or an object saying what to
//!   change of the first request.
//!
//! A [`Pager`] is the spec compiled. Given a page ([`PageSeen`]) it says what the next
//! request is ([`NextRequest`]), or that the page was the last one. A URL relative to the
//! request that got the page is joined to it, and a URL on another origin (scheme, host,
//! port) than the first request's is refused: the job's headers, credentials among them,
//! would go to another host.
//!
//! `null`, `""`, `false` and no output at all end the pages, for every program that reads a
//! next URL or cursor. A program that errors, or gives something that is not a next request,
//! is a [`NextError`].

use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::link::next_link;
use crate::answer::{AnswerError, PageProgram, PageVars};
use crate::setting::Setting;

/// The most pages followed for one ID unless the job says otherwise.
pub const DEFAULT_MAX_PAGES: u32 = 10_000;

/// How a job follows the pages of each ID's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaginateSpec {
    /// How the next page's request is found.
    pub style: PageStyle,
    /// The jq program whose outputs are the items kept of each page.
    pub items: String,
    /// The most pages followed for one ID.
    pub max_pages: u32,
}

/// How the request for the next page is found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PageStyle {
    /// The `Link` header's link with `rel="next"`.
    Link,
    /// A URL read from the body by a jq program.
    NextUrl {
        /// The program.
        program: String,
    },
    /// A cursor read from the body by a jq program, written into the first request.
    Cursor {
        /// The program.
        program: String,
        /// Where the cursor goes.
        param: ParamPlace,
    },
    /// A page number: `start` for the first page after the first request, counting up.
    Page {
        /// Where the number goes.
        param: ParamPlace,
        /// The number of the first page (the first request is taken to ask for it).
        start: u64,
        /// Items in a full page: a page with fewer is the last (none: only an empty page is).
        size: Option<u32>,
    },
    /// The number of items seen so far.
    Offset {
        /// Where the offset goes.
        param: ParamPlace,
        /// Items in a full page: a page with fewer is the last (none: only an empty page is).
        size: Option<u32>,
    },
    /// A jq program whose one output is the next request.
    Jq {
        /// The program.
        program: String,
    },
}

/// Where a cursor, page number or offset is written into the first request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamPlace {
    /// A query parameter of the URL, by name (one already there is replaced).
    Query(String),
    /// A field of the JSON body, by its dotted path (`page.after`).
    Body(String),
}

/// The request for the next page, as a change of the first request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NextRequest {
    /// Another URL, absolute (already joined to the URL of the request that got the page).
    Url(String),
    /// The first request's URL with these query parameters set (replacing those there).
    Query(Vec<(String, String)>),
    /// The first request's body with these fields set, by dotted path.
    Body(Vec<(String, Value)>),
}

/// A paginated job's settings that do not fit together or do not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PaginateError {
    /// A style that is not one of those known.
    #[error(
        "{} {given:?} is not a style of paging: write link, next-url=JQ, cursor=JQ, page, \
         offset or jq=PROGRAM",
        Setting::Paginate
    )]
    UnknownStyle {
        /// The style as written.
        given: String,
    },
    /// A style that reads a program was given none.
    #[error(
        "{} {style} needs a jq program after the '=' ({style}=PROGRAM)",
        Setting::Paginate
    )]
    NoProgram {
        /// The style.
        style: &'static str,
    },
    /// A style that takes no program was given one.
    #[error("{} {style} takes no program (write {style} alone)", Setting::Paginate)]
    UnwantedProgram {
        /// The style.
        style: &'static str,
    },
    /// A style that writes into the request was not told where.
    #[error(
        "{} {style} needs {}: the query parameter (NAME) or body field (body:PATH) its value \
         is written to",
        Setting::Paginate,
        Setting::PageParam
    )]
    NeedsParam {
        /// The style.
        style: &'static str,
    },
    /// A setting the style does not use.
    #[error("{setting} is not used by {} {style}", Setting::Paginate)]
    Unused {
        /// The setting given.
        setting: Setting,
        /// The style.
        style: &'static str,
    },
    /// A parameter place with no name or path.
    #[error(
        "{} {given:?} names no parameter: write NAME (a query parameter) or body:PATH \
         (a body field, dotted: body:page.after)",
        Setting::PageParam
    )]
    BadParam {
        /// The place as written.
        given: String,
    },
    /// A count that must be at least 1.
    #[error("{setting} must be at least 1")]
    Zero {
        /// The setting.
        setting: Setting,
    },
    /// A program that is not jq.
    #[error(transparent)]
    Program(#[from] AnswerError),
}

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

impl PageStyle {
    /// The style the flag text `style` names (`link`, `next-url=JQ`, `cursor=JQ`, `page`,
    /// `offset`, `jq=PROGRAM`), with the settings that go with it: where its value is
    /// written (`NAME` or `body:PATH`), the first page's number and a full page's size.
    /// A setting the style does not use is refused, as is one it needs and was not given.
    pub fn parse(
        style: &str,
        param: Option<&str>,
        start: Option<u64>,
        size: Option<u32>,
    ) -> Result<PageStyle, PaginateError> {
        let (name, program) = match style.split_once('=') {
            Some((name, program)) => (name.trim(), Some(program.trim())),
            None => (style.trim(), None),
        };
        let (name, takes_program): (&'static str, bool) = match name {
            "link" => ("link", false),
            "next-url" => ("next-url", true),
            "cursor" => ("cursor", true),
            "page" => ("page", false),
            "offset" => ("offset", false),
            "jq" => ("jq", true),
            _ => {
                return Err(PaginateError::UnknownStyle {
                    given: style.to_string(),
                })
            }
        };
        let program = match (takes_program, program) {
            (true, Some(p)) if !p.is_empty() => p.to_string(),
            (true, _) => return Err(PaginateError::NoProgram { style: name }),
            (false, Some(_)) => return Err(PaginateError::UnwantedProgram { style: name }),
            (false, None) => String::new(),
        };
        let unused = |setting: Setting| PaginateError::Unused {
            setting,
            style: name,
        };
        let writes = matches!(name, "cursor" | "page" | "offset");
        let param = match (writes, param) {
            (true, Some(p)) => Some(ParamPlace::parse(p)?),
            (true, None) => return Err(PaginateError::NeedsParam { style: name }),
            (false, Some(_)) => return Err(unused(Setting::PageParam)),
            (false, None) => None,
        };
        if start.is_some() && name != "page" {
            return Err(unused(Setting::PageStart));
        }
        if size.is_some() && !matches!(name, "page" | "offset") {
            return Err(unused(Setting::PageSize));
        }
        if size == Some(0) {
            return Err(PaginateError::Zero {
                setting: Setting::PageSize,
            });
        }
        Ok(match (name, param) {
            ("link", _) => PageStyle::Link,
            ("next-url", _) => PageStyle::NextUrl { program },
            ("cursor", Some(param)) => PageStyle::Cursor { program, param },
            ("page", Some(param)) => PageStyle::Page {
                param,
                start: start.unwrap_or(1),
                size,
            },
            ("offset", Some(param)) => PageStyle::Offset { param, size },
            ("jq", _) => PageStyle::Jq { program },
            (style, _) => return Err(PaginateError::NeedsParam { style }),
        })
    }

    /// The style's name as the flag text writes it.
    pub fn name(&self) -> &'static str {
        match self {
            PageStyle::Link => "link",
            PageStyle::NextUrl { .. } => "next-url",
            PageStyle::Cursor { .. } => "cursor",
            PageStyle::Page { .. } => "page",
            PageStyle::Offset { .. } => "offset",
            PageStyle::Jq { .. } => "jq",
        }
    }
}

impl std::fmt::Display for PageStyle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageStyle::Link => f.write_str("link"),
            PageStyle::NextUrl { program } => write!(f, "next-url={program}"),
            PageStyle::Cursor { program, param } => write!(f, "cursor={program} into {param}"),
            PageStyle::Page { param, start, size } => {
                write!(f, "page into {param} from {start}")?;
                size.map_or(Ok(()), |s| write!(f, ", {s} items a page"))
            }
            PageStyle::Offset { param, size } => {
                write!(f, "offset into {param}")?;
                size.map_or(Ok(()), |s| write!(f, ", {s} items a page"))
            }
            PageStyle::Jq { program } => write!(f, "jq={program}"),
        }
    }
}

impl ParamPlace {
    /// The place the flag text names: `body:PATH` a body field, anything else a query
    /// parameter.
    pub fn parse(text: &str) -> Result<ParamPlace, PaginateError> {
        let bad = || PaginateError::BadParam {
            given: text.to_string(),
        };
        match text.strip_prefix("body:") {
            Some(path) if path.is_empty() || path.split('.').any(str::is_empty) => Err(bad()),
            Some(path) => Ok(ParamPlace::Body(path.to_string())),
            None if text.trim().is_empty() => Err(bad()),
            None => Ok(ParamPlace::Query(text.to_string())),
        }
    }

    /// The request change that writes `value` here: a query parameter as text, a body field
    /// as the JSON value.
    fn next(&self, value: Value) -> NextRequest {
        match self {
            ParamPlace::Query(name) => {
                NextRequest::Query(vec![(name.clone(), scalar_text(&value))])
            }
            ParamPlace::Body(path) => NextRequest::Body(vec![(path.clone(), value)]),
        }
    }
}

impl std::fmt::Display for ParamPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamPlace::Query(name) => write!(f, "query parameter {name}"),
            ParamPlace::Body(path) => write!(f, "body field {path}"),
        }
    }
}

/// A string's text, or a number's (or a boolean's) as JSON writes it.
fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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

/// `url` with the query parameters `pairs` set: each replaces every parameter of its name
/// already there (in place of the first of them), or is added at the end.
pub fn set_query(url: &Url, pairs: &[(String, String)]) -> Url {
    let old: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut done = vec![false; pairs.len()];
    let mut out = url.clone();
    {
        let mut query = out.query_pairs_mut();
        query.clear();
        for (name, value) in &old {
            match pairs.iter().position(|(n, _)| n == name) {
                Some(i) if done[i] => {}
                Some(i) => {
                    done[i] = true;
                    query.append_pair(name, &pairs[i].1);
                }
                None => {
                    query.append_pair(name, value);
                }
            }
        }
        for (i, (name, value)) in pairs.iter().enumerate() {
            if !done[i] {
                query.append_pair(name, value);
            }
        }
    }
    out
}

/// `body` with `value` set at the dotted `path`, objects made on the way (a part of the path
/// that holds something other than an object is replaced by one).
pub fn set_body_path(body: &mut Value, path: &str, value: Value) {
    let mut at = body;
    for part in path.split('.') {
        if !at.is_object() {
            *at = Value::Object(serde_json::Map::new());
        }
        at = at
            .as_object_mut()
            .expect("made an object above")
            .entry(part.to_string())
            .or_insert(Value::Null);
    }
    *at = value;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    fn pager(style: PageStyle) -> Pager {
        Pager::compile(&PaginateSpec {
            style,
            items: ".data[]?".into(),
            max_pages: DEFAULT_MAX_PAGES,
        })
        .unwrap()
    }

    fn style(text: &str, param: Option<&str>) -> PageStyle {
        PageStyle::parse(text, param, None, None).unwrap()
    }

    /// The next request after a page of `body` (and `headers`), page 0 of a request to
    /// `https://api.test/r?id=1`, `count` items kept.
    fn next_of(
        pager: &Pager,
        headers: &[(&str, &[u8])],
        body: Value,
        count: u32,
    ) -> Result<Option<NextRequest>, NextError> {
        let first = url("https://api.test/r?id=1");
        let seen = PageSeen {
            request_url: &first,
            status: 200,
            headers,
            body: &body,
            page: 0,
            items_before: 0,
        };
        pager.next(&first, &seen, count)
    }

    fn next_url(text: &str) -> Option<NextRequest> {
        Some(NextRequest::Url(text.into()))
    }

    #[test]
    fn flag_text_names_each_style() {
        assert_eq!(style("link", None), PageStyle::Link);
        assert_eq!(
            style("next-url=.links.next", None),
            PageStyle::NextUrl {
                program: ".links.next".into()
            }
        );
        assert_eq!(
            style("cursor=.next_cursor", Some("body:page.after")),
            PageStyle::Cursor {
                program: ".next_cursor".into(),
                param: ParamPlace::Body("page.after".into())
            }
        );
        assert_eq!(
            PageStyle::parse("page", Some("p"), Some(0), Some(100)).unwrap(),
            PageStyle::Page {
                param: ParamPlace::Query("p".into()),
                start: 0,
                size: Some(100)
            }
        );
        assert_eq!(
            style("page", Some("p")),
            PageStyle::Page {
                param: ParamPlace::Query("p".into()),
                start: 1,
                size: None
            },
            "pages start at 1 unless told"
        );
        assert_eq!(
            style("offset", Some("offset")),
            PageStyle::Offset {
                param: ParamPlace::Query("offset".into()),
                size: None
            }
        );
        assert_eq!(
            style("jq=.next", None),
            PageStyle::Jq {
                program: ".next".into()
            }
        );
    }

    #[test]
    fn flag_text_that_does_not_fit_is_refused_with_a_reason() {
        let refused = |s: &str, param: Option<&str>, start, size| {
            PageStyle::parse(s, param, start, size)
                .unwrap_err()
                .to_string()
        };
        assert!(refused("links", None, None, None).contains("not a style of paging"));
        assert!(refused("cursor", Some("c"), None, None).contains("needs a jq program"));
        assert!(refused("next-url= ", None, None, None).contains("needs a jq program"));
        assert!(refused("link=.x", None, None, None).contains("takes no program"));
        assert!(refused("cursor=.c", None, None, None).contains("needs page_param"));
        assert!(refused("page", None, None, None).contains("needs page_param"));
        assert!(refused("link", Some("p"), None, None).contains("page_param is not used"));
        assert!(refused("offset", Some("o"), Some(1), None).contains("page_start is not used"));
        assert!(refused("cursor=.c", Some("c"), None, Some(5)).contains("page_size is not used"));
        assert!(refused("page", Some("p"), None, Some(0)).contains("at least 1"));
        assert!(refused("page", Some("body:"), None, None).contains("names no parameter"));
        assert!(refused("page", Some("body:a..b"), None, None).contains("names no parameter"));
        assert!(refused("page", Some(" "), None, None).contains("names no parameter"));
    }

    #[test]
    fn programs_that_are_not_jq_and_no_pages_are_refused() {
        let spec = |style, items: &str, max_pages| PaginateSpec {
            style,
            items: items.into(),
            max_pages,
        };
        let bad_items = Pager::compile(&spec(PageStyle::Link, ".data[", 10)).unwrap_err();
        assert!(
            bad_items.to_string().starts_with("items \".data[\""),
            "{bad_items}"
        );
        let bad_next = Pager::compile(&spec(style("jq=.next |", None), ".[]", 10)).unwrap_err();
        assert!(
            bad_next.to_string().contains("not a valid jq program"),
            "{bad_next}"
        );
        let none = Pager::compile(&spec(PageStyle::Link, ".[]", 0)).unwrap_err();
        assert!(
            none.to_string().contains("max_pages must be at least 1"),
            "{none}"
        );
    }

    #[test]
    fn the_spec_is_stored_as_tagged_json() {
        let spec = PaginateSpec {
            style: style("cursor=.next", Some("body:page.after")),
            items: ".data[]".into(),
            max_pages: 500,
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json,
            json!({"style": {"kind": "cursor", "program": ".next", "param": {"body": "page.after"}},
                   "items": ".data[]", "max_pages": 500})
        );
        assert_eq!(serde_json::from_value::<PaginateSpec>(json).unwrap(), spec);
        let link = serde_json::to_value(PageStyle::Link).unwrap();
        assert_eq!(link, json!({"kind": "link"}));
    }

    #[test]
    fn items_are_each_output_of_the_program_with_the_page_bound() {
        let first = url("https://api.test/r");
        let body = json!({"data": [1, 2, 3]});
        let seen = PageSeen {
            request_url: &first,
            status: 200,
            headers: &[],
            body: &body,
            page: 4,
            items_before: 0,
        };
        assert_eq!(
            pager(PageStyle::Link).items(&seen).unwrap(),
            vec![json!(1), json!(2), json!(3)]
        );
        let with_page = Pager::compile(&PaginateSpec {
            style: PageStyle::Link,
            items: ".data[] | {v: ., page: $page, status: $status}".into(),
            max_pages: 1,
        })
        .unwrap();
        assert_eq!(
            with_page.items(&seen).unwrap()[0],
            json!({"v": 1, "page": 4, "status": 200})
        );
        let failing = Pager::compile(&PaginateSpec {
            style: PageStyle::Link,
            items: ".data.x".into(),
            max_pages: 1,
        })
        .unwrap();
        let e = failing.items(&seen).unwrap_err();
        assert!(
            matches!(
                e,
                NextError::Program {
                    what: Setting::Items,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn link_follows_rel_next_joined_to_the_request_url_and_ends_without_one() {
        let p = pager(PageStyle::Link);
        let link = |v: &'static str| -> Vec<(&'static str, &'static [u8])> {
            vec![("Link", v.as_bytes())]
        };
        assert_eq!(
            next_of(&p, &link(r#"</r?id=1&page=2>; rel="next""#), json!([]), 0).unwrap(),
            next_url("https://api.test/r?id=1&page=2"),
            "an empty page with a next link is not the last: the link decides"
        );
        assert_eq!(
            next_of(&p, &link(r#"<page/3>; rel="next last""#), json!([]), 1).unwrap(),
            next_url("https://api.test/page/3")
        );
        assert_eq!(
            next_of(&p, &link(r#"</r?page=9>; rel="last""#), json!([]), 1).unwrap(),
            None
        );
        assert_eq!(next_of(&p, &[], json!([]), 1).unwrap(), None);
        let two_headers: Vec<(&str, &[u8])> = vec![
            ("link", br#"</a>; rel="prev""#),
            ("LINK", br#"</b>; rel="next""#),
        ];
        assert_eq!(
            next_of(&p, &two_headers, json!([]), 1).unwrap(),
            next_url("https://api.test/b")
        );
    }

    #[test]
    fn a_next_url_on_another_origin_is_refused() {
        let p = pager(PageStyle::Link);
        for other in [
            "https://evil.test/r?page=2",
            "http://api.test/r?page=2",
            "https://api.test:8443/r?page=2",
            "//evil.test/r",
        ] {
            let header = format!("<{other}>; rel=next");
            let e = next_of(&p, &[("link", header.as_bytes())], json!([]), 1).unwrap_err();
            assert!(matches!(e, NextError::OtherOrigin { .. }), "{other}: {e}");
            assert!(e.to_string().contains("https://api.test"), "{e}");
        }
        let same = "<https://api.test:443/r?page=2>; rel=next";
        assert!(next_of(&p, &[("link", same.as_bytes())], json!([]), 1).is_ok());
        let p = pager(style("next-url=.next", None));
        let e = next_of(&p, &[], json!({"next": "https://evil.test/"}), 1).unwrap_err();
        assert!(matches!(e, NextError::OtherOrigin { .. }), "{e}");
        let e = next_of(&p, &[], json!({"next": "http://[::1"}), 1).unwrap_err();
        assert!(matches!(e, NextError::BadUrl { .. }), "{e}");
    }

    #[test]
    fn next_url_reads_the_body_and_ends_on_null_empty_false_or_nothing() {
        let p = pager(style("next-url=.links.next", None));
        assert_eq!(
            next_of(&p, &[], json!({"links": {"next": "/r?id=1&after=x"}}), 3).unwrap(),
            next_url("https://api.test/r?id=1&after=x")
        );
        for end in [
            json!({"links": {"next": null}}),
            json!({"links": {"next": ""}}),
            json!({"links": {"next": false}}),
            json!({}),
        ] {
            assert_eq!(next_of(&p, &[], end.clone(), 3).unwrap(), None, "{end}");
        }
        let p = pager(style("next-url=.links.next | select(. != null)", None));
        assert_eq!(
            next_of(&p, &[], json!({"links": {}}), 3).unwrap(),
            None,
            "no output"
        );
        let p = pager(style("next-url=.next", None));
        let e = next_of(&p, &[], json!({"next": 5}), 3).unwrap_err();
        assert!(matches!(e, NextError::Malformed { .. }), "{e}");
        let p = pager(style("next-url=.next[]", None));
        let e = next_of(&p, &[], json!({"next": ["/a", "/b"]}), 3).unwrap_err();
        assert!(e.to_string().contains("more than one output"), "{e}");
        let p = pager(style("next-url=.next.x", None));
        let e = next_of(&p, &[], json!({"next": "a"}), 3).unwrap_err();
        assert!(matches!(e, NextError::Program { .. }), "{e}");
    }

    #[test]
    fn a_cursor_goes_to_its_query_parameter_or_body_field_and_ends_on_null_or_empty() {
        let p = pager(style("cursor=.next_cursor", Some("cursor")));
        assert_eq!(
            next_of(&p, &[], json!({"next_cursor": "abc=="}), 50).unwrap(),
            Some(NextRequest::Query(vec![("cursor".into(), "abc==".into())]))
        );
        assert_eq!(
            next_of(&p, &[], json!({"next_cursor": 1234}), 50).unwrap(),
            Some(NextRequest::Query(vec![("cursor".into(), "1234".into())])),
            "a number is written as its text"
        );
        for end in [json!(""), json!(null), json!(false)] {
            assert_eq!(
                next_of(&p, &[], json!({"next_cursor": end}), 50).unwrap(),
                None
            );
        }
        let e = next_of(&p, &[], json!({"next_cursor": {"a": 1}}), 50).unwrap_err();
        assert!(e.to_string().contains("not a cursor"), "{e}");
        let stripe = pager(style(
            "cursor=if .has_more then .data[-1].id else null end",
            Some("body:page.after"),
        ));
        assert_eq!(
            next_of(
                &stripe,
                &[],
                json!({"has_more": true, "data": [{"id": "a"}, {"id": "b"}]}),
                2
            )
            .unwrap(),
            Some(NextRequest::Body(vec![("page.after".into(), json!("b"))]))
        );
        assert_eq!(
            next_of(
                &stripe,
                &[],
                json!({"has_more": false, "data": [{"id": "a"}]}),
                1
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn page_numbers_count_up_from_the_start_and_end_on_an_empty_or_short_page() {
        let p = pager(PageStyle::parse("page", Some("page"), Some(1), Some(50)).unwrap());
        assert_eq!(
            next_of(&p, &[], json!([]), 50).unwrap(),
            Some(NextRequest::Query(vec![("page".into(), "2".into())]))
        );
        assert_eq!(next_of(&p, &[], json!([]), 49).unwrap(), None, "short");
        assert_eq!(next_of(&p, &[], json!([]), 0).unwrap(), None, "empty");
        let no_size = pager(PageStyle::parse("page", Some("body:p"), Some(0), None).unwrap());
        assert_eq!(
            next_of(&no_size, &[], json!([]), 3).unwrap(),
            Some(NextRequest::Body(vec![("p".into(), json!(1))])),
            "without a size, only an empty page is the last; a body field gets a number"
        );
        assert_eq!(next_of(&no_size, &[], json!([]), 0).unwrap(), None);
        let first = url("https://api.test/r");
        let body = json!([]);
        let later = PageSeen {
            request_url: &first,
            status: 200,
            headers: &[],
            body: &body,
            page: 6,
            items_before: 300,
        };
        assert_eq!(
            p.next(&first, &later, 50).unwrap(),
            Some(NextRequest::Query(vec![("page".into(), "8".into())])),
            "page 6 counted from 0 was number 7"
        );
    }

    #[test]
    fn offsets_count_the_items_seen_and_end_on_an_empty_or_short_page() {
        let p = pager(PageStyle::parse("offset", Some("offset"), None, Some(100)).unwrap());
        let first = url("https://api.test/r");
        let body = json!([]);
        let seen = PageSeen {
            request_url: &first,
            status: 200,
            headers: &[],
            body: &body,
            page: 2,
            items_before: 200,
        };
        assert_eq!(
            p.next(&first, &seen, 100).unwrap(),
            Some(NextRequest::Query(vec![("offset".into(), "300".into())]))
        );
        assert_eq!(p.next(&first, &seen, 99).unwrap(), None);
        assert_eq!(p.next(&first, &seen, 0).unwrap(), None);
    }

    #[test]
    fn the_jq_form_gives_a_url_or_one_change_of_the_first_request() {
        let p = pager(style("jq=.next", None));
        let next = |v: Value| next_of(&p, &[], json!({ "next": v }), 5);
        assert_eq!(
            next(json!("?id=1&p=2")).unwrap(),
            next_url("https://api.test/r?id=1&p=2")
        );
        assert_eq!(
            next(json!({"url": "/x"})).unwrap(),
            next_url("https://api.test/x")
        );
        assert_eq!(
            next(json!({"query": {"p": 2, "q": "a b", "f": true}})).unwrap(),
            Some(NextRequest::Query(vec![
                ("f".into(), "true".into()),
                ("p".into(), "2".into()),
                ("q".into(), "a b".into()),
            ]))
        );
        assert_eq!(
            next(json!({"body": {"page.after": {"id": 7}}})).unwrap(),
            Some(NextRequest::Body(vec![(
                "page.after".into(),
                json!({"id": 7})
            )]))
        );
        assert_eq!(next(json!(null)).unwrap(), None);
        assert_eq!(next(json!("")).unwrap(), None);
        for bad in [
            json!(5),
            json!([1]),
            json!({}),
            json!({"url": "/x", "query": {"p": 1}}),
            json!({"url": 5}),
            json!({"query": {"p": [1]}}),
            json!({"query": {}}),
            json!({"query": "p=1"}),
            json!({"body": {"a..b": 1}}),
            json!({"body": []}),
            json!({"headers": {}}),
        ] {
            let e = next(bad.clone()).unwrap_err();
            assert!(matches!(e, NextError::Malformed { .. }), "{bad}: {e}");
        }
        let with_count = pager(style(
            "jq=if $count < 5 then null else {query: {page: ($page + 2)}} end",
            None,
        ));
        assert_eq!(
            next_of(&with_count, &[], json!({}), 5).unwrap(),
            Some(NextRequest::Query(vec![("page".into(), "2".into())]))
        );
        assert_eq!(next_of(&with_count, &[], json!({}), 4).unwrap(), None);
    }

    #[test]
    fn query_parameters_are_replaced_in_place_and_encoded() {
        let first = url("https://api.test/r?a=1&cursor=old&b=x%20y&cursor=older");
        let set = set_query(
            &first,
            &[
                ("cursor".into(), "n/x+y=&z".into()),
                ("new".into(), "é".into()),
            ],
        );
        assert_eq!(
            set.as_str(),
            "https://api.test/r?a=1&cursor=n%2Fx%2By%3D%26z&b=x+y&new=%C3%A9"
        );
        let pairs: Vec<(String, String)> = set
            .query_pairs()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        assert_eq!(pairs[1], ("cursor".to_string(), "n/x+y=&z".to_string()));
        let bare = set_query(&url("https://api.test/r"), &[("page".into(), "2".into())]);
        assert_eq!(bare.as_str(), "https://api.test/r?page=2");
    }

    #[test]
    fn a_body_path_is_set_making_objects_on_the_way() {
        let mut body = json!({"query": "x", "page": {"size": 10}, "flat": 1});
        set_body_path(&mut body, "page.after", json!("c1"));
        set_body_path(&mut body, "cursor", json!(3));
        set_body_path(&mut body, "flat.deep", json!(true));
        assert_eq!(
            body,
            json!({"query": "x", "page": {"size": 10, "after": "c1"}, "cursor": 3, "flat": {"deep": true}})
        );
        let mut nothing = Value::Null;
        set_body_path(&mut nothing, "a.b", json!(1));
        assert_eq!(nothing, json!({"a": {"b": 1}}));
    }

    /// The pager against the fake API's paginated routes: every item once, in order, and the
    /// last page found by each style's own rule.
    #[cfg(feature = "demo")]
    mod against_the_fake_api {
        use crate::demo::api::{ApiConfig, FakeApi};
        use crate::handler::paginate::{
            set_query, NextRequest, PageSeen, PageStyle, Pager, PaginateSpec,
        };

        /// Every item of `id`, walking the pages of `first` as the pager says.
        async fn walk(c: &reqwest::Client, style: PageStyle, first: &str) -> (Vec<u64>, u32) {
            let items = match style {
                PageStyle::Cursor { .. } => ".data[]",
                _ => ".[]",
            };
            let pager = Pager::compile(&PaginateSpec {
                style,
                items: items.into(),
                max_pages: 100,
            })
            .unwrap();
            let first = reqwest::Url::parse(first).unwrap();
            let mut url = first.clone();
            let (mut seen, mut pages, mut before) = (Vec::new(), 0, 0);
            loop {
                let resp = c.get(url.clone()).send().await.unwrap();
                let status = resp.status().as_u16();
                let headers: Vec<(String, Vec<u8>)> = resp
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                    .collect();
                let headers: Vec<(&str, &[u8])> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                let body: serde_json::Value =
                    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
                let page = PageSeen {
                    request_url: &url,
                    status,
                    headers: &headers,
                    body: &body,
                    page: pages,
                    items_before: before,
                };
                let kept = pager.items(&page).unwrap();
                let next = pager.next(&first, &page, kept.len() as u32).unwrap();
                seen.extend(kept.iter().map(|i| i["k"].as_u64().unwrap()));
                before += kept.len() as u64;
                pages += 1;
                url = match next {
                    None => return (seen, pages),
                    Some(NextRequest::Url(next)) => reqwest::Url::parse(&next).unwrap(),
                    Some(NextRequest::Query(pairs)) => set_query(&first, &pairs),
                    Some(NextRequest::Body(_)) => panic!("no body on these routes"),
                };
            }
        }

        #[tokio::test]
        async fn the_pager_walks_every_route_to_its_end() {
            let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
            let c = reqwest::Client::builder().no_proxy().build().unwrap();
            let all = |n: u64| (0..n).collect::<Vec<u64>>();
            let link = api.pages_link_url_template().replace("{id}", "p230-l") + "?per_page=50";
            assert_eq!(walk(&c, PageStyle::Link, &link).await, (all(230), 5));
            let cursor =
                PageStyle::parse("cursor=.next_cursor", Some("cursor"), None, None).unwrap();
            let url = api.pages_cursor_url_template().replace("{id}", "p230-c");
            assert_eq!(walk(&c, cursor, &url).await, (all(230), 5));
            let offset = PageStyle::parse("offset", Some("offset"), None, Some(50)).unwrap();
            let url = api.pages_offset_url_template().replace("{id}", "p200-o") + "?limit=50";
            assert_eq!(
                walk(&c, offset, &url).await,
                (all(200), 5),
                "four full pages, then an empty one"
            );
            let page = PageStyle::parse("page", Some("page"), Some(1), Some(40)).unwrap();
            let url = api.pages_link_url_template().replace("{id}", "p90-p") + "?per_page=40";
            assert_eq!(
                walk(&c, page, &url).await,
                (all(90), 3),
                "a short last page"
            );
            api.shutdown().await;
        }
    }
}
