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
