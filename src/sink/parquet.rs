//! Parquet export: a job's results as a Parquet file, one row per unique ID, in input order.
//!
//! Owns the file's schema and its writing, streamed in row groups so memory stays flat
//! however many IDs the job has (a row group is cut at `ROW_GROUP_ROWS` rows or
//! `ROW_GROUP_BYTES` of buffered values, whichever comes first). The fixed columns:
//!
//! | column        | Parquet type                 | nulls                 |
//! |---------------|------------------------------|-----------------------|
//! | `id`          | BYTE_ARRAY (String)          | never                 |
//! | `status`      | BYTE_ARRAY (String)          | never: `ok`, `failed` |
//! | `http_status` | INT32                        | no answer             |
//! | `attempts`    | INT64                        | never                 |
//! | `bucket`      | INT64                        | never                 |
//! | `error_class` | BYTE_ARRAY (String)          | ok records            |
//! | `error`       | BYTE_ARRAY (String)          | ok records            |
//! | `usage_input` | INT64                        | no usage reported     |
//! | `usage_output`| INT64                        | no usage reported     |
//! | `body`        | BYTE_ARRAY (JSON)            | failed records        |
//!
//! The two `usage_` columns (what each ID's calls cost, [`crate::meter::Usage`]) are there
//! only for a job whose answers reported usage: the files of other jobs are as before.
//!
//! The input columns asked for ([`InputColumns`]) follow, each a String column (null for a
//! record without stored values).
//!
//! With `flatten`, a first pass over the results infers the top-level fields of the object
//! results ([`FlatSchema`]), and each becomes a column in place of `body`: INT64, DOUBLE,
//! BOOLEAN or String by the values seen (integers and floats together are DOUBLE; any other
//! disagreement, and nested values, are String, nested ones as JSON text); a record without
//! the field has null. A field named like a fixed column gets a `body_` prefix. Results that
//! are not objects keep a `body` column (null for the flattened ones), so nothing is lost.
//!
//! A per-item export (one row per item of each ID, [`export_items`]) has columns of its own,
//! in `per_item`.
//!
//! Written through `sink::replace_atomically`: a temp file, synced, then renamed.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use parquet::basic::{Compression, LogicalType, Repetition, Type as Physical};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;
use serde_json::value::RawValue;

use super::atomic::replace_atomically;
use super::columns::InputColumns;
use super::records::for_each;
use crate::store::{ExportError, ItemRecord, ItemStatus, Store};

mod per_item;

pub use per_item::{export_items, export_items_to_file};

/// Rows per row group at most.
pub(crate) const ROW_GROUP_ROWS: usize = 128 * 1024;
/// Buffered value bytes per row group at most (bodies can be large).
pub(crate) const ROW_GROUP_BYTES: usize = 32 << 20;
/// Flattened columns at most: results keyed by data (an ID per key) are not a table.
pub(crate) const MAX_FLAT_FIELDS: usize = 1000;

/// The fixed columns, in order.
pub(crate) const FIXED: [&str; 8] = [
    "id",
    "status",
    "http_status",
    "attempts",
    "bucket",
    "error_class",
    "error",
    "body",
];

/// The type a flattened field's values agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only nulls seen so far.
    Null,
    /// Integers (i64).
    Int,
    /// Numbers, some not integers (f64).
    Float,
    /// Booleans.
    Bool,
    /// Strings, or values of mixed types (as their JSON text).
    Str,
}

impl Kind {
    fn of(raw: &RawValue) -> Kind {
        let text = raw.get();
        match text.as_bytes()[0] {
            b'n' => Kind::Null,
            b't' | b'f' => Kind::Bool,
            b'"' | b'{' | b'[' => Kind::Str,
            _ if text.parse::<i64>().is_ok() => Kind::Int,
            _ if text.parse::<f64>().is_ok_and(f64::is_finite) => Kind::Float,
            _ => Kind::Str,
        }
    }

