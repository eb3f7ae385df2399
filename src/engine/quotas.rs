//! The quota gate: every attempt takes its cost from each of the job's quotas before it
//! starts ([`QuotaGate::acquire`]), and waits, holding no ID's attempts, while a window is
//! spent. The job's budget, once spent, stops the run ([`QuotaStop::Spent`]).
//!
//! Calls are reserved in the store a few at a time ([`crate::quota::chunk`]) before they are
//! made, so a crash never loses count (see [`crate::quota`]); the store's answer, not the
//! local clock, says which slot the calls were reserved in and when a spent window frees
//! calls (a fleet's database counts in its own time).
//!
//! A quota of tokens or money takes, before the call, what the call is expected to cost
//! (tokens: the handler's estimate) or may cost at the most (money: the handler's bound, so
//! that a budget is never overspent by a call), and is settled by what the answer says it
//! cost ([`QuotaCall::settle`]): what was taken and not spent goes back to this run's
//! reserve for the same slot, what was spent beyond it is owed and taken from the next
//! reservation. A call whose cost is never known (no answer: a timeout, a dropped
//! connection) keeps what it took. A budget that cannot cover the next call waits for the
//! calls in flight to settle before it is called spent: the run stops within one call's
//! most of its cap.
//!
//! A fixed window's boundary: a call made just before it may reach the API just after, and
//! count in the API's next window. So no call starts in a fixed window's last moments
//! ([`boundary_band`]: a twentieth of the window, at most 250 ms): it waits for the next
//! window, where it is counted. A call slower to arrive than that may still cross, so the
//! first reservation in a new fixed window also takes what is still in flight, and what calls
//! of the slot before took that ended after the boundary but before that reservation: the API
//! may count them there. That carry is this run's own; another worker of a fleet may have
//! reserved the new window whole before it, which the band is there to make rare.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::meter::{Money, Unit, Usage};
use crate::quota::{chunk, Quota, QuotaGrant, QuotaState, QuotaWant, SlotUse, Window};
use crate::store::{Store, StoreError};

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
    #[error("{}", spent_message(.0, .1))]
    Spent(Quota, u64),
    /// One call costs more than a window ever allows: no wait helps.
    #[error(
        "a call is expected to cost {need} {}, more than the quota {quota} allows in a whole \
         window: raise the quota (or send less per call)",
        .quota.unit.name()
    )]
    TooCostly { quota: Quota, need: u64 },
    #[error("reserving quota: {0}")]
    Store(#[from] StoreError),
}

/// The message of a spent budget (`left`: what was left when the next call needed more).
fn spent_message(quota: &Quota, left: &u64) -> String {
    match quota.unit {
        Unit::Money(_) => format!(
            "the job's budget of {} is spent: {} is left, less than the next call may cost; \
             every result so far is durable (raise the budget to go on)",
            Money(quota.limit),
            Money(*left)
        ),
        unit => format!(
            "the job's budget of {} {} is spent; every result so far is durable (raise the \
             budget to go on)",
            quota.limit,
            unit.name()
        ),
    }
}

/// The most one call may take of a quota: far beyond any real call, and small enough that
/// the run's reserve, a signed count, never overflows.
const MOST_TAKEN: u64 = 1 << 60;

/// What a call is expected to cost, and at most, before it is made (each unknown if the
/// handler cannot tell).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cost {
    pub(crate) expected: Option<Usage>,
    pub(crate) most: Option<Usage>,
}

/// What a call turned out to cost, as its outcome tells.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Spent {
    /// The answer said (its usage).
    Reported(Usage),
    /// Nothing: the API answered with an error, which it does not bill.
    Nothing,
    /// Unknown (no answer, or one that reports no usage): what was taken stays spent.
    Unknown,
}

/// This run's hold on the job's quotas.
pub(crate) struct QuotaGate {
    quotas: Vec<Quota>,
    book: Arc<dyn QuotaBook>,
    /// Taken by every acquire: one reservation at a time, and waiters in line while a window
    /// is spent.
    local: tokio::sync::Mutex<Vec<Local>>,
    shared: Arc<Shared>,
    /// Where each quota stands (shared with the run's counters, for reports).
    states: Arc<Mutex<Vec<QuotaState>>>,
}

