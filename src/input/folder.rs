//! Folder input: the data files directly in a folder, read in name order as one input, as
//! Spark's file source reads a folder of part files; or the files a glob names (`data/*.csv`,
//! with a `*` in the last component only: its folder's data files whose names match).
//!
//! Owns which files of a folder are data ([`list`]: regular files, not recursive, hidden
//! names and the names Spark and Hadoop write beside data skipped), the format their
//! extensions agree on ([`format_of`]), the record of the files a job planned
//! ([`InputFile`]) and its fingerprint, and [`FolderRows`], which reads the files one after
//! the other through the single-file reader.
//!
//! Rows are numbered across files: a row's index counts the rows of every file before its
//! own, so buckets are cut by global rows and a bucket may span two files; a row's line is
//! its line in its own file, and messages name that file. A CSV file has its own header row.
//!
//! A [`Cursor`] addresses a position across files without a field of its own for the file:
//! its `byte` counts the bytes of the planned files before the one it points into (their
//! planned lengths, which never change while the job lasts), so a cursor of a single-file job
//! and one of a folder are stored alike. A cursor at the end of one file and the start of the
//! next is read as the start of the next (line 1); the last planned file takes every byte from
//! its start on, so a cursor at its planned end still addresses it when it has grown. A
//! Parquet file, which seeks by row, takes its row in the file from the cursor's line (the
//! 1-based row in the file); its byte, only proportional to the row, is kept strictly inside
//! the file except at its first row and after its last, so that it never reads as a boundary.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::InputError;
use super::file::FileReader;
use super::fingerprint::Fingerprint;
use super::row::{Cursor, Row};
#[cfg(any(test, feature = "cli"))]
use super::spec::format_from_extension;
use super::spec::{InputFormat, InputSpec};

/// One file of a folder input as the job planned it: the fingerprint of its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// The file's name in the folder.
    pub name: String,
    /// The file's length in bytes, as planned.
    pub len: u64,
    /// XXH3-64 of its content.
    pub xxh3: u64,
}

impl InputFile {
    /// The file's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            len: self.len,
            xxh3: self.xxh3,
        }
    }
}

/// Whether `name` is a data file's name: not hidden (`.`), not a name Spark or Hadoop writes
/// beside the data (`_SUCCESS`, `_committed_…` and any other `_` name, `….crc` checksums).
pub(crate) fn is_data_name(name: &str) -> bool {
    !(name.starts_with('.') || name.starts_with('_') || name.ends_with(".crc"))
}

/// The folder holding a folder input's files, and the pattern their names must match when
/// the input is a glob (`data/part-*.csv`: a `*` in the last component only).
fn split(input: &Path) -> (&Path, Option<&str>) {
    match input.file_name().and_then(|n| n.to_str()) {
        Some(name) if name.contains('*') && !input.exists() => {
            (input.parent().unwrap_or(Path::new(".")), Some(name))
        }
        _ => (input, None),
    }
}

/// Whether `input` names a folder input: a folder, or a glob whose last component holds a
/// `*` (any run of characters).
pub(crate) fn is_folder_input(input: &Path) -> bool {
    input.is_dir() || split(input).1.is_some()
}

/// The folder holding a folder input's files (the folder itself, or a glob's folder).
pub(crate) fn folder_of(input: &Path) -> &Path {
    split(input).0
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters.
fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The data files of the folder input `input`, by name in byte order: the regular files
/// directly in the folder (or those a glob matches), not recursive, names that are not data
/// skipped ([`is_data_name`]). A data file whose name is not UTF-8 is refused.
pub(crate) fn list(input: &Path) -> Result<Vec<String>, InputError> {
    let (dir, pattern) = split(input);
    let read_err = |source| InputError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|source| InputError::Open {
        path: dir.to_owned(),
        source,
    })? {
        let entry = entry.map_err(read_err)?;
        let lossy = entry.file_name().to_string_lossy().into_owned();
        if !is_data_name(&lossy) || pattern.is_some_and(|p| !glob_matches(p, &lossy)) {
            continue;
        }
        // Through a symbolic link: a link to a data file is a data file.
        let meta = std::fs::metadata(entry.path()).map_err(read_err)?;
        if !meta.is_file() {
            continue;
        }
        let Ok(name) = entry.file_name().into_string() else {
            return Err(InputError::Folder {
                path: entry.path(),
                reason: "the file's name is not UTF-8".into(),
            });
        };
        names.push(name);
    }
    names.sort_unstable();
    if names.is_empty() {
        let reason = match pattern {
            Some(_) => "no data file matches the pattern".to_string(),
            None => "the input folder holds no data files".to_string(),
        };
        return Err(InputError::Folder {
            path: input.to_owned(),
            reason: format!(
                "{reason} (hidden files and names starting with `_` or ending in `.crc` are \
                 not data)"
            ),
        });
    }
    Ok(names)
}