    fn join(self, other: Kind) -> Kind {
        match (self, other) {
            (a, b) if a == b => a,
            (Kind::Null, b) => b,
            (a, Kind::Null) => a,
            (Kind::Int, Kind::Float) | (Kind::Float, Kind::Int) => Kind::Float,
            _ => Kind::Str,
        }
    }
}

/// The columns `flatten` makes: the object results' top-level fields, first seen first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlatSchema {
    /// (field name in the results, column name, kind).
    pub fields: Vec<(String, String, Kind)>,
    /// Some result is not an object: a `body` column keeps those.
    pub other_bodies: bool,
}

/// A result's top-level fields in their order, borrowed where no unescaping is needed.
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Fields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut m: M,
            ) -> Result<Fields<'de>, M::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

fn fields(body: &RawValue) -> Option<Fields<'_>> {
    body.get()
        .starts_with('{')
        .then(|| serde_json::from_str(body.get()).ok())
        .flatten()
}

impl FlatSchema {
    /// Infer from every record `walk` gives.
    async fn infer(
        store: &impl Store,
        only: Option<ItemStatus>,
    ) -> Result<FlatSchema, ExportError> {
        let mut schema = FlatSchema::default();
        let mut index: HashMap<String, usize> = HashMap::new();
        walk(store, only, &mut |_, r| {
            let Some(body) = r.body.as_deref() else {
                return Ok(());
            };
            let Some(Fields(map)) = fields(body) else {
                schema.other_bodies = true;
                return Ok(());
            };
            for (name, value) in map {
                let kind = Kind::of(value);
                match index.get(name.as_ref()) {
                    Some(&i) => schema.fields[i].2 = schema.fields[i].2.join(kind),
                    None => {
                        if schema.fields.len() == MAX_FLAT_FIELDS {
                            return Err(io::Error::other(format!(
                                "the results have more than {MAX_FLAT_FIELDS} distinct top-level fields: not a table to flatten (export without flatten, or pick the fields with {})",
                                crate::setting::Setting::Extract
                            )));
                        }
                        index.insert(name.to_string(), schema.fields.len());
                        schema.fields.push((name.to_string(), String::new(), kind));
                    }
                }
            }
            Ok(())
        })
        .await?;
        // Column names: a field named like a fixed column (or like another field once
        // prefixed) gets `body_` in front until it is unique.
        let mut taken: std::collections::HashSet<String> =
            FIXED.iter().map(|s| s.to_string()).collect();
        taken.extend(schema.fields.iter().map(|f| f.0.clone()));
        for i in 0..schema.fields.len() {
            let name = schema.fields[i].0.clone();
            let column = if FIXED.contains(&name.as_str()) {
                let mut c = format!("body_{name}");
                while taken.contains(&c) {
                    c = format!("body_{c}");
                }
                taken.insert(c.clone());
                c
            } else {
                name
            };
            schema.fields[i].1 = column;
        }
        Ok(schema)
    }
}

/// One column's values of the row group being gathered.
enum Values {
    Str(Vec<ByteArray>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Double(Vec<f64>),
    Bool(Vec<bool>),
}

struct Column {
    values: Values,
    /// Definition levels (1 present, 0 null); `None` for a required column.
    defs: Option<Vec<i16>>,
}

impl Column {
    fn new(values: Values, optional: bool) -> Column {
        Column {
            values,
            defs: optional.then(Vec::new),
        }
    }

    fn null(&mut self) {
        self.defs
            .as_mut()
            .expect("only optional columns take nulls")
            .push(0);
    }

    fn present(&mut self) {
        if let Some(d) = &mut self.defs {
            d.push(1);
        }
    }

    fn str(&mut self, s: Option<&[u8]>) -> usize {
        match s {
            None => {
                self.null();
                0
            }
            Some(s) => {
                self.present();
                let Values::Str(v) = &mut self.values else {
                    unreachable!("a string column")
                };
                v.push(ByteArray::from(s.to_vec()));
                s.len()
            }
        }
    }

