//! The lease of a state directory: its flock (see [`Leases`] on [`SledStore`]).

use std::sync::atomic::Ordering;

use super::SledStore;
use crate::store::{Commit, Lease, LeaseScope, LeaseToken, Leases, NoFleet, StoreError};
use crate::watchdog;

impl SledStore {
    /// Refuse a lease this store does not hold (see [`Leases`]).
    fn check_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        if self.lease.load(Ordering::Acquire) == lease.token.0 {
            return Ok(());
        }
        Err(StoreError::at(
            self.path.display(),
            StoreError::LeaseLost {
                scope: format!("{:?}", lease.scope),
                token: lease.token.0,
            },
        ))
    }
}

/// The state directory's flock is the lease: one process works on the job, so every scope
/// is granted, under one token per acquisition (stored in sled, so tokens only grow across
/// runs: the run number). A newer acquisition supersedes the older lease, whose commits are
/// refused from then on, as are those of a released one.
impl Leases for SledStore {
    type Fleet = NoFleet;

    async fn acquire(&self, scope: LeaseScope) -> Result<Option<Lease>, StoreError> {
        let t = self.t()?;
        let token = self.tokens.fetch_add(1, Ordering::AcqRel) + 1;
        t.meta
            .insert("lease", &token.to_be_bytes())
            .map_err(|e| self.err(e))?;
        self.lease.store(token, Ordering::Release);
        Ok(Some(Lease {
            scope,
            token: LeaseToken(token),
        }))
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.check_lease(lease)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let _ = self
            .lease
            .compare_exchange(lease.token.0, 0, Ordering::AcqRel, Ordering::Acquire);
        Ok(())
    }

    async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), StoreError> {
        let _watch = watchdog::watch("writing commit records");
        self.check_lease(lease)?;
        match commit {
            Commit::Job(commits) => self.commit_job(commits),
            Commit::Rerun {
                rerun,
                buckets,
                moved,
            } => self.commit_rerun(rerun, buckets, moved),
        }
    }
}
