//! Results log: where the items' final records live, beside sled rather than inside it.
//!
//! Owns two files of a state directory and their crash rules:
//!
//! ```text
//! DIR/results.log   append-only entries, each
//!                   [payload length u32 LE][CRC-32 of payload u32 LE][payload]:
//!                   a group of records appended together when the length's two top bits
//!                   are set (see [`log_groups`](super::log_groups)), what every append
//!                   writes; entries of one record written by builds before groups are
//!                   still read where they are (never converted): payload
//!                   [row varint][ID check u32 LE][record bytes] when only the top bit is
//!                   set (COMPACT), else [row u64 LE][ID length u32 LE][ID UTF-8][record bytes]
//! DIR/positions     dense array by input row: u64 LE = 1 + the position of the row's current
//!                   record ([`Pos`]: an entry's offset, or a group's offset and the record's
//!                   index in it), 0 = none (holes read as none)
//! ```
//!
//! A row's current record is the last one appended for it (a rerun's new result replaces the
//! old one). Appends go to the log at once (one write per batch) and their positions wait in
//! memory until [`ResultsLog::sync`], which makes the log durable first and only then writes
//! the positions of what it made durable: so the positions file never points at a record that
//! might not be on disk. The positions file itself is synced less often; the log offset from
//! which every position is durable ([`Durable::covers`]) is kept by the caller (in sled, with
//! the commit log), and an open replays the log from there, cutting off a torn tail. A bad
//! entry before [`Durable::synced`] (the log length made durable) is damage, not a torn
//! tail, and is an error.
//!
//! Nothing here grows with the number of records in memory: reads are `pread`s served by the
//! page cache. That is the point: one sled key per ID cost about 35 bytes of RSS per ID in
//! sled's page table, for ever.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::log_groups::{self, GroupWriter, Pos};

/// The results log's file name in the state directory.
pub(crate) const LOG_FILE: &str = "results.log";
/// The positions file's name in the state directory.
pub(crate) const POSITIONS_FILE: &str = "positions";

/// How often (at most) a sync also makes the positions durable and moves
/// [`Durable::covers`]: the replay after a crash is bounded by what was appended in that time.
const COVER_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Positions waiting in memory past this many rows make a record call sync the log itself
/// (a huge bucket synced only at its commit must not hold all its positions in memory).
const MAX_PENDING: usize = 1 << 18;

pub(super) use super::log_groups::HEADER;
/// The length field's top bit: a compact entry, which keeps a check of its ID rather than the
/// ID (the ID lists hold the IDs; the check catches a position pointing at another row's
/// record, as the whole ID did).
const COMPACT: u32 = 1 << 31;
/// Most records are smaller: one read gets header and payload.
const READ_AHEAD: usize = 1024;

/// What the caller keeps, durably, for the next open (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Durable {
    /// Every record before this log offset has its position durable in the positions file.
    pub covers: u64,
    /// The log was durable up to here.
    pub synced: u64,
    /// The positions file was durable up to here (it only grows): an open refuses a shorter
    /// one. 0 in records written before it was kept (16 bytes long): not checked.
    pub positions: u64,
}

impl Durable {
    /// The 24 bytes the store keeps: `covers`, `synced`, `positions`, each u64 big-endian.
    pub(crate) fn to_bytes(self) -> [u8; 24] {
        let mut out = [0; 24];
        out[..8].copy_from_slice(&self.covers.to_be_bytes());
        out[8..16].copy_from_slice(&self.synced.to_be_bytes());
        out[16..].copy_from_slice(&self.positions.to_be_bytes());
        out
    }

    /// Read [`Durable::to_bytes`]'s 24 bytes, or the 16 of older stores (`positions` 0); none for any other length.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Durable> {
        let word = |i: usize| Some(u64::from_be_bytes(bytes.get(i..i + 8)?.try_into().ok()?));
        match bytes.len() {
            16 | 24 => Some(Durable {
                covers: word(0)?,
                synced: word(8)?,
                positions: if bytes.len() == 24 { word(16)? } else { 0 },
            }),
            _ => None,
        }
    }
}

/// Errors of the results log; the store says which directory.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogError {
    /// A file operation on the log or the positions file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file holds what a crash cannot leave behind (see the module doc).
    #[error("{path}: {reason}")]
    Damaged {
        /// The damaged file.
        path: PathBuf,
        /// What is wrong: a bad entry before the durable length, a positions file shorter than recorded.
        reason: String,
    },
}

/// A row's position not yet written to the positions file.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Where its current record is.
    latest: Pos,
    /// The first record appended for the row since its position was last written: a replay
    /// from here finds every record the positions file does not know.
    earliest: u64,
}

struct Appender {
    /// The log's length: where the next entry goes.
    len: u64,
    /// Scratch for encoding a batch.
    buf: Vec<u8>,
}

struct Synced {
    /// The log length last made durable.
    log: u64,
    durable: Durable,
    covered_at: std::time::Instant,
}

/// The open results log and positions file of one state directory.
pub(crate) struct ResultsLog {
    log_path: PathBuf,
    positions_path: PathBuf,
    log: File,
    positions: File,
    appender: Mutex<Appender>,
    pending: Mutex<HashMap<u64, Pending>>,
    synced: Mutex<Synced>,
}

