//! The JSONL and CSV exports: a job's final results, one record per unique ID, in input
//! order, with their fields ([`COLUMNS`]), written to a stream or to a file replaced
//! atomically (a Parquet export is sent to [`super::parquet`]).

use std::cell::RefCell;
use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;
use serde_json::value::RawValue;

use super::atomic::replace_atomically;
use super::columns::InputColumns;
use super::parquet;
use super::records::{stream, Rows};
use crate::store::{ExportError, FinalVisit, ItemRecord, ItemStatus, Store};

/// The columns of a JSONL or CSV export, in order (the JSONL export adds `attempt_errors`,
/// `rerun` and `usage` when they have a value; the CSV export of a job whose answers
/// reported usage adds `usage_input` and `usage_output` after `bucket`).
pub const COLUMNS: [&str; 10] = [
    "id",
    "status",
    "http_status",
    "body",
    "error",
    "error_class",
    "attempts",
    "bucket",
    "attempt_errors",
    "rerun",
];

/// Export file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum ExportFormat {
    /// One JSON object per line.
    Jsonl,
    /// CSV with a header row.
    Csv,
    /// Written to a file only (with --output).
    Parquet,
}

/// A JSON line's fields: those before its body, its body, those after it (split so that a
/// paginated ID's body is written between them, page by page, as [`JsonLines`] does).
#[derive(Serialize)]
struct ExportRow<'a> {
    #[serde(flatten)]
    head: RowHead<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a RawValue>,
    #[serde(flatten)]
    tail: RowTail<'a>,
}

/// A JSON line's fields before its body.
#[derive(Serialize)]
struct RowHead<'a> {
    id: &'a str,
    status: ItemStatus,
    http_status: Option<u16>,
}

/// A JSON line's fields after its body.
#[derive(Serialize)]
struct RowTail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_class: Option<String>,
    attempts: u32,
    bucket: u64,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    attempt_errors: &'a [crate::failure::AttemptNote],
    /// The rerun that wrote the record, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    rerun: Option<u32>,
    /// What the ID's calls cost, if their answers said.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<crate::meter::Usage>,
    /// The input columns carried ([`InputColumns`]).
    #[serde(flatten)]
    input: serde_json::Map<String, serde_json::Value>,
}

