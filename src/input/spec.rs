//! Where the IDs come from and how they are laid out: an [`InputSpec`] (a file, or a folder
//! read as one), its [`InputFormat`], and the format a file's extension suggests
//! ([`format_from_extension`]).

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How IDs are laid out in the input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum InputFormat {
    /// One ID per line; surrounding whitespace and `\r` trimmed; blank lines skipped.
    Text,
    /// A header row, then records; the ID is in the named column.
    Csv {
        /// The ID column's name in the header row.
        column: String,
    },
    /// One JSON object per line; the ID is the named field (a string or a number).
    Jsonl {
        /// The ID field's name.
        field: String,
    },
    /// A Parquet file, read by row group; the ID is the named top-level column (strings,
    /// binary UTF-8 or integers).
    Parquet {
        /// The ID column's name.
        column: String,
    },
}

impl fmt::Display for InputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputFormat::Text => write!(f, "text"),
            InputFormat::Csv { column } => write!(f, "csv (column {column:?})"),
            InputFormat::Jsonl { field } => write!(f, "jsonl (field {field:?})"),
            InputFormat::Parquet { column } => write!(f, "parquet (column {column:?})"),
        }
    }
}

/// Where the IDs come from: the file (or the folder of files, read as one) and how to read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSpec {
    /// The input file, or a folder read as one input.
    pub path: PathBuf,
    /// How IDs are laid out in it.
    pub format: InputFormat,
}

/// Guess the format from the file extension: `.csv`, `.jsonl`/`.ndjson`, `.parquet`, anything
/// else text.
#[cfg(any(test, feature = "cli"))]
pub(crate) fn format_from_extension(path: &std::path::Path) -> &'static str {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .as_deref()
    {
        Some("csv") => "csv",
        Some("jsonl") | Some("ndjson") => "jsonl",
        Some("parquet") => "parquet",
        _ => "text",
    }
}
