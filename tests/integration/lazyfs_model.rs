//! The power-cut model itself (`lazyfs`): what was synced survives a cut, nothing else does;
//! metadata goes through at once; syncs are counted on the right paths; locks work across
//! processes on the mount.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};

use crate::lazyfs::{LazyFs, SyncCounts};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn rw(path: &std::path::Path) -> File {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

#[test]
fn a_cut_keeps_what_was_fsynced_and_drops_later_writes() {
    let mut fs = LazyFs::mount();
    let path = fs.path().join("data");
    let a = pattern(6000, 1);
    let f = rw(&path);
    f.write_all_at(&a, 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(fs.pending_bytes(), 0, "fsync left data pending");

    // Overwrite inside A and append B, then close: closing makes nothing durable.
    f.write_all_at(b"BBBB", 10).unwrap();
    f.write_all_at(&pattern(5000, 2), 6000).unwrap();
    drop(f);
    let mut shown = a.clone();
    shown[10..14].copy_from_slice(b"BBBB");
    shown.extend(pattern(5000, 2));
    assert_eq!(
        fs::read(&path).unwrap(),
        shown,
        "the mount shows pending writes"
    );
    assert!(fs.pending_bytes() > 0);

    fs.cut();
    fs.remount();
    assert_eq!(
        fs::read(&path).unwrap(),
        a,
        "after the cut: exactly what was fsynced"
    );
    assert_eq!(fs.pending_bytes(), 0);
    assert_eq!(fs.unsupported(), Vec::<String>::new());
}

#[test]
fn size_changes_are_lazy_and_a_shrunk_file_reads_zeros_where_it_grows_again() {
    let mut fs = LazyFs::mount();
    let path = fs.path().join("t");
    let old = pattern(10_000, 3);
    let f = rw(&path);
    f.write_all_at(&old, 0).unwrap();
    f.sync_data().unwrap();

    // Truncate to 0, then write past the old bytes: what lies between reads as zeros.
    f.set_len(0).unwrap();
    f.write_all_at(b"x", 8192).unwrap();
    let mut expected = vec![0u8; 8192];
    expected.push(b'x');
    assert_eq!(fs::read(&path).unwrap(), expected);
    f.sync_data().unwrap();

    // An unsynced shrink is lost.
    f.set_len(3).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), 3);
    drop(f);
    fs.cut();
    fs.remount();
    assert_eq!(fs::read(&path).unwrap(), expected);
}

#[test]
fn a_grown_fdatasynced_file_keeps_its_size_and_an_unsynced_new_file_is_empty() {
    let mut fs = LazyFs::mount();
    let grown = fs.path().join("grown");
    let f = rw(&grown);
    f.write_all_at(&pattern(100, 4), 0).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(&pattern(10_000, 5), 100).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b"lost", 10_100).unwrap();
    drop(f);

    let never = fs.path().join("never-synced");
    fs::write(&never, pattern(5000, 6)).unwrap();
    assert_eq!(fs::metadata(&never).unwrap().len(), 5000);

    fs.cut();
    fs.remount();
    let mut expected = pattern(100, 4);
    expected.extend(pattern(10_000, 5));
    assert_eq!(fs::read(&grown).unwrap(), expected);
    // Metadata went through at once: the file exists, its data did not.
    assert_eq!(fs::read(&never).unwrap(), Vec::<u8>::new());
}

#[test]
fn a_file_synced_then_renamed_over_another_keeps_its_data_under_the_new_name() {
    let mut fs = LazyFs::mount();
    let target = fs.path().join("target");
    fs::write(&target, b"old").unwrap();
    File::open(&target).unwrap().sync_all().unwrap();

    // The atomic write: temp file, fsync, rename over the target.
    let tmp = fs.path().join("target.tmp");
    let mut f = File::create(&tmp).unwrap();
    f.write_all(b"new contents").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::rename(&tmp, &target).unwrap();

    // The same without the fsync: the rename survives, the data does not.
    let other = fs.path().join("other");
    let other_tmp = fs.path().join("other.tmp");
    fs::write(&other, b"old").unwrap();
    File::open(&other).unwrap().sync_all().unwrap();
    fs::write(&other_tmp, b"never synced").unwrap();
    fs::rename(&other_tmp, &other).unwrap();

    fs.cut();
    fs.remount();
    assert_eq!(fs::read(&target).unwrap(), b"new contents");
    assert!(!tmp.exists());
    assert_eq!(fs::read(&other).unwrap(), b"");
    assert!(!other_tmp.exists());
}

#[test]
fn a_shared_mapping_keeps_the_page_msynced_and_loses_the_page_dirtied_later() {
    let mut fs = LazyFs::mount();
    let path = fs.path().join("mapped");
    let f = rw(&path);
    f.set_len(2 * 4096).unwrap();
    f.sync_all().unwrap();
    // SAFETY: a shared mapping of 2 pages of a file of that size, unmapped below, used only
    // through the slice while mapped.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            2 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(ptr, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let map = std::slice::from_raw_parts_mut(ptr.cast::<u8>(), 2 * 4096);
        map[..4096].fill(0xAB);
        assert_eq!(libc::msync(ptr, 4096, libc::MS_SYNC), 0);
        map[4096..].fill(0xCD);
        fs.cut();
        assert_eq!(libc::munmap(ptr, 2 * 4096), 0);
    }
    drop(f);
    let synced = fs.syncs().of("mapped");
    assert!(
        synced.fsync + synced.fdatasync >= 2,
        "set_len's fsync and msync's: {synced:?}"
    );
    fs.remount();
    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), 2 * 4096);
    assert!(data[..4096].iter().all(|&b| b == 0xAB), "the msynced page");
    assert!(
        data[4096..].iter().all(|&b| b == 0),
        "the page dirtied after"
    );
}

