//! Input: reading IDs from a file, streamed, with the byte positions needed to re-read it.
//!
//! Owns the four input formats (plain text, CSV, JSONL, Parquet), the rules that turn a line into an
//! ID or into a bad line, the [`Cursor`] that lets a reader start again at any row boundary
//! without re-reading what came before, and the input [`Fingerprint`] that detects a changed
//! file on resume. A folder of files is read as one input (the `folder` module).
//!
//! Rows are what buckets are cut from: every data record is a row (a non-blank line of a text
//! or JSONL file, a CSV record after the header, a row of a Parquet file), including records
//! that turn out to be bad. Bad lines keep their row number so bucket boundaries never depend
//! on `--skip-bad-lines`. Nothing here holds more than one line (or, for Parquet, the footer and
//! one page and batch of the ID column) in memory.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod folder;
mod parquet;
pub use folder::{
    fingerprint as folder_fingerprint, fingerprint_files as folder_files,
    fingerprint_planned as folder_fingerprint_planned, folder_of, format_of as folder_format,
    is_data_name, is_folder_input, list as folder_list, InputFile,
};
#[cfg(test)]
pub(crate) use parquet::test_file as parquet_test_file;

/// Longest line we accept: a longer one is a bad line, so a file without newlines cannot
/// make us allocate without bound.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// How IDs are laid out in the input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum InputFormat {
    /// One ID per line; surrounding whitespace and `\r` trimmed; blank lines skipped.
    Text,
    /// A header row, then records; the ID is in the named column.
    Csv { column: String },
    /// One JSON object per line; the ID is the named field (a string or a number).
    Jsonl { field: String },
    /// A Parquet file, read by row group; the ID is the named top-level column (strings,
    /// binary UTF-8 or integers).
    Parquet { column: String },
}

impl fmt::Display for InputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputFormat::Text => write!(f, "text"),
            InputFormat::Csv { column } => write!(f, "csv (column {column:?})"),
            InputFormat::Jsonl { field } => write!(f, "jsonl (field {field:?})"),
            InputFormat::Parquet { column } => write!(f, "parquet (column {column:?})"),
        }
    }
}

/// Where the IDs come from: the file (or the folder of files, read as one) and how to read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSpec {
    pub path: PathBuf,
    pub format: InputFormat,
}

/// Errors that stop reading the input.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot open input {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot read input {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}:{line}: {reason}")]
    BadLine {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    /// The file's header (a CSV header row, a Parquet file's footer and schema) does not
    /// fit: no ID column, a column that cannot hold IDs, not a file of the format.
    #[error("{path}: {reason}")]
    Header { path: PathBuf, reason: String },
    /// A folder input that cannot be read as one: no data files, files of mixed formats.
    #[error("{path}: {reason}")]
    Folder { path: PathBuf, reason: String },
}

/// The position of the next row to read: a row boundary, valid for seeking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Byte offset in the file where the next row starts (or where scanning resumes). For
    /// Parquet, which seeks by `row`, the file's length times the share of rows before it:
    /// for progress only.
    pub byte: u64,
    /// 1-based physical line number at `byte` (for Parquet, the 1-based row number).
    pub line: u64,
    /// 0-based index of the next row.
    pub row: u64,
}

/// One data record of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// 0-based row index: the position that decides the row's bucket.
    pub index: u64,
    /// 1-based line where the record starts (for Parquet, the 1-based row number), for
    /// messages.
    pub line: u64,
    /// The ID, or why this record has none (a kept column without a value included).
    pub id: Result<String, String>,
    /// The kept columns' values ([`InputReader::keep_columns`]) as one JSON object, in the
    /// order they were asked for; none when no column is kept or the row has no ID.
    pub values: Option<String>,
}

/// A fingerprint of the input's first `len` bytes: detects a changed file on resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub len: u64,
    pub xxh3: u64,
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes, xxh3 {:016x}", self.len, self.xxh3)
    }
}

