//! Input: reading IDs from a file, streamed, with the byte positions needed to re-read it.
//!
//! Owns the four input formats (plain text, CSV, JSONL, Parquet), the rules that turn a line into an
//! ID or into a bad line, the [`Cursor`] that lets a reader start again at any row boundary
//! without re-reading what came before, and the input [`Fingerprint`] that detects a changed
//! file on resume. A folder of files is read as one input (the `folder` module).
//!
//! Rows are what buckets are cut from: every data record is a row (a non-blank line of a text
//! or JSONL file, a CSV record after the header, a row of a Parquet file), including records
//! that turn out to be bad. Bad lines keep their row number so bucket boundaries never depend
//! on `--skip-bad-lines`. Nothing here holds more than one line (or, for Parquet, the footer and
//! one page and batch of the ID column) in memory.
//!
//! The parts, one file each: `spec` (the [`InputSpec`] and its [`InputFormat`]), `row` (a
//! `Row` and the [`Cursor`] of the next one), `error`, `fingerprint`, `file` (reading
//! one file of any format), `parquet` (a Parquet file's rows), `folder` (a folder of files
//! read as one, each by `file`) and `reader` (the `InputReader` that opens either).

mod error;
mod file;
mod fingerprint;
mod folder;
mod parquet;
mod reader;
mod row;
mod spec;
#[cfg(test)]
mod tests;

pub use error::InputError;
pub use fingerprint::Fingerprint;
#[cfg(feature = "cli")]
pub(crate) use folder::format_of as folder_format;
pub use folder::InputFile;
pub(crate) use folder::{
    fingerprint as folder_fingerprint, fingerprint_files as folder_files,
    fingerprint_planned as folder_fingerprint_planned, folder_of, is_folder_input,
    list as folder_list,
};
#[cfg(test)]
pub(crate) use parquet::test_file as parquet_test_file;
pub(crate) use reader::InputReader;
pub use row::Cursor;
#[cfg(feature = "cli")]
pub(crate) use spec::format_from_extension;
pub use spec::{InputFormat, InputSpec};
