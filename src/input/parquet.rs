//! Parquet input: the ID column of a Parquet file, read one row group at a time.
//!
//! Owns the rules for a Parquet ID column (which column types give IDs and how a value
//! becomes its text; a null or empty value is a bad row) and the mapping of a row number to
//! (row group, row within it) from the file's footer, which lets a reader start at any row
//! without decoding the row groups before it. In memory at a time: the footer, one page of the
//! ID column and one batch of at most [`BATCH_ROWS`] decoded IDs, however large the file.
//!
//! A Parquet file is written whole (its footer last), so it never grows by appending rows:
//! a changed file is a changed input.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ::parquet::basic::{ConvertedType, LogicalType, Repetition, Type as Physical};
use ::parquet::column::reader::{get_column_reader, ColumnReader};
use ::parquet::errors::ParquetError;
use ::parquet::file::metadata::ParquetMetaData;
use ::parquet::file::reader::{FileReader, SerializedFileReader};
use ::parquet::file::serialized_reader::SerializedPageReader;
use ::parquet::schema::types::{ColumnDescPtr, ColumnDescriptor};

use super::error::InputError;
use super::row::{Cursor, Row};

/// How many rows are decoded at once.
const BATCH_ROWS: usize = 1024;

/// How a column's values are read: the ID column admits text and integers only
/// ([`id_kind`]), a kept column also floating point and booleans ([`value_kind`]).
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Strings, or binary holding UTF-8.
    Text,
    Int32 {
        signed: bool,
    },
    Int64 {
        signed: bool,
    },
    Float,
    Double,
    Bool,
}

/// One decoded value of a row (a null is `None` beside it).
#[derive(Debug, Clone)]
enum Cell {
    Bytes(Vec<u8>),
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
}

/// One column being read: the ID column or a kept one.
struct Column {
    name: String,
    /// The column's leaf index.
    index: usize,
    descr: ColumnDescPtr,
    kind: Kind,
    /// The column reader of the row group being read, once opened. In a mutex only because
    /// the crate's decoders are not `Sync` and an input reader is shared by reference across
    /// awaits; it is only reached through `&mut self` (`get_mut`), never locked.
    reader: Mutex<Option<ColumnReader>>,
    /// Values decoded and not yet returned (`None`: null): rows `next..` of the file.
    pending: VecDeque<Option<Cell>>,
    levels: Vec<i16>,
}

/// The rows of a Parquet file's ID column (and kept columns), from a chosen row on.
pub(super) struct ParquetRows {
    path: PathBuf,
    file: Arc<File>,
    meta: ParquetMetaData,
    /// The ID column first, then the kept columns in the order asked for.
    columns: Vec<Column>,
    file_len: u64,
    total_rows: u64,
    /// The row group being read (the number of row groups at the end).
    group: usize,
    /// The 0-based row of the file returned next.
    next: u64,
}

impl ParquetRows {
    /// Read `file` (at `path`) from its footer, check that `column` can hold IDs and position
    /// the reader at `row`.
    pub(super) fn open(
        path: &Path,
        file: File,
        column: &str,
        row: u64,
    ) -> Result<ParquetRows, InputError> {
        let read_err = |source| InputError::Read {
            path: path.to_owned(),
            source,
        };
        let file_len = file.metadata().map_err(read_err)?.len();
        let clone = file.try_clone().map_err(read_err)?;
        let meta = SerializedFileReader::new(clone)
            .map_err(|e| parquet_error(path, e))?
            .metadata()
            .clone();
        let id = Column::find(&meta, column, id_kind).map_err(|reason| InputError::Header {
            path: path.to_owned(),
            reason,
        })?;
        let total_rows = (0..meta.num_row_groups())
            .map(|g| meta.row_group(g).num_rows().max(0) as u64)
            .sum();
        let mut rows = ParquetRows {
            path: path.to_owned(),
            file: Arc::new(file),
            meta,
            columns: vec![id],
            file_len,
            total_rows,
            group: 0,
            next: 0,
        };
        rows.seek(row)?;
        Ok(rows)
    }

    /// Read `names` beside the ID from the next row on (see
    /// [`super::InputReader::keep_columns`]).
    pub(super) fn keep_columns(&mut self, names: &[String]) -> Result<(), InputError> {
        self.columns.truncate(1);
        for name in names {
            let column = Column::find(&self.meta, name, value_kind).map_err(|reason| {
                InputError::Header {
                    path: self.path.clone(),
                    reason,
                }
            })?;
            self.columns.push(column);
        }
        self.seek(self.next)
    }

