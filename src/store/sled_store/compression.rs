//! Results at rest: zstd, with a dictionary trained from the job's own first answers.
//!
//! Owns the file `DIR/results.dict` and the compressor and decompressor of the record bodies
//! (the handler's results) in `results.log`. Answers of one API share their keys, their
//! structure and much of their vocabulary, which a frame of one answer cannot exploit: zstd
//! per answer keeps about half of a 2 KB JSON answer. A dictionary trained on the first
//! answers carries what they share, so each record compresses alone to about a fifth, about
//! what a block of 256 answers compresses to, and each record still reads alone (a bucket, an
//! ID) without decompressing its neighbours. (Measured on the bench's realistic answers:
//! 1,870 bytes raw; per answer 991 bytes; with a 32 KB dictionary from 2,000 answers 350
//! bytes at 7 µs per answer; blocks of 64 and 256 answers 355 and 330 bytes.)
//!
//! The life of a dictionary:
//!
//! 1. Until it exists, bodies are compressed without one (or kept raw when that is not
//!    smaller), and copies of the first [`TRAIN_SAMPLES`] bodies are kept in memory.
//! 2. Then a background thread trains a dictionary of [`DICT_BYTES`] from them and writes it
//!    to `results.dict` (`[magic "HWDICT01"][CRC-32 of the dictionary u32 LE][dictionary]`):
//!    a new file, never in place of an existing one, synced with its directory.
//! 3. The store records it ([`DictRecord`]: its zstd ID and the file's CRC-32 and length) in
//!    sled's `meta` under [`DICT_META_KEY`] and flushes that durably; only then is it
//!    installed ([`Compression::install`]). So no record compressed with a dictionary reaches
//!    the disk before both the dictionary and the store's record of it do.
//! 4. An open loads the dictionary the store recorded, and refuses the directory
//!    ([`DictError`], a corrupt store) if `results.dict` is missing or is not that file: the
//!    records need it, and a new one would decode them wrongly. A store that has one never
//!    trains again. A `results.dict` the store has no record of (a crash between steps 2 and
//!    3) is recorded then, at the open. If training fails (too few or too uniform samples),
//!    the job goes on without one.
//!
//! Frames name their dictionary (zstd's dictionary ID), so a frame given another dictionary
//! (or none) fails to decompress instead of decoding to wrong bytes.
//!
//! A record's body says how it is stored ([`Codec`]), so records written before the
//! dictionary, by older builds (raw JSON) and with it are all read.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use zstd::bulk::{Compressor, Decompressor};

/// The dictionary's file name in the state directory.
pub(crate) const DICT_FILE: &str = "results.dict";
/// The key in sled's `meta` tree of the store's [`DictRecord`].
pub(crate) const DICT_META_KEY: &str = "dict";

const MAGIC: &[u8; 8] = b"HWDICT01";
/// zstd's level for the results: as fast as level 1 with a dictionary, and smaller.
const LEVEL: i32 = 3;
/// Bodies the dictionary is trained on.
pub(crate) const TRAIN_SAMPLES: usize = 2_000;
/// Sample bytes kept at most for training, whatever the bodies' size.
const TRAIN_BYTES: usize = 8 << 20;
/// The dictionary's size.
const DICT_BYTES: usize = 32 << 10;
/// Bodies shorter than this are kept raw: a zstd frame costs more than it saves.
const MIN_COMPRESS: usize = 24;
/// The largest body a record may claim (16 times the HTTP handler's largest answer): a
/// larger length read from the disk is damage, and is never allocated.
pub(crate) const MAX_BODY: usize = 256 << 20;

/// How a body is stored, the first byte of its part of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Codec {
    /// As the handler returned it.
    Raw = 0,
    /// A zstd frame without a dictionary.
    Zstd = 1,
    /// A zstd frame with the job's dictionary (`results.dict`).
    ZstdDict = 2,
}

impl Codec {
    pub(crate) fn from_byte(b: u8) -> Option<Codec> {
        match b {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::ZstdDict),
            _ => None,
        }
    }
}

