//! Pages log: the pages of paginated IDs ([`crate::store::PageRecord`]), beside sled as the
//! results are, in two files created with the job's first page (a job that never pages has
//! neither):
//!
//! ```text
//! DIR/pages.log    append-only group entries, framed as the results log's
//!                  ([`log_groups`](super::log_groups): [length u32 LE with the two top bits
//!                  set][CRC-32 u32 LE][the group's records, each with its row]); a page's
//!                  record is its link
//!                  [ID check u32 LE][generation varint][page varint]
//!                  [previous: 0, or 1 + (this group's offset − the previous page's group
//!                  offset) varint, then the previous page's index in its group varint]
//!                  then its mark and items ([`page_codec`](super::page_codec))
//! DIR/page_heads   dense array by input row: u64 LE = 1 + the position ([`Pos`]) of the
//!                  row's last page written, 0 = none (holes read as none)
//! ```
//!
//! A row's pages form one chain, newest first: from its head, each page links to the page
//! before it in its generation (the one numbered below it), and a generation's first page to
//! the last page of the generation before. So the pages of one ID are found by walking back
//! from its head, with no index and nothing in memory but the walk's positions (8 bytes a
//! page). A page written again (the same generation and number) links to what the earlier one
//! linked to: the earlier one, and any page after it in its generation, drop out of the
//! chain (the pages after a page asked again follow from its answer, not the earlier one's).
//! Generations only grow along a row's chain: a page of a generation older than the row's
//! last page is refused ([`AppendError::Refused`]). The ID check catches a head or a link
//! pointing at another ID's page, as in the results log's compact entries.
//!
//! Durability mirrors the results log's ([`super::results_log`]): appends go to the log at
//! once and their heads wait in memory until [`PagesLog::sync`], which makes the log durable
//! first and only then writes the heads of what it made durable; the heads file is synced at
//! most every second, and the log offset from which every head is durable ([`Durable`], with
//! `positions` the heads file's length) is kept by the caller in sled (under [`META_KEY`]).
//! An open replays the log from there and cuts off a torn tail; a bad entry before the
//! durable length is damage. [`PagesLog::make_durable`] makes the log durable alone: a store
//! calls it before it appends a record that counts pages, so no such record reaches the
//! results log (where a later sync, a self-sync of the results log or the kernel's own
//! write-back could make it durable) before the pages it counts are durable.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::log_groups::{self, GroupWriter, Pos, HEADER};
use super::results_log::{id_check, read_at_most, read_full, Durable, LogError};
use super::varint;

/// The pages log's file name in the state directory.
pub(crate) const LOG_FILE: &str = "pages.log";
/// The heads file's name in the state directory.
pub(crate) const HEADS_FILE: &str = "page_heads";
/// The key in sled's `meta` tree of what of the pages log is durable ([`Durable`]).
pub(crate) const META_KEY: &str = "pages";

/// How often (at most) a sync also makes the heads durable and moves [`Durable::covers`].
const COVER_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Heads waiting in memory past this many rows make an append sync the log itself.
const MAX_PENDING: usize = 1 << 18;
/// Most groups of pages are smaller: one read gets header and payload.
const READ_AHEAD: usize = 4096;

/// Where a page stands among its row's pages, as its record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Link {
    check: u32,
    generation: u32,
    page: u32,
    /// The page before it in the row's chain.
    prev: Option<Pos>,
}

/// A page to append: whose it is, its generation and number, and its mark and items as
/// [`page_codec`](super::page_codec) encodes them.
pub(crate) struct NewPage<'a> {
    /// The row of the ID's first occurrence.
    pub row: u64,
    /// The ID.
    pub id: &'a str,
    /// 0 for the job's own run, `k` for rerun `k`.
    pub generation: u32,
    /// The page's number.
    pub page: u32,
    /// Its mark and items, encoded.
    pub bytes: &'a [u8],
}

/// Why pages were not appended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppendError {
    /// The log or the heads file failed, or holds damage.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A page the chain cannot take (see the module doc).
    #[error("{0}")]
    Refused(String),
}

/// A row's head not yet written to the heads file.
#[derive(Debug, Clone, Copy)]
struct Pending {
    latest: Pos,
    /// The first page appended for the row since its head was last written.
    earliest: u64,
}