    /// How many rows the file holds, from its footer.
    pub(super) fn rows_in_file(&self) -> u64 {
        self.total_rows
    }

    /// Where the next row starts: its row number; the byte is the file length times the share
    /// of rows before it, for progress only (seeking uses the row).
    pub(super) fn cursor(&self) -> Cursor {
        let byte = if self.total_rows == 0 {
            0
        } else {
            (u128::from(self.file_len) * u128::from(self.next.min(self.total_rows))
                / u128::from(self.total_rows)) as u64
        };
        Cursor {
            byte,
            line: self.next + 1,
            row: self.next,
        }
    }

    /// The next row (its line the 1-based row number); `None` after the last row.
    pub(super) fn next_row(&mut self) -> Result<Option<Row>, InputError> {
        loop {
            if let Some(cell) = self.columns[0].pending.pop_front() {
                let index = self.next;
                self.next += 1;
                let kind = self.columns[0].kind;
                let kept: Vec<(&str, Option<Cell>)> = self.columns[1..]
                    .iter_mut()
                    .map(|c| (c.name.as_str(), c.pending.pop_front().flatten()))
                    .collect();
                let id = match cell {
                    Some(cell) => id_text(cell, kind),
                    None => Err("ID is null".to_string()),
                };
                let (id, values) = match id {
                    Ok(id) if !kept.is_empty() => match values(kept) {
                        Ok(values) => (Ok(id), Some(values)),
                        Err(reason) => (Err(reason), None),
                    },
                    id => (id, None),
                };
                return Ok(Some(Row {
                    index,
                    line: index + 1,
                    id,
                    values,
                }));
            }
            if self.group >= self.meta.num_row_groups() {
                return Ok(None);
            }
            if self.columns[0].reader().is_none() {
                for c in 0..self.columns.len() {
                    let reader = self.group_reader(self.group, c)?;
                    *self.columns[c].reader() = Some(reader);
                }
            }
            if self.read_batch()? == 0 {
                for c in &mut self.columns {
                    *c.reader() = None;
                }
                self.group += 1;
            }
        }
    }

    /// Find the row group holding `row` from the footer's row counts (the groups before it
    /// are not read) and skip to `row` within it.
    fn seek(&mut self, row: u64) -> Result<(), InputError> {
        let mut first = 0u64;
        let mut group = 0;
        while group < self.meta.num_row_groups() {
            let n = self.meta.row_group(group).num_rows().max(0) as u64;
            if row < first + n {
                break;
            }
            first += n;
            group += 1;
        }
        self.group = group;
        self.next = row;
        for c in &mut self.columns {
            c.pending.clear();
            *c.reader() = None;
        }
        if group < self.meta.num_row_groups() && row > first {
            let skip = usize::try_from(row - first).unwrap_or(usize::MAX);
            for c in 0..self.columns.len() {
                let mut reader = self.group_reader(group, c)?;
                let skipped = match &mut reader {
                    ColumnReader::BoolColumnReader(r) => r.skip_records(skip),
                    ColumnReader::ByteArrayColumnReader(r) => r.skip_records(skip),
                    ColumnReader::Int32ColumnReader(r) => r.skip_records(skip),
                    ColumnReader::Int64ColumnReader(r) => r.skip_records(skip),
                    ColumnReader::FloatColumnReader(r) => r.skip_records(skip),
                    ColumnReader::DoubleColumnReader(r) => r.skip_records(skip),
                    _ => unreachable!("the kinds admit only these column types"),
                }
                .map_err(|e| parquet_error(&self.path, e))?;
                if skipped != skip {
                    return Err(self.damaged(group));
                }
                *self.columns[c].reader() = Some(reader);
            }
        }
        Ok(())
    }

    fn damaged(&self, group: usize) -> InputError {
        InputError::Header {
            path: self.path.clone(),
            reason: format!(
                "row group {group} holds fewer rows than its footer says; the file is damaged"
            ),
        }
    }

    fn group_reader(&self, group: usize, column: usize) -> Result<ColumnReader, InputError> {
        let meta = self.meta.row_group(group);
        let column = &self.columns[column];
        let pages = SerializedPageReader::new(
            Arc::clone(&self.file),
            meta.column(column.index),
            meta.num_rows().max(0) as usize,
            None,
        )
        .map_err(|e| parquet_error(&self.path, e))?;
        Ok(get_column_reader(column.descr.clone(), Box::new(pages)))
    }

