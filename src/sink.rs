//! Sink: writing a job's results out, one record per unique ID, in input order.
//!
//! Owns the export formats (JSONL and CSV) and their fields, and writing them either to
//! standard output or to a file replaced atomically (a temp file in the same directory,
//! synced, then renamed), so a reader never sees half an export.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::store::{ExportError, ItemRecord, ItemStatus, Store};

/// Export file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Jsonl,
    Csv,
}

#[derive(Serialize)]
struct ExportRow<'a> {
    id: &'a str,
    status: ItemStatus,
    http_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_class: Option<String>,
    attempts: u32,
    bucket: u64,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    attempt_errors: &'a [crate::retry::AttemptNote],
}

/// Write every final result of `store` to `out`. Returns the number of records.
pub fn export(
    store: &impl Store,
    format: ExportFormat,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let mut count = 0;
    match format {
        ExportFormat::Jsonl => store.for_each_final(&mut |id, r| {
            serde_json::to_writer(&mut *out, &row(id, r)).map_err(io::Error::from)?;
            out.write_all(b"\n")?;
            count += 1;
            Ok(())
        })?,
        ExportFormat::Csv => {
            let mut w = csv::Writer::from_writer(&mut *out);
            w.write_record([
                "id",
                "status",
                "http_status",
                "body",
                "error",
                "error_class",
                "attempts",
                "bucket",
            ])
            .map_err(csv_io)?;
            store.for_each_final(&mut |id, r| {
                let status = match r.status {
                    ItemStatus::Ok => "ok",
                    ItemStatus::Failed => "failed",
                    ItemStatus::Pending => "pending",
                };
                let error = r
                    .error
                    .as_deref()
                    .map(|e| serde_json::to_string(e).expect("strings serialize"));
                w.write_record([
                    id,
                    status,
                    &r.http_status.map(|s| s.to_string()).unwrap_or_default(),
                    r.body.as_deref().map(RawValue::get).unwrap_or_default(),
                    error.as_deref().unwrap_or_default(),
                    &r.class.map(|c| c.to_string()).unwrap_or_default(),
                    &r.attempts.to_string(),
                    &r.bucket.to_string(),
                ])
                .map_err(csv_io)?;
                count += 1;
                Ok(())
            })?;
            w.flush()?;
        }
    }
    out.flush()?;
    Ok(count)
}

fn row<'a>(id: &'a str, r: &'a ItemRecord) -> ExportRow<'a> {
    ExportRow {
        id,
        status: r.status,
        http_status: r.http_status,
        body: r.body.as_deref(),
        error: r.error.as_deref(),
        error_class: r.class.map(|c| c.to_string()),
        attempts: r.attempts,
        bucket: r.bucket,
        attempt_errors: &r.attempt_errors,
    }
}

fn csv_io(e: csv::Error) -> io::Error {
    match e.into_kind() {
        csv::ErrorKind::Io(e) => e,
        other => io::Error::other(format!("{other:?}")),
    }
}

/// Export to `path`, replacing it atomically. Returns the number of records.
pub fn export_to_file(
    store: &impl Store,
    format: ExportFormat,
    path: &Path,
) -> Result<u64, ExportError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    let mut out = BufWriter::with_capacity(1 << 20, tmp);
    let count = export(store, format, &mut out)?;
    let tmp = out.into_inner().map_err(|e| e.into_error())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(count)
}