/// The format the extensions of the folder input `input`'s data files say (as
/// [`format_from_extension`] says it of one file): the same for every file, or an error
/// naming two files that differ.
#[cfg(any(test, feature = "cli"))]
pub(crate) fn format_of(input: &Path) -> Result<&'static str, InputError> {
    let names = list(input)?;
    let first = &names[0];
    let format = format_from_extension(Path::new(first));
    if let Some(other) = names
        .iter()
        .find(|n| format_from_extension(Path::new(n)) != format)
    {
        return Err(InputError::Folder {
            path: input.to_owned(),
            reason: format!(
                "the input folder mixes formats: {first} is {format} and {other} is {} (one \
                 format for every file; name the format to read them all as one)",
                format_from_extension(Path::new(other))
            ),
        });
    }
    Ok(format)
}

/// The fingerprint of each data file of the folder input `input` as it is now, in name order.
pub(crate) fn fingerprint_files(input: &Path) -> Result<Vec<InputFile>, InputError> {
    list(input)?
        .into_iter()
        .map(|name| {
            let f = Fingerprint::of_file(&folder_of(input).join(&name))?;
            Ok(InputFile {
                name,
                len: f.len,
                xxh3: f.xxh3,
            })
        })
        .collect()
}

/// The fingerprint of a folder input: its length is the files' total length (what a
/// [`Cursor`]'s byte counts up to), its hash that of every file's name, length and hash.
pub(crate) fn fingerprint(files: &[InputFile]) -> Fingerprint {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for f in files {
        hasher.update(&(f.name.len() as u64).to_le_bytes());
        hasher.update(f.name.as_bytes());
        hasher.update(&f.len.to_le_bytes());
        hasher.update(&f.xxh3.to_le_bytes());
    }
    Fingerprint {
        len: files.iter().map(|f| f.len).sum(),
        xxh3: hasher.digest(),
    }
}

/// The planned files of the folder input `input` hashed again as they are now: equal to the
/// job's fingerprint when none changed (files added since are not looked at).
pub(crate) fn fingerprint_planned(
    input: &Path,
    planned: &[InputFile],
) -> Result<Fingerprint, InputError> {
    let now = planned
        .iter()
        .map(|f| {
            let now = Fingerprint::of_file(&folder_of(input).join(&f.name))?;
            Ok(InputFile {
                name: f.name.clone(),
                len: now.len,
                xxh3: now.xxh3,
            })
        })
        .collect::<Result<Vec<_>, InputError>>()?;
    Ok(fingerprint(&now))
}

/// The rows of a folder's files, one file after the other (see the module doc).
pub(super) struct FolderRows {
    spec: InputSpec,
    /// Each file's name and length (its planned one; for the last, reading stops at `end`).
    files: Vec<(String, u64)>,
    /// The file being read.
    at: usize,
    /// The bytes of the files before `at`.
    offset: u64,
    /// The global index of the current file reader's row 0.
    row_base: u64,
    /// The byte of the whole input not to read past.
    end: u64,
    /// The reader of file `at`; none when there is nothing to read in it (an empty file).
    reader: Option<Box<FileReader>>,
    /// File `at`'s path.
    path: PathBuf,
    /// The columns each file's reader keeps ([`FileReader::keep_columns`]).
    keep: Vec<String>,
}

