//! Upgrades of older store formats on open: formats 1 and 2 kept results (and ID lists) in sled
//! and are moved out; formats 3, 4 and 5 only get marked 6 (their records stay as they are:
//! JSON item records are read beside binary ones, and results log entries of one record beside
//! groups).

use super::*;

/// Store formats this build opens: the current one; format 5 (results log entries of one
/// record each, still read: it only marks the store format 6); format 4 (JSON item records,
/// still read: it only marks the store); format 3 (rerun ID lists in sled, still read there; it
/// only marks the store); format 2 (results in sled) and format 1
/// (also one offset record per bucket), which it upgrades in place.
pub(super) const READS_VERSIONS: [u32; 6] = [1, 2, 3, 4, 5, FORMAT_VERSION];

/// The first format with results and the job's ID lists out of sled: older ones are upgraded
/// by moving them.
pub(super) const FILES_SINCE: u32 = 3;

impl SledStore {
    /// Write inline ID lists (key, list) to ids.log and point the offset log at them.
    pub(super) fn move_lists(
        &self,
        t: &Trees,
        lists: Vec<(sled::IVec, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        let blobs: Vec<Vec<u8>> = lists.iter().map(|(_, l)| l.clone()).collect();
        let refs = self.id_lists.append(&blobs).map_err(|e| self.log_err(e))?;
        let mut batch = sled::Batch::default();
        for ((key, _), list) in lists.iter().zip(refs) {
            batch.insert(key, &list.to_bytes());
        }
        t.ids.apply_batch(batch).map_err(|e| self.err(e))?;
        t.flush().map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Move a format 1 or 2 store's results out of sled (see the module doc). An upgrade that
    /// stops half way starts over at the next open: the database says format 2 until the end.
    pub(super) fn upgrade(&self) -> Result<(), StoreError> {
        let t = self.t()?;
        self.results.clear().map_err(|e| self.log_err(e))?;
        // ID lists kept inline in sled move to ids.log (lists moved by an upgrade that
        // stopped half way are references already).
        let mut inline = Vec::new();
        for entry in t.ids.iter() {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            if ListRef::from_bytes(&value).is_none() {
                inline.push((key, value.to_vec()));
            }
            if inline.len() == 256 {
                self.move_lists(&t, std::mem::take(&mut inline))?;
            }
        }
        self.move_lists(&t, inline)?;
        let mut planned = 0;
        let mut moved = 0u64;
        for segment in self.segments()? {
            let segment = segment?;
            planned = segment.last() + 1;
            let lists = self.read_segment_ids(&segment)?;
            for list in &lists {
                self.index
                    .insert_all(
                        list.iter().map(|(row, id, _)| (*row, id.as_str())),
                        &mut |r, s| self.holds(r, s),
                    )
                    .map_err(|e| self.index_error(e))?;
                let mut found = Vec::new();
                for (row, id, _) in list {
                    if let Some(value) = t.items.get(id.as_bytes()).map_err(|e| self.err(e))? {
                        // Check it decodes before it is moved.
                        self.decode_item(*row, &value)?;
                        found.push((*row, id.as_str(), value));
                    }
                }
                moved += found.len() as u64;
                self.results
                    .append(found.iter().map(|(row, id, v)| (*row, *id, v.as_ref())))
                    .map_err(|e| self.log_err(e))?;
            }
        }
        self.sync_side_files(&t, planned, true)?;
        t.meta
            .insert("version", &FORMAT_VERSION.to_be_bytes())
            .map_err(|e| self.err(e))?;
        t.flush().map_err(|e| self.err(e))?;
        t.items.clear().map_err(|e| self.err(e))?;
        t.flush().map_err(|e| self.err(e))?;
        tracing::info!(
            path = %self.path.display(),
            results = moved,
            "upgraded the store to format {FORMAT_VERSION}: results moved out of sled"
        );
        Ok(())
    }
}
