//! The quota gate: every attempt takes a call from each of the job's quotas before it
//! starts ([`QuotaGate::acquire`]), and waits, holding no ID's attempts, while a window is
//! spent. The job's budget, once spent, stops the run ([`QuotaStop::Spent`]).
//!
//! Calls are reserved in the store a few at a time ([`crate::quota::chunk`]) before they are
//! made, so a crash never loses count (see [`crate::quota`]); the store's answer, not the
//! local clock, says which slot the calls were reserved in and when a spent window frees
//! calls (a fleet's database counts in its own time).
//!
//! A fixed window's boundary: a call made just before it may reach the API just after, and
//! count in the API's next window. So the first reservation in a new fixed window also takes
//! one call for each call still in flight: the API may count them there.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::quota::{chunk, Quota, QuotaGrant, QuotaState, QuotaWant, Window};
use crate::store::{now_ms, Store, StoreError};

/// Where the gate reserves calls: the job's store.
pub(crate) trait QuotaBook: Send + Sync + 'static {
    fn reserve<'a>(
        &'a self,
        wants: &'a [QuotaWant],
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<QuotaGrant>, StoreError>>;
}

impl<S: Store> QuotaBook for S {
    fn reserve<'a>(
        &'a self,
        wants: &'a [QuotaWant],
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<QuotaGrant>, StoreError>> {
        Box::pin(self.reserve_quota(wants, now_ms))
    }
}

/// Why no call may start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuotaStop {
    /// The job's budget is spent: the run stops; a larger budget continues it.
    #[error(
        "the job's budget of {} calls is spent; every result so far is durable (raise the \
         budget to go on)",
        .0.limit
    )]
    Spent(Quota),
    #[error("reserving quota: {0}")]
    Store(#[from] StoreError),
}

/// This run's hold on the job's quotas.
pub(crate) struct QuotaGate {
    quotas: Vec<Quota>,
    book: Arc<dyn QuotaBook>,
    /// Taken by every acquire: one reservation at a time, and waiters in line while a window
    /// is spent.
    local: tokio::sync::Mutex<Vec<Local>>,
    in_flight: Arc<AtomicU64>,
    /// Where each quota stands (shared with the run's counters, for reports).
    states: Arc<Mutex<Vec<QuotaState>>>,
}

/// One quota's calls reserved by this run and not yet used.
#[derive(Debug, Default, Clone, Copy)]
struct Local {
    /// The slot they were reserved in (the store's word).
    slot_ms: Option<u64>,
    available: u64,
}

/// A call taken from every quota, in flight until dropped.
pub(crate) struct QuotaCall(Arc<AtomicU64>);

impl Drop for QuotaCall {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl QuotaGate {
    pub(crate) fn new(quotas: Vec<Quota>, book: Arc<dyn QuotaBook>) -> QuotaGate {
        let states = quotas
            .iter()
            .map(|q| QuotaState {
                quota: q.to_string(),
                limit: q.limit,
                used: 0,
                frees_at_ms: None,
                window_ms: q.window.length().map(|l| l.as_millis() as u64),
                exhausted: false,
            })
            .collect();
        QuotaGate {
            local: tokio::sync::Mutex::new(vec![Local::default(); quotas.len()]),
            quotas,
            book,
            in_flight: Arc::new(AtomicU64::new(0)),
            states: Arc::new(Mutex::new(states)),
        }
    }

    /// Where each quota stands, as the gate keeps it up to date.
    pub(crate) fn states(&self) -> Arc<Mutex<Vec<QuotaState>>> {
        self.states.clone()
    }

