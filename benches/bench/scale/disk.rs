//! Free disk before a `scale` run: what the run will write (each part bounded from above)
//! against what the file system holding it has free, from `statvfs`; the run is refused
//! when it would not fit, before anything is written.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::numbers::size;

/// What one part of the run will write, at most, and where.
pub struct Need {
    pub what: String,
    pub path: PathBuf,
    pub bytes: u64,
}

/// One file system the run writes to: what it has free for us, and what we need of it.
pub struct Room {
    pub mount: PathBuf,
    pub free: u64,
    pub need: u64,
    pub parts: Vec<String>,
}

/// The free space of every file system `needs` write to against what they need there;
/// an error stating both figures when one has too little.
pub fn check(needs: &[Need]) -> Result<Vec<Room>> {
    let mut rooms: Vec<(u64, Room)> = Vec::new();
    for need in needs {
        let (device, free) = free_bytes(&need.path)?;
        let part = format!("{} {}", need.what, size(need.bytes));
        match rooms.iter_mut().find(|(d, _)| *d == device) {
            Some((_, room)) => {
                room.need += need.bytes;
                room.parts.push(part);
            }
            None => rooms.push((
                device,
                Room {
                    mount: need.path.clone(),
                    free,
                    need: need.bytes,
                    parts: vec![part],
                },
            )),
        }
    }
    let rooms: Vec<Room> = rooms.into_iter().map(|(_, room)| room).collect();
    for room in &rooms {
        if room.need > room.free {
            bail!(
                "not enough free disk for this run: the file system of {} has {} free, the \
                 run needs up to {} there ({}); free some space, point TMPDIR elsewhere or \
                 pass a smaller --ids",
                room.mount.display(),
                size(room.free),
                size(room.need),
                room.parts.join(" + ")
            );
        }
    }
    Ok(rooms)
}

/// (device, bytes free to an unprivileged user) of the file system holding `path`.
pub fn free_bytes(path: &Path) -> Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .dev();
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{} as a C string", path.display()))?;
    // SAFETY: statvfs only writes the struct it is given; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!("statvfs({}): {e}", path.display());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok((device, st.f_bavail as u64 * st.f_frsize as u64))
}