/// The store's durable record of its dictionary (sled `meta`, [`DICT_META_KEY`]): which
/// `results.dict` its records need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DictRecord {
    /// The dictionary's zstd ID (frames carry it).
    pub(crate) id: u32,
    /// CRC-32 of the whole `results.dict` file.
    pub(crate) file_crc: u32,
    /// Its length in bytes.
    pub(crate) file_len: u64,
}

impl DictRecord {
    /// `[id u32 BE][file CRC-32 u32 BE][file length u64 BE]`.
    pub(crate) fn to_bytes(self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..4].copy_from_slice(&self.id.to_be_bytes());
        out[4..8].copy_from_slice(&self.file_crc.to_be_bytes());
        out[8..].copy_from_slice(&self.file_len.to_be_bytes());
        out
    }

    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<DictRecord> {
        let bytes: &[u8; 16] = bytes.try_into().ok()?;
        Some(DictRecord {
            id: u32::from_be_bytes(bytes[..4].try_into().ok()?),
            file_crc: u32::from_be_bytes(bytes[4..8].try_into().ok()?),
            file_len: u64::from_be_bytes(bytes[8..].try_into().ok()?),
        })
    }

    /// The record of a `results.dict` holding `file`, if it is whole.
    fn of_file(file: &[u8]) -> Option<(DictRecord, Vec<u8>)> {
        let dict = parse(file)?;
        let id = zstd::zstd_safe::get_dict_id_from_dict(&dict)?.get();
        let record = DictRecord {
            id,
            file_crc: crc32fast::hash(file),
            file_len: file.len() as u64,
        };
        Some((record, dict))
    }
}

/// A dictionary written (or found) that the store has yet to record before it is used.
pub(crate) struct Unrecorded {
    pub(crate) record: DictRecord,
    pub(crate) dict: Vec<u8>,
}

/// The compressor and decompressor of one state directory's bodies (see the module doc).
pub(crate) struct Compression {
    path: PathBuf,
    /// The compressor in use, and what its frames are: with the dictionary once it is
    /// recorded.
    compressor: Mutex<(Compressor<'static>, Codec)>,
    plain: Mutex<Decompressor<'static>>,
    /// The dictionary's decompressor, once there is one.
    with_dict: RwLock<Option<Arc<Mutex<Decompressor<'static>>>>>,
    /// Samples for training; `None` once a dictionary exists or training has started.
    samples: Mutex<Option<Samples>>,
    /// A dictionary in `results.dict` that the store has not recorded yet (see the module doc).
    unrecorded: Mutex<Option<Unrecorded>>,
}

#[derive(Default)]
struct Samples {
    bytes: Vec<u8>,
    sizes: Vec<usize>,
}

/// A dictionary file that cannot be read, or is not the one the store recorded.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub(crate) struct DictError {
    pub(crate) path: PathBuf,
    pub(crate) reason: String,
}

