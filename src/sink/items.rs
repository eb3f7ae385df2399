//! One row per item: how a per-item export cuts each ID's result into its items, the same for
//! every format (JSON lines and CSV in [`super::item_export`], Parquet in
//! [`super::parquet`]).
//!
//! The rows each ID gives, so that none leaves the export silently:
//!
//! - a paginated ID's items, read from its pages a range at a time and never joined: a row
//!   per item, numbered from 0 across its pages in order (`item_index`), each with the number
//!   of the page it came on (`page`, from 0);
//! - a paginated ID whose result was kept as its body (a store that keeps no pages): a row
//!   per item of that array, with no page number;
//! - an ID of a job that does not page, with a body: one row, its body as the item, index 0;
//! - an ID with no item (a failed ID, or a paginated ID whose pages held none): one row with
//!   no item, no index and no page, and its status (and error) as in the per-ID export.

use std::io;

use serde_json::value::RawValue;

use super::records::Rows;
use crate::spec::JobSpec;
use crate::store::{ExportError, FinalVisit, ItemRecord, ItemStatus, Store, StoreError};

/// The columns of a per-item export, in order, for every format (the JSONL export adds
/// `rerun` when it has a value; the CSV and Parquet exports have the first ten).
pub const ITEM_COLUMNS: [&str; 11] = [
    "id",
    "item_index",
    "page",
    "status",
    "http_status",
    "item",
    "error",
    "error_class",
    "attempts",
    "bucket",
    "rerun",
];

/// One item of an ID's result.
#[derive(Clone, Copy)]
pub(super) struct Item<'a> {
    /// Its place among the ID's items, from 0, in order across its pages.
    pub(super) index: u64,
    /// The page it came on, from 0 (none for a result kept as a body).
    pub(super) page: Option<u32>,
    /// The item itself.
    pub(super) value: &'a RawValue,
}

/// A per-item export's writer of rows.
pub(super) trait ItemRows {
    /// Write the row of `item` of `id`, or the ID's one row without an item. `record` is the
    /// ID's record: its fields other than its result are the row's.
    fn row(&mut self, id: &str, record: &ItemRecord, item: Option<Item<'_>>) -> io::Result<()>;
}

/// A status as the CSV and Parquet rows write it.
pub(super) fn status_name(status: ItemStatus) -> &'static str {
    match status {
        ItemStatus::Ok => "ok",
        ItemStatus::Failed => "failed",
        ItemStatus::Pending => "pending",
    }
}

/// Whether the job in `store` pages: a result it kept as a body is then its items.
pub(super) async fn job_pages(store: &impl Store) -> Result<bool, ExportError> {
    let Some(job) = store.job().await? else {
        return Ok(false);
    };
    Ok(JobSpec::from_stored(&job)?.work.paginate().is_some())
}

/// Each final record cut into the rows of its items, handed to `rows` (see the module doc).
pub(super) struct EachItem<'r, R: ItemRows> {
    rows: &'r mut R,
    /// The job pages: a result kept as a body is an array of items.
    paged: bool,
    /// The paginated record begun: its ID, its record and the index of its next item.
    open: Option<(String, ItemRecord, u64)>,
}

impl<'r, R: ItemRows> EachItem<'r, R> {
    pub(super) fn new(rows: &'r mut R, paged: bool) -> Self {
        EachItem {
            rows,
            paged,
            open: None,
        }
    }

    /// A record whose result is in it: its body's items in a job that pages, else its body
    /// as one item; one row without an item if it has none.
    fn whole(&mut self, id: &str, record: &ItemRecord) -> io::Result<()> {
        let Some(body) = record.body.as_deref() else {
            return self.rows.row(id, record, None);
        };
        let items = self
            .paged
            .then(|| serde_json::from_str::<Vec<&RawValue>>(body.get()).ok())
            .flatten();
        let Some(items) = items else {
            let item = Item {
                index: 0,
                page: None,
                value: body,
            };
            return self.rows.row(id, record, Some(item));
        };
        if items.is_empty() {
            return self.rows.row(id, record, None);
        }
        for (index, value) in (0..).zip(items) {
            let item = Item {
                index,
                page: None,
                value,
            };
            self.rows.row(id, record, Some(item))?;
        }
        Ok(())
    }
}

