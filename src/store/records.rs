//! The records that make a run resumable, and their meaning:
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
//! - the job's spec ([`StoredJob`]) and the planner's position in the input
//!   ([`PlannerState`]);
//! - **reruns** ([`RerunRecord`], numbered from 1): a rerun is a second log beside the job's
//!   own, with its fixed selection of IDs cut into rerun buckets ([`RerunBucket`]), written
//!   and made durable before any of them is called, and a commit record per rerun bucket
//!   written only after its new results are durable. Committing a rerun bucket also moves
//!   the ok/failed counts of the job buckets its IDs belong to, in the same atomic write;
//!
//! and the figures a job's records add up to ([`StoreStats`], [`RerunStats`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::failure::ErrorClass;
use crate::input::{Cursor, Fingerprint};
use crate::meter::Usage;

/// The store format this build reads and writes. 6: the results log is written in groups of
/// records, one header and checksum per group (format 5's entries of one record are still
/// read where they are); 5: item records are binary with their
/// bodies compressed (format 4 wrote JSON records, which this build still reads); 4: a
/// rerun's ID lists are in `ids.log` like the job's (format 3 kept them in sled, where this
/// build still reads them).
pub const FORMAT_VERSION: u32 = 6;

/// A job's spec as a store keeps it: opaque bytes in an encoding the job module owns and
/// versions ([`crate::job::JobSpec::to_stored`]), with the job's id, which a store may use to
/// tell its job from another (the sled backend checks it at open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredJob {
    /// The job's id, stable across runs.
    pub id: String,
    /// The encoding's version.
    pub version: u32,
    /// The encoded spec.
    pub spec: Vec<u8>,
}

/// Milliseconds since the Unix epoch by the system's clock: what a look at a job from
/// outside a run reads (a status, a dashboard); a run reads its own
/// [`crate::clock::Clock`] ([`crate::RunOptions::clock`]).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The write-ahead record of one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetRecord {
    /// The bucket's number, from 0 in input order.
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
    /// When the record was written (ms since the Unix epoch).
    pub planned_at_ms: u64,
}

/// The completion record of one bucket: all its results are durable. A bucket whose record
/// counts failures is "committed with failures".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRecord {
    /// The bucket's number.
    pub bucket: u64,
    /// IDs of the bucket whose final result is ok.
    pub ok: u64,
    /// IDs of the bucket whose final result is a failure.
    pub failed: u64,
    /// When the bucket was committed (ms since the Unix epoch).
    pub committed_at_ms: u64,
    /// The failed IDs by error class (absent in records written before it existed: then
    /// its sum is not `failed`, and readers count from the items).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed_by_class: BTreeMap<String, u64>,
    /// What the calls of the bucket's IDs cost, as their answers said (zero in records
    /// written before it was counted).
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

impl CommitRecord {
    /// The commit record of `bucket` with `tally`'s counts, stamped `at_ms` (ms since the
    /// Unix epoch, by the run's [`crate::clock::Clock`]).
    pub fn new(bucket: u64, tally: Tally, at_ms: u64) -> CommitRecord {
        CommitRecord {
            bucket,
            ok: tally.ok,
            failed: tally.failed,
            committed_at_ms: at_ms,
            failed_by_class: tally.failed_by_class,
            usage: tally.usage,
        }
    }

    /// Whether `failed_by_class` accounts for every failure.
    pub fn classes_complete(&self) -> bool {
        self.failed_by_class.values().sum::<u64>() == self.failed
    }
}

/// Counts of final results, as a commit record keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Records with status ok.
    pub ok: u64,
    /// Records with status failed.
    pub failed: u64,
    /// The failed records by error class name (`class_name`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed_by_class: BTreeMap<String, u64>,
    /// What the counted records' calls cost.
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

impl Tally {
    /// Count one record (pending ones are not counted).
    pub fn add(&mut self, record: &ItemRecord) {
        if record.status != ItemStatus::Pending {
            self.usage.add(record.usage.unwrap_or_default());
        }
        match record.status {
            ItemStatus::Ok => self.ok += 1,
            ItemStatus::Failed => {
                self.failed += 1;
                *self.failed_by_class.entry(class_name(record)).or_default() += 1;
            }
            ItemStatus::Pending => {}
        }
    }
}