/// What calls in flight share with the gate.
struct Shared {
    /// Per quota, the units taken by calls in flight.
    in_flight: Vec<AtomicU64>,
    /// Per quota, what settled calls gave back and owe, until the next acquire counts it.
    settled: Mutex<Vec<Settled>>,
    /// Told when a call settles (a spent budget waits for it).
    settles: Notify,
    /// Per fixed-window quota, what calls taken in a slot that has passed and ended before
    /// the run's first reservation in the new one took: the API may have counted them in
    /// the new window (they reached it late), and no carry did.
    crossed: Vec<AtomicU64>,
    /// Per quota, the slot whose first reservation last carried the calls in flight.
    carried_slot: Vec<AtomicU64>,
    /// The run's wall clock: which slot is current.
    clock: Clock,
}

/// What settled calls gave back (in one slot) and owe (whatever their slot).
#[derive(Debug, Default, Clone, Copy)]
struct Settled {
    slot_ms: Option<u64>,
    returned: u64,
    owed: u64,
}

/// One quota's units reserved by this run and not yet used (below zero: owed).
#[derive(Debug, Default, Clone, Copy)]
struct Local {
    /// The slot they were reserved in (the store's word).
    slot_ms: Option<u64>,
    available: i64,
}

/// A call taken from every quota, in flight until settled or dropped (a dropped call keeps
/// what it took).
pub(crate) struct QuotaCall {
    shared: Arc<Shared>,
    quotas: Arc<[Quota]>,
    /// Per quota: the units taken, and the slot they were taken in.
    taken: Vec<(u64, Option<u64>)>,
}

impl QuotaCall {
    /// Settle the call by what it cost: what it took and did not spend goes back to the
    /// run's reserve, what it spent beyond that is owed.
    pub(crate) fn settle(mut self, spent: Spent) {
        let mut settled = self
            .shared
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (i, (q, &(taken, slot))) in self.quotas.iter().zip(&self.taken).enumerate() {
            if !q.unit.is_metered() {
                continue;
            }
            let cost = match spent {
                Spent::Reported(usage) => q.unit.of(Some(usage)),
                Spent::Nothing => 0,
                Spent::Unknown => taken,
            };
            let s = &mut settled[i];
            if cost > taken {
                s.owed += cost - taken;
            } else if cost < taken {
                // Given back in the newest slot only: what an older slot's call did not
                // spend is no use now (a fixed window's is gone; a rolling window's stays
                // counted, which errs on the safe side).
                if slot > s.slot_ms || s.returned == 0 {
                    *s = Settled {
                        slot_ms: slot,
                        returned: 0,
                        owed: s.owed,
                    };
                }
                if slot == s.slot_ms {
                    s.returned += taken - cost;
                }
            }
        }
        drop(settled);
        self.release();
    }

    /// The call is no longer in flight: a spent budget waiting for it looks again.
    fn release(&mut self) {
        let now = self.shared.clock.now_ms();
        for (i, (taken, slot)) in self.taken.iter_mut().enumerate() {
            let taken = std::mem::take(taken);
            let window = self.quotas[i].window;
            if let (Window::Fixed { .. }, Some(slot)) = (window, *slot) {
                let current = window.slot(now).0;
                // Read before the call leaves the count in flight: a carry that saw it
                // in flight has marked its slot by then (or counts it twice, never none).
                if slot < current && self.shared.carried_slot[i].load(SeqCst) < current {
                    self.shared.crossed[i].fetch_add(taken, SeqCst);
                }
            }
            self.shared.in_flight[i].fetch_sub(taken, SeqCst);
        }
        self.shared.settles.notify_waiters();
    }
}

impl Drop for QuotaCall {
    fn drop(&mut self) {
        self.release();
    }
}