/// Who an entry's record is for, as the entry keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who<'a> {
    /// The ID itself (entries written before compact ones).
    Id(&'a str),
    /// A check of the ID ([`id_check`]).
    Check(u32),
}

impl Who<'_> {
    fn is(self, id: &str) -> bool {
        match self {
            Who::Id(stored) => stored == id,
            Who::Check(check) => check == id_check(id),
        }
    }
}

/// The check a compact entry keeps of its ID: 32 bits of its xxh3.
pub(super) fn id_check(id: &str) -> u32 {
    xxhash_rust::xxh3::xxh3_64(id.as_bytes()) as u32
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The input row the record is for.
    pub row: u64,
    /// Who the record is for, as an entry of one record keeps it (`Who` owned); none in a
    /// group.
    pub id: Option<StoredWho>,
    /// The record's bytes, as the store encoded them.
    pub record: Vec<u8>,
}

/// What an entry's length field says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One record with its whole ID (builds before compact entries).
    Whole,
    /// One record with a check of its ID (builds before groups).
    Compact,
    /// A group of records.
    Group,
}

/// The kind and payload length an entry's length field holds.
fn kind_of(field: u32) -> (Kind, usize) {
    if field & log_groups::GROUP == log_groups::GROUP {
        (Kind::Group, (field & !log_groups::GROUP) as usize)
    } else if field & COMPACT != 0 {
        (Kind::Compact, (field & !COMPACT) as usize)
    } else {
        (Kind::Whole, field as usize)
    }
}

/// The rows of an entry's payload, with each record's position: None if it does not parse.
fn rows_of(at: u64, kind: Kind, payload: &[u8]) -> Option<Vec<(u64, Pos)>> {
    match kind {
        Kind::Group => Some(
            log_groups::records(payload)?
                .into_iter()
                .enumerate()
                .map(|(i, (row, _))| {
                    let index = i as u16;
                    (row, Pos::Grouped { at, index })
                })
                .collect(),
        ),
        Kind::Whole | Kind::Compact => {
            let (row, _, _) = parse(payload, kind == Kind::Compact)?;
            Some(vec![(row, Pos::Entry(at))])
        }
    }
}

/// A group read back (kept while a bucket's records are read from it).
struct Group {
    at: u64,
    payload: Vec<u8>,
    records: Vec<(u64, std::ops::Range<usize>)>,
}

