//! ID index: a persistent hash index from an ID to the input row of its first occurrence.
//!
//! Owns the file `ids.idx` of a state directory and its format. Nothing per ID is kept in
//! the process's own memory: the data lives in the OS page cache, which the kernel can evict.
//! The file's first `MAP_LEN` bytes (the tables of a job of up to about a million IDs) are
//! mapped shared, so a lookup or insert there is a load or store, not a `pread` and a
//! `pwrite` (1.5 µs of system time per new ID on the development machine); tables beyond
//! that are read and written with `pread`/`pwrite`. The mapped pages a job touches count in
//! the process's RSS (as file pages, which the kernel can reclaim; at most `MAP_LEN`).
//! A store through the map never fills a hole of the sparse file: until a region's page has
//! had its disk block allocated by a `pwrite` (an initial one-page table, until its first
//! insert) its inserts are written with `pwrite`, so a full disk is an error, not a SIGBUS.
//! `fdatasync` writes back the pages dirtied through the map as it does those written.
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! 0         header copy 0 ┐ magic "HWIDX001", version u32, subtables u32 (4096),
//! 100 KiB   header copy 1 ┘ generation u64, per subtable (region offset, slots, entries)
//!                           u64 each, CRC32 of the preceding bytes
//! 200 KiB   regions, 4 KiB aligned, each one subtable: `slots` entries of 8 bytes,
//!           (fragment26 << 38) | row, u64, empty iff 0
//! ```
//!
//! The 64-bit xxh3 of an ID picks its subtable (top 12 bits) and a 26-bit fragment (low
//! bits, 0 taken as 1), whose low bits also pick the first slot to probe (so a subtable can
//! grow without reading the IDs again). A fragment is no proof: many IDs share one. A slot
//! whose fragment matches is taken for the ID only once the caller's check says the ID at
//! its row is that ID (read from the ID lists, see [`IdIndex::get`]), or, on an insert, when
//! its row is the row being inserted (a row holds one ID); otherwise probing goes on. So a
//! fragment collision costs a check and never returns the wrong row. Checks are rare: a
//! probe meets another ID's equal fragment with a chance of about one in 2^26 divided by a
//! subtable's slots, per slot (about 1 in 30,000 at a million IDs).
//!
//! A subtable is an open-addressing table with linear probing, at most three quarters full:
//! to grow, it is rebuilt at twice the size in a new region appended to the file. Regions
//! are never reused, so a header on disk always points at regions that are still intact.
//!
//! Version 1 of the file (16-byte slots holding a 64-bit tag and 24 check bits, taken as
//! proof of the ID) is refused as [`ErrorKind::InvalidData`], as a damaged index is: the
//! store removes it and builds this one again from the offset log (the index is derived
//! data). An older build does the same with this one.
//!
//! Regions left behind by growth are punched out of the file (`fallocate` with
//! `FALLOC_FL_PUNCH_HOLE`: the space goes back to the filesystem, the file keeps its size)
//! once a header that no longer points at them is durable: by the sync after the growth, and
//! at open for whatever a crash left (every gap between the live regions). The older header
//! copy may still point at them, but it is only read if the newer one is damaged, and the
//! newer one is never written before the older one has become the newer (see below). Where the
//! filesystem cannot punch holes, the space simply stays allocated.
//!
//! The header is written only by [`IdIndex::sync`], after the regions are durable, into the
//! copy with the older generation: a torn header write leaves the other copy valid. Its
//! entry counts are a lower bound (inserts after the last sync may or may not survive a
//! crash); callers insert again what they need after a crash: inserting is idempotent.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock};

const MAGIC: &[u8; 8] = b"HWIDX001";
const VERSION: u32 = 2;
const SUBTABLES: usize = 4096;
const ENTRY: u64 = 8;
/// Slots read at once while probing: one `pread` covers a probe at three quarters full.
const WINDOW: u64 = 16;
/// A new subtable's slots: one page.
const INITIAL_SLOTS: u64 = 512;
const ALIGN: u64 = 4096;
/// Bits of a slot holding the row; the fragment takes the rest.
const ROW_BITS: u32 = 38;
/// Rows must be below this (they share a word with the fragment).
const ROW_LIMIT: u64 = 1 << ROW_BITS;
/// Bits of an ID's hash kept in its slot.
const FRAGMENT_BITS: u32 = 64 - ROW_BITS;
const HEADER_LEN: usize = 8 + 4 + 4 + 8 + SUBTABLES * 24 + 4;
const HEADER_SPAN: u64 = align_up(HEADER_LEN as u64);
const DATA_START: u64 = 2 * HEADER_SPAN;
/// How much of the file, from its start, is mapped: the headers, a new index's tables
/// (4,096 pages) and their first growth.
const MAP_LEN: u64 = 32 << 20;
// A region made at creation is at most one page: any larger region was written in full by
// `grow`, so its blocks are allocated (see `Sub::stores`).
const _: () = assert!(INITIAL_SLOTS * ENTRY <= ALIGN);

/// The most entries a subtable of `slots` holds before it grows: three quarters. Linear
/// probing's expected probe of a new ID is then about 8.5 slots at the fullest and 2.5 on
/// average over a subtable's growth, one window; at half full 16-byte slots took 43 bytes per
/// ID on average (37.5% load), at three quarters 28; 8-byte slots take half that.
const fn max_entries(slots: u64) -> u64 {
    slots / 4 * 3
}

const fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// One subtable as the header records it.
#[derive(Debug, Clone, Copy)]
struct Sub {
    offset: u64,
    slots: u64,
    entries: u64,
    /// Not in the header: every page of the region has its disk block (written by `grow`,
    /// or a one-page region after a `pwrite` into it), so inserts may store through the map.
    stores: bool,
}

impl Sub {
    fn new(offset: u64, slots: u64, entries: u64) -> Sub {
        Sub {
            offset,
            slots,
            entries,
            stores: slots * ENTRY > ALIGN,
        }
    }
}

/// The file's first bytes ([`MAP_LEN`]) mapped shared (the mapping may run past the end of
/// the file: only regions inside the file are touched). Reads happen under the index's read
/// lock and stores under its write lock, as `pread` and `pwrite` did.
struct Map {
    ptr: std::ptr::NonNull<u8>,
    len: u64,
}

// SAFETY: the mapping is plain shared memory owned by this value; the index's lock orders
// every access to it.
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

impl Map {
    /// Map `file`, or None where the system cannot (the index then uses `pread`/`pwrite`).
    fn new(file: &File, len: u64) -> Option<Map> {
        crate::os::map_shared(file, len).map(|ptr| Map { ptr, len })
    }

    /// Where `sub`'s region starts in the map, if it lies inside it.
    fn region(&self, sub: &Sub) -> Option<*mut u8> {
        let end = sub.offset.checked_add(sub.slots * ENTRY)?;
        // SAFETY: the offset is inside the mapping.
        (end <= self.len).then(|| unsafe { self.ptr.as_ptr().add(sub.offset as usize) })
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `Map::new` mapped; nothing refers to it any more.
        unsafe { crate::os::unmap(self.ptr, self.len) };
    }
}

struct Inner {
    subs: Vec<Sub>,
    /// Where the next region goes.
    end: u64,
    /// Sum of the subtables' entries.
    total: u64,
    /// Regions (offset, length) left behind by growth since the last sync's header.
    abandoned: Vec<(u64, u64)>,
}

/// What an ID hashes to.
struct Key {
    sub: usize,
    /// In `1..2^FRAGMENT_BITS`: never 0, so a taken slot is never 0.
    fragment: u64,
}

impl Key {
    fn new(id: &str) -> Key {
        let h = xxhash_rust::xxh3::xxh3_64(id.as_bytes());
        Key {
            sub: (h >> 52) as usize,
            fragment: (h & ((1 << FRAGMENT_BITS) - 1)).max(1),
        }
    }

    /// The slot word recording this ID at `row`.
    fn word(&self, row: u64) -> u64 {
        self.fragment << ROW_BITS | row
    }
}

/// The fragment and the row of a slot word.
fn unpack(word: u64) -> (u64, u64) {
    (word >> ROW_BITS, word & (ROW_LIMIT - 1))
}

/// The slot a word (or a key's fragment) is first probed at in a subtable of `slots`.
fn home(fragment: u64, slots: u64) -> u64 {
    fragment & (slots - 1)
}

/// An error of a lookup: the index's file, or the caller's check of an ID's row.
#[derive(Debug)]
pub(crate) enum IndexError<E> {
    Io(io::Error),
    Check(E),
}

impl<E> From<io::Error> for IndexError<E> {
    fn from(e: io::Error) -> Self {
        IndexError::Io(e)
    }
}

enum Probe {
    Found(u64),
    Empty(u64),
    Full,
}

/// The on-disk ID → first-row index. See the module documentation.
pub(crate) struct IdIndex {
    path: PathBuf,
    file: File,
    map: Option<Map>,
    inner: RwLock<Inner>,
    /// Serializes [`IdIndex::sync`]; holds the generation of the newest header on disk.
    generation: Mutex<u64>,
}

impl std::fmt::Debug for IdIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdIndex")
            .field("path", &self.path)
            .field("len", &self.len())
            .finish()
    }
}

impl IdIndex {
    /// Open the index at `path`, creating it if it does not exist.
    ///
    /// A file that is not a valid index (bad magic, version or checksum, truncated) is an
    /// error of kind [`ErrorKind::InvalidData`] whose message names the file.
    pub(crate) fn open(path: &Path) -> io::Result<IdIndex> {
        IdIndex::open_with(path, INITIAL_SLOTS, MAP_LEN)
    }

