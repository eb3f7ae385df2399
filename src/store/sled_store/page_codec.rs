//! A page's bytes in `pages.log` after its link (see [`pages_log`](super::pages_log)): its
//! bucket, where its ID's pages stand after it ([`PageMark`], but for the page's number,
//! which the link holds with the generation; the row is the log's) and its items, compressed
//! as the results' bodies are ([`Compression`]).
//!
//! ```text
//! bucket varint
//! count varint, items_before varint, attempts varint
//! flags u8      bit 0 a next request, 1 usage, 2 a first attempt time
//! [first attempt: zigzag(ms − EPOCH_MS) varint]
//! [usage: input varint, output varint]
//! [next request: length varint, its JSON]
//! codec u8 (compression::Codec), the items' raw length varint, the stored bytes to the end
//! ```
//!
//! So a page without a next request (its ID's last) costs 7 to 12 bytes around its items,
//! and one with a next request that much plus the request as JSON (a query parameter is
//! about 25 bytes).

use std::sync::Arc;

use serde_json::value::RawValue;

use super::compression::{Codec, Compression};
use super::varint;
use crate::handler::paginate::NextRequest;
use crate::meter::Usage;
use crate::store::{PageMark, PageRecord};

const NEXT: u8 = 1;
const USAGE: u8 = 1 << 1;
const FIRST_ATTEMPT: u8 = 1 << 2;
/// First attempt times are kept from here (as the item records' times are): 6 bytes, not 7.
const EPOCH_MS: i64 = 1_700_000_000_000;

/// Append the bytes of `page` to `out`, its items compressed by `bodies`.
pub(super) fn encode(page: &PageRecord, bodies: &Arc<Compression>, out: &mut Vec<u8>) {
    let mark = &page.mark;
    varint::put(out, page.bucket);
    varint::put(out, u64::from(mark.count));
    varint::put(out, mark.items_before);
    varint::put(out, u64::from(mark.attempts));
    let flag = |on: bool, bit: u8| if on { bit } else { 0 };
    out.push(
        flag(mark.next.is_some(), NEXT)
            | flag(mark.usage.is_some(), USAGE)
            | flag(mark.first_attempt_ms.is_some(), FIRST_ATTEMPT),
    );
    if let Some(ms) = mark.first_attempt_ms {
        let since = (ms as i64).wrapping_sub(EPOCH_MS);
        varint::put(out, varint::zigzag(since));
    }
    if let Some(usage) = mark.usage {
        varint::put(out, usage.input);
        varint::put(out, usage.output);
    }
    if let Some(next) = &mark.next {
        let json = serde_json::to_vec(next).expect("a next request serializes");
        varint::put(out, json.len() as u64);
        out.extend_from_slice(&json);
    }
    let items = page.items.get().as_bytes();
    let at = out.len();
    out.push(0);
    varint::put(out, items.len() as u64);
    out[at] = bodies.compress(items, out) as u8;
}