impl ResultsLog {
    /// Open (creating if missing) the files in `dir`, given what the store last recorded as
    /// durable, and replay the log from `durable.covers`.
    pub(crate) fn open(dir: &Path, durable: Durable) -> Result<ResultsLog, LogError> {
        let log_path = dir.join(LOG_FILE);
        let positions_path = dir.join(POSITIONS_FILE);
        let open = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|source| LogError::Io {
                    path: path.to_owned(),
                    source,
                })
        };
        let log = open(&log_path)?;
        let positions = open(&positions_path)?;
        let io = |source| LogError::Io {
            path: log_path.clone(),
            source,
        };
        let damaged = |reason: String| LogError::Damaged {
            path: log_path.clone(),
            reason,
        };
        let file_len = log.metadata().map_err(io)?.len();
        if file_len < durable.synced || durable.covers > durable.synced {
            return Err(damaged(format!(
                "it holds {file_len} bytes, but {} were durable (truncated or replaced)",
                durable.synced
            )));
        }
        let positions_len = positions
            .metadata()
            .map_err(|source| LogError::Io {
                path: positions_path.clone(),
                source,
            })?
            .len();
        if durable.covers > 0 && positions_len == 0 {
            return Err(LogError::Damaged {
                path: positions_path.clone(),
                reason: "it is empty, but positions were durable in it (emptied or replaced)"
                    .into(),
            });
        }
        if positions_len < durable.positions {
            return Err(LogError::Damaged {
                path: positions_path.clone(),
                reason: format!(
                    "it holds {positions_len} bytes, but {} were durable (truncated or replaced)",
                    durable.positions
                ),
            });
        }
        // Replay: every entry from `covers` on gets its position back in memory.
        let mut pending = HashMap::new();
        let mut reader = std::io::BufReader::with_capacity(1 << 20, &log);
        std::io::Seek::seek(&mut reader, std::io::SeekFrom::Start(durable.covers)).map_err(io)?;
        let mut at = durable.covers;
        let mut payload = Vec::new();
        loop {
            let mut header = [0u8; HEADER];
            match read_full(&mut reader, &mut header).map_err(io)? {
                0 => break,
                HEADER => {}
                _ => {
                    if at < durable.synced {
                        return Err(damaged(format!("the entry at byte {at} is cut short")));
                    }
                    break;
                }
            }
            let field = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
            let (kind, len) = kind_of(field);
            let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
            // The length comes from the disk: nothing is allocated for an entry that runs
            // past the end of the file (a torn tail, or damage before the durable mark).
            if at + (HEADER + len) as u64 > file_len {
                if at < durable.synced {
                    return Err(damaged(format!(
                        "the entry at byte {at} is damaged (its length {len} runs past the \
                         end of the file)"
                    )));
                }
                break;
            }
            payload.resize(len, 0);
            let got = read_full(&mut reader, &mut payload).map_err(io)?;
            let rows = (got == len && crc32fast::hash(&payload) == crc)
                .then(|| rows_of(at, kind, &payload))
                .flatten();
            let Some(rows) = rows else {
                if at < durable.synced {
                    return Err(damaged(format!(
                        "the entry at byte {at} is damaged (bad length or checksum)"
                    )));
                }
                break;
            };
            for (row, pos) in rows {
                pending
                    .entry(row)
                    .and_modify(|p: &mut Pending| p.latest = pos)
                    .or_insert(Pending {
                        latest: pos,
                        earliest: at,
                    });
            }
            at += (HEADER + len) as u64;
        }
        drop(reader);
        if at < file_len {
            // A torn tail: never durable, and nothing refers to it. Cut it off so the next
            // entry starts at a boundary.
            log.set_len(at).map_err(io)?;
            tracing::debug!(
                at,
                file_len,
                "cut off the results log's torn tail after a crash"
            );
        }
        Ok(ResultsLog {
            log_path,
            positions_path,
            log,
            positions,
            appender: Mutex::new(Appender {
                len: at,
                buf: Vec::new(),
            }),
            pending: Mutex::new(pending),
            synced: Mutex::new(Synced {
                log: durable.synced,
                durable,
                covered_at: std::time::Instant::now(),
            }),
        })
    }

    fn io(&self, path: &Path) -> impl Fn(std::io::Error) -> LogError {
        let path = path.to_owned();
        move |source| LogError::Io {
            path: path.clone(),
            source,
        }
    }

    fn damaged(&self, reason: String) -> LogError {
        LogError::Damaged {
            path: self.log_path.clone(),
            reason,
        }
    }

    /// Append records (row, ID, record bytes) in one write. They are readable at once and
    /// durable after the next [`ResultsLog::sync`].
    pub(crate) fn append<'a>(
        &self,
        records: impl IntoIterator<Item = (u64, &'a str, &'a [u8])>,
    ) -> Result<(), LogError> {
        let mut appender = self
            .appender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Appender { len, buf } = &mut *appender;
        buf.clear();
        let mut placed = Vec::new();
        let mut groups = GroupWriter::new(buf);
        for (row, _id, record) in records {
            let (start, index) = groups.push(row, record).map_err(|e| self.damaged(e))?;
            let at = *len + start as u64;
            if at >= log_groups::MAX_GROUP_OFFSET {
                return Err(self.damaged(format!("it cannot grow past {at} bytes")));
            }
            placed.push((row, Pos::Grouped { at, index }));
        }
        groups.close();
        if placed.is_empty() {
            return Ok(());
        }
        self.log
            .write_all_at(buf, *len)
            .map_err(self.io(&self.log_path))?;
        *len += buf.len() as u64;
        if buf.capacity() > 4 << 20 {
            *buf = Vec::new();
        }
        // Positions are published under the appender's lock, so they reach `pending` in log
        // order and the latest one wins.
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (row, pos) in placed {
            pending
                .entry(row)
                .and_modify(|p| p.latest = pos)
                .or_insert(Pending {
                    latest: pos,
                    earliest: pos.entry(),
                });
        }
        let full = pending.len() > MAX_PENDING;
        drop(pending);
        drop(appender);
        if full {
            self.sync(false)?;
        }
        Ok(())
    }

    /// Where the current record of `row` is, if it has one.
    fn position(&self, row: u64) -> Result<Option<Pos>, LogError> {
        if let Some(p) = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&row)
        {
            return Ok(Some(p.latest));
        }
        let mut bytes = [0u8; 8];
        let got = read_at_most(&self.positions, &mut bytes, row * 8)
            .map_err(self.io(&self.positions_path))?;
        let value = if got == 8 {
            u64::from_le_bytes(bytes)
        } else {
            0
        };
        Ok(value.checked_sub(1).map(Pos::from_u64))
    }

    /// Whether `row` has a record.
    #[cfg(test)]
    pub(crate) fn contains(&self, row: u64) -> Result<bool, LogError> {
        Ok(self.position(row)?.is_some())
    }

    /// The current record of `row`, which must be `id`'s (an entry of one record keeps
    /// who it is for; a group only the row: the ID index checked `id`'s row).
    pub(crate) fn get(&self, row: u64, id: &str) -> Result<Option<Vec<u8>>, LogError> {
        match self.position(row)? {
            Some(pos) => self.record_at(pos, row, id, &mut None).map(Some),
            None => Ok(None),
        }
    }

    /// The current records of many rows (each with its ID), in order: one read of the
    /// positions file for their whole row range when they are close together (a bucket).
    pub(crate) fn get_many(&self, rows: &[(u64, &str)]) -> Result<Vec<Option<Vec<u8>>>, LogError> {
        let (Some(lo), Some(hi)) = (
            rows.iter().map(|r| r.0).min(),
            rows.iter().map(|r| r.0).max(),
        ) else {
            return Ok(Vec::new());
        };
        if hi - lo > 4 * rows.len() as u64 + 64 {
            return rows.iter().map(|(row, id)| self.get(*row, id)).collect();
        }
        let mut bytes = vec![0u8; ((hi - lo + 1) * 8) as usize];
        let got = read_at_most(&self.positions, &mut bytes, lo * 8)
            .map_err(self.io(&self.positions_path))?;
        bytes.truncate(got - got % 8);
        let mut out = Vec::with_capacity(rows.len());
        // A bucket's records were mostly appended together: one read per group.
        let mut group = None;
        for (row, id) in rows {
            let pending = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(row)
                .map(|p| p.latest);
            let pos = pending.or_else(|| {
                let i = ((row - lo) * 8) as usize;
                let v = bytes.get(i..i + 8)?;
                let v = u64::from_le_bytes(v.try_into().expect("8 bytes"));
                v.checked_sub(1).map(Pos::from_u64)
            });
            out.push(match pos {
                Some(pos) => Some(self.record_at(pos, *row, id, &mut group)?),
                None => None,
            });
        }
        Ok(out)
    }

    /// The record at `pos`, which must be `row`'s (and `id`'s, where the entry says who it
    /// is for); `group` keeps the group read last.
    fn record_at(
        &self,
        pos: Pos,
        row: u64,
        id: &str,
        group: &mut Option<Group>,
    ) -> Result<Vec<u8>, LogError> {
        let entry = match pos {
            Pos::Entry(at) => self.read_entry(at)?,
            Pos::Grouped { at, index } => {
                if group.as_ref().is_none_or(|g| g.at != at) {
                    *group = Some(self.read_group(at)?);
                }
                let g = group.as_ref().expect("read just now");
                let (stored, range) = g.records.get(index as usize).ok_or_else(|| {
                    self.damaged(format!(
                        "row {row} points at record {index} of the group at byte {at}, which \
                         holds {}",
                        g.records.len()
                    ))
                })?;
                Entry {
                    row: *stored,
                    id: None,
                    record: g.payload[range.clone()].to_vec(),
                }
            }
        };
        let who_matches = entry.id.as_ref().is_none_or(|who| who.who().is(id));
        if entry.row != row || !who_matches {
            let who = entry
                .id
                .as_ref()
                .map_or(String::new(), |who| format!(" ({who})"));
            return Err(self.damaged(format!(
                "row {row} ({id:?}) points at {pos:?}, which holds row {}{who}",
                entry.row
            )));
        }
        Ok(entry.record)
    }

    /// The group entry starting at `at`.
    fn read_group(&self, at: u64) -> Result<Group, LogError> {
        let (kind, payload) = self.read_payload(at)?;
        let bad = |what: &str| self.damaged(format!("the entry at byte {at} is {what}"));
        if kind != Kind::Group {
            return Err(bad("not a group, but a position points into one"));
        }
        let records = log_groups::records(&payload).ok_or_else(|| bad("undecodable"))?;
        Ok(Group {
            at,
            payload,
            records,
        })
    }

    /// The entry of one record starting at `at`.
    fn read_entry(&self, at: u64) -> Result<Entry, LogError> {
        let (kind, payload) = self.read_payload(at)?;
        let bad = |what: &str| self.damaged(format!("the entry at byte {at} is {what}"));
        if kind == Kind::Group {
            return Err(bad("a group, but a position points at it as one record"));
        }
        let (row, id, record) =
            parse(&payload, kind == Kind::Compact).ok_or_else(|| bad("undecodable"))?;
        Ok(Entry {
            row,
            id: Some(StoredWho::of(id)),
            record: record.to_vec(),
        })
    }

    /// The kind and checked payload of the entry starting at `at`.
    fn read_payload(&self, at: u64) -> Result<(Kind, Vec<u8>), LogError> {
        let io = self.io(&self.log_path);
        let mut buf = vec![0u8; READ_AHEAD];
        let got = read_at_most(&self.log, &mut buf, at).map_err(&io)?;
        let bad = |what: &str| self.damaged(format!("the entry at byte {at} is {what}"));
        if got < HEADER {
            return Err(bad("missing"));
        }
        let field = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
        let (kind, len) = kind_of(field);
        let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        if HEADER + len > got {
            // The length comes from the disk: check it against the file before allocating.
            let file_len = self.log.metadata().map_err(&io)?.len();
            if at + (HEADER + len) as u64 > file_len {
                return Err(bad("cut short (its length runs past the end of the log)"));
            }
            buf.resize(HEADER + len, 0);
            let more = read_at_most(&self.log, &mut buf[got..], at + got as u64).map_err(&io)?;
            if got + more < HEADER + len {
                return Err(bad("cut short"));
            }
        }
        buf.truncate(HEADER + len);
        buf.drain(..HEADER);
        if crc32fast::hash(&buf) != crc {
            return Err(bad("damaged (checksum)"));
        }
        Ok((kind, buf))
    }

    /// Make every append so far durable, then write their positions. Returns what the store
    /// keeps for the next open. Moves [`Durable::covers`] at most every `COVER_EVERY`, or
    /// now if `force` (a store being closed: the next open then replays nothing).
    pub(crate) fn sync(&self, force: bool) -> Result<Durable, LogError> {
        let mut synced = self
            .synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let len = self
            .appender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len;
        if len > synced.log {
            self.log.sync_data().map_err(self.io(&self.log_path))?;
            synced.log = len;
        }
        // Positions of records now durable go to the file, then leave memory: a reader looks
        // in memory first, so it sees one or the other, never neither.
        let mut ready: Vec<(u64, Pos)> = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(_, p)| p.latest.entry() < len)
            .map(|(row, p)| (*row, p.latest))
            .collect();
        ready.sort_unstable_by_key(|(row, _)| *row);
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0;
        let write = |start: u64, bytes: &[u8]| {
            self.positions
                .write_all_at(bytes, start * 8)
                .map_err(self.io(&self.positions_path))
        };
        for (i, (row, at)) in ready.iter().enumerate() {
            if i > 0 && *row != ready[i - 1].0 + 1 {
                write(run_start, &run)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = *row;
            }
            run.extend_from_slice(&(at.to_u64() + 1).to_le_bytes());
        }
        if !run.is_empty() {
            write(run_start, &run)?;
        }
        let oldest_left = {
            let mut pending = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for (row, at) in &ready {
                if pending.get(row).is_some_and(|p| p.latest == *at) {
                    pending.remove(row);
                }
            }
            pending.values().map(|p| p.earliest).min()
        };
        synced.durable.synced = synced.log;
        if force || synced.covered_at.elapsed() >= COVER_EVERY || synced.durable.covers == 0 {
            self.positions
                .sync_data()
                .map_err(self.io(&self.positions_path))?;
            synced.durable.positions = self
                .positions
                .metadata()
                .map_err(self.io(&self.positions_path))?
                .len();
            // Rows still waiting (appended after `len`, or rewritten after it) are replayed
            // from their first unwritten record.
            synced.durable.covers = oldest_left.map_or(len, |e| e.min(len));
            synced.covered_at = std::time::Instant::now();
        }
        Ok(synced.durable)
    }

    /// The log's length.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.appender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len
    }

    /// Empty both files (an upgrade that starts over).
    pub(crate) fn clear(&self) -> Result<(), LogError> {
        let mut appender = self
            .appender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut synced = self
            .synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.log.set_len(0).map_err(self.io(&self.log_path))?;
        self.positions
            .set_len(0)
            .map_err(self.io(&self.positions_path))?;
        appender.len = 0;
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        *synced = Synced {
            log: 0,
            durable: Durable::default(),
            covered_at: std::time::Instant::now(),
        };
        Ok(())
    }
}

