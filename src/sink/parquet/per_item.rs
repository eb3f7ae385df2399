//! The per-item Parquet export: one row per item of each ID ([`crate::sink::items`]), in
//! input order and each ID's items in order, written in row groups as the pages are read (a
//! group is cut at `ROW_GROUP_ROWS` rows or `ROW_GROUP_BYTES` of buffered values), so memory
//! stays flat however many items an ID has. Its columns:
//!
//! | column        | Parquet type          | nulls                                 |
//! |---------------|-----------------------|---------------------------------------|
//! | `id`          | BYTE_ARRAY (String)   | never                                 |
//! | `item_index`  | INT64                 | a row without an item                 |
//! | `page`        | INT64                 | no item, or not from a page           |
//! | `status`      | BYTE_ARRAY (String)   | never: `ok`, `failed`                 |
//! | `http_status` | INT32                 | no answer                             |
//! | `item`        | BYTE_ARRAY (JSON)     | a row without an item                 |
//! | `error`       | BYTE_ARRAY (String)   | ok records                            |
//! | `error_class` | BYTE_ARRAY (String)   | ok records                            |
//! | `attempts`    | INT64                 | never                                 |
//! | `bucket`      | INT64                 | never                                 |
//!
//! The input columns asked for ([`InputColumns`]) follow, each a String column.

use std::io::{self, Write};
use std::path::Path;

use parquet::basic::Type as Physical;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

use super::{
    file_writer, parquet_io, plain_type, string_type, write_group, Column, ParquetCompression,
    Values, ROW_GROUP_BYTES, ROW_GROUP_ROWS,
};
use crate::sink::atomic::replace_atomically;
use crate::sink::columns::InputColumns;
use crate::sink::items::{job_pages, status_name, EachItem, Item, ItemRows, ITEM_COLUMNS};
use crate::sink::records::stream;
use crate::store::{ExportError, ItemRecord, ItemStatus, Store};

/// Write the results of `store` (with status `only`) as Parquet to `out`, one row per item
/// (the rows of [`crate::sink::export_items`]), in row groups as the pages are read, its
/// pages compressed with `compression`. Returns the number of rows.
pub async fn export_items<W: Write + Send>(
    store: &impl Store,
    only: Option<ItemStatus>,
    compression: ParquetCompression,
    columns: &InputColumns,
    out: W,
) -> Result<u64, ExportError> {
    let groups = (ROW_GROUP_ROWS, ROW_GROUP_BYTES);
    export_items_in_groups(store, only, compression, columns, out, groups).await
}

/// [`export_items`] to `path`, replacing it atomically. Returns the number of rows.
pub async fn export_items_to_file(
    store: &impl Store,
    only: Option<ItemStatus>,
    compression: ParquetCompression,
    columns: &InputColumns,
    path: &Path,
) -> Result<u64, ExportError> {
    replace_atomically(path, async |out| {
        export_items(store, only, compression, columns, out).await
    })
    .await
}

/// [`export_items`] with row groups cut at `(rows, bytes)`.
pub(super) async fn export_items_in_groups<W: Write + Send>(
    store: &impl Store,
    only: Option<ItemStatus>,
    compression: ParquetCompression,
    columns: &InputColumns,
    out: W,
    (max_rows, max_bytes): (usize, usize),
) -> Result<u64, ExportError> {
    let paged = job_pages(store).await?;
    let (schema, buffers) = item_columns(columns);
    let mut rows = ItemTable {
        writer: file_writer(out, schema, compression)?,
        columns: buffers,
        input: columns,
        limits: (max_rows, max_bytes),
        group: (0, 0),
        count: 0,
    };
    stream(store, only, &mut EachItem::new(&mut rows, paged)).await?;
    if rows.group.0 > 0 {
        write_group(&mut rows.columns, &mut rows.writer).map_err(parquet_io)?;
    }
    rows.writer.close().map_err(parquet_io)?;
    Ok(rows.count)
}

/// The file's columns (see the module doc) and a buffer for each.
fn item_columns(input: &InputColumns) -> (Vec<Type>, Vec<Column>) {
    let [id, index, page, status, http_status, item, error, class, attempts, bucket, _] =
        ITEM_COLUMNS;
    let mut schema = vec![
        string_type(id, false, false),
        plain_type(index, Physical::INT64, true),
        plain_type(page, Physical::INT64, true),
        string_type(status, false, false),
        plain_type(http_status, Physical::INT32, true),
        string_type(item, true, true),
        string_type(error, true, false),
        string_type(class, true, false),
        plain_type(attempts, Physical::INT64, false),
        plain_type(bucket, Physical::INT64, false),
    ];
    let str = |optional| Column::new(Values::Str(Vec::new()), optional);
    let int64 = |optional| Column::new(Values::Int64(Vec::new()), optional);
    let mut columns = vec![
        str(false),
        int64(true),
        int64(true),
        str(false),
        Column::new(Values::Int32(Vec::new()), true),
        str(true),
        str(true),
        str(true),
        int64(false),
        int64(false),
    ];
    for name in input.names() {
        schema.push(string_type(name, true, false));
        columns.push(str(true));
    }
    (schema, columns)
}

/// The rows of the row group being gathered, and the file they go to.
struct ItemTable<'a, W: Write + Send> {
    writer: SerializedFileWriter<W>,
    columns: Vec<Column>,
    input: &'a InputColumns,
    /// A group is written at this many rows or bytes.
    limits: (usize, usize),
    /// The rows and bytes of the group being gathered.
    group: (usize, usize),
    count: u64,
}

impl<W: Write + Send> ItemRows for ItemTable<'_, W> {
    fn row(&mut self, id: &str, r: &ItemRecord, item: Option<Item<'_>>) -> io::Result<()> {
        let c = &mut self.columns;
        let mut bytes = 64;
        bytes += c[0].str(Some(id.as_bytes()));
        int64(&mut c[1], item.map(|i| i.index as i64));
        int64(&mut c[2], item.and_then(|i| i.page).map(i64::from));
        c[3].str(Some(status_name(r.status).as_bytes()));
        match r.http_status {
            Some(s) => {
                c[4].present();
                let Values::Int32(v) = &mut c[4].values else {
                    unreachable!("an INT32 column")
                };
                v.push(i32::from(s));
            }
            None => c[4].null(),
        }
        bytes += c[5].str(item.map(|i| i.value.get().as_bytes()));
        bytes += c[6].str(r.error.as_deref().map(str::as_bytes));
        let class = r.class.map(|k| k.to_string());
        c[7].str(class.as_deref().map(str::as_bytes));
        int64(&mut c[8], Some(i64::from(r.attempts)));
        int64(&mut c[9], Some(r.bucket as i64));
        for (col, value) in c[10..].iter_mut().zip(self.input.texts(r)) {
            bytes += col.str(value.as_deref().map(str::as_bytes));
        }
        self.count += 1;
        self.group.0 += 1;
        self.group.1 += bytes;
        if self.group.0 >= self.limits.0 || self.group.1 >= self.limits.1 {
            write_group(&mut self.columns, &mut self.writer).map_err(parquet_io)?;
            self.group = (0, 0);
        }
        Ok(())
    }
}

/// Add `value` (none: null) to an INT64 column.
fn int64(column: &mut Column, value: Option<i64>) {
    let Some(value) = value else {
        return column.null();
    };
    column.present();
    let Values::Int64(v) = &mut column.values else {
        unreachable!("an INT64 column")
    };
    v.push(value);
}