struct Appender {
    len: u64,
    buf: Vec<u8>,
}

struct Synced {
    /// The log length last made durable.
    log: u64,
    durable: Durable,
    covered_at: std::time::Instant,
    /// The files were created by this open: their directory is synced with the log's first
    /// sync.
    created: bool,
}

/// A group read back (kept while the pages of one ID are read from it).
struct Group {
    at: u64,
    payload: Vec<u8>,
    records: Vec<(u64, std::ops::Range<usize>)>,
}

/// The open pages log and heads file of one state directory.
pub(crate) struct PagesLog {
    dir: PathBuf,
    log_path: PathBuf,
    heads_path: PathBuf,
    log: File,
    heads: File,
    appender: Mutex<Appender>,
    pending: Mutex<HashMap<u64, Pending>>,
    synced: Mutex<Synced>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PagesLog {
    /// Open the files in `dir`, given what the store last recorded as durable, and replay
    /// the log from `durable.covers`. Without a log file: none, unless `create` (then both
    /// files are created) or something of it was durable (then it is damage).
    pub(crate) fn open(
        dir: &Path,
        durable: Durable,
        create: bool,
    ) -> Result<Option<PagesLog>, LogError> {
        let log_path = dir.join(LOG_FILE);
        let heads_path = dir.join(HEADS_FILE);
        let exists = log_path
            .try_exists()
            .map_err(|source| io_error(&log_path, source))?;
        if !exists && !create {
            if durable.synced > 0 || durable.positions > 0 {
                return Err(LogError::Damaged {
                    path: log_path,
                    reason: format!("it is missing, but {} bytes were durable", durable.synced),
                });
            }
            return Ok(None);
        }
        let open = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|source| io_error(path, source))
        };
        let log = open(&log_path)?;
        let heads = open(&heads_path)?;
        let damaged = |path: &Path, reason: String| LogError::Damaged {
            path: path.to_owned(),
            reason,
        };
        let file_len = log.metadata().map_err(|e| io_error(&log_path, e))?.len();
        if file_len < durable.synced || durable.covers > durable.synced {
            return Err(damaged(
                &log_path,
                format!(
                    "it holds {file_len} bytes, but {} were durable (truncated or replaced)",
                    durable.synced
                ),
            ));
        }
        let heads_len = heads
            .metadata()
            .map_err(|e| io_error(&heads_path, e))?
            .len();
        if heads_len < durable.positions || (durable.covers > 0 && heads_len == 0) {
            return Err(damaged(
                &heads_path,
                format!(
                    "it holds {heads_len} bytes, but {} were durable (truncated or replaced)",
                    durable.positions
                ),
            ));
        }
        let (pending, at) = replay(&log, &log_path, durable, file_len)?;
        if at < file_len {
            // A torn tail: never durable, and nothing refers to it.
            log.set_len(at).map_err(|e| io_error(&log_path, e))?;
            tracing::debug!(
                at,
                file_len,
                "cut off the pages log's torn tail after a crash"
            );
        }
        Ok(Some(PagesLog {
            dir: dir.to_owned(),
            log_path,
            heads_path,
            log,
            heads,
            appender: Mutex::new(Appender {
                len: at,
                buf: Vec::new(),
            }),
            pending: Mutex::new(pending),
            synced: Mutex::new(Synced {
                log: durable.synced,
                durable,
                covered_at: std::time::Instant::now(),
                created: !exists,
            }),
        }))
    }

    fn damaged(&self, reason: String) -> LogError {
        LogError::Damaged {
            path: self.log_path.clone(),
            reason,
        }
    }

    /// Append pages in one write, each linked into its row's chain (see the module doc). They
    /// are readable at once and durable after the next [`PagesLog::sync`] or
    /// [`PagesLog::make_durable`].
    pub(crate) fn append(&self, pages: &[NewPage<'_>]) -> Result<(), AppendError> {
        let mut appender = lock(&self.appender);
        let Appender { len, buf } = &mut *appender;
        buf.clear();
        // The links and heads of this append's pages, before they are in the file.
        let mut links: HashMap<u64, Link> = HashMap::new();
        let mut heads: HashMap<u64, Pos> = HashMap::new();
        let mut placed = Vec::with_capacity(pages.len());
        let mut group = None;
        let mut record = Vec::new();
        let mut groups = GroupWriter::new(buf);
        for p in pages {
            let check = id_check(p.id);
            let head = match heads.get(&p.row) {
                Some(pos) => Some(*pos),
                None => self.head(p.row)?,
            };
            let prev = self.prev_of(p, check, head, &links, &mut group)?;
            let at = *len + groups.next_start() as u64;
            record.clear();
            record.extend_from_slice(&check.to_le_bytes());
            varint::put(&mut record, u64::from(p.generation));
            varint::put(&mut record, u64::from(p.page));
            match prev {
                None => varint::put(&mut record, 0),
                Some(prev) => {
                    let Pos::Grouped { at: prev_at, index } = prev else {
                        unreachable!("the pages log holds groups only");
                    };
                    varint::put(&mut record, 1 + (at - prev_at));
                    varint::put(&mut record, u64::from(index));
                }
            }
            record.extend_from_slice(p.bytes);
            let (start, index) = groups
                .push(p.row, &record)
                .map_err(|e| self.damaged(e.replace("results", "pages")))?;
            let at = *len + start as u64;
            if at >= log_groups::MAX_GROUP_OFFSET {
                return Err(self
                    .damaged(format!("it cannot grow past {at} bytes"))
                    .into());
            }
            let pos = Pos::Grouped { at, index };
            let link = Link {
                check,
                generation: p.generation,
                page: p.page,
                prev,
            };
            links.insert(pos.to_u64(), link);
            heads.insert(p.row, pos);
            placed.push((p.row, pos));
        }
        groups.close();
        if placed.is_empty() {
            return Ok(());
        }
        self.log
            .write_all_at(buf, *len)
            .map_err(|e| io_error(&self.log_path, e))?;
        *len += buf.len() as u64;
        if buf.capacity() > 4 << 20 {
            *buf = Vec::new();
        }
        let mut pending = lock(&self.pending);
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

    /// The page `p` links to: walking back from the row's head `head`, the first page that
    /// stays in the chain (of its generation and numbered below it, or of an older one).
    fn prev_of(
        &self,
        p: &NewPage<'_>,
        check: u32,
        head: Option<Pos>,
        links: &HashMap<u64, Link>,
        group: &mut Option<Group>,
    ) -> Result<Option<Pos>, AppendError> {
        let mut cur = head;
        while let Some(pos) = cur {
            let link = match links.get(&pos.to_u64()) {
                Some(link) => *link,
                None => self.link_at(pos, p.row, check, group)?.0,
            };
            if link.generation > p.generation {
                return Err(AppendError::Refused(format!(
                    "page {} of {:?} in generation {} comes after its pages of generation {}",
                    p.page, p.id, p.generation, link.generation
                )));
            }
            if link.generation < p.generation || link.page < p.page {
                return Ok(Some(pos));
            }
            cur = link.prev;
        }
        Ok(None)
    }

    /// Where the last page written for `row` is, if it has one.
    fn head(&self, row: u64) -> Result<Option<Pos>, LogError> {
        if let Some(p) = lock(&self.pending).get(&row) {
            return Ok(Some(p.latest));
        }
        let mut bytes = [0u8; 8];
        let got = read_at_most(&self.heads, &mut bytes, row * 8)
            .map_err(|e| io_error(&self.heads_path, e))?;
        let value = if got == 8 {
            u64::from_le_bytes(bytes)
        } else {
            0
        };
        Ok(value.checked_sub(1).map(Pos::from_u64))
    }

    /// The page of `generation` at the front of the chain of `id` (at `row`): the page
    /// written last of those it keeps, with its number and its mark and items' bytes.
    pub(crate) fn last(
        &self,
        row: u64,
        id: &str,
        generation: u32,
    ) -> Result<Option<(u32, Vec<u8>)>, LogError> {
        let check = id_check(id);
        let mut group = None;
        let mut cur = self.head(row)?;
        while let Some(pos) = cur {
            let (link, bytes) = self.link_at(pos, row, check, &mut group)?;
            if link.generation < generation {
                break;
            }
            if link.generation == generation {
                let g = group.as_ref().expect("read by link_at");
                return Ok(Some((link.page, g.payload[bytes].to_vec())));
            }
            cur = link.prev;
        }
        Ok(None)
    }

    /// Pages `from..from + count` of `id` (at `row`) in `generation`, in order, each with its
    /// mark and items' bytes; a page missing from the chain is damage.
    pub(crate) fn pages(
        &self,
        row: u64,
        id: &str,
        generation: u32,
        from: u32,
        count: u32,
    ) -> Result<Vec<Vec<u8>>, LogError> {
        let check = id_check(id);
        let mut group = None;
        let end = u64::from(from) + u64::from(count);
        // Walk back to page `from`, keeping the positions (8 bytes each) of the pages asked
        // for: in the chain, a generation's pages go down one by one, or skip the missing.
        let mut found: Vec<u64> = Vec::new();
        let mut cur = self.head(row)?;
        while let Some(pos) = cur {
            let (link, _) = self.link_at(pos, row, check, &mut group)?;
            if link.generation < generation || (link.generation == generation && link.page < from) {
                break;
            }
            if link.generation == generation && u64::from(link.page) < end {
                found.push(pos.to_u64());
            }
            cur = link.prev;
        }
        let missing = |page: u64| {
            self.damaged(format!(
                "page {page} of {id:?} (row {row}, generation {generation}) is missing"
            ))
        };
        let mut out = Vec::new();
        for page in u64::from(from)..end {
            let pos = found.pop().ok_or_else(|| missing(page))?;
            let (link, bytes) = self.link_at(Pos::from_u64(pos), row, check, &mut group)?;
            // Numbered above `page`: the pages in between are missing.
            if u64::from(link.page) != page {
                return Err(missing(page));
            }
            let g = group.as_ref().expect("read by link_at");
            out.push(g.payload[bytes].to_vec());
        }
        Ok(out)
    }

    /// The link of the page at `pos`, which must be `row`'s and its ID's (`check`), and
    /// where its mark and items are in `group`'s payload (`group` keeps the group read last).
    fn link_at(
        &self,
        pos: Pos,
        row: u64,
        check: u32,
        group: &mut Option<Group>,
    ) -> Result<(Link, std::ops::Range<usize>), LogError> {
        let Pos::Grouped { at, index } = pos else {
            return Err(self.damaged(format!("row {row} points at {pos:?}, not into a group")));
        };
        if group.as_ref().is_none_or(|g| g.at != at) {
            *group = Some(self.read_group(at)?);
        }
        let g = group.as_ref().expect("read just now");
        let (stored, range) = g.records.get(index as usize).ok_or_else(|| {
            self.damaged(format!(
                "row {row} points at page {index} of the group at byte {at}, which holds {}",
                g.records.len()
            ))
        })?;
        let bad = |what: String| self.damaged(format!("row {row} points at {pos:?}, {what}"));
        if *stored != row {
            return Err(bad(format!("which holds row {stored}")));
        }
        let record = &g.payload[range.clone()];
        let (link, used) =
            parse_link(record, at).ok_or_else(|| bad("whose link is undecodable".into()))?;
        if link.check != check {
            return Err(bad(format!(
                "which holds an ID with check {:08x}",
                link.check
            )));
        }
        // A link goes back in the log: a walk always ends.
        if link
            .prev
            .is_some_and(|prev| (prev.entry(), index_of(prev)) >= (at, index))
        {
            return Err(bad("whose link does not go back".into()));
        }
        Ok((link, range.start + used..range.end))
    }

    /// The group entry starting at `at`.
    fn read_group(&self, at: u64) -> Result<Group, LogError> {
        let bad = |what: &str| self.damaged(format!("the entry at byte {at} is {what}"));
        let mut buf = vec![0u8; READ_AHEAD];
        let got = read_at_most(&self.log, &mut buf, at).map_err(|e| io_error(&self.log_path, e))?;
        if got < HEADER {
            return Err(bad("missing"));
        }
        let field = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
        if field & log_groups::GROUP != log_groups::GROUP {
            return Err(bad("not a group"));
        }
        let len = (field & !log_groups::GROUP) as usize;
        let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        if HEADER + len > got {
            // The length comes from the disk: check it against the file before allocating.
            let file_len = self
                .log
                .metadata()
                .map_err(|e| io_error(&self.log_path, e))?
                .len();
            if at + (HEADER + len) as u64 > file_len {
                return Err(bad("cut short (its length runs past the end of the log)"));
            }
            buf.resize(HEADER + len, 0);
            let more = read_at_most(&self.log, &mut buf[got..], at + got as u64)
                .map_err(|e| io_error(&self.log_path, e))?;
            if got + more < HEADER + len {
                return Err(bad("cut short"));
            }
        }
        buf.truncate(HEADER + len);
        buf.drain(..HEADER);
        if crc32fast::hash(&buf) != crc {
            return Err(bad("damaged (checksum)"));
        }
        let records = log_groups::records(&buf).ok_or_else(|| bad("undecodable"))?;
        Ok(Group {
            at,
            payload: buf,
            records,
        })
    }

    /// Make every append so far durable, without writing heads (see the module doc).
    pub(crate) fn make_durable(&self) -> Result<(), LogError> {
        let mut synced = lock(&self.synced);
        let len = lock(&self.appender).len;
        self.sync_log(&mut synced, len)
    }

    fn sync_log(&self, synced: &mut Synced, len: u64) -> Result<(), LogError> {
        if len > synced.log || synced.created {
            self.log
                .sync_data()
                .map_err(|e| io_error(&self.log_path, e))?;
            synced.log = synced.log.max(len);
        }
        if synced.created {
            // The files' names are durable with their directory, before anything says that
            // what they hold is.
            self.heads
                .sync_all()
                .map_err(|e| io_error(&self.heads_path, e))?;
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_error(&self.dir, e))?;
            synced.created = false;
        }
        Ok(())
    }

    /// Make every append so far durable, then write their heads. Returns what the store keeps
    /// for the next open. Moves [`Durable::covers`] at most every `COVER_EVERY`, or now if
    /// `force`.
    pub(crate) fn sync(&self, force: bool) -> Result<Durable, LogError> {
        let mut synced = lock(&self.synced);
        let len = lock(&self.appender).len;
        self.sync_log(&mut synced, len)?;
        let mut ready: Vec<(u64, Pos)> = lock(&self.pending)
            .iter()
            .filter(|(_, p)| p.latest.entry() < len)
            .map(|(row, p)| (*row, p.latest))
            .collect();
        ready.sort_unstable_by_key(|(row, _)| *row);
        let write = |start: u64, bytes: &[u8]| {
            self.heads
                .write_all_at(bytes, start * 8)
                .map_err(|e| io_error(&self.heads_path, e))
        };
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0;
        for (i, (row, pos)) in ready.iter().enumerate() {
            if i > 0 && *row != ready[i - 1].0 + 1 {
                write(run_start, &run)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = *row;
            }
            run.extend_from_slice(&(pos.to_u64() + 1).to_le_bytes());
        }
        if !run.is_empty() {
            write(run_start, &run)?;
        }
        let oldest_left = {
            let mut pending = lock(&self.pending);
            for (row, pos) in &ready {
                if pending.get(row).is_some_and(|p| p.latest == *pos) {
                    pending.remove(row);
                }
            }
            pending.values().map(|p| p.earliest).min()
        };
        synced.durable.synced = synced.log;
        if force || synced.covered_at.elapsed() >= COVER_EVERY || synced.durable.covers == 0 {
            self.heads
                .sync_data()
                .map_err(|e| io_error(&self.heads_path, e))?;
            synced.durable.positions = self
                .heads
                .metadata()
                .map_err(|e| io_error(&self.heads_path, e))?
                .len();
            synced.durable.covers = oldest_left.map_or(len, |e| e.min(len));
            synced.covered_at = std::time::Instant::now();
        }
        Ok(synced.durable)
    }

    /// The log's length.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        lock(&self.appender).len
    }

    /// The log's length last made durable.
    #[cfg(test)]
    pub(crate) fn synced_len(&self) -> u64 {
        lock(&self.synced).log
    }
}

