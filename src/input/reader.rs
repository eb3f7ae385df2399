//! The input's front door ([`InputReader`]): the rows of a file, or of a folder of files
//! read as one, from any [`Cursor`].

use std::path::Path;

use super::error::InputError;
use super::file::FileReader;
use super::folder::{self, FolderRows, InputFile};
use super::row::{Cursor, Row};
use super::spec::InputSpec;

/// Reads rows from an input file (or a folder of files read as one), starting at a
/// [`Cursor`].
pub(crate) struct InputReader {
    inner: Inner,
}

enum Inner {
    File(FileReader),
    /// A folder's rows, and where the next one starts.
    Folder {
        rows: Box<FolderRows>,
        cursor: Cursor,
    },
}

impl InputReader {
    /// Open `spec.path` and position it at `cursor` (use `Cursor::default()` for the start).
    pub(crate) fn open(spec: &InputSpec, cursor: Cursor) -> Result<InputReader, InputError> {
        Self::open_bounded(spec, cursor, u64::MAX)
    }

    /// [`InputReader::open`], reading no further than byte `end`: the length the job's
    /// fingerprint covers. Rows appended later (a producer still writing the file, maybe in
    /// the middle of a line) are not this job's input until a later run checks them as a
    /// grown input. A Parquet file cannot grow: its footer says where it ends.
    pub(crate) fn open_bounded(
        spec: &InputSpec,
        cursor: Cursor,
        end: u64,
    ) -> Result<InputReader, InputError> {
        Self::open_planned(spec, &[], cursor, end)
    }

    /// [`InputReader::open_bounded`] of a job's input: a folder input reads the `files` the
    /// job planned (every data file in it now when empty); a file ignores them.
    pub(crate) fn open_planned(
        spec: &InputSpec,
        files: &[InputFile],
        cursor: Cursor,
        end: u64,
    ) -> Result<InputReader, InputError> {
        let inner = if folder::is_folder_input(&spec.path) {
            let rows = FolderRows::open(spec, files, cursor, end)?;
            Inner::Folder {
                cursor: rows.cursor(),
                rows: Box::new(rows),
            }
        } else {
            Inner::File(FileReader::open_bounded(spec, cursor, end)?)
        };
        Ok(InputReader { inner })
    }

    /// Read the values of `columns` (CSV columns, JSONL fields, Parquet columns) beside each
    /// row's ID, into [`Row::values`]. A column the file's header or schema lacks is an error
    /// here; a row without a value for one is a bad row. A text input has no columns.
    pub(crate) fn keep_columns(&mut self, columns: &[String]) -> Result<(), InputError> {
        if columns.is_empty() {
            return Ok(());
        }
        match &mut self.inner {
            Inner::File(file) => file.keep_columns(columns),
            Inner::Folder { rows, .. } => rows.keep_columns(columns),
        }
    }

    /// The input file's path, for messages (of a folder, the file being read).
    pub(crate) fn path(&self) -> &Path {
        match &self.inner {
            Inner::File(file) => file.path(),
            Inner::Folder { rows, .. } => rows.path(),
        }
    }

    /// Of a folder input, the name of the file being read (the one of the row read last);
    /// `None` for a file input.
    pub(crate) fn file_in_folder(&self) -> Option<&str> {
        match &self.inner {
            Inner::Folder { rows, .. } => rows.path().file_name().and_then(|n| n.to_str()),
            Inner::File(_) => None,
        }
    }

    /// How many rows the whole file holds, when its format says so without reading them (a
    /// Parquet file's footer; of a folder of Parquet files, the sum of their footers'); `None`
    /// for the line formats, which must be read to know.
    pub(crate) fn rows_in_file(&self) -> Option<u64> {
        match &self.inner {
            Inner::File(file) => file.rows_in_file(),
            Inner::Folder { rows, .. } => rows.rows_in_files(),
        }
    }

    /// Where the next row starts.
    pub(crate) fn cursor(&self) -> Cursor {
        match &self.inner {
            Inner::File(file) => file.cursor(),
            Inner::Folder { cursor, .. } => *cursor,
        }
    }

    /// Read the next row; `None` at the end of the input.
    pub(crate) fn next_row(&mut self) -> Result<Option<Row>, InputError> {
        match &mut self.inner {
            Inner::File(file) => file.next_row(),
            Inner::Folder { rows, cursor } => {
                let row = rows.next_row()?;
                *cursor = rows.cursor();
                Ok(row)
            }
        }
    }
}
