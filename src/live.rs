//! Live status: the snapshot a running process publishes for other processes to read.
//!
//! Owns `DIR/live.json`: written by the runner once a second (a temp file renamed over the
//! old one, so a reader never sees half a file) and marked finished when the run ends
//! cleanly, before the run lets go of the store's lock. The store itself is locked while a
//! run is active, so `status` reads this file instead, and decides from it, the pid and its
//! age how the runner stands; once the store is free, a snapshot not marked finished alone
//! says the last runner died.

// Parts only the command line uses are dead code in the library alone.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::StoreStats;

/// The file's name in the state directory.
pub(crate) const LIVE_FILE: &str = "live.json";

/// A snapshot older than this, from a process that no longer updates it, is stale.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(10);

/// What a running process says about itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LiveSnapshot {
    /// The run's process id (tells a live run from a dead one).
    pub(crate) pid: u32,
    /// The job's id, stable across runs.
    pub(crate) job_id: String,
    /// The run's id, new each start.
    pub(crate) run_id: String,
    /// Unix milliseconds.
    pub(crate) started_ms: u64,
    /// When the snapshot was last written (Unix milliseconds); older than [`STALE_AFTER`] from a live pid: stale.
    pub(crate) updated_ms: u64,
    /// The run ended (cleanly: finished, stopped or halted); `outcome` says how.
    pub(crate) finished: bool,
    /// "finished", "halted", "stopped", "not finished" or "failed"; none while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) outcome: Option<String>,
    /// Items finished per second over the last minute (less early in the run).
    pub(crate) items_per_second: f64,
    /// Items finished per second over the whole run.
    #[serde(default)]
    pub(crate) average_items_per_second: f64,
    /// The rate limit in force, requests per second (none: no limit).
    pub(crate) effective_rate: Option<f64>,
    /// Seconds left at the last minute's speed, once the input's size is known.
    pub(crate) eta_seconds: Option<u64>,
    /// Job-wide figures: the store's at the start plus this run's.
    pub(crate) ok: u64,
    /// IDs failed, job-wide.
    pub(crate) failed: u64,
    /// Planned IDs without a final result, job-wide.
    pub(crate) pending: u64,
    /// Buckets committed, job-wide.
    pub(crate) buckets_committed: u64,
    /// Buckets planned, job-wide.
    pub(crate) buckets_planned: u64,
    /// Input rows read, job-wide (bad and duplicate rows included).
    pub(crate) rows_read: u64,
    /// Rows in the whole input, once counted.
    pub(crate) input_rows: Option<u64>,
    /// This run's figures.
    pub(crate) run_ok: u64,
    /// Items this run finished failed.
    pub(crate) run_failed: u64,
    /// Retries this run made.
    pub(crate) retries: u64,
    /// Pages of paginated IDs this run had answered (none in snapshots of older versions).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) pages: u64,
    /// Answers 429 this run got.
    pub(crate) throttled: u64,
    /// API calls under way now.
    pub(crate) in_flight: u64,
    /// Where the job's quotas stand (none in snapshots of older versions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) quotas: Vec<crate::quota::QuotaState>,
    /// The limits the API announced (none in snapshots of older versions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) announced: Vec<crate::quota::pacer::PolicyState>,
    /// Where the run serves the job's dashboard (`host:port`), if it does: a reader that
    /// cannot open the store the run holds reaches the run's own readings there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dashboard: Option<String>,
    /// What the calls cost, job-wide, as their answers said.
    #[serde(default, skip_serializing_if = "crate::meter::Usage::is_zero")]
    pub(crate) usage: crate::meter::Usage,
    /// What the job spent by its prices, its projection and its budget (none if unpriced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spend: Option<crate::meter::Spend>,
}

/// The live file of the state directory `state`.
pub(crate) fn path(state: &Path) -> PathBuf {
    state.join(LIVE_FILE)
}

/// The temporary file a snapshot is written to before it is renamed over [`LIVE_FILE`].
/// A fixed name: the only writer is the run holding the store's lock, and a file left by a
/// crash is simply overwritten by the next run.
pub(crate) const LIVE_TMP: &str = "live.json.tmp";

/// Replace the snapshot atomically.
pub(crate) fn publish(state: &Path, snapshot: &LiveSnapshot) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(snapshot).expect("snapshots serialize");
    let tmp = state.join(LIVE_TMP);
    std::fs::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, path(state))
}

