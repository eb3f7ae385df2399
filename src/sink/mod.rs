//! Sink: writing a job's results out, one record per unique ID, in input order.
//!
//! Owns the export formats (JSONL and CSV; Parquet in [`parquet`]) and their
//! fields, and writing them either to
//! standard output or to a file replaced atomically (a temp file in the same directory,
//! synced, then renamed), so a reader never sees half an export. Also owns the error table
//! (`highwater failures`): every failed ID with its class, message, attempts and times, as a
//! table, JSONL or CSV, in input order.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::store::{ExportError, ItemRecord, ItemStatus, JobView, Store};

mod columns;
pub mod parquet;

pub use columns::InputColumns;

/// The columns of a JSONL or CSV export, in order (the JSONL export adds `attempt_errors`
/// and `rerun` when they have a value).
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
    Jsonl,
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
    /// The input columns carried ([`InputColumns`]).
    #[serde(flatten)]
    input: serde_json::Map<String, serde_json::Value>,
}

/// Every final record, or only those with status `only` (failed ones are found without
/// reading the buckets that have none).
pub(crate) async fn for_each(
    store: &impl Store,
    only: Option<ItemStatus>,
    f: &mut dyn FnMut(&str, &ItemRecord) -> io::Result<()>,
) -> Result<(), ExportError> {
    match only {
        Some(ItemStatus::Failed) => store.for_each_failure(None, f).await,
        Some(status) => {
            store
                .for_each_final(&mut |id, r| {
                    if r.status == status {
                        f(id, r)?;
                    }
                    Ok(())
                })
                .await
        }
        None => store.for_each_final(f).await,
    }
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
            let mut w = csv::Writer::from_writer(&mut *out);
            let header = COLUMNS[..8].iter().copied();
            w.write_record(header.chain(columns.names().iter().map(String::as_str)))
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
                let input = input.iter().map(|v| v.as_deref().unwrap_or_default());
                w.write_record(fixed.into_iter().chain(input))
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
        input: serde_json::Map::new(),
    }
}

fn csv_io(e: csv::Error) -> io::Error {
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
        return parquet::export_to_file(store, only, false, columns, path).await;
    }
    replace_atomically(path, async |out| {
        export(store, format, only, columns, out).await
    })
    .await
}

/// Write `path` through `write`, atomically: into a temp file in the same directory, which
/// is synced and then renamed over `path`. Returns what `write` returns.
pub(crate) async fn replace_atomically(
    path: &Path,
    write: impl AsyncFnOnce(&mut BufWriter<tempfile::NamedTempFile>) -> Result<u64, ExportError>,
) -> Result<u64, ExportError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    let mut out = BufWriter::with_capacity(1 << 20, tmp);
    let count = write(&mut out).await?;
    let tmp = out.into_inner().map_err(|e| e.into_error())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(count)
}

/// Formats of the error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum FailuresFormat {
    Table,
    Jsonl,
    Csv,
}

/// Which failures to list.
#[derive(Debug, Clone, Default)]
pub struct FailureFilter {
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

/// How many buckets with failures the human `status` names (`--json` has more).
const HUMAN_BUCKETS_SHOWN: usize = 20;

/// What `status` says about failures: the buckets committed with failures (the first
/// `cap`, with the total) and the failed IDs by error class.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FailureSummary {
    pub buckets: Vec<u64>,
    pub buckets_total: u64,
    pub by_class: std::collections::BTreeMap<String, u64>,
}