    /// Decode up to [`BATCH_ROWS`] rows of the current row group, of every column; returns
    /// how many (0 at the group's end).
    fn read_batch(&mut self) -> Result<usize, InputError> {
        let path = self.path.clone();
        let rows = self.columns[0]
            .read(BATCH_ROWS)
            .map_err(|e| parquet_error(&path, e))?;
        for c in 1..self.columns.len() {
            let mut read = 0;
            while read < rows {
                let n = self.columns[c]
                    .read(rows - read)
                    .map_err(|e| parquet_error(&path, e))?;
                if n == 0 {
                    return Err(self.damaged(self.group));
                }
                read += n;
            }
        }
        Ok(rows)
    }
}

impl Column {
    /// The top-level column `name` of the file, if `kind` admits its type.
    fn find(
        meta: &ParquetMetaData,
        name: &str,
        kind: fn(&ColumnDescriptor) -> Result<Kind, String>,
    ) -> Result<Column, String> {
        let (index, descr) = top_column(meta, name)?;
        let kind = kind(&descr)?;
        Ok(Column {
            name: name.to_owned(),
            index,
            descr,
            kind,
            reader: Mutex::new(None),
            pending: VecDeque::new(),
            levels: Vec::new(),
        })
    }

    fn reader(&mut self) -> &mut Option<ColumnReader> {
        self.reader.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// Decode up to `max` rows into `pending`; returns how many (0 at the group's end).
    fn read(&mut self, max: usize) -> Result<usize, ParquetError> {
        let max_def = self.descr.max_def_level();
        let kind = self.kind;
        self.levels.clear();
        let levels = &mut self.levels;
        let pending = &mut self.pending;
        let reader = self.reader.get_mut().unwrap_or_else(|e| e.into_inner());
        macro_rules! decode {
            ($r:expr, $cell:expr) => {{
                let mut values = Vec::new();
                let (rows, _, _) = $r.read_records(max, Some(levels), None, &mut values)?;
                spread(rows, levels, max_def, values, pending, $cell);
                rows
            }};
        }
        Ok(match reader.as_mut().expect("opened before reading") {
            ColumnReader::ByteArrayColumnReader(r) => {
                decode!(r, |v: ::parquet::data_type::ByteArray| Cell::Bytes(
                    v.data().to_vec()
                ))
            }
            ColumnReader::Int32ColumnReader(r) => decode!(r, |v: i32| match kind {
                Kind::Int32 { signed: false } => Cell::UInt(u64::from(v as u32)),
                _ => Cell::Int(i64::from(v)),
            }),
            ColumnReader::Int64ColumnReader(r) => decode!(r, |v: i64| match kind {
                Kind::Int64 { signed: false } => Cell::UInt(v as u64),
                _ => Cell::Int(v),
            }),
            ColumnReader::FloatColumnReader(r) => decode!(r, |v: f32| Cell::Float(f64::from(v))),
            ColumnReader::DoubleColumnReader(r) => decode!(r, Cell::Float),
            ColumnReader::BoolColumnReader(r) => decode!(r, Cell::Bool),
            _ => unreachable!("the kinds admit only these column types"),
        })
    }
}

/// Turn `rows` decoded rows into cells: with an optional column, a definition level below
/// the maximum is a null (no value in `values`).
fn spread<T>(
    rows: usize,
    levels: &[i16],
    max_def: i16,
    values: Vec<T>,
    out: &mut VecDeque<Option<Cell>>,
    cell: impl Fn(T) -> Cell,
) {
    let mut values = values.into_iter();
    for i in 0..rows {
        let present = max_def == 0 || levels.get(i) == Some(&max_def);
        out.push_back(if present {
            values.next().map(&cell)
        } else {
            None
        });
    }
}

/// The ID an ID column's value gives.
fn id_text(cell: Cell, kind: Kind) -> Result<String, String> {
    match (cell, kind) {
        (Cell::Bytes(b), _) => text_id(&b),
        (Cell::Int(v), _) => Ok(v.to_string()),
        (Cell::UInt(v), _) => Ok(v.to_string()),
        (Cell::Float(_) | Cell::Bool(_), k) => {
            unreachable!("id_kind admits no {k:?} column")
        }
    }
}

/// A row's kept columns as one JSON object (text as strings, numbers and booleans as such),
/// or why the row has no value for one: a null, binary that is not UTF-8, a number JSON cannot
/// hold (NaN, an infinity).
fn values(kept: Vec<(&str, Option<Cell>)>) -> Result<String, String> {
    let mut out = serde_json::Map::with_capacity(kept.len());
    for (name, cell) in kept {
        let value = match cell {
            None => return Err(format!("column {name:?} is null")),
            Some(Cell::Bytes(b)) => serde_json::Value::String(
                String::from_utf8(b).map_err(|_| format!("column {name:?} is not valid UTF-8"))?,
            ),
            Some(Cell::Int(v)) => v.into(),
            Some(Cell::UInt(v)) => v.into(),
            Some(Cell::Bool(v)) => v.into(),
            Some(Cell::Float(v)) => serde_json::Number::from_f64(v)
                .map(serde_json::Value::Number)
                .ok_or_else(|| format!("column {name:?} holds {v}, which JSON cannot write"))?,
        };
        out.insert(name.to_owned(), value);
    }
    Ok(serde_json::Value::Object(out).to_string())
}

fn text_id(bytes: &[u8]) -> Result<String, String> {
    match std::str::from_utf8(bytes) {
        Err(_) => Err("ID is not valid UTF-8".to_string()),
        Ok(s) if s.trim().is_empty() => Err("ID is empty".to_string()),
        Ok(s) => Ok(s.trim().to_string()),
    }
}

/// The leaf column named `name` at the top level of the schema, with its index.
fn top_column(meta: &ParquetMetaData, name: &str) -> Result<(usize, ColumnDescPtr), String> {
    let schema = meta.file_metadata().schema_descr();
    let fields = schema.root_schema().get_fields();
    let Some(field) = fields.iter().find(|f| f.name() == name) else {
        let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
        return Err(format!(
            "the Parquet schema has no column {name:?} (columns: {})",
            names.join(", ")
        ));
    };
    if !field.is_primitive() {
        return Err(format!(
            "column {name:?} is nested (a group, list or map); a column read must hold one \
             value per row"
        ));
    }
    if field.get_basic_info().has_repetition()
        && field.get_basic_info().repetition() == Repetition::REPEATED
    {
        return Err(format!(
            "column {name:?} is repeated; a column read must hold one value per row"
        ));
    }
    let index = (0..schema.num_columns())
        .find(|&i| {
            let c = schema.column(i);
            c.path().parts().len() == 1 && c.name() == name
        })
        .ok_or_else(|| format!("column {name:?} has no leaf column in the file's schema"))?;
    Ok((index, schema.column(index)))
}

/// Which of the column's types give IDs: strings (or binary holding UTF-8) and integers.
fn id_kind(descr: &ColumnDescriptor) -> Result<Kind, String> {
    let logical = descr.logical_type_ref();
    let converted = descr.converted_type();
    let kind = match (descr.physical_type(), logical) {
        (
            Physical::BYTE_ARRAY,
            None | Some(LogicalType::String | LogicalType::Enum | LogicalType::Json),
        ) if matches!(
            converted,
            ConvertedType::NONE | ConvertedType::UTF8 | ConvertedType::ENUM | ConvertedType::JSON
        ) =>
        {
            Some(Kind::Text)
        }
        (Physical::INT32, None) => match converted {
            ConvertedType::NONE
            | ConvertedType::INT_8
            | ConvertedType::INT_16
            | ConvertedType::INT_32 => Some(Kind::Int32 { signed: true }),
            ConvertedType::UINT_8 | ConvertedType::UINT_16 | ConvertedType::UINT_32 => {
                Some(Kind::Int32 { signed: false })
            }
            _ => None,
        },
        (Physical::INT32, Some(LogicalType::Integer { is_signed, .. })) => {
            Some(Kind::Int32 { signed: *is_signed })
        }
        (Physical::INT64, None) => match converted {
            ConvertedType::NONE | ConvertedType::INT_64 => Some(Kind::Int64 { signed: true }),
            ConvertedType::UINT_64 => Some(Kind::Int64 { signed: false }),
            _ => None,
        },
        (Physical::INT64, Some(LogicalType::Integer { is_signed, .. })) => {
            Some(Kind::Int64 { signed: *is_signed })
        }
        _ => None,
    };
    kind.ok_or_else(|| {
        format!(
            "column {:?} holds {} values; an ID column must hold strings (or binary UTF-8) or \
             integers",
            descr.name(),
            describe(descr)
        )
    })
}

/// Which of the column's types a kept column may hold: those of an ID column, floating point
/// and booleans (a template writes them as JSON does).
fn value_kind(descr: &ColumnDescriptor) -> Result<Kind, String> {
    if descr.logical_type_ref().is_none() && descr.converted_type() == ConvertedType::NONE {
        match descr.physical_type() {
            Physical::FLOAT => return Ok(Kind::Float),
            Physical::DOUBLE => return Ok(Kind::Double),
            Physical::BOOLEAN => return Ok(Kind::Bool),
            _ => {}
        }
    }
    id_kind(descr).map_err(|_| {
        format!(
            "column {:?} holds {} values; a column a template uses must hold strings (or binary \
             UTF-8), integers, floating point numbers or booleans",
            descr.name(),
            describe(descr)
        )
    })
}

/// A column's physical type with its logical or converted type, for messages.
fn describe(descr: &ColumnDescriptor) -> String {
    let logical = match descr.logical_type_ref() {
        Some(l) => format!(" ({l:?})"),
        None if descr.converted_type() != ConvertedType::NONE => {
            format!(" ({})", descr.converted_type())
        }
        None => String::new(),
    };
    format!("{}{logical}", descr.physical_type())
}

fn parquet_error(path: &Path, e: ParquetError) -> InputError {
    match e {
        ParquetError::External(source) => InputError::Read {
            path: path.to_owned(),
            source: std::io::Error::other(source),
        },
        e => InputError::Header {
            path: path.to_owned(),
            reason: format!("cannot read it as Parquet: {e}"),
        },
    }
}

/// Parquet files for tests, written with the crate's low-level writer.
#[cfg(test)]
pub(crate) mod test_file {
    use std::fs::File;
    use std::path::Path;
    use std::sync::Arc;