/// An entry's payload: its row, who it is for and its record bytes.
fn parse(payload: &[u8], compact: bool) -> Option<(u64, Who<'_>, &[u8])> {
    if compact {
        let (row, rest) = super::varint::get(payload)?;
        let check = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
        return Some((row, Who::Check(check), &rest[4..]));
    }
    let row = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let len = u32::from_le_bytes(payload.get(8..12)?.try_into().ok()?) as usize;
    let id = std::str::from_utf8(payload.get(12..12 + len)?).ok()?;
    Some((row, Who::Id(id), &payload[12 + len..]))
}

/// [`Who`], owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoredWho {
    /// The ID.
    Id(String),
    /// A check of the ID.
    Check(u32),
}

impl StoredWho {
    fn of(who: Who<'_>) -> StoredWho {
        match who {
            Who::Id(id) => StoredWho::Id(id.to_owned()),
            Who::Check(c) => StoredWho::Check(c),
        }
    }

    fn who(&self) -> Who<'_> {
        match self {
            StoredWho::Id(id) => Who::Id(id),
            StoredWho::Check(c) => Who::Check(*c),
        }
    }
}

impl std::fmt::Display for StoredWho {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoredWho::Id(id) => write!(f, "{id:?}"),
            StoredWho::Check(c) => write!(f, "an ID with check {c:08x}"),
        }
    }
}

