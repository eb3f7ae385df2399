//! Which ID is at a row: the check the ID index asks for when an ID's hash fragment matches a
//! slot (see [`id_index`](super::id_index)), answered from the ID lists, never from the
//! index itself.
//!
//! A row's ID is in ids.log once its segment is planned, or, between the planner noting it
//! ([`Store::first_rows`]) and the plan holding it, only in memory here. To find a planned
//! row's list, this keeps the first row of every segment seen so far (16 bytes per segment,
//! about one per thousand rows), read once from the offset log and extended as segments are
//! planned, and the last list read. A row it cannot place holds no ID as far as the index is
//! concerned: at worst an ID is indexed twice (a plan's own rows), never found at a wrong row.

use std::collections::BTreeMap;

use super::id_index::IndexError;
use super::*;

/// What [`SledStore::holds`] keeps between calls.
#[derive(Debug, Default)]
pub(super) struct IdRows {
    /// IDs noted by the planner and not planned yet: row → ID.
    noted: BTreeMap<u64, String>,
    /// Per segment read so far, in bucket order: (its first row, its first bucket).
    segments: Vec<(u64, u64)>,
    /// The first bucket after the segments read.
    next_bucket: u64,
    /// The row after the segments read.
    end_row: u64,
    /// The list read last: its segment's first bucket and its (row, ID) entries.
    last: Option<(u64, Vec<(u64, String)>)>,
}

impl SledStore {
    fn id_rows(&self) -> std::sync::MutexGuard<'_, IdRows> {
        self.id_rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the ID at `row` is `id`, as far as the plan and the rows noted say.
    pub(super) fn holds(&self, row: u64, id: &str) -> Result<bool, StoreError> {
        let mut rows = self.id_rows();
        if let Some(noted) = rows.noted.get(&row) {
            return Ok(noted == id);
        }
        if row >= rows.end_row {
            self.read_segments(&mut rows)?;
        }
        let i = rows.segments.partition_point(|&(start, _)| start <= row);
        let Some(&(_, first)) = i.checked_sub(1).and_then(|i| rows.segments.get(i)) else {
            return Ok(false);
        };
        if rows.last.as_ref().is_none_or(|(at, _)| *at != first) {
            let list = self.read_list(first)?;
            rows.last = Some((first, list));
        }
        let list = &rows.last.as_ref().expect("read just now").1;
        Ok(list
            .binary_search_by_key(&row, |(r, _)| *r)
            .is_ok_and(|at| list[at].1 == id))
    }

    /// Note IDs the planner read first (or again at the same row) until they are planned.
    pub(super) fn note_rows<'a>(&self, noted: impl IntoIterator<Item = (u64, &'a str)>) {
        let mut rows = self.id_rows();
        for (row, id) in noted {
            rows.noted.insert(row, id.to_owned());
        }
    }

    /// Forget the noted rows below `end`: planned, their IDs are in ids.log.
    pub(super) fn planned_rows(&self, end: u64) {
        let mut rows = self.id_rows();
        rows.noted = rows.noted.split_off(&end);
    }

    /// An error of the ID index or of its check, as the store's.
    pub(super) fn index_error(&self, e: IndexError<StoreError>) -> StoreError {
        match e {
            IndexError::Io(e) => self.index_err(e),
            IndexError::Check(e) => e,
        }
    }

    /// Read the segments planned since the last call.
    fn read_segments(&self, rows: &mut IdRows) -> Result<(), StoreError> {
        for segment in self.segments_from(rows.next_bucket)? {
            let segment = segment?;
            if segment.first < rows.next_bucket {
                continue;
            }
            rows.segments.push((segment.start.row, segment.first));
            rows.next_bucket = segment.last() + 1;
            rows.end_row = segment.buckets.last().map_or(segment.start.row, |b| b[2]);
        }
        Ok(())
    }

    /// The (row, ID) entries of the segment starting at bucket `first`, in row order.
    fn read_list(&self, first: u64) -> Result<Vec<(u64, String)>, StoreError> {
        let ids = self.segment_list(first, &format!("the segment from bucket {first}"))?;
        Ok(ids.into_iter().map(|(row, id, _)| (row, id)).collect())
    }
}