    use ::parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
    use ::parquet::file::properties::WriterProperties;
    use ::parquet::file::writer::SerializedFileWriter;
    use ::parquet::schema::parser::parse_message_type;

    /// One column's values in one row group (`None`: null).
    pub(crate) enum Col {
        Str(Vec<Option<&'static str>>),
        Bytes(Vec<Option<&'static [u8]>>),
        I32(Vec<Option<i32>>),
        I64(Vec<Option<i64>>),
        F64(Vec<Option<f64>>),
    }

    fn split<T: Clone>(v: &[Option<T>]) -> (Vec<T>, Vec<i16>) {
        let values = v.iter().flatten().cloned().collect();
        let defs = v.iter().map(|x| i16::from(x.is_some())).collect();
        (values, defs)
    }

    /// Write `groups` (each a row group: one [`Col`] per column of `schema`, a Parquet message
    /// type) to `path`, in pages of at most `page_rows` rows.
    pub(crate) fn write(path: &Path, schema: &str, groups: Vec<Vec<Col>>, page_rows: usize) {
        let schema = Arc::new(parse_message_type(schema).unwrap());
        let props = Arc::new(
            WriterProperties::builder()
                .set_write_batch_size(page_rows)
                .set_data_page_row_count_limit(page_rows)
                .build(),
        );
        let mut writer =
            SerializedFileWriter::new(File::create(path).unwrap(), schema, props).unwrap();
        for group in groups {
            let mut g = writer.next_row_group().unwrap();
            for col in group {
                let mut c = g.next_column().unwrap().unwrap();
                match col {
                    Col::Str(v) => {
                        let (values, defs) = split(&v);
                        let values: Vec<ByteArray> =
                            values.into_iter().map(ByteArray::from).collect();
                        c.typed::<ByteArrayType>()
                            .write_batch(&values, Some(&defs), None)
                    }
                    Col::Bytes(v) => {
                        let (values, defs) = split(&v);
                        let values: Vec<ByteArray> =
                            values.into_iter().map(|b| b.to_vec().into()).collect();
                        c.typed::<ByteArrayType>()
                            .write_batch(&values, Some(&defs), None)
                    }
                    Col::I32(v) => {
                        let (values, defs) = split(&v);
                        c.typed::<Int32Type>()
                            .write_batch(&values, Some(&defs), None)
                    }
                    Col::I64(v) => {
                        let (values, defs) = split(&v);
                        c.typed::<Int64Type>()
                            .write_batch(&values, Some(&defs), None)
                    }
                    Col::F64(v) => {
                        let (values, defs) = split(&v);
                        c.typed::<DoubleType>()
                            .write_batch(&values, Some(&defs), None)
                    }
                }
                .unwrap();
                c.close().unwrap();
            }
            g.close().unwrap();
        }
        writer.close().unwrap();
    }

    /// A file of one optional string column `id`, one row group per slice.
    pub(crate) fn ids(path: &Path, groups: &[Vec<Option<&'static str>>], page_rows: usize) {
        write(
            path,
            "message m { optional binary id (UTF8); }",
            groups.iter().map(|g| vec![Col::Str(g.clone())]).collect(),
            page_rows,
        );
    }
}
