//! The binary's progress events (`--log-format json --progress-interval 1s`), read back from
//! its log as it runs: how far the planner is ahead of the calls, and how long it spent
//! writing and syncing the buckets it planned.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The figures of one event that the bench reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Event {
    /// Input rows read, job-wide.
    pub rows_read: u64,
    /// Planned IDs without a final result, job-wide: how far planning is ahead.
    pub pending: u64,
}

/// One run's log, read as it grows.
pub struct ProgressLog {
    path: PathBuf,
    offset: u64,
    /// The end of the log past its last newline.
    partial: String,
    pub latest: Option<Event>,
    /// Milliseconds the planner spent writing and syncing its buckets, over the run's
    /// events so far (the whole run's once its last event is read).
    pub planner_ms: f64,
    /// Whether the run's last event (the one covering the whole run) was read.
    pub ended: bool,
}

impl ProgressLog {
    pub fn new(path: &Path) -> ProgressLog {
        ProgressLog {
            path: path.to_path_buf(),
            offset: 0,
            partial: String::new(),
            latest: None,
            planner_ms: 0.0,
            ended: false,
        }
    }

    /// Reads the events written since the last call.
    pub fn read(&mut self) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        let mut text = String::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err()
            || file.read_to_string(&mut text).is_err()
        {
            return;
        }
        self.offset += text.len() as u64;
        self.partial.push_str(&text);
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        let lines: String = self.partial.drain(..=end).collect();
        for line in lines.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["event"] != "progress" {
                continue;
            }
            let number = |key: &str| v[key].as_u64().unwrap_or(0);
            let d = &v["duration_ms"];
            let planner = d["offset_write_ms"].as_f64().unwrap_or(0.0)
                + d["offset_sync_ms"].as_f64().unwrap_or(0.0);
            if v["last"] == true {
                // It covers the whole run: the sum of the intervals, and what they missed.
                self.planner_ms = planner;
                self.ended = true;
            } else {
                self.planner_ms += planner;
            }
            self.latest = Some(Event {
                rows_read: number("rows_read"),
                pending: number("pending"),
            });
        }
    }
}
