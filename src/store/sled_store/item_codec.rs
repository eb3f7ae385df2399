//! The item record's bytes in `results.log`: a binary envelope around the compressed body
//! (format 5), and the JSON every earlier format wrote, which is still read.
//!
//! A binary record starts with its flags, whose status bits are never 3; a JSON record starts
//! with `{` (0x7b), whose low two bits are 3. Binary layout (varints are LEB128, `zz` a
//! zigzag varint):
//!
//! ```text
//! flags u8       bits 0-1 status (0 pending, 1 ok, 2 failed), 2 HTTP status other than
//!                200, 3 body, 4 extras, 5 latency, 6 rerun, 7 times
//! bucket varint, attempts varint
//! [HTTP status: varint if bit 2, else 200 if the body's codec byte says so (below)]
//! [times: finished, then first attempt and last attempt, each 0 = none or 1 + zz: finished
//!         in ms from EPOCH_MS, the attempts in ms before finished (or before EPOCH_MS
//!         without it); bit 7 is set when any of the three is]
//! [latency varint (ms)] [rerun varint]
//! [extras: length varint, JSON {class, error, attempt_errors, u}: rare (failures, retries),
//!  but for `u`, the usage [input, output] of a metered job's calls]
//! [body: codec u8 (compression::Codec; + 0x80: the HTTP status was 200), raw length varint,
//!  the stored bytes to the end]
//! [without a body: a last byte 0x80 if the HTTP status was 200]
//! ```
//!
//! About 12 bytes around the body where the JSON envelope took about 220. The row and the
//! ID are the results log's entry around it (a JSON record repeats the row), and the kept columns are read from the plan.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::compression::{Codec, Compression};
use super::varint::{self, put as varint, unzigzag, zigzag};
use crate::failure::{AttemptNote, ErrorClass};
use crate::store::{ItemRecord, ItemStatus};

/// A JSON record's first byte; a binary record's (its flags) never has both low bits set.
const JSON: u8 = b'{';
/// Added to the codec byte (or the last byte without a body): the HTTP status was 200.
const HTTP_200: u8 = 0x80;
/// Timestamps are kept from here (2023-11-14): five bytes until 2031.
const EPOCH_MS: i64 = 1_700_000_000_000;

const HTTP: u8 = 1 << 2;
const BODY: u8 = 1 << 3;
const EXTRAS: u8 = 1 << 4;
const LATENCY: u8 = 1 << 5;
const RERUN: u8 = 1 << 6;
const TIMES: u8 = 1 << 7;

/// What a record rarely has, kept as JSON.
#[derive(Serialize, Deserialize, Default)]
struct Extras {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    class: Option<ErrorClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    attempt_errors: Vec<AttemptNote>,
    /// The usage, input then output: on every record of a metered job (readers before it
    /// ignore it).
    #[serde(default, rename = "u", skip_serializing_if = "Option::is_none")]
    usage: Option<[u64; 2]>,
    /// The pages stored for a paginated ID (its result is their items).
    #[serde(default, rename = "p", skip_serializing_if = "Option::is_none")]
    pages: Option<u32>,
}

/// Append `record`'s bytes to `out`, its body compressed by `bodies`.
pub(super) fn encode(
    record: &ItemRecord,
    bodies: &std::sync::Arc<Compression>,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let status = match record.status {
        ItemStatus::Pending => 0,
        ItemStatus::Ok => 1,
        ItemStatus::Failed => 2,
    };
    let extras = record.class.is_some()
        || record.error.is_some()
        || !record.attempt_errors.is_empty()
        || record.usage.is_some()
        || record.pages.is_some();
    let times = [
        record.finished_at_ms,
        record.first_attempt_ms,
        record.last_attempt_ms,
    ];
    let times = times.iter().any(Option::is_some);
    // Checked before anything is written: a time out of range fails the write, whole.
    let encoded_times = if times {
        Some(encode_times(record)?)
    } else {
        None
    };
    let ok_200 = record.http_status == Some(200);
    let flags = status
        | flag(record.http_status.is_some() && !ok_200, HTTP)
        | flag(record.body.is_some(), BODY)
        | flag(extras, EXTRAS)
        | flag(record.latency_ms.is_some(), LATENCY)
        | flag(record.rerun.is_some(), RERUN)
        | flag(times, TIMES);
    out.push(flags);
    varint(out, record.bucket);
    varint(out, u64::from(record.attempts));
    if let Some(http) = record.http_status.filter(|_| !ok_200) {
        varint(out, u64::from(http));
    }
    for v in encoded_times.into_iter().flatten() {
        varint(out, v);
    }
    if let Some(latency) = record.latency_ms {
        varint(out, latency);
    }
    if let Some(rerun) = record.rerun {
        varint(out, u64::from(rerun));
    }
    if extras {
        let json = serde_json::to_vec(&Extras {
            class: record.class,
            error: record.error.clone(),
            attempt_errors: record.attempt_errors.clone(),
            usage: record.usage.map(|u| [u.input, u.output]),
            pages: record.pages,
        })
        .expect("extras serialize");
        varint(out, json.len() as u64);
        out.extend_from_slice(&json);
    }
    if let Some(body) = &record.body {
        let body = body.get().as_bytes();
        let at = out.len();
        out.push(0);
        varint(out, body.len() as u64);
        out[at] = bodies.compress(body, out) as u8 | flag(ok_200, HTTP_200);
    } else if ok_200 {
        out.push(HTTP_200);
    }
    Ok(())
}

