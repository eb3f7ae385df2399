//! Plan: cutting the input into buckets, deterministically.
//!
//! Owns the rule that makes a bucket: bucket N is the next `bucket_size` rows of the input
//! after bucket N-1 (so, read from the start, rows `[N*size, (N+1)*size)`), a pure function of
//! the input and the bucket size, never of timing. A row whose ID appeared in an earlier row is
//! a duplicate: it stays in its bucket's row range but is not called again. A row without a
//! usable ID stops planning with an error naming the file and line, or, with
//! `--skip-bad-lines`, is counted and recorded.
//!
//! Duplicates are judged by the store, which notes every ID read with its first row
//! ([`crate::store::Store::first_rows`]): an ID first read at an earlier row is a duplicate,
//! whether that row is in this batch, an earlier one or an earlier run.
//!
//! The planner only reads and decides; writing the planned buckets ahead of their work is the
//! engine's job (through [`crate::store::Store::plan`]).

use crate::clock::Clock;
use crate::input::{Fingerprint, InputError, InputReader};
use crate::store::{BadLine, OffsetRecord, PlannedBucket, PlannerState, Store, StoreError};

/// Errors while planning.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The input could not be read, or a row holds no usable ID.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Reads the input from the planner's position and cuts buckets.
pub(crate) struct Planner {
    reader: InputReader,
    state: PlannerState,
    bucket_size: u64,
    skip_bad_lines: bool,
    input: Fingerprint,
    /// What the buckets are stamped with.
    clock: Clock,
}

impl Planner {
    /// Start planning at `state` (the stored position) with an opened reader at that cursor.
    pub(crate) fn new(
        reader: InputReader,
        state: PlannerState,
        bucket_size: u64,
        skip_bad_lines: bool,
        input: Fingerprint,
    ) -> Planner {
        Planner {
            reader,
            state,
            bucket_size: bucket_size.max(1),
            skip_bad_lines,
            input,
            clock: Clock::system(),
        }
    }

    /// Stamp the buckets planned with `clock`'s time (the system's by default).
    pub(crate) fn stamped_by(self, clock: Clock) -> Planner {
        Planner { clock, ..self }
    }

    /// The position after the last bucket returned.
    pub(crate) fn state(&self) -> PlannerState {
        self.state
    }