impl QuotaGate {
    /// A gate for `quotas` reserving in `book`; `clock` says which window is current.
    pub(crate) fn new(quotas: Vec<Quota>, book: Arc<dyn QuotaBook>, clock: Clock) -> QuotaGate {
        let states = quotas
            .iter()
            .map(|q| QuotaState {
                quota: q.to_string(),
                limit: q.limit,
                used: 0,
                frees_at_ms: None,
                window_ms: q.window.length().map(|l| l.as_millis() as u64),
                exhausted: false,
                unit: q.unit,
            })
            .collect();
        QuotaGate {
            local: tokio::sync::Mutex::new(vec![Local::default(); quotas.len()]),
            shared: Arc::new(Shared {
                in_flight: quotas.iter().map(|_| AtomicU64::new(0)).collect(),
                settled: Mutex::new(vec![Settled::default(); quotas.len()]),
                settles: Notify::new(),
                crossed: quotas.iter().map(|_| AtomicU64::new(0)).collect(),
                carried_slot: quotas.iter().map(|_| AtomicU64::new(0)).collect(),
                clock,
            }),
            quotas,
            book,
            states: Arc::new(Mutex::new(states)),
        }
    }

    /// Where each quota stands, as the gate keeps it up to date.
    pub(crate) fn states(&self) -> Arc<Mutex<Vec<QuotaState>>> {
        self.states.clone()
    }

    /// Whether a quota counts what calls cost (tokens, money): its calls want a [`Cost`]
    /// and a settlement.
    pub(crate) fn metered(&self) -> bool {
        self.quotas.iter().any(|q| q.unit.is_metered())
    }

    /// Whether a quota counts money: its calls want their most.
    pub(crate) fn priced(&self) -> bool {
        self.quotas.iter().any(|q| matches!(q.unit, Unit::Money(_)))
    }

    /// What a call of `cost` takes of `quota`: a call, its expected tokens, or the most it
    /// may cost in money.
    fn take_of(quota: &Quota, cost: Cost) -> u64 {
        match quota.unit {
            Unit::Calls => 1,
            Unit::Money(_) => quota.unit.of(cost.most.or(cost.expected)),
            unit => unit.of(cost.expected),
        }
    }

    /// How many units to reserve at a time of `quota`: [`chunk`] for calls; a fiftieth of
    /// the limit for what calls cost (a call takes many units).
    fn chunk_of(quota: &Quota) -> u64 {
        match quota.unit {
            Unit::Calls => chunk(quota),
            _ => (quota.limit / 50).max(1),
        }
    }