impl FolderRows {
    /// Position a reader of `files` (of the folder `spec.path`) at `cursor`, reading no
    /// further than byte `end` of the whole; `files` as planned, or every data file now when
    /// empty.
    pub(super) fn open(
        spec: &InputSpec,
        files: &[InputFile],
        cursor: Cursor,
        end: u64,
    ) -> Result<FolderRows, InputError> {
        let files: Vec<(String, u64)> = if files.is_empty() {
            list(&spec.path)?
                .into_iter()
                .map(|name| {
                    let path = folder_of(&spec.path).join(&name);
                    let len = std::fs::metadata(&path)
                        .map_err(|source| InputError::Open { path, source })?
                        .len();
                    Ok((name, len))
                })
                .collect::<Result<_, InputError>>()?
        } else {
            files.iter().map(|f| (f.name.clone(), f.len)).collect()
        };
        let mut rows = FolderRows {
            spec: spec.clone(),
            files,
            at: 0,
            offset: 0,
            row_base: cursor.row,
            end,
            reader: None,
            path: PathBuf::new(),
            keep: Vec::new(),
        };
        // The file the cursor points into: at a boundary, the next one (the last takes all).
        while rows.at + 1 < rows.files.len() && cursor.byte >= rows.offset + rows.files[rows.at].1 {
            rows.offset += rows.files[rows.at].1;
            rows.at += 1;
        }
        let inner = if cursor.byte <= rows.offset {
            // The start of the file: no row of it read yet.
            Cursor::default()
        } else {
            let inner = Cursor {
                byte: cursor.byte - rows.offset,
                ..cursor
            };
            match spec.format {
                // A Parquet reader seeks by its row in the file: the cursor's line says it.
                InputFormat::Parquet { .. } => {
                    let in_file = cursor.line.saturating_sub(1);
                    rows.row_base = cursor.row.saturating_sub(in_file);
                    Cursor {
                        row: in_file,
                        ..inner
                    }
                }
                _ => {
                    rows.row_base = 0;
                    inner
                }
            }
        };
        rows.open_file(inner)?;
        Ok(rows)
    }

    /// Open file `at` at `cursor` (in the file), unless there is nothing in it to read.
    fn open_file(&mut self, cursor: Cursor) -> Result<(), InputError> {
        let (name, len) = &self.files[self.at];
        let end = if self.at + 1 == self.files.len() {
            self.end.saturating_sub(self.offset)
        } else {
            *len
        };
        self.path = folder_of(&self.spec.path).join(name);
        // An empty file holds no rows (Spark writes empty part files without a CSV header).
        let empty = end == 0 || std::fs::metadata(&self.path).is_ok_and(|m| m.len() == 0);
        self.reader = if empty {
            None
        } else {
            let spec = InputSpec {
                path: self.path.clone(),
                ..self.spec.clone()
            };
            let mut reader = FileReader::open_bounded(&spec, cursor, end)?;
            reader.keep_columns(&self.keep)?;
            Some(Box::new(reader))
        };
        Ok(())
    }

    /// Read `columns` beside each ID, in this file and the next ones.
    pub(super) fn keep_columns(&mut self, columns: &[String]) -> Result<(), InputError> {
        self.keep = columns.to_vec();
        match &mut self.reader {
            Some(reader) => reader.keep_columns(columns),
            None => Ok(()),
        }
    }

    /// How many rows the files hold, when their format says so without reading them (a
    /// Parquet file's footer): each file's footer is read.
    pub(super) fn rows_in_files(&self) -> Option<u64> {
        if !matches!(self.spec.format, InputFormat::Parquet { .. }) {
            return None;
        }
        let mut total = 0;
        for (name, _) in &self.files {
            let spec = InputSpec {
                path: folder_of(&self.spec.path).join(name),
                ..self.spec.clone()
            };
            total += FileReader::open_bounded(&spec, Cursor::default(), u64::MAX)
                .ok()?
                .rows_in_file()?;
        }
        Some(total)
    }

    /// The file being read, for messages.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Where the next row starts, across files.
    pub(super) fn cursor(&self) -> Cursor {
        let Some(reader) = &self.reader else {
            return Cursor {
                byte: self.offset,
                line: 1,
                row: self.row_base,
            };
        };
        let c = reader.cursor();
        let len = self.files[self.at].1;
        // A Parquet cursor's byte is only proportional to its row: kept strictly inside the
        // file unless at its start or end, so that a byte at a boundary is never a row within.
        let byte = match reader.rows_in_file() {
            Some(_) if c.row == 0 => 0,
            Some(total) if c.row >= total => len,
            Some(_) => c.byte.clamp(1, len.saturating_sub(1).max(1)),
            None => c.byte,
        };
        Cursor {
            byte: self.offset + byte,
            line: c.line,
            row: self.row_base + c.row,
        }
    }

