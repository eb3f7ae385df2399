//! The encodings of the offset log and the commit log in sled: segments (consecutive buckets
//! planned together), runs of commit records, the binary ID lists, rerun keys, and JSON values.
//! Older formats' values (one record per bucket) decode as a segment or run of one.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::*;

/// The most buckets one commit log record holds: readers decode a whole run to find one
/// bucket, and a background checkpoint can commit tens of thousands of one-row buckets.
pub(super) const MAX_COMMIT_RUN: usize = 256;

/// A commit log value: a run of consecutive buckets, or a format 1 record of one bucket.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum CommitValue {
    Run(Vec<CommitRecord>),
    Bucket(CommitRecord),
}

/// One offset log record (format 2): consecutive buckets planned together from one input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Segment {
    pub(super) first: u64,
    pub(super) input: Fingerprint,
    pub(super) planned_at_ms: u64,
    /// Where the first bucket's first row starts.
    pub(super) start: Cursor,
    /// Per bucket, in order: where the row after it starts (byte, line, row), then its unique
    /// IDs, duplicate rows and bad lines.
    pub(super) buckets: Vec<[u64; 6]>,
}

/// An offset log value: a segment, or a format 1 record of one bucket.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum OffsetValue {
    Segment(Segment),
    Bucket(OffsetRecord),
}

impl Segment {
    /// Split planned buckets into runs that can share a segment: consecutive bucket numbers,
    /// each starting where the one before ended, from the same input.
    pub(super) fn runs(buckets: &[PlannedBucket]) -> impl Iterator<Item = &[PlannedBucket]> {
        buckets.chunk_by(|a, b| {
            b.offset.bucket == a.offset.bucket + 1
                && b.offset.start == a.offset.end
                && b.offset.input == a.offset.input
        })
    }

    /// The segment of a run (from [`Segment::runs`], so never empty).
    pub(super) fn of(run: &[PlannedBucket]) -> Segment {
        let first = &run[0].offset;
        Segment {
            first: first.bucket,
            input: first.input,
            planned_at_ms: first.planned_at_ms,
            start: first.start,
            buckets: run
                .iter()
                .map(|b| {
                    let o = &b.offset;
                    [
                        o.end.byte,
                        o.end.line,
                        o.end.row,
                        o.items,
                        o.duplicates,
                        o.bad_lines,
                    ]
                })
                .collect(),
        }
    }

    pub(super) fn of_record(o: OffsetRecord) -> Segment {
        Segment {
            first: o.bucket,
            input: o.input,
            planned_at_ms: o.planned_at_ms,
            start: o.start,
            buckets: vec![[
                o.end.byte,
                o.end.line,
                o.end.row,
                o.items,
                o.duplicates,
                o.bad_lines,
            ]],
        }
    }

    pub(super) fn last(&self) -> u64 {
        self.first + self.buckets.len() as u64 - 1
    }

    pub(super) fn contains(&self, bucket: u64) -> bool {
        (self.first..=self.last()).contains(&bucket)
    }

    /// Each bucket's offset record.
    pub(super) fn offsets(&self) -> impl Iterator<Item = OffsetRecord> + '_ {
        let mut start = self.start;
        self.buckets
            .iter()
            .zip(self.first..)
            .map(move |(b, bucket)| {
                let [byte, line, row, items, duplicates, bad_lines] = *b;
                let end = Cursor { byte, line, row };
                let offset = OffsetRecord {
                    bucket,
                    start,
                    end,
                    items,
                    duplicates,
                    bad_lines,
                    input: self.input,
                    planned_at_ms: self.planned_at_ms,
                };
                start = end;
                offset
            })
    }

    /// The offset record of `bucket`, which the segment [contains](Segment::contains).
    pub(super) fn offset(&self, bucket: u64) -> OffsetRecord {
        self.offsets()
            .nth((bucket - self.first) as usize)
            .expect("the segment contains the bucket")
    }
}

pub(super) fn rerun_key(rerun: u32, bucket: u64) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&rerun.to_be_bytes());
    key[4..].copy_from_slice(&bucket.to_be_bytes());
    key
}

/// One entry of an ID list: the ID's row, the ID, and its input row's kept columns (a JSON
/// object) when the job keeps any.
pub(super) type Listed = (u64, String, Option<Box<str>>);

/// The length field's top bit: the entry's ID is followed by its row's values
/// (`[length u32 LE][values]`). Lists of jobs that keep no columns never set it: they are
/// written as before it existed.
const WITH_VALUES: u32 = 1 << 31;

/// An ID list: `[row u64 LE][length u32 LE][ID]`, then the values if the length says so.
/// `values` is empty (no columns kept) or holds one JSON object per item.
pub(super) fn encode_ids<'a>(
    items: impl IntoIterator<Item = &'a (u64, String)> + Clone,
    values: impl IntoIterator<Item = &'a String>,
) -> Vec<u8> {
    let size = items.clone().into_iter().map(|(_, id)| 12 + id.len()).sum();
    let mut out = Vec::with_capacity(size);
    let mut values = values.into_iter();
    for (row, id) in items {
        let value = values.next();
        let flag = if value.is_some() { WITH_VALUES } else { 0 };
        out.extend_from_slice(&row.to_le_bytes());
        out.extend_from_slice(&(id.len() as u32 | flag).to_le_bytes());
        out.extend_from_slice(id.as_bytes());
        if let Some(value) = value {
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value.as_bytes());
        }
    }
    out
}