    /// `map_len`: how much of the file to map (0: none).
    fn open_with(path: &Path, initial_slots: u64, map_len: u64) -> io::Result<IdIndex> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                create(path, initial_slots)?;
                OpenOptions::new().read(true).write(true).open(path)?
            }
            r => r?,
        };
        let invalid = |reason: String| {
            io::Error::new(
                ErrorKind::InvalidData,
                format!("{} is not a valid ID index: {reason}", path.display()),
            )
        };
        let len = file.metadata()?.len();
        if len < DATA_START {
            return Err(invalid(format!("truncated ({len} bytes)")));
        }
        let mut best: Option<(u64, Vec<Sub>)> = None;
        let mut reasons = Vec::new();
        for copy in 0..2 {
            let mut buf = vec![0u8; HEADER_LEN];
            file.read_exact_at(&mut buf, copy * HEADER_SPAN)?;
            match decode(&buf, len) {
                Ok((generation, subs)) => {
                    if best.as_ref().is_none_or(|(g, _)| generation > *g) {
                        best = Some((generation, subs));
                    }
                }
                Err(reason) => reasons.push(format!("header copy {copy}: {reason}")),
            }
        }
        let (generation, subs) = best.ok_or_else(|| invalid(reasons.join("; ")))?;
        let total = subs.iter().map(|s| s.entries).sum();
        punch_gaps(&file, &subs, len)?;
        Ok(IdIndex {
            path: path.to_owned(),
            map: Map::new(&file, map_len),
            file,
            inner: RwLock::new(Inner {
                subs,
                end: align_up(len),
                total,
                abandoned: Vec::new(),
            }),
            generation: Mutex::new(generation),
        })
    }

    /// The row recorded for `id`, if any. `holds(row, id)` says whether the ID at `row` is
    /// `id` (false for a row it does not know): it is asked for each slot whose fragment
    /// matches, so a collision is skipped. It must not use the index.
    pub(crate) fn get<E>(
        &self,
        id: &str,
        holds: &mut impl FnMut(u64, &str) -> Result<bool, E>,
    ) -> Result<Option<u64>, IndexError<E>> {
        let key = Key::new(id);
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        match self.probe(&inner.subs[key.sub], &key, id, None, holds)? {
            Probe::Found(row) => Ok(Some(row)),
            Probe::Empty(_) | Probe::Full => Ok(None),
        }
    }

    /// Record `id` at `row` unless it is there already: returns the row already recorded
    /// (unchanged) or None if it was inserted now. Rows must be below 2^38. `holds` as for
    /// [`IdIndex::get`]; a slot of `row` itself is taken as `id` without asking.
    pub(crate) fn insert<E>(
        &self,
        id: &str,
        row: u64,
        holds: &mut impl FnMut(u64, &str) -> Result<bool, E>,
    ) -> Result<Option<u64>, IndexError<E>> {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        self.insert_locked(&mut inner, id, row, holds)
    }

    /// Insert many at once (same semantics, one lock); returns for each the existing row or
    /// None. On an error, the items before the failing one are inserted.
    pub(crate) fn insert_all<'a, E>(
        &self,
        items: impl IntoIterator<Item = (u64, &'a str)>,
        holds: &mut impl FnMut(u64, &str) -> Result<bool, E>,
    ) -> Result<Vec<Option<u64>>, IndexError<E>> {
        let items = items.into_iter();
        let mut out = Vec::with_capacity(items.size_hint().0);
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        for (row, id) in items {
            out.push(self.insert_locked(&mut inner, id, row, holds)?);
        }
        Ok(out)
    }

    /// Make every earlier insert durable: sync the regions, then write the header (into the
    /// older of its two copies), then sync again.
    pub(crate) fn sync(&self) -> io::Result<()> {
        let mut generation = self
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (subs, abandoned) = {
            let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            (inner.subs.clone(), std::mem::take(&mut inner.abandoned))
        };
        // Every region `subs` points at was written before this.
        self.file.sync_data()?;
        let next = *generation + 1;
        self.file
            .write_all_at(&encode(next, &subs), (next % 2) * HEADER_SPAN)?;
        self.file.sync_data()?;
        *generation = next;
        // Replaced before `subs` was taken: the durable header no longer points at them.
        for (at, len) in abandoned {
            punch(&self.file, at, len);
        }
        Ok(())
    }

    /// Entries counted (a lower bound after a crash).
    pub(crate) fn len(&self) -> u64 {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }

    /// Whether no entry is counted.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert_locked<E>(
        &self,
        inner: &mut Inner,
        id: &str,
        row: u64,
        holds: &mut impl FnMut(u64, &str) -> Result<bool, E>,
    ) -> Result<Option<u64>, IndexError<E>> {
        if row >= ROW_LIMIT {
            return Err(IndexError::Io(io::Error::new(
                ErrorKind::InvalidInput,
                format!("row {row} of ID {id:?} is too large for the ID index (limit 2^38)"),
            )));
        }
        let key = Key::new(id);
        loop {
            let sub = inner.subs[key.sub];
            match self.probe(&sub, &key, id, Some(row), holds)? {
                Probe::Found(existing) => return Ok(Some(existing)),
                Probe::Empty(slot) if sub.entries < max_entries(sub.slots) => {
                    let word = key.word(row);
                    match self.map.as_ref().and_then(|m| m.region(&sub)) {
                        Some(region) if sub.stores => {
                            // SAFETY: the slot is inside the region, inside the file and the
                            // mapping; 8-byte aligned (regions are page aligned); the write
                            // lock is held. One aligned store: a crash leaves the slot empty
                            // or taken.
                            unsafe {
                                let at = region.add((slot * ENTRY) as usize).cast::<u64>();
                                at.write_volatile(word.to_le());
                            }
                        }
                        _ => {
                            self.file
                                .write_all_at(&word.to_le_bytes(), sub.offset + slot * ENTRY)?;
                            // Its one page now has its block.
                            inner.subs[key.sub].stores |= region_len(sub.slots) == ALIGN;
                        }
                    }
                    inner.subs[key.sub].entries += 1;
                    inner.total += 1;
                    return Ok(None);
                }
                Probe::Empty(_) | Probe::Full => self.grow(inner, key.sub)?,
            }
        }
    }

    /// Walk the probe sequence of `key` (of `id`) in `sub`, a window of slots per read; a
    /// slot whose fragment matches is `id`'s if its row is `row` or `holds` says so.
    fn probe<E>(
        &self,
        sub: &Sub,
        key: &Key,
        id: &str,
        row: Option<u64>,
        holds: &mut impl FnMut(u64, &str) -> Result<bool, E>,
    ) -> Result<Probe, IndexError<E>> {
        let mut buf = [0u8; (WINDOW * ENTRY) as usize];
        let mut pos = home(key.fragment, sub.slots);
        let mut seen = 0;
        let mapped = self.map.as_ref().and_then(|m| m.region(sub));
        while seen < sub.slots {
            let n = WINDOW.min(sub.slots - pos).min(sub.slots - seen);
            let window = &mut buf[..(n * ENTRY) as usize];
            match mapped {
                // SAFETY: the window is inside the region, inside the file and the mapping
                // (a hole reads as zeros); a lock is held, so no store of ours races it.
                Some(region) => unsafe {
                    let from = region.add((pos * ENTRY) as usize);
                    std::ptr::copy_nonoverlapping(from, window.as_mut_ptr(), window.len());
                },
                None => self.file.read_exact_at(window, sub.offset + pos * ENTRY)?,
            }
            for (i, entry) in window.chunks_exact(ENTRY as usize).enumerate() {
                let word = slot_word(entry);
                if word == 0 {
                    return Ok(Probe::Empty(pos + i as u64));
                }
                let (fragment, stored) = unpack(word);
                if fragment == key.fragment
                    && (row == Some(stored) || holds(stored, id).map_err(IndexError::Check)?)
                {
                    return Ok(Probe::Found(stored));
                }
            }
            seen += n;
            pos = (pos + n) & (sub.slots - 1);
        }
        Ok(Probe::Full)
    }

    /// Rebuild subtable `s` at (at least) twice its size in a new region at the end of the
    /// file. Its entries are counted anew (the recorded count may be low after a crash).
    fn grow(&self, inner: &mut Inner, s: usize) -> io::Result<()> {
        let old = inner.subs[s];
        let mut buf = vec![0u8; (old.slots * ENTRY) as usize];
        self.file.read_exact_at(&mut buf, old.offset)?;
        let live = || {
            buf.chunks_exact(ENTRY as usize)
                .filter(|e| slot_word(e) != 0)
        };
        let entries = live().count() as u64;
        let mut slots = old.slots * 2;
        while entries >= max_entries(slots) {
            slots *= 2;
        }
        let mut table = vec![0u8; (slots * ENTRY) as usize];
        for entry in live() {
            let mut pos = home(unpack(slot_word(entry)).0, slots);
            while slot_word(&table[(pos * ENTRY) as usize..]) != 0 {
                pos = (pos + 1) & (slots - 1);
            }
            let at = (pos * ENTRY) as usize;
            table[at..at + ENTRY as usize].copy_from_slice(entry);
        }
        let offset = inner.end;
        self.file.write_all_at(&table, offset)?;
        inner.end = align_up(offset + slots * ENTRY);
        inner.abandoned.push((old.offset, region_len(old.slots)));
        inner.total = inner.total - old.entries + entries;
        // Written in full just now: every page has its block.
        inner.subs[s] = Sub {
            stores: true,
            ..Sub::new(offset, slots, entries)
        };
        Ok(())
    }
}

