//! LEB128 varints and zigzag, the integers of the compact on-disk encodings (item records,
//! results log entries, ID lists).

/// Append `v` as a LEB128 varint (1 byte below 128, at most 10).
pub(super) fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at the start of `bytes` and the bytes after it; `None` if it is cut short or
/// longer than 10 bytes.
pub(super) fn get(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, &b) in bytes.iter().take(10).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, &bytes[i + 1..]));
        }
    }
    None
}

/// A signed number as an unsigned one, small for small magnitudes.
pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The inverse of [`zigzag`].
pub(super) fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_cut_or_overlong_input() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put(&mut out, v);
            out.push(9);
            assert_eq!(get(&out), Some((v, &[9u8][..])));
            assert!(get(&out[..out.len() - 2]).is_none());
        }
        assert!(get(&[0x80; 11]).is_none());
        for v in [0, 1, -1, i64::MIN, i64::MAX, -300] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
    }
}
