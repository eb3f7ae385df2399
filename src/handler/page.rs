//! One page of a paginated ID's answer: which page a call asks for ([`PageAt`]) and what
//! its answer gave ([`Page`]): the items kept of it and the request for the next page.

use serde_json::value::RawValue;

use super::answered::Answered;
use super::paginate::NextRequest;
use crate::meter::Usage;

/// Which page of an ID's answer a call asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageAt {
    /// The page's number, from 0.
    pub page: u32,
    /// The items kept of the earlier pages.
    pub items_before: u64,
    /// The request for the page, as a change of the ID's first request; none for the first
    /// page.
    pub next: Option<NextRequest>,
}

impl PageAt {
    /// The page after this one, which asks `next`, this one having kept `count` items.
    pub fn after(&self, count: u32, next: NextRequest) -> PageAt {
        PageAt {
            page: self.page + 1,
            items_before: self.items_before + u64::from(count),
            next: Some(next),
        }
    }
}

/// One page's answer: the items kept of it, and the request for the next page.
#[derive(Debug, Clone)]
pub struct Page {
    /// The items kept of the page, as one JSON array.
    pub items: Box<RawValue>,
    /// How many items the array holds.
    pub count: u32,
    /// The request for the next page; none when this page was the last.
    pub next: Option<NextRequest>,
    /// The page's HTTP status, when it had one.
    pub status: Option<u16>,
    /// What the page's call cost, when its answer said.
    pub usage: Option<Usage>,
}

impl Page {
    /// The items of the array, without its brackets: the text that joins (with a comma)
    /// into the array of an ID's items. Empty for an empty page.
    pub fn items_inner(&self) -> &str {
        let text = self.items.get().trim();
        text.strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .map_or("", str::trim)
    }
}

impl Answered for Page {
    fn status(&self) -> Option<u16> {
        self.status
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(items: &str, count: u32) -> Page {
        Page {
            items: RawValue::from_string(items.to_string()).unwrap(),
            count,
            next: None,
            status: Some(200),
            usage: None,
        }
    }

    #[test]
    fn a_pages_items_join_without_their_brackets() {
        assert_eq!(
            page(r#"[{"k":0},{"k":1}]"#, 2).items_inner(),
            r#"{"k":0},{"k":1}"#
        );
        assert_eq!(page("[ ]", 0).items_inner(), "");
        assert_eq!(page("[]", 0).items_inner(), "");
    }

    #[test]
    fn the_page_after_counts_the_items_before_it() {
        let first = PageAt::default();
        let next = NextRequest::Query(vec![("page".into(), "2".into())]);
        let second = first.after(50, next.clone());
        assert_eq!((second.page, second.items_before), (1, 50));
        assert_eq!(second.next, Some(next.clone()));
        assert_eq!(second.after(20, next).items_before, 70);
    }
}