    /// Cut whole buckets until at least `min_rows` rows are read or the input ends. Returns
    /// the buckets and the planner position after them; no buckets once the input is
    /// exhausted. Duplicates are judged by `store`, which notes every ID read: all the
    /// batch's IDs in one call.
    pub(crate) async fn next_batch(
        &mut self,
        store: &impl Store,
        min_rows: u64,
    ) -> Result<Vec<PlannedBucket>, PlanError> {
        let mut buckets = Vec::new();
        // Every ID read, with its row, the index of its bucket in `buckets` and its kept
        // columns.
        let mut read: Vec<(usize, u64, String, Option<String>)> = Vec::new();
        let mut rows = 0;
        // One time for the batch: it is written ahead as one record.
        let planned_at_ms = self.clock.now_ms();
        while rows < min_rows.max(1) && !self.state.exhausted {
            let start = self.reader.cursor();
            let mut bucket = PlannedBucket {
                offset: OffsetRecord {
                    bucket: self.state.next_bucket,
                    start,
                    end: start,
                    items: 0,
                    duplicates: 0,
                    bad_lines: 0,
                    input: self.input,
                    planned_at_ms,
                },
                items: Vec::new(),
                values: Vec::new(),
                bad_lines: Vec::new(),
            };
            let mut taken = 0;
            while taken < self.bucket_size {
                let Some(row) = self.reader.next_row()? else {
                    self.state.exhausted = true;
                    break;
                };
                taken += 1;
                match row.id {
                    // A row read makes its bucket non-empty: it is pushed below.
                    Ok(id) => read.push((buckets.len(), row.index, id, row.values)),
                    Err(reason) if self.skip_bad_lines => {
                        // A line number alone does not say which file of a folder.
                        let reason = match self.reader.file_in_folder() {
                            Some(file) => format!("{file}: {reason}"),
                            None => reason,
                        };
                        bucket.offset.bad_lines += 1;
                        bucket.bad_lines.push(BadLine {
                            row: row.index,
                            line: row.line,
                            reason,
                        });
                    }
                    Err(reason) => {
                        return Err(InputError::BadLine {
                            path: self.reader.path().to_owned(),
                            line: row.line,
                            reason: format!(
                                "{reason} (use {} to skip and record such lines)",
                                crate::setting::Setting::SkipBadLines
                            ),
                        }
                        .into())
                    }
                }
            }
            rows += taken;
            if taken > 0 {
                bucket.offset.end = self.reader.cursor();
                self.state.next_bucket += 1;
                buckets.push(bucket);
            }
            self.state.cursor = self.reader.cursor();
        }
        let ids: Vec<(u64, &str)> = read
            .iter()
            .map(|(_, row, id, _)| (*row, id.as_str()))
            .collect();
        let firsts = store.first_rows(&ids).await?;
        drop(ids);
        for ((at, row, id, values), first) in read.into_iter().zip(firsts) {
            let bucket: &mut PlannedBucket = &mut buckets[at];
            if first.is_some() {
                bucket.offset.duplicates += 1;
            } else {
                bucket.items.push((row, id));
                // The reader gives values for every row with an ID, or for none.
                bucket.values.extend(values);
            }
        }
        for bucket in &mut buckets {
            bucket.offset.items = bucket.items.len() as u64;
        }
        Ok(buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{Cursor, InputFormat, InputSpec};
    use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};
    use std::io::Write;

    fn setup(content: &str) -> (tempfile::TempDir, InputSpec, SledStore) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(content.as_bytes())
            .unwrap();
        let store = SledStore::open(
            &dir.path().join("state"),
            OpenMode::CreateIfMissing,
            DEFAULT_CACHE_BYTES,
        )
        .unwrap();
        (
            dir,
            InputSpec {
                path,
                format: InputFormat::Text,
            },
            store,
        )
    }

    fn fp() -> Fingerprint {
        Fingerprint { len: 0, xxh3: 0 }
    }

    async fn cut_all(
        spec: &InputSpec,
        store: &SledStore,
        size: u64,
        min_rows: u64,
        state: PlannerState,
    ) -> Vec<PlannedBucket> {
        let reader = InputReader::open(spec, state.cursor).unwrap();
        let mut p = Planner::new(reader, state, size, true, fp());
        let mut all = vec![];
        loop {
            let batch = p.next_batch(store, min_rows).await.unwrap();
            if batch.is_empty() {
                break;
            }
            store.plan(&batch, &p.state()).await.unwrap();
            all.extend(batch);
        }
        assert!(p.state().exhausted);
        all
    }