    /// Take a call of `cost` from every quota, waiting while one is spent.
    pub(crate) async fn acquire(&self, cost: Cost) -> Result<QuotaCall, QuotaStop> {
        let takes: Vec<u64> = self.quotas.iter().map(|q| Self::take_of(q, cost)).collect();
        for (q, &take) in self.quotas.iter().zip(&takes) {
            // More than a whole window (or budget) allows, or than is counted exactly.
            if take > q.limit || take > MOST_TAKEN {
                return Err(QuotaStop::TooCostly {
                    quota: *q,
                    need: take,
                });
            }
        }
        // A call needs at least one unit left: a spent window holds calls of unknown cost.
        let needs: Vec<i64> = takes.iter().map(|&t| t.max(1) as i64).collect();
        let mut local = self.local.lock().await;
        loop {
            let now = self.shared.clock.now_ms();
            if let Some(wait) = self.quotas.iter().filter_map(|q| to_boundary(q, now)).max() {
                tokio::time::sleep(wait).await;
                continue;
            }
            self.fold_settled(&mut local);
            // Units reserved in a slot that has passed are no use now; owed ones still are.
            for (q, l) in self.quotas.iter().zip(local.iter_mut()) {
                if l.slot_ms != Some(q.window.slot(now).0) {
                    l.available = l.available.min(0);
                }
            }
            if local.iter().zip(&needs).all(|(l, &n)| l.available >= n) {
                let mut taken = Vec::with_capacity(self.quotas.len());
                for (i, l) in local.iter_mut().enumerate() {
                    l.available -= takes[i] as i64;
                    self.shared.in_flight[i].fetch_add(takes[i], Relaxed);
                    taken.push((takes[i], l.slot_ms));
                }
                return Ok(QuotaCall {
                    shared: self.shared.clone(),
                    quotas: self.quotas.clone().into(),
                    taken,
                });
            }
            let mut carries = Vec::new();
            let (which, wants): (Vec<usize>, Vec<QuotaWant>) = self
                .quotas
                .iter()
                .zip(local.iter())
                .enumerate()
                .filter(|(i, (_, l))| l.available < needs[*i])
                .map(|(i, (q, l))| {
                    // A fixed window this run made calls in before, now passed: what is in
                    // flight may count in the new one.
                    let carry = match q.window {
                        Window::Fixed { .. }
                            if l.slot_ms.is_some_and(|s| s != q.window.slot(now).0) =>
                        {
                            let in_flight = self.shared.in_flight[i].load(SeqCst);
                            self.shared.carried_slot[i].store(q.window.slot(now).0, SeqCst);
                            in_flight + self.shared.crossed[i].swap(0, SeqCst)
                        }
                        _ => 0,
                    };
                    let short = (needs[i] - l.available) as u64;
                    carries.push(carry);
                    let want = QuotaWant::new(*q, Self::chunk_of(q).max(short) + carry);
                    (i, want)
                })
                .unzip();
            let grants = self.book.reserve(&wants, now).await?;
            let mut wait_until: Option<u64> = None;
            let mut spent = None;
            {
                let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
                for ((&i, carry), grant) in which.iter().zip(carries).zip(&grants) {
                    let l = &mut local[i];
                    if l.slot_ms != Some(grant.slot_ms) {
                        l.available = l.available.min(0);
                    }
                    l.slot_ms = Some(grant.slot_ms);
                    l.available += grant.calls.saturating_sub(carry) as i64;
                    let s = &mut states[i];
                    s.used = grant.used;
                    s.frees_at_ms = grant.frees_at_ms;
                    s.exhausted = l.available < needs[i];
                    if s.exhausted {
                        match grant.frees_at_ms {
                            None => spent = Some((i, l.available.max(0) as u64)),
                            Some(at) => wait_until = Some(wait_until.map_or(at, |w| w.max(at))),
                        }
                    }
                }
            }
            if let Some((i, left)) = spent {
                // What calls in flight took and do not spend comes back: wait for them
                // before calling the budget spent.
                let settles = self.shared.settles.notified();
                tokio::pin!(settles);
                settles.as_mut().enable();
                if self.quotas[i].unit.is_metered() {
                    // Settled while the reservation was made, not counted yet: look again.
                    let pending = {
                        let settled = self
                            .shared
                            .settled
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        settled[i].returned > 0
                    };
                    if pending {
                        continue;
                    }
                    if self.shared.in_flight[i].load(Relaxed) > 0 {
                        settles.await;
                        continue;
                    }
                }
                return Err(QuotaStop::Spent(self.quotas[i], left));
            }
            if let Some(at) = wait_until {
                let wait =
                    Duration::from_millis(at.saturating_sub(self.shared.clock.now_ms()).max(10));
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

    /// Give back to the store what this run holds and did not spend, once its calls are
    /// done (a run ending, halted or stopped): a resume, a rerun or another worker may spend
    /// it. What calls still in flight hold stays counted (they may be billed).
    pub(crate) async fn give_back(&self) -> Result<(), StoreError> {
        let mut local = self.local.lock().await;
        self.fold_settled(&mut local);
        let now = self.shared.clock.now_ms();
        let wants: Vec<QuotaWant> = self
            .quotas
            .iter()
            .zip(local.iter())
            .filter_map(|(q, l)| {
                let slot = l.slot_ms.filter(|&s| q.window.counts(s, now))?;
                (l.available > 0).then(|| QuotaWant {
                    give_back: Some(SlotUse {
                        start_ms: slot,
                        used: l.available as u64,
                    }),
                    ..QuotaWant::new(*q, 0)
                })
            })
            .collect();
        if wants.is_empty() {
            return Ok(());
        }
        let grants = self.book.reserve(&wants, now).await?;
        for l in local.iter_mut() {
            l.available = l.available.min(0);
        }
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        for (want, grant) in wants.iter().zip(&grants) {
            if let Some(i) = self.quotas.iter().position(|q| *q == want.quota) {
                states[i].used = grant.used;
            }
        }
        Ok(())
    }

    /// Count what settled calls gave back and owe into `local`.
    fn fold_settled(&self, local: &mut [Local]) {
        let mut settled = self
            .shared
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (l, s) in local.iter_mut().zip(settled.iter_mut()) {
            l.available -= s.owed as i64;
            if s.slot_ms == l.slot_ms {
                l.available += s.returned as i64;
            }
            *s = Settled::default();
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

/// The last moments of a fixed window of `length` in which no call starts: a twentieth of
/// it, at most 250 ms (a 2-second window loses a twentieth, a minute's under 0.5%).
pub(crate) fn boundary_band(length: Duration) -> Duration {
    (length / 20).min(Duration::from_millis(250))
}

/// How long until `quota`'s fixed window ends, when `now_ms` is in its [`boundary_band`].
fn to_boundary(quota: &Quota, now_ms: u64) -> Option<Duration> {
    let Window::Fixed { length } = quota.window else {
        return None;
    };
    let (start, len) = quota.window.slot(now_ms);
    let left = (start + len).saturating_sub(now_ms);
    (Duration::from_millis(left) <= boundary_band(length)).then(|| Duration::from_millis(left))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;
    use crate::store::now_ms;

    fn gate(store: &Arc<MemStore>, quotas: &[&str]) -> QuotaGate {
        let quotas = quotas.iter().map(|q| q.parse().unwrap()).collect();
        QuotaGate::new(quotas, store.clone(), Clock::system())
    }

    /// No call starts in a fixed window's last twentieth: one asked for then waits for the
    /// next window and is counted there; one asked for before the band is not held.
    #[tokio::test(start_paused = true)]
    async fn no_call_starts_in_a_fixed_windows_last_moments() {
        use crate::clock::SimulatedClock;
        const SLOT: u64 = 1_800_000_000_000; // a multiple of 2,000 ms
        let store = Arc::new(MemStore::new());
        let clock = SimulatedClock::starting_at_ms(SLOT + 1_000);
        let quota: Quota = "30/2s".parse().unwrap();
        let gate = QuotaGate::new(vec![quota], store.clone(), clock.clone().into());
        let early = gate.acquire(Cost::default()).await.unwrap();
        assert_eq!(early.taken[0].1, Some(SLOT), "before the band: this window");
        assert_eq!(clock.now_ms(), SLOT + 1_000, "not held");
        drop(early);
        // 30 ms before the boundary, inside the band of 100 ms.
        clock.jump_forward(Duration::from_millis(970));
        let late = gate.acquire(Cost::default()).await.unwrap();
        assert_eq!(
            late.taken[0].1,
            Some(SLOT + 2_000),
            "counted in the next window"
        );
        assert!(clock.now_ms() >= SLOT + 2_000, "started after the boundary");
        assert_eq!(
            boundary_band(Duration::from_secs(2)),
            Duration::from_millis(100)
        );
        assert_eq!(
            boundary_band(Duration::from_secs(3600)),
            Duration::from_millis(250)
        );
    }

    #[tokio::test]
    async fn a_budget_stops_at_its_limit_across_runs_and_a_larger_one_goes_on() {
        let store = Arc::new(MemStore::new());
        let first = gate(&store, &["10/job"]);
        for _ in 0..10 {
            drop(first.acquire(Cost::default()).await.unwrap());
        }
        assert!(matches!(
            first.acquire(Cost::default()).await,
            Err(QuotaStop::Spent(..))
        ));
        assert!(first.states().lock().unwrap()[0].exhausted);
        // A new run (a resume) continues the count.
        let again = gate(&store, &["10/job"]);
        assert!(matches!(
            again.acquire(Cost::default()).await,
            Err(QuotaStop::Spent(..))
        ));
        let raised = gate(&store, &["15/job"]);
        for _ in 0..5 {
            drop(raised.acquire(Cost::default()).await.unwrap());
        }
        assert!(matches!(
            raised.acquire(Cost::default()).await,
            Err(QuotaStop::Spent(..))
        ));
        assert_eq!(raised.states().lock().unwrap()[0].used, 15);
    }

    #[tokio::test]
    async fn a_resume_never_exceeds_what_a_killed_run_reserved() {
        let store = Arc::new(MemStore::new());
        // 500 per hour: chunks of 10. The first run makes 3 calls and is killed (dropped).
        let first = gate(&store, &["500/h"]);
        let calls: Vec<_> =
            futures_util::future::join_all((0..3).map(|_| first.acquire(Cost::default())))
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
        drop(calls);
        drop(first);
        let ledger = store.quota_ledger().await.unwrap();
        let window = "500/h".parse::<Quota>().unwrap().window;
        let reserved = ledger.used(&"500/h".parse().unwrap(), now_ms());
        assert!((3..=10).contains(&reserved), "{reserved}");
        // The resumed run gets what is left, no more (unless the hour turned meanwhile).
        let second = gate(&store, &["500/h"]);
        let hour = window.slot(now_ms()).0;
        let mut made = 0;
        while made < 500 {
            match tokio::time::timeout(Duration::from_millis(50), second.acquire(Cost::default()))
                .await
            {
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
            drop(gate.acquire(Cost::default()).await.unwrap());
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

    fn money(limit: &str) -> Quota {
        Quota {
            limit: limit.parse::<Money>().unwrap().0,
            window: Window::Job,
            unit: Unit::Money(crate::meter::Prices {
                input: "1".parse().unwrap(),
                output: "4".parse().unwrap(),
            }),
        }
    }

    /// A call's most (1,000 in, 500 out: 0.003) and what it spends (200 in, 100 out: 0.0006).
    const MOST: Usage = Usage {
        input: 1000,
        output: 500,
    };
    const SPENT: Usage = Usage {
        input: 200,
        output: 100,
    };

    /// Calls of `gate` by `workers` at once until it stops one (which stops the run, as a
    /// halt does); how many calls were made.
    async fn spend_until_stopped(gate: Arc<QuotaGate>, workers: usize) -> (u64, QuotaStop) {
        let spent = Arc::new(AtomicU64::new(0));
        let halted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks: Vec<_> = (0..workers)
            .map(|_| {
                let (gate, spent, halted) = (gate.clone(), spent.clone(), halted.clone());
                tokio::spawn(async move {
                    while !halted.load(Relaxed) {
                        let cost = Cost {
                            expected: Some(SPENT),
                            most: Some(MOST),
                        };
                        match gate.acquire(cost).await {
                            Ok(call) => {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                spent.fetch_add(1, Relaxed);
                                call.settle(Spent::Reported(SPENT));
                            }
                            Err(stop) => {
                                halted.store(true, Relaxed);
                                return Some(stop);
                            }
                        }
                    }
                    None
                })
            })
            .collect();
        let mut stop = None;
        for t in tasks {
            stop = stop.or(t.await.unwrap());
        }
        (spent.load(Relaxed), stop.unwrap())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_budget_in_money_stops_within_one_calls_most_of_it_and_a_larger_one_goes_on() {
        let store = Arc::new(MemStore::new());
        let each = money("0").unit.of(Some(SPENT));
        let most = money("0").unit.of(Some(MOST));
        let cap = money("0.05").limit;
        let gate = Arc::new(QuotaGate::new(
            vec![money("0.05")],
            store.clone(),
            Clock::system(),
        ));
        let (calls, stop) = spend_until_stopped(gate, 8).await;
        assert!(matches!(stop, QuotaStop::Spent(..)), "{stop}");
        assert!(
            stop.to_string().contains("budget of 0.0500 is spent"),
            "{stop}"
        );
        // Never above the cap, and short of it by less than a call's most: the calls in
        // flight gave back what they did not spend before the budget was called spent.
        let spent = calls * each;
        assert!(
            spent <= cap && cap - spent < most,
            "{calls} calls: {spent} of {cap}"
        );
        // A resume with the same budget stops at once; a larger one goes on from the count.
        let again = Arc::new(QuotaGate::new(
            vec![money("0.05")],
            store.clone(),
            Clock::system(),
        ));
        assert_eq!(spend_until_stopped(again, 2).await.0, 0);
        let raised = Arc::new(QuotaGate::new(
            vec![money("0.08")],
            store.clone(),
            Clock::system(),
        ));
        let (more, _) = spend_until_stopped(raised, 3).await;
        let total = (calls + more) * each;
        let cap = money("0.08").limit;
        assert!(total <= cap && cap - total < 2 * most, "{total} of {cap}");
    }

    #[tokio::test]
    async fn a_token_quota_takes_the_estimate_and_settles_what_was_spent() {
        let store = Arc::new(MemStore::new());
        let quota: Quota = "1000tokens/job".parse().unwrap();
        let gate = QuotaGate::new(vec![quota], store.clone(), Clock::system());
        let cost = Cost {
            expected: Some(Usage {
                input: 60,
                output: 40,
            }),
            most: None,
        };
        // Each call is expected at 100 tokens and spends 50: twice the calls fit.
        let mut calls = 0;
        while let Ok(call) = gate.acquire(cost).await {
            call.settle(Spent::Reported(Usage {
                input: 30,
                output: 20,
            }));
            calls += 1;
        }
        assert!((19..=20).contains(&calls), "{calls}");
        // A call with no answer keeps what it took; an error the API answered with gives
        // it all back.
        let store = Arc::new(MemStore::new());
        let gate = QuotaGate::new(vec![quota], store.clone(), Clock::system());
        for _ in 0..5 {
            gate.acquire(cost).await.unwrap().settle(Spent::Unknown);
        }
        for _ in 0..100 {
            gate.acquire(cost).await.unwrap().settle(Spent::Nothing);
        }
        let used = store.quota_ledger().await.unwrap().used(&quota, now_ms());
        assert!((500..=600).contains(&used), "{used}");
        // A call expected above a whole window's limit is refused at once.
        let small: Quota = "50tokens/1h".parse().unwrap();
        let gate = QuotaGate::new(vec![small], store, Clock::system());
        assert!(matches!(
            gate.acquire(cost).await,
            Err(QuotaStop::TooCostly { need: 100, .. })
        ));
    }

    #[tokio::test]
    async fn a_run_gives_back_what_it_holds_and_did_not_spend() {
        let store = Arc::new(MemStore::new());
        let budget = money("0.05");
        let gate = QuotaGate::new(
            vec![budget, "100/job".parse().unwrap()],
            store.clone(),
            Clock::system(),
        );
        let cost = Cost {
            expected: Some(SPENT),
            most: Some(MOST),
        };
        for _ in 0..3 {
            gate.acquire(cost)
                .await
                .unwrap()
                .settle(Spent::Reported(SPENT));
        }
        // One call still in flight at the end keeps its most counted.
        let in_flight = gate.acquire(cost).await.unwrap();
        gate.give_back().await.unwrap();
        let ledger = store.quota_ledger().await.unwrap();
        let each = budget.unit.of(Some(SPENT));
        let most = budget.unit.of(Some(MOST));
        assert_eq!(ledger.used(&budget, now_ms()), 3 * each + most);
        assert_eq!(ledger.used(&"100/job".parse().unwrap(), now_ms()), 4);
        drop(in_flight);
    }

    /// A call taken just before a fixed window's boundary and ended just after it, before
    /// any other reservation: the first reservation of the new window takes one more call
    /// for it (the API may have counted it there).
    #[tokio::test]
    async fn a_call_that_ends_past_a_fixed_windows_boundary_counts_in_the_next_window() {
        let quota: Quota = "100/400ms".parse().unwrap();
        loop {
            let store = Arc::new(MemStore::new());
            let gate = QuotaGate::new(vec![quota], store.clone(), Clock::system());
            let (start, len) = quota.window.slot(now_ms());
            if start + len - now_ms() < 150 {
                tokio::time::sleep(Duration::from_millis(start + len - now_ms() + 5)).await;
                continue;
            }
            let call = gate.acquire(Cost::default()).await.unwrap();
            let next = start + len;
            tokio::time::sleep(Duration::from_millis(next.saturating_sub(now_ms()) + 5)).await;
            drop(call);
            drop(gate.acquire(Cost::default()).await.unwrap());
            let now = now_ms();
            if quota.window.slot(now).0 != next {
                // The machine was too slow for the scenario: try again.
                continue;
            }
            let used = store.quota_ledger().await.unwrap().used(&quota, now);
            assert_eq!(used, chunk(&quota) + 1, "a chunk and the call that crossed");
            return;
        }
    }
}
