//! A paginated job's items: the pages of one ID's answer followed one request at a time,
//! their items joined, in order, into the ID's result.
//!
//! Each page is one request through every gate of an attempt ([`ItemTask::attempt`]: the
//! rate limit, the quotas, the announced limits, the credentials, the concurrency) with a
//! retry policy of its own: a page that fails is retried alone, with a fresh backoff and its
//! own attempts and retry time, never the ID's earlier pages. A page that fails for good
//! fails the ID, its error naming the page. The record's attempts, attempt notes and usage
//! are the sum over the ID's pages.
//!
//! Guard rails, each failing the ID alone (class `pagination`) while the job goes on:
//! - a next request the ID followed already (the same URL, cursor or change of the first
//!   request): the pages loop;
//! - a page number or offset whose page has the same items as the page before (the API
//!   ignores the parameter, and every page would be the first);
//! - more pages than the job's most.
//!
//! Where the pages go depends on the store:
//! - a store that keeps pages ([`crate::store::Store::keeps_pages`]) is handed each page as
//!   it comes, through the writer (so a page is durable before the ID's final record, and
//!   with the results around it), with where the ID's pages stand after it
//!   ([`PageMark`]); the final record counts the pages and holds no body. An ID whose run
//!   stopped mid-way continues, on resume, at the page after its last durable one, with the
//!   next request stored with that page: never at the first;
//! - any other store gets the items joined into the ID's body, held until its last page (at
//!   most [`MAX_HELD_BYTES`]); a run stopped mid-ID asks for its pages again from the first.
//!
//! A fleet's worker whose lease on the ID's bucket is lost mid-ID asks for no more of its
//! pages: the bucket's new owner continues the ID from its durable pages.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use serde_json::value::RawValue;
use xxhash_rust::xxh3::xxh3_64;

use super::item::Item;
use super::worker::{AttemptState, ItemTask, StoredPages};
use super::writer::WriterMsg;
use crate::failure::{AttemptNote, ErrorClass, Failure};
use crate::handler::paginate::{NextRequest, PageStyle, PaginateSpec};
use crate::handler::{Handler, Output, PageAt};
use crate::meter::Usage;
use crate::progress::Counters;
use crate::retry::{self, ItemOutcome};
use crate::setting::Setting;
use crate::store::{PageMark, PageRecord};

/// The most bytes of items held for one ID.
pub(crate) const MAX_HELD_BYTES: usize = 64 << 20;

/// The most attempt notes kept in an ID's record over all its pages (the latest).
const MAX_NOTES: usize = 64;

impl<H: Handler> ItemTask<H> {
    /// Every page of `item`'s answer as `spec` says, from where its stored pages stand: the
    /// outcome, and the pages the store keeps as its result (none: the result is a body).
    pub(super) async fn pages(
        &self,
        state: &AttemptState<'_, '_>,
        item: &Item,
        spec: &PaginateSpec,
    ) -> (ItemOutcome, Option<StoredPages>) {
        let handler = &*self.handler;
        let (id, row) = (item.id.as_str(), item.values.as_deref());
        let mut joined = Joined::default();
        let mut guard = Guard::new(spec);
        // Where the ID's stored pages stand, if it has any (a resume continues there).
        let mut at = PageAt::default();
        let mut first_attempt_ms = None;
        if let Some(mark) = item.resume.as_deref() {
            joined.attempts = mark.attempts;
            joined.usage = mark.usage;
            first_attempt_ms = mark.first_attempt_ms;
            match &mark.next {
                // Its last page is durable and its record was not: nothing to ask.
                None => {
                    let stored = StoredPages {
                        pages: mark.pages(),
                        first_attempt_ms,
                    };
                    return (joined.done(), Some(stored));
                }
                Some(next) => {
                    at = PageAt {
                        page: mark.pages(),
                        items_before: mark.items(),
                        next: Some(next.clone()),
                    }
                }
            }
        }
        loop {
            let outcome = retry::run(
                &self.spec.retry,
                |attempt| self.attempt(state, attempt, || handler.call_page(id, row, &at)),
                self.stop.stopping(),
            )
            .await;
            let page = match outcome {
                ItemOutcome::Abandoned => return (ItemOutcome::Abandoned, None),
                ItemOutcome::Failed {
                    error,
                    attempts,
                    errors,
                } => {
                    joined.attempted(attempts, errors);
                    let error = Failure {
                        message: format!("page {}: {}", at.page + 1, error.message),
                        ..error
                    };
                    return (joined.failed(error), None);
                }
                ItemOutcome::Ok {
                    output,
                    attempts,
                    errors,
                } => {
                    joined.attempted(attempts, errors);
                    output
                }
            };
            Counters::add(&self.counters.pages, 1);
            joined.status = page.status.or(joined.status);
            if let Some(u) = page.usage {
                joined.usage = Some(joined.usage.unwrap_or_default() + u);
            }
            if first_attempt_ms.is_none() {
                first_attempt_ms = Some(state.first_at.load(Relaxed)).filter(|&t| t > 0);
            }
            if let Some(next) = &page.next {
                if let Err(e) = guard.check(&at, &page.items, page.count, next) {
                    return (joined.failed(e), None);
                }
            }
            let stored = if self.keeps_pages {
                let mark = PageMark {
                    page: at.page,
                    count: page.count,
                    items_before: at.items_before,
                    next: page.next.clone(),
                    attempts: joined.attempts,
                    usage: joined.usage,
                    first_attempt_ms,
                };
                let record = PageRecord {
                    row: item.row,
                    bucket: item.bucket,
                    generation: self.rerun.unwrap_or(0),
                    mark,
                    items: page.items,
                };
                let id = item.id.clone();
                let page = Box::new(record);
                self.to_writer(WriterMsg::Page { id, page }).await;
                Some(StoredPages {
                    pages: at.page + 1,
                    first_attempt_ms,
                })
            } else {
                if let Err(e) = joined.push(page.items_inner()) {
                    return (joined.failed(e), None);
                }
                None
            };
            match page.next {
                None => return (joined.done(), stored),
                Some(next) => at = at.after(page.count, next),
            }
            // The bucket's lease lost mid-ID: its new owner continues the ID.
            if let Some(lease) = item.lease.as_ref().filter(|l| !self.fleet.holds(l)) {
                tracing::debug!(id, ?lease.scope, "pages left to the bucket's new owner");
                return (ItemOutcome::Abandoned, None);
            }
        }
    }
}

