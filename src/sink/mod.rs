//! Sink: writing a job's results out, one record per unique ID, in input order.
//!
//! Owns the export formats (JSONL and CSV; Parquet in [`parquet`]) and their fields, and
//! writing them either to standard output or to a file replaced atomically (a temp file in
//! the same directory, synced, then renamed), so a reader never sees half an export. Also
//! owns the error table (`highwater failures`): every failed ID with its class, message,
//! attempts and times, as a table, JSONL or CSV, in input order.

mod atomic;
mod columns;
mod export;
#[cfg(test)]
mod export_tests;
mod failures;
pub mod parquet;
mod records;
mod summary;

pub use columns::InputColumns;
pub use export::{export, export_to_file, ExportFormat, COLUMNS};
pub use failures::{failures, FailureFilter, FailuresFormat};
pub use summary::FailureSummary;
