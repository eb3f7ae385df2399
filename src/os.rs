//! What the process asks of the operating system: as many open files as it may have, so
//! that `concurrency` in the thousands gets its connections; holes punched in a sparse file; a
//! lower priority for a background thread; whether a process exists; a state directory's
//! lock (`flock`); a file mapped in memory (the ID index); and, for the exec handler's
//! processes, a process group of their own and their death with highwater's; the process's
//! peak memory. The platform
//! calls live here, behind `cfg(unix)` and `cfg(target_os = "linux")`; elsewhere the limit is
//! left as it is and not checked, and a child is contained only by its attempt killing it.

/// Descriptors a run needs besides one connection per item in flight: stdio, the state
/// directory's files (sled's, the results log, positions, the ID index and lists), the
/// input, the runtime's own (epoll, eventfds), a metrics listener, and connections being
/// replaced.
pub(crate) const RESERVED_FILES: u64 = 64;

/// The process may not open enough files for the requests it is asked to keep in flight.
#[derive(Debug, thiserror::Error)]
#[error(
    "{in_flight} requests in flight need about {needed} open files, but this process may \
     open at most {limit} (its hard limit; raise it with `ulimit -Hn` as root or in \
     limits.conf / systemd's LimitNOFILE)"
)]
pub struct TooFewFiles {
    /// Requests asked to be in flight at once.
    pub in_flight: u64,
    /// Open files they need, with the process's own.
    pub needed: u64,
    /// The process's hard limit on open files.
    pub limit: u64,
}

/// Raise the soft limit on open files to the hard limit, and check that `in_flight`
/// connections (plus `RESERVED_FILES`) fit under it. Returns the limit in force.
pub fn open_files_for(in_flight: u64) -> Result<Option<u64>, TooFewFiles> {
    let Some(limit) = raise_open_files() else {
        return Ok(None);
    };
    let needed = in_flight + RESERVED_FILES;
    if needed > limit {
        return Err(TooFewFiles {
            in_flight,
            needed,
            limit,
        });
    }
    Ok(Some(limit))
}

/// Raise the soft `RLIMIT_NOFILE` to the hard one (where the hard one is unlimited, to the
/// most the kernel takes); the soft limit in force after, or None where it is not known.
#[cfg(unix)]
fn raise_open_files() -> Option<u64> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return None;
    }
    if l.rlim_cur < l.rlim_max {
        // An unlimited hard limit is refused by some kernels (macOS caps at OPEN_MAX):
        // then try a large finite one.
        for want in [l.rlim_max, 1 << 20] {
            let raised = libc::rlimit {
                rlim_cur: want.min(l.rlim_max),
                rlim_max: l.rlim_max,
            };
            // SAFETY: setrlimit reads one rlimit through a valid pointer.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                l.rlim_cur = raised.rlim_cur;
                break;
            }
        }
    }
    // rlim_t is u64 on Linux and macOS, but not on every unix.
    #[allow(clippy::unnecessary_cast)]
    Some(l.rlim_cur as u64)
}

#[cfg(not(unix))]
fn raise_open_files() -> Option<u64> {
    None
}

/// Contain a child process of the exec handler before it is spawned: it leads a process
/// group of its own (so [`kill_process_group`] reaches everything it starts), and, on
/// Linux, the kernel sends it `SIGKILL` when the thread that forked it ends (so it dies
/// with highwater, even when highwater is killed with `SIGKILL`).
pub(crate) fn contain_child(command: &mut tokio::process::Command) {
    #[cfg(unix)]
    command.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id();
        // SAFETY: between fork and exec only async-signal-safe calls are made (prctl,
        // getppid) and nothing allocates: the error is an OS error code.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // Forked just before highwater died: the signal was missed, do not run.
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(unix))]
    let _ = command;
}

/// Send `SIGKILL` to the process group `group` (a child contained by [`contain_child`] and
/// all it started). A group that is gone already is not an error.
pub(crate) fn kill_process_group(group: u32) {
    #[cfg(unix)]
    {
        if let Ok(group) = libc::pid_t::try_from(group) {
            // SAFETY: killpg takes plain integers; a wrong group is an error code.
            unsafe {
                libc::killpg(group, libc::SIGKILL);
            }
        }
    }
    #[cfg(not(unix))]
    let _ = group;
}