    fn clear(&mut self) {
        match &mut self.values {
            Values::Str(v) => v.clear(),
            Values::Int32(v) => v.clear(),
            Values::Int64(v) => v.clear(),
            Values::Double(v) => v.clear(),
            Values::Bool(v) => v.clear(),
        }
        if let Some(d) = &mut self.defs {
            d.clear();
        }
    }
}

fn string_type(name: &str, optional: bool, json: bool) -> Type {
    Type::primitive_type_builder(name, Physical::BYTE_ARRAY)
        .with_repetition(repetition(optional))
        .with_logical_type(Some(if json {
            LogicalType::Json
        } else {
            LogicalType::String
        }))
        .build()
        .expect("a valid string column")
}

fn plain_type(name: &str, physical: Physical, optional: bool) -> Type {
    Type::primitive_type_builder(name, physical)
        .with_repetition(repetition(optional))
        .build()
        .expect("a valid column")
}

fn repetition(optional: bool) -> Repetition {
    if optional {
        Repetition::OPTIONAL
    } else {
        Repetition::REQUIRED
    }
}

/// The file's columns and their buffers.
struct Table {
    schema: Vec<Type>,
    columns: Vec<Column>,
    flat: Option<FlatSchema>,
    body: bool,
    /// The `usage_input` and `usage_output` columns are there (after `error`).
    usage: bool,
    input: InputColumns,
}

impl Table {
    fn new(flat: Option<FlatSchema>, input: InputColumns, usage: bool) -> Table {
        let mut schema = vec![
            string_type("id", false, false),
            string_type("status", false, false),
            plain_type("http_status", Physical::INT32, true),
            plain_type("attempts", Physical::INT64, false),
            plain_type("bucket", Physical::INT64, false),
            string_type("error_class", true, false),
            string_type("error", true, false),
        ];
        let mut columns = vec![
            Column::new(Values::Str(Vec::new()), false),
            Column::new(Values::Str(Vec::new()), false),
            Column::new(Values::Int32(Vec::new()), true),
            Column::new(Values::Int64(Vec::new()), false),
            Column::new(Values::Int64(Vec::new()), false),
            Column::new(Values::Str(Vec::new()), true),
            Column::new(Values::Str(Vec::new()), true),
        ];
        if usage {
            for name in ["usage_input", "usage_output"] {
                schema.push(plain_type(name, Physical::INT64, true));
                columns.push(Column::new(Values::Int64(Vec::new()), true));
            }
        }
        let body = flat.as_ref().is_none_or(|f| f.other_bodies);
        if body {
            schema.push(string_type("body", true, true));
            columns.push(Column::new(Values::Str(Vec::new()), true));
        }
        for (_, column, kind) in flat.iter().flat_map(|f| &f.fields) {
            let (t, values) = match kind {
                Kind::Int => (
                    plain_type(column, Physical::INT64, true),
                    Values::Int64(Vec::new()),
                ),
                Kind::Float => (
                    plain_type(column, Physical::DOUBLE, true),
                    Values::Double(Vec::new()),
                ),
                Kind::Bool => (
                    plain_type(column, Physical::BOOLEAN, true),
                    Values::Bool(Vec::new()),
                ),
                Kind::Str | Kind::Null => {
                    (string_type(column, true, false), Values::Str(Vec::new()))
                }
            };
            schema.push(t);
            columns.push(Column::new(values, true));
        }
        for name in input.names() {
            schema.push(string_type(name, true, false));
            columns.push(Column::new(Values::Str(Vec::new()), true));
        }
        Table {
            schema,
            columns,
            flat,
            body,
            usage,
            input,
        }
    }