/// Write every final result of `store` (with status `only`, if given) to `out`. Returns the
/// number of records. A paginated ID's items are written page by page, never held whole.
pub async fn export(
    store: &impl Store,
    format: ExportFormat,
    only: Option<ItemStatus>,
    columns: &InputColumns,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let count = match format {
        ExportFormat::Jsonl => {
            let mut lines = JsonLines {
                out: &mut *out,
                columns,
                count: 0,
                open: None,
            };
            stream(store, only, &mut lines).await?;
            lines.count
        }
        ExportFormat::Csv => {
            let usage = !crate::store::JobView::stats(store).await?.usage.is_zero();
            let out = RefCell::new(&mut *out);
            let mut w = csv::Writer::from_writer(Through(&out));
            let header = COLUMNS[..8].iter().copied();
            let usage_header = ["usage_input", "usage_output"]
                .into_iter()
                .filter(|_| usage);
            w.write_record(
                header
                    .chain(usage_header)
                    .chain(columns.names().iter().map(String::as_str)),
            )
            .map_err(csv_io)?;
            let mut rows = CsvRows {
                w,
                out: &out,
                columns,
                usage,
                count: 0,
                open: None,
            };
            stream(store, only, &mut rows).await?;
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

fn row<'a>(id: &'a str, r: &'a ItemRecord) -> ExportRow<'a> {
    ExportRow {
        head: RowHead {
            id,
            status: r.status,
            http_status: r.http_status,
        },
        body: r.body.as_deref(),
        tail: RowTail {
            error: r.error.as_deref(),
            error_class: r.class.map(|c| c.to_string()),
            attempts: r.attempts,
            bucket: r.bucket,
            attempt_errors: &r.attempt_errors,
            rerun: r.rerun,
            usage: r.usage,
            input: serde_json::Map::new(),
        },
    }
}

/// The JSONL export: a record per line, a paginated ID's body written page by page.
struct JsonLines<'a> {
    out: &'a mut dyn Write,
    columns: &'a InputColumns,
    count: u64,
    /// Of the paginated record begun: its fields after the body (a JSON object), and whether
    /// any item was written.
    open: Option<(Vec<u8>, bool)>,
}

impl Rows for JsonLines<'_> {
    fn row(&mut self, id: &str, r: &ItemRecord) -> io::Result<()> {
        let mut row = row(id, r);
        row.tail.input = self.columns.values(r);
        serde_json::to_writer(&mut *self.out, &row).map_err(io::Error::from)?;
        self.out.write_all(b"\n")?;
        self.count += 1;
        Ok(())
    }
}

impl FinalVisit for JsonLines<'_> {
    fn record(&mut self, id: &str, r: &ItemRecord) -> Result<(), ExportError> {
        Ok(self.row(id, r)?)
    }

    fn begin(&mut self, id: &str, r: &ItemRecord) -> Result<(), ExportError> {
        let mut row = row(id, r);
        row.tail.input = self.columns.values(r);
        // `{"id":...,"http_status":...}` and `{"error":...}`: the line is the first without
        // its `}`, the body, then the second without its `{`.
        let head = serde_json::to_vec(&row.head).map_err(io::Error::from)?;
        let tail = serde_json::to_vec(&row.tail).map_err(io::Error::from)?;
        self.out.write_all(&head[..head.len() - 1])?;
        self.out.write_all(b",\"body\":[")?;
        self.open = Some((tail, false));
        Ok(())
    }

    fn items(&mut self, _page: u32, inner: &str) -> Result<(), ExportError> {
        let (_, any) = self.open.as_mut().expect("items come after begin");
        if *any {
            self.out.write_all(b",")?;
        }
        *any = true;
        Ok(self.out.write_all(inner.as_bytes())?)
    }

    fn end(&mut self) -> Result<(), ExportError> {
        let (tail, _) = self.open.take().expect("end comes after begin");
        self.out.write_all(b"],")?;
        self.out.write_all(&tail[1..])?;
        self.out.write_all(b"\n")?;
        self.count += 1;
        Ok(())
    }
}

/// The export's output, shared by the CSV writer and a paginated ID's body, which is written
/// straight to it between the writer's fields.
struct Through<'a, 'o, W: Write + ?Sized>(&'a RefCell<&'o mut W>);

impl<W: Write + ?Sized> Write for Through<'_, '_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

/// The CSV export: a record per row, a paginated ID's body written page by page.
struct CsvRows<'a, 'o, W: Write + ?Sized> {
    w: csv::Writer<Through<'a, 'o, W>>,
    out: &'a RefCell<&'o mut W>,
    columns: &'a InputColumns,
    /// Whether the rows have the usage columns.
    usage: bool,
    count: u64,
    /// Of the paginated record begun: its fields after the body, and its body so far.
    open: Option<(Vec<String>, CsvBody)>,
}

impl<W: Write + ?Sized> CsvRows<'_, '_, W> {
    /// A record's fields: the four up to its body (none for the body of a paginated record,
    /// written apart), and those after it.
    fn fields(&self, id: &str, r: &ItemRecord) -> (Vec<String>, Vec<String>) {
        let status = match r.status {
            ItemStatus::Ok => "ok",
            ItemStatus::Failed => "failed",
            ItemStatus::Pending => "pending",
        };
        let error = r
            .error
            .as_deref()
            .map(|e| serde_json::to_string(e).expect("strings serialize"));
        let head = vec![
            id.to_string(),
            status.to_string(),
            r.http_status.map(|s| s.to_string()).unwrap_or_default(),
            r.body
                .as_deref()
                .map(RawValue::get)
                .unwrap_or_default()
                .to_string(),
        ];
        let units = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
        let mut tail = vec![
            error.unwrap_or_default(),
            r.class.map(|c| c.to_string()).unwrap_or_default(),
            r.attempts.to_string(),
            r.bucket.to_string(),
        ];
        if self.usage {
            tail.push(units(r.usage.map(|u| u.input)));
            tail.push(units(r.usage.map(|u| u.output)));
        }
        tail.extend(
            self.columns
                .texts(r)
                .into_iter()
                .map(Option::unwrap_or_default),
        );
        (head, tail)
    }
}