/// The bytes a region of `slots` slots takes in the file.
fn region_len(slots: u64) -> u64 {
    align_up(slots * ENTRY)
}

/// Give the space of `len` bytes at `at` back to the filesystem, keeping the file's size;
/// best effort (a filesystem without hole punching keeps it allocated).
fn punch(file: &File, at: u64, len: u64) {
    if let Err(error) = crate::os::punch_hole(file, at, len) {
        tracing::debug!(at, len, %error, "could not punch a hole in the ID index");
    }
}

/// Punch every gap between the live regions of `subs` (what growth left behind, written
/// before a crash or by an older build), unless the file holds no more than they need.
fn punch_gaps(file: &File, subs: &[Sub], len: u64) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut live: Vec<(u64, u64)> = subs
        .iter()
        .map(|s| (s.offset, region_len(s.slots)))
        .collect();
    let needed = DATA_START + live.iter().map(|(_, l)| l).sum::<u64>();
    if file.metadata()?.blocks() * 512 <= needed {
        return Ok(());
    }
    live.sort_unstable();
    let mut at = DATA_START;
    for (offset, region) in live {
        if offset > at {
            punch(file, at, offset - at);
        }
        at = at.max(offset + region);
    }
    if align_up(len) > at {
        punch(file, at, align_up(len) - at);
    }
    Ok(())
}

/// The slot word at the start of `entry`.
fn slot_word(entry: &[u8]) -> u64 {
    u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"))
}

