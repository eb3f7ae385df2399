//! Group entries of the results log: the records of one append framed together, and the
//! positions that point into them.
//!
//! A group entry is a results log entry (`[length u32 LE][CRC-32 u32 LE][payload]`, see
//! [`results_log`](super::results_log)) whose length field has its two top bits set
//! ([`GROUP`]); its payload is the group's records one after the other, each
//! `[zigzag(row − previous row) varint][record length varint][record bytes]` (the previous
//! row of the first is 0). So the 8-byte header and the checksum are paid once per group,
//! not per record. A group holds at most [`MAX_RECORDS`] records and closes once its
//! payload reaches [`MAX_BYTES`] (a single record may be larger), so reading one record
//! reads and checks a few kilobytes, not a whole append.
//!
//! A group keeps no check of its records' IDs, only their rows: the ID index checks an ID's
//! row against the ID lists before the results log is asked, and a position pointing at
//! another row's record is still caught by its row.
//!
//! A position ([`Pos`]) is where a row's current record is: the offset of an entry of the
//! builds before groups (top bit clear), or a group's offset and the record's index in it
//! (top bit set). Both kinds live side by side in one positions file: an older log is read
//! as it is, never converted.

/// The length field's bits marking a group entry (the compact bit and the one below it).
pub(super) const GROUP: u32 = 3 << 30;
/// An entry's header in the results log, a group's as any other's: its payload's length
/// and its checksum.
pub(super) const HEADER: usize = 8;
/// The largest payload a group entry's length field holds.
pub(super) const MAX_LEN: usize = (1 << 30) - 1;
/// The most records in one group.
pub(super) const MAX_RECORDS: usize = 256;
/// A group closes once its payload reaches this.
pub(super) const MAX_BYTES: usize = 32 << 10;

/// A position's top bit: in a group.
const IN_GROUP: u64 = 1 << 63;
/// Bits of a position holding the record's index in its group.
const INDEX_BITS: u32 = 16;
/// Groups must start below this offset (128 TiB) to be pointed at.
pub(super) const MAX_GROUP_OFFSET: u64 = 1 << (63 - INDEX_BITS);
const _: () = assert!(MAX_RECORDS < 1 << INDEX_BITS);

/// Where a row's current record is (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pos {
    /// An entry of one record, as builds before groups wrote it, at this log offset.
    Entry(u64),
    /// Record `index` of the group entry at `at`.
    Grouped { at: u64, index: u16 },
}

impl Pos {
    /// The position as a u64 (what the positions file keeps, plus one).
    pub(super) fn to_u64(self) -> u64 {
        match self {
            Pos::Entry(at) => at,
            Pos::Grouped { at, index } => IN_GROUP | at << INDEX_BITS | u64::from(index),
        }
    }

    pub(super) fn from_u64(v: u64) -> Pos {
        if v & IN_GROUP == 0 {
            Pos::Entry(v)
        } else {
            Pos::Grouped {
                at: (v & !IN_GROUP) >> INDEX_BITS,
                index: v as u16,
            }
        }
    }

    /// The log offset of the entry holding the record.
    pub(super) fn entry(self) -> u64 {
        match self {
            Pos::Entry(at) | Pos::Grouped { at, .. } => at,
        }
    }
}

/// Encodes records into group entries in a buffer.
pub(super) struct GroupWriter<'a> {
    buf: &'a mut Vec<u8>,
    /// Where the open group's header starts in `buf`, and its records so far.
    open: Option<(usize, usize)>,
    previous: u64,
}

impl<'a> GroupWriter<'a> {
    pub(super) fn new(buf: &'a mut Vec<u8>) -> Self {
        GroupWriter {
            buf,
            open: None,
            previous: 0,
        }
    }

    /// Add a record; returns where in `buf` its group starts and its index in it.
    pub(super) fn push(&mut self, row: u64, record: &[u8]) -> Result<(usize, u16), String> {
        let (start, count) = match self.open {
            Some(open) => open,
            None => {
                let start = self.buf.len();
                self.buf.extend_from_slice(&[0; HEADER]);
                self.previous = 0;
                (start, 0)
            }
        };
        let delta = super::varint::zigzag(row.wrapping_sub(self.previous) as i64);
        super::varint::put(self.buf, delta);
        super::varint::put(self.buf, record.len() as u64);
        self.buf.extend_from_slice(record);
        self.previous = row;
        let count = count + 1;
        let payload = self.buf.len() - start - HEADER;
        if payload > MAX_LEN {
            return Err(format!(
                "a record of {} bytes is too large for the results log",
                record.len()
            ));
        }
        self.open = Some((start, count));
        if count == MAX_RECORDS || payload >= MAX_BYTES {
            self.close();
        }
        Ok((start, (count - 1) as u16))
    }

