//! ID lists: the file holding each planned segment's unique IDs, beside sled.
//!
//! Owns `DIR/ids.log`, append-only: one entry per segment the planner wrote and per bucket of
//! a rerun, `[length u32 LE][CRC-32 of the list u32 LE][the list]`. The offset log in sled
//! keeps, per segment (and a rerun's offset log per rerun bucket), where its entry starts
//! ([`ListRef`]), written only after the entry is durable: an offset record never points at a
//! list that is not on disk.
//!
//! The lists are most of what a plan writes (the ID and about 2 bytes; 12 before compact
//! lists); kept in sled they made
//! sled hold every list read or written since it was opened in memory (about 25 MB per
//! million IDs, whatever its cache size), so an export of a 10M-ID store peaked at 310 MB.
//! Here they are read with `pread`: the page cache holds them, not the process.
//!
//! Whatever follows the last entry an offset log points at (entries of a plan or a rerun whose
//! sled write never happened: a crash between the two) is written over by the next appends; an
//! open never cuts it, so an open that then finds the store damaged has destroyed nothing. A
//! file shorter than that entry's end lost data and is an error.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::results_log::{read_at_most, LogError};

/// The ID lists' file name in the state directory.
pub(crate) const FILE: &str = "ids.log";

const HEADER: u64 = 8;

/// Where one list is: what the offset log keeps for a segment (12 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListRef {
    /// Where the entry starts in the file (bytes).
    pub at: u64,
    /// The list's length (bytes, header excluded).
    pub len: u32,
}

impl ListRef {
    /// Bytes of [`ListRef::to_bytes`].
    pub(crate) const SIZE: usize = 12;

    /// `at` (u64) then `len` (u32), big-endian.
    pub(crate) fn to_bytes(self) -> [u8; 12] {
        let mut out = [0; 12];
        out[..8].copy_from_slice(&self.at.to_be_bytes());
        out[8..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// A reference, or none if `bytes` is not one (a list stored inline by format 1 or 2,
    /// which is never 12 bytes long: empty, or at least one 13-byte entry).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<ListRef> {
        let bytes: [u8; 12] = bytes.try_into().ok()?;
        Some(ListRef {
            at: u64::from_be_bytes(bytes[..8].try_into().ok()?),
            len: u32::from_be_bytes(bytes[8..].try_into().ok()?),
        })
    }

    /// Where the entry ends in the file.
    pub(crate) fn end(self) -> u64 {
        self.at + HEADER + self.len as u64
    }
}

/// The open `ids.log` of a state directory.
pub(crate) struct IdLists {
    path: PathBuf,
    file: File,
    /// The file's length: where the next entry goes.
    len: Mutex<u64>,
}

impl IdLists {
    /// Open (creating if missing) the file in `dir`; `end` is where the last entry the offset
    /// log points at ends (0: none).
    pub(crate) fn open(dir: &Path, end: u64) -> Result<IdLists, LogError> {
        let path = dir.join(FILE);
        let io = |source| LogError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < end {
            return Err(LogError::Damaged {
                path,
                reason: format!(
                    "it holds {len} bytes, but the offset log points {end} bytes into it \
                     (truncated or replaced)"
                ),
            });
        }
        // Past `end`: a plan that never reached sled. Nothing points at it; the next append
        // writes over it.
        Ok(IdLists {
            path,
            file,
            len: Mutex::new(end),
        })
    }

    /// Append lists and make them durable; returns where each is.
    pub(crate) fn append(&self, lists: &[Vec<u8>]) -> Result<Vec<ListRef>, LogError> {
        let io = |source| LogError::Io {
            path: self.path.clone(),
            source,
        };
        let mut len = self
            .len
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut buf = Vec::with_capacity(lists.iter().map(|l| l.len() + 8).sum());
        let mut refs = Vec::with_capacity(lists.len());
        for list in lists {
            let list_len = u32::try_from(list.len()).map_err(|_| LogError::Damaged {
                path: self.path.clone(),
                reason: format!("an ID list of {} bytes is too long", list.len()),
            })?;
            refs.push(ListRef {
                at: *len + buf.len() as u64,
                len: list_len,
            });
            buf.extend_from_slice(&list_len.to_le_bytes());
            buf.extend_from_slice(&crc32fast::hash(list).to_le_bytes());
            buf.extend_from_slice(list);
        }
        if buf.is_empty() {
            return Ok(refs);
        }
        self.file.write_all_at(&buf, *len).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        *len += buf.len() as u64;
        Ok(refs)
    }

    /// The list at `at`, checked.
    pub(crate) fn read(&self, at: ListRef) -> Result<Vec<u8>, LogError> {
        let mut buf = vec![0u8; HEADER as usize + at.len as usize];
        let got = read_at_most(&self.file, &mut buf, at.at).map_err(|source| LogError::Io {
            path: self.path.clone(),
            source,
        })?;
        let damaged = |what: &str| LogError::Damaged {
            path: self.path.clone(),
            reason: format!("the ID list at byte {} is {what}", at.at),
        };
        if got < buf.len() {
            return Err(damaged("cut short"));
        }
        let len = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        if len != at.len || crc32fast::hash(&buf[HEADER as usize..]) != crc {
            return Err(damaged("damaged (length or checksum)"));
        }
        buf.drain(..HEADER as usize);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_back_and_an_unreferenced_tail_is_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let lists = IdLists::open(dir.path(), 0).unwrap();
        let refs = lists
            .append(&[b"one".to_vec(), Vec::new(), vec![7; 5000]])
            .unwrap();
        assert_eq!(lists.read(refs[0]).unwrap(), b"one");
        assert_eq!(lists.read(refs[1]).unwrap(), b"");
        assert_eq!(lists.read(refs[2]).unwrap(), vec![7; 5000]);
        let later = lists.append(&[b"later".to_vec()]).unwrap()[0];
        drop(lists);
        // The offset log only knows the first three: the fourth is written over.
        let lists = IdLists::open(dir.path(), refs[2].end()).unwrap();
        assert_eq!(lists.read(refs[2]).unwrap(), vec![7; 5000]);
        let again = lists.append(&[b"again".to_vec()]).unwrap()[0];
        assert_eq!(again.at, later.at);
        assert_eq!(lists.read(again).unwrap(), b"again");
        assert_eq!(
            lists.read(later).unwrap(),
            b"again",
            "the old entry is gone"
        );
        // Refs round-trip through their 12 bytes; inline format-2 lists are never 12 bytes.
        assert_eq!(ListRef::from_bytes(&again.to_bytes()), Some(again));
        assert_eq!(ListRef::from_bytes(b"short"), None);
    }

    #[test]
    fn damage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let lists = IdLists::open(dir.path(), 0).unwrap();
        let r = lists.append(&[vec![1; 100]]).unwrap()[0];
        drop(lists);
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(FILE))
            .unwrap();
        f.write_all_at(b"xx", 50).unwrap();
        let lists = IdLists::open(dir.path(), r.end()).unwrap();
        assert!(lists.read(r).unwrap_err().to_string().contains("checksum"));
        drop(lists);
        f.set_len(r.end() - 1).unwrap();
        let err = IdLists::open(dir.path(), r.end()).err().unwrap();
        assert!(err.to_string().contains("ids.log"), "{err}");
    }
}
