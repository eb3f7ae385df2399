//! A test-only file system that models a power cut, after LazyFS (the one Jepsen uses): a
//! FUSE passthrough over a real backing directory that keeps every write nobody synced in
//! memory, and drops it at a "cut".
//!
//! The model:
//! - Metadata goes to the backing directory at once: lookup, getattr, chmod/chown/utimes,
//!   mkdir, create/mknod (regular files), open, readdir, unlink, rmdir, rename (also over an
//!   existing file, and `renameat2` flags), statfs. So a file created and never synced exists
//!   after a cut, empty; a rename is durable at once, fsyncdir or not.
//! - Data is lazy: `write` and size changes (truncate, `set_len`) go to a pending overlay in
//!   memory, per backing inode: dirty 4 KiB pages (read-modify-written from the backing
//!   file), a logical length, and the lowest length the file had since its last sync (the
//!   backing bytes past it read as zeros). `read` and `getattr` see backing + overlay.
//!   `fsync` and `fdatasync` of a file write its whole overlay to the backing file and
//!   fsync that; closing a file (`flush`, `release`) makes nothing durable. The overlay is
//!   keyed by inode, so a file written, synced and renamed keeps its data (tempfile+rename).
//! - [`LazyFs::cut`] is the power cut: pending data is dropped, and from then on writes,
//!   size changes and syncs are acknowledged and thrown away, metadata changes fail with
//!   EIO. [`LazyFs::remount`] mounts a fresh session over the same backing directory: what
//!   it shows is exactly what was synced (plus the metadata).
//! - Every fsync, fdatasync and fsyncdir is counted per path ([`LazyFs::syncs`]), and every
//!   operation the model does not cover fails (ENOSYS, which the kernel turns into
//!   EOPNOTSUPP where the call has one, as for `fallocate`) and is listed in
//!   [`LazyFs::unsupported`].
//!
//! Limits: metadata is never lost (a real file system may lose a create or a rename whose
//! directory was not fsynced); a sync writes the whole file's overlay, not a range; no torn
//! pages or reordered writes within what was synced; symlinks, hard links, xattrs and
//! `fallocate` are not modelled. Locks are the kernel's own (no getlk/setlk here, so
//! `flock` and POSIX locks work across the processes of this machine). Shared writable
//! `mmap` works: the kernel writes dirty pages back as WRITE requests (before an FSYNC on
//! `msync`/`fdatasync`), so they are pending like any write.
//!
//! Mounting needs `/dev/fuse` and, for fuser's pure-Rust mount, `mount(2)` itself: root (or
//! CAP_SYS_ADMIN). Without that, fuser falls back to `fusermount3` (Debian: `fuse3`).
//! A machine without FUSE fails the test that mounts, with a message: it never skips.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackgroundSession, Config, CopyFileRangeFlags, Errno, FileAttr, FileHandle,
    FileType, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags, LockOwner, MountOption,
    OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyPoll, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

const PAGE: u64 = 4096;
/// How long the kernel may cache names and attributes: not at all. The backing file system
/// reuses inode numbers, and a cached size of a replaced file's inode number once made a
/// new file read longer than it was written.
const TTL: Duration = Duration::ZERO;
/// Bound on waiting for a session's thread to end after its mount was detached.
const END_WAIT: Duration = Duration::from_secs(5);

/// How often one path was synced since the mount.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncCounts {
    /// `fsync` of the file (FUSE FSYNC without the datasync flag).
    pub fsync: u64,
    /// `fdatasync` of the file (FUSE FSYNC with the datasync flag; `msync(MS_SYNC)` too).
    pub fdatasync: u64,
    /// `fsync`/`fdatasync` of the directory.
    pub fsyncdir: u64,
}

/// The durability calls since the mount, per path relative to the mount point (the root
/// is the empty path). A file is named by its path at the time of the call.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncLog {
    pub by_path: BTreeMap<PathBuf, SyncCounts>,
}

impl SyncLog {
    /// The counts of one path (zeros if it was never synced).
    pub fn of(&self, path: impl AsRef<Path>) -> SyncCounts {
        self.by_path.get(path.as_ref()).copied().unwrap_or_default()
    }
}

