//! Sink: writing a job's results out, one record per unique ID, in input order, or one row
//! per item of each ID (a paginated ID's items, `items`).
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
mod item_export;
mod items;
pub mod parquet;
mod records;
mod summary;

pub use columns::InputColumns;
pub use export::{export, export_to_file, ExportFormat, COLUMNS};
pub use failures::{failures, FailureFilter, FailuresFormat};
pub use item_export::{export_items, export_items_to_file};
pub use items::ITEM_COLUMNS;
pub use summary::FailureSummary;
