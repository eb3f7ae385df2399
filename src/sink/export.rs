//! The JSONL and CSV exports: a job's final results, one record per unique ID, in input
//! order, with their fields ([`COLUMNS`]), written to a stream or to a file replaced
//! atomically (a Parquet export is sent to [`super::parquet`]).

use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;
use serde_json::value::RawValue;

use super::atomic::replace_atomically;
use super::columns::InputColumns;
use super::parquet;
use super::records::for_each;
use crate::store::{ExportError, ItemRecord, ItemStatus, Store};

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
/// number of records.
pub async fn export(
    store: &impl Store,
    format: ExportFormat,
    only: Option<ItemStatus>,
    columns: &InputColumns,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let mut count = 0;
    match format {
        ExportFormat::Jsonl => {
            for_each(store, only, &mut |id, r| {
                let mut row = row(id, r);
                row.input = columns.values(r);
                serde_json::to_writer(&mut *out, &row).map_err(io::Error::from)?;
                out.write_all(b"\n")?;
                count += 1;
                Ok(())
            })
            .await?
        }
        ExportFormat::Csv => {
            let usage = !crate::store::JobView::stats(store).await?.usage.is_zero();
            let mut w = csv::Writer::from_writer(&mut *out);
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
            for_each(store, only, &mut |id, r| {
                let status = match r.status {
                    ItemStatus::Ok => "ok",
                    ItemStatus::Failed => "failed",
                    ItemStatus::Pending => "pending",
                };
                let error = r
                    .error
                    .as_deref()
                    .map(|e| serde_json::to_string(e).expect("strings serialize"));
                let input = columns.texts(r);
                let fixed = [
                    id,
                    status,
                    &r.http_status.map(|s| s.to_string()).unwrap_or_default(),
                    r.body.as_deref().map(RawValue::get).unwrap_or_default(),
                    error.as_deref().unwrap_or_default(),
                    &r.class.map(|c| c.to_string()).unwrap_or_default(),
                    &r.attempts.to_string(),
                    &r.bucket.to_string(),
                ];
                let units = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
                let costs = [
                    units(r.usage.map(|u| u.input)),
                    units(r.usage.map(|u| u.output)),
                ];
                let costs = costs.iter().map(String::as_str).filter(|_| usage);
                let input = input.iter().map(|v| v.as_deref().unwrap_or_default());
                w.write_record(fixed.into_iter().chain(costs).chain(input))
                    .map_err(csv_io)?;
                count += 1;
                Ok(())
            })
            .await?;
            w.flush()?;
        }
        ExportFormat::Parquet => {
            return Err(ExportError::Write(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a Parquet export is written to a file, not to a stream",
            )))
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
        rerun: r.rerun,
        usage: r.usage,
        input: serde_json::Map::new(),
    }
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