    /// Take a call from every quota, waiting while one is spent.
    pub(crate) async fn acquire(&self) -> Result<QuotaCall, QuotaStop> {
        let mut local = self.local.lock().await;
        loop {
            let now = now_ms();
            // Calls reserved in a slot that has passed are no use now.
            for (q, l) in self.quotas.iter().zip(local.iter_mut()) {
                if l.slot_ms != Some(q.window.slot(now).0) {
                    l.available = 0;
                }
            }
            if local.iter().all(|l| l.available > 0) {
                for l in local.iter_mut() {
                    l.available -= 1;
                }
                self.in_flight.fetch_add(1, Relaxed);
                return Ok(QuotaCall(self.in_flight.clone()));
            }
            let in_flight = self.in_flight.load(Relaxed);
            let (which, wants): (Vec<usize>, Vec<QuotaWant>) = self
                .quotas
                .iter()
                .zip(local.iter())
                .enumerate()
                .filter(|(_, (_, l))| l.available == 0)
                .map(|(i, (q, l))| {
                    // A fixed window this run made calls in before, now passed: the calls in
                    // flight may count in the new one.
                    let carry = match q.window {
                        Window::Fixed { .. }
                            if l.slot_ms.is_some_and(|s| s != q.window.slot(now).0) =>
                        {
                            in_flight
                        }
                        _ => 0,
                    };
                    let want = QuotaWant {
                        quota: *q,
                        calls: chunk(q) + carry,
                    };
                    (i, want)
                })
                .unzip();
            let grants = self.book.reserve(&wants, now).await?;
            let mut wait_until: Option<u64> = None;
            let mut spent = None;
            {
                let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
                for ((&i, want), grant) in which.iter().zip(&wants).zip(&grants) {
                    let q = &self.quotas[i];
                    let carry = want.calls - chunk(q);
                    let l = &mut local[i];
                    l.slot_ms = Some(grant.slot_ms);
                    l.available = grant.calls.saturating_sub(carry);
                    let s = &mut states[i];
                    s.used = grant.used;
                    s.frees_at_ms = grant.frees_at_ms;
                    s.exhausted = l.available == 0;
                    if l.available == 0 {
                        match grant.frees_at_ms {
                            None => spent = Some(*q),
                            Some(at) => wait_until = Some(wait_until.map_or(at, |w| w.max(at))),
                        }
                    }
                }
            }
            if let Some(q) = spent {
                return Err(QuotaStop::Spent(q));
            }
            if let Some(at) = wait_until {
                let wait = Duration::from_millis(at.saturating_sub(now_ms()).max(10));
                // Said once per wait worth a line (a rolling window frees calls slot by slot).
                if wait >= Duration::from_secs(1) {
                    tracing::info!(
                        quotas = %self.exhausted_names(),
                        wait_ms = wait.as_millis() as u64,
                        "quota spent: waiting for its window to free calls"
                    );
                }
                tokio::time::sleep(wait).await;
                let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
                for s in states.iter_mut() {
                    s.exhausted = false;
                }
            }
        }
    }

    fn exhausted_names(&self) -> String {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|s| s.exhausted)
            .map(|s| s.quota.clone())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;

    fn gate(store: &Arc<MemStore>, quotas: &[&str]) -> QuotaGate {
        let quotas = quotas.iter().map(|q| q.parse().unwrap()).collect();
        QuotaGate::new(quotas, store.clone())
    }

    #[tokio::test]
    async fn a_budget_stops_at_its_limit_across_runs_and_a_larger_one_goes_on() {
        let store = Arc::new(MemStore::new());
        let first = gate(&store, &["10/job"]);
        for _ in 0..10 {
            drop(first.acquire().await.unwrap());
        }
        assert!(matches!(first.acquire().await, Err(QuotaStop::Spent(_))));
        assert!(first.states().lock().unwrap()[0].exhausted);
        // A new run (a resume) continues the count.
        let again = gate(&store, &["10/job"]);
        assert!(matches!(again.acquire().await, Err(QuotaStop::Spent(_))));
        let raised = gate(&store, &["15/job"]);
        for _ in 0..5 {
            drop(raised.acquire().await.unwrap());
        }
        assert!(matches!(raised.acquire().await, Err(QuotaStop::Spent(_))));
        assert_eq!(raised.states().lock().unwrap()[0].used, 15);
    }

    #[tokio::test]
    async fn a_resume_never_exceeds_what_a_killed_run_reserved() {
        let store = Arc::new(MemStore::new());
        // 500 per hour: chunks of 10. The first run makes 3 calls and is killed (dropped).
        let first = gate(&store, &["500/h"]);
        let calls: Vec<_> = futures_util::future::join_all((0..3).map(|_| first.acquire()))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        drop(calls);
        drop(first);
        let ledger = store.quota_ledger().await.unwrap();
        let window = "500/h".parse::<Quota>().unwrap().window;
        let reserved = ledger.used(&window, now_ms());
        assert!((3..=10).contains(&reserved), "{reserved}");
        // The resumed run gets what is left, no more (unless the hour turned meanwhile).
        let second = gate(&store, &["500/h"]);
        let hour = window.slot(now_ms()).0;
        let mut made = 0;
        while made < 500 {
            match tokio::time::timeout(Duration::from_millis(50), second.acquire()).await {
                Ok(call) => {
                    drop(call.unwrap());
                    made += 1;
                }
                Err(_) => break,
            }
        }
        if window.slot(now_ms()).0 == hour {
            assert_eq!(made, 500 - reserved);
            assert!(second.states().lock().unwrap()[0].exhausted);
        }
    }

    #[tokio::test]
    async fn every_quota_is_kept_and_a_spent_window_waits_for_the_next() {
        let store = Arc::new(MemStore::new());
        let gate = gate(&store, &["5/200ms", "100/job"]);
        let mut at = Vec::new();
        for _ in 0..12 {
            drop(gate.acquire().await.unwrap());
            at.push(now_ms());
        }
        let window = "5/200ms".parse::<Quota>().unwrap().window;
        let mut per_slot = std::collections::BTreeMap::<u64, u64>::new();
        for t in &at {
            *per_slot.entry(window.slot(*t).0).or_default() += 1;
        }
        assert!(per_slot.values().all(|n| *n <= 5), "{per_slot:?}");
        assert!(per_slot.len() >= 3);
        // Counted as reserved: the calls made, and at most a chunk (2) more.
        let used = gate.states().lock().unwrap()[1].used;
        assert!((12..=14).contains(&used), "{used}");
    }
}