pub(super) fn decode_ids(mut blob: &[u8]) -> Option<Vec<Listed>> {
    let mut out = Vec::new();
    while !blob.is_empty() {
        let row = u64::from_le_bytes(blob.get(..8)?.try_into().ok()?);
        let len = u32::from_le_bytes(blob.get(8..12)?.try_into().ok()?);
        let (len, with_values) = ((len & !WITH_VALUES) as usize, len & WITH_VALUES != 0);
        let id = std::str::from_utf8(blob.get(12..12 + len)?).ok()?;
        blob = &blob[12 + len..];
        let values = if with_values {
            let vlen = u32::from_le_bytes(blob.get(..4)?.try_into().ok()?) as usize;
            let v = std::str::from_utf8(blob.get(4..4 + vlen)?).ok()?;
            blob = &blob[4 + vlen..];
            Some(v.into())
        } else {
            None
        };
        out.push((row, id.to_owned(), values));
    }
    Some(out)
}

pub(super) fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("store records always serialize")
}

impl SledStore {
    pub(super) fn decode<T: DeserializeOwned>(
        &self,
        what: &str,
        bytes: &[u8],
    ) -> Result<T, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| {
            StoreError::at(
                self.path.display(),
                StoreError::Corrupt {
                    reason: format!("undecodable {what} record: {e}"),
                },
            )
        })
    }

    pub(super) fn get<T: DeserializeOwned>(
        &self,
        tree: &sled::Tree,
        key: &[u8],
        what: &str,
    ) -> Result<Option<T>, StoreError> {
        match tree.get(key).map_err(|e| self.err(e))? {
            None => Ok(None),
            Some(bytes) => self.decode(what, &bytes).map(Some),
        }
    }

    pub(super) fn decode_all<T: DeserializeOwned>(
        &self,
        iter: sled::Iter,
        what: &str,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        for entry in iter {
            let (_, v) = entry.map_err(|e| self.err(e))?;
            out.push(self.decode(what, &v)?);
        }
        Ok(out)
    }

    pub(super) fn segment(&self, key: &[u8], value: &[u8]) -> Result<Segment, StoreError> {
        let corrupt =
            |reason: String| StoreError::at(self.path.display(), StoreError::Corrupt { reason });
        let segment = match serde_json::from_slice::<OffsetValue>(value) {
            Ok(OffsetValue::Segment(s)) => s,
            Ok(OffsetValue::Bucket(o)) => Segment::of_record(o),
            // Say what is wrong with it as a segment (untagged enums only say "no variant").
            Err(_) => self.decode::<Segment>("offset", value)?,
        };
        if segment.buckets.is_empty() || key != segment.first.to_be_bytes() {
            return Err(corrupt(format!(
                "the offset record under key {key:02x?} is for buckets {}..{}",
                segment.first,
                segment.first + segment.buckets.len() as u64
            )));
        }
        Ok(segment)
    }

    /// Decode a commit log entry: its first bucket and the records of its run.
    pub(super) fn commit_run(
        &self,
        key: &[u8],
        value: &[u8],
    ) -> Result<(u64, Vec<CommitRecord>), StoreError> {
        let corrupt =
            |reason: String| StoreError::at(self.path.display(), StoreError::Corrupt { reason });
        let first = <[u8; 8]>::try_from(key)
            .map(u64::from_be_bytes)
            .map_err(|_| corrupt(format!("a commit record has the key {key:02x?}")))?;
        let run = match serde_json::from_slice::<CommitValue>(value) {
            Ok(CommitValue::Run(run)) => run,
            Ok(CommitValue::Bucket(c)) => vec![c],
            Err(_) => self.decode::<Vec<CommitRecord>>("commit", value)?,
        };
        let consecutive = run
            .iter()
            .zip(first..)
            .all(|(c, bucket)| c.bucket == bucket);
        if run.is_empty() || !consecutive {
            return Err(corrupt(format!(
                "the commit record under bucket {first} is not a run of buckets from {first}"
            )));
        }
        Ok((first, run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_lists_carry_values_only_when_kept_and_old_lists_read_as_before() {
        let items = [(3, "a".to_string()), (9, "é/b".to_string())];
        let plain = encode_ids(&items, &[]);
        // The entries as every format wrote them: row, length, ID.
        let mut old = Vec::new();
        for (row, id) in &items {
            old.extend_from_slice(&row.to_le_bytes());
            old.extend_from_slice(&(id.len() as u32).to_le_bytes());
            old.extend_from_slice(id.as_bytes());
        }
        assert_eq!(plain, old, "a list without values is written as before");
        let back = decode_ids(&old).unwrap();
        assert_eq!(
            back,
            vec![(3, "a".to_string(), None), (9, "é/b".to_string(), None)]
        );
        let values = [r#"{"n":"x"}"#.to_string(), r#"{"n":"é"}"#.to_string()];
        let with = encode_ids(&items, &values);
        assert_eq!(
            decode_ids(&with).unwrap(),
            vec![
                (3, "a".to_string(), Some(values[0].as_str().into())),
                (9, "é/b".to_string(), Some(values[1].as_str().into())),
            ]
        );
        assert!(decode_ids(&with[..with.len() - 1]).is_none(), "a cut entry");
    }
}
