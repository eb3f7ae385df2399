//! An input that grew since it was planned ([`GrownInput`]): a file by rows appended after
//! its planned part, checked byte for byte ([`appended`]); a folder by new files after the
//! planned ones (judged in `folder_input`).

use super::error::JobError;
use crate::input::{Fingerprint, InputFile, InputSpec};

/// An input that grew since it was planned: a file by appending rows, a folder by new files
/// after the planned ones (and rows appended to the last).
pub(super) struct GrownInput {
    /// A folder's files now to read, in name order: the planned ones (the last maybe longer)
    /// and the new ones; none for a file.
    pub(super) files: Vec<InputFile>,
    /// The input's fingerprint now.
    pub(super) fingerprint: Fingerprint,
    /// Bytes of newline that start the last planned file's appended part and end its old
    /// last line, to step over (see [`appended`]).
    pub(super) skip: u64,
    /// What grew, for the job's history.
    pub(super) change: String,
}

/// Check that `spec.path` (now `now`) is the input fingerprinted as `then` with rows
/// appended. Returns how many bytes of newline the appended part starts with that end the
/// old last line (when the old content did not end with a newline), to step over.
pub(super) fn appended(
    spec: &InputSpec,
    then: &Fingerprint,
    now: Fingerprint,
) -> Result<u64, JobError> {
    let path = &spec.path;
    let changed = |what: String| JobError::InputChanged {
        path: path.clone(),
        what,
        then: *then,
        now,
    };
    if matches!(spec.format, crate::input::InputFormat::Parquet { .. }) {
        return Err(changed(
            "a Parquet file is written whole (its footer last), so it cannot have grown by \
             appending rows; a changed Parquet input is a different input (start a new job for it)"
                .into(),
        ));
    }
    if now.len < then.len {
        return Err(changed(format!(
            "it is shorter than at creation ({} bytes, then {})",
            now.len, then.len
        )));
    }
    if now.len == then.len {
        return Err(changed(format!(
            "its content differs at the same length ({} bytes)",
            now.len
        )));
    }
    if Fingerprint::of_prefix(path, then.len)? != *then {
        return Err(changed(format!(
            "its first {} bytes (the part already planned) changed",
            then.len
        )));
    }
    let read_err = |source| crate::input::InputError::Read {
        path: path.clone(),
        source,
    };
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    file.seek(SeekFrom::Start(then.len - 1)).map_err(read_err)?;
    let mut edge = [0u8; 3];
    let n = file.read(&mut edge).map_err(read_err)?;
    let edge = &edge[..n];
    if edge.first() == Some(&b'\n') {
        return Ok(0);
    }
    let skip = match &edge[1..] {
        [b'\n', ..] => 1,
        [b'\r', b'\n', ..] => 2,
        _ => {
            return Err(changed(format!(
                "its old last line (ending at byte {}) had no newline and the appended text continues it, changing its ID; add a newline before the appended rows",
                then.len
            )))
        }
    };
    if matches!(spec.format, crate::input::InputFormat::Csv { .. }) {
        return Err(changed(
            "the old CSV content ended without a newline; appending to it is not supported".into(),
        ));
    }
    Ok(skip)
}
