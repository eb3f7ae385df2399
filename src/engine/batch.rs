//! A batch job's units: up to its batch size of one bucket's items sent in one request, then
//! each ID's part of the answer made its record.
//!
//! A batch's request goes through the same gates and retries as an item's
//! ([`ItemTask::attempt`]): the rate limit, the quotas, the concurrency and the retry policy
//! count requests. Its answer is split into each ID's part ([`crate::handler::batch`]):
//!
//! - an ID whose part is a result, or a failure for good (`fail-if`), has its record;
//! - an ID the answer does not mention, or whose part asks for a retry (`retry-if`), is asked
//!   again alone: a unit of one, through the single item's path, whose answer not mentioning
//!   it is a retryable failure of class `missing`;
//! - a request refused in a way that may be one ID's doing (the handler says:
//!   [`may_be_one_ids`], a 4xx other than 401, 407 or 429) is split in halves, each sent
//!   again, until the culprit stands alone and fails by itself;
//! - any other failure (out of attempts on 503s, an outage past its limit) is every item's.
//!
//! Each record is handed to the writer as an item's is: a bucket commits when all its items
//! have theirs, whatever unit they were in, and what was in flight at a crash is replayed.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use tokio::sync::SemaphorePermit;

use super::item::Item;
use super::worker::{AttemptState, ItemTask, Slot, Times};
use crate::failure::Next;
use crate::handler::batch::{may_be_one_ids, BatchAnswer};
use crate::handler::Handler;
use crate::progress::Counters;
use crate::retry::{self, ItemOutcome};
use crate::throttle::ItemHistory;

impl<H: Handler> ItemTask<H> {
    /// A unit of several items (its first attempt given `first`), each to its record, with
    /// the units it splits into (see the module doc).
    pub(super) fn batch<'a>(
        &'a self,
        items: Vec<Item>,
        slot: &'a Slot<'a>,
        first: Option<SemaphorePermit<'a>>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            if items.len() == 1 {
                let item = items.into_iter().next().expect("one item");
                let permit = match first {
                    Some(permit) => permit,
                    None => tokio::select! {
                        permit = slot.permits().acquire() => {
                            permit.expect("the semaphore is never closed")
                        }
                        _ = self.stop.stopping() => {
                            Counters::add(&self.counters.abandoned, 1);
                            return;
                        }
                    },
                };
                return self.process(item, slot, permit).await;
            }
            let first = &Mutex::new(first);
            let (first_at, last_at, last_latency) =
                (&AtomicU64::new(0), &AtomicU64::new(0), &AtomicU64::new(0));
            let history = &ItemHistory::default();
            let state = AttemptState {
                slot,
                first,
                permits: slot.permits(),
                history,
                first_at,
                last_at,
                last_latency,
                estimate: &|| None,
                most: &|| None,
            };
            let state = &state;
            let handler = &*self.handler;
            let request: Vec<(&str, Option<&str>)> = items
                .iter()
                .map(|i| (i.id.as_str(), i.values.as_deref()))
                .collect();
            let request = &request;
            let outcome: ItemOutcome<BatchAnswer> = retry::run(
                &self.spec.retry,
                |attempt| self.attempt(state, attempt, || handler.call_batch(request)),
                self.stop.stopping(),
            )
            .await;
            let times = Times {
                first_ms: first_at.load(Relaxed),
                last_ms: last_at.load(Relaxed),
                latency_us: last_latency.load(Relaxed),
            };
            match outcome {
                ItemOutcome::Abandoned => {
                    Counters::add(&self.counters.abandoned, items.len() as u64);
                }
                ItemOutcome::Ok {
                    output,
                    attempts,
                    errors,
                } => {
                    let mut parts: HashMap<String, _> = HashMap::with_capacity(output.parts.len());
                    for (id, part) in output.parts {
                        // An ID the answer holds twice: its first part.
                        parts.entry(id).or_insert(part);
                    }
                    let mut again = Vec::new();
                    for item in items {
                        let outcome = match parts.remove(&item.id) {
                            Some(Ok(output)) => ItemOutcome::Ok {
                                output,
                                attempts,
                                errors: errors.clone(),
                            },
                            Some(Err(error)) if error.next == Next::Permanent => {
                                ItemOutcome::Failed {
                                    error,
                                    attempts,
                                    errors: errors.clone(),
                                }
                            }
                            // Not mentioned, or its part asks for a retry: alone, again.
                            _ => {
                                again.push(item);
                                continue;
                            }
                        };
                        self.finish(item, outcome, times).await;
                    }
                    let alone = again
                        .into_iter()
                        .map(|item| self.batch(vec![item], slot, None));
                    futures_util::future::join_all(alone).await;
                }
                ItemOutcome::Failed {
                    error,
                    attempts,
                    errors,
                } => {
                    if may_be_one_ids(&error) {
                        let mut left = items;
                        let right = left.split_off(left.len() / 2);
                        tracing::debug!(
                            ids = left.len() + right.len(),
                            status = error.status,
                            "a batch refused with a 4xx: asking in halves"
                        );
                        let halves = [self.batch(left, slot, None), self.batch(right, slot, None)];
                        futures_util::future::join_all(halves).await;
                        return;
                    }
                    for item in items {
                        let outcome = ItemOutcome::Failed {
                            error: error.clone(),
                            attempts,
                            errors: errors.clone(),
                        };
                        self.finish(item, outcome, times).await;
                    }
                }
            }
        })
    }
}