    #[tokio::test]
    async fn buckets_are_fixed_row_ranges_and_duplicates_are_judged_in_order() {
        let (_d, spec, store) = setup("a\nb\na\n\nc\nd\nb\ne\n");
        let buckets = cut_all(&spec, &store, 3, 1, PlannerState::default()).await;
        let ranges: Vec<_> = buckets
            .iter()
            .map(|b| (b.offset.bucket, b.offset.start.row, b.offset.end.row))
            .collect();
        assert_eq!(ranges, vec![(0, 0, 3), (1, 3, 6), (2, 6, 7)]);
        let ids: Vec<Vec<&str>> = buckets
            .iter()
            .map(|b| b.items.iter().map(|i| i.1.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
        assert_eq!(buckets.iter().map(|b| b.offset.duplicates).sum::<u64>(), 2);
    }

    /// Plan `spec1` in one go and `spec2` (the same input, its own store) first `first_rows`
    /// rows, written ahead, then the rest from the stored position in small batches: the
    /// buckets (ranges, items, duplicates, bad lines) are the same. Returns them.
    async fn same_in_batches_or_resumed(
        (spec1, store1): (&InputSpec, &SledStore),
        (spec2, store2): (&InputSpec, &SledStore),
        first_rows: u64,
    ) -> Vec<PlannedBucket> {
        let one_go = cut_all(spec1, store1, 7, 1000, PlannerState::default()).await;
        let reader = InputReader::open(spec2, Cursor::default()).unwrap();
        let mut p = Planner::new(reader, PlannerState::default(), 7, true, fp());
        let first = p.next_batch(store2, first_rows).await.unwrap();
        store2.plan(&first, &p.state()).await.unwrap();
        let mut resumed = first;
        resumed.extend(cut_all(spec2, store2, 7, 3, p.state()).await);
        let key = |b: &PlannedBucket| {
            (
                b.offset.bucket,
                b.offset.start,
                b.offset.end,
                b.items.clone(),
                b.offset.duplicates,
                b.bad_lines.clone(),
            )
        };
        assert_eq!(
            one_go.iter().map(key).collect::<Vec<_>>(),
            resumed.iter().map(key).collect::<Vec<_>>()
        );
        one_go
    }

    #[tokio::test]
    async fn planning_in_batches_or_resumed_cuts_the_same_buckets() {
        let content: String = (0..100).map(|i| format!("id{}\n", i % 70)).collect();
        let (_d1, spec1, store1) = setup(&content);
        let (_d2, spec2, store2) = setup(&content);
        same_in_batches_or_resumed((&spec1, &store1), (&spec2, &store2), 10).await;
    }

    #[tokio::test]
    async fn a_parquet_input_planned_in_batches_or_resumed_cuts_the_same_buckets() {
        let ids: Vec<Option<&'static str>> = (0..300)
            .map(|i| match i {
                41 | 199 => None,
                i => Some(&*Box::leak(format!("id{}", i % 230).into_boxed_str())),
            })
            .collect();
        let groups = [
            ids[..100].to_vec(),
            ids[100..101].to_vec(),
            ids[101..].to_vec(),
        ];
        let parquet = |dir: &tempfile::TempDir| {
            let path = dir.path().join("in.parquet");
            crate::input::parquet_test_file::ids(&path, &groups, 16);
            InputSpec {
                path,
                format: InputFormat::Parquet {
                    column: "id".into(),
                },
            }
        };
        let (d1, _, store1) = setup("");
        let spec1 = parquet(&d1);
        let (d2, _, store2) = setup("");
        let spec2 = parquet(&d2);
        let one_go = same_in_batches_or_resumed((&spec1, &store1), (&spec2, &store2), 45).await;
        assert_eq!(one_go.len(), 43);
        let bad: Vec<_> = one_go.iter().flat_map(|b| b.bad_lines.clone()).collect();
        assert_eq!(
            bad,
            vec![
                BadLine {
                    row: 41,
                    line: 42,
                    reason: "ID is null".into()
                },
                BadLine {
                    row: 199,
                    line: 200,
                    reason: "ID is null".into()
                }
            ]
        );
        let duplicates: u64 = one_go.iter().map(|b| b.offset.duplicates).sum();
        // Rows 230.. repeat rows 0..70, but row 41 was null: its ID is first read at row 271.
        assert_eq!(duplicates, 69);
    }

    #[tokio::test]
    async fn bad_lines_stop_or_are_recorded() {
        let (_d, spec, store) = setup("a\n\u{0}\nb\n");
        std::fs::write(&spec.path, b"a\n\xff\nb\n").unwrap();
        let reader = InputReader::open(&spec, Cursor::default()).unwrap();
        let mut p = Planner::new(reader, PlannerState::default(), 10, false, fp());
        let err = p.next_batch(&store, 1).await.unwrap_err().to_string();
        assert!(
            err.contains("in.txt:2:") && err.contains("skip_bad_lines"),
            "{err}"
        );
        let buckets = cut_all(&spec, &store, 10, 1, PlannerState::default()).await;
        assert_eq!(
            buckets[0].bad_lines,
            vec![BadLine {
                row: 1,
                line: 2,
                reason: "line is not valid UTF-8".into()
            }]
        );
        assert_eq!(buckets[0].items.len(), 2);
    }
}