/// Read into `buf` until it is full or the reader ends; returns the bytes read.
pub(super) fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// `read_at` until `buf` is full or the file ends; returns the bytes read.
pub(crate) fn read_at_most(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: u64) -> Vec<u8> {
        format!(
            "{{\"n\":{n},\"pad\":\"{}\"}}",
            "x".repeat((n % 2000) as usize)
        )
        .into_bytes()
    }

    fn append(log: &ResultsLog, rows: impl Iterator<Item = u64>) {
        let items: Vec<(u64, String, Vec<u8>)> =
            rows.map(|r| (r, format!("id/{r} ü"), rec(r))).collect();
        log.append(
            items
                .iter()
                .map(|(r, id, b)| (*r, id.as_str(), b.as_slice())),
        )
        .unwrap();
    }

    fn check(log: &ResultsLog, rows: impl Iterator<Item = u64>) {
        for r in rows {
            assert_eq!(
                log.get(r, &format!("id/{r} ü")).unwrap(),
                Some(rec(r)),
                "row {r}"
            );
        }
    }

    /// An entry of one record as builds before groups wrote it (compact: with a check of
    /// its ID).
    fn compact_entry(row: u64, id: &str, record: &[u8]) -> Vec<u8> {
        let mut payload = Vec::new();
        super::super::varint::put(&mut payload, row);
        payload.extend_from_slice(&id_check(id).to_le_bytes());
        payload.extend_from_slice(record);
        let mut out = (payload.len() as u32 | COMPACT).to_le_bytes().to_vec();
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// An entry as builds before compact entries wrote it.
    fn old_entry(row: u64, id: &str, record: &[u8]) -> Vec<u8> {
        let mut payload = row.to_le_bytes().to_vec();
        payload.extend_from_slice(&(id.len() as u32).to_le_bytes());
        payload.extend_from_slice(id.as_bytes());
        payload.extend_from_slice(record);
        let mut out = (payload.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    #[test]
    fn a_log_of_older_entries_replays_and_reads_beside_groups() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = Vec::new();
        for r in 0..50 {
            let (id, record) = (format!("id/{r} ü"), rec(r));
            old.extend(match r < 25 {
                true => old_entry(r, &id, &record),
                false => compact_entry(r, &id, &record),
            });
        }
        std::fs::write(dir.path().join(LOG_FILE), &old).unwrap();
        // Nothing durable recorded: the open replays the old entries from the start.
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        check(&log, 0..50);
        append(&log, (50..100).chain(10..20).chain(30..40));
        check(&log, 0..100);
        // Groups of two records cost less than 5 bytes a record beyond it; a compact entry
        // took 14 or more (header, row, ID check).
        let records: u64 = (50..100)
            .chain(10..20)
            .chain(30..40)
            .map(|r| rec(r).len() as u64)
            .sum();
        assert!(log.len() - (old.len() as u64) < 70 * 5 + records);
        // A position pointing at another ID's record is damage in an entry that keeps who
        // it is for.
        assert!(matches!(
            log.get(3, "id/4 ü"),
            Err(LogError::Damaged { .. })
        ));
        assert!(matches!(
            log.get(45, "id/46 ü"),
            Err(LogError::Damaged { .. })
        ));
        let durable = log.sync(true).unwrap();
        drop(log);
        let log = ResultsLog::open(dir.path(), durable).unwrap();
        check(&log, 0..100);
        // And replayed from the start, the mixed log still rebuilds every position.
        std::fs::remove_file(dir.path().join(POSITIONS_FILE)).unwrap();
        drop(log);
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        check(&log, 0..100);
    }

    #[test]
    fn appends_read_back_before_and_after_sync_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        append(&log, 0..100);
        append(&log, (200..300).rev());
        check(&log, (0..100).chain(200..300));
        assert_eq!(log.get(150, "id/150 ü").unwrap(), None);
        assert!(!log.contains(100).unwrap());
        let durable = log.sync(false).unwrap();
        assert_eq!(durable.synced, log.len());
        check(&log, (0..100).chain(200..300));
        // A later record for a row replaces the earlier one.
        log.append([(5, "id/5 ü", b"new".as_slice())]).unwrap();
        assert_eq!(log.get(5, "id/5 ü").unwrap().unwrap(), b"new");
        let durable = log.sync(false).unwrap();
        drop(log);
        let log = ResultsLog::open(dir.path(), durable).unwrap();
        assert_eq!(log.get(5, "id/5 ü").unwrap().unwrap(), b"new");
        check(&log, (0..5).chain(6..100).chain(200..300));
    }

    /// Points row `to`'s position at row `from`'s record, durably.
    fn misplace(dir: &Path, log: &ResultsLog, from: u64, to: u64) {
        let pos = log.position(from).unwrap().unwrap();
        let f = OpenOptions::new()
            .write(true)
            .open(dir.join(POSITIONS_FILE))
            .unwrap();
        f.write_all_at(&(pos.to_u64() + 1).to_le_bytes(), to * 8)
            .unwrap();
    }

    #[test]
    fn a_position_pointing_at_another_rows_record_in_a_group_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        append(&log, 0..10);
        let durable = log.sync(true).unwrap();
        misplace(dir.path(), &log, 4, 7);
        let err = log.get(7, "id/7 ü").unwrap_err();
        assert!(matches!(err, LogError::Damaged { .. }), "{err}");
        assert!(err.to_string().contains("holds row 4"), "{err}");
        // An index past the group's records, likewise.
        let Pos::Grouped { at, .. } = log.position(3).unwrap().unwrap() else {
            panic!("an append writes groups");
        };
        let beyond = Pos::Grouped { at, index: 200 };
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(POSITIONS_FILE))
            .unwrap();
        f.write_all_at(&(beyond.to_u64() + 1).to_le_bytes(), 3 * 8)
            .unwrap();
        let rows: Vec<(u64, String)> = (0..10).map(|r| (r, format!("id/{r} ü"))).collect();
        let rows: Vec<(u64, &str)> = rows.iter().map(|(r, id)| (*r, id.as_str())).collect();
        assert!(matches!(log.get_many(&rows), Err(LogError::Damaged { .. })));
        drop(log);
        let log = ResultsLog::open(dir.path(), durable).unwrap();
        assert!(log.get(3, "id/3 ü").is_err());
        check(&log, (0..3).chain(8..10));
    }

    #[test]
    fn one_append_is_framed_as_groups_of_at_most_256_records() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        let items: Vec<(u64, String)> = (0..600).map(|r| (r, r.to_string())).collect();
        log.append(
            items
                .iter()
                .map(|(r, id)| (*r, id.as_str(), b"v".as_slice())),
        )
        .unwrap();
        // Three groups: three headers, then per record a one- or two-byte row delta (the
        // first of each group: the row itself), a length and the record.
        assert!(
            log.len() <= 3 * (HEADER as u64 + 1) + 600 * 3,
            "{}",
            log.len()
        );
        let groups: std::collections::BTreeSet<u64> = (0..600)
            .map(|r| log.position(r).unwrap().unwrap().entry())
            .collect();
        assert_eq!(groups.len(), 3);
        let durable = log.sync(true).unwrap();
        drop(log);
        // Replayed from the start, every record is found in its group.
        let log = ResultsLog::open(
            dir.path(),
            Durable {
                covers: 0,
                ..durable
            },
        )
        .unwrap();
        for (r, id) in items.iter().step_by(7) {
            assert_eq!(log.get(*r, id).unwrap().unwrap(), b"v");
        }
    }

    #[test]
    fn a_damaged_group_is_refused_whole_when_durable_and_cut_whole_when_torn() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        append(&log, 0..10);
        let durable = log.sync(true).unwrap();
        append(&log, 10..20);
        let len = log.len();
        drop(log);
        let path = dir.path().join(LOG_FILE);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        // One byte of the last record of the second group: its checksum fails, and every
        // record of that group goes with the torn tail.
        let last = f.metadata().unwrap().len() - 1;
        f.write_all_at(b"#", last).unwrap();
        let log = ResultsLog::open(dir.path(), durable).unwrap();
        assert_eq!(log.len(), durable.synced, "the whole group was cut");
        assert!(log.len() < len);
        check(&log, 0..10);
        for r in 10..20 {
            assert_eq!(log.get(r, &format!("id/{r} ü")).unwrap(), None);
        }
        drop(log);
        // Inside the durable part the same damage is an error, on a read and on a replay.
        f.write_all_at(b"#", durable.synced - 1).unwrap();
        let log = ResultsLog::open(dir.path(), durable).unwrap();
        let err = log.get(3, "id/3 ü").unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        drop(log);
        let replay_all = Durable {
            covers: 0,
            ..durable
        };
        let err = ResultsLog::open(dir.path(), replay_all).err().unwrap();
        assert!(err.to_string().contains("damaged"), "{err}");
    }

    #[test]
    fn a_kill_before_sync_replays_from_covers_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        append(&log, 0..50);
        let durable = log.sync(false).unwrap();
        assert_eq!(durable.covers, durable.synced);
        // Written after the last sync: in the page cache, as after a kill -9.
        append(&log, 50..80);
        log.append([(3, "id/3 ü", b"rewritten".as_slice())])
            .unwrap();
        let len = log.len();
        drop(log);
        // A torn entry at the end: half a header and payload.
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(LOG_FILE))
            .unwrap();
        f.write_all_at(&[9, 0, 0, 0, 1, 2, 3], len).unwrap();
        let log = ResultsLog::open(dir.path(), durable).unwrap();
        assert_eq!(log.len(), len, "the torn tail is cut off");
        check(&log, (0..3).chain(4..80));
        assert_eq!(log.get(3, "id/3 ü").unwrap().unwrap(), b"rewritten");
        append(&log, 80..90);
        check(&log, 80..90);
    }

    #[test]
    fn positions_not_durable_are_rebuilt_by_the_replay() {
        // covers moves at most every second: a sync before that leaves it behind, and the
        // replay must rebuild the positions the file may not hold (here: none at all).
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        append(&log, 0..10);
        let first = log.sync(false).unwrap();
        append(&log, 10..40);
        let second = log.sync(false).unwrap();
        assert_eq!(second.covers, first.covers, "covers waits for COVER_EVERY");
        drop(log);
        std::fs::write(dir.path().join(POSITIONS_FILE), [0u8; 80]).unwrap();
        let log = ResultsLog::open(dir.path(), second).unwrap();
        check(&log, 10..40);
    }

    #[test]
    fn a_row_rewritten_across_a_sync_keeps_its_durable_record_on_replay() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        append(&log, 0..5);
        let durable = log.sync(false).unwrap();
        log.append([(2, "id/2 ü", b"first".as_slice())]).unwrap();
        let d2 = log.sync(false).unwrap();
        log.append([(2, "id/2 ü", b"second".as_slice())]).unwrap();
        // A group of one: header, row (one byte), length (one byte), record.
        let cut = log.len() - (HEADER + 1 + 1 + 6) as u64;
        drop(log);
        // The second record never reached the disk (power loss): cut it away.
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(LOG_FILE))
            .unwrap();
        f.set_len(cut).unwrap();
        let log = ResultsLog::open(dir.path(), d2).unwrap();
        assert_eq!(log.get(2, "id/2 ü").unwrap().unwrap(), b"first");
        assert!(durable.synced <= d2.synced);
    }

    #[test]
    fn damage_inside_the_durable_part_is_an_error_not_a_cut() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        append(&log, 0..20);
        let durable = log.sync(false).unwrap();
        drop(log);
        // Replay starts at 0 (say the positions were never made durable) and meets damage.
        let replay_all = Durable {
            covers: 0,
            synced: durable.synced,
            positions: 0,
        };
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(LOG_FILE))
            .unwrap();
        f.write_all_at(b"XXXX", 40).unwrap();
        let err = ResultsLog::open(dir.path(), replay_all).err().unwrap();
        assert!(err.to_string().contains("results.log"), "{err}");
        // A log shorter than what was durable is refused.
        f.set_len(durable.synced - 1).unwrap();
        let err = ResultsLog::open(dir.path(), durable).err().unwrap();
        assert!(err.to_string().contains("durable"), "{err}");
    }

    /// Run `body` in a child process (this test binary, the test `name` alone) whose address
    /// space is capped at 1 GiB, so an allocation sized by a huge length from the disk
    /// aborts it and fails the test.
    fn under_a_memory_cap(name: &str, body: impl FnOnce()) {
        if std::env::var_os("HIGHWATER_TEST_MEMORY_CAPPED").is_some() {
            body();
            return;
        }
        let module = module_path!()
            .split_once("::")
            .expect("the crate, then the module")
            .1;
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"ulimit -v 1048576 && exec "$0" --exact "$1" --test-threads 1"#)
            .arg(std::env::current_exe().unwrap())
            .arg(format!("{module}::{name}"))
            .env("HIGHWATER_TEST_MEMORY_CAPPED", "1")
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "under a 1 GiB cap: {}\n{}{}",
            status.status,
            String::from_utf8_lossy(&status.stdout),
            String::from_utf8_lossy(&status.stderr)
        );
    }

    #[test]
    fn a_huge_length_from_the_disk_is_a_torn_tail_or_damage_never_an_allocation() {
        under_a_memory_cap(
            "a_huge_length_from_the_disk_is_a_torn_tail_or_damage_never_an_allocation",
            || {
                let dir = tempfile::tempdir().unwrap();
                let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
                append(&log, 0..20);
                let durable = log.sync(true).unwrap();
                drop(log);
                // After the durable mark: a torn tail whose length says 2 GiB.
                let path = dir.path().join(LOG_FILE);
                let f = OpenOptions::new().write(true).open(&path).unwrap();
                let huge = (COMPACT | 0x7fff_ffff).to_le_bytes();
                f.write_all_at(&[&huge[..], &[7; 20]].concat(), durable.synced)
                    .unwrap();
                let log = ResultsLog::open(dir.path(), durable).unwrap();
                check(&log, 0..20);
                assert_eq!(log.len(), durable.synced, "the torn tail is cut off");
                // A durable entry's length damaged to 2 GiB: read, it is an error.
                let at = log.position(19).unwrap().expect("row 19's entry").entry();
                f.write_all_at(&huge, at).unwrap();
                let err = log.get(19, "id/19 ü").unwrap_err();
                assert!(err.to_string().contains("runs past the end"), "{err}");
                drop(log);
                // And an open that replays it refuses the log: it was durable.
                let replay_all = Durable {
                    covers: 0,
                    ..durable
                };
                let err = ResultsLog::open(dir.path(), replay_all).err().unwrap();
                assert!(err.to_string().contains("runs past the end"), "{err}");
            },
        );
    }

    #[test]
    fn many_pending_positions_sync_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        let n = MAX_PENDING as u64 + 10;
        let items: Vec<(u64, String)> = (0..n).map(|r| (r, r.to_string())).collect();
        log.append(
            items
                .iter()
                .map(|(r, id)| (*r, id.as_str(), b"{}".as_slice())),
        )
        .unwrap();
        assert!(log.pending.lock().unwrap().is_empty());
        for (r, id) in items.iter().step_by(997) {
            assert_eq!(log.get(*r, id).unwrap().unwrap(), b"{}");
        }
    }

    #[test]
    fn get_many_reads_what_get_reads() {
        let dir = tempfile::tempdir().unwrap();
        let log = ResultsLog::open(dir.path(), Durable::default()).unwrap();
        append(&log, (0..50).filter(|r| r % 3 != 0));
        log.sync(false).unwrap();
        append(&log, 50..60);
        let ids: Vec<(u64, String)> = (0..70).map(|r| (r, format!("id/{r} ü"))).collect();
        let rows: Vec<(u64, &str)> = ids.iter().map(|(r, id)| (*r, id.as_str())).collect();
        let many = log.get_many(&rows).unwrap();
        let one: Vec<_> = rows
            .iter()
            .map(|(r, id)| log.get(*r, id).unwrap())
            .collect();
        assert_eq!(many, one);
        assert_eq!(many.iter().filter(|r| r.is_some()).count(), 33 + 10);
        // Far-apart rows take the one-by-one path, with the same answers.
        let sparse = [(1, "id/1 ü"), (1_000_000, "id/1000000 ü"), (55, "id/55 ü")];
        assert_eq!(
            log.get_many(&sparse).unwrap(),
            vec![Some(rec(1)), None, Some(rec(55))]
        );
    }

    #[test]
    fn durable_round_trips_through_bytes() {
        let d = Durable {
            covers: 7,
            synced: 1 << 40,
            positions: 800,
        };
        assert_eq!(Durable::from_bytes(&d.to_bytes()), Some(d));
        assert_eq!(Durable::from_bytes(b"short"), None);
        // As stored before the positions' length was kept.
        let old = Durable::from_bytes(&d.to_bytes()[..16]).unwrap();
        assert_eq!(old, Durable { positions: 0, ..d });
    }
}
