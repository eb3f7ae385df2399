//! The [`Dispatcher`]: has the writer track each bucket a source hands it, then queues the
//! bucket's items for the workers; and, at the end of the run, lets the workers finish.
//! Where the buckets come from is the source's ([`super::source`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;

use super::error::EngineError;
use super::item::Item;
use super::queue::WorkQueue;
use super::stop::Stop;
use super::writer::{Track, WriterMsg};

/// The most items queued for the workers: enough that none waits for the dispatcher, which
/// is woken to refill it only once it has drained to half.
pub(super) fn work_queue(workers: usize) -> usize {
    (4 * workers).max(64)
}

pub(super) struct Dispatcher {
    pub(super) stop: Stop,
    pub(super) queue: Arc<WorkQueue<Item>>,
    /// `concurrency` workers, each calling the API for one item at a time.
    pub(super) workers: JoinSet<()>,
    pub(super) writer: mpsc::Sender<WriterMsg>,
    /// Rung by the writer after each commit: a source waiting for the log to finish looks
    /// again at once, not at its next poll (the last buckets are often this worker's own).
    pub(super) committed: Arc<Notify>,
}

impl Dispatcher {
    /// Have the writer track the buckets, then queue their items for the workers, bucket
    /// after bucket, until done or asked to stop.
    pub(super) async fn dispatch(
        &mut self,
        tracks: Vec<Track>,
        work: Vec<Vec<Item>>,
    ) -> Result<(), EngineError> {
        self.writer
            .send(WriterMsg::Track(tracks))
            .await
            .map_err(|_| writer_gone())?;
        for items in work {
            if self.writer.is_closed() {
                return Err(writer_gone());
            }
            if !self.queue.push_all(items, &self.stop).await {
                break;
            }
        }
        Ok(())
    }

    /// Let the workers finish what is queued and in flight; after a stop request, wait for
    /// the items in flight for at most `timeout`, then abandon them (they stay pending and
    /// are replayed). A worker that panicked fails the run.
    pub(super) async fn finish(&mut self, timeout: Duration) -> Result<(), EngineError> {
        self.queue.close();
        let mut panicked = None;
        let mut note = |done: Result<(), tokio::task::JoinError>| {
            if let Err(e) = done {
                if e.is_panic() {
                    tracing::error!("item worker failed: {e}");
                    panicked.get_or_insert(e.to_string());
                }
            }
        };
        let workers = &mut self.workers;
        let all_done = async {
            while let Some(done) = workers.join_next().await {
                note(done);
            }
        };
        if self.stop.is_stopping() {
            let _ = tokio::time::timeout(timeout, all_done).await;
        } else {
            tokio::select! {
                _ = all_done => {}
                _ = async { self.stop.stopping().await; tokio::time::sleep(timeout).await } => {}
            }
        }
        // Workers still running are busy with an item (idle ones end at the stop, unless the
        // timeout was too short for them to see it); aborting one mid-item counts its item
        // abandoned.
        let left = self.workers.len() as u64;
        if left > 0 {
            tracing::warn!(
                workers = left,
                "stopping with workers still busy; their items stay pending and are replayed"
            );
            self.workers.abort_all();
            // Joined one by one, not `shutdown`, so a panic on the way out is still reported.
            while let Some(done) = self.workers.join_next().await {
                note(done);
            }
        }
        match panicked {
            Some(e) => Err(EngineError::Internal(format!("item worker: {e}"))),
            None => Ok(()),
        }
    }
}

fn writer_gone() -> EngineError {
    EngineError::Internal("the result writer stopped".into())
}