/// The three time varints of `record` (see the module doc); an error if a time is too far
/// from the others (or from `EPOCH_MS`) to be kept.
fn encode_times(record: &ItemRecord) -> Result<[u64; 3], String> {
    let ms = |t: u64| i64::try_from(t).map_err(|_| format!("its time {t} ms is out of range"));
    let from = |base: i64, t: i64, what: &str| {
        t.checked_sub(base)
            .and_then(|d| zigzag(d).checked_add(1))
            .ok_or_else(|| format!("its {what} time {t} ms is out of range"))
    };
    let finished = record.finished_at_ms.map(ms).transpose()?;
    let base = finished.unwrap_or(EPOCH_MS);
    let mut out = [0; 3];
    if let Some(f) = finished {
        out[0] = from(EPOCH_MS, f, "finish")?;
    }
    for (slot, (at, what)) in out[1..].iter_mut().zip([
        (record.first_attempt_ms, "first attempt"),
        (record.last_attempt_ms, "last attempt"),
    ]) {
        if let Some(at) = at {
            // Kept as ms before `base` (usually a few): base - at.
            *slot = from(ms(at)?, base, what)?;
        }
    }
    Ok(out)
}

/// The record in `bytes` (binary or JSON) of the results log's entry for `row`; the error
/// says what is wrong.
pub(super) fn decode(bytes: &[u8], row: u64, bodies: &Compression) -> Result<ItemRecord, String> {
    if bytes.first() == Some(&JSON) {
        return serde_json::from_slice(bytes).map_err(|e| e.to_string());
    }
    let mut r = Reader { bytes, at: 0 };
    let flags = r.byte()?;
    let mut record = ItemRecord::pending(row, 0);
    record.status = match flags & 3 {
        0 => ItemStatus::Pending,
        1 => ItemStatus::Ok,
        2 => ItemStatus::Failed,
        _ => return Err("its status is unknown".into()),
    };
    record.bucket = r.varint()?;
    record.attempts = u32::try_from(r.varint()?).map_err(|_| "its attempts overflow")?;
    if flags & HTTP != 0 {
        record.http_status =
            Some(u16::try_from(r.varint()?).map_err(|_| "its HTTP status overflows")?);
    }
    if flags & TIMES != 0 {
        let time = |t: Option<i64>, what: &str| -> Result<u64, String> {
            t.and_then(|t| u64::try_from(t).ok())
                .ok_or_else(|| format!("its {what} time is out of range"))
        };
        let finished = match r.varint()? {
            0 => None,
            v => Some(time(EPOCH_MS.checked_add(unzigzag(v - 1)), "finish")?),
        };
        record.finished_at_ms = finished;
        // Checked above: a finish time fits in an i64.
        let base = finished.map_or(EPOCH_MS, |f| f as i64);
        let mut before = |what: &str| -> Result<Option<u64>, String> {
            Ok(match r.varint()? {
                0 => None,
                v => Some(time(base.checked_sub(unzigzag(v - 1)), what)?),
            })
        };
        record.first_attempt_ms = before("first attempt")?;
        record.last_attempt_ms = before("last attempt")?;
    }
    if flags & LATENCY != 0 {
        record.latency_ms = Some(r.varint()?);
    }
    if flags & RERUN != 0 {
        record.rerun = Some(u32::try_from(r.varint()?).map_err(|_| "its rerun overflows")?);
    }
    if flags & EXTRAS != 0 {
        let len = r.varint()? as usize;
        let extras: Extras =
            serde_json::from_slice(r.take(len)?).map_err(|e| format!("its extras: {e}"))?;
        record.class = extras.class;
        record.error = extras.error;
        record.attempt_errors = extras.attempt_errors;
        record.usage = extras
            .usage
            .map(|[input, output]| crate::meter::Usage { input, output });
        record.pages = extras.pages;
    }
    let last = if flags & BODY != 0 {
        let byte = r.byte()?;
        let codec = Codec::from_byte(byte & !HTTP_200).ok_or("its body's codec is unknown")?;
        let raw_len = r.varint()?;
        let body = bodies.decompress(codec, &bytes[r.at..], raw_len)?;
        let body = String::from_utf8(body).map_err(|_| "its body is not UTF-8")?;
        record.body =
            Some(RawValue::from_string(body).map_err(|e| format!("its body is not JSON: {e}"))?);
        byte
    } else {
        let byte = bytes.get(r.at).copied();
        if r.at + usize::from(byte.is_some()) != bytes.len() || byte.is_some_and(|b| b != HTTP_200)
        {
            return Err("it has bytes after its end".into());
        }
        byte.unwrap_or(0)
    };
    if last & HTTP_200 != 0 {
        if record.http_status.is_some() {
            return Err("it has two HTTP statuses".into());
        }
        record.http_status = Some(200);
    }
    Ok(record)
}

