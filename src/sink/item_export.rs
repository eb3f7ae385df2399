//! The per-item JSONL and CSV exports: a job's final results, one row per item of each ID
//! ([`super::items`]), in input order and each ID's items in order, with their fields
//! ([`ITEM_COLUMNS`]), written to a stream or to a file replaced atomically (a Parquet export
//! is sent to [`super::parquet`]). Rows are written as the pages are read: an ID's items are
//! never held together.

use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;
use serde_json::value::RawValue;

use super::atomic::replace_atomically;
use super::columns::InputColumns;
use super::export::{csv_io, ExportFormat};
use super::items::{job_pages, status_name, EachItem, Item, ItemRows, ITEM_COLUMNS};
use super::parquet;
use super::records::stream;
use crate::store::{ExportError, ItemRecord, ItemStatus, Store};

/// A per-item JSON line.
#[derive(Serialize)]
struct ItemLine<'a> {
    id: &'a str,
    item_index: Option<u64>,
    page: Option<u32>,
    status: ItemStatus,
    http_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    item: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_class: Option<String>,
    attempts: u32,
    bucket: u64,
    /// The rerun that wrote the ID's record, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    rerun: Option<u32>,
    /// The input columns carried ([`InputColumns`]).
    #[serde(flatten)]
    input: serde_json::Map<String, serde_json::Value>,
}

/// Write every final result of `store` (with status `only`, if given) to `out`, one row per
/// item ([`crate::sink::ITEM_COLUMNS`]): a paginated ID's items in order, each with its index
/// among them (from 0) and its page; an ID of a job that does not page, its body as item 0;
/// an ID without items (failed, or paginated with none), one row without an item. Rows are
/// written as the pages are read, never joined. Returns the number of rows.
pub async fn export_items(
    store: &impl Store,
    format: ExportFormat,
    only: Option<ItemStatus>,
    columns: &InputColumns,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let paged = job_pages(store).await?;
    let count = match format {
        ExportFormat::Jsonl => {
            let mut lines = ItemLines {
                out: &mut *out,
                columns,
                count: 0,
            };
            stream(store, only, &mut EachItem::new(&mut lines, paged)).await?;
            lines.count
        }
        ExportFormat::Csv => {
            let mut w = csv::Writer::from_writer(&mut *out);
            let header = ITEM_COLUMNS[..10].iter().copied();
            w.write_record(header.chain(columns.names().iter().map(String::as_str)))
                .map_err(csv_io)?;
            let mut rows = ItemCsv {
                w,
                columns,
                count: 0,
            };
            stream(store, only, &mut EachItem::new(&mut rows, paged)).await?;
            rows.w.flush()?;
            rows.count
        }
        ExportFormat::Parquet => {
            return Err(ExportError::Write(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a Parquet export is written to a file, not to a stream",
            )))
        }
    };
    out.flush()?;
    Ok(count)
}

/// [`export_items`] to `path`, replacing it atomically. Returns the number of rows.
pub async fn export_items_to_file(
    store: &impl Store,
    format: ExportFormat,
    only: Option<ItemStatus>,
    columns: &InputColumns,
    path: &Path,
) -> Result<u64, ExportError> {
    if format == ExportFormat::Parquet {
        let compression = Default::default();
        return parquet::export_items_to_file(store, only, compression, columns, path).await;
    }
    replace_atomically(path, async |out| {
        export_items(store, format, only, columns, out).await
    })
    .await
}

/// The per-item JSONL export: a row per line.
struct ItemLines<'a> {
    out: &'a mut dyn Write,
    columns: &'a InputColumns,
    count: u64,
}

impl ItemRows for ItemLines<'_> {
    fn row(&mut self, id: &str, r: &ItemRecord, item: Option<Item<'_>>) -> io::Result<()> {
        let line = ItemLine {
            id,
            item_index: item.map(|i| i.index),
            page: item.and_then(|i| i.page),
            status: r.status,
            http_status: r.http_status,
            item: item.map(|i| i.value),
            error: r.error.as_deref(),
            error_class: r.class.map(|c| c.to_string()),
            attempts: r.attempts,
            bucket: r.bucket,
            rerun: r.rerun,
            input: self.columns.values(r),
        };
        serde_json::to_writer(&mut *self.out, &line).map_err(io::Error::from)?;
        self.out.write_all(b"\n")?;
        self.count += 1;
        Ok(())
    }
}

/// The per-item CSV export: a row per item, `item` and `error` as JSON text.
struct ItemCsv<'a, W: Write> {
    w: csv::Writer<W>,
    columns: &'a InputColumns,
    count: u64,
}

impl<W: Write> ItemRows for ItemCsv<'_, W> {
    fn row(&mut self, id: &str, r: &ItemRecord, item: Option<Item<'_>>) -> io::Result<()> {
        let text = |n: Option<String>| n.unwrap_or_default();
        let error = r
            .error
            .as_deref()
            .map(|e| serde_json::to_string(e).expect("strings serialize"));
        let mut fields = vec![
            id.to_string(),
            text(item.map(|i| i.index.to_string())),
            text(item.and_then(|i| i.page).map(|p| p.to_string())),
            status_name(r.status).to_string(),
            text(r.http_status.map(|s| s.to_string())),
            text(item.map(|i| i.value.get().to_string())),
            text(error),
            text(r.class.map(|c| c.to_string())),
            r.attempts.to_string(),
            r.bucket.to_string(),
        ];
        fields.extend(
            self.columns
                .texts(r)
                .into_iter()
                .map(Option::unwrap_or_default),
        );
        self.w.write_record(&fields).map_err(csv_io)?;
        self.count += 1;
        Ok(())
    }
}