/// An ID's pages so far: its items joined, and what its attempts add up to.
#[derive(Default)]
struct Joined {
    /// `[` and the items so far, comma-joined.
    items: String,
    attempts: u32,
    errors: Vec<AttemptNote>,
    status: Option<u16>,
    usage: Option<Usage>,
}

impl Joined {
    fn attempted(&mut self, attempts: u32, errors: Vec<AttemptNote>) {
        self.attempts = self.attempts.saturating_add(attempts);
        self.errors.extend(errors);
        if self.errors.len() > MAX_NOTES {
            self.errors.drain(..self.errors.len() - MAX_NOTES);
        }
    }

    /// Add a page's items (the inside of its array).
    fn push(&mut self, inner: &str) -> Result<(), Failure> {
        if self.items.is_empty() {
            self.items.push('[');
        }
        if inner.is_empty() {
            return Ok(());
        }
        if self.items.len() + 1 + inner.len() + 1 > MAX_HELD_BYTES {
            return Err(Failure::permanent(format!(
                "its items pass {} MiB, more than one ID's result holds",
                MAX_HELD_BYTES >> 20
            ))
            .class(ErrorClass::Pagination));
        }
        if self.items.len() > 1 {
            self.items.push(',');
        }
        self.items.push_str(inner);
        Ok(())
    }

    fn done(mut self) -> ItemOutcome {
        if self.items.is_empty() {
            self.items.push('[');
        }
        self.items.push(']');
        let result = RawValue::from_string(self.items).expect("items are JSON values");
        ItemOutcome::Ok {
            output: Output {
                result,
                status: self.status,
                usage: self.usage,
            },
            attempts: self.attempts,
            errors: self.errors,
        }
    }

    fn failed(self, error: Failure) -> ItemOutcome {
        ItemOutcome::Failed {
            error,
            attempts: self.attempts,
            errors: self.errors,
        }
    }
}

/// The guard rails of one ID's pages (see the module doc).
struct Guard {
    max_pages: u32,
    /// A page number or offset: a page like the one before is the API ignoring it.
    counted: bool,
    /// Each next request followed (hashed), with the page that gave it (from 0).
    followed: HashMap<u64, u32>,
    /// The items of the page before (hashed), for `counted`.
    last_items: Option<u64>,
}

impl Guard {
    fn new(spec: &PaginateSpec) -> Guard {
        Guard {
            max_pages: spec.max_pages,
            counted: matches!(
                spec.style,
                PageStyle::Page { .. } | PageStyle::Offset { .. }
            ),
            followed: HashMap::new(),
            last_items: None,
        }
    }

    /// May the page after `at` (which kept `count` items, `items`) be asked for with
    /// `next`?
    fn check(
        &mut self,
        at: &PageAt,
        items: &RawValue,
        count: u32,
        next: &NextRequest,
    ) -> Result<(), Failure> {
        let failure = |message: String| Failure::permanent(message).class(ErrorClass::Pagination);
        let this = at.page + 1;
        if this >= self.max_pages {
            return Err(failure(format!(
                "page {this} has a next page, and {} is {}: its items after page {this} were \
                 not asked for",
                Setting::MaxPages,
                self.max_pages
            )));
        }
        if self.counted && count > 0 {
            let hash = xxh3_64(items.get().as_bytes());
            if self.last_items == Some(hash) {
                return Err(failure(format!(
                    "page {this} has the same items as page {}: the API does not seem to read \
                     the page's {} ({})",
                    this - 1,
                    Setting::PageParam,
                    describe(next)
                )));
            }
            self.last_items = Some(hash);
        }
        let key = xxh3_64(canonical(next).as_bytes());
        if let Some(earlier) = self.followed.insert(key, at.page) {
            return Err(failure(format!(
                "page {this}'s next page ({}) was already followed after page {}: the pages \
                 loop",
                describe(next),
                earlier + 1
            )));
        }
        Ok(())
    }
}

/// A next request's text, the same for the same request: a URL without its fragment.
fn canonical(next: &NextRequest) -> String {
    match next {
        NextRequest::Url(url) => {
            let url = url.split('#').next().unwrap_or(url);
            format!("url {url}")
        }
        other => serde_json::to_string(other).expect("a next request serializes"),
    }
}

/// A next request, for messages.
fn describe(next: &NextRequest) -> String {
    const MOST: usize = 200;
    let text = match next {
        NextRequest::Url(url) => url.clone(),
        NextRequest::UrlKeeping { url, first } => {
            format!("{url} (with {} of the first request)", first.join(", "))
        }
        NextRequest::Query(pairs) => pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&"),
        NextRequest::Body(fields) => fields
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    match text.char_indices().nth(MOST) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}
