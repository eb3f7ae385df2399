//! The bench's scratch files: its temporary directory, the input files of IDs, and the size
//! of what a run left on disk.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub fn id_of(i: u64) -> String {
    format!("id-{i:09}")
}

/// Writes `n` distinct IDs, one a line.
pub fn write_input(path: &Path, n: u64) -> Result<u64> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    for i in 0..n {
        writeln!(out, "id-{i:09}")?;
    }
    out.flush()?;
    out.get_ref().sync_all()?;
    Ok(std::fs::metadata(path)?.len())
}

/// The bytes [`write_input`] writes for `n` IDs: `id-`, the number (nine digits at least)
/// and a newline each.
pub fn input_len(n: u64) -> u64 {
    let (mut bytes, mut from, mut digits, mut below) = (0, 0, 9, 1_000_000_000u64);
    while from < n {
        bytes += (n.min(below) - from) * (digits + 4);
        (from, digits, below) = (below, digits + 1, below.saturating_mul(10));
    }
    bytes
}

pub fn finish_temp(guard: Option<tempfile::TempDir>, path: &Path) {
    match guard {
        Some(dir) => {
            if let Err(e) = dir.close() {
                eprintln!("warning: could not remove {}: {e}", path.display());
            }
        }
        None => eprintln!("kept {}", path.display()),
    }
}

pub fn temp_dir(keep: bool) -> Result<(Option<tempfile::TempDir>, PathBuf)> {
    let dir = tempfile::Builder::new()
        .prefix("highwater-bench-")
        .tempdir()
        .context("creating a temporary directory")?;
    let path = std::fs::canonicalize(dir.path())?;
    Ok(if keep {
        let _ = dir.keep();
        (None, path)
    } else {
        (Some(dir), path)
    })
}

/// (apparent bytes, allocated bytes) of everything under `dir`.
pub fn dir_size(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut apparent, mut allocated) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                apparent += m.len();
                allocated += m.blocks() * 512;
            }
        }
    }
    (apparent, allocated)
}

/// The entries of the directory `state` with their allocated bytes (a folder's with all it
/// holds, as `du` counts them), largest first.
pub fn files_of(state: &Path) -> Result<Vec<(String, u64)>> {
    use std::os::unix::fs::MetadataExt;
    let mut files = Vec::new();
    for e in std::fs::read_dir(state)?.flatten() {
        let path = e.path();
        let size = if path.is_dir() {
            dir_size(&path).1
        } else {
            std::fs::metadata(&path).map_or(0, |m| m.blocks() * 512)
        };
        files.push((e.file_name().to_string_lossy().into_owned(), size));
    }
    files.sort_by_key(|f| std::cmp::Reverse(f.1));
    Ok(files)
}
