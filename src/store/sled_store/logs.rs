//! Reading and writing the offset log and the commit log: planned segments with their ID lists
//! (in `ids.log`), the items of a bucket (with their records from the results log), pages of
//! buckets with their commit records, and commits (a bucket is committed once).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::*;

/// The highest bucket written, and the highest known durable, as `bucket + 1` (0: none).
#[derive(Default)]
pub(super) struct Watermarks {
    pub(super) planned: AtomicU64,
    pub(super) committed: AtomicU64,
}

impl SledStore {
    /// The offset log's segments, in bucket order.
    pub(super) fn segments(
        &self,
    ) -> Result<impl Iterator<Item = Result<Segment, StoreError>> + '_, StoreError> {
        let t = self.t()?;
        let entries = t.offsets.iter();
        Ok(entries.map(move |entry| {
            // The handle stays with the iterator, so no reopen happens under it.
            let _open = &t;
            let (key, value) = entry.map_err(|e| self.err(e))?;
            self.segment(&key, &value)
        }))
    }

    /// The offset log's segments from the one holding `bucket` on, in bucket order.
    pub(super) fn segments_from(
        &self,
        bucket: u64,
    ) -> Result<impl Iterator<Item = Result<Segment, StoreError>> + '_, StoreError> {
        let t = self.t()?;
        let start = match t.offsets.range(..=bucket.to_be_bytes()).next_back() {
            Some(entry) => entry.map_err(|e| self.err(e))?.0.to_vec(),
            None => bucket.to_be_bytes().to_vec(),
        };
        let entries = t.offsets.range(start..);
        Ok(entries.map(move |entry| {
            let _open = &t;
            let (key, value) = entry.map_err(|e| self.err(e))?;
            self.segment(&key, &value)
        }))
    }

    /// The commit records of a segment's buckets, by bucket.
    pub(super) fn commits_of(
        &self,
        segment: &Segment,
    ) -> Result<BTreeMap<u64, CommitRecord>, StoreError> {
        let t = self.t()?;
        let mut out = BTreeMap::new();
        let mut take = |run: Vec<CommitRecord>| {
            out.extend(
                run.into_iter()
                    .filter(|c| segment.contains(c.bucket))
                    .map(|c| (c.bucket, c)),
            )
        };
        // A run starting before the segment may reach into it.
        if let Some(entry) = t.commits.range(..segment.first.to_be_bytes()).next_back() {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            take(self.commit_run(&key, &value)?.1);
        }
        let range = segment.first.to_be_bytes()..=segment.last().to_be_bytes();
        for entry in t.commits.range(range) {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            take(self.commit_run(&key, &value)?.1);
        }
        Ok(out)
    }

    /// Whether any of `buckets` (a range) is in the commit log.
    pub(super) fn any_committed(&self, first: u64, last: u64) -> Result<bool, StoreError> {
        let t = self.t()?;
        if let Some(entry) = t
            .commits
            .range(first.to_be_bytes()..=last.to_be_bytes())
            .next()
        {
            entry.map_err(|e| self.err(e))?;
            return Ok(true);
        }
        Ok(self.commit_run_of(first)?.is_some())
    }

    /// The ID list of the segment starting at bucket `first`, decoded from ids.log; its
    /// errors name it as `what` ("the IDs of `what` are missing").
    pub(super) fn segment_list(&self, first: u64, what: &str) -> Result<Vec<Listed>, StoreError> {
        let t = self.t()?;
        let corrupt = |reason: &str| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!("the IDs of {what} {reason}"),
                },
            )
        };
        let value = t
            .ids
            .get(first.to_be_bytes())
            .map_err(|e| self.err(e))?
            .ok_or_else(|| corrupt("are missing"))?;
        let list =
            ListRef::from_bytes(&value).ok_or_else(|| corrupt("have no place in ids.log"))?;
        let blob = self.id_lists.read(list).map_err(|e| self.log_err(e))?;
        decode_ids(&blob).ok_or_else(|| corrupt("are undecodable"))
    }

    pub(super) fn read_segment_ids(&self, segment: &Segment) -> Result<SegmentIds, StoreError> {
        let what = format!("buckets {}..={}", segment.first, segment.last());
        let corrupt = |reason: &str| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!("the IDs of {what} {reason}"),
                },
            )
        };
        let mut ids = self.segment_list(segment.first, &what)?.into_iter();
        let mut out = Vec::with_capacity(segment.buckets.len());
        for offset in segment.offsets() {
            let bucket: Vec<_> = ids.by_ref().take(offset.items as usize).collect();
            if bucket.len() as u64 != offset.items {
                return Err(corrupt(&format!(
                    "are fewer than their offset records count ({} in bucket {})",
                    offset.items, offset.bucket
                )));
            }
            out.push(bucket);
        }
        if ids.next().is_some() {
            return Err(corrupt("are more than their offset records count"));
        }
        Ok(out)
    }

    /// A bucket's items: each ID with its final record, or a pending one.
    pub(super) fn items_of(
        &self,
        offset: &OffsetRecord,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let segment = self.segment_of(offset.bucket)?.ok_or_else(|| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!("bucket {} has no offset record", offset.bucket),
                },
            )
        })?;
        let ids = self.segment_ids(&segment)?;
        self.records(offset, &ids[(offset.bucket - segment.first) as usize])
    }

    /// Each of a bucket's IDs with its final record, or a pending one.
    pub(super) fn records(
        &self,
        offset: &OffsetRecord,
        ids: &[Listed],
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        let rows: Vec<(u64, &str)> = ids.iter().map(|(row, id, _)| (*row, id.as_str())).collect();
        let found = self.results.get_many(&rows).map_err(|e| self.log_err(e))?;
        let mut out = Vec::with_capacity(ids.len());
        for ((row, id, values), found) in ids.iter().zip(found) {
            let record = match found {
                Some(bytes) => self.decode_item(*row, &bytes)?,
                None => ItemRecord::pending(*row, offset.bucket),
            };
            let values = values.clone();
            out.push((id.clone(), ItemRecord { values, ..record }));
        }
        Ok(out)
    }

    /// The final record of the ID at `row`, if it has one.
    pub(super) fn result(&self, row: u64, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        match self.results.get(row, id).map_err(|e| self.log_err(e))? {
            Some(bytes) => self.decode_item(row, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Buckets from `from` on with their commit records (see [`Store::buckets`]).
    pub(super) fn read_buckets(
        &self,
        from: u64,
        limit: usize,
    ) -> Result<Vec<BucketState>, StoreError> {
        let mut out = Vec::new();
        if limit == 1 {
            // A point lookup: through the read cache, not a segment's whole commit log.
            if let Some(segment) = self.segment_of(from)? {
                let commit = self
                    .commit_run_of(from)?
                    .map(|(first, run)| run[(from - first) as usize].clone());
                out.push(BucketState {
                    offset: segment.offset(from),
                    commit,
                });
                return Ok(out);
            }
        }
        if limit == 0 {
            return Ok(out);
        }
        for segment in self.segments_from(from)? {
            let segment = segment?;
            if segment.last() < from {
                continue;
            }
            let mut committed = self.commits_of(&segment)?;
            for offset in segment.offsets().filter(|o| o.bucket >= from) {
                let commit = committed.remove(&offset.bucket);
                out.push(BucketState { offset, commit });
                if out.len() == limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// Write planned buckets and the planner position (see [`Store::plan`]).
    pub(super) fn write_plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> Result<(), StoreError> {
        let t = self.t()?;
        // The index first (IDs the planner noted through `first_row` are there already): an
        // ID indexed for a plan that then fails is planned again at the same row (planning is
        // deterministic), which the index takes as already there.
        let noted = self.noted.load(Ordering::Acquire);
        self.index
            .insert_all(
                buckets
                    .iter()
                    .flat_map(|b| &b.items)
                    .filter(|(row, _)| *row >= noted)
                    .map(|(row, id)| (*row, id.as_str())),
                &mut |r, s| self.holds(r, s),
            )
            .map_err(|e| self.index_error(e))?;
        let mut offsets = sled::Batch::default();
        let mut ids = sled::Batch::default();
        let mut bad = sled::Batch::default();
        let mut bytes = 0;
        // The ID lists go to ids.log, durable before the offset records that point at them.
        let runs: Vec<&[PlannedBucket]> = Segment::runs(buckets).collect();
        let lists: Vec<Vec<u8>> = runs
            .iter()
            .map(|run| {
                encode_ids(
                    run.iter().flat_map(|b| &b.items),
                    run.iter().flat_map(|b| &b.values),
                )
            })
            .collect();
        let refs = self.id_lists.append(&lists).map_err(|e| self.log_err(e))?;
        for (run, list) in runs.iter().zip(refs) {
            let segment = Segment::of(run);
            let key = segment.first.to_be_bytes();
            let value = json(&segment);
            bytes += value.len() + ListRef::SIZE;
            offsets.insert(&key, value);
            ids.insert(&key, &list.to_bytes());
            for line in run.iter().flat_map(|b| &b.bad_lines) {
                let value = json(line);
                bytes += value.len();
                bad.insert(&line.row.to_be_bytes(), value);
            }
        }
        let planner = json(planner);
        let highest = buckets
            .iter()
            .map(|b| b.offset.bucket + 1)
            .max()
            .unwrap_or(0);
        let result = (&t.offsets, &t.ids, &t.bad, &t.meta)
            .transaction(|(o, i, b, m)| {
                o.apply_batch(&offsets)?;
                i.apply_batch(&ids)?;
                b.apply_batch(&bad)?;
                m.insert("planner", planner.as_slice())?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                TransactionError::Storage(e) => self.err(e),
                TransactionError::Abort(()) => StoreError::at(
                    self.path.display(),
                    StoreError::Backend {
                        reason: "plan aborted".into(),
                    },
                ),
            });
        if result.is_ok() {
            let end = buckets.iter().map(|b| b.offset.end.row).max().unwrap_or(0);
            self.planned_rows(end);
        }
        self.written.planned.fetch_max(highest, Ordering::AcqRel);
        self.wrote(bytes);
        result
    }

    /// Write the commit records of job buckets (a bucket committed already keeps its record).
    pub(super) fn commit_job(&self, commits: &[CommitRecord]) -> Result<(), StoreError> {
        let t = self.t()?;
        let generation = self.runs_rewritten.load(Ordering::Acquire);
        let mut sorted: Vec<&CommitRecord> = commits.iter().collect();
        sorted.sort_by_key(|c| c.bucket);
        sorted.dedup_by_key(|c| c.bucket);
        let mut batch = sled::Batch::default();
        // The last run written: its first bucket and length.
        let mut last: Option<(u64, usize)> = None;
        let mut bytes = 0;
        let mut write = |run: &[&CommitRecord]| {
            for part in run.chunks(MAX_COMMIT_RUN) {
                let value = json(&part);
                bytes += value.len();
                batch.insert(&part[0].bucket.to_be_bytes(), value);
                last = Some((part[0].bucket, part.len()));
            }
        };
        for run in sorted.chunk_by(|a, b| b.bucket == a.bucket + 1) {
            let (first, last) = (run[0].bucket, run[run.len() - 1].bucket);
            if !self.any_committed(first, last)? {
                write(run);
                continue;
            }
            // Some are committed already: a commit is final, so those stay as they are.
            let mut fresh = Vec::new();
            for c in run {
                if self.commit_run_of(c.bucket)?.is_none() {
                    fresh.push(*c);
                }
            }
            for part in fresh.chunk_by(|a, b| b.bucket == a.bucket + 1) {
                write(part);
            }
        }
        t.commits.apply_batch(batch).map_err(|e| self.err(e))?;
        self.wrote(bytes);
        // The next commit checks the run before its buckets: usually this one. Keep it, as
        // `commit_run_of` would (new runs never change an existing one).
        if let Some((first, len)) = last {
            let steady =
                generation % 2 == 0 && self.runs_rewritten.load(Ordering::Acquire) == generation;
            if let (true, Ok(at)) = (steady, sorted.binary_search_by_key(&first, |c| c.bucket)) {
                let run: Vec<CommitRecord> =
                    sorted[at..at + len].iter().map(|c| (*c).clone()).collect();
                self.cache().run = Some((generation, first, Arc::new(run)));
            }
        }
        let highest = commits.iter().map(|c| c.bucket + 1).max().unwrap_or(0);
        self.written.committed.fetch_max(highest, Ordering::AcqRel);
        Ok(())
    }

    /// The stored job (see [`Store::job`]).
    pub(super) fn read_job(&self) -> Result<Option<StoredJob>, StoreError> {
        let t = self.t()?;
        let Some(spec) = t.meta.get("job").map_err(|e| self.err(e))? else {
            return Ok(None);
        };
        let version = match t.meta.get("job_version").map_err(|e| self.err(e))? {
            Some(v) => <[u8; 4]>::try_from(v.as_ref())
                .map(u32::from_be_bytes)
                .map_err(|_| self.corrupt("its job record's version is undecodable"))?,
            // Stores written before the spec was opaque hold version 1.
            None => 1,
        };
        let id = match t.meta.get("job_id").map_err(|e| self.err(e))? {
            Some(id) => String::from_utf8(id.to_vec())
                .map_err(|_| self.corrupt("its job id is not UTF-8"))?,
            // Before, the id was only inside the spec (version 1: JSON with a `job_id`).
            None => {
                #[derive(Deserialize)]
                struct Id {
                    job_id: String,
                }
                self.decode::<Id>("job", &spec)?.job_id
            }
        };
        Ok(Some(StoredJob {
            id,
            version,
            spec: spec.to_vec(),
        }))
    }
}