/// The page of `row` in `generation` numbered `page` whose bytes are `bytes`; what is wrong
/// with them if they do not decode.
pub(super) fn decode(
    bytes: &[u8],
    row: u64,
    generation: u32,
    page: u32,
    bodies: &Compression,
) -> Result<PageRecord, String> {
    let mut rest = bytes;
    let mut number = || -> Result<u64, String> {
        let (v, after) = varint::get(rest).ok_or("it is cut short")?;
        rest = after;
        Ok(v)
    };
    let small = |v: u64, what: &str| u32::try_from(v).map_err(|_| format!("its {what} is {v}"));
    let bucket = number()?;
    let count = small(number()?, "count")?;
    let items_before = number()?;
    let attempts = small(number()?, "attempts")?;
    let (&flags, after) = rest.split_first().ok_or("it is cut short")?;
    rest = after;
    if flags & !(NEXT | USAGE | FIRST_ATTEMPT) != 0 {
        return Err(format!("its flags {flags:#04x} are unknown"));
    }
    let mut number = || -> Result<u64, String> {
        let (v, after) = varint::get(rest).ok_or("it is cut short")?;
        rest = after;
        Ok(v)
    };
    let first_attempt_ms = if flags & FIRST_ATTEMPT != 0 {
        let ms = EPOCH_MS.checked_add(varint::unzigzag(number()?));
        Some(
            ms.and_then(|ms| u64::try_from(ms).ok())
                .ok_or("its first attempt time is out of range")?,
        )
    } else {
        None
    };
    let usage = if flags & USAGE != 0 {
        Some(Usage {
            input: number()?,
            output: number()?,
        })
    } else {
        None
    };
    let next = if flags & NEXT != 0 {
        let len = number()?;
        let json = usize::try_from(len)
            .ok()
            .and_then(|len| rest.get(..len))
            .ok_or("its next request is cut short")?;
        rest = &rest[json.len()..];
        let next: NextRequest = serde_json::from_slice(json)
            .map_err(|e| format!("its next request does not decode: {e}"))?;
        Some(next)
    } else {
        None
    };
    let (&codec, after) = rest.split_first().ok_or("it is cut short")?;
    let codec = Codec::from_byte(codec).ok_or("its items' codec is unknown")?;
    let (raw_len, stored) = varint::get(after).ok_or("it is cut short")?;
    let items = bodies
        .decompress(codec, stored, raw_len)
        .map_err(|e| e.replace("its body", "its items"))?;
    let items = String::from_utf8(items).map_err(|_| "its items are not UTF-8")?;
    let items = RawValue::from_string(items).map_err(|e| format!("its items are not JSON: {e}"))?;
    let mark = PageMark {
        page,
        count,
        items_before,
        next,
        attempts,
        usage,
        first_attempt_ms,
    };
    Ok(PageRecord {
        row,
        bucket,
        generation,
        mark,
        items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(
        next: Option<NextRequest>,
        usage: Option<Usage>,
        first: Option<u64>,
        items: &RawValue,
    ) -> PageRecord {
        PageRecord {
            row: 4,
            bucket: 300,
            generation: 2,
            mark: PageMark {
                page: 7,
                count: 3,
                items_before: 1_000_000,
                next,
                attempts: 9,
                usage,
                first_attempt_ms: first,
            },
            items: items.to_owned(),
        }
    }

    #[test]
    fn pages_round_trip_and_a_cut_never_decodes() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = Compression::open(dir.path(), None).unwrap();
        let long: Vec<_> = (0..200).map(|i| serde_json::json!({"id": i})).collect();
        let long = serde_json::value::to_raw_value(&long).unwrap();
        let short = serde_json::value::to_raw_value(&[1]).unwrap();
        let next = NextRequest::Query(vec![("cursor".into(), "abc".into())]);
        let usage = Usage {
            input: 5,
            output: 6,
        };
        let body_next = NextRequest::Body(vec![("p".into(), 3.into())]);
        for page in [
            page(None, None, None, &short),
            page(Some(next), None, Some(1), &long),
            page(
                Some(body_next),
                Some(usage),
                Some(1_765_000_000_000),
                &short,
            ),
        ] {
            let mut out = Vec::new();
            encode(&page, &bodies, &mut out);
            let got = decode(&out, 4, 2, 7, &bodies).unwrap();
            assert_eq!((got.row, got.bucket, got.generation), (4, 300, 2));
            assert_eq!(got.mark, page.mark);
            assert_eq!(got.items.get(), page.items.get());
            for cut in 0..out.len() {
                assert!(
                    decode(&out[..cut], 4, 2, 7, &bodies).is_err(),
                    "cut at {cut}"
                );
            }
        }
        // Without a next request: bucket (2 bytes), count, items before (3 bytes for a
        // million), attempts, flags, codec and length around the items.
        let mut out = Vec::new();
        encode(&page(None, None, None, &short), &bodies, &mut out);
        assert_eq!(out.len(), 2 + 1 + 3 + 1 + 1 + 1 + 1 + short.get().len());
    }
}
