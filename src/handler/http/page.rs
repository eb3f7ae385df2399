//! The HTTP handler's pages: one page of an ID's answer asked for (its request made in
//! `target.rs`) and its answer read into a [`Page`]: the job's answer checks, then the items
//! program, then the next request.

use reqwest::header::HeaderMap;
use serde_json::Value;

use super::target::{paging_failure, storable, PageTarget};
use super::{Fill, HttpHandler};
use crate::failure::{ErrorClass, Failure};
use crate::handler::error::HandlerError;
use crate::handler::page::{Page, PageAt};
use crate::handler::paginate::{PageSeen, Pager, PaginateSpec};
use crate::handler::template::row_values;
use crate::setting::Setting;

impl HttpHandler {
    /// Follow the pages of each ID's answer as `spec` says: its programs are compiled now.
    pub fn with_pagination(mut self, spec: &PaginateSpec) -> Result<HttpHandler, HandlerError> {
        let pager = Pager::compile(spec).map_err(|e| HandlerError::Invalid {
            what: Setting::Paginate,
            reason: e.to_string(),
        })?;
        self.pager = Some(Box::new(pager));
        Ok(self)
    }

    /// One request for the page `at` of `id`'s answer (with its input row's kept columns):
    /// the items kept of it and the request for the next page.
    pub async fn attempt_page(
        &self,
        id: &str,
        row: Option<&str>,
        at: &PageAt,
    ) -> Result<Page, Failure> {
        self.page_unmasked(id, row, at)
            .await
            .map_err(|f| self.masked(f))
    }

    async fn page_unmasked(
        &self,
        id: &str,
        row: Option<&str>,
        at: &PageAt,
    ) -> Result<Page, Failure> {
        let Some(pager) = &self.pager else {
            return Err(
                Failure::permanent("this job does not follow pages").class(ErrorClass::Request)
            );
        };
        let row = row_values(row)?;
        self.check_id(id)?;
        let mut target = PageTarget {
            next: at.next.as_ref(),
            first: None,
            sent: None,
        };
        let (status, headers, bytes) = self
            .exchange(Fill::One(id, row.as_ref()), Some(&mut target))
            .await?;
        let (Some(first), Some(sent)) = (target.first, target.sent) else {
            unreachable!("a request that was sent has its URLs");
        };
        let usage = self.answer.usage(
            Some(status),
            || headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
            &bytes,
        );
        let body = read_page(&bytes, status)?;
        // The job's checks of an answer, on each page.
        self.answer.judge(
            Some(status),
            || headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
            bytes,
        )?;
        let seen_headers = header_pairs(&headers);
        let seen = PageSeen {
            request_url: &sent,
            status,
            headers: &seen_headers,
            body: &body,
            page: at.page,
            items_before: at.items_before,
        };
        let items = pager.items(&seen).map_err(paging_failure)?;
        let count = u32::try_from(items.len()).unwrap_or(u32::MAX);
        let next = pager.next(&first, &seen, count).map_err(paging_failure)?;
        let next = next
            .map(|next| storable(next, &first, &self.secrets))
            .transpose()?;
        let items = serde_json::value::to_raw_value(&items).expect("JSON values serialize");
        Ok(Page {
            items,
            count,
            next,
            status: Some(status),
            usage,
        })
    }
}

/// A page's body as JSON: one that is not is a retryable failure (class `body`), as a
/// truncated answer would be.
fn read_page(bytes: &[u8], status: u16) -> Result<Value, Failure> {
    serde_json::from_slice(bytes.trim_ascii()).map_err(|e| {
        Failure::retry(format!(
            "a page must be JSON for its items to be read ({e}): {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(120)])
        ))
        .class(ErrorClass::Body)
        .status(status)
    })
}

/// The headers as the pager's programs see them.
fn header_pairs(headers: &HeaderMap) -> Vec<(&str, &[u8])> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect()
}
