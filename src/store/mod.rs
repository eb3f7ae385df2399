//! Store: where a job's progress lives, behind a trait so the engine does not know its backend.
//!
//! It owns the records that make a run resumable and their meaning (`records`: the offset
//! log written ahead of the work, the results keyed by ID, the commit log, the job's spec,
//! the planner's position, reruns).
//!
//! A backend implements the small async seam in [`backend`] ([`Store`] and [`Leases`], and
//! [`Fleet`] if several workers may share a job through it);
//! everything derived from the records ([`JobView`]: statistics, the export's walk, failure
//! listings, a rerun's count moves) is written once above it. The embedded default is
//! [`sled`](sled_store::SledStore); [`mem::MemStore`] keeps everything in memory (tests,
//! and the reference a new backend is compared with by the conformance suite in the
//! crate's private `conformance` module).

pub mod backend;
mod error;
pub mod mem;
mod pages;
#[cfg(feature = "postgres")]
pub mod postgres;
mod records;
pub mod sled_store;
pub mod view;

pub(crate) use backend::worker_label;
pub use backend::{
    BucketState, Commit, Fleet, FleetKind, FleetRate, FleetVisitor, Lease, LeaseScope, LeaseToken,
    LeasedBucket, Leases, Log, NoFleet, RerunBucketState, Store,
};
pub use error::{ExportError, StoreError};
pub use pages::{PageMark, PageRecord};
pub(crate) use records::{class_label, class_name};
pub use records::{
    now_ms, BadLine, CommitRecord, ItemRecord, ItemStatus, JobBucketShare, OffsetRecord,
    PlannedBucket, PlannerState, RerunBucket, RerunOffset, RerunRecord, RerunSelection, RerunStats,
    StoreStats, StoredJob, Tally, FORMAT_VERSION,
};
pub use sled_store::SledStore;
pub use view::{FinalVisit, JobView};