/// The error class of a failed record, as `failures --class` names it.
pub(crate) fn class_name(record: &ItemRecord) -> String {
    class_label(record.class)
}

/// The name a failure class is counted under ("unknown" for none).
pub(crate) fn class_label(class: Option<ErrorClass>) -> String {
    class.map_or_else(|| "unknown".to_string(), |c| c.to_string())
}

/// Where an item stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemStatus {
    /// Planned, no final result yet.
    Pending,
    /// Final: the work succeeded.
    Ok,
    /// Final: the work failed permanently or ran out of attempts.
    Failed,
}

/// One unique ID's record, keyed by the ID.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemRecord {
    /// The row of the ID's first occurrence.
    pub row: u64,
    /// The bucket the ID belongs to.
    pub bucket: u64,
    /// Pending until the item's final result is written.
    pub status: ItemStatus,
    /// The last attempt's HTTP status; none for a handler without one (exec, closure) or a failure before any answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// The handler's result (JSON) when ok; none when failed or pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Box<RawValue>>,
    /// The final failure's class; none unless failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<ErrorClass>,
    /// The final failure's message; none unless failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Attempts made (free ones included), summed across reruns; 0 while pending.
    #[serde(default)]
    pub attempts: u32,
    /// Every failed attempt's error class, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_errors: Vec<crate::failure::AttemptNote>,
    /// The last attempt's latency (ms); set only when ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// When the final result was made (ms since the Unix epoch); none while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// When the item's first attempt started (across reruns: the very first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_attempt_ms: Option<u64>,
    /// When the item's last attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_ms: Option<u64>,
    /// The rerun that wrote this record (none: the job's own run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun: Option<u32>,
    /// What the item's calls cost, summed across reruns, as their answers said; none when no
    /// answer said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::meter::Usage>,
    /// The pages of a paginated ID's answer the store keeps for it ([`super::PageRecord`],
    /// in the generation of [`ItemRecord::rerun`]): its result is their items, in order, and
    /// `body` is none. None for a record whose result is its body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages: Option<u32>,
    /// The kept columns of the ID's input row (a JSON object), when the job keeps any: read
    /// back with the ID from the plan, never written with the record.
    #[serde(skip)]
    pub values: Option<Box<str>>,
}

impl ItemRecord {
    /// The record of an ID planned but not yet done.
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
            first_attempt_ms: None,
            last_attempt_ms: None,
            rerun: None,
            usage: None,
            pages: None,
            values: None,
        }
    }

    /// Whether the item has a final result (ok or failed).
    pub fn is_final(&self) -> bool {
        self.status != ItemStatus::Pending
    }

    /// Carry the history of `prior` (the record this one replaces in a rerun) into this
    /// one: attempts add up, earlier attempt errors come first (with the prior final error
    /// when it was a failure), the first attempt time is the earliest.
    pub fn continue_from(&mut self, prior: &ItemRecord) {
        self.attempts += prior.attempts;
        self.usage = match (prior.usage, self.usage) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        let mut errors = prior.attempt_errors.clone();
        errors.append(&mut self.attempt_errors);
        self.attempt_errors = errors;
        self.first_attempt_ms = match (prior.first_attempt_ms, self.first_attempt_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// An input line that held no usable ID, recorded with `--skip-bad-lines`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadLine {
    /// The row's 0-based index.
    pub row: u64,
    /// The row's 1-based line in the file.
    pub line: u64,
    /// Why the line held no usable ID.
    pub reason: String,
}

/// One bucket as the planner cut it, ready to be written ahead of its work.
#[derive(Debug, Clone)]
pub struct PlannedBucket {
    /// The bucket's write-ahead record.
    pub offset: OffsetRecord,
    /// Unique IDs with their rows, in input order.
    pub items: Vec<(u64, String)>,
    /// The kept columns of each item's row, one JSON object per item in `items`' order;
    /// empty when the job keeps no columns.
    pub values: Vec<String>,
    /// The lines skipped in the bucket's rows.
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

/// Which IDs a rerun calls again, fixed when it is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RerunSelection {
    /// Every failed ID of the job.
    Failed,
    /// The failed IDs of these buckets, or all their IDs.
    Buckets {
        /// Job bucket numbers.
        buckets: Vec<u64>,
        /// Call every ID of them, not only the failed ones.
        all_items: bool,
    },
    /// Exactly the IDs of a file, one per line.
    Ids {
        /// The file's canonical path.
        file: PathBuf,
        /// The file's fingerprint when the rerun was created.
        fingerprint: Fingerprint,
    },
}

/// A rerun: its number, what it selected, and how big it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RerunRecord {
    /// 1, 2, ... in creation order.
    pub number: u32,
    /// Which IDs it calls again.
    pub selection: RerunSelection,
    /// Rerun buckets and IDs in the selection.
    pub buckets: u64,
    /// IDs in the selection.
    pub ids: u64,
    /// When the rerun was created (ms since the Unix epoch).
    pub created_at_ms: u64,
}

