//! Durability of the side files beside sled (the pages log, the results log and the ID
//! index): a sync makes them durable first (on the blocking pool), the pages log before the
//! results log, then records in sled how far they are; an open indexes again what a crash may
//! have lost.

use std::path::Path;

use super::*;

/// How often (at most) a sync makes the ID index durable; an open after a crash indexes again
/// the IDs of the buckets planned since.
pub(super) const INDEX_SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// What a sync made durable of the side files.
pub(super) struct SideSynced {
    /// The pages log's durable part, if the store has one.
    pages: Option<Durable>,
    /// The results log's.
    results: Durable,
    /// The ID index's sync, if it was due.
    indexed: Option<std::io::Result<()>>,
}

/// Make the pages log (if any) and then the results log durable (and the ID index, if
/// `index_due`): the blocking part of a sync. The pages log goes first, so that a record is
/// never durable before the pages it counts (see [`super::pages`]).
pub(super) fn side_sync(
    pages: Option<&PagesLog>,
    results: &ResultsLog,
    index: &IdIndex,
    index_due: bool,
    force: bool,
) -> Result<SideSynced, LogError> {
    let pages = pages.map(|p| p.sync(force)).transpose()?;
    let results = results.sync(force)?;
    let indexed = index_due.then(|| index.sync());
    Ok(SideSynced {
        pages,
        results,
        indexed,
    })
}

pub(super) fn log_error(path: &Path, e: LogError) -> StoreError {
    match e {
        LogError::Io { path, source } => StoreError::at(path.display(), StoreError::Io(source)),
        LogError::Damaged { path: file, reason } => StoreError::at(
            path.display(),
            StoreError::Corrupt {
                reason: format!("{}: {reason}", file.display()),
            },
        ),
    }
}

impl SledStore {
    pub(super) fn log_err(&self, e: LogError) -> StoreError {
        log_error(&self.path, e)
    }

    pub(super) fn index_err(&self, e: std::io::Error) -> StoreError {
        match e.kind() {
            std::io::ErrorKind::InvalidData => StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: e.to_string(),
                },
            ),
            _ => StoreError::at(self.path.join(INDEX_FILE).display(), StoreError::Io(e)),
        }
    }

    /// Make the pages log, the results log and the ID index durable, and write into sled how
    /// far they are (durable with sled's next flush). `planned`: the planned-bucket watermark read before
    /// (every bucket below it had its IDs indexed before it was planned).
    pub(super) fn sync_side_files(
        &self,
        t: &Trees,
        planned: u64,
        force: bool,
    ) -> Result<(), StoreError> {
        let index_due = self.index_due(planned, force);
        let pages = self.pages.get();
        let synced = side_sync(
            pages.as_deref(),
            &self.results,
            &self.index,
            index_due,
            force,
        );
        self.note_side_files(t, planned, synced)
    }

    /// Whether a sync should make the ID index durable: it can always be rebuilt from the
    /// offset log's ID lists, so only now and then (an open indexes again the buckets planned
    /// since).
    pub(super) fn index_due(&self, planned: u64, force: bool) -> bool {
        planned > 0
            && (force
                || self
                    .indexed_at
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .elapsed()
                    >= INDEX_SYNC_EVERY)
    }

    /// Write into sled how far the side files are durable (after [`side_sync`]).
    pub(super) fn note_side_files(
        &self,
        t: &Trees,
        planned: u64,
        synced: Result<SideSynced, LogError>,
    ) -> Result<(), StoreError> {
        let synced = synced.map_err(|e| self.log_err(e))?;
        let mut batch = sled::Batch::default();
        if let Some(pages) = synced.pages {
            batch.insert(pages_log::META_KEY, &pages.to_bytes());
        }
        batch.insert("results", &synced.results.to_bytes());
        if let Some(indexed) = synced.indexed {
            indexed.map_err(|e| self.index_err(e))?;
            batch.insert("indexed", &planned.to_be_bytes());
            *self
                .indexed_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = std::time::Instant::now();
        }
        t.meta.apply_batch(batch).map_err(|e| self.err(e))
    }

    /// Index again the IDs of buckets planned after the index was last made durable (a crash
    /// may have lost them; inserting is idempotent), or all of them if the index was lost.
    pub(super) fn index_again(&self) -> Result<(), StoreError> {
        let t = self.t()?;
        let mut from = match t.meta.get("indexed").map_err(|e| self.err(e))? {
            Some(v) => <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| {
                    StoreError::at(
                        self.path.display(),
                        StoreError::Corrupt {
                            reason: "its record of the ID index is undecodable".into(),
                        },
                    )
                })?,
            None => 0,
        };
        if self.index.is_empty() && from > 0 {
            tracing::warn!(
                path = %self.path.display(),
                "the ID index was empty: building it again from the offset log"
            );
            from = 0;
        }
        let mut ids = 0;
        for segment in self.segments_from(from)? {
            let segment = segment?;
            let lists = self.read_segment_ids(&segment)?;
            for (offset, list) in segment.offsets().zip(&lists) {
                if offset.bucket < from {
                    continue;
                }
                ids += list.len();
                self.index
                    .insert_all(
                        list.iter().map(|(row, id, _)| (*row, id.as_str())),
                        &mut |r, s| self.holds(r, s),
                    )
                    .map_err(|e| self.index_error(e))?;
            }
        }
        tracing::debug!(from, ids, "indexed the IDs planned after the last sync");
        Ok(())
    }
}
