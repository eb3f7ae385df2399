//! The error table (`highwater failures`): every failed ID with its class, message,
//! attempts and times, as a table, JSONL or CSV, in input order.

use std::io::{self, Write};

use serde::Serialize;

use super::export::csv_io;
use crate::store::{ExportError, ItemRecord, JobView, Store};

/// Formats of the error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum FailuresFormat {
    /// Aligned columns for a terminal.
    Table,
    /// One JSON object per line.
    Jsonl,
    /// CSV with a header row.
    Csv,
}

/// Which failures to list.
#[derive(Debug, Clone, Default)]
pub struct FailureFilter {
    /// Only this bucket's failures.
    pub bucket: Option<u64>,
    /// An error class name (one of [`ErrorClass::ALL`](crate::failure::ErrorClass::ALL)).
    pub class: Option<String>,
}

#[derive(Serialize)]
struct FailureRow<'a> {
    id: &'a str,
    bucket: u64,
    row: u64,
    error_class: Option<String>,
    http_status: Option<u16>,
    error: Option<&'a str>,
    attempts: u32,
    first_attempt: Option<String>,
    last_attempt: Option<String>,
    /// Each failed attempt's class (and HTTP status), oldest first.
    attempt_classes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rerun: Option<u32>,
}

fn rfc3339(ms: Option<u64>) -> Option<String> {
    ms.map(|ms| {
        humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        )
        .to_string()
    })
}

fn failure_row<'a>(id: &'a str, r: &'a ItemRecord) -> FailureRow<'a> {
    FailureRow {
        id,
        bucket: r.bucket,
        row: r.row,
        error_class: r.class.map(|c| c.to_string()),
        http_status: r.http_status,
        error: r.error.as_deref(),
        attempts: r.attempts,
        first_attempt: rfc3339(r.first_attempt_ms),
        last_attempt: rfc3339(r.last_attempt_ms),
        attempt_classes: r
            .attempt_errors
            .iter()
            .map(|n| match n.http_status {
                Some(s) => format!("{} {s}", n.class),
                None => n.class.to_string(),
            })
            .collect(),
        rerun: r.rerun,
    }
}

/// Write the failed IDs matching `filter` to `out`, in input order. Returns how many.
pub async fn failures(
    store: &impl Store,
    format: FailuresFormat,
    filter: &FailureFilter,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let mut count = 0;
    let columns = [
        "id",
        "bucket",
        "row",
        "error_class",
        "http_status",
        "error",
        "attempts",
        "first_attempt",
        "last_attempt",
        "attempt_classes",
    ];
    let mut table = IdColumn::default();
    match format {
        FailuresFormat::Table => {}
        FailuresFormat::Csv => {
            out.write_all((columns.join(",") + "\n").as_bytes())?;
        }
        FailuresFormat::Jsonl => {}
    }
    store
        .for_each_failure(filter.bucket, &mut |id, r| {
            if let Some(class) = &filter.class {
                if r.class.map(|c| c.to_string()).as_deref() != Some(class.as_str()) {
                    return Ok(());
                }
            }
            let row = failure_row(id, r);
            match format {
                FailuresFormat::Jsonl => {
                    serde_json::to_writer(&mut *out, &row).map_err(io::Error::from)?;
                    out.write_all(b"\n")?;
                }
                FailuresFormat::Csv => {
                    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
                    w.write_record([
                        row.id,
                        &row.bucket.to_string(),
                        &row.row.to_string(),
                        row.error_class.as_deref().unwrap_or_default(),
                        &row.http_status.map(|s| s.to_string()).unwrap_or_default(),
                        row.error.unwrap_or_default(),
                        &row.attempts.to_string(),
                        row.first_attempt.as_deref().unwrap_or_default(),
                        row.last_attempt.as_deref().unwrap_or_default(),
                        &row.attempt_classes.join(";"),
                    ])
                    .map_err(csv_io)?;
                    out.write_all(&w.into_inner().map_err(|e| e.into_error())?)?;
                }
                FailuresFormat::Table => {
                    let rest = format!(
                        "{:>7} {:<10} {:>4} {:>8}  {:<24} {:<24} {}",
                        row.bucket,
                        row.error_class.as_deref().unwrap_or("-"),
                        row.http_status.map(|s| s.to_string()).unwrap_or("-".into()),
                        row.attempts,
                        row.first_attempt.as_deref().unwrap_or("-"),
                        row.last_attempt.as_deref().unwrap_or("-"),
                        row.error.unwrap_or("-"),
                    );
                    table.row(out, row.id, rest)?;
                }
            }
            count += 1;
            Ok(())
        })
        .await?;
    if format == FailuresFormat::Table {
        table.flush(out)?;
    }
    out.flush()?;
    Ok(count)
}

/// The ID column of the failures table, sized to the IDs: as wide as the longest of the
/// first [`IdColumn::SAMPLE`] rows (held back until then, so memory stays bounded), at
/// least the heading, at most [`IdColumn::MAX`]. A longer ID is cut, its last character
/// shown as `…`, so every row stays in line (the JSONL and CSV forms keep it whole).
#[derive(Default)]
struct IdColumn {
    width: Option<usize>,
    held: Vec<(String, String)>,
}

impl IdColumn {
    const SAMPLE: usize = 1000;
    const MAX: usize = 64;

    fn row(&mut self, out: &mut dyn Write, id: &str, rest: String) -> io::Result<()> {
        match self.width {
            Some(width) => writeln!(out, "{} {rest}", cell(id, width)),
            None => {
                self.held.push((id.to_owned(), rest));
                if self.held.len() >= Self::SAMPLE {
                    self.flush(out)?;
                }
                Ok(())
            }
        }
    }

    /// Fix the width (if not yet), write the heading and the rows held back.
    fn flush(&mut self, out: &mut dyn Write) -> io::Result<()> {
        if self.width.is_some() {
            return Ok(());
        }
        let longest = self.held.iter().map(|(id, _)| id.chars().count()).max();
        let width = longest.unwrap_or(0).clamp("ID".len(), Self::MAX);
        self.width = Some(width);
        writeln!(
            out,
            "{} {:>7} {:<10} {:>4} {:>8}  {:<24} {:<24} ERROR",
            cell("ID", width),
            "BUCKET",
            "CLASS",
            "HTTP",
            "ATTEMPTS",
            "FIRST ATTEMPT",
            "LAST ATTEMPT"
        )?;
        for (id, rest) in std::mem::take(&mut self.held) {
            writeln!(out, "{} {rest}", cell(&id, width))?;
        }
        Ok(())
    }
}

/// `text` in exactly `width` characters: padded, or cut with `…` as its last one.
fn cell(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        format!("{text}{}", " ".repeat(width - n))
    } else {
        let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}