impl FailureSummary {
    /// Read from the commit records (and the items of buckets they do not cover).
    pub async fn of(store: &impl Store, cap: usize) -> Result<FailureSummary, ExportError> {
        let failed = store.failed_buckets().await?;
        let mut s = FailureSummary {
            buckets: failed.iter().take(cap).map(|c| c.bucket).collect(),
            buckets_total: failed.len() as u64,
            by_class: Default::default(),
        };
        // Commit records count their failures by class; only buckets committed before they
        // did, and buckets not committed yet, are counted from their items.
        let mut scan: Vec<u64> = store
            .open_buckets()
            .await?
            .iter()
            .map(|o| o.bucket)
            .collect();
        for c in &failed {
            if c.classes_complete() {
                for (class, n) in &c.failed_by_class {
                    *s.by_class.entry(class.clone()).or_default() += n;
                }
            } else {
                scan.push(c.bucket);
            }
        }
        for bucket in scan {
            store
                .for_each_failure(Some(bucket), &mut |_, r| {
                    *s.by_class.entry(crate::store::class_name(r)).or_default() += 1;
                    Ok(())
                })
                .await?;
        }
        Ok(s)
    }

    /// Human lines for `status`.
    pub fn render(&self) -> String {
        if self.buckets_total == 0 {
            return String::new();
        }
        let list: Vec<String> = self
            .buckets
            .iter()
            .take(HUMAN_BUCKETS_SHOWN)
            .map(u64::to_string)
            .collect();
        let more = self.buckets_total - list.len() as u64;
        let classes: Vec<String> = self
            .by_class
            .iter()
            .map(|(c, n)| format!("{c} {n}"))
            .collect();
        format!(
            "committed with failures: {} bucket(s): {}{}\nfailed by class: {}\n",
            self.buckets_total,
            list.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            classes.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_summary_names_a_few_buckets_and_counts_the_rest() {
        let s = FailureSummary {
            buckets: (0..100).collect(),
            buckets_total: 250,
            by_class: [("http".to_string(), 7), ("timeout".to_string(), 2)].into(),
        };
        let text = s.render();
        assert!(text.contains("250 bucket(s): 0, 1,"), "{text}");
        assert!(text.contains("19 and 230 more"), "{text}");
        assert!(text.contains("http 7, timeout 2"), "{text}");
        assert_eq!(FailureSummary::default().render(), "");
    }

    #[tokio::test]
    async fn classes_come_from_commit_records_or_from_the_items_of_older_ones() {
        use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};
        use crate::store::{
            Commit, CommitRecord, LeaseScope, Leases, OffsetRecord, PlannedBucket, PlannerState,
        };
        let dir = tempfile::tempdir().unwrap();
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        let row = |row| crate::input::Cursor {
            row,
            ..Default::default()
        };
        let offset = |bucket| OffsetRecord {
            bucket,
            start: row(bucket),
            end: row(bucket + 1),
            items: 1,
            duplicates: 0,
            bad_lines: 0,
            input: crate::input::Fingerprint { len: 1, xxh3: 1 },
            planned_at_ms: 0,
        };
        let planned = |bucket: u64, id: &str| PlannedBucket {
            offset: offset(bucket),
            items: vec![(bucket, id.to_string())],
            bad_lines: vec![],
            values: Vec::new(),
        };
        s.plan(
            &[planned(0, "a"), planned(1, "b")],
            &PlannerState::default(),
        )
        .await
        .unwrap();
        let failed = |bucket| {
            let mut r = ItemRecord::pending(bucket, bucket);
            r.status = ItemStatus::Failed;
            r.class = Some(crate::failure::ErrorClass::Http);
            r
        };
        s.record(&[("a".into(), failed(0)), ("b".into(), failed(1))])
            .await
            .unwrap();
        let lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
        let commits = [
            // Written before commit records counted classes: counted from the items.
            CommitRecord {
                bucket: 0,
                failed: 1,
                ..CommitRecord::default()
            },
            // Complete: taken as it is (the class differs on purpose, to tell them apart).
            CommitRecord {
                bucket: 1,
                failed: 1,
                failed_by_class: [("timeout".to_string(), 1)].into(),
                ..CommitRecord::default()
            },
        ];
        s.commit(&lease, Commit::Job(&commits)).await.unwrap();
        let summary = FailureSummary::of(&s, 10).await.unwrap();
        assert_eq!(summary.buckets, vec![0, 1]);
        assert_eq!(
            summary.by_class,
            [("http".to_string(), 1), ("timeout".to_string(), 1)].into()
        );
    }
}