/// The pages log of an open store, once it exists.
#[derive(Default)]
pub(crate) struct PagesSlot(Mutex<Option<Arc<PagesLog>>>);

impl PagesSlot {
    /// The slot of a store whose pages log is `log`, if it has one.
    pub(crate) fn new(log: Option<PagesLog>) -> PagesSlot {
        PagesSlot(Mutex::new(log.map(Arc::new)))
    }

    /// The pages log, if the store has one.
    pub(crate) fn get(&self) -> Option<Arc<PagesLog>> {
        lock(&self.0).clone()
    }

    /// The pages log, created now in `dir` if the store has none yet.
    pub(crate) fn get_or_create(&self, dir: &Path) -> Result<Arc<PagesLog>, LogError> {
        let mut slot = lock(&self.0);
        if let Some(log) = &*slot {
            return Ok(log.clone());
        }
        let log = PagesLog::open(dir, Durable::default(), true)?.expect("created");
        let log = Arc::new(log);
        *slot = Some(log.clone());
        Ok(log)
    }
}

fn io_error(path: &Path, source: std::io::Error) -> LogError {
    LogError::Io {
        path: path.to_owned(),
        source,
    }
}

fn index_of(pos: Pos) -> u16 {
    match pos {
        Pos::Grouped { index, .. } => index,
        Pos::Entry(_) => 0,
    }
}