/// The last snapshot, if there is a readable one.
pub(crate) fn read(state: &Path) -> Option<LiveSnapshot> {
    let bytes = std::fs::read(path(state)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Whether a process with this pid exists.
pub(crate) fn pid_alive(pid: u32) -> bool {
    // A zombie (dead, not yet reaped by its parent) still answers signal 0.
    crate::os::process_exists(pid) && i32::try_from(pid).is_ok_and(|pid| !is_zombie(pid))
}

/// Linux: the process's state in /proc is Z (or X). Elsewhere: never known to be.
fn is_zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

/// How a snapshot's runner stands, seen from another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runner {
    /// Running and publishing.
    Live,
    /// The process exists but the snapshot stopped being updated.
    Stale,
    /// The process is gone without marking the snapshot finished (judged by the pid while
    /// the store is locked; `status` of a free store needs no pid).
    Died,
    /// The run ended cleanly.
    Finished,
}

impl LiveSnapshot {
    /// How the runner of a snapshot read while the store is locked stands.
    pub(crate) fn runner(&self, now_ms: u64) -> Runner {
        if self.finished {
            Runner::Finished
        } else if !pid_alive(self.pid) || self.pid == std::process::id() {
            Runner::Died
        } else if now_ms.saturating_sub(self.updated_ms) > STALE_AFTER.as_millis() as u64 {
            Runner::Stale
        } else {
            Runner::Live
        }
    }
}

/// Unix milliseconds as an RFC 3339 UTC time.
pub(crate) fn format_ms(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

impl LiveSnapshot {
    /// The job-wide figures as the store's [`StoreStats`], with the same keys as `status`
    /// of a free store gives. What a live run does not track (IDs planned are ok + failed +
    /// pending; duplicates, bad lines and input bytes read are left at 0; the input is read
    /// to its end once every row of a counted input is read).
    pub(crate) fn stats(&self) -> StoreStats {
        StoreStats {
            buckets_planned: self.buckets_planned,
            buckets_committed: self.buckets_committed,
            buckets_in_flight: self.buckets_planned.saturating_sub(self.buckets_committed),
            rows_read: self.rows_read,
            ids_planned: self.ok + self.failed + self.pending,
            ok: self.ok,
            failed: self.failed,
            pending: self.pending,
            duplicates: 0,
            bad_lines: 0,
            input_exhausted: self.input_rows == Some(self.rows_read),
            input_bytes_read: 0,
            usage: self.usage,
        }
    }

    /// Human text for `status` while the run is live.
    pub(crate) fn render(&self, state: &Path, runner: Runner, now_ms: u64) -> String {
        let age = Duration::from_secs(now_ms.saturating_sub(self.updated_ms) / 1000);
        let how = match runner {
            Runner::Live => "running".to_string(),
            Runner::Stale => format!(
                "running, but its snapshot was last updated {} ago (is it stuck?)",
                humantime::format_duration(age)
            ),
            Runner::Died => "died".to_string(),
            Runner::Finished => "ended".to_string(),
        };
        let input = match self.input_rows {
            Some(total) => format!("{} of {total} rows read", self.rows_read),
            None => format!(
                "{} rows read (the input's size is being counted)",
                self.rows_read
            ),
        };
        let rate = self
            .effective_rate
            .map_or("no rate limit".to_string(), |r| {
                format!("rate limit {r:.1}/s")
            });
        let eta = match self.eta_seconds {
            Some(s) => humantime::format_duration(Duration::from_secs(s)).to_string(),
            None => "unknown yet".to_string(),
        };
        let quotas: String = self
            .quotas
            .iter()
            .map(|q| format!("quotas:     {}\n", q.render()))
            .chain(
                self.announced
                    .iter()
                    .map(|a| format!("API limits: {}\n", a.render())),
            )
            .collect();
        let mut text = format!(
            "state:      {}\njob:        {}\nrunner:     {how}: pid {}, run {}, started {}, updated {}\n\
             IDs:        {} ok, {} failed, {} pending so far\n\
             buckets:    {} planned, {} committed\ninput:      {input}\n\
             speed:      {:.1} items/s over the last minute, {:.1} on average, {rate}\nETA:        {eta}\n\
             this run:   {} ok, {} failed, {} retries, {} answers 429, {} in flight\n",
            state.display(),
            self.job_id,
            self.pid,
            self.run_id,
            format_ms(self.started_ms),
            format_ms(self.updated_ms),
            self.ok,
            self.failed,
            self.pending,
            self.buckets_planned,
            self.buckets_committed,
            self.items_per_second,
            self.average_items_per_second,
            self.run_ok,
            self.run_failed,
            self.retries,
            self.throttled,
            self.in_flight,
        );
        if self.pages > 0 {
            text.push_str(&format!("pages:      {} answered this run\n", self.pages));
        }
        text.push_str(&quotas);
        if !self.usage.is_zero() {
            text.push_str(&format!("usage:      {}\n", self.usage));
        }
        if let Some(spend) = &self.spend {
            text.push_str(&format!("spend:      {}\n", spend.render()));
        }
        if let Some(addr) = &self.dashboard {
            text.push_str(&format!("dashboard:  http://{addr}/ (served by the run)\n"));
        }
        text
    }
}

/// For serde: leave a count out while it is 0.
fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(pid: u32) -> LiveSnapshot {
        LiveSnapshot {
            pid,
            job_id: "j".into(),
            run_id: "r".into(),
            started_ms: 1,
            updated_ms: 1_000,
            finished: false,
            outcome: None,
            items_per_second: 1.0,
            average_items_per_second: 1.0,
            effective_rate: None,
            eta_seconds: None,
            ok: 1,
            failed: 0,
            pending: 2,
            buckets_committed: 0,
            buckets_planned: 1,
            rows_read: 3,
            input_rows: Some(3),
            run_ok: 1,
            run_failed: 0,
            retries: 0,
            pages: 0,
            throttled: 0,
            in_flight: 0,
            quotas: Vec::new(),
            announced: Vec::new(),
            dashboard: None,
            usage: Default::default(),
            spend: None,
        }
    }

    #[test]
    fn a_snapshot_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = snapshot(1);
        publish(dir.path(), &s).unwrap();
        assert_eq!(read(dir.path()), Some(s));
        // Only the file itself is left: the temp file was renamed.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn runners_are_judged_by_pid_and_age() {
        // Our parent exists and is not us.
        let parent = std::os::unix::process::parent_id();
        let s = snapshot(parent);
        assert_eq!(s.runner(1_000 + 500), Runner::Live);
        assert_eq!(s.runner(1_000 + 60_000), Runner::Stale);
        assert_eq!(snapshot(i32::MAX as u32).runner(1_000), Runner::Died);
        let done = LiveSnapshot {
            finished: true,
            ..snapshot(i32::MAX as u32)
        };
        assert_eq!(done.runner(1_000), Runner::Finished);
    }
}
