//! A paginated job's settings as stored ([`PaginateSpec`]): the style of paging with where its
//! value goes, the items program and the most pages; and the request for the next page as a
//! change of the first request ([`NextRequest`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::answer::AnswerError;
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
    /// Another URL (as [`NextRequest::Url`]) whose query parameters named in `first` are
    /// the first request's, as rendered for each request: the form a next URL is kept in
    /// when it repeats a parameter of the first request (an API key in the query, which is
    /// then never stored).
    UrlKeeping {
        /// The URL without those parameters.
        url: String,
        /// The names of the parameters taken from the first request, in order.
        first: Vec<String>,
    },
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
    pub(super) fn next(&self, value: Value) -> NextRequest {
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
pub(super) fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
