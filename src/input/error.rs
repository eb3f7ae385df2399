//! The errors that stop reading the input ([`InputError`]).

use std::io;
use std::path::PathBuf;

/// Errors that stop reading the input.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The input file or folder could not be opened.
    #[error("cannot open input {path}: {source}")]
    Open {
        /// The input.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// Reading the input failed midway.
    #[error("cannot read input {path}: {source}")]
    Read {
        /// The input.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// A row holds no usable ID (without `--skip-bad-lines`).
    #[error("{path}:{line}: {reason}")]
    BadLine {
        /// The input file.
        path: PathBuf,
        /// The row's 1-based line (for Parquet, its row number).
        line: u64,
        /// Why the row holds no usable ID.
        reason: String,
    },
    /// The file's header (a CSV header row, a Parquet file's footer and schema) does not
    /// fit: no ID column, a column that cannot hold IDs, not a file of the format.
    #[error("{path}: {reason}")]
    Header {
        /// The file.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// A folder input that cannot be read as one: no data files, files of mixed formats.
    #[error("{path}: {reason}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// Why it cannot be read as one input.
        reason: String,
    },
}