/// Give the space of `len` bytes at `at` back to the filesystem, keeping the file's size
/// (Linux `fallocate` with `PUNCH_HOLE | KEEP_SIZE`). Elsewhere, or on a filesystem without
/// hole punching, an error: the space stays allocated, which costs disk, not correctness.
pub(crate) fn punch_hole(file: &std::fs::File, at: u64, len: u64) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(at), Ok(len)) = (i64::try_from(at), i64::try_from(len)) else {
            return Err(std::io::Error::other(
                "range beyond the largest file offset",
            ));
        };
        // SAFETY: a plain syscall on a file descriptor this process owns; no memory is shared.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at,
                len,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, at, len);
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "hole punching is only done on Linux",
        ))
    }
}

/// Give the calling thread a lower CPU priority (nice 10), so background work such as
/// counting the input's rows yields to the run. Linux only (there a thread is its own
/// scheduling entity); elsewhere nothing.
pub(crate) fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority on the calling thread; no memory is involved.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// Whether a process with this pid exists (a zombie included: the caller tells those
/// apart). Elsewhere than Unix: assumed to.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) fn process_exists(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    #[cfg(unix)]
    {
        // SAFETY: signal 0 only checks that the process exists; nothing is sent.
        let rc = unsafe { libc::kill(pid, 0) };
        rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Take an exclusive advisory lock on `file` without waiting: `Ok(false)` when another
/// holder has it.
pub(crate) fn try_lock_exclusive(file: &std::fs::File) -> std::io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file descriptor the caller owns; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(false)
        } else {
            Err(err)
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "state directories are locked with flock, on Unix only",
        ))
    }
}

/// A shared, writable mapping of the first `len` bytes of `file`, or `None` where the
/// system cannot map it (the caller then reads and writes the file). The caller unmaps it
/// with [`unmap`] once nothing refers to it.
pub(crate) fn map_shared(file: &std::fs::File, len: u64) -> Option<std::ptr::NonNull<u8>> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return None;
        }
        // SAFETY: a new shared mapping of a file the caller owns, at an address the kernel
        // picks; nothing else refers to that memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                usize::try_from(len).ok()?,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            tracing::debug!(error = %std::io::Error::last_os_error(), "could not map a file");
            return None;
        }
        std::ptr::NonNull::new(ptr.cast())
    }
    #[cfg(not(unix))]
    {
        let _ = (file, len);
        None
    }
}

/// Unmap what [`map_shared`] mapped.
///
/// # Safety
/// `ptr` and `len` are exactly a mapping [`map_shared`] returned, and nothing refers to its
/// memory any more.
pub(crate) unsafe fn unmap(ptr: std::ptr::NonNull<u8>, len: u64) {
    #[cfg(unix)]
    // SAFETY: the caller's promise.
    unsafe {
        libc::munmap(ptr.as_ptr().cast(), len as usize);
    }
    #[cfg(not(unix))]
    let _ = (ptr, len);
}

/// The most memory the process has held resident so far (Linux's `VmHWM`), in bytes; none
/// where the platform does not say.
#[cfg(feature = "cli")]
pub(crate) fn peak_memory() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: u64 = line
            .trim_start_matches("VmHWM:")
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// `; peak memory N MiB` for a command's closing line, or nothing where it is not known.
#[cfg(feature = "cli")]
pub(crate) fn peak_memory_note() -> String {
    peak_memory().map_or_else(String::new, |b| {
        format!("; peak memory {} MiB", b.div_ceil(1 << 20))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_and_checked() {
        let limit = open_files_for(1).unwrap().expect("known on unix");
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
        #[allow(clippy::unnecessary_cast)]
        let cur = l.rlim_cur as u64;
        assert_eq!(cur, limit);
        assert!(l.rlim_cur == l.rlim_max || l.rlim_cur >= 1 << 20);
        let e = open_files_for(limit).unwrap_err();
        assert_eq!(e.needed, limit + RESERVED_FILES);
        assert!(e.to_string().contains(&format!("at most {limit}")), "{e}");
    }
}
