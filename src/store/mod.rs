//! Store: where a job's progress lives, behind a trait so the engine does not know its backend.
//!
//! Owns the records that make a run resumable and their meaning:
//!
//! - the **offset log** ([`OffsetRecord`], one per bucket): the bucket's row range, the byte
//!   positions to re-read it and the input fingerprint, written together with the bucket's
//!   unique IDs (in input order), atomically, and made durable before any of its items is
//!   dispatched: a write-ahead record;
//! - the **results** ([`ItemRecord`], one per unique ID, keyed by ID), written once the item
//!   is final (ok or failed); a replayed ID overwrites its own record, so output never
//!   duplicates; an ID of a planned bucket without a record is pending;
//! - the **commit log** ([`CommitRecord`], one per bucket): written only after every result of
//!   the bucket is durable;
//! - the job's spec and the planner's position in the input.
//!
//! The embedded default is [`sled`](sled_store::SledStore); the trait is what a shared backend
//! implements to let several workers share a job.

pub mod sled_store;

use std::future::Future;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::input::{Cursor, Fingerprint};
use crate::job::JobSpec;
use crate::retry::ErrorClass;

pub use sled_store::SledStore;

/// The store format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Errors of the store. Each says which state directory it is about.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path} is not a highwater state directory: {reason}")]
    NotAStore { path: PathBuf, reason: String },
    #[error("{path} is in use by another highwater process{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Busy { path: PathBuf, pid: Option<u32> },
    #[error("{path} holds store format version {found}; this highwater reads version {supported}")]
    Version {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("the store in {path} is corrupt or truncated: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store error in {path}: {reason}")]
    Backend { path: PathBuf, reason: String },
}

/// The write-ahead record of one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetRecord {
    pub bucket: u64,
    /// Where the bucket's first row starts (row index, line, byte).
    pub start: Cursor,
    /// Where the row after the bucket starts.
    pub end: Cursor,
    /// Unique IDs in the bucket: the items to call.
    pub items: u64,
    /// Rows whose ID appeared in an earlier row.
    pub duplicates: u64,
    /// Rows that held no usable ID (skipped with `--skip-bad-lines`).
    pub bad_lines: u64,
    /// The input the bucket was cut from.
    pub input: Fingerprint,
    pub planned_at_ms: u64,
}

/// The completion record of one bucket: all its results are durable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRecord {
    pub bucket: u64,
    pub ok: u64,
    pub failed: u64,
    pub committed_at_ms: u64,
}

/// Where an item stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemStatus {
    Pending,
    Ok,
    Failed,
}

/// One unique ID's record, keyed by the ID.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemRecord {
    /// The row of the ID's first occurrence.
    pub row: u64,
    pub bucket: u64,
    pub status: ItemStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<ErrorClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub attempts: u32,
    /// Every failed attempt's error class, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_errors: Vec<crate::retry::AttemptNote>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
}

impl ItemRecord {
    pub fn pending(row: u64, bucket: u64) -> ItemRecord {
        ItemRecord {
            row,
            bucket,
            status: ItemStatus::Pending,
            http_status: None,
            body: None,
            class: None,
            error: None,
            attempts: 0,
            attempt_errors: Vec::new(),
            latency_ms: None,
            finished_at_ms: None,
        }
    }

    pub fn is_final(&self) -> bool {
        self.status != ItemStatus::Pending
    }
}

/// An input line that held no usable ID, recorded with `--skip-bad-lines`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadLine {
    pub row: u64,
    pub line: u64,
    pub reason: String,
}

/// One bucket as the planner cut it, ready to be written ahead of its work.
#[derive(Debug, Clone)]
pub struct PlannedBucket {
    pub offset: OffsetRecord,
    /// Unique IDs with their rows, in input order.
    pub items: Vec<(u64, String)>,
    pub bad_lines: Vec<BadLine>,
}

/// Where the planner stands in the input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannerState {
    /// The next bucket to plan.
    pub next_bucket: u64,
    /// Where the next bucket starts in the input.
    pub cursor: Cursor,
    /// The input has been read to its end.
    pub exhausted: bool,
}

/// Figures derived from the store's records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    pub buckets_planned: u64,
    pub buckets_committed: u64,
    pub buckets_in_flight: u64,
    /// Rows read from the input so far (bad and duplicate rows included).
    pub rows_read: u64,
    /// Unique IDs planned so far.
    pub ids_planned: u64,
    pub ok: u64,
    pub failed: u64,
    pub pending: u64,
    pub duplicates: u64,
    pub bad_lines: u64,
    /// The input was read to its end.
    pub input_exhausted: bool,
    /// Bytes of the input read so far.
    pub input_bytes_read: u64,
}

impl StoreStats {
    /// Every row planned and every bucket committed.
    pub fn finished(&self) -> bool {
        self.input_exhausted && self.buckets_in_flight == 0
    }
}

/// The storage a job's progress lives in.
///
/// Calls are cheap and synchronous except [`Store::sync`], which waits for durability.
/// Writes become durable only once a later `sync` returns.
pub trait Store: Send + Sync + 'static {
    /// The stored job, if the job was created.
    fn job(&self) -> Result<Option<JobSpec>, StoreError>;
    /// Store the job spec (at creation, or with changed operational fields).
    fn put_job(&self, spec: &JobSpec) -> Result<(), StoreError>;
    /// Where the planner stands.
    fn planner(&self) -> Result<PlannerState, StoreError>;
    /// Whether an ID has a final result (its first occurrence was in an earlier bucket).
    fn has_result(&self, id: &str) -> Result<bool, StoreError>;
    /// Atomically write planned buckets (offset records, their unique IDs, bad lines)
    /// together with the planner's new position.
    fn plan(&self, buckets: &[PlannedBucket], planner: &PlannerState) -> Result<(), StoreError>;
    /// Write final item records.
    fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError>;
    /// Write commit records. Callers make the buckets' results durable first.
    fn commit(&self, commits: &[CommitRecord]) -> Result<(), StoreError>;
    /// Make every earlier write durable.
    fn sync(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Buckets with an offset record but no commit record, in bucket order.
    fn open_buckets(&self) -> Result<Vec<OffsetRecord>, StoreError>;
    /// The unique IDs of a bucket, in input order, with their records.
    fn bucket_items(&self, bucket: &OffsetRecord) -> Result<Vec<(String, ItemRecord)>, StoreError>;
    /// Every final record in input order.
    fn for_each_final(
        &self,
        f: &mut dyn FnMut(&str, &ItemRecord) -> std::io::Result<()>,
    ) -> Result<(), ExportError>;
    /// Recorded bad lines, in input order, at most `limit`.
    fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError>;
    /// Figures for `status` and the run summary.
    fn stats(&self) -> Result<StoreStats, StoreError>;
}

/// Errors while walking the results for an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the export: {0}")]
    Write(#[from] std::io::Error),
}
