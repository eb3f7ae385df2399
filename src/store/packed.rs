//! Packed encodings of the embedded store: the few binary values it keeps many of.
//!
//! Owns three byte formats, each a plain sequence of fixed-width little-endian fields, so a
//! reader can skip to one entry without decoding the others:
//!
//! - **ID lists** (a segment's or rerun bucket's unique IDs): per ID, its row (u64), its
//!   length (u32) and its UTF-8 bytes;
//! - **result chunks** (the final records of consecutive rows, folded together once their
//!   buckets are committed): per record, its row (u64), its length (u32) and its JSON;
//! - **ID index groups** (every planned ID, by a hash of the ID): per ID, the low 32 bits of
//!   its hash, its bucket (u64) and its row (u64). A group holds the IDs whose hash starts
//!   with the same bits; a match is only a candidate, confirmed against the ID list.
//!
//! Decoders return `None` on a truncated or malformed value: the store reports it as corrupt.

/// Bytes of one index entry: hash (u32), bucket (u64), row (u64).
pub const ENTRY_LEN: usize = 20;

/// Encode (row, bytes) pairs: ID lists and result chunks share the framing.
pub fn encode<'a, B: AsRef<[u8]> + 'a>(items: impl IntoIterator<Item = (u64, &'a B)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (row, bytes) in items {
        push(&mut out, row, bytes.as_ref());
    }
    out
}

/// Append one (row, bytes) pair.
pub fn push(out: &mut Vec<u8>, row: u64, bytes: &[u8]) {
    out.extend_from_slice(&row.to_le_bytes());
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A value that is truncated or not in its format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// Iterate (row, bytes) pairs; an `Err` item ends a malformed value.
pub fn entries(mut blob: &[u8]) -> impl Iterator<Item = Result<(u64, &[u8]), Malformed>> {
    std::iter::from_fn(move || {
        if blob.is_empty() {
            return None;
        }
        let next = (|| {
            let row = u64::from_le_bytes(blob.get(..8)?.try_into().ok()?);
            let len = u32::from_le_bytes(blob.get(8..12)?.try_into().ok()?) as usize;
            let bytes = blob.get(12..12 + len)?;
            Some((row, bytes, 12 + len))
        })();
        match next {
            Some((row, bytes, used)) => {
                blob = &blob[used..];
                Some(Ok((row, bytes)))
            }
            None => {
                blob = &[];
                Some(Err(Malformed))
            }
        }
    })
}

/// Decode a whole ID list.
pub fn decode_ids(blob: &[u8]) -> Option<Vec<(u64, String)>> {
    entries(blob)
        .map(|e| {
            let (row, bytes) = e.ok()?;
            Some((row, std::str::from_utf8(bytes).ok()?.to_owned()))
        })
        .collect()
}

/// The bytes stored for `row`, without decoding the others. `Err` if the value is malformed.
pub fn find(blob: &[u8], row: u64) -> Result<Option<&[u8]>, Malformed> {
    for entry in entries(blob) {
        let (r, bytes) = entry?;
        if r == row {
            return Ok(Some(bytes));
        }
        if r > row {
            break;
        }
    }
    Ok(None)
}

/// The hash an ID is indexed by.
pub fn hash(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(id.as_bytes())
}

/// The index group of a hash, with `bits` bits of groups (1..=32).
pub fn group(hash: u64, bits: u8) -> [u8; 4] {
    ((hash >> (64 - u32::from(bits))) as u32).to_be_bytes()
}

/// One index entry.
pub fn entry(hash: u64, bucket: u64, row: u64) -> [u8; ENTRY_LEN] {
    let mut e = [0u8; ENTRY_LEN];
    e[..4].copy_from_slice(&(hash as u32).to_le_bytes());
    e[4..12].copy_from_slice(&bucket.to_le_bytes());
    e[12..].copy_from_slice(&row.to_le_bytes());
    e
}

/// The (bucket, row) of each entry of a group whose hash matches. `None`: malformed.
pub fn candidates(group: &[u8], hash: u64) -> Option<Vec<(u64, u64)>> {
    if group.len() % ENTRY_LEN != 0 {
        return None;
    }
    let want = (hash as u32).to_le_bytes();
    Some(
        group
            .chunks_exact(ENTRY_LEN)
            .filter(|e| e[..4] == want)
            .map(|e| {
                (
                    u64::from_le_bytes(e[4..12].try_into().expect("8 bytes")),
                    u64::from_le_bytes(e[12..].try_into().expect("8 bytes")),
                )
            })
            .collect(),
    )
}

/// A group with `new` entries added, each once (re-planning a batch after a crash writes
/// the same entries again). `None`: the old group is malformed.
pub fn extend_group(old: Option<&[u8]>, new: &[[u8; ENTRY_LEN]]) -> Option<Vec<u8>> {
    let old = old.unwrap_or_default();
    if old.len() % ENTRY_LEN != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(old.len() + new.len() * ENTRY_LEN);
    out.extend_from_slice(old);
    for e in new {
        if !out.chunks_exact(ENTRY_LEN).any(|have| have == e) {
            out.extend_from_slice(e);
        }
    }
    Some(out)
}

/// Index bits for about `ids` IDs: about 16 IDs per group at that size, so a group stays a
/// few hundred bytes and the index a small fraction of the IDs in keys.
pub fn bits_for(ids: u64) -> u8 {
    let groups = (ids / 16).max(1);
    let bits = 64 - groups.leading_zeros() as u8;
    bits.clamp(12, 26)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip_and_find_one_row() {
        let ids = [(3u64, "a/b?c"), (5, ""), (9, "é ü")];
        let blob = encode(ids.iter().map(|(r, s)| (*r, s)));
        let back = decode_ids(&blob).unwrap();
        assert_eq!(
            back,
            ids.iter()
                .map(|(r, s)| (*r, s.to_string()))
                .collect::<Vec<_>>()
        );
        assert_eq!(find(&blob, 9).unwrap(), Some("é ü".as_bytes()));
        assert_eq!(find(&blob, 5).unwrap(), Some(&b""[..]));
        assert_eq!(find(&blob, 4).unwrap(), None);
        assert!(decode_ids(&blob[..blob.len() - 1]).is_none());
        assert!(find(&blob[..blob.len() - 1], 9).is_err());
    }

    #[test]
    fn groups_hold_each_entry_once_and_match_by_hash() {
        let h = hash("x");
        let e1 = entry(h, 1, 10);
        let e2 = entry(h ^ 1, 2, 20);
        let g = extend_group(None, &[e1, e2]).unwrap();
        let g = extend_group(Some(&g), &[e1]).unwrap();
        assert_eq!(g.len(), 2 * ENTRY_LEN);
        assert_eq!(candidates(&g, h).unwrap(), vec![(1, 10)]);
        assert_eq!(candidates(&g, h ^ 1).unwrap(), vec![(2, 20)]);
        assert!(candidates(&g[1..], h).is_none());
        assert_eq!(group(u64::MAX, 12), 4095u32.to_be_bytes());
        assert_eq!(bits_for(0), 12);
        assert_eq!(bits_for(10_000_000), 20);
    }
}
