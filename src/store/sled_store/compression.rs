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
//!    to `results.dict` (`[magic "HWDICT01"][CRC-32 of the dictionary u32 LE][dictionary]`),
//!    atomically and durably; only then is it used. So a record that names the dictionary
//!    never reaches the disk before the dictionary does.
//! 3. An open loads it. One job has at most one dictionary: a store that has one never trains
//!    again. If training fails (too few or too uniform samples), the job goes on without one.
//!
//! A record's body says how it is stored ([`Codec`]), so records written before the
//! dictionary, by older builds (raw JSON) and with it are all read.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use zstd::bulk::{Compressor, Decompressor};

/// The dictionary's file name in the state directory.
pub(crate) const DICT_FILE: &str = "results.dict";

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

/// The compressor and decompressor of one state directory's bodies (see the module doc).
pub(crate) struct Compression {
    path: PathBuf,
    /// The compressor in use, and what its frames are: with the dictionary once it is
    /// durable.
    compressor: Mutex<(Compressor<'static>, Codec)>,
    plain: Mutex<Decompressor<'static>>,
    /// The dictionary's decompressor, once there is one.
    with_dict: RwLock<Option<Arc<Mutex<Decompressor<'static>>>>>,
    /// Samples for training; `None` once a dictionary exists or training has started.
    samples: Mutex<Option<Samples>>,
}

#[derive(Default)]
struct Samples {
    bytes: Vec<u8>,
    sizes: Vec<usize>,
}

/// A dictionary file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub(crate) struct DictError {
    pub(crate) path: PathBuf,
    pub(crate) reason: String,
}

impl Compression {
    /// Open the compression of the state directory `dir`: with its dictionary if it has one.
    pub(crate) fn open(dir: &Path) -> Result<Arc<Compression>, DictError> {
        let path = dir.join(DICT_FILE);
        let err = |reason: String| DictError {
            path: path.clone(),
            reason,
        };
        let zstd_err = |e: std::io::Error| err(format!("zstd: {e}"));
        let dict = match std::fs::read(&path) {
            Ok(bytes) => Some(parse(&bytes).ok_or_else(|| err("damaged (checksum)".into()))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(err(e.to_string())),
        };
        let compression = Compression {
            path: path.clone(),
            compressor: Mutex::new((compressor(None).map_err(zstd_err)?, Codec::Zstd)),
            plain: Mutex::new(Decompressor::new().map_err(zstd_err)?),
            with_dict: RwLock::new(None),
            samples: Mutex::new(dict.is_none().then(Samples::default)),
        };
        if let Some(dict) = dict {
            compression.install(&dict).map_err(zstd_err)?;
        }
        Ok(Arc::new(compression))
    }

    /// Use `dict` from now on.
    fn install(&self, dict: &[u8]) -> std::io::Result<()> {
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

    /// The body of `raw_len` bytes stored as `data` with `codec`.
    pub(crate) fn decompress(
        &self,
        codec: Codec,
        data: &[u8],
        raw_len: usize,
    ) -> Result<Vec<u8>, String> {
        let out = match codec {
            Codec::Raw => return Ok(data.to_vec()),
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

    /// The dictionary's decompressor. A reader opened before the job's writer trained the
    /// dictionary loads it now.
    fn dict_decompressor(&self) -> Result<Arc<Mutex<Decompressor<'static>>>, String> {
        if let Some(d) = self
            .with_dict
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(d);
        }
        let dict = match std::fs::read(&self.path) {
            Ok(bytes) => {
                parse(&bytes).ok_or_else(|| format!("{DICT_FILE} is damaged (checksum)"))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("it needs {DICT_FILE}, which is missing"))
            }
            Err(e) => return Err(format!("{DICT_FILE}: {e}")),
        };
        let d = Arc::new(Mutex::new(
            Decompressor::with_dictionary(&dict).map_err(|e| format!("{DICT_FILE}: {e}"))?,
        ));
        *self
            .with_dict
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(d.clone());
        Ok(d)
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

    /// Train, write `results.dict` durably, then use it (see the module doc).
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
        if let Err(e) = super::write_atomically(&self.path, &file) {
            tracing::warn!(path = %self.path.display(), "could not write the results' dictionary ({e}); the job goes on without it");
            return;
        }
        if let Err(e) = self.install(&dict) {
            tracing::warn!(
                "could not load the results' dictionary ({e}); the job goes on without it"
            );
            return;
        }
        tracing::debug!(
            samples = samples.sizes.len(),
            bytes = dict.len(),
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
    // The record keeps the length; the dictionary is the job's only one; the log's CRC covers
    // the bytes.
    use zstd::stream::raw::CParameter;
    c.set_parameter(CParameter::ContentSizeFlag(false))?;
    c.set_parameter(CParameter::DictIdFlag(false))?;
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