impl Fingerprint {
    /// Hash the whole file.
    pub fn of_file(path: &Path) -> Result<Fingerprint, InputError> {
        let len = std::fs::metadata(path)
            .map_err(|source| InputError::Open {
                path: path.to_owned(),
                source,
            })?
            .len();
        Self::of_prefix(path, len)
    }

    /// Hash the file's first `len` bytes (fails if the file is shorter).
    pub fn of_prefix(path: &Path, len: u64) -> Result<Fingerprint, InputError> {
        let file = File::open(path).map_err(|source| InputError::Open {
            path: path.to_owned(),
            source,
        })?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut reader = BufReader::with_capacity(1 << 20, file.take(len));
        let mut seen = 0u64;
        loop {
            let buf = reader.fill_buf().map_err(|source| InputError::Read {
                path: path.to_owned(),
                source,
            })?;
            if buf.is_empty() {
                break;
            }
            hasher.update(buf);
            let n = buf.len();
            seen += n as u64;
            reader.consume(n);
        }
        if seen != len {
            return Err(InputError::Read {
                path: path.to_owned(),
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("file is shorter than {len} bytes"),
                ),
            });
        }
        Ok(Fingerprint {
            len,
            xxh3: hasher.digest(),
        })
    }
}

/// Reads rows from an input file, starting at a [`Cursor`].
pub struct InputReader {
    path: PathBuf,
    inner: Inner,
    cursor: Cursor,
}

enum Inner {
    Lines {
        reader: BufReader<Bounded>,
        buf: Vec<u8>,
        json_field: Option<String>,
        /// The JSONL fields kept beside the ID.
        keep: Vec<String>,
    },
    Csv {
        reader: Box<csv::Reader<Bounded>>,
        column: usize,
        /// The header row, to find kept columns by name.
        headers: csv::ByteRecord,
        /// The columns kept beside the ID: name and index.
        keep: Vec<(String, usize)>,
        record: csv::ByteRecord,
        /// Length of the file when its last byte is not a newline: the last record's line
        /// is then the reader's current line, not the one before it.
        unterminated_len: Option<u64>,
    },
    Parquet(Box<parquet::ParquetRows>),
    Folder(Box<folder::FolderRows>),
}

impl InputReader {
    /// Open `spec.path` and position it at `cursor` (use `Cursor::default()` for the start).
    pub fn open(spec: &InputSpec, cursor: Cursor) -> Result<InputReader, InputError> {
        Self::open_bounded(spec, cursor, u64::MAX)
    }

    /// [`InputReader::open`], reading no further than byte `end`: the length the job's
    /// fingerprint covers. Rows appended later (a producer still writing the file, maybe in
    /// the middle of a line) are not this job's input until a later run checks them as a
    /// grown input. A Parquet file cannot grow: its footer says where it ends.
    pub fn open_bounded(
        spec: &InputSpec,
        cursor: Cursor,
        end: u64,
    ) -> Result<InputReader, InputError> {
        Self::open_planned(spec, &[], cursor, end)
    }

