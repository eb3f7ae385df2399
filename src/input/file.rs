//! Reading one input file ([`FileReader`]): text and JSONL line by line, CSV by record,
//! Parquet by row group ([`super::parquet`]), each from a [`Cursor`] and no further than
//! the length the job's fingerprint covers; the rules that turn a line into an ID or a bad
//! line.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::error::InputError;
use super::parquet;
use super::row::{Cursor, Row};
use super::spec::{InputFormat, InputSpec};

/// Longest line we accept: a longer one is a bad line, so a file without newlines cannot
/// make us allocate without bound.
pub(crate) const MAX_LINE_BYTES: usize = 1 << 20;

/// Reads rows from one input file (text, CSV, JSONL or Parquet), starting at a [`Cursor`].
pub(super) struct FileReader {
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
}

impl FileReader {
    /// Open the file `spec.path` and position it at `cursor`, reading no further than byte
    /// `end` (see [`InputReader::open_bounded`](super::InputReader::open_bounded)).
    pub(super) fn open_bounded(
        spec: &InputSpec,
        cursor: Cursor,
        end: u64,
    ) -> Result<FileReader, InputError> {
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
        Ok(FileReader {
            path,
            inner,
            cursor,
        })
    }

    /// Read the values of `columns` (CSV columns, JSONL fields, Parquet columns) beside each
    /// row's ID, into [`Row::values`]. A column the file's header or schema lacks is an error
    /// here; a row without a value for one is a bad row. A text input has no columns.
    pub(super) fn keep_columns(&mut self, columns: &[String]) -> Result<(), InputError> {
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
        }
        Ok(())
    }

    /// The file's path, for messages.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// How many rows the whole file holds, when its format says so without reading them (a
    /// Parquet file's footer); `None` for the line formats, which must be read to know.
    pub(super) fn rows_in_file(&self) -> Option<u64> {
        match &self.inner {
            Inner::Parquet(rows) => Some(rows.rows_in_file()),
            Inner::Lines { .. } | Inner::Csv { .. } => None,
        }
    }

    /// Where the next row starts.
    pub(super) fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// Read the next row; `None` at the end of the input.
    pub(super) fn next_row(&mut self) -> Result<Option<Row>, InputError> {
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
        }
    }
}

/// A file read up to `end` only (see [`FileReader::open_bounded`]).
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