/// Create a fresh index at `path` atomically: written in full beside it, then renamed.
fn create(path: &Path, initial_slots: u64) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".ids.idx-")
        .tempfile_in(dir)?;
    let stride = align_up(initial_slots * ENTRY);
    let subs: Vec<Sub> = (0..SUBTABLES as u64)
        .map(|i| Sub::new(DATA_START + i * stride, initial_slots, 0))
        .collect();
    // The regions are holes that read as zeros: empty slots.
    tmp.as_file()
        .set_len(DATA_START + SUBTABLES as u64 * stride)?;
    tmp.as_file().write_all_at(&encode(0, &subs), 0)?;
    tmp.as_file().sync_all()?;
    match tmp.persist_noclobber(path) {
        Ok(_) => {}
        // Another opener created it first: use theirs.
        Err(e) if e.error.kind() == ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e.error),
    }
    File::open(dir)?.sync_all()
}

fn encode(generation: u64, subs: &[Sub]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_LEN);
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&VERSION.to_le_bytes());
    buf.extend_from_slice(&(SUBTABLES as u32).to_le_bytes());
    buf.extend_from_slice(&generation.to_le_bytes());
    for s in subs {
        for v in [s.offset, s.slots, s.entries] {
            buf.extend_from_slice(&v.to_le_bytes());
        }
    }
    buf.extend_from_slice(&crc32fast::hash(&buf).to_le_bytes());
    buf
}

/// Parse and check one header copy of a file of `file_len` bytes.
fn decode(buf: &[u8], file_len: u64) -> Result<(u64, Vec<Sub>), String> {
    let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
    if &buf[..8] != MAGIC {
        return Err("bad magic".into());
    }
    let crc = u32_at(HEADER_LEN - 4);
    if crc32fast::hash(&buf[..HEADER_LEN - 4]) != crc {
        return Err("checksum mismatch".into());
    }
    let version = u32_at(8);
    if version != VERSION {
        return Err(format!("version {version}, expected {VERSION}"));
    }
    if u32_at(12) as usize != SUBTABLES {
        return Err(format!("{} subtables, expected {SUBTABLES}", u32_at(12)));
    }
    let mut subs = Vec::with_capacity(SUBTABLES);
    for i in 0..SUBTABLES {
        let at = 24 + i * 24;
        let (offset, slots, entries) = (u64_at(at), u64_at(at + 8), u64_at(at + 16));
        let fits = slots
            .checked_mul(ENTRY)
            .and_then(|bytes| bytes.checked_add(offset))
            .is_some_and(|end| end <= file_len);
        if !slots.is_power_of_two()
            || slots >= ROW_LIMIT
            || offset < DATA_START
            || offset % ALIGN != 0
            || entries > slots
            || !fits
        {
            return Err(format!(
                "subtable {i} (region at {offset}, {slots} slots, {entries} entries) does not \
                 fit a file of {file_len} bytes"
            ));
        }
        subs.push(Sub::new(offset, slots, entries));
    }
    Ok((u64_at(16), subs))
}