    /// Add one record; returns about how many bytes it buffered.
    fn push(&mut self, id: &str, r: &ItemRecord) -> usize {
        let c = &mut self.columns;
        let mut bytes = 64;
        bytes += c[0].str(Some(id.as_bytes()));
        let status: &[u8] = match r.status {
            ItemStatus::Ok => b"ok",
            ItemStatus::Failed => b"failed",
            ItemStatus::Pending => b"pending",
        };
        c[1].str(Some(status));
        match r.http_status {
            Some(s) => {
                c[2].present();
                let Values::Int32(v) = &mut c[2].values else {
                    unreachable!()
                };
                v.push(i32::from(s));
            }
            None => c[2].null(),
        }
        let Values::Int64(v) = &mut c[3].values else {
            unreachable!()
        };
        v.push(i64::from(r.attempts));
        let Values::Int64(v) = &mut c[4].values else {
            unreachable!()
        };
        v.push(r.bucket as i64);
        let class = r.class.map(|k| k.to_string());
        c[5].str(class.as_deref().map(str::as_bytes));
        bytes += c[6].str(r.error.as_deref().map(str::as_bytes));
        // The body's column, after the usage columns if there are.
        let body_at = if self.usage { 9 } else { 7 };
        if self.usage {
            for (at, units) in [
                (7, r.usage.map(|u| u.input)),
                (8, r.usage.map(|u| u.output)),
            ] {
                match units {
                    Some(n) => {
                        c[at].present();
                        let Values::Int64(v) = &mut c[at].values else {
                            unreachable!()
                        };
                        v.push(i64::try_from(n).unwrap_or(i64::MAX));
                    }
                    None => c[at].null(),
                }
            }
        }
        let inputs = self.input.texts(r);
        let first_input = c.len() - inputs.len();
        for (col, value) in c[first_input..].iter_mut().zip(&inputs) {
            bytes += col.str(value.as_deref().map(str::as_bytes));
        }
        let body = r.body.as_deref();
        let Some(flat) = &self.flat else {
            bytes += c[body_at].str(body.map(|b| b.get().as_bytes()));
            return bytes;
        };
        let map: Option<HashMap<Cow<str>, &RawValue>> = body
            .and_then(fields)
            .map(|Fields(v)| v.into_iter().collect());
        let first = if self.body {
            let other = body.filter(|_| map.is_none());
            bytes += c[body_at].str(other.map(|b| b.get().as_bytes()));
            body_at + 1
        } else {
            body_at
        };
        for (i, (name, _, kind)) in flat.fields.iter().enumerate() {
            let col = &mut c[first + i];
            let value = map
                .as_ref()
                .and_then(|m| m.get(name.as_str()))
                .filter(|v| v.get() != "null");
            let Some(value) = value else {
                col.null();
                continue;
            };
            let text = value.get();
            match (kind, &mut col.values) {
                (Kind::Int, Values::Int64(v)) => {
                    v.push(text.parse().expect("inferred as an integer"))
                }
                (Kind::Float, Values::Double(v)) => {
                    v.push(text.parse().expect("inferred as a number"))
                }
                (Kind::Bool, Values::Bool(v)) => v.push(text == "true"),
                (_, Values::Str(v)) => {
                    let s = match serde_json::from_str::<Cow<str>>(text) {
                        Ok(s) => s,
                        Err(_) => Cow::Borrowed(text),
                    };
                    bytes += s.len();
                    v.push(ByteArray::from(s.as_bytes().to_vec()));
                }
                _ => unreachable!("the column was made for the inferred kind"),
            }
            col.present();
        }
        bytes
    }
}

/// Write `columns`' buffered values as the file's next row group, and empty them.
fn write_group<W: Write + Send>(
    columns: &mut [Column],
    writer: &mut SerializedFileWriter<W>,
) -> parquet::errors::Result<()> {
    let mut group = writer.next_row_group()?;
    let mut columns = columns.iter_mut();
    while let Some(mut out) = group.next_column()? {
        let c = columns.next().expect("one buffer per column");
        let defs = c.defs.as_deref();
        match &c.values {
            Values::Str(v) => out.typed::<ByteArrayType>().write_batch(v, defs, None)?,
            Values::Int32(v) => out.typed::<Int32Type>().write_batch(v, defs, None)?,
            Values::Int64(v) => out.typed::<Int64Type>().write_batch(v, defs, None)?,
            Values::Double(v) => out.typed::<DoubleType>().write_batch(v, defs, None)?,
            Values::Bool(v) => out.typed::<BoolType>().write_batch(v, defs, None)?,
        };
        out.close()?;
        c.clear();
    }
    group.close()?;
    Ok(())
}

/// A file of the columns `fields` written to `out`, its pages compressed with `compression`.
fn file_writer<W: Write + Send>(
    out: W,
    fields: Vec<Type>,
    compression: ParquetCompression,
) -> Result<SerializedFileWriter<W>, ExportError> {
    let schema = Type::group_type_builder("highwater_results")
        .with_fields(fields.into_iter().map(Arc::new).collect())
        .build()
        .map_err(parquet_io)?;
    let props = WriterProperties::builder()
        .set_compression(compression.codec())
        .set_created_by(concat!("highwater ", env!("CARGO_PKG_VERSION")).into())
        .build();
    Ok(SerializedFileWriter::new(out, Arc::new(schema), Arc::new(props)).map_err(parquet_io)?)
}

fn parquet_io(e: parquet::errors::ParquetError) -> io::Error {
    io::Error::other(format!("parquet: {e}"))
}

/// Every final record of `store` (with status `only`, if given), in input order.
async fn walk(
    store: &impl Store,
    only: Option<ItemStatus>,
    f: &mut dyn FnMut(&str, &ItemRecord) -> io::Result<()>,
) -> Result<(), ExportError> {
    for_each(store, only, f).await
}

/// How a Parquet export is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParquetOptions {
    /// Object results become columns (see the module doc).
    pub flatten: bool,
    /// The pages' compression.
    pub compression: ParquetCompression,
}

