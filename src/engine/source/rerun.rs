//! [`RerunLog`]: a rerun's log, run by the only worker (it holds the job's lease). Its work
//! is the rerun's open buckets, written ahead when the rerun was created: nothing is planned.
//! They are read one at a time as they are dispatched, so the run's memory does not grow
//! with the rerun's size; each item carries the record it replaces (whose history the new
//! record keeps), and the writer commits to the rerun's commit log.

use std::sync::Arc;

use super::{job_lease, Source};
use crate::engine::dispatcher::Dispatcher;
use crate::engine::error::EngineError;
use crate::engine::item::{rerun_work, with_marks};
use crate::engine::member::{Alone, Member};
use crate::engine::writer::Track;
use crate::progress::Counters;
use crate::store::{JobView, Lease, Leases, Log, RerunOffset, Store};
use crate::throttle::Throttle;

/// A rerun's log (see the module doc).
pub(in crate::engine) struct RerunLog<S> {
    store: Arc<S>,
    rerun: u32,
    lease: Lease,
    /// The rerun's buckets without a commit record, in bucket order.
    open: Vec<RerunOffset>,
    /// The job pages: its IDs continue at the pages this rerun's earlier runs kept.
    paged: bool,
}

impl<S: Store + Leases> RerunLog<S> {
    /// Take the job's lease and list the rerun's open buckets.
    pub(in crate::engine) async fn open(
        store: Arc<S>,
        rerun: u32,
        paged: bool,
    ) -> Result<RerunLog<S>, EngineError> {
        let lease = job_lease(&*store).await?;
        let open = store.rerun_open_buckets(rerun).await?;
        Ok(RerunLog {
            store,
            rerun,
            lease,
            open,
            paged,
        })
    }
}

impl<S: Store + Leases> Source for RerunLog<S> {
    fn log(&self) -> Log {
        Log::Rerun(self.rerun)
    }

    fn member(&mut self, _throttle: &Arc<Throttle>) -> Arc<dyn Member> {
        Arc::new(Alone)
    }

    async fn feed(
        &mut self,
        dispatcher: &mut Dispatcher,
        _counters: &Arc<Counters>,
    ) -> Result<(), EngineError> {
        for offset in std::mem::take(&mut self.open) {
            if dispatcher.stop.is_stopping() {
                break;
            }
            let items = self.store.rerun_bucket_items(&offset).await?;
            let (done, mut todo) = rerun_work(self.rerun, offset.bucket, items);
            with_marks(&*self.store, self.paged, self.rerun, &mut todo).await?;
            let track = Track {
                key: offset.bucket,
                bucket: offset.bucket,
                remaining: todo.len() as u64,
                done,
                lease: self.lease.clone(),
            };
            dispatcher.dispatch(vec![track], vec![todo]).await?;
        }
        Ok(())
    }

    async fn close(self) -> Result<(), EngineError> {
        Ok(self.store.release(&self.lease).await?)
    }
}
