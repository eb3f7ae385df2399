//! Writing an export's file atomically (a temp file in the same directory, synced, then
//! renamed), so a reader never sees half an export.

use std::io::BufWriter;
use std::path::Path;

use crate::store::ExportError;

/// Write `path` through `write`, atomically: into a temp file in the same directory, which
/// is synced and then renamed over `path`. Returns what `write` returns.
pub(super) async fn replace_atomically(
    path: &Path,
    write: impl AsyncFnOnce(&mut BufWriter<tempfile::NamedTempFile>) -> Result<u64, ExportError>,
) -> Result<u64, ExportError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    let mut out = BufWriter::with_capacity(1 << 20, tmp);
    let count = write(&mut out).await?;
    let tmp = out.into_inner().map_err(|e| e.into_error())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(count)
}