#[test]
fn the_sync_log_tells_fsync_fdatasync_and_fsyncdir_apart_by_path() {
    let fs = LazyFs::mount();
    fs::create_dir(fs.path().join("d")).unwrap();
    let mut f = File::create(fs.path().join("d/f")).unwrap();
    f.write_all(b"f").unwrap();
    f.sync_all().unwrap();
    let mut g = File::create(fs.path().join("g")).unwrap();
    g.write_all(b"g").unwrap();
    g.sync_data().unwrap();
    g.sync_data().unwrap();
    File::open(fs.path().join("d")).unwrap().sync_all().unwrap();
    File::open(fs.path()).unwrap().sync_data().unwrap();
    fs::write(fs.path().join("h"), b"never synced").unwrap();

    let log = fs.syncs();
    let counts = |fsync, fdatasync, fsyncdir| SyncCounts {
        fsync,
        fdatasync,
        fsyncdir,
    };
    assert_eq!(log.of("d/f"), counts(1, 0, 0), "{log:?}");
    assert_eq!(log.of("g"), counts(0, 2, 0), "{log:?}");
    assert_eq!(log.of("d"), counts(0, 0, 1), "{log:?}");
    assert_eq!(log.of(""), counts(0, 0, 1), "the root: {log:?}");
    assert_eq!(log.of("h"), counts(0, 0, 0), "{log:?}");
    assert_eq!(log.by_path.len(), 4, "{log:?}");
}

#[test]
fn an_unsupported_call_fails_and_is_listed() {
    let fs = LazyFs::mount();
    let f = rw(&fs.path().join("holes"));
    f.write_all_at(&[1u8; 8192], 0).unwrap();
    // What highwater's ID index does to give space back.
    // SAFETY: a syscall on a file descriptor owned here.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            4096,
        )
    };
    assert_eq!(rc, -1, "fallocate is not modelled: it must fail");
    let unsupported = fs.unsupported();
    assert_eq!(unsupported.len(), 1, "{unsupported:?}");
    assert!(
        unsupported[0].starts_with("fallocate(holes"),
        "{unsupported:?}"
    );
}

#[test]
fn a_flock_held_by_another_process_on_the_mount_is_seen() {
    let fs = LazyFs::mount();
    let path = fs.path().join("lock");
    File::create(&path).unwrap();
    let mut child = Command::new("flock")
        .arg("-x")
        .arg(&path)
        .args(["-c", "echo held; cat >/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the flock command (util-linux)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "held\n");

    let f = File::open(&path).unwrap();
    // SAFETY: flock on a file descriptor owned here.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    let err = std::io::Error::last_os_error();
    assert_eq!(rc, -1, "the child holds the lock");
    assert_eq!(err.raw_os_error(), Some(libc::EWOULDBLOCK));

    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    // SAFETY: as above.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn remounting_does_not_wait_for_processes_that_held_files_on_the_mount() {
    let mut fs = LazyFs::mount();
    let path = fs.path().join("held");
    fs::write(&path, b"synced").unwrap();
    File::open(&path).unwrap().sync_all().unwrap();
    // One child is SIGKILLed holding the file open; the other still holds it at the remount.
    let hold = |path: &std::path::Path| {
        let mut child = Command::new("sh")
            .args(["-c", "exec 3<>\"$0\"; echo ready; cat >/dev/null"])
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        child
    };
    let mut killed = hold(&path);
    let mut alive = hold(&path);
    fs.cut();
    killed.kill().unwrap();
    killed.wait().unwrap();

    fs.remount();
    assert_eq!(fs.left_running(), 0, "the old session ended");
    assert_eq!(fs::read(&path).unwrap(), b"synced");
    fs::write(fs.path().join("new"), b"works").unwrap();
    assert_eq!(fs::read(fs.path().join("new")).unwrap(), b"works");

    drop(alive.stdin.take());
    alive.wait().unwrap();
    drop(fs);
}

/// A file replaced again and again through a synced temp file and a rename, each time with
/// contents of another length (as a marker or a checkpoint is), beside a file written, never
/// synced and renamed over another (as live.json is), reads back exactly what was written last, before and
/// after a cut: inode numbers the backing file system reuses never carry an old file's
/// pending data over to a new one.
#[test]
fn a_file_replaced_many_times_by_rename_reads_back_its_last_contents() {
    let mut fs = LazyFs::mount();
    let target = fs.path().join("marker");
    let mut last = Vec::new();
    for round in 0..200usize {
        let scratch = fs.path().join("live.tmp");
        File::create(&scratch)
            .unwrap()
            .write_all(&pattern(600, 0xee))
            .unwrap();
        fs::rename(&scratch, fs.path().join("live")).unwrap();
        let contents = pattern(300 - (round * 7) % 250, round as u8);
        let tmp = fs.path().join(format!(".tmp{}", round % 3));
        let mut f = File::create(&tmp).unwrap();
        f.write_all(&contents).unwrap();
        f.sync_all().unwrap();
        drop(f);
        fs::rename(&tmp, &target).unwrap();
        File::open(fs.path()).unwrap().sync_all().unwrap();
        assert_eq!(fs::read(&target).unwrap(), contents, "round {round}");
        last = contents;
    }
    fs.cut();
    fs.remount();
    assert_eq!(fs::read(&target).unwrap(), last);
}