impl<R: ItemRows> Rows for EachItem<'_, R> {
    fn row(&mut self, id: &str, record: &ItemRecord) -> io::Result<()> {
        self.whole(id, record)
    }
}

impl<R: ItemRows> FinalVisit for EachItem<'_, R> {
    fn record(&mut self, id: &str, record: &ItemRecord) -> Result<(), ExportError> {
        Ok(self.whole(id, record)?)
    }

    fn begin(&mut self, id: &str, record: &ItemRecord) -> Result<(), ExportError> {
        self.open = Some((id.to_string(), record.clone(), 0));
        Ok(())
    }

    fn items(&mut self, page: u32, inner: &str) -> Result<(), ExportError> {
        let (id, record, next) = self.open.as_mut().expect("items come after begin");
        let array = format!("[{inner}]");
        let values: Vec<&RawValue> = serde_json::from_str(&array).map_err(|e| {
            StoreError::corrupt(format!("{id:?}: the items of its page {page}: {e}"))
        })?;
        for value in values {
            let item = Item {
                index: *next,
                page: Some(page),
                value,
            };
            self.rows.row(id, record, Some(item))?;
            *next += 1;
        }
        Ok(())
    }

    fn end(&mut self) -> Result<(), ExportError> {
        let (id, record, next) = self.open.take().expect("end comes after begin");
        if next == 0 {
            self.rows.row(&id, &record, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row handed on: ID, index, page, item.
    type SeenRow = (String, Option<u64>, Option<u32>, Option<String>);

    /// The rows handed on.
    #[derive(Default)]
    struct Seen(Vec<SeenRow>);

    impl ItemRows for Seen {
        fn row(&mut self, id: &str, _: &ItemRecord, item: Option<Item<'_>>) -> io::Result<()> {
            let value = item.map(|i| i.value.get().to_string());
            self.0.push((
                id.to_string(),
                item.map(|i| i.index),
                item.and_then(|i| i.page),
                value,
            ));
            Ok(())
        }
    }

    fn with_body(body: Option<&str>) -> ItemRecord {
        let mut r = ItemRecord::pending(0, 0);
        r.status = if body.is_some() {
            ItemStatus::Ok
        } else {
            ItemStatus::Failed
        };
        r.body = body.map(|b| RawValue::from_string(b.to_string()).unwrap());
        r
    }

    fn row(id: &str, index: Option<u64>, page: Option<u32>, item: Option<&str>) -> Seen {
        Seen(vec![(id.into(), index, page, item.map(String::from))])
    }

    #[test]
    fn a_paginated_ids_items_are_numbered_across_its_pages_and_one_without_any_has_a_row() {
        let mut seen = Seen::default();
        let mut each = EachItem::new(&mut seen, true);
        let r = with_body(None);
        each.begin("a", &r).unwrap();
        each.items(0, r#"{"k":0}, {"k":1}"#).unwrap();
        each.items(2, r#"{"k":2}"#).unwrap();
        each.end().unwrap();
        each.begin("empty", &r).unwrap();
        each.end().unwrap();
        assert_eq!(
            seen.0,
            [
                ("a".into(), Some(0), Some(0), Some(r#"{"k":0}"#.into())),
                ("a".into(), Some(1), Some(0), Some(r#"{"k":1}"#.into())),
                ("a".into(), Some(2), Some(2), Some(r#"{"k":2}"#.into())),
                ("empty".into(), None, None, None),
            ]
        );
    }

    #[test]
    fn a_body_is_one_item_unless_the_job_pages_and_a_failed_id_has_a_row_without_one() {
        let cases: [(bool, Option<&str>, Seen); 5] = [
            (false, Some("[1,2]"), row("x", Some(0), None, Some("[1,2]"))),
            (false, None, row("x", None, None, None)),
            (true, None, row("x", None, None, None)),
            (true, Some("[]"), row("x", None, None, None)),
            (
                true,
                Some("[1, {\"a\":2}]"),
                Seen(vec![
                    ("x".into(), Some(0), None, Some("1".into())),
                    ("x".into(), Some(1), None, Some("{\"a\":2}".into())),
                ]),
            ),
        ];
        for (paged, body, want) in cases {
            let mut seen = Seen::default();
            let r = with_body(body);
            EachItem::new(&mut seen, paged).record("x", &r).unwrap();
            assert_eq!(seen.0, want.0, "paged {paged}, body {body:?}");
        }
    }
}
