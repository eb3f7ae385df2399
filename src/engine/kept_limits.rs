//! The windows learnt from the API's refusals, kept with the job ([`Keeper`]): a run paces by
//! those kept before its first call (a resume does not learn them again through 429s), keeps
//! what it learns as it learns it, and, as one worker of a fleet, paces by what any worker
//! learnt (each change merged in the store: `quota::merge_kept`).
//!
//! Losing them is never losing data: a store that fails to keep or read them is logged once,
//! and the run goes on learning from refusals as if none had been kept.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::quota::pacer::AnnouncedLimits;
use crate::quota::{merge_kept, KeptLimit};
use crate::store::Store;

/// How often the run compares what it learnt with what the job keeps.
pub(super) const KEEP_EVERY: Duration = Duration::from_secs(1);

/// Keeps the run's learnt windows with the job, and adopts the job's.
pub(super) struct Keeper<S> {
    store: Arc<S>,
    limits: Arc<AnnouncedLimits>,
    /// Whether a failure was logged already.
    warned: bool,
}

impl<S: Store> Keeper<S> {
    /// A keeper of `limits` with the job `store` holds.
    pub(super) fn new(store: Arc<S>, limits: Arc<AnnouncedLimits>) -> Keeper<S> {
        Keeper {
            store,
            limits,
            warned: false,
        }
    }

    /// Pace by the windows the job keeps (before the run's first call), saying which.
    pub(super) async fn restore(&mut self) {
        match self.store.learned_limits().await {
            Ok(kept) if !kept.is_empty() => {
                self.limits.adopt(&kept);
                for k in &kept {
                    tracing::info!(
                        limit = k.limit,
                        window_ms = k.length_ms,
                        refusals = k.refusals,
                        "pacing by an API limit the job learnt before: {}",
                        k.render()
                    );
                }
            }
            Ok(_) => {}
            Err(e) => self.warn(&e),
        }
    }

    /// Compare once: adopt what the job keeps that is newer, keep what is newer here.
    pub(super) async fn sync(&mut self) {
        let stored = match self.store.learned_limits().await {
            Ok(stored) => stored,
            Err(e) => return self.warn(&e),
        };
        self.limits.adopt(&stored);
        let merged = merge_kept(&stored, &self.limits.kept());
        if !same_limits(&merged, &stored) {
            if let Err(e) = self.store.keep_learned_limits(&merged).await {
                self.warn(&e);
            }
        }
    }

    /// Sync every [`KEEP_EVERY`] until aborted.
    pub(super) fn spawn(mut self) -> JoinHandle<()>
    where
        S: Send + Sync + 'static,
    {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(KEEP_EVERY).await;
                self.sync().await;
            }
        })
    }

    fn warn(&mut self, e: &dyn std::fmt::Display) {
        if !std::mem::replace(&mut self.warned, true) {
            tracing::warn!(
                "the API limits learnt from refusals could not be kept with the job: {e}"
            );
        }
    }
}

/// The same windows with the same limits and evidence (their phases move with time, which is
/// not news).
fn same_limits(a: &[KeptLimit], b: &[KeptLimit]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (x.limit, x.length_ms, x.refusals, x.changed_unix_ms)
                == (y.limit, y.length_ms, y.refusals, y.changed_unix_ms)
        })
}