    /// Where in `buf` the group of the next record pushed starts (the open one, or a new one
    /// at the end): a record can point at records before it relative to its own group.
    pub(super) fn next_start(&self) -> usize {
        self.open.map_or(self.buf.len(), |(start, _)| start)
    }

    /// Close the open group (if any): write its header.
    pub(super) fn close(&mut self) {
        let Some((start, _)) = self.open.take() else {
            return;
        };
        let header = HEADER;
        let payload = &self.buf[start + header..];
        let (len, crc) = (payload.len() as u32, crc32fast::hash(payload));
        self.buf[start..start + 4].copy_from_slice(&(len | GROUP).to_le_bytes());
        self.buf[start + 4..start + header].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A group entry's records: each one's row and where its bytes are in `payload`. None if the
/// payload does not parse (cut short, or a record running past its end), or holds more
/// records than a group may.
pub(super) fn records(payload: &[u8]) -> Option<Vec<(u64, std::ops::Range<usize>)>> {
    let mut out = Vec::new();
    let mut rest = payload;
    let mut row = 0u64;
    while !rest.is_empty() {
        let (delta, after) = super::varint::get(rest)?;
        let (len, after) = super::varint::get(after)?;
        let len = usize::try_from(len).ok().filter(|l| *l <= after.len())?;
        row = row.wrapping_add(super::varint::unzigzag(delta) as u64);
        let start = payload.len() - after.len();
        out.push((row, start..start + len));
        rest = &after[len..];
        if out.len() > MAX_RECORDS {
            return None;
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_of_both_kinds_round_trip_through_u64() {
        for pos in [
            Pos::Entry(0),
            Pos::Entry(MAX_GROUP_OFFSET * 4),
            Pos::Grouped { at: 0, index: 0 },
            Pos::Grouped {
                at: MAX_GROUP_OFFSET - 1,
                index: (MAX_RECORDS - 1) as u16,
            },
        ] {
            assert_eq!(Pos::from_u64(pos.to_u64()), pos);
            // The positions file keeps the value plus one (0: none).
            assert!(pos.to_u64().checked_add(1).is_some());
        }
    }

    #[test]
    fn records_split_into_groups_that_parse_back() {
        let mut buf = Vec::new();
        let mut w = GroupWriter::new(&mut buf);
        let rows: Vec<u64> = (0..600).map(|i| (i * 7919) % 1000).collect();
        let mut placed = Vec::new();
        for &row in &rows {
            let record = vec![row as u8; (row % 50) as usize];
            placed.push(w.push(row, &record).unwrap());
        }
        w.close();
        // 600 small records: groups of 256, 256 and 88.
        let starts: Vec<usize> = placed.iter().map(|p| p.0).collect();
        let mut groups = starts.clone();
        groups.dedup();
        assert_eq!(groups.len(), 3);
        for (i, (&row, &(start, index))) in rows.iter().zip(&placed).enumerate() {
            let header = super::HEADER;
            let field = u32::from_le_bytes(buf[start..start + 4].try_into().unwrap());
            assert_eq!(field & GROUP, GROUP);
            let len = (field & !GROUP) as usize;
            let payload = &buf[start + header..start + header + len];
            let crc = u32::from_le_bytes(buf[start + 4..start + 8].try_into().unwrap());
            assert_eq!(crc32fast::hash(payload), crc);
            let parsed = records(payload).unwrap();
            let (got, range) = parsed[index as usize].clone();
            assert_eq!(got, row, "record {i}");
            assert_eq!(payload[range], vec![row as u8; (row % 50) as usize][..]);
        }
        // A big record closes its group at once.
        let mut buf = Vec::new();
        let mut w = GroupWriter::new(&mut buf);
        assert_eq!(w.push(5, &vec![1; MAX_BYTES]).unwrap(), (0, 0));
        let (second, _) = w.push(6, b"x").unwrap();
        assert!(second > MAX_BYTES);
    }

    #[test]
    fn a_cut_or_overlong_payload_does_not_parse() {
        let mut buf = Vec::new();
        let mut w = GroupWriter::new(&mut buf);
        w.push(3, b"abc").unwrap();
        w.push(1, b"de").unwrap();
        w.close();
        let payload = &buf[8..];
        assert_eq!(
            records(payload).unwrap(),
            vec![(3, 2..5), (1, 7..9)],
            "rows go back as well as forward"
        );
        // Cut inside a record, it does not parse; cut between records it would, which is why
        // the entry's length and checksum cover the whole group.
        for cut in (1..payload.len()).filter(|&cut| cut != 5) {
            let parsed = records(&payload[..cut]);
            assert!(parsed.is_none(), "cut at {cut}: {parsed:?}");
        }
        assert!(records(&[]).is_none());
    }
}
