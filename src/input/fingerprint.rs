//! The input's [`Fingerprint`]: a hash of its first bytes that detects a changed file on
//! resume.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::InputError;

/// A fingerprint of the input's first `len` bytes: detects a changed file on resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Bytes fingerprinted: the file's length when the fingerprint was taken.
    pub len: u64,
    /// XXH3-64 of those bytes.
    pub xxh3: u64,
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes, xxh3 {:016x}", self.len, self.xxh3)
    }
}

impl Fingerprint {
    /// Hash the whole file.
    pub fn of_file(path: &Path) -> Result<Fingerprint, InputError> {
        let len = std::fs::metadata(path)
            .map_err(|source| InputError::Open {
                path: path.to_owned(),
                source,
            })?
            .len();
        Self::of_prefix(path, len)
    }

    /// Hash the file's first `len` bytes (fails if the file is shorter).
    pub fn of_prefix(path: &Path, len: u64) -> Result<Fingerprint, InputError> {
        let file = File::open(path).map_err(|source| InputError::Open {
            path: path.to_owned(),
            source,
        })?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut reader = BufReader::with_capacity(1 << 20, file.take(len));
        let mut seen = 0u64;
        loop {
            let buf = reader.fill_buf().map_err(|source| InputError::Read {
                path: path.to_owned(),
                source,
            })?;
            if buf.is_empty() {
                break;
            }
            hasher.update(buf);
            let n = buf.len();
            seen += n as u64;
            reader.consume(n);
        }
        if seen != len {
            return Err(InputError::Read {
                path: path.to_owned(),
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("file is shorter than {len} bytes"),
                ),
            });
        }
        Ok(Fingerprint {
            len,
            xxh3: hasher.digest(),
        })
    }
}
