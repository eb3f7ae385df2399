//! The keys the store's rows are addressed by: a job's row id ([`JobId`]), a worker session
//! ([`WorkerId`]), a log's number in `hw_bucket.rerun` ([`log_number`]) and one held bucket
//! lease ([`Lease`]). Plain values, no SQL: every other file here may use them.

/// A job's row id in `hw_job`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct JobId(pub i64);

/// A worker session: the random UUID of one process start (text form).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkerId(pub String);

impl std::fmt::Display for WorkerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A log's number in `hw_bucket.rerun`: 0 for the job's own, n for rerun n.
pub(super) fn log_number(log: crate::store::Log) -> i32 {
    match log {
        crate::store::Log::Job => 0,
        crate::store::Log::Rerun(n) => i32::try_from(n).unwrap_or(i32::MAX),
    }
}

/// One held bucket lease: which bucket of which log, and the token it was granted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The job's log or a rerun's.
    pub log: crate::store::Log,
    /// The bucket's number in that log.
    pub bucket: u64,
    /// The fencing token the lease was granted with.
    pub token: i64,
}