/// Two IDs of the same subtable and fragment, found by a birthday search (38 bits: some
/// 700,000 IDs), for tests of what the index does when fragments collide.
#[cfg(test)]
pub(super) fn colliding_ids() -> (String, String) {
    let mut seen = std::collections::HashMap::new();
    for i in 0u64.. {
        let key = Key::new(&format!("c-{i}"));
        if let Some(other) = seen.insert((key.sub as u64) << FRAGMENT_BITS | key.fragment, i) {
            return (format!("c-{other}"), format!("c-{i}"));
        }
    }
    unreachable!("a 38-bit key space repeats")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::Arc;

    fn id(i: u64) -> String {
        match i % 5 {
            0..=2 => format!("id-{i}"),
            3 => format!("ключ-{i}-日本語-🦀"),
            _ if i % 1000 == 4 => format!("{}{i}", "long-".repeat(600)),
            _ => format!("{i}"),
        }
    }

    /// IDs the tests insert at rows other than [`id`]'s.
    const NAMED: [(u64, &str); 6] = [
        (7, "a"),
        (0, ""),
        (1, "x"),
        (1, "a"),
        (2, "b"),
        (ROW_LIMIT - 1, "max"),
    ];

    /// The tests' check of a row: the ID there is [`id`] of the row, or a named one.
    fn by_row(row: u64, s: &str) -> Result<bool, Infallible> {
        Ok(id(row) == s || NAMED.contains(&(row, s)))
    }

    fn flip(path: &Path, at: u64) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    }

    #[test]
    fn send_sync() {
        fn check<T: Send + Sync>() {}
        check::<IdIndex>();
    }

    #[test]
    fn insert_get() {
        let dir = tempfile::tempdir().unwrap();
        let idx = IdIndex::open(&dir.path().join("ids.idx")).unwrap();
        assert!(idx.is_empty());
        assert_eq!(idx.get("a", &mut by_row).unwrap(), None);
        assert_eq!(idx.insert("a", 7, &mut by_row).unwrap(), None);
        assert_eq!(idx.insert("", 0, &mut by_row).unwrap(), None);
        assert_eq!(idx.get("a", &mut by_row).unwrap(), Some(7));
        assert_eq!(idx.get("", &mut by_row).unwrap(), Some(0));
        assert_eq!(idx.insert("a", 9, &mut by_row).unwrap(), Some(7));
        assert_eq!(idx.get("a", &mut by_row).unwrap(), Some(7));
        assert_eq!(idx.get("b", &mut by_row).unwrap(), None);
        assert_eq!(
            idx.insert_all([(1, "x"), (2, "a"), (3, "x")], &mut by_row)
                .unwrap(),
            vec![None, Some(7), Some(1)]
        );
        assert_eq!(idx.len(), 3);
    }

    /// With the whole file mapped, none of it (`pread`/`pwrite` only), and part of it (the
    /// first growths inside the map, the later ones beyond it); reopened the other way
    /// (what was stored through the map is read with `pread`, and the reverse).
    #[test]
    fn many_with_growth_and_reopen() {
        for map_len in [MAP_LEN, 0, DATA_START + (4 << 20)] {
            many_with_growth_and_reopen_mapping(map_len);
        }
    }

    fn many_with_growth_and_reopen_mapping(map_len: u64) {
        const N: u64 = 200_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.idx");
        let idx = IdIndex::open_with(&path, 8, map_len).unwrap();
        let ids: Vec<String> = (0..N).map(id).collect();
        for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
            if chunk[0] % 2000 == 0 {
                for &i in chunk {
                    assert_eq!(idx.insert(&ids[i as usize], i, &mut by_row).unwrap(), None);
                }
            } else {
                let items = chunk.iter().map(|&i| (i, ids[i as usize].as_str()));
                assert!(idx
                    .insert_all(items, &mut by_row)
                    .unwrap()
                    .iter()
                    .all(Option::is_none));
            }
        }
        // About 49 IDs a subtable: every one grew from 8 slots at least twice (the fewest
        // IDs a subtable gets depends on the hash: three times needs more than 24).
        let grown = idx.inner.read().unwrap().subs.iter().all(|s| s.slots >= 32);
        assert!(grown, "every subtable grew at least twice");
        for (i, s) in ids.iter().enumerate() {
            assert_eq!(idx.get(s, &mut by_row).unwrap(), Some(i as u64), "{s}");
        }
        assert_eq!(idx.len(), N);
        idx.sync().unwrap();
        drop(idx);
        eprintln!(
            "file size: {} bytes",
            std::fs::metadata(&path).unwrap().len()
        );
        let reopen_len = if map_len == 0 { MAP_LEN } else { 0 };
        let idx = IdIndex::open_with(&path, INITIAL_SLOTS, reopen_len).unwrap();
        assert_eq!(idx.len(), N);
        for (i, s) in ids.iter().enumerate() {
            assert_eq!(idx.get(s, &mut by_row).unwrap(), Some(i as u64), "{s}");
        }
        assert_eq!(idx.insert(&ids[5], 99, &mut by_row).unwrap(), Some(5));
        assert_eq!(idx.get("absent", &mut by_row).unwrap(), None);
    }

    /// Bytes the file takes on disk.
    fn allocated(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    /// What the live regions and the headers take, and 2% for the filesystem's own blocks
    /// (a file with many holes needs more extent blocks).
    fn live_bytes(idx: &IdIndex) -> u64 {
        let inner = idx.inner.read().unwrap();
        let live = DATA_START + inner.subs.iter().map(|s| region_len(s.slots)).sum::<u64>();
        live + live / 50
    }

    #[test]
    fn regions_left_by_growth_go_back_to_the_filesystem_at_sync_and_at_open() {
        const N: u64 = 60_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.idx");
        let ids: Vec<String> = (0..N).map(id).collect();
        let idx = IdIndex::open_with(&path, 8, MAP_LEN).unwrap();
        let half = (N / 2) as usize;
        idx.insert_all(
            (0..).zip(ids[..half].iter().map(String::as_str)),
            &mut by_row,
        )
        .unwrap();
        let written = allocated(&path);
        // Doubling leaves about as much behind as is live.
        assert!(
            written > live_bytes(&idx) * 3 / 2,
            "growth left regions behind: {written} allocated, {} live",
            live_bytes(&idx)
        );
        idx.sync().unwrap();
        assert!(
            allocated(&path) <= live_bytes(&idx),
            "{} bytes allocated for {} live",
            allocated(&path),
            live_bytes(&idx)
        );
        // Growth after that sync, then a crash: the next open punches what it left.
        idx.insert_all(
            (half as u64..).zip(ids[half..].iter().map(String::as_str)),
            &mut by_row,
        )
        .unwrap();
        assert!(allocated(&path) > live_bytes(&idx));
        drop(idx);
        let idx = IdIndex::open(&path).unwrap();
        assert!(
            allocated(&path) <= live_bytes(&idx),
            "{} bytes allocated for {} live",
            allocated(&path),
            live_bytes(&idx)
        );
        // What the durable header holds is intact; the rest is inserted again, as after any
        // crash (some of it survived: written into regions that did not move).
        for (i, s) in ids[..half].iter().enumerate() {
            assert_eq!(idx.get(s, &mut by_row).unwrap(), Some(i as u64), "{s}");
        }
        let again = idx
            .insert_all(
                (half as u64..).zip(ids[half..].iter().map(String::as_str)),
                &mut by_row,
            )
            .unwrap();
        for (i, found) in again.into_iter().enumerate() {
            assert!(
                found.is_none_or(|row| row == (half + i) as u64),
                "{found:?}"
            );
        }
        idx.sync().unwrap();
        drop(idx);
        let idx = IdIndex::open(&path).unwrap();
        for (i, s) in ids.iter().enumerate() {
            assert_eq!(idx.get(s, &mut by_row).unwrap(), Some(i as u64), "{s}");
        }
    }

    /// A new job's index (the default size, 4,096 empty subtables) is a file of holes: its
    /// length is over 16 MB, but only the headers and the pages written take disk space.
    #[test]
    fn a_new_index_takes_its_headers_and_written_pages_on_disk_not_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.idx");
        let idx = IdIndex::open(&path).unwrap();
        idx.insert_all(
            (0..).zip(
                (0..100)
                    .map(id)
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str),
            ),
            &mut by_row,
        )
        .unwrap();
        idx.sync().unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len >= 16_000_000, "{len}");
        // Two 100 KiB headers and at most one 4 KiB page per ID, with room for the
        // filesystem's own blocks.
        assert!(
            allocated(&path) <= 200 * 1024 + 100 * 4096 + 64 * 1024,
            "{} bytes allocated for a {len}-byte index of 100 IDs",
            allocated(&path)
        );
    }

    #[test]
    fn reopen_without_sync() {
        const N: u64 = 30_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.idx");
        let ids: Vec<String> = (0..N).map(id).collect();
        let idx = IdIndex::open_with(&path, 8, MAP_LEN).unwrap();
        for i in 0..N / 3 {
            idx.insert(&ids[i as usize], i, &mut by_row).unwrap();
        }
        idx.sync().unwrap();
        // Grows every subtable after the sync; the header on disk stays the old one.
        for i in N / 3..N {
            idx.insert(&ids[i as usize], i, &mut by_row).unwrap();
        }
        drop(idx);
        let idx = IdIndex::open(&path).unwrap();
        assert!(idx.len() >= N / 3);
        for i in 0..N / 3 {
            assert_eq!(idx.get(&ids[i as usize], &mut by_row).unwrap(), Some(i));
        }
        for i in 0..N {
            let got = idx.insert(&ids[i as usize], i, &mut by_row).unwrap();
            assert!(got.is_none() || got == Some(i));
        }
        for i in 0..N {
            assert_eq!(idx.get(&ids[i as usize], &mut by_row).unwrap(), Some(i));
        }
        idx.sync().unwrap();
        drop(idx);
        let idx = IdIndex::open(&path).unwrap();
        for i in 0..N {
            assert_eq!(idx.get(&ids[i as usize], &mut by_row).unwrap(), Some(i));
        }
    }

    #[test]
    fn corrupt_and_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.idx");
        let idx = IdIndex::open(&path).unwrap();
        idx.insert("a", 1, &mut by_row).unwrap();
        drop(idx);
        flip(&path, 100);
        let e = IdIndex::open(&path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");

        // A damaged newest copy falls back to the older one; both damaged is an error.
        let path = dir.path().join("two.idx");
        let idx = IdIndex::open(&path).unwrap();
        idx.insert("a", 1, &mut by_row).unwrap();
        idx.sync().unwrap(); // generation 1, copy 1
        idx.insert("b", 2, &mut by_row).unwrap();
        idx.sync().unwrap(); // generation 2, copy 0
        drop(idx);
        flip(&path, 30);
        let idx = IdIndex::open(&path).unwrap();
        assert_eq!(idx.get("a", &mut by_row).unwrap(), Some(1));
        drop(idx);
        flip(&path, HEADER_SPAN + 30);
        let e = IdIndex::open(&path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);

        for len in [0, 1000, DATA_START + 100] {
            let path = dir.path().join(format!("short-{len}.idx"));
            drop(IdIndex::open(&path).unwrap());
            OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len)
                .unwrap();
            let e = IdIndex::open(&path).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
            assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
        }
    }

    /// A new index's one-page tables are holes: the first insert into each is a `pwrite`
    /// (a full disk is then an error), the next ones store through the map.
    #[test]
    fn stores_through_the_map_only_where_the_disk_block_is_allocated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.idx");
        let idx = IdIndex::open(&path).unwrap();
        assert!(idx.map.is_some());
        let stores = |idx: &IdIndex| {
            let inner = idx.inner.read().unwrap();
            inner.subs.iter().filter(|s| s.stores).count()
        };
        assert_eq!(stores(&idx), 0);
        let sub = |id: &str| Key::new(id).sub;
        idx.insert("a", 1, &mut by_row).unwrap();
        assert!(idx.inner.read().unwrap().subs[sub("a")].stores);
        assert_eq!(stores(&idx), 1);
        drop(idx);
        // Reopened, one-page regions are holes again as far as the index knows.
        let idx = IdIndex::open(&path).unwrap();
        assert_eq!(stores(&idx), 0);
        assert_eq!(idx.get("a", &mut by_row).unwrap(), Some(1));
    }

    #[test]
    fn ids_sharing_a_fragment_are_told_apart_by_the_check_of_their_rows() {
        let (a, b) = colliding_ids();
        let (ka, kb) = (Key::new(&a), Key::new(&b));
        assert_eq!((ka.sub, ka.fragment), (kb.sub, kb.fragment));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.idx");
        let idx = IdIndex::open_with(&path, 8, MAP_LEN).unwrap();
        let rows = [(3, a.as_str()), (8, b.as_str())];
        let asked = std::cell::Cell::new(0);
        let mut holds = |row: u64, s: &str| {
            asked.set(asked.get() + 1);
            Ok::<_, Infallible>(rows.contains(&(row, s)))
        };
        assert_eq!(idx.insert(&a, 3, &mut holds).unwrap(), None);
        assert_eq!(asked.get(), 0);
        // b meets a's slot: the check of row 3 says it is not b, so b gets its own.
        assert_eq!(idx.insert(&b, 8, &mut holds).unwrap(), None);
        assert_eq!(asked.get(), 1);
        assert_eq!(idx.get(&a, &mut holds).unwrap(), Some(3));
        assert_eq!(idx.get(&b, &mut holds).unwrap(), Some(8));
        // A repeat of b further on is told its first row; a again at its own row needs no
        // check.
        assert_eq!(idx.insert(&b, 12, &mut holds).unwrap(), Some(8));
        let before = asked.get();
        assert_eq!(idx.insert(&a, 3, &mut holds).unwrap(), Some(3));
        assert_eq!(asked.get(), before);
        assert_eq!(idx.len(), 2);
        // The fragment alone would have answered b with a's row.
        let trusting = idx.get(&b, &mut |_, _| Ok::<_, Infallible>(true)).unwrap();
        assert_eq!(trusting, Some(3));
        // Neither is found when no row holds it.
        let nowhere = |_: u64, _: &str| Ok::<_, Infallible>(false);
        assert_eq!(idx.get(&a, &mut nowhere.clone()).unwrap(), None);
        assert_eq!(idx.get(&b, &mut nowhere.clone()).unwrap(), None);
        // An error of the check is the caller's.
        let e = idx.get(&b, &mut |_, _| Err("no list")).unwrap_err();
        assert!(matches!(e, IndexError::Check("no list")), "{e:?}");
        // Through growth and a reopen, both keep their rows.
        let others = (100..20_000u64).map(|i| (i, id(i))).collect::<Vec<_>>();
        idx.insert_all(others.iter().map(|(i, s)| (*i, s.as_str())), &mut by_row)
            .unwrap();
        idx.sync().unwrap();
        drop(idx);
        let idx = IdIndex::open(&path).unwrap();
        assert_eq!(idx.get(&a, &mut holds).unwrap(), Some(3));
        assert_eq!(idx.get(&b, &mut holds).unwrap(), Some(8));
    }

    /// An index of the layout before 8-byte slots is refused as invalid data, which has the
    /// store build it again.
    #[test]
    fn the_layout_of_16_byte_slots_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.idx");
        drop(IdIndex::open(&path).unwrap());
        let mut header = vec![0u8; HEADER_LEN];
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        f.read_exact_at(&mut header, 0).unwrap();
        header[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32fast::hash(&header[..HEADER_LEN - 4]);
        header[HEADER_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        f.write_all_at(&header, 0).unwrap();
        f.write_all_at(&header, HEADER_SPAN).unwrap();
        let e = IdIndex::open(&path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(e.to_string().contains("version 1, expected 2"), "{e}");
    }

    #[test]
    fn row_limit() {
        let dir = tempfile::tempdir().unwrap();
        let idx = IdIndex::open(&dir.path().join("ids.idx")).unwrap();
        assert_eq!(idx.insert("max", ROW_LIMIT - 1, &mut by_row).unwrap(), None);
        assert_eq!(idx.get("max", &mut by_row).unwrap(), Some(ROW_LIMIT - 1));
        for row in [ROW_LIMIT, u64::MAX] {
            let e = idx.insert("big", row, &mut by_row).unwrap_err();
            assert!(matches!(e, IndexError::Io(e) if e.kind() == ErrorKind::InvalidInput));
            assert!(idx.insert_all([(row, "big")], &mut by_row).is_err());
        }
        assert_eq!(idx.get("big", &mut by_row).unwrap(), None);
    }

    #[test]
    fn concurrent_get_and_insert() {
        const N: u64 = 40_000;
        let dir = tempfile::tempdir().unwrap();
        let idx = Arc::new(IdIndex::open_with(&dir.path().join("ids.idx"), 8, MAP_LEN).unwrap());
        let ids: Vec<String> = (0..N).map(id).collect();
        for i in 0..N / 4 {
            idx.insert(&ids[i as usize], i, &mut by_row).unwrap();
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in N / 4..N {
                    assert_eq!(idx.insert(&ids[i as usize], i, &mut by_row).unwrap(), None);
                }
            });
            s.spawn(|| {
                for round in 0..4 {
                    for i in 0..N {
                        let got = idx.get(&ids[i as usize], &mut by_row).unwrap();
                        if i < N / 4 {
                            assert_eq!(got, Some(i), "round {round}");
                        } else {
                            assert!(got.is_none() || got == Some(i));
                        }
                    }
                }
            });
        });
        for i in 0..N {
            assert_eq!(idx.get(&ids[i as usize], &mut by_row).unwrap(), Some(i));
        }
    }
}
