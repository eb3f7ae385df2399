//! The pages of a paginated ID's answer as a store keeps them ([`PageRecord`]), and where an
//! ID's pages stand ([`PageMark`]): how many are stored and the request for the next one.
//!
//! A page is keyed by its ID, its generation (0 for the job's own run, `k` for rerun `k`,
//! which asks for every page again) and its number, from 0: written again under the same key,
//! it replaces the earlier page. A store makes an ID's pages durable as a prefix (page `n`
//! durable means pages `0..n` of its generation are) and before any record written after
//! them, so that the last page durable is where the ID's pages stand after a crash, and a
//! final record that counts `n` pages ([`super::ItemRecord::pages`]) finds all of them.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::handler::paginate::NextRequest;
use crate::meter::Usage;

/// One page of an ID's answer: the items kept of it, and where the ID's pages stand after it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PageRecord {
    /// The row of the ID's first occurrence.
    pub row: u64,
    /// The bucket the ID belongs to.
    pub bucket: u64,
    /// 0 for the job's own run, `k` for rerun `k`.
    pub generation: u32,
    /// Where the ID's pages stand once this page is stored.
    pub mark: PageMark,
    /// The items kept of the page, as one JSON array.
    pub items: Box<RawValue>,
}

/// Where an ID's pages stand after a page: which page it was, its items, and the request for
/// the next one (none: the page was the last), with the totals of the ID's attempts so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageMark {
    /// The page's number, from 0.
    pub page: u32,
    /// The items kept of the page.
    pub count: u32,
    /// The items kept of the earlier pages.
    pub items_before: u64,
    /// The request for the next page; none when this page was the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<NextRequest>,
    /// Attempts made for the ID's pages so far (this page's included).
    pub attempts: u32,
    /// What the ID's calls cost so far, when their answers said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// When the ID's first attempt started (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_attempt_ms: Option<u64>,
}

impl PageMark {
    /// The pages stored once this one is.
    pub fn pages(&self) -> u32 {
        self.page + 1
    }

    /// The items kept of the pages stored once this one is.
    pub fn items(&self) -> u64 {
        self.items_before + u64::from(self.count)
    }
}
