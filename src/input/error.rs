//! The errors that stop reading the input ([`InputError`]).

use std::io;
use std::path::PathBuf;

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