/// The compression of a Parquet export's pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ParquetCompression {
    /// Snappy, Spark's default: fast, and read by everything.
    #[default]
    Snappy,
    /// zstd (level 3): smaller files, a little slower to write.
    Zstd,
    /// None.
    None,
}

impl ParquetCompression {
    fn codec(self) -> Compression {
        match self {
            ParquetCompression::Snappy => Compression::SNAPPY,
            ParquetCompression::Zstd => {
                Compression::ZSTD(parquet::basic::ZstdLevel::try_new(3).expect("3 is a level"))
            }
            ParquetCompression::None => Compression::UNCOMPRESSED,
        }
    }
}

/// Write the results of `store` (with status `only`) as Parquet to `out`, as `options` say.
/// Returns the number of rows.
pub async fn export<W: Write + Send>(
    store: &impl Store,
    only: Option<ItemStatus>,
    options: ParquetOptions,
    columns: &InputColumns,
    out: W,
) -> Result<u64, ExportError> {
    let groups = (ROW_GROUP_ROWS, ROW_GROUP_BYTES);
    export_in_groups(store, only, options, columns, out, groups).await
}

/// [`export`] with row groups cut at `(rows, bytes)`.
async fn export_in_groups<W: Write + Send>(
    store: &impl Store,
    only: Option<ItemStatus>,
    options: ParquetOptions,
    columns: &InputColumns,
    out: W,
    (max_rows, max_bytes): (usize, usize),
) -> Result<u64, ExportError> {
    let flat = if options.flatten {
        Some(FlatSchema::infer(store, only).await?)
    } else {
        None
    };
    if let Some((_, clash, _)) = flat
        .iter()
        .flat_map(|f| &f.fields)
        .find(|(_, column, _)| columns.names().contains(column))
    {
        return Err(ExportError::Columns(format!(
            "the input column {clash:?} is named like a field of the results that flattening \
             makes a column: export without flattening, or without that input column"
        )));
    }
    let usage = !crate::store::JobView::stats(store).await?.usage.is_zero();
    let mut table = Table::new(flat, columns.clone(), usage);
    let fields = table.schema.drain(..).collect();
    let mut writer = file_writer(out, fields, options.compression)?;
    let (mut rows, mut group_rows, mut group_bytes) = (0u64, 0usize, 0usize);
    walk(store, only, &mut |id, r| {
        group_bytes += table.push(id, r);
        group_rows += 1;
        rows += 1;
        if group_rows >= max_rows || group_bytes >= max_bytes {
            write_group(&mut table.columns, &mut writer).map_err(parquet_io)?;
            (group_rows, group_bytes) = (0, 0);
        }
        Ok(())
    })
    .await?;
    if group_rows > 0 {
        write_group(&mut table.columns, &mut writer).map_err(parquet_io)?;
    }
    writer.close().map_err(parquet_io)?;
    Ok(rows)
}

