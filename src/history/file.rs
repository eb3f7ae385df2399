//! The history file: `DIR/history.log` in a state directory, one [`Record`] per line.
//!
//! Each line is `CRC32 JSON`: the CRC (8 hex digits) of the JSON text, a space, the JSON.
//! Only the run holding the store's lock appends to it (through the monitor), and nothing
//! else of the store is needed to read it: another process (`serve`, `report`) reads it
//! while the job runs, without the lock. A line cut short by a crash, or whose CRC does not
//! match, is skipped by readers; the next writer cuts a torn tail off before appending.
//! Lines are written, not synced: a crash of the process loses nothing, a power cut at most
//! the samples the page cache held.
//!
//! Bounded: once it holds more than [`MAX_SAMPLES`] samples it is thinned (every other one
//! of its older three quarters dropped, each run's first and last sample kept) and rewritten
//! through a temporary file renamed over it; repeated thinning leaves recent hours at full
//! resolution and older ones coarser. At about 450 bytes a sample, the file stays under
//! about 3 MB however long the job runs.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::record::Record;

/// The file's name in the state directory.
pub(crate) const HISTORY_FILE: &str = "history.log";

/// Samples kept at most before the file is thinned.
pub(crate) const MAX_SAMPLES: usize = 6000;

/// The history file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot read the job's history: {source}")]
pub struct HistoryReadError {
    /// The history file.
    pub(crate) path: PathBuf,
    /// The operating system's error.
    pub(crate) source: std::io::Error,
}

/// The path of the history file of a state directory.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(HISTORY_FILE)
}

/// Every whole, intact record of the history of the state directory `dir`, oldest first;
/// none if it has no history file.
pub(crate) fn read(dir: &Path) -> Result<Vec<Record>, HistoryReadError> {
    let path = path(dir);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(HistoryReadError { path, source }),
    };
    let mut records = Vec::new();
    let mut reader = BufReader::new(file);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            // Not UTF-8: a damaged line; the reader moved past it.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => continue,
            Err(source) => return Err(HistoryReadError { path, source }),
        }
        // No newline: a line being written, or cut short by a crash.
        let Some(text) = line.strip_suffix('\n') else {
            break;
        };
        if let Some(record) = decode(text) {
            records.push(record);
        }
    }
    Ok(records)
}

fn encode(record: &Record) -> String {
    let json = serde_json::to_string(record).expect("history records serialize");
    format!("{:08x} {json}\n", crc32fast::hash(json.as_bytes()))
}

fn decode(line: &str) -> Option<Record> {
    let (crc, json) = line.split_once(' ')?;
    let crc = u32::from_str_radix(crc, 16).ok()?;
    if crc32fast::hash(json.as_bytes()) != crc {
        return None;
    }
    serde_json::from_str(json).ok()
}

/// The history file of a state directory, open for appending by the run that holds it.
#[derive(Debug)]
pub(crate) struct HistoryFile {
    path: PathBuf,
    file: File,
    samples: usize,
    max_samples: usize,
}

impl HistoryFile {
    /// Open (or create) the history file of `dir` for appending, cutting a torn last line.
    pub(crate) fn open(dir: &Path) -> std::io::Result<HistoryFile> {
        Self::open_with_limit(dir, MAX_SAMPLES)
    }

    /// [`HistoryFile::open`], thinning past `max_samples` samples (at least 16).
    pub(crate) fn open_with_limit(dir: &Path, max_samples: usize) -> std::io::Result<HistoryFile> {
        let path = path(dir);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if whole < bytes.len() {
            file.set_len(whole as u64)?;
        }
        file.seek(SeekFrom::End(0))?;
        if bytes.is_empty() {
            // Maybe new: its entry is durable with the directory.
            File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()?;
        }
        let samples = String::from_utf8_lossy(&bytes[..whole])
            .lines()
            .filter_map(decode)
            .filter(|r| matches!(r, Record::Sample(_)))
            .count();
        Ok(HistoryFile {
            path,
            file,
            samples,
            max_samples: max_samples.max(16),
        })
    }

    /// Append one record, durably (one `fdatasync`, a record every `--history-interval`:
    /// a power cut loses at most the record being written); thin the file when it holds too
    /// many samples.
    pub(crate) fn append(&mut self, record: &Record) -> std::io::Result<()> {
        self.file.write_all(encode(record).as_bytes())?;
        self.file.sync_data()?;
        if matches!(record, Record::Sample(_)) {
            self.samples += 1;
        }
        if self.samples > self.max_samples {
            self.thin()?;
        }
        Ok(())
    }

    #[cfg(test)]
    /// Samples in the file.
    pub(crate) fn samples(&self) -> usize {
        self.samples
    }

