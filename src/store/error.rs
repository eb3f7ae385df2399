//! Store errors: what went wrong, the same for every backend ([`StoreError`]), and while
//! walking the results for an export ([`ExportError`]).
//!
//! A variant says what happened and what a caller can do about it (refuse, wait for another
//! process, restore from a backup, give up the bucket); none of them names a file. Where it
//! happened is the backend's to say: the sled backend wraps its errors in [`StoreError::At`]
//! with its state directory or the file concerned, a database backend with its job.
//! [`StoreError::root`] looks through that wrapping.

/// Errors of a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// What is there is not a store of this kind: missing, foreign, or not to be written into.
    #[error("not a highwater {kind}: {reason}")]
    NotAStore {
        /// What was expected, e.g. "state directory".
        kind: &'static str,
        /// What was found instead.
        reason: String,
    },
    /// Another process holds the store.
    #[error("in use by another highwater process{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Busy {
        /// The holder's process id, when the store records it.
        pid: Option<u32>,
    },
    /// The store was written in a format this build does not read.
    #[error("holds store format version {found}; this highwater reads version {supported}")]
    Version {
        /// The store's format version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The store lost or garbled data it had made durable.
    #[error("the store is corrupt or truncated: {reason}")]
    Corrupt {
        /// What was found wrong.
        reason: String,
    },
    /// A write was fenced off: the lease it carried is not the one the store holds now (another
    /// worker took the bucket over, or the lease expired). Nothing of that write was applied.
    #[error(
        "the lease on {scope} (token {token}) is not held any more: another worker owns it now"
    )]
    LeaseLost {
        /// What the lease was on (a bucket, the planner).
        scope: String,
        /// The lease the write carried.
        token: u64,
    },
    /// A file system operation failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Anything else the backend reports.
    #[error("store error: {reason}")]
    Backend {
        /// The backend's message.
        reason: String,
    },
    /// One of the errors above, said of a place (a state directory, a file, a job).
    #[error("{place}: {source}")]
    At {
        /// The place, as the backend names it.
        place: String,
        /// The error said of it.
        source: Box<StoreError>,
    },
}

impl StoreError {
    /// `error`, said of `place` (an error already said of a place keeps its own).
    pub fn at(place: impl std::fmt::Display, error: StoreError) -> StoreError {
        match error {
            e @ StoreError::At { .. } => e,
            e => StoreError::At {
                place: place.to_string(),
                source: Box::new(e),
            },
        }
    }

    /// The error without the place it was said of.
    pub fn root(&self) -> &StoreError {
        match self {
            StoreError::At { source, .. } => source.root(),
            e => e,
        }
    }

    /// A [`StoreError::Corrupt`] for `reason`.
    pub fn corrupt(reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            reason: reason.into(),
        }
    }

    /// A [`StoreError::Backend`] for `reason`.
    pub fn backend(reason: impl Into<String>) -> StoreError {
        StoreError::Backend {
            reason: reason.into(),
        }
    }
}

/// Errors while walking the results for an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The store failed while reading the results.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Writing the export's output failed.
    #[error("writing the export: {0}")]
    Write(#[from] std::io::Error),
    /// Input columns asked for that the export cannot carry: not kept by the job, or named
    /// like a column the export has.
    #[error("{0}")]
    Columns(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_said_once_and_looked_through() {
        let e = StoreError::at("/s", StoreError::Busy { pid: Some(7) });
        assert_eq!(
            e.to_string(),
            "/s: in use by another highwater process (pid 7)"
        );
        let again = StoreError::at("/s/lock", e);
        assert_eq!(
            again.to_string(),
            "/s: in use by another highwater process (pid 7)"
        );
        assert!(matches!(again.root(), StoreError::Busy { pid: Some(7) }));
    }
}
