//! A row of the input ([`Row`]) and the position of the next one ([`Cursor`]), a row
//! boundary any reader can start again at.

use serde::{Deserialize, Serialize};

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
pub(crate) struct Row {
    /// 0-based row index: the position that decides the row's bucket.
    pub index: u64,
    /// 1-based line where the record starts (for Parquet, the 1-based row number), for
    /// messages.
    pub line: u64,
    /// The ID, or why this record has none (a kept column without a value included).
    pub id: Result<String, String>,
    /// The kept columns' values
    /// ([`InputReader::keep_columns`](super::InputReader::keep_columns)) as one JSON object,
    /// in the order they were asked for; none when no column is kept or the row has no ID.
    pub values: Option<String>,
}