/// A page record's link, read in the group at `at`, and the bytes it takes.
fn parse_link(record: &[u8], at: u64) -> Option<(Link, usize)> {
    let check = u32::from_le_bytes(record.get(..4)?.try_into().ok()?);
    let (generation, rest) = varint::get(&record[4..])?;
    let (page, rest) = varint::get(rest)?;
    let (back, mut rest) = varint::get(rest)?;
    let prev = match back {
        0 => None,
        back => {
            let (index, after) = varint::get(rest)?;
            rest = after;
            Some(Pos::Grouped {
                at: at.checked_sub(back - 1)?,
                index: u16::try_from(index).ok()?,
            })
        }
    };
    let link = Link {
        check,
        generation: u32::try_from(generation).ok()?,
        page: u32::try_from(page).ok()?,
        prev,
    };
    Some((link, record.len() - rest.len()))
}

/// Replay `log` from `durable.covers`: the heads of the pages found, and where the last
/// whole entry ends (a bad entry there, before `durable.synced`, is damage).
fn replay(
    log: &File,
    path: &Path,
    durable: Durable,
    file_len: u64,
) -> Result<(HashMap<u64, Pending>, u64), LogError> {
    let io = |e| io_error(path, e);
    let damaged = |reason: String| LogError::Damaged {
        path: path.to_owned(),
        reason,
    };
    let mut pending = HashMap::new();
    let mut reader = std::io::BufReader::with_capacity(1 << 20, log);
    std::io::Seek::seek(&mut reader, std::io::SeekFrom::Start(durable.covers)).map_err(io)?;
    let mut at = durable.covers;
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; HEADER];
        match read_full(&mut reader, &mut header).map_err(io)? {
            0 => break,
            HEADER => {}
            _ if at < durable.synced => {
                return Err(damaged(format!("the entry at byte {at} is cut short")));
            }
            _ => break,
        }
        let field = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let len = (field & !log_groups::GROUP) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        // The length comes from the disk: nothing is allocated for an entry that runs past
        // the end of the file.
        let fits = at + (HEADER + len) as u64 <= file_len;
        let rows = if fits && field & log_groups::GROUP == log_groups::GROUP {
            payload.resize(len, 0);
            let got = read_full(&mut reader, &mut payload).map_err(io)?;
            (got == len && crc32fast::hash(&payload) == crc)
                .then(|| log_groups::records(&payload))
                .flatten()
        } else {
            None
        };
        let Some(rows) = rows else {
            if at < durable.synced {
                return Err(damaged(format!(
                    "the entry at byte {at} is damaged (bad length or checksum)"
                )));
            }
            break;
        };
        for (index, (row, _)) in rows.into_iter().enumerate() {
            let pos = Pos::Grouped {
                at,
                index: index as u16,
            };
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
    Ok((pending, at))
}
