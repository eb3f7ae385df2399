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

mod pager;
mod request;
mod spec;
#[cfg(test)]
mod tests;

pub use pager::{check_origin, NextError, PageSeen, Pager};
pub use request::{set_body_path, set_query};
pub use spec::{
    NextRequest, PageStyle, PaginateError, PaginateSpec, ParamPlace, DEFAULT_MAX_PAGES,
};