    /// [`InputReader::open_bounded`] of a job's input: a folder input reads the `files` the
    /// job planned (every data file in it now when empty); a file ignores them.
    pub fn open_planned(
        spec: &InputSpec,
        files: &[InputFile],
        cursor: Cursor,
        end: u64,
    ) -> Result<InputReader, InputError> {
        if folder::is_folder_input(&spec.path) {
            let rows = folder::FolderRows::open(spec, files, cursor, end)?;
            return Ok(InputReader {
                path: spec.path.clone(),
                cursor: rows.cursor(),
                inner: Inner::Folder(Box::new(rows)),
            });
        }
        let path = spec.path.clone();
        let open_err = |source| InputError::Open {
            path: path.clone(),
            source,
        };
        let read_err = |source| InputError::Read {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(open_err)?;
        let mut file = Bounded { file, pos: 0, end };
        let mut cursor = Cursor {
            line: cursor.line.max(1),
            ..cursor
        };
        let inner = match &spec.format {
            InputFormat::Parquet { column } => {
                let rows = parquet::ParquetRows::open(&path, file.file, column, cursor.row)?;
                cursor = rows.cursor();
                Inner::Parquet(Box::new(rows))
            }
            InputFormat::Text | InputFormat::Jsonl { .. } => {
                file.seek(SeekFrom::Start(cursor.byte)).map_err(read_err)?;
                let json_field = match &spec.format {
                    InputFormat::Jsonl { field } => Some(field.clone()),
                    _ => None,
                };
                Inner::Lines {
                    reader: BufReader::with_capacity(256 << 10, file),
                    buf: Vec::new(),
                    json_field,
                    keep: Vec::new(),
                }
            }
            InputFormat::Csv { column } => {
                let unterminated_len = unterminated_len(&mut file).map_err(read_err)?;
                let mut reader = csv::ReaderBuilder::new()
                    .flexible(true)
                    .has_headers(true)
                    .from_reader(file);
                let headers = reader
                    .byte_headers()
                    .map_err(|e| csv_error(&path, e))?
                    .clone();
                if headers.is_empty() {
                    return Err(InputError::Header {
                        path,
                        reason: "the CSV file has no header row".into(),
                    });
                }
                let index = csv_column(&headers, column).map_err(|reason| InputError::Header {
                    path: path.clone(),
                    reason,
                })?;
                if cursor.byte == 0 {
                    let pos = reader.position();
                    cursor.byte = pos.byte();
                    cursor.line = pos.line();
                } else {
                    let mut pos = csv::Position::new();
                    pos.set_byte(cursor.byte)
                        .set_line(cursor.line)
                        .set_record(cursor.row + 1);
                    reader.seek(pos).map_err(|e| csv_error(&path, e))?;
                }
                Inner::Csv {
                    reader: Box::new(reader),
                    column: index,
                    headers,
                    keep: Vec::new(),
                    record: csv::ByteRecord::new(),
                    unterminated_len,
                }
            }
        };
        Ok(InputReader {
            path,
            inner,
            cursor,
        })
    }

    /// Read the values of `columns` (CSV columns, JSONL fields, Parquet columns) beside each
    /// row's ID, into [`Row::values`]. A column the file's header or schema lacks is an error
    /// here; a row without a value for one is a bad row. A text input has no columns.
    pub fn keep_columns(&mut self, columns: &[String]) -> Result<(), InputError> {
        if columns.is_empty() {
            return Ok(());
        }
        let header = |reason: String| InputError::Header {
            path: self.path.clone(),
            reason,
        };
        match &mut self.inner {
            Inner::Lines {
                json_field: None, ..
            } => {
                return Err(header(format!(
                    "a text input has one ID per line and no columns (asked for {})",
                    columns.join(", ")
                )))
            }
            Inner::Lines { keep, .. } => *keep = columns.to_vec(),
            Inner::Csv { headers, keep, .. } => {
                *keep = columns
                    .iter()
                    .map(|c| Ok((c.clone(), csv_column(headers, c)?)))
                    .collect::<Result<_, String>>()
                    .map_err(header)?;
            }
            Inner::Parquet(rows) => rows.keep_columns(columns)?,
            Inner::Folder(rows) => rows.keep_columns(columns)?,
        }
        Ok(())
    }

    /// The input file's path, for messages (of a folder, the file being read).
    pub fn path(&self) -> &Path {
        match &self.inner {
            Inner::Folder(rows) => rows.path(),
            _ => &self.path,
        }
    }

    /// Of a folder input, the name of the file being read (the one of the row read last);
    /// `None` for a file input.
    pub fn file_in_folder(&self) -> Option<&str> {
        match &self.inner {
            Inner::Folder(rows) => rows.path().file_name().and_then(|n| n.to_str()),
            _ => None,
        }
    }

    /// How many rows the whole file holds, when its format says so without reading them (a
    /// Parquet file's footer; of a folder of Parquet files, the sum of their footers'); `None`
    /// for the line formats, which must be read to know.
    pub fn rows_in_file(&self) -> Option<u64> {
        match &self.inner {
            Inner::Parquet(rows) => Some(rows.rows_in_file()),
            Inner::Folder(rows) => rows.rows_in_files(),
            Inner::Lines { .. } | Inner::Csv { .. } => None,
        }
    }

    /// Where the next row starts.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// Read the next row; `None` at the end of the input.
    pub fn next_row(&mut self) -> Result<Option<Row>, InputError> {
        match &mut self.inner {
            Inner::Lines {
                reader,
                buf,
                json_field,
                keep,
            } => loop {
                let line = self.cursor.line;
                let (consumed, overlong) =
                    read_line_capped(reader, buf).map_err(|source| InputError::Read {
                        path: self.path.clone(),
                        source,
                    })?;
                if consumed == 0 {
                    return Ok(None);
                }
                self.cursor.byte += consumed as u64;
                self.cursor.line += 1;
                if !overlong && is_blank(buf) {
                    continue;
                }
                let index = self.cursor.row;
                self.cursor.row += 1;
                let (id, values) = if overlong {
                    (
                        Err(format!("line is longer than {MAX_LINE_BYTES} bytes")),
                        None,
                    )
                } else {
                    match json_field {
                        None => (text_id(buf), None),
                        Some(field) => json_row(buf, field, keep),
                    }
                };
                return Ok(Some(Row {
                    index,
                    line,
                    id,
                    values,
                }));
            },
            Inner::Csv {
                reader,
                column,
                keep,
                record,
                unterminated_len,
                ..
            } => {
                let more = reader
                    .read_byte_record(record)
                    .map_err(|e| csv_error(&self.path, e))?;
                if !more {
                    return Ok(None);
                }
                // The csv crate's record position counts skipped blank lines as the record's
                // start, so name the line the record ends on instead (its only line, mostly).
                let pos = reader.position();
                let line = if Some(pos.byte()) == *unterminated_len {
                    pos.line()
                } else {
                    pos.line().saturating_sub(1)
                };
                self.cursor.byte = pos.byte();
                self.cursor.line = pos.line();
                let index = self.cursor.row;
                self.cursor.row += 1;
                let id = match record.get(*column) {
                    None => Err(format!(
                        "record has {} fields, no value for the ID column",
                        record.len()
                    )),
                    Some(raw) => match std::str::from_utf8(raw) {
                        Err(_) => Err("ID is not valid UTF-8".to_string()),
                        Ok(s) if s.trim().is_empty() => Err("ID is empty".to_string()),
                        Ok(s) => Ok(s.trim().to_string()),
                    },
                };
                let (id, values) = match id {
                    Ok(id) if !keep.is_empty() => match csv_values(record, keep) {
                        Ok(values) => (Ok(id), Some(values)),
                        Err(reason) => (Err(reason), None),
                    },
                    id => (id, None),
                };
                Ok(Some(Row {
                    index,
                    line,
                    id,
                    values,
                }))
            }
            Inner::Parquet(rows) => {
                let row = rows.next_row()?;
                self.cursor = rows.cursor();
                Ok(row)
            }
            Inner::Folder(rows) => {
                let row = rows.next_row()?;
                self.cursor = rows.cursor();
                Ok(row)
            }
        }
    }
}

/// A file read up to `end` only (see [`InputReader::open_bounded`]).
struct Bounded {
    file: File,
    pos: u64,
    end: u64,
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end.saturating_sub(self.pos);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if n == 0 {
            return Ok(0);
        }
        let read = self.file.read(&mut buf[..n])?;
        self.pos += read as u64;
        Ok(read)
    }
}