impl Compression {
    /// Open the compression of the state directory `dir`, whose store recorded the
    /// dictionary `recorded` (see the module doc).
    pub(crate) fn open(
        dir: &Path,
        recorded: Option<DictRecord>,
    ) -> Result<Arc<Compression>, DictError> {
        let path = dir.join(DICT_FILE);
        let err = |reason: String| DictError {
            path: path.clone(),
            reason,
        };
        let zstd_err = |e: std::io::Error| err(format!("zstd: {e}"));
        let file = match std::fs::read(&path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(err(e.to_string())),
        };
        let found = match &file {
            Some(bytes) => Some(DictRecord::of_file(bytes).ok_or_else(|| {
                err(
                    "damaged (checksum, or not a zstd dictionary); it travels with \
                     results.log: restore both from the same copy"
                        .into(),
                )
            })?),
            None => None,
        };
        let (installed, unrecorded) = match (recorded, found) {
            (None, None) => (None, None),
            (Some(want), None) => {
                return Err(err(format!(
                    "missing: the store's records are compressed with dictionary {} from this \
                     file (results.dict travels with results.log); restore it from the copy \
                     results.log came from",
                    want.id
                )))
            }
            (Some(want), Some((found, _))) if found != want => {
                return Err(err(format!(
                    "not the dictionary the store's records are compressed with (the store \
                     recorded dictionary {} of {} bytes, CRC-32 {:08x}; this file holds \
                     dictionary {} of {} bytes, CRC-32 {:08x}); restore the results.dict that \
                     travels with this results.log",
                    want.id, want.file_len, want.file_crc, found.id, found.file_len, found.file_crc
                )))
            }
            (Some(_), Some((_, dict))) => (Some(dict), None),
            (None, Some((record, dict))) => (None, Some(Unrecorded { record, dict })),
        };
        let trains = installed.is_none() && unrecorded.is_none();
        let compression = Compression {
            path: path.clone(),
            compressor: Mutex::new((compressor(None).map_err(zstd_err)?, Codec::Zstd)),
            plain: Mutex::new(Decompressor::new().map_err(zstd_err)?),
            with_dict: RwLock::new(None),
            samples: Mutex::new(trains.then(Samples::default)),
            unrecorded: Mutex::new(unrecorded),
        };
        if let Some(dict) = installed {
            compression.install(&dict).map_err(zstd_err)?;
        }
        Ok(Arc::new(compression))
    }

    /// The dictionary in `results.dict` the store must record (durably) before it calls
    /// [`Compression::install`], if there is one; at most once.
    pub(crate) fn take_unrecorded(&self) -> Option<Unrecorded> {
        self.unrecorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Use `dict` from now on: only once the store recorded it durably (see the module doc).
    pub(crate) fn install(&self, dict: &[u8]) -> std::io::Result<()> {
        let c = compressor(Some(dict))?;
        let d = Decompressor::with_dictionary(dict)?;
        *self
            .with_dict
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(Mutex::new(d)));
        *self
            .compressor
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (c, Codec::ZstdDict);
        Ok(())
    }

    /// Append `body` to `out` as it is stored; return how.
    pub(crate) fn compress(self: &Arc<Self>, body: &[u8], out: &mut Vec<u8>) -> Codec {
        self.sample(body);
        if body.len() < MIN_COMPRESS {
            out.extend_from_slice(body);
            return Codec::Raw;
        }
        let start = out.len();
        out.resize(start + zstd::zstd_safe::compress_bound(body.len()), 0);
        let mut compressor = self
            .compressor
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let codec = compressor.1;
        let done = compressor.0.compress_to_buffer(body, &mut out[start..]);
        drop(compressor);
        match done {
            Ok(n) if n < body.len() => {
                out.truncate(start + n);
                codec
            }
            _ => {
                out.truncate(start);
                out.extend_from_slice(body);
                Codec::Raw
            }
        }
    }

    /// The body of `raw_len` bytes stored as `data` with `codec`. `raw_len` and `data` come
    /// from the disk: a length above [`MAX_BODY`] is an error, never an allocation.
    pub(crate) fn decompress(
        &self,
        codec: Codec,
        data: &[u8],
        raw_len: u64,
    ) -> Result<Vec<u8>, String> {
        let raw_len = usize::try_from(raw_len)
            .ok()
            .filter(|&n| n <= MAX_BODY)
            .ok_or_else(|| format!("its body's length {raw_len} is above {MAX_BODY} bytes"))?;
        let out = match codec {
            Codec::Raw if data.len() == raw_len => return Ok(data.to_vec()),
            Codec::Raw => {
                return Err(format!(
                    "its body is {} bytes, not the length {raw_len} it records",
                    data.len()
                ))
            }
            Codec::Zstd => self
                .plain
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .decompress(data, raw_len),
            Codec::ZstdDict => {
                let d = self.dict_decompressor()?;
                let mut d = d.lock().unwrap_or_else(PoisonError::into_inner);
                d.decompress(data, raw_len)
            }
        };
        let out = out.map_err(|e| format!("its body does not decompress: {e}"))?;
        if out.len() != raw_len {
            return Err(format!(
                "its body decompresses to {} bytes, not {raw_len}",
                out.len()
            ));
        }
        Ok(out)
    }