/// Export to `path` as Parquet, replacing it atomically. Returns the number of rows.
pub async fn export_to_file(
    store: &impl Store,
    only: Option<ItemStatus>,
    options: ParquetOptions,
    columns: &InputColumns,
    path: &Path,
) -> Result<u64, ExportError> {
    replace_atomically(path, async |out| {
        export(store, only, options, columns, out).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};
    use crate::store::{OffsetRecord, PlannedBucket, PlannerState};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    async fn store_with(bodies: &[(&str, Option<&str>)]) -> (tempfile::TempDir, SledStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStore::open(
            &dir.path().join("state"),
            OpenMode::CreateIfMissing,
            DEFAULT_CACHE_BYTES,
        )
        .unwrap();
        let n = bodies.len() as u64;
        let cursor = |row| crate::input::Cursor {
            row,
            ..Default::default()
        };
        let planned = PlannedBucket {
            offset: OffsetRecord {
                bucket: 0,
                start: cursor(0),
                end: cursor(n),
                items: n,
                duplicates: 0,
                bad_lines: 0,
                input: crate::input::Fingerprint { len: 1, xxh3: 1 },
                planned_at_ms: 0,
            },
            items: bodies
                .iter()
                .enumerate()
                .map(|(i, (id, _))| (i as u64, id.to_string()))
                .collect(),
            bad_lines: vec![],
            values: Vec::new(),
        };
        s.plan(&[planned], &PlannerState::default()).await.unwrap();
        let records: Vec<(String, ItemRecord)> = bodies
            .iter()
            .enumerate()
            .map(|(i, (id, body))| {
                let mut r = ItemRecord::pending(i as u64, 0);
                r.attempts = 1;
                match body {
                    Some(b) => {
                        r.status = ItemStatus::Ok;
                        r.http_status = Some(200);
                        r.body = Some(RawValue::from_string(b.to_string()).unwrap());
                    }
                    None => {
                        r.status = ItemStatus::Failed;
                        r.class = Some(crate::failure::ErrorClass::Timeout);
                        r.error = Some("timed out".into());
                    }
                }
                (id.to_string(), r)
            })
            .collect();
        s.record(&records).await.unwrap();
        (dir, s)
    }

    type Row = Vec<(String, Field)>;

    fn read(bytes: Vec<u8>) -> (Vec<String>, Vec<Row>, usize) {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let groups = reader.metadata().num_row_groups();
        let names = reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        let rows = reader
            .get_row_iter(None)
            .unwrap()
            .map(|row| {
                row.unwrap()
                    .get_column_iter()
                    .map(|(n, f)| (n.clone(), f.clone()))
                    .collect()
            })
            .collect();
        (names, rows, groups)
    }

    #[tokio::test]
    async fn flatten_infers_types_prefixes_fixed_names_and_keeps_other_bodies() {
        let (_d, s) = store_with(&[
            (
                "a",
                Some(r#"{"n":1,"x":1,"f":true,"s":"é\"","id":"inner","mixed":1,"deep":{"k":[1]}}"#),
            ),
            (
                "b",
                Some(r#"{"n":2,"x":2.5,"f":false,"mixed":"one","extra":null}"#),
            ),
            ("c", Some(r#""plain text""#)),
            ("d", None),
        ])
        .await;
        let mut out = Vec::new();
        assert_eq!(
            export_in_groups(
                &s,
                None,
                ParquetOptions {
                    flatten: true,
                    compression: ParquetCompression::Zstd,
                },
                &InputColumns::none(),
                &mut out,
                (3, usize::MAX)
            )
            .await
            .unwrap(),
            4
        );
        let (names, rows, groups) = read(out);
        assert_eq!(groups, 2);
        assert_eq!(
            names,
            [
                "id",
                "status",
                "http_status",
                "attempts",
                "bucket",
                "error_class",
                "error",
                "body",
                "n",
                "x",
                "f",
                "s",
                "body_id",
                "mixed",
                "deep",
                "extra"
            ]
        );
        let get = |row: &Row, name: &str| row.iter().find(|(n, _)| n == name).unwrap().1.clone();
        let a = &rows[0];
        assert_eq!(get(a, "id"), Field::Str("a".into()));
        assert_eq!(get(a, "n"), Field::Long(1));
        assert_eq!(get(a, "x"), Field::Double(1.0));
        assert_eq!(get(a, "f"), Field::Bool(true));
        assert_eq!(get(a, "s"), Field::Str("é\"".into()));
        assert_eq!(get(a, "body_id"), Field::Str("inner".into()));
        assert_eq!(get(a, "mixed"), Field::Str("1".into()));
        assert_eq!(get(a, "deep"), Field::Str(r#"{"k":[1]}"#.into()));
        assert_eq!(get(a, "body"), Field::Null);
        let b = &rows[1];
        assert_eq!(get(b, "x"), Field::Double(2.5));
        assert_eq!(get(b, "mixed"), Field::Str("one".into()));
        assert_eq!(get(b, "s"), Field::Null);
        assert_eq!(get(b, "extra"), Field::Null);
        let c = &rows[2];
        assert_eq!(get(c, "body"), Field::Str(r#""plain text""#.into()));
        assert_eq!(get(c, "n"), Field::Null);
        let d = &rows[3];
        assert_eq!(get(d, "status"), Field::Str("failed".into()));
        assert_eq!(get(d, "http_status"), Field::Null);
        assert_eq!(get(d, "error_class"), Field::Str("timeout".into()));
        assert_eq!(get(d, "error"), Field::Str("timed out".into()));
        assert_eq!(get(d, "attempts"), Field::Long(1));
        assert_eq!(get(d, "bucket"), Field::Long(0));
    }

    #[tokio::test]
    async fn without_flatten_the_body_is_json_text_and_status_filters() {
        let (_d, s) = store_with(&[("a", Some(r#"{"n":1}"#)), ("d", None)]).await;
        let mut out = Vec::new();
        assert_eq!(
            export(
                &s,
                Some(ItemStatus::Ok),
                ParquetOptions::default(),
                &InputColumns::none(),
                &mut out
            )
            .await
            .unwrap(),
            1
        );
        let (names, rows, groups) = read(out);
        assert_eq!(names, FIXED);
        assert_eq!(groups, 1);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0][7].1, Field::Str(r#"{"n":1}"#.into()));
        assert_eq!(rows[0][2].1, Field::Int(200));
    }

    #[tokio::test]
    async fn kinds_join_as_documented() {
        let k = |s: &str| Kind::of(&RawValue::from_string(s.into()).unwrap());
        assert_eq!(k("1"), Kind::Int);
        assert_eq!(k("-1.5e3"), Kind::Float);
        assert_eq!(k("99999999999999999999"), Kind::Float);
        assert_eq!(k("null"), Kind::Null);
        assert_eq!(Kind::Int.join(Kind::Float), Kind::Float);
        assert_eq!(Kind::Null.join(Kind::Bool), Kind::Bool);
        assert_eq!(Kind::Int.join(Kind::Bool), Kind::Str);
    }
}