fn flag(on: bool, bit: u8) -> u8 {
    if on {
        bit
    } else {
        0
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.bytes.get(self.at).ok_or("it is cut short")?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or("it is cut short")?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let (v, rest) = varint::get(&self.bytes[self.at..]).ok_or("it is cut short")?;
        self.at = self.bytes.len() - rest.len();
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::super::compression::TRAIN_SAMPLES;
    use super::*;

    fn full() -> ItemRecord {
        let mut r = ItemRecord::pending(7, 3);
        r.status = ItemStatus::Ok;
        r.http_status = Some(200);
        r.body = Some(
            RawValue::from_string(r#"{"a":[1,2,{"b":"ccccccccccccccccccccccccccc"}]}"#.into())
                .unwrap(),
        );
        r.attempts = 3;
        r.attempt_errors = vec![AttemptNote {
            class: ErrorClass::Http,
            http_status: Some(503),
            free: true,
        }];
        r.latency_ms = Some(12);
        r.finished_at_ms = Some(1_764_800_000_123);
        r.first_attempt_ms = Some(1_764_799_990_000);
        r.last_attempt_ms = Some(1_764_800_000_100);
        r.rerun = Some(2);
        r
    }

    fn same(a: &ItemRecord, b: &ItemRecord) {
        assert_eq!(
            serde_json::to_string(a).unwrap(),
            serde_json::to_string(b).unwrap()
        );
    }

    #[test]
    fn records_round_trip_in_binary_and_json_records_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = Compression::open(dir.path(), None).unwrap();
        let mut failed = ItemRecord::pending(9, 4);
        failed.status = ItemStatus::Failed;
        failed.class = Some(ErrorClass::Timeout);
        failed.error = Some("timed out after 30s".into());
        failed.attempts = 5;
        failed.finished_at_ms = Some(1_600_000_000_000); // before EPOCH_MS
        let mut odd_times = full();
        odd_times.first_attempt_ms = Some(odd_times.finished_at_ms.unwrap() + 5); // clock stepped back
        odd_times.last_attempt_ms = None;
        let mut no_body = full();
        no_body.body = None;
        let mut teapot = full();
        teapot.http_status = Some(418);
        let mut metered = full();
        metered.attempt_errors.clear();
        metered.usage = Some(crate::meter::Usage {
            input: 1234,
            output: 56,
        });
        let mut metered_failure = ItemRecord::pending(3, 1);
        metered_failure.status = ItemStatus::Failed;
        metered_failure.usage = Some(crate::meter::Usage {
            input: 9,
            output: 0,
        });
        let mut paged = full();
        paged.attempt_errors.clear();
        paged.body = None;
        paged.pages = Some(40);
        for record in [
            paged,
            metered,
            metered_failure,
            full(),
            failed,
            ItemRecord::pending(1, 0),
            odd_times,
            no_body,
            teapot,
        ] {
            let mut bytes = Vec::new();
            encode(&record, &bodies, &mut bytes).unwrap();
            assert_ne!(bytes[0], JSON);
            same(&decode(&bytes, record.row, &bodies).unwrap(), &record);
            let json = serde_json::to_vec(&record).unwrap();
            same(&decode(&json, record.row, &bodies).unwrap(), &record);
            for cut in 1..bytes.len() {
                let _ = decode(&bytes[..cut], record.row, &bodies); // never panics
            }
        }
        // A plain ok record's envelope (no retries, no body) is a few bytes, not ~200.
        let mut plain = full();
        plain.attempt_errors.clear();
        plain.attempts = 1;
        plain.body = None;
        let mut bytes = Vec::new();
        encode(&plain, &bodies, &mut bytes).unwrap();
        let json = serde_json::to_vec(&plain).unwrap();
        assert!(
            bytes.len() <= 20,
            "{} bytes (JSON: {})",
            bytes.len(),
            json.len()
        );
    }

    #[test]
    fn a_huge_or_wrong_body_length_is_an_error_not_an_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = Compression::open(dir.path(), None).unwrap();
        let mut record = full();
        record.attempt_errors.clear();
        let mut bytes = Vec::new();
        encode(&record, &bodies, &mut bytes).unwrap();
        // The body's part: codec byte, raw length varint, stored bytes. Rewrite the length.
        let body = record.body.as_ref().unwrap().get().len() as u64;
        let mut len = Vec::new();
        varint(&mut len, body);
        let at = bytes
            .windows(len.len() + 1)
            .rposition(|w| w[0] & !HTTP_200 <= 2 && w[1..] == len[..])
            .expect("the body's length");
        for huge in [
            u64::MAX,
            u64::MAX / 2,
            1 << 40,
            super::super::compression::MAX_BODY as u64 + 1,
        ] {
            for codec in [Codec::Raw, Codec::Zstd, Codec::ZstdDict] {
                let mut bad = bytes[..at].to_vec();
                bad.push(codec as u8 | HTTP_200);
                varint(&mut bad, huge);
                bad.extend_from_slice(&bytes[at + 1 + len.len()..]);
                let err = decode(&bad, 7, &bodies).unwrap_err();
                assert!(err.contains("length"), "{huge} {codec:?}: {err}");
            }
        }
        // A raw body must be as long as its record says.
        let mut short = bytes[..at].to_vec();
        short.push(Codec::Raw as u8 | HTTP_200);
        varint(&mut short, 5);
        short.extend_from_slice(b"[1,2,3]");
        assert!(decode(&short, 7, &bodies).is_err());
    }

    #[test]
    fn random_and_mutated_records_decode_to_ok_or_err_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = Compression::open(dir.path(), None).unwrap();
        let mut valid = Vec::new();
        for record in [full(), ItemRecord::pending(1, 0)] {
            let mut bytes = Vec::new();
            encode(&record, &bodies, &mut bytes).unwrap();
            valid.push(bytes);
        }
        // xorshift64*: deterministic, seed by seed.
        for seed in 1..=20_000u64 {
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move || {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                x.wrapping_mul(0x2545_F491_4F6C_DD1D)
            };
            let bytes: Vec<u8> = match seed % 4 {
                // Random bytes, the first not '{' (JSON is serde's to check).
                0 => (0..next() % 48)
                    .map(|i| match (i, next() as u8) {
                        (0, b'{') => 0,
                        (_, b) => b,
                    })
                    .collect(),
                // A valid record with a few bytes changed.
                1 | 2 => {
                    let mut b = valid[(seed % 2) as usize].clone();
                    for _ in 0..1 + next() % 4 {
                        let at = (next() % b.len() as u64) as usize;
                        b[at] = next() as u8;
                    }
                    b
                }
                // A valid record with ten-byte varints (up to u64::MAX) spliced in.
                _ => {
                    let mut b = valid[(seed % 2) as usize].clone();
                    let at = 1 + (next() % (b.len() as u64 - 1)) as usize;
                    let mut v = Vec::new();
                    varint(&mut v, next() | 1 << 63);
                    b.splice(at..at, v);
                    b
                }
            };
            let _ = decode(&bytes, 7, &bodies);
        }
    }

    #[test]
    fn times_from_the_disk_that_overflow_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = Compression::open(dir.path(), None).unwrap();
        // flags: ok, times; bucket 0, attempts 1; then finished and the two attempts.
        let record = |times: [u64; 3]| {
            let mut bytes = vec![1 | TIMES, 0, 1];
            for t in times {
                varint(&mut bytes, t);
            }
            bytes
        };
        for times in [
            // EPOCH_MS + i64::MAX - 1
            [1 + zigzag(i64::MAX - 1), 0, 0],
            // before 1970
            [1 + zigzag(-EPOCH_MS - 1), 0, 0],
            // finished at EPOCH_MS, first attempt at EPOCH_MS - (i64::MIN + 1)
            [1, 1 + zigzag(i64::MIN + 1), 0],
            // finished at EPOCH_MS, last attempt before 1970
            [1, 0, 1 + zigzag(EPOCH_MS + 1)],
            // the same without a finish time
            [0, 1 + zigzag(i64::MIN + 1), 0],
            [0, 0, 1 + zigzag(EPOCH_MS + 1)],
            [u64::MAX, u64::MAX, u64::MAX],
        ] {
            let err = decode(&record(times), 0, &bodies).unwrap_err();
            assert!(err.contains("out of range"), "{times:?}: {err}");
        }
    }

    #[test]
    fn each_time_round_trips_alone_or_with_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = Compression::open(dir.path(), None).unwrap();
        let values = [
            Some(1_764_800_000_123), // after EPOCH_MS
            Some(1_600_000_000_000), // before it
            Some(0),
            None,
        ];
        for finished in values {
            for first in values {
                for last in values {
                    let mut record = full();
                    record.finished_at_ms = finished;
                    record.first_attempt_ms = first;
                    record.last_attempt_ms = last;
                    let mut bytes = Vec::new();
                    encode(&record, &bodies, &mut bytes).unwrap();
                    let back = decode(&bytes, record.row, &bodies).unwrap();
                    assert_eq!(
                        (
                            back.finished_at_ms,
                            back.first_attempt_ms,
                            back.last_attempt_ms
                        ),
                        (finished, first, last)
                    );
                    same(&back, &record);
                }
            }
        }
        // A time too far out to keep fails the write instead of wrapping.
        let mut far = full();
        far.last_attempt_ms = Some(u64::MAX);
        assert!(encode(&far, &bodies, &mut Vec::new()).is_err());
    }

    #[cfg(feature = "demo")]
    #[test]
    fn bodies_compress_and_a_trained_dictionary_is_used_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = Compression::open(dir.path(), None).unwrap();
        let answer = |i: usize| {
            let v = crate::demo::api::profile_body(&format!("id-{i}"));
            let mut r = full();
            r.body = Some(RawValue::from_string(v.to_string()).unwrap());
            r
        };
        let mut before = Vec::new();
        encode(&answer(0), &bodies, &mut before).unwrap();
        let raw = answer(0).body.unwrap().get().len();
        assert!(before.len() < raw * 3 / 4, "{} of {raw}", before.len());
        let mut stored = vec![before];
        let mut recorded = None;
        for i in 1..=TRAIN_SAMPLES + 50 {
            let mut b = Vec::new();
            encode(&answer(i), &bodies, &mut b).unwrap();
            stored.push(b);
            if i == TRAIN_SAMPLES {
                // Training runs on its own thread: wait for it (bounded).
                for _ in 0..600 {
                    if let Some(new) = bodies.take_unrecorded() {
                        assert!(!bodies.trained(), "not used before the store records it");
                        // What the store does once it recorded it.
                        bodies.install(&new.dict).unwrap();
                        recorded = Some(new.record);
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
        assert!(bodies.trained(), "a dictionary was trained");
        assert!(dir
            .path()
            .join(super::super::compression::DICT_FILE)
            .exists());
        let mut with = Vec::new();
        encode(&answer(99_999), &bodies, &mut with).unwrap();
        assert!(
            with.len() < raw / 3,
            "{} of {raw} with the dictionary",
            with.len()
        );
        stored.push(with);
        // A new open reads every record: before, during and after the dictionary.
        drop(bodies);
        let again = Compression::open(dir.path(), recorded).unwrap();
        assert!(again.trained());
        for b in &stored {
            let r = decode(b, 7, &again).unwrap();
            assert_eq!(r.status, ItemStatus::Ok);
        }
        // Given another dictionary, a record that needs the job's fails (its frame names the
        // dictionary): an error, never other bytes.
        let other_dir = tempfile::tempdir().unwrap();
        let other = Compression::open(other_dir.path(), None).unwrap();
        let samples: Vec<Vec<u8>> = (0..TRAIN_SAMPLES)
            .map(|i| format!(r#"{{"other":{i},"shape":"{}"}}"#, "xy".repeat(i % 40)).into_bytes())
            .collect();
        let other_dict = zstd::dict::from_samples(&samples, 4 << 10).unwrap();
        other.install(&other_dict).unwrap();
        let err = decode(stored.last().unwrap(), 7, &other).unwrap_err();
        assert!(err.contains("decompress"), "{err}");
        // Without its dictionary, a record that needs it is an error, not a panic; and an
        // open of a store that recorded one refuses a missing file.
        std::fs::remove_file(dir.path().join(super::super::compression::DICT_FILE)).unwrap();
        let err = Compression::open(dir.path(), recorded).err().unwrap();
        assert!(err.reason.contains("missing"), "{err}");
        let lost = Compression::open(dir.path(), None).unwrap();
        let err = decode(stored.last().unwrap(), 7, &lost).unwrap_err();
        assert!(err.contains("results.dict"), "{err}");
    }
}