    /// The next row (its index global, its line in its file); `None` after the last file.
    pub(super) fn next_row(&mut self) -> Result<Option<Row>, InputError> {
        loop {
            if let Some(reader) = &mut self.reader {
                if let Some(row) = reader.next_row()? {
                    return Ok(Some(Row {
                        index: self.row_base + row.index,
                        ..row
                    }));
                }
            }
            if self.at + 1 >= self.files.len() {
                return Ok(None);
            }
            self.row_base = self.cursor().row;
            self.offset += self.files[self.at].1;
            self.at += 1;
            self.open_file(Cursor::default())?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).unwrap();
        }
        dir
    }

    #[test]
    fn the_data_files_in_name_order_without_hidden_or_spark_marker_files() {
        let dir = folder(&[
            ("part-10.csv", b"x"),
            ("part-02.csv", b"x"),
            ("Part-03.csv", b"x"),
            ("_SUCCESS", b""),
            ("_committed_123", b"x"),
            (".part-02.csv.crc", b"x"),
            ("part-02.csv.crc", b"x"),
            (".hidden.csv", b"x"),
        ]);
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/part-00.csv"), "x").unwrap();
        let names = list(dir.path()).unwrap();
        // Byte order: upper case before lower case.
        assert_eq!(names, ["Part-03.csv", "part-02.csv", "part-10.csv"]);
        assert_eq!(format_of(dir.path()).unwrap(), "csv");
    }

    #[test]
    fn a_glob_names_the_matching_data_files_of_its_folder() {
        for (pattern, name, matches) in [
            ("*.csv", "a.csv", true),
            ("*.csv", "a.csv.gz", false),
            ("part-*.csv", "part-1.csv", true),
            ("part-*.csv", "xpart-1.csv", false),
            ("p*-*.csv", "part-0001.csv", true),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*", "anything", true),
            ("exact", "exact", true),
            ("exact", "exact2", false),
        ] {
            assert_eq!(glob_matches(pattern, name), matches, "{pattern} {name}");
        }
        let dir = folder(&[
            ("part-1.csv", b"x"),
            ("part-0.csv", b"x"),
            ("other.csv", b"x"),
            ("_part-2.csv", b"x"),
        ]);
        let glob = dir.path().join("part-*.csv");
        assert!(is_folder_input(&glob) && is_folder_input(dir.path()));
        assert!(!is_folder_input(&dir.path().join("other.csv")));
        assert_eq!(folder_of(&glob), dir.path());
        assert_eq!(list(&glob).unwrap(), ["part-0.csv", "part-1.csv"]);
        let err = list(&dir.path().join("*.txt")).unwrap_err().to_string();
        assert!(err.contains("no data file matches the pattern"), "{err}");
    }

    #[test]
    fn an_empty_folder_or_mixed_formats_are_refused_naming_the_files() {
        let dir = folder(&[("_SUCCESS", b"")]);
        let err = list(dir.path()).unwrap_err().to_string();
        assert!(err.contains("holds no data files"), "{err}");
        let dir = folder(&[("a.csv", b"id\n1\n"), ("b.jsonl", b"{}\n"), ("c.csv", b"")]);
        let err = format_of(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("a.csv is csv") && err.contains("b.jsonl is jsonl"),
            "{err}"
        );
    }

    #[test]
    fn the_fingerprint_covers_every_name_length_and_content() {
        let dir = folder(&[("a.txt", b"a\n"), ("b.txt", b"b\n")]);
        let then = fingerprint_files(dir.path()).unwrap();
        let f = fingerprint(&then);
        assert_eq!(f.len, 4);
        assert_eq!(fingerprint_planned(dir.path(), &then).unwrap(), f);
        std::fs::write(dir.path().join("c.txt"), "c\n").unwrap();
        assert_eq!(
            fingerprint_planned(dir.path(), &then).unwrap(),
            f,
            "new files are not planned ones"
        );
        std::fs::write(dir.path().join("b.txt"), "B\n").unwrap();
        assert_ne!(fingerprint_planned(dir.path(), &then).unwrap(), f);
        std::fs::rename(dir.path().join("b.txt"), dir.path().join("b2.txt")).unwrap();
        assert!(fingerprint_planned(dir.path(), &then).is_err());
        let mut renamed = then.clone();
        renamed[1].name = "b2.txt".into();
        assert_ne!(fingerprint(&renamed), f);
    }
}