/// A file's data nobody synced.
struct Pending {
    /// The file's logical length.
    len: u64,
    /// The lowest length since the last sync: backing bytes at or past it read as zeros.
    floor: u64,
    /// Dirty pages by index, each `PAGE` bytes, zeros past `len`.
    pages: BTreeMap<u64, Box<[u8]>>,
}

struct Handle {
    file: File,
    ino: u64,
}

struct State {
    cut: bool,
    /// By backing inode.
    pending: HashMap<u64, Pending>,
    syncs: SyncLog,
    /// FUSE inode to path relative to the backing root.
    paths: HashMap<u64, PathBuf>,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    /// A disk that stopped answering syncs ([`LazyFs::stall_syncs`]): each sync's reply waits
    /// here, unanswered, until [`LazyFs::answer_syncs`].
    stalled: bool,
    unanswered: Vec<ReplyEmpty>,
}

/// What one mounted session works on; shared by the session's thread and [`LazyFs`].
struct Shared {
    backing: PathBuf,
    /// The backing root's `st_ino`: FUSE inode 1, and backing inode 1 (if any) takes it.
    root_ino: u64,
    state: Mutex<State>,
    /// Kept across remounts.
    unsupported: Arc<Mutex<Vec<String>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn kind_of(ft: std::fs::FileType) -> FileType {
    FileType::from_std(ft).unwrap_or(FileType::RegularFile)
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

impl Pending {
    fn new(backing_len: u64) -> Pending {
        Pending {
            len: backing_len,
            floor: backing_len,
            pages: BTreeMap::new(),
        }
    }

    fn bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }

    /// The page as the file shows it now, made dirty.
    fn page(&mut self, file: &File, idx: u64) -> io::Result<&mut [u8]> {
        if !self.pages.contains_key(&idx) {
            let mut buf = vec![0u8; PAGE as usize].into_boxed_slice();
            let start = idx * PAGE;
            let valid = self.floor.min(file.metadata()?.len());
            if start < valid {
                let n = (valid - start).min(PAGE) as usize;
                read_full_at(file, &mut buf[..n], start)?;
            }
            self.pages.insert(idx, buf);
        }
        Ok(self.pages.get_mut(&idx).expect("inserted above"))
    }

    fn write(&mut self, file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let idx = at / PAGE;
            let in_page = (at % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(data.len() - done);
            self.page(file, idx)?[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        self.len = self.len.max(offset + data.len() as u64);
        Ok(())
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            self.pages.retain(|&idx, _| idx * PAGE < len);
            if let Some(page) = self.pages.get_mut(&(len / PAGE)) {
                page[(len % PAGE) as usize..].fill(0);
            }
            self.floor = self.floor.min(len);
        }
        self.len = len;
    }

    /// Make it the backing file's content (the caller syncs).
    fn apply(&self, file: &File) -> io::Result<()> {
        if self.floor < file.metadata()?.len() {
            file.set_len(self.floor)?;
        }
        for (&idx, page) in &self.pages {
            let start = idx * PAGE;
            if start < self.len {
                let n = (self.len - start).min(PAGE) as usize;
                file.write_all_at(&page[..n], start)?;
            }
        }
        file.set_len(self.len)
    }
}

fn read_full_at(file: &File, buf: &mut [u8], mut at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Bytes `[offset, offset+size)` as the file shows them: backing below the floor, overlay
/// pages over it, zeros elsewhere, cut at the logical length.
fn read_logical(
    file: &File,
    pending: Option<&Pending>,
    offset: u64,
    size: u32,
) -> io::Result<Vec<u8>> {
    let backing_len = file.metadata()?.len();
    let (len, valid) = match pending {
        Some(p) => (p.len, p.floor.min(backing_len)),
        None => (backing_len, backing_len),
    };
    if offset >= len {
        return Ok(Vec::new());
    }
    let end = len.min(offset + u64::from(size));
    let mut buf = vec![0u8; (end - offset) as usize];
    if offset < valid {
        let n = (valid.min(end) - offset) as usize;
        read_full_at(file, &mut buf[..n], offset)?;
    }
    if let Some(p) = pending {
        for (&idx, page) in p.pages.range(offset / PAGE..=(end - 1) / PAGE) {
            let start = (idx * PAGE).max(offset);
            let stop = ((idx + 1) * PAGE).min(end);
            buf[(start - offset) as usize..(stop - offset) as usize].copy_from_slice(
                &page[(start - idx * PAGE) as usize..(stop - idx * PAGE) as usize],
            );
        }
    }
    Ok(buf)
}

impl Shared {
    /// FUSE inode of a backing inode, and back (the mapping is its own inverse).
    fn map_ino(&self, ino: u64) -> u64 {
        if ino == self.root_ino {
            1
        } else if ino == 1 {
            self.root_ino
        } else {
            ino
        }
    }

    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.backing.clone()
        } else {
            self.backing.join(rel)
        }
    }

    fn rel_of(&self, st: &State, ino: INodeNo) -> Result<PathBuf, Errno> {
        if ino.0 == 1 {
            return Ok(PathBuf::new());
        }
        st.paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn child(&self, st: &State, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.rel_of(st, parent)?.join(name))
    }

    fn attr(&self, st: &State, md: &std::fs::Metadata) -> FileAttr {
        let ino = self.map_ino(md.ino());
        let size = match st.pending.get(&md.ino()) {
            Some(p) if md.is_file() => p.len,
            _ => md.size(),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(md.atime(), md.atime_nsec()),
            mtime: time(md.mtime(), md.mtime_nsec()),
            ctime: time(md.ctime(), md.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind_of(md.file_type()),
            perm: (md.mode() & 0o7777) as u16,
            nlink: md.nlink() as u32,
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev() as u32,
            blksize: PAGE as u32,
            flags: 0,
        }
    }

    /// Metadata of an inode: through the open handle if given, else by path, else through
    /// any open handle of it (an unlinked file).
    fn stat(
        &self,
        st: &State,
        ino: INodeNo,
        fh: Option<FileHandle>,
    ) -> Result<std::fs::Metadata, Errno> {
        if let Some(h) = fh.and_then(|fh| st.handles.get(&fh.0)) {
            return h.file.metadata().map_err(|e| errno(&e));
        }
        match self.rel_of(st, ino) {
            Ok(rel) => std::fs::symlink_metadata(self.full(&rel)).map_err(|e| errno(&e)),
            Err(e) => match st.handles.values().find(|h| h.ino == ino.0) {
                Some(h) => h.file.metadata().map_err(|e| errno(&e)),
                None => Err(e),
            },
        }
    }

    fn entry(&self, st: &mut State, rel: PathBuf) -> Result<FileAttr, Errno> {
        let md = std::fs::symlink_metadata(self.full(&rel)).map_err(|e| errno(&e))?;
        let attr = self.attr(st, &md);
        if attr.ino.0 != 1 {
            st.paths.insert(attr.ino.0, rel);
        }
        Ok(attr)
    }

    fn unsupported(&self, what: String) -> Errno {
        lock(&self.unsupported).push(what);
        Errno::ENOSYS
    }

    fn open_backing(&self, path: &Path, create: Option<(u32, i32)>) -> io::Result<File> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        if let Some((mode, flags)) = create {
            opts.create(true)
                .mode(mode)
                .custom_flags(flags & libc::O_EXCL);
        }
        match opts.open(path) {
            Err(e) if create.is_none() && e.raw_os_error() == Some(libc::EISDIR) => {
                File::open(path)
            }
            other => other,
        }
    }

    fn new_handle(&self, st: &mut State, file: File, ino: u64) -> u64 {
        st.next_fh += 1;
        let fh = st.next_fh;
        st.handles.insert(fh, Handle { file, ino });
        fh
    }
}

struct Fs(Arc<Shared>);

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = &self.0;
        let mut st = lock(&s.state);
        match s
            .child(&st, parent, name)
            .and_then(|rel| s.entry(&mut st, rel))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = &self.0;
        let st = lock(&s.state);
        match s.stat(&st, ino, fh) {
            Ok(md) => reply.attr(&TTL, &s.attr(&st, &md)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let s = &self.0;
        let mut st = lock(&s.state);
        let result = (|| -> Result<FileAttr, Errno> {
            let rel = s.rel_of(&st, ino).ok();
            let metadata_change = mode.is_some()
                || uid.is_some()
                || gid.is_some()
                || atime.is_some()
                || mtime.is_some();
            if st.cut && metadata_change {
                return Err(Errno::EIO);
            }
            let by_handle = fh
                .and_then(|fh| st.handles.get(&fh.0))
                .map(|h| h.file.try_clone());
            let file = match (by_handle, &rel) {
                (Some(f), _) => f.map_err(|e| errno(&e))?,
                (None, Some(rel)) => {
                    let path = s.full(rel);
                    s.open_backing(&path, None)
                        .or_else(|_| File::open(&path))
                        .map_err(|e| errno(&e))?
                }
                (None, None) => return Err(Errno::ENOENT),
            };
            if let Some(mode) = mode {
                let rc =
                    unsafe { libc::fchmod(std::os::fd::AsRawFd::as_raw_fd(&file), mode & 0o7777) };
                if rc != 0 {
                    return Err(errno(&io::Error::last_os_error()));
                }
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::fchown(&file, uid, gid).map_err(|e| errno(&e))?;
            }
            if atime.is_some() || mtime.is_some() {
                let resolve = |t: TimeOrNow| match t {
                    TimeOrNow::SpecificTime(t) => t,
                    TimeOrNow::Now => SystemTime::now(),
                };
                let mut times = std::fs::FileTimes::new();
                if let Some(t) = atime {
                    times = times.set_accessed(resolve(t));
                }
                if let Some(t) = mtime {
                    times = times.set_modified(resolve(t));
                }
                file.set_times(times).map_err(|e| errno(&e))?;
            }
            let md = file.metadata().map_err(|e| errno(&e))?;
            if let Some(size) = size {
                if !md.is_file() {
                    return Err(Errno::EISDIR);
                }
                if !st.cut {
                    let backing_len = md.len();
                    st.pending
                        .entry(md.ino())
                        .or_insert_with(|| Pending::new(backing_len))
                        .set_len(size);
                }
            }
            let mut attr = s.attr(&st, &md);
            if st.cut {
                if let Some(size) = size {
                    attr.size = size;
                }
            }
            Ok(attr)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let mut st = lock(&s.state);
        let result = (|| {
            let rel = s.child(&st, parent, name)?;
            if mode & libc::S_IFMT != libc::S_IFREG {
                return Err(s.unsupported(format!(
                    "mknod({}, mode={mode:o}, rdev={rdev})",
                    rel.display()
                )));
            }
            if st.cut {
                return Err(Errno::EIO);
            }
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode & !umask & 0o7777)
                .open(s.full(&rel))
                .map_err(|e| errno(&e))?;
            s.entry(&mut st, rel)
        })();
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let mut st = lock(&s.state);
        let result = (|| {
            let rel = s.child(&st, parent, name)?;
            if st.cut {
                return Err(Errno::EIO);
            }
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(s.full(&rel))
                .map_err(|e| errno(&e))?;
            s.entry(&mut st, rel)
        })();
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let what = format!(
            "symlink({:?} in inode {parent} -> {})",
            link_name,
            target.display()
        );
        reply.error(self.0.unsupported(what));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        reply.error(self.0.unsupported(format!("readlink(inode {ino})")));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let what = format!("link(inode {ino} -> {newname:?} in inode {newparent})");
        reply.error(self.0.unsupported(what));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let mut st = lock(&s.state);
        let result = (|| {
            let from = s.child(&st, parent, name)?;
            let to = s.child(&st, newparent, newname)?;
            if st.cut {
                return Err(Errno::EIO);
            }
            let (cfrom, cto) = (
                cstr(&s.full(&from)).map_err(|e| errno(&e))?,
                cstr(&s.full(&to)).map_err(|e| errno(&e))?,
            );
            let moved = std::fs::symlink_metadata(s.full(&from)).map_err(|e| errno(&e))?;
            let replaced = std::fs::symlink_metadata(s.full(&to)).ok();
            // SAFETY: two NUL-terminated paths that live across the call.
            let rc = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    cfrom.as_ptr(),
                    libc::AT_FDCWD,
                    cto.as_ptr(),
                    flags.bits(),
                )
            };
            if rc != 0 {
                return Err(errno(&io::Error::last_os_error()));
            }
            let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
            // Names under the old path move with it (a directory); a replaced name goes.
            let mut renamed = Vec::new();
            for (&ino, rel) in st.paths.iter() {
                if let Ok(rest) = rel.strip_prefix(&from) {
                    renamed.push((ino, to.join(rest)));
                } else if exchange {
                    if let Ok(rest) = rel.strip_prefix(&to) {
                        renamed.push((ino, from.join(rest)));
                    }
                }
            }
            if let (Some(old), false) = (&replaced, exchange) {
                let old_ino = s.map_ino(old.ino());
                if st.paths.get(&old_ino) == Some(&to) {
                    st.paths.remove(&old_ino);
                }
            }
            for (ino, rel) in renamed {
                st.paths.insert(ino, rel.components().collect());
            }
            st.paths.insert(s.map_ino(moved.ino()), to);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let s = &self.0;
        let mut st = lock(&s.state);
        // O_TRUNC never reaches the backing file: the kernel sends it as a setattr of the
        // size (no atomic_o_trunc), which is lazy like any size change.
        let result = (|| {
            let rel = s.rel_of(&st, ino)?;
            let file = s.open_backing(&s.full(&rel), None).map_err(|e| errno(&e))?;
            Ok(s.new_handle(&mut st, file, ino.0))
        })();
        match result {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let s = &self.0;
        let mut st = lock(&s.state);
        let result = (|| {
            let rel = s.child(&st, parent, name)?;
            if st.cut {
                return Err(Errno::EIO);
            }
            let existed = s.full(&rel).symlink_metadata().is_ok();
            let file = s
                .open_backing(&s.full(&rel), Some((mode & !umask & 0o7777, flags)))
                .map_err(|e| errno(&e))?;
            if !existed {
                // A new file: the backing file system may have reused the inode number of a
                // file removed with data still pending, which must not show through.
                let ino = file.metadata().map_err(|e| errno(&e))?.ino();
                st.pending.remove(&ino);
            }
            let attr = s.entry(&mut st, rel)?;
            let fh = s.new_handle(&mut st, file, attr.ino.0);
            Ok((attr, fh))
        })();
        match result {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = &self.0;
        let st = lock(&s.state);
        let Some(h) = st.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let result = h
            .file
            .metadata()
            .and_then(|md| read_logical(&h.file, st.pending.get(&md.ino()), offset, size));
        match result {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let s = &self.0;
        let mut st = lock(&s.state);
        if st.cut {
            return reply.written(data.len() as u32);
        }
        let st = &mut *st;
        let Some(h) = st.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let result = h.file.metadata().and_then(|md| {
            st.pending
                .entry(md.ino())
                .or_insert_with(|| Pending::new(md.len()))
                .write(&h.file, offset, data)
        });
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = lock(&self.0.state);
        if let Some(h) = st.handles.remove(&fh.0) {
            // The last handle of an unlinked file: its data can never be synced, and its
            // backing inode number may be reused.
            let gone = h.file.metadata().map(|md| (md.nlink() == 0, md.ino()));
            if let Ok((true, bino)) = gone {
                if !st.handles.values().any(|o| o.ino == h.ino) {
                    st.pending.remove(&bino);
                }
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let mut st = lock(&s.state);
        if st.cut {
            return reply.ok();
        }
        if st.stalled {
            return st.unanswered.push(reply);
        }
        let st = &mut *st;
        let rel = s
            .rel_of(st, ino)
            .unwrap_or_else(|_| PathBuf::from(format!("<inode {ino}>")));
        let counts = st.syncs.by_path.entry(rel).or_default();
        if datasync {
            counts.fdatasync += 1;
        } else {
            counts.fsync += 1;
        }
        let Some(h) = st.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let result = (|| {
            let bino = h.file.metadata()?.ino();
            if let Some(p) = st.pending.get(&bino) {
                p.apply(&h.file)?;
            }
            st.pending.remove(&bino);
            if datasync {
                h.file.sync_data()
            } else {
                h.file.sync_all()
            }
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let s = &self.0;
        let st = lock(&s.state);
        match s.stat(&st, ino, None) {
            Ok(md) if md.is_dir() => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = &self.0;
        let st = lock(&s.state);
        let result = (|| -> Result<Vec<(u64, FileType, std::ffi::OsString)>, Errno> {
            let rel = s.rel_of(&st, ino)?;
            let mut entries = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            let mut children = Vec::new();
            for e in std::fs::read_dir(s.full(&rel)).map_err(|e| errno(&e))? {
                let e = e.map_err(|e| errno(&e))?;
                let kind = e.file_type().map(kind_of).unwrap_or(FileType::RegularFile);
                children.push((s.map_ino(e.ino()), kind, e.file_name()));
            }
            children.sort_by(|a, b| a.2.cmp(&b.2));
            entries.extend(children);
            Ok(entries)
        })();
        match result {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let mut st = lock(&s.state);
        if st.cut {
            return reply.ok();
        }
        if st.stalled {
            return st.unanswered.push(reply);
        }
        let result = s.rel_of(&st, ino).and_then(|rel| {
            st.syncs.by_path.entry(rel.clone()).or_default().fsyncdir += 1;
            File::open(s.full(&rel))
                .and_then(|d| d.sync_all())
                .map_err(|e| errno(&e))
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let path = match cstr(&self.0.backing) {
            Ok(p) => p,
            Err(e) => return reply.error(errno(&e)),
        };
        // SAFETY: a NUL-terminated path and a zeroed struct the call fills.
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut sv) } != 0 {
            return reply.error(errno(&io::Error::last_os_error()));
        }
        reply.statfs(
            sv.f_blocks,
            sv.f_bfree,
            sv.f_bavail,
            sv.f_files,
            sv.f_ffree,
            sv.f_bsize as u32,
            sv.f_namemax as u32,
            sv.f_frsize as u32,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(
            self.0
                .unsupported(format!("setxattr(inode {ino}, {name:?})")),
        );
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.error(
            self.0
                .unsupported(format!("removexattr(inode {ino}, {name:?})")),
        );
    }

    // getxattr and listxattr: the kernel's default (ENOSYS), not listed: the kernel asks for
    // `security.capability` on its own before a write.

    fn bmap(&self, _req: &Request, ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        reply.error(self.0.unsupported(format!("bmap(inode {ino})")));
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(
            self.0
                .unsupported(format!("ioctl(inode {ino}, cmd={cmd:#x})")),
        );
    }

    fn poll(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        reply.error(self.0.unsupported(format!("poll(inode {ino})")));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let rel = s.rel_of(&lock(&s.state), ino).unwrap_or_default();
        let what = format!(
            "fallocate({}, offset={offset}, len={length}, mode={mode:#x})",
            rel.display()
        );
        reply.error(s.unsupported(what));
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let what = format!("lseek(inode {ino}, offset={offset}, whence={whence})");
        reply.error(self.0.unsupported(what));
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let what = format!("copy_file_range(inode {ino_in} -> inode {ino_out}, len={len})");
        reply.error(self.0.unsupported(what));
    }
}

impl Fs {
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let s = &self.0;
        let mut st = lock(&s.state);
        let result = (|| {
            let rel = s.child(&st, parent, name)?;
            if st.cut {
                return Err(Errno::EIO);
            }
            let path = s.full(&rel);
            let md = std::fs::symlink_metadata(&path).map_err(|e| errno(&e))?;
            if dir {
                std::fs::remove_dir(&path)
            } else {
                std::fs::remove_file(&path)
            }
            .map_err(|e| errno(&e))?;
            let ino = s.map_ino(md.ino());
            if st.paths.get(&ino) == Some(&rel) {
                st.paths.remove(&ino);
            }
            if !dir && md.nlink() <= 1 && !st.handles.values().any(|h| h.ino == ino) {
                st.pending.remove(&md.ino());
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// A mounted lazy file system over a backing directory of its own; unmounted on drop.
pub struct LazyFs {
    session: Option<BackgroundSession>,
    /// The mount's device number (its minor names the connection in fusectl).
    conn: Option<u64>,
    /// Sessions whose thread did not end when unmounted (see [`LazyFs::left_running`]).
    left_running: usize,
    shared: Arc<Shared>,
    unsupported: Arc<Mutex<Vec<String>>>,
    mount: tempfile::TempDir,
    backing: tempfile::TempDir,
}

const HOW_TO: &str = "the lazyfs tests need FUSE: /dev/fuse (`modprobe fuse`; in a container, \
     `--device /dev/fuse` and CAP_SYS_ADMIN) and either root, for fuser's own mount(2), or \
     `fusermount3` (Debian: `apt-get install fuse3`)";

impl LazyFs {
    /// Mount a fresh, empty lazy file system. Fails the test (never skips) when FUSE is not
    /// there.
    pub fn mount() -> LazyFs {
        if !Path::new("/dev/fuse").exists() {
            panic!("/dev/fuse is missing: {HOW_TO}");
        }
        let backing = tempfile::Builder::new()
            .prefix("lazyfs-backing-")
            .tempdir()
            .expect("backing directory");
        let mount = tempfile::Builder::new()
            .prefix("lazyfs-mnt-")
            .tempdir()
            .expect("mount point");
        let unsupported = Arc::new(Mutex::new(Vec::new()));
        let shared = new_shared(backing.path(), &unsupported);
        let (session, conn) = spawn(&shared, mount.path());
        LazyFs {
            session: Some(session),
            conn,
            left_running: 0,
            shared,
            unsupported,
            mount,
            backing,
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.mount.path()
    }

    /// The backing directory (what survives a cut, as the model keeps it).
    pub fn backing(&self) -> &Path {
        self.backing.path()
    }

    /// The power cut: every pending write and size change is dropped, and from now on
    /// writes, size changes and syncs are thrown away (metadata changes fail with EIO). The
    /// caller kills and reaps its processes on the mount right after, then [`remount`]s.
    ///
    /// [`remount`]: LazyFs::remount
    pub fn cut(&mut self) {
        let mut st = lock(&self.shared.state);
        st.cut = true;
        st.pending.clear();
    }

    /// Unmount (after a [`cut`](LazyFs::cut), made here if the caller did not) and mount a
    /// fresh session over the same backing directory at the same path: it shows exactly
    /// what was synced. The sync log starts anew; the list of unsupported calls goes on.
    pub fn remount(&mut self) {
        self.answer_syncs();
        self.cut();
        self.unmount();
        self.shared = new_shared(self.backing.path(), &self.unsupported);
        let (session, conn) = spawn(&self.shared, self.mount.path());
        self.session = Some(session);
        self.conn = conn;
    }

    /// The disk stops answering syncs: from now on every fsync, fdatasync and fsyncdir waits,
    /// unanswered (as on a hung disk or a network file system that stopped answering), until
    /// [`answer_syncs`](LazyFs::answer_syncs). Writes, reads and metadata still work.
    pub fn stall_syncs(&self) {
        lock(&self.shared.state).stalled = true;
    }

    /// How many syncs wait unanswered.
    pub fn unanswered_syncs(&self) -> usize {
        lock(&self.shared.state).unanswered.len()
    }

    /// The disk answers again: the syncs that waited fail with EIO (nothing they asked for
    /// was made durable), later ones work.
    pub fn answer_syncs(&self) {
        let waiting = {
            let mut st = lock(&self.shared.state);
            st.stalled = false;
            std::mem::take(&mut st.unanswered)
        };
        for reply in waiting {
            reply.error(Errno::EIO);
        }
    }

    /// fsync / fdatasync / fsyncdir counts per path since the mount.
    pub fn syncs(&self) -> SyncLog {
        lock(&self.shared.state).syncs.clone()
    }

    /// Bytes held in dirty pages, waiting for a sync.
    pub fn pending_bytes(&self) -> u64 {
        lock(&self.shared.state)
            .pending
            .values()
            .map(Pending::bytes)
            .sum()
    }

    /// The calls the model does not cover that reached it (each failed), in order.
    pub fn unsupported(&self) -> Vec<String> {
        lock(&self.unsupported).clone()
    }

    /// How many earlier sessions did not end when unmounted (and were left running,
    /// detached): 0 unless the abort through fusectl failed.
    pub fn left_running(&self) -> usize {
        self.left_running
    }

    /// Detach the mount (so a process that still holds a file on it, or died with one,
    /// cannot keep it busy), abort the connection if its session thread does not end, and
    /// wait for that thread a bounded time; a thread that still runs is left behind.
    fn unmount(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        if let Ok(path) = cstr(self.mount.path()) {
            // SAFETY: a NUL-terminated path.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
        let ended = |s: &BackgroundSession| {
            let until = Instant::now() + END_WAIT;
            while !s.guard.is_finished() {
                if Instant::now() > until {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            true
        };
        // Abort the connection at once: a process that still holds a file on the old mount
        // gets errors (the power is off), and the session's thread ends.
        if let Some(dev) = self.conn {
            abort_connection(dev);
        }
        let done = ended(&session);
        if done {
            // The connection is gone: the session's own unmount sees that and does nothing.
            let _ = session.join();
        } else {
            eprintln!(
                "lazyfs: the session of {} did not end (a process still holds a file on it?); \
                 left running, detached",
                self.mount.path().display()
            );
            // Dropping it would unmount by path, which may be the next session's mount.
            std::mem::forget(session);
            self.left_running += 1;
        }
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        self.answer_syncs();
        self.cut();
        self.unmount();
    }
}

/// Abort a FUSE connection through fusectl, mounting fusectl first if it is not (root only;
/// without it, the caller's bounded wait is all there is).
fn abort_connection(dev: u64) {
    let conns = Path::new("/sys/fs/fuse/connections");
    let abort = conns.join(libc::minor(dev).to_string()).join("abort");
    if !abort.exists() && conns.is_dir() {
        // SAFETY: NUL-terminated strings that live across the call; no data argument.
        unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    }
    let _ = std::fs::write(&abort, "1");
}

fn new_shared(backing: &Path, unsupported: &Arc<Mutex<Vec<String>>>) -> Arc<Shared> {
    let root_ino = std::fs::metadata(backing).expect("backing directory").ino();
    Arc::new(Shared {
        backing: backing.to_path_buf(),
        root_ino,
        state: Mutex::new(State {
            cut: false,
            pending: HashMap::new(),
            syncs: SyncLog::default(),
            paths: HashMap::new(),
            handles: HashMap::new(),
            next_fh: 0,
            stalled: false,
            unanswered: Vec::new(),
        }),
        unsupported: Arc::clone(unsupported),
    })
}

/// Mount a session; the mount is up on return (the kernel's INIT was answered). Also
/// returns the mount's device number: its minor is the connection's number in fusectl.
fn spawn(shared: &Arc<Shared>, mount: &Path) -> (BackgroundSession, Option<u64>) {
    // Config is non-exhaustive: set fields on the default.
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("lazyfs".into()),
        MountOption::Subtype("lazyfs".into()),
    ];
    config.n_threads = Some(1);
    let session = fuser::spawn_mount(Fs(Arc::clone(shared)), mount, &config).unwrap_or_else(|e| {
        panic!(
            "mounting lazyfs on {} failed: {e}; {HOW_TO}",
            mount.display()
        )
    });
    let dev = std::fs::metadata(mount).map(|m| m.dev()).ok();
    (session, dev)
}