    /// Rewrite the file with every other sample of its older three quarters.
    fn thin(&mut self) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let records = read(dir).map_err(|e| e.source)?;
        let kept = thinned(records);
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        let mut out = std::io::BufWriter::new(tmp.as_file_mut());
        for r in &kept {
            out.write_all(encode(r).as_bytes())?;
        }
        out.flush()?;
        drop(out);
        tmp.as_file().sync_all()?;
        tmp.persist(&self.path).map_err(|e| e.error)?;
        File::open(dir)?.sync_all()?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.samples = kept
            .iter()
            .filter(|r| matches!(r, Record::Sample(_)))
            .count();
        Ok(())
    }
}

/// The records with every other sample of the older three quarters dropped; run records,
/// each run's first and last sample and the newest quarter are all kept.
fn thinned(records: Vec<Record>) -> Vec<Record> {
    let samples: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Record::Sample(_)))
        .map(|(i, _)| i)
        .collect();
    let recent_from = samples.get(samples.len() * 3 / 4).copied().unwrap_or(0);
    let run_of = |i: usize| match &records[i] {
        Record::Sample(s) => Some(s.run_id.as_str()),
        Record::Run(_) => None,
    };
    let mut keep = vec![true; records.len()];
    for (n, &i) in samples.iter().enumerate() {
        if i >= recent_from {
            break;
        }
        let first = n == 0 || run_of(samples[n - 1]) != run_of(i);
        let last = samples.get(n + 1).is_none_or(|&j| run_of(j) != run_of(i));
        if !first && !last && n % 2 == 1 {
            keep[i] = false;
        }
    }
    records
        .into_iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(r, _)| r)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{RunStart, Sample};

    fn sample(run: &str, at_ms: u64) -> Record {
        Record::Sample(Sample {
            at_ms,
            run_id: run.into(),
            worker: None,
            ok: at_ms,
            failed: 0,
            retries: 0,
            attempts: at_ms,
            pages: 0,
            throttled: 0,
            answers: Default::default(),
            p50_ms: Some(1.0),
            p90_ms: None,
            p99_ms: None,
            rate: None,
            rate_cause: Default::default(),
            in_flight: 0,
            job_ok: at_ms,
            job_failed: 0,
            job_pending: 0,
            buckets_committed: 0,
            buckets_planned: 0,
            rows_read: 0,
            input_rows: None,
        })
    }

    fn run(id: &str) -> Record {
        Record::Run(RunStart {
            run_id: id.into(),
            started_ms: 0,
            pid: 1,
            worker: None,
            spec: serde_json::json!({"job_id": "j"}),
        })
    }

    #[test]
    fn records_survive_a_reopen_and_a_torn_or_garbled_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = HistoryFile::open(dir.path()).unwrap();
        h.append(&run("a")).unwrap();
        h.append(&sample("a", 1)).unwrap();
        drop(h);
        // A garbled line, then a line cut short by a crash.
        let mut f = OpenOptions::new()
            .append(true)
            .open(path(dir.path()))
            .unwrap();
        f.write_all(b"00000000 {\"kind\":\"sample\"}\n{\"kind\":\"sa")
            .unwrap();
        drop(f);
        assert_eq!(read(dir.path()).unwrap().len(), 2);
        let mut h = HistoryFile::open(dir.path()).unwrap();
        assert_eq!(h.samples(), 1);
        h.append(&run("b")).unwrap();
        h.append(&sample("b", 2)).unwrap();
        let all = read(dir.path()).unwrap();
        assert_eq!(
            all,
            vec![run("a"), sample("a", 1), run("b"), sample("b", 2)]
        );
    }

    #[test]
    fn a_history_past_its_limit_is_thinned_keeping_runs_their_ends_and_recent_samples() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = HistoryFile::open_with_limit(dir.path(), 100).unwrap();
        h.append(&run("a")).unwrap();
        for t in 0..60 {
            h.append(&sample("a", t)).unwrap();
        }
        h.append(&run("b")).unwrap();
        for t in 60..1000 {
            h.append(&sample("b", t)).unwrap();
        }
        assert!(h.samples() <= 100, "{}", h.samples());
        let all = read(dir.path()).unwrap();
        let runs = all.iter().filter(|r| matches!(r, Record::Run(_))).count();
        assert_eq!(runs, 2);
        let times: Vec<u64> = all
            .iter()
            .filter_map(|r| match r {
                Record::Sample(s) => Some(s.at_ms),
                Record::Run(_) => None,
            })
            .collect();
        // Each run's first and last sample, and the newest ones, at full resolution.
        for t in [0, 59, 60, 999, 998, 997] {
            assert!(times.contains(&t), "{t} dropped: {times:?}");
        }
        assert!(times.windows(2).all(|w| w[0] < w[1]));
        assert!(std::fs::metadata(path(dir.path())).unwrap().len() < 100 * 1024);
    }
}