    /// The dictionary's decompressor, if the store has one.
    fn dict_decompressor(&self) -> Result<Arc<Mutex<Decompressor<'static>>>, String> {
        self.with_dict
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                format!("its body needs the job's dictionary ({DICT_FILE}), and the store has none")
            })
    }

    /// Keep a copy of `body` for training; start training once there are enough.
    fn sample(self: &Arc<Self>, body: &[u8]) {
        let mut guard = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(samples) = guard.as_mut() else {
            return;
        };
        if samples.bytes.len() + body.len() <= TRAIN_BYTES {
            samples.bytes.extend_from_slice(body);
            samples.sizes.push(body.len());
        }
        if samples.sizes.len() < TRAIN_SAMPLES && samples.bytes.len() + body.len() <= TRAIN_BYTES {
            return;
        }
        let samples = guard.take().expect("checked above");
        drop(guard);
        let this = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("highwater-dict".into())
            .spawn(move || this.train(samples));
        if let Err(e) = spawned {
            tracing::debug!("no dictionary for the results: {e}");
        }
    }

    /// Train and write `results.dict` durably; the store records it, then uses it (see the
    /// module doc).
    fn train(&self, samples: Samples) {
        let started = std::time::Instant::now();
        let dict = match zstd::dict::from_continuous(&samples.bytes, &samples.sizes, DICT_BYTES) {
            Ok(dict) => dict,
            Err(e) => {
                tracing::debug!("no dictionary for the results (training: {e})");
                return;
            }
        };
        let mut file = Vec::with_capacity(12 + dict.len());
        file.extend_from_slice(MAGIC);
        file.extend_from_slice(&crc32fast::hash(&dict).to_le_bytes());
        file.extend_from_slice(&dict);
        let Some((record, dict)) = DictRecord::of_file(&file) else {
            tracing::debug!("no dictionary for the results (training made one without an ID)");
            return;
        };
        if let Err(e) = super::dir::write_new(&self.path, &file) {
            tracing::warn!(path = %self.path.display(), "could not write the results' dictionary ({e}); the job goes on without it");
            return;
        }
        *self
            .unrecorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Unrecorded { record, dict });
        tracing::debug!(
            samples = samples.sizes.len(),
            bytes = file.len(),
            id = record.id,
            ms = started.elapsed().as_millis() as u64,
            "trained the results' dictionary"
        );
    }

    /// Whether new bodies are compressed with the dictionary (for tests).
    #[cfg(test)]
    pub(crate) fn trained(&self) -> bool {
        self.compressor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            == Codec::ZstdDict
    }
}

fn compressor(dict: Option<&[u8]>) -> std::io::Result<Compressor<'static>> {
    let mut c = match dict {
        Some(d) => Compressor::with_dictionary(LEVEL, d)?,
        None => Compressor::new(LEVEL)?,
    };
    // The record keeps the length; the log's CRC covers the bytes. The frame names its
    // dictionary (4 bytes), so a frame given another dictionary fails instead of decoding to
    // wrong bytes.
    use zstd::stream::raw::CParameter;
    c.set_parameter(CParameter::ContentSizeFlag(false))?;
    c.set_parameter(CParameter::DictIdFlag(true))?;
    c.set_parameter(CParameter::ChecksumFlag(false))?;
    Ok(c)
}

/// The dictionary in a `results.dict` file's bytes, if they are whole.
fn parse(bytes: &[u8]) -> Option<Vec<u8>> {
    let (head, dict) = (bytes.get(..12)?, &bytes[12..]);
    if &head[..8] != MAGIC || dict.is_empty() {
        return None;
    }
    let crc = u32::from_le_bytes(head[8..12].try_into().ok()?);
    (crc32fast::hash(dict) == crc).then(|| dict.to_vec())
}