impl<W: Write + ?Sized> Rows for CsvRows<'_, '_, W> {
    fn row(&mut self, id: &str, r: &ItemRecord) -> io::Result<()> {
        let (head, tail) = self.fields(id, r);
        self.w
            .write_record(head.iter().chain(&tail))
            .map_err(csv_io)?;
        self.count += 1;
        Ok(())
    }
}

impl<W: Write + ?Sized> FinalVisit for CsvRows<'_, '_, W> {
    fn record(&mut self, id: &str, r: &ItemRecord) -> Result<(), ExportError> {
        Ok(self.row(id, r)?)
    }

    fn begin(&mut self, id: &str, r: &ItemRecord) -> Result<(), ExportError> {
        let (head, tail) = self.fields(id, r);
        // The body's field written empty, so that the writer counts it and puts the comma
        // before it; the body itself goes straight to the output after it.
        for field in &head {
            self.w.write_field(field).map_err(csv_io)?;
        }
        self.w.flush()?;
        self.open = Some((tail, CsvBody::default()));
        Ok(())
    }

    fn items(&mut self, _page: u32, inner: &str) -> Result<(), ExportError> {
        let (_, body) = self.open.as_mut().expect("items come after begin");
        Ok(body.push(&mut *self.out.borrow_mut(), inner)?)
    }

    fn end(&mut self) -> Result<(), ExportError> {
        let (tail, body) = self.open.take().expect("end comes after begin");
        body.end(&mut *self.out.borrow_mut())?;
        for field in &tail {
            self.w.write_field(field).map_err(csv_io)?;
        }
        self.w.write_record(None::<&[u8]>).map_err(csv_io)?;
        self.count += 1;
        Ok(())
    }
}

/// A paginated ID's body as a CSV field, written as its pages come: quoted as the CSV writer
/// quotes a field (when it holds a comma, a quote or a line break; a quote doubled). Until
/// one of those comes, what came is held (at most the ID's one item, as a second one comes
/// after a comma); from then on each page's items are written as they come.
#[derive(Default)]
struct CsvBody {
    /// `[` and the items so far, while the field may yet go unquoted.
    held: Option<String>,
    /// Whether the field was found to need quotes (its opening quote is written).
    quoted: bool,
}

impl CsvBody {
    /// Bytes that make the CSV writer quote a field.
    const SPECIAL: [char; 4] = [',', '"', '\r', '\n'];

    fn push(&mut self, out: &mut dyn Write, inner: &str) -> io::Result<()> {
        if self.quoted {
            out.write_all(b",")?;
            return write_quoted(out, inner);
        }
        let held = self.held.get_or_insert_with(|| String::from("["));
        if held.len() > 1 {
            held.push(',');
        }
        held.push_str(inner);
        if held.contains(Self::SPECIAL) {
            out.write_all(b"\"")?;
            write_quoted(out, held)?;
            self.held = None;
            self.quoted = true;
        }
        Ok(())
    }

    fn end(self, out: &mut dyn Write) -> io::Result<()> {
        if self.quoted {
            return out.write_all(b"]\"");
        }
        out.write_all(self.held.as_deref().unwrap_or("[").as_bytes())?;
        out.write_all(b"]")
    }
}

/// `text` inside a quoted CSV field: each quote doubled.
fn write_quoted(out: &mut dyn Write, text: &str) -> io::Result<()> {
    for (i, part) in text.split('"').enumerate() {
        if i > 0 {
            out.write_all(b"\"\"")?;
        }
        out.write_all(part.as_bytes())?;
    }
    Ok(())
}

pub(super) fn csv_io(e: csv::Error) -> io::Error {
    match e.into_kind() {
        csv::ErrorKind::Io(e) => e,
        other => io::Error::other(format!("{other:?}")),
    }
}

/// Export to `path`, replacing it atomically. Returns the number of records.
pub async fn export_to_file(
    store: &impl Store,
    format: ExportFormat,
    only: Option<ItemStatus>,
    columns: &InputColumns,
    path: &Path,
) -> Result<u64, ExportError> {
    if format == ExportFormat::Parquet {
        return parquet::export_to_file(store, only, Default::default(), columns, path).await;
    }
    replace_atomically(path, async |out| {
        export(store, format, only, columns, out).await
    })
    .await
}
