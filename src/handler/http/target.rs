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
            Some(NextRequest::Url(next)) => next_url(&first, next)?,
            Some(NextRequest::UrlKeeping { url, first: kept }) => {
                let next = next_url(&first, url)?;
                let pairs: Vec<(String, String)> = first
                    .query_pairs()
                    .filter(|(name, _)| kept.iter().any(|k| k == name))
                    .map(|(n, v)| (n.into_owned(), v.into_owned()))
                    .collect();
                let mut next = next;
                {
                    let mut query = next.query_pairs_mut();
                    for (name, value) in &pairs {
                        query.append_pair(name, value);
                    }
                }
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

/// `next` as it is kept with its page: a next URL that repeats query parameters of the first
/// request (name and value) takes them from the first request instead
/// ([`NextRequest::UrlKeeping`]), so that a secret the URL template put there (an API key) is
/// not kept; a next request that still carries one of the job's secrets is refused: it
/// would be stored.
pub(super) fn storable(
    next: NextRequest,
    first: &Url,
    secrets: &crate::secrets::Secrets,
) -> Result<NextRequest, Failure> {
    let next = match next {
        NextRequest::Url(text) => match Url::parse(&text) {
            Ok(url) => {
                let firsts: Vec<(String, String)> = first
                    .query_pairs()
                    .map(|(n, v)| (n.into_owned(), v.into_owned()))
                    .collect();
                let repeats = |n: &str, v: &str| firsts.iter().any(|(fnm, fv)| fnm == n && fv == v);
                let pairs: Vec<(String, String)> = url
                    .query_pairs()
                    .map(|(n, v)| (n.into_owned(), v.into_owned()))
                    .collect();
                let mut kept: Vec<String> = Vec::new();
                for (n, v) in &pairs {
                    if repeats(n, v) && !kept.contains(n) {
                        kept.push(n.clone());
                    }
                }
                if kept.is_empty() {
                    NextRequest::Url(text)
                } else {
                    let mut bare = url.clone();
                    bare.set_query(None);
                    let rest: Vec<&(String, String)> =
                        pairs.iter().filter(|(n, _)| !kept.contains(n)).collect();
                    if !rest.is_empty() {
                        let mut query = bare.query_pairs_mut();
                        for (n, v) in rest {
                            query.append_pair(n, v);
                        }
                    }
                    NextRequest::UrlKeeping {
                        url: bare.to_string(),
                        first: kept,
                    }
                }
            }
            Err(_) => NextRequest::Url(text),
        },
        other => other,
    };
    let text = serde_json::to_string(&next).expect("a next request serializes");
    if secrets.mask(&text) != text {
        return Err(Failure {
            next: Next::Permanent,
            class: ErrorClass::Pagination,
            status: None,
            message: format!(
                "the next page's request carries one of the job's secrets where the first \
                 request does not have it ({}): it is not stored",
                secrets.mask(&text)
            ),
        });
    }
    Ok(next)
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

/// A next URL the API gave, parsed and on the first request's origin.
fn next_url(first: &Url, next: &str) -> Result<Url, Failure> {
    let parsed = Url::parse(next).map_err(|e| {
        paging_failure(NextError::BadUrl {
            url: next.to_string(),
            reason: e.to_string(),
        })
    })?;
    check_origin(first, &parsed).map_err(paging_failure)?;
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::Secrets;

    fn secrets() -> Secrets {
        let s = Secrets::new();
        s.add("k-0123456789abcdef");
        s
    }

    #[test]
    fn a_next_url_repeating_a_first_parameter_takes_it_from_the_first_request() {
        let first =
            Url::parse("https://api.test/u/1/repos?per_page=50&key=k-0123456789abcdef").unwrap();
        let next = NextRequest::Url(
            "https://api.test/u/1/repos?page=2&per_page=50&key=k-0123456789abcdef".into(),
        );
        let kept = storable(next, &first, &secrets()).unwrap();
        assert_eq!(
            kept,
            NextRequest::UrlKeeping {
                url: "https://api.test/u/1/repos?page=2".into(),
                first: vec!["per_page".into(), "key".into()],
            }
        );
        // Asked for, it has the first request's values again.
        let mut target = PageTarget {
            next: Some(&kept),
            first: None,
            sent: None,
        };
        let url = target.url(first.clone()).unwrap();
        assert_eq!(
            url.as_str(),
            "https://api.test/u/1/repos?page=2&per_page=50&key=k-0123456789abcdef"
        );
        // Nothing repeated: kept as it is.
        let plain = NextRequest::Url("https://api.test/u/1/repos?page=3".into());
        assert_eq!(storable(plain.clone(), &first, &secrets()).unwrap(), plain);
    }

    #[test]
    fn a_next_request_carrying_a_secret_elsewhere_is_refused_not_stored() {
        let first = Url::parse("https://api.test/u/1").unwrap();
        let cursor = NextRequest::Query(vec![("cursor".into(), "x-k-0123456789abcdef".into())]);
        let refused = storable(cursor, &first, &secrets()).unwrap_err();
        assert_eq!(refused.class, ErrorClass::Pagination);
        assert!(
            !refused.message.contains("0123456789abcdef"),
            "{}",
            refused.message
        );
        let in_path = NextRequest::Url("https://api.test/k-0123456789abcdef/2".into());
        assert!(storable(in_path, &first, &secrets()).is_err());
    }
}
