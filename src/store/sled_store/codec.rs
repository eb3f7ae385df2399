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

/// The second word of a compact list's prefix: where a list of whole entries has its first
/// ID's length, which is never this.
const COMPACT_LIST: [u8; 4] = [0xff; 4];

/// An ID list, compact: `[first row u64 LE][ff ff ff ff]`, then per ID
/// `[zz(row - (previous row + 1)) varint][(length << 1 | has values) varint][ID]`, then the
/// values as `[length varint][values]` if it has them (about 2 bytes besides the ID where
/// whole entries took 12). `values` is empty (no columns kept) or holds one JSON object per
/// item. Lists of whole entries (`[row u64 LE][length u32 LE, top bit: values][ID]`, then
/// `[length u32 LE][values]`), as every build before wrote them, are still read.
pub(super) fn encode_ids<'a>(
    items: impl IntoIterator<Item = &'a (u64, String)> + Clone,
    values: impl IntoIterator<Item = &'a String>,
) -> Vec<u8> {
    let size = items
        .clone()
        .into_iter()
        .map(|(_, id)| 3 + id.len())
        .sum::<usize>()
        + 12;
    let mut out = Vec::with_capacity(size);
    let mut values = values.into_iter();
    let mut items = items.into_iter().peekable();
    let Some(&&(first, _)) = items.peek() else {
        return out;
    };
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&COMPACT_LIST);
    let mut next = first;
    for (row, id) in items {
        let value = values.next();
        let delta = row.wrapping_sub(next) as i64;
        super::varint::put(&mut out, super::varint::zigzag(delta));
        super::varint::put(
            &mut out,
            (id.len() as u64) << 1 | u64::from(value.is_some()),
        );
        out.extend_from_slice(id.as_bytes());
        if let Some(value) = value {
            super::varint::put(&mut out, value.len() as u64);
            out.extend_from_slice(value.as_bytes());
        }
        next = row.wrapping_add(1);
    }
    out
}

pub(super) fn decode_ids(blob: &[u8]) -> Option<Vec<Listed>> {
    if blob.get(8..12) == Some(&COMPACT_LIST[..]) {
        return decode_compact_ids(blob);
    }
    decode_whole_ids(blob)
}

fn decode_compact_ids(blob: &[u8]) -> Option<Vec<Listed>> {
    let mut next = u64::from_le_bytes(blob.get(..8)?.try_into().ok()?);
    let mut blob = &blob[12..];
    let mut out = Vec::new();
    while !blob.is_empty() {
        let delta = get_varint(&mut blob)?;
        let row = next.wrapping_add(super::varint::unzigzag(delta) as u64);
        let len = get_varint(&mut blob)?;
        let (len, with_values) = (usize::try_from(len >> 1).ok()?, len & 1 != 0);
        let id = std::str::from_utf8(blob.get(..len)?).ok()?;
        blob = &blob[len..];
        let values = if with_values {
            let vlen = usize::try_from(get_varint(&mut blob)?).ok()?;
            let v = std::str::from_utf8(blob.get(..vlen)?).ok()?;
            blob = &blob[vlen..];
            Some(v.into())
        } else {
            None
        };
        out.push((row, id.to_owned(), values));
        next = row.wrapping_add(1);
    }
    Some(out)
}

/// The length field's top bit in a list of whole entries: the ID is followed by its row's
/// values.
const WITH_VALUES: u32 = 1 << 31;

fn decode_whole_ids(mut blob: &[u8]) -> Option<Vec<Listed>> {
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

fn get_varint(blob: &mut &[u8]) -> Option<u64> {
    let (v, rest) = super::varint::get(blob)?;
    *blob = rest;
    Some(v)
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

    /// An item record from `results.log` (binary or JSON, see [`super::item_codec`]).
    pub(super) fn decode_item(&self, row: u64, bytes: &[u8]) -> Result<ItemRecord, StoreError> {
        super::item_codec::decode(bytes, row, &self.bodies)
            .map_err(|reason| self.corrupt(format!("undecodable item record: {reason}")))
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
        let items = [
            (3, "a".to_string()),
            (4, "é/b".to_string()),
            (9, "c".to_string()),
        ];
        let plain = encode_ids(&items, &[]);
        let expected: Vec<Listed> = items.iter().map(|(r, id)| (*r, id.clone(), None)).collect();
        assert_eq!(decode_ids(&plain).unwrap(), expected);
        assert_eq!(
            plain.len(),
            12 + 3 * 2 + 1 + 4 + 1,
            "two bytes besides each ID"
        );
        // The entries as every earlier build wrote them: row, length (top bit: values), ID.
        let values = [
            r#"{"n":"x"}"#.to_string(),
            r#"{"n":"é"}"#.to_string(),
            "{}".into(),
        ];
        let mut old = Vec::new();
        for ((row, id), v) in items.iter().zip(&values) {
            old.extend_from_slice(&row.to_le_bytes());
            old.extend_from_slice(&(id.len() as u32 | WITH_VALUES).to_le_bytes());
            old.extend_from_slice(id.as_bytes());
            old.extend_from_slice(&(v.len() as u32).to_le_bytes());
            old.extend_from_slice(v.as_bytes());
        }
        let with: Vec<Listed> = items
            .iter()
            .zip(&values)
            .map(|((r, id), v)| (*r, id.clone(), Some(v.as_str().into())))
            .collect();
        assert_eq!(decode_ids(&old).unwrap(), with);
        assert_eq!(decode_ids(&encode_ids(&items, &values)).unwrap(), with);
        // Rows out of order (never written so, but decoded as written) and a huge row.
        let odd = [
            (10, "x".to_string()),
            (2, "y".to_string()),
            (u64::MAX - 1, "z".to_string()),
        ];
        let back = decode_ids(&encode_ids(&odd, &[])).unwrap();
        assert_eq!(
            back.iter().map(|e| e.0).collect::<Vec<_>>(),
            [10, 2, u64::MAX - 1]
        );
        assert!(encode_ids(&[], &[]).is_empty());
        let compact = encode_ids(&items, &values);
        for cut in 1..compact.len() {
            let _ = decode_ids(&compact[..cut]); // never panics
        }
        assert!(
            decode_ids(&compact[..compact.len() - 1]).is_none(),
            "a cut entry"
        );
        assert!(decode_ids(&old[..old.len() - 1]).is_none(), "a cut entry");
    }
}