/// How many IDs of one job bucket a rerun bucket holds, by their status before the rerun.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobBucketShare {
    /// The job bucket.
    pub bucket: u64,
    /// Of its IDs in the rerun bucket, those ok before the rerun.
    pub ok: u64,
    /// Of its IDs in the rerun bucket, those failed before the rerun.
    pub failed: u64,
    /// The failed ones by error class name (`class_name`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed_by_class: BTreeMap<String, u64>,
    /// What the calls of its IDs in the rerun bucket had cost before the rerun.
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

/// The write-ahead record of one rerun bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RerunOffset {
    /// The rerun's number.
    pub rerun: u32,
    /// The rerun bucket's number, from 0 within the rerun.
    pub bucket: u64,
    /// IDs in the rerun bucket.
    pub items: u64,
    /// Its IDs per job bucket, by status before the rerun: what its commit moves.
    pub before: Vec<JobBucketShare>,
    /// When the record was written (ms since the Unix epoch).
    pub planned_at_ms: u64,
}

/// One rerun bucket, written ahead of its work.
#[derive(Debug, Clone)]
pub struct RerunBucket {
    /// The rerun bucket's write-ahead record.
    pub offset: RerunOffset,
    /// The IDs with their input rows, in input order.
    pub items: Vec<(u64, String)>,
    /// The kept columns of each item's row, as [`PlannedBucket::values`].
    pub values: Vec<String>,
}

/// Where a rerun stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RerunStats {
    /// The rerun's number.
    pub number: u32,
    /// Rerun buckets in the selection.
    pub buckets: u64,
    /// Rerun buckets committed.
    pub buckets_committed: u64,
    /// IDs in the selection.
    pub ids: u64,
    /// IDs with a result written by this rerun, by outcome.
    pub ok: u64,
    /// IDs this rerun finished failed (see `ok`).
    pub failed: u64,
    /// IDs of the selection without a result from this rerun yet.
    pub pending: u64,
}

impl RerunStats {
    /// Whether every rerun bucket is committed.
    pub fn finished(&self) -> bool {
        self.buckets_committed == self.buckets
    }
}

/// Figures derived from the store's records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// Buckets with an offset record.
    pub buckets_planned: u64,
    /// Buckets with a commit record.
    pub buckets_committed: u64,
    /// Buckets planned and not committed.
    pub buckets_in_flight: u64,
    /// Rows read from the input so far (bad and duplicate rows included).
    pub rows_read: u64,
    /// Unique IDs planned so far.
    pub ids_planned: u64,
    /// IDs whose final result is ok.
    pub ok: u64,
    /// IDs whose final result is a failure.
    pub failed: u64,
    /// Planned IDs without a final result.
    pub pending: u64,
    /// Rows whose ID appeared in an earlier row.
    pub duplicates: u64,
    /// Rows without a usable ID (skipped with `--skip-bad-lines`).
    pub bad_lines: u64,
    /// The input was read to its end.
    pub input_exhausted: bool,
    /// Bytes of the input read so far.
    pub input_bytes_read: u64,
    /// What the calls of the IDs with a final result cost, as their answers said.
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

impl StoreStats {
    /// Every row planned and every bucket committed.
    pub fn finished(&self) -> bool {
        self.input_exhausted && self.buckets_in_flight == 0
    }
}
