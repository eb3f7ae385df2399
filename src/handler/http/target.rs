//! The request for one page of a paginated ID: the ID's first request (its URL and body),
//! changed as the page's [`NextRequest`] says, and the URLs it was sent to.
//!
//! A next URL on another origin than the first request's is refused here too, not only where
//! the pager found it: a page's next request may come from elsewhere (a stored position).

use reqwest::Url;
use serde_json::Value;

use crate::failure::{ErrorClass, Failure, Next};
use crate::handler::paginate::{check_origin, set_body_path, set_query, NextError, NextRequest};
use crate::setting::Setting;

/// What a page's request is made of, and the URLs it was sent to (filled in by
/// [`HttpHandler::exchange`]).
pub(super) struct PageTarget<'a> {
    pub(super) next: Option<&'a NextRequest>,
    /// The URL of the ID's first request: another origin is refused.
    pub(super) first: Option<Url>,
    /// The URL the page's request went to: a relative next URL is joined to it.
    pub(super) sent: Option<Url>,
}

impl PageTarget<'_> {
    /// The page's URL, from the first request's.
    pub(super) fn url(&mut self, first: Url) -> Result<Url, Failure> {
        let url = match self.next {
            Some(NextRequest::Url(next)) => {
                let next = Url::parse(next).map_err(|e| {
                    paging_failure(NextError::BadUrl {
                        url: next.clone(),
                        reason: e.to_string(),
                    })
                })?;
                check_origin(&first, &next).map_err(paging_failure)?;
                next
            }
            Some(NextRequest::Query(pairs)) => set_query(&first, pairs),
            Some(NextRequest::Body(_)) | None => first.clone(),
        };
        self.first = Some(first);
        self.sent = Some(url.clone());
        Ok(url)
    }

    /// The page's body, from the first request's (`{}` without one when fields are set).
    pub(super) fn body(&self, body: Option<String>) -> Result<Option<String>, Failure> {
        let Some(NextRequest::Body(fields)) = self.next else {
            return Ok(body);
        };
        let mut value = match &body {
            None => Value::Object(Default::default()),
            Some(text) => serde_json::from_str(text).map_err(|e| {
                Failure::permanent(format!(
                    "the next page's cursor goes into the request's body, which is not JSON \
                     ({e})"
                ))
                .class(ErrorClass::Request)
            })?,
        };
        for (path, field) in fields {
            set_body_path(&mut value, path, field.clone());
        }
        Ok(Some(value.to_string()))
    }
}

/// Why a page's items or next request could not be read, as the ID's failure for good: an
/// items program that fails is an answer the job's programs refuse (class `invalid`);
/// anything about the next request is the paging's (class `pagination`).
pub(crate) fn paging_failure(e: NextError) -> Failure {
    let class = match &e {
        NextError::Program {
            what: Setting::Items,
            ..
        } => ErrorClass::Invalid,
        _ => ErrorClass::Pagination,
    };
    Failure {
        next: Next::Permanent,
        class,
        status: None,
        message: e.to_string(),
    }
}
