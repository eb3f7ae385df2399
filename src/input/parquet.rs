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

use super::{Cursor, InputError, Row};

/// How many rows of the ID column are decoded at once.
const BATCH_ROWS: usize = 1024;

/// How the ID column's values become IDs.
#[derive(Debug, Clone, Copy)]
enum IdKind {
    /// Strings, or binary holding UTF-8.
    Text,
    Int32 {
        signed: bool,
    },
    Int64 {
        signed: bool,
    },
}

/// The rows of a Parquet file's ID column, from a chosen row on.
pub(super) struct ParquetRows {
    path: PathBuf,
    file: Arc<File>,
    meta: ParquetMetaData,
    descr: ColumnDescPtr,
    /// The ID column's leaf index.
    column: usize,
    kind: IdKind,
    file_len: u64,
    total_rows: u64,
    /// The row group being read (the number of row groups at the end).
    group: usize,
    /// The ID column reader of `group`, once opened. In a mutex only because the crate's
    /// decoders are not `Sync` and an input reader is shared by reference across awaits; it
    /// is only reached through `&mut self` (`get_mut`), never locked.
    reader: Mutex<Option<ColumnReader>>,
    /// IDs decoded and not yet returned: rows `next..`.
    pending: VecDeque<Result<String, String>>,
    /// The 0-based row of the file returned next.
    next: u64,
    levels: Vec<i16>,
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
        let (index, descr) = id_column(&meta, column).map_err(|reason| InputError::Header {
            path: path.to_owned(),
            reason,
        })?;
        let kind = id_kind(&descr).map_err(|reason| InputError::Header {
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
            descr,
            column: index,
            kind,
            file_len,
            total_rows,
            group: 0,
            reader: Mutex::new(None),
            pending: VecDeque::new(),
            next: 0,
            levels: Vec::new(),
        };
        rows.seek(row)?;
        Ok(rows)
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
            if let Some(id) = self.pending.pop_front() {
                let index = self.next;
                self.next += 1;
                return Ok(Some(Row {
                    index,
                    line: index + 1,
                    id,
                }));
            }
            if self.group >= self.meta.num_row_groups() {
                return Ok(None);
            }
            if self.column_reader().is_none() {
                let reader = self.group_reader(self.group)?;
                *self.column_reader() = Some(reader);
            }
            if self.read_batch()? == 0 {
                *self.column_reader() = None;
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
        self.pending.clear();
        *self.column_reader() = None;
        if group < self.meta.num_row_groups() && row > first {
            let mut reader = self.group_reader(group)?;
            let skip = usize::try_from(row - first).unwrap_or(usize::MAX);
            let skipped = match &mut reader {
                ColumnReader::ByteArrayColumnReader(r) => r.skip_records(skip),
                ColumnReader::Int32ColumnReader(r) => r.skip_records(skip),
                ColumnReader::Int64ColumnReader(r) => r.skip_records(skip),
                _ => unreachable!("id_kind admits only these column types"),
            }
            .map_err(|e| parquet_error(&self.path, e))?;
            if skipped != skip {
                return Err(InputError::Header {
                    path: self.path.clone(),
                    reason: format!(
                        "row group {group} holds fewer rows than its footer says; the file is damaged"
                    ),
                });
            }
            *self.column_reader() = Some(reader);
        }
        Ok(())
    }

    fn column_reader(&mut self) -> &mut Option<ColumnReader> {
        self.reader.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    fn group_reader(&self, group: usize) -> Result<ColumnReader, InputError> {
        let meta = self.meta.row_group(group);
        let pages = SerializedPageReader::new(
            Arc::clone(&self.file),
            meta.column(self.column),
            meta.num_rows().max(0) as usize,
            None,
        )
        .map_err(|e| parquet_error(&self.path, e))?;
        Ok(get_column_reader(self.descr.clone(), Box::new(pages)))
    }

    /// Decode up to [`BATCH_ROWS`] rows of the current row group into `pending`; returns
    /// how many (0 at the group's end).
    fn read_batch(&mut self) -> Result<usize, InputError> {
        let max_def = self.descr.max_def_level();
        let kind = self.kind;
        self.levels.clear();
        let levels = &mut self.levels;
        let pending = &mut self.pending;
        let reader = self.reader.get_mut().unwrap_or_else(|e| e.into_inner());
        let result = match reader.as_mut().expect("opened before reading") {
            ColumnReader::ByteArrayColumnReader(r) => {
                let mut values = Vec::new();
                r.read_records(BATCH_ROWS, Some(levels), None, &mut values)
                    .map(|(rows, _, _)| {
                        spread(rows, levels, max_def, values, pending, |v| {
                            text_id(v.data())
                        });
                        rows
                    })
            }
            ColumnReader::Int32ColumnReader(r) => {
                let mut values = Vec::new();
                r.read_records(BATCH_ROWS, Some(levels), None, &mut values)
                    .map(|(rows, _, _)| {
                        spread(rows, levels, max_def, values, pending, |v| {
                            Ok(match kind {
                                IdKind::Int32 { signed: false } => (v as u32).to_string(),
                                _ => v.to_string(),
                            })
                        });
                        rows
                    })
            }
            ColumnReader::Int64ColumnReader(r) => {
                let mut values = Vec::new();
                r.read_records(BATCH_ROWS, Some(levels), None, &mut values)
                    .map(|(rows, _, _)| {
                        spread(rows, levels, max_def, values, pending, |v| {
                            Ok(match kind {
                                IdKind::Int64 { signed: false } => (v as u64).to_string(),
                                _ => v.to_string(),
                            })
                        });
                        rows
                    })
            }
            _ => unreachable!("id_kind admits only these column types"),
        };
        result.map_err(|e| parquet_error(&self.path, e))
    }
}

/// Turn `rows` decoded rows into IDs: with an optional column, a definition level below the
/// maximum is a null (no value in `values`).
fn spread<T>(
    rows: usize,
    levels: &[i16],
    max_def: i16,
    values: Vec<T>,
    out: &mut VecDeque<Result<String, String>>,
    id: impl Fn(T) -> Result<String, String>,
) {
    let mut values = values.into_iter();
    for i in 0..rows {
        let present = max_def == 0 || levels.get(i) == Some(&max_def);
        let value = if present { values.next() } else { None };
        out.push_back(match value {
            Some(v) => id(v),
            None => Err("ID is null".to_string()),
        });
    }
}

fn text_id(bytes: &[u8]) -> Result<String, String> {
    match std::str::from_utf8(bytes) {
        Err(_) => Err("ID is not valid UTF-8".to_string()),
        Ok(s) if s.trim().is_empty() => Err("ID is empty".to_string()),
        Ok(s) => Ok(s.trim().to_string()),
    }
}

/// The leaf column named `name` at the top level of the schema, with its index.
fn id_column(meta: &ParquetMetaData, name: &str) -> Result<(usize, ColumnDescPtr), String> {
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
            "column {name:?} is nested (a group, list or map); an ID column must hold one \
             string or integer per row"
        ));
    }
    if field.get_basic_info().has_repetition()
        && field.get_basic_info().repetition() == Repetition::REPEATED
    {
        return Err(format!(
            "column {name:?} is repeated; an ID column must hold one string or integer per row"
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
fn id_kind(descr: &ColumnDescriptor) -> Result<IdKind, String> {
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
            Some(IdKind::Text)
        }
        (Physical::INT32, None) => match converted {
            ConvertedType::NONE
            | ConvertedType::INT_8
            | ConvertedType::INT_16
            | ConvertedType::INT_32 => Some(IdKind::Int32 { signed: true }),
            ConvertedType::UINT_8 | ConvertedType::UINT_16 | ConvertedType::UINT_32 => {
                Some(IdKind::Int32 { signed: false })
            }
            _ => None,
        },
        (Physical::INT32, Some(LogicalType::Integer { is_signed, .. })) => {
            Some(IdKind::Int32 { signed: *is_signed })
        }
        (Physical::INT64, None) => match converted {
            ConvertedType::NONE | ConvertedType::INT_64 => Some(IdKind::Int64 { signed: true }),
            ConvertedType::UINT_64 => Some(IdKind::Int64 { signed: false }),
            _ => None,
        },
        (Physical::INT64, Some(LogicalType::Integer { is_signed, .. })) => {
            Some(IdKind::Int64 { signed: *is_signed })
        }
        _ => None,
    };
    kind.ok_or_else(|| {
        let logical = match logical {
            Some(l) => format!(" ({l:?})"),
            None if converted != ConvertedType::NONE => format!(" ({converted})"),
            None => String::new(),
        };
        format!(
            "column {:?} holds {}{logical} values; an ID column must hold strings (or binary \
             UTF-8) or integers",
            descr.name(),
            descr.physical_type()
        )
    })
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

#[cfg(test)]
mod tests {
    use super::test_file::{self, Col};
    use crate::input::{Cursor, InputFormat, InputReader, InputSpec};

    fn spec(path: &std::path::Path, column: &str) -> InputSpec {
        InputSpec {
            path: path.to_owned(),
            format: InputFormat::Parquet {
                column: column.into(),
            },
        }
    }

    type Rows = Vec<(u64, u64, Result<String, String>)>;

    fn all(spec: &InputSpec, cursor: Cursor) -> (Rows, Cursor) {
        let mut r = InputReader::open(spec, cursor).unwrap();
        let mut out = vec![];
        while let Some(row) = r.next_row().unwrap() {
            out.push((row.index, row.line, row.id));
        }
        (out, r.cursor())
    }

    fn refused(spec: &InputSpec) -> String {
        InputReader::open(spec, Cursor::default())
            .err()
            .expect("refused")
            .to_string()
    }

    #[test]
    fn string_ids_across_row_groups_with_null_and_empty_as_bad_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        test_file::ids(
            &path,
            &[
                vec![Some("a"), Some("b/é"), None],
                vec![Some("c"), Some(""), Some(" d ")],
                vec![],
                vec![Some("e")],
            ],
            2,
        );
        let spec = spec(&path, "id");
        let reader = InputReader::open(&spec, Cursor::default()).unwrap();
        assert_eq!(reader.rows_in_file(), Some(7));
        let (rows, end) = all(&spec, Cursor::default());
        assert_eq!(
            rows,
            vec![
                (0, 1, Ok("a".into())),
                (1, 2, Ok("b/é".into())),
                (2, 3, Err("ID is null".into())),
                (3, 4, Ok("c".into())),
                (4, 5, Err("ID is empty".into())),
                (5, 6, Ok("d".into())),
                (6, 7, Ok("e".into())),
            ]
        );
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            end,
            Cursor {
                byte: len,
                line: 8,
                row: 7
            }
        );
    }

    #[test]
    fn integer_ids_become_decimal_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        test_file::write(
            &path,
            "message m { required int64 id; optional int32 u (UINT_32); required int32 small; }",
            vec![
                vec![
                    Col::I64(vec![Some(-7), Some(9_007_199_254_740_993)]),
                    Col::I32(vec![Some(-1), None]),
                    Col::I32(vec![Some(3), Some(-4)]),
                ],
                vec![
                    Col::I64(vec![Some(0)]),
                    Col::I32(vec![Some(5)]),
                    Col::I32(vec![Some(i32::MIN)]),
                ],
            ],
            100,
        );
        let ids = |column| {
            all(&spec(&path, column), Cursor::default())
                .0
                .into_iter()
                .map(|r| r.2)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ids("id"),
            [
                Ok("-7".into()),
                Ok("9007199254740993".into()),
                Ok("0".into())
            ]
        );
        assert_eq!(
            ids("u"),
            [
                Ok("4294967295".into()),
                Err("ID is null".into()),
                Ok("5".into())
            ]
        );
        assert_eq!(
            ids("small"),
            [Ok("3".into()), Ok("-4".into()), Ok("-2147483648".into())]
        );
    }

    #[test]
    fn a_cursor_restarts_at_any_row_as_a_full_read_continues() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        let group = |n: usize, nulls: usize| -> Vec<Option<&'static str>> {
            (0..n)
                .map(|i| {
                    if i % nulls == 3 {
                        None
                    } else {
                        Some(&*Box::leak(format!("id{i}").into_boxed_str()))
                    }
                })
                .collect()
        };
        test_file::ids(&path, &[group(250, 50), group(1, 7), group(400, 90)], 64);
        let spec = spec(&path, "id");
        let (full, _) = all(&spec, Cursor::default());
        assert_eq!(full.len(), 651);
        let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
        for at in 0..=full.len() {
            let cursor = r.cursor();
            assert_eq!(cursor.row, at as u64);
            if at % 13 == 0 || (248..=252).contains(&at) || at + 2 >= full.len() {
                assert_eq!(all(&spec, cursor).0, full[at..], "from row {at}");
                // Only the row is needed to start again.
                let bare = Cursor {
                    row: at as u64,
                    ..Cursor::default()
                };
                assert_eq!(all(&spec, bare).0, full[at..], "from bare row {at}");
            }
            r.next_row().unwrap();
        }
    }

    #[test]
    fn binary_ids_must_be_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        test_file::write(
            &path,
            "message m { required binary id; }",
            vec![vec![Col::Bytes(vec![
                Some(b"ok-1"),
                Some(b"\xff\xfe"),
                Some(b"ok-2"),
            ])]],
            10,
        );
        let rows = all(&spec(&path, "id"), Cursor::default()).0;
        assert_eq!(
            rows,
            vec![
                (0, 1, Ok("ok-1".into())),
                (1, 2, Err("ID is not valid UTF-8".into())),
                (2, 3, Ok("ok-2".into())),
            ]
        );
    }

    #[test]
    fn a_missing_column_names_the_file_and_its_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        test_file::write(
            &path,
            "message m { required int64 user_id; optional binary name (UTF8); }",
            vec![vec![Col::I64(vec![Some(1)]), Col::Str(vec![Some("ann")])]],
            10,
        );
        let err = refused(&spec(&path, "id"));
        assert!(err.contains("ids.parquet"), "{err}");
        assert!(err.contains("no column \"id\""), "{err}");
        assert!(err.contains("user_id, name"), "{err}");
    }

    #[test]
    fn columns_that_cannot_hold_ids_are_refused_up_front() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        test_file::write(
            &path,
            "message m { required double score; required int32 day (DATE); }",
            vec![vec![Col::F64(vec![Some(1.5)]), Col::I32(vec![Some(1)])]],
            10,
        );
        let err = refused(&spec(&path, "score"));
        assert!(err.contains("\"score\" holds DOUBLE"), "{err}");
        assert!(
            err.contains("strings (or binary UTF-8) or integers"),
            "{err}"
        );
        let err = refused(&spec(&path, "day"));
        assert!(err.contains("\"day\" holds INT32 (Date)"), "{err}");

        let nested = dir.path().join("nested.parquet");
        test_file::write(
            &nested,
            "message m { optional group info { optional binary name (UTF8); } required int32 n; }",
            vec![vec![Col::Str(vec![None]), Col::I32(vec![Some(1)])]],
            10,
        );
        let err = refused(&spec(&nested, "info"));
        assert!(err.contains("\"info\" is nested"), "{err}");

        let repeated = dir.path().join("repeated.parquet");
        test_file::write(&repeated, "message m { repeated int64 ids; }", vec![], 10);
        let err = refused(&spec(&repeated, "ids"));
        assert!(err.contains("\"ids\" is repeated"), "{err}");

        let text = dir.path().join("not.parquet");
        std::fs::write(&text, "id\n1\n").unwrap();
        let err = refused(&spec(&text, "id"));
        assert!(
            err.contains("not.parquet: cannot read it as Parquet"),
            "{err}"
        );
    }

    #[test]
    fn a_file_without_rows_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        test_file::ids(&path, &[], 10);
        assert!(all(&spec(&path, "id"), Cursor::default()).0.is_empty());
    }
}