impl Seek for Bounded {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.pos = self.file.seek(to)?;
        Ok(self.pos)
    }
}

fn unterminated_len(file: &mut Bounded) -> io::Result<Option<u64>> {
    let len = file.file.metadata()?.len().min(file.end);
    if len == 0 {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(if last[0] == b'\n' { None } else { Some(len) })
}

fn csv_error(path: &Path, e: csv::Error) -> InputError {
    let line = e.position().map(|p| p.line()).unwrap_or(0);
    match e.into_kind() {
        csv::ErrorKind::Io(source) => InputError::Read {
            path: path.to_owned(),
            source,
        },
        kind => InputError::BadLine {
            path: path.to_owned(),
            line,
            reason: format!("CSV error: {kind:?}"),
        },
    }
}

/// The index of the header row's column `name`, or why there is none (naming the columns).
fn csv_column(headers: &csv::ByteRecord, name: &str) -> Result<usize, String> {
    headers
        .iter()
        .position(|h| trim_bom(h) == name.as_bytes())
        .ok_or_else(|| {
            let names: Vec<String> = headers
                .iter()
                .map(|h| String::from_utf8_lossy(trim_bom(h)).into_owned())
                .collect();
            format!(
                "the header row has no column {name:?} (columns: {})",
                names.join(", ")
            )
        })
}

/// A CSV record's kept columns as one JSON object of strings (as written: not trimmed), or
/// why the record has no value for one.
fn csv_values(record: &csv::ByteRecord, keep: &[(String, usize)]) -> Result<String, String> {
    let mut values = serde_json::Map::with_capacity(keep.len());
    for (name, at) in keep {
        let raw = record.get(*at).ok_or_else(|| {
            format!(
                "record has {} fields, no value for the column {name:?}",
                record.len()
            )
        })?;
        let text = std::str::from_utf8(raw)
            .map_err(|_| format!("the column {name:?} is not valid UTF-8"))?;
        values.insert(name.clone(), serde_json::Value::String(text.to_owned()));
    }
    Ok(serde_json::Value::Object(values).to_string())
}

fn trim_bom(field: &[u8]) -> &[u8] {
    field.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(field)
}

/// A line with nothing but whitespace (Unicode whitespace and a byte-order mark included):
/// not a row.
fn is_blank(line: &[u8]) -> bool {
    if line.iter().all(|b| b.is_ascii_whitespace()) {
        return true;
    }
    match std::str::from_utf8(line) {
        Ok(s) => s.strip_prefix('\u{feff}').unwrap_or(s).trim().is_empty(),
        Err(_) => false,
    }
}

fn text_id(line: &[u8]) -> Result<String, String> {
    let s = std::str::from_utf8(line).map_err(|_| "line is not valid UTF-8".to_string())?;
    let s = s.strip_prefix('\u{feff}').unwrap_or(s);
    Ok(s.trim().to_string())
}

/// A JSON line's ID and its kept fields (one JSON object, each field's value as written),
/// or why it has none: a kept field that is absent or null is a bad row.
fn json_row(line: &[u8], field: &str, keep: &[String]) -> (Result<String, String>, Option<String>) {
    let parsed = std::str::from_utf8(line)
        .map_err(|_| "line is not valid UTF-8".to_string())
        .and_then(|s| {
            serde_json::from_str::<serde_json::Value>(s.trim())
                .map_err(|e| format!("not valid JSON: {e}"))
        });
    let mut object = match parsed {
        Ok(serde_json::Value::Object(object)) => object,
        Ok(_) => return (Err("line is not a JSON object".to_string()), None),
        Err(reason) => return (Err(reason), None),
    };
    let id = match json_id(&object, field) {
        Ok(id) => id,
        Err(reason) => return (Err(reason), None),
    };
    if keep.is_empty() {
        return (Ok(id), None);
    }
    let mut values = serde_json::Map::with_capacity(keep.len());
    for name in keep {
        match object.remove(name) {
            None => return (Err(format!("object has no field {name:?}")), None),
            Some(serde_json::Value::Null) => return (Err(format!("field {name:?} is null")), None),
            Some(value) => {
                values.insert(name.clone(), value);
            }
        }
    }
    (Ok(id), Some(serde_json::Value::Object(values).to_string()))
}

fn json_id(
    object: &serde_json::Map<String, serde_json::Value>,
    field: &str,
) -> Result<String, String> {
    match object.get(field) {
        None => Err(format!("object has no field {field:?}")),
        Some(serde_json::Value::String(s)) if s.is_empty() => {
            Err(format!("field {field:?} is empty"))
        }
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(format!(
            "field {field:?} is not a string or a number: {other}"
        )),
    }
}

/// Read one line (through `\n`) into `buf`, keeping at most [`MAX_LINE_BYTES`] of it.
/// Returns the bytes consumed from the reader and whether the line was cut.
fn read_line_capped(reader: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<(usize, bool)> {
    buf.clear();
    let mut consumed = 0;
    let mut overlong = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok((consumed, overlong));
        }
        let (chunk, done) = match memchr_newline(available) {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        if !overlong {
            if buf.len() + chunk.len() > MAX_LINE_BYTES + 1 {
                overlong = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let n = chunk.len();
        consumed += n;
        reader.consume(n);
        if done {
            return Ok((consumed, overlong));
        }
    }
}

fn memchr_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

/// Guess the format from the file extension: `.csv`, `.jsonl`/`.ndjson`, `.parquet`, anything
/// else text.
pub fn format_from_extension(path: &Path) -> &'static str {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .as_deref()
    {
        Some("csv") => "csv",
        Some("jsonl") | Some("ndjson") => "jsonl",
        Some("parquet") => "parquet",
        _ => "text",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(content: &[u8], ext: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("input.{ext}"));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(content)
            .unwrap();
        (dir, path)
    }

    #[test]
    fn a_bounded_reader_stops_at_the_fingerprinted_length() {
        let ids = |spec: &InputSpec, cursor: Cursor, end: u64| {
            let mut r = InputReader::open_bounded(spec, cursor, end).unwrap();
            let mut out = vec![];
            while let Some(row) = r.next_row().unwrap() {
                out.push(row.id.unwrap());
            }
            (out, r.cursor())
        };
        // The job saw "a\nb\n"; a producer has since written "c\nd" (d still being written).
        let (_d, path) = write(b"a\nb\nc\nd", "txt");
        let text = InputSpec {
            path,
            format: InputFormat::Text,
        };
        let (got, cursor) = ids(&text, Cursor::default(), 4);
        assert_eq!(got, ["a", "b"]);
        assert_eq!(cursor.byte, 4);
        // Resumed at the end, nothing more is read until the input is checked again.
        assert!(ids(&text, cursor, 4).0.is_empty());
        // Checked again at 6 bytes: only "c", never the half-written "d".
        assert_eq!(ids(&text, cursor, 6).0, ["c"]);

        let (_d, path) = write(b"id,x\n1,a\n2,b\n3,c\n4", "csv");
        let csv = InputSpec {
            path,
            format: InputFormat::Csv {
                column: "id".into(),
            },
        };
        let (got, cursor) = ids(&csv, Cursor::default(), 13);
        assert_eq!(got, ["1", "2"]);
        assert_eq!(ids(&csv, cursor, 17).0, ["3"]);
    }

    fn all(spec: &InputSpec, cursor: Cursor) -> Vec<(u64, u64, Result<String, String>)> {
        let mut r = InputReader::open(spec, cursor).unwrap();
        let mut out = vec![];
        while let Some(row) = r.next_row().unwrap() {
            out.push((row.index, row.line, row.id));
        }
        out
    }

    /// Every row's ID (or why none) with its kept values, read from `cursor` on.
    fn kept(
        spec: &InputSpec,
        cursor: Cursor,
        columns: &[&str],
    ) -> Vec<(Result<String, String>, Option<String>)> {
        let mut r = InputReader::open(spec, cursor).unwrap();
        let columns: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        r.keep_columns(&columns).unwrap();
        let mut out = vec![];
        while let Some(row) = r.next_row().unwrap() {
            out.push((row.id, row.values));
        }
        out
    }

    #[test]
    fn kept_csv_columns_are_read_beside_the_id_and_a_missing_one_is_a_bad_row() {
        let (_d, path) = write(
            "name,id,domain\n\"Smith, J\",1, a.example \n\"\"\"q\"\" é\",2,b\nc,3\n,4,\n"
                .as_bytes(),
            "csv",
        );
        let spec = InputSpec {
            path: path.clone(),
            format: InputFormat::Csv {
                column: "id".into(),
            },
        };
        let rows = kept(&spec, Cursor::default(), &["domain", "name"]);
        assert_eq!(
            rows,
            vec![
                (
                    Ok("1".into()),
                    Some(r#"{"domain":" a.example ","name":"Smith, J"}"#.into())
                ),
                (
                    Ok("2".into()),
                    Some(r#"{"domain":"b","name":"\"q\" é"}"#.into())
                ),
                (
                    Err("record has 2 fields, no value for the column \"domain\"".into()),
                    None
                ),
                (Ok("4".into()), Some(r#"{"domain":"","name":""}"#.into())),
            ]
        );
        // Read again from a row's cursor, the values are the same.
        let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
        r.next_row().unwrap();
        assert_eq!(kept(&spec, r.cursor(), &["domain", "name"]), rows[1..]);
        let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
        let err = r.keep_columns(&["nme".into()]).unwrap_err().to_string();
        assert!(
            err.contains("no column \"nme\" (columns: name, id, domain)"),
            "{err}"
        );
        assert!(err.contains(&path.display().to_string()), "{err}");
    }

    #[test]
    fn kept_jsonl_fields_keep_their_json_and_absent_or_null_is_a_bad_row() {
        let (_d, path) = write(
            concat!(
                r#"{"k":"a","geo":{"lat":1.5},"n":2}"#,
                "\n",
                r#"{"k":"b","n":3}"#,
                "\n",
                r#"{"k":"c","geo":null,"n":1}"#,
                "\n"
            )
            .as_bytes(),
            "jsonl",
        );
        let spec = InputSpec {
            path,
            format: InputFormat::Jsonl { field: "k".into() },
        };
        assert_eq!(
            kept(&spec, Cursor::default(), &["n", "geo"]),
            vec![
                (Ok("a".into()), Some(r#"{"geo":{"lat":1.5},"n":2}"#.into())),
                (Err("object has no field \"geo\"".into()), None),
                (Err("field \"geo\" is null".into()), None),
            ]
        );
        assert_eq!(
            kept(&spec, Cursor::default(), &[])[0],
            (Ok("a".into()), None)
        );
        let (_d, path) = write(b"a\n", "txt");
        let text = InputSpec {
            path,
            format: InputFormat::Text,
        };
        let mut r = InputReader::open(&text, Cursor::default()).unwrap();
        let err = r.keep_columns(&["x".into()]).unwrap_err().to_string();
        assert!(err.contains("no columns"), "{err}");
    }

    #[test]
    fn text_trims_and_skips_blank_lines() {
        let (_d, path) = write(b"  a \r\n\n b/c?d#e%f \n\t\nz\xc3\xa9", "txt");
        let spec = InputSpec {
            path,
            format: InputFormat::Text,
        };
        let rows = all(&spec, Cursor::default());
        assert_eq!(
            rows,
            vec![
                (0, 1, Ok("a".into())),
                (1, 3, Ok("b/c?d#e%f".into())),
                (2, 5, Ok("zé".into()))
            ]
        );
    }

    #[test]
    fn lines_blank_after_trimming_unicode_whitespace_are_not_rows() {
        let (_d, path) = write(
            b"\xef\xbb\xbf\r\nid-1\r\n\xc2\xa0\r\n\xe2\x80\x83\nid-2",
            "txt",
        );
        let spec = InputSpec {
            path,
            format: InputFormat::Text,
        };
        let rows = all(&spec, Cursor::default());
        assert_eq!(
            rows,
            vec![(0, 2, Ok("id-1".into())), (1, 5, Ok("id-2".into()))]
        );
    }

    #[test]
    fn text_invalid_utf8_is_a_bad_row_with_its_line() {
        let (_d, path) = write(b"a\n\xff\xfe\nb\n", "txt");
        let spec = InputSpec {
            path,
            format: InputFormat::Text,
        };
        let rows = all(&spec, Cursor::default());
        assert_eq!(rows[1].0, 1);
        assert_eq!(rows[1].1, 2);
        assert!(rows[1].2.is_err());
        assert_eq!(rows[2].2, Ok("b".into()));
    }

    #[test]
    fn cursor_resumes_at_the_same_rows() {
        let (_d, path) = write(b"a\n\nb\nc\r\nd\n", "txt");
        let spec = InputSpec {
            path,
            format: InputFormat::Text,
        };
        let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
        r.next_row().unwrap();
        r.next_row().unwrap();
        let cursor = r.cursor();
        let rest: Vec<_> = all(&spec, cursor);
        assert_eq!(rest, vec![(2, 4, Ok("c".into())), (3, 5, Ok("d".into()))]);
    }

    #[test]
    fn csv_reads_the_named_column_and_resumes() {
        let (_d, path) = write(
            b"\xEF\xBB\xBFname,id\nx,1\n\ny,\"2,5\"\nshort\nz,3\n",
            "csv",
        );
        let spec = InputSpec {
            path,
            format: InputFormat::Csv {
                column: "id".into(),
            },
        };
        let rows = all(&spec, Cursor::default());
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0], (0, 2, Ok("1".into())));
        assert_eq!(rows[1], (1, 4, Ok("2,5".into())));
        assert_eq!(rows[2].1, 5);
        assert!(rows[2].2.is_err());
        assert_eq!(rows[3], (3, 6, Ok("3".into())));
        let mut r = InputReader::open(&spec, Cursor::default()).unwrap();
        r.next_row().unwrap();
        r.next_row().unwrap();
        let rest = all(&spec, r.cursor());
        assert_eq!(rest[1], (3, 6, Ok("3".into())));
    }

    #[test]
    fn csv_without_the_column_names_the_columns() {
        let (_d, path) = write(b"a,b\n1,2\n", "csv");
        let spec = InputSpec {
            path,
            format: InputFormat::Csv {
                column: "id".into(),
            },
        };
        let err = InputReader::open(&spec, Cursor::default())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("no column \"id\""), "{err}");
        assert!(err.contains("a, b"), "{err}");
    }

    #[test]
    fn jsonl_reads_strings_and_numbers_and_flags_bad_lines() {
        let (_d, path) = write(
            b"{\"id\":\"a\"}\n{\"id\":7}\n[1]\n{\"x\":1}\nnope\n{\"id\":null}\n",
            "jsonl",
        );
        let spec = InputSpec {
            path,
            format: InputFormat::Jsonl { field: "id".into() },
        };
        let rows = all(&spec, Cursor::default());
        assert_eq!(rows[0].2, Ok("a".into()));
        assert_eq!(rows[1].2, Ok("7".into()));
        assert!(rows[2]
            .2
            .as_ref()
            .unwrap_err()
            .contains("not a JSON object"));
        assert!(rows[3].2.as_ref().unwrap_err().contains("no field"));
        assert!(rows[4].2.as_ref().unwrap_err().contains("not valid JSON"));
        assert!(rows[5].2.is_err());
    }

    #[test]
    fn overlong_lines_are_bad_rows_not_memory() {
        let mut content = vec![b'x'; MAX_LINE_BYTES + 10];
        content.extend_from_slice(b"\nok\n");
        let (_d, path) = write(&content, "txt");
        let spec = InputSpec {
            path,
            format: InputFormat::Text,
        };
        let rows = all(&spec, Cursor::default());
        assert!(rows[0].2.is_err());
        assert_eq!(rows[1], (1, 2, Ok("ok".into())));
    }

    #[test]
    fn fingerprint_detects_change_and_prefix() {
        let (_d, path) = write(b"a\nb\n", "txt");
        let f1 = Fingerprint::of_file(&path).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"c\n")
            .unwrap();
        let f2 = Fingerprint::of_file(&path).unwrap();
        assert_ne!(f1, f2);
        assert_eq!(Fingerprint::of_prefix(&path, f1.len).unwrap(), f1);
        assert!(Fingerprint::of_prefix(&path, 100).is_err());
    }
}
