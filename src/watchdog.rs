//! A watch on the store's calls that can hang: a [`Watchdog`] notices a call that has not
//! returned within its bound and says so, once, through the action it was given.
//!
//! A store can hang without failing: sled's flush has been seen to wait forever on a condition
//! variable with every one of its threads idle (sled issue #1412), and a disk or a network
//! file system can stop answering `fdatasync`. A job that runs 36 hours and hangs silently is
//! worse than one that crashes: nothing restarts it. So the calls a run waits on and that can
//! block in this way (a backend's flush and sync, its writes) enter the watch while they run
//! ([`watch`]); a thread of the watchdog's own, which the hung call cannot block, looks at
//! the oldest call in progress a few times per bound and reports it once it has waited the
//! bound ([`Stall`]).
//!
//! What a stall does is the program's choice ([`install`]): the command line logs what is
//! stuck and ends the process with an exit code of its own, which a supervisor restarts on (a
//! resume is cheap and calls again only what was in flight). A hung call cannot be
//! cancelled, so ending the process is the one way out; the records it made durable stay
//! so, as after a kill. Without an installed watchdog, [`watch`] costs one atomic load.
//!
//! Time the process spends stopped (SIGSTOP, a terminal's Ctrl-Z, a suspended machine) is
//! not counted: the watchdog's own sleep shows it, as a tick that came far too late.
//!
//! The watch is in real time (std's `Instant`), not tokio's like the run's waits: a hung
//! call hangs in real time, and a test that pauses tokio's clock must not see a flush
//! that took a microsecond as stalled for the hours the test skipped.
//!
//! Only calls that must answer in time are watched: a backend that waits out an outage on
//! purpose (PostgreSQL's reconnecting steps, which log as they wait) is not stalled.

// Parts only the command line uses are dead code in the library alone.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// A watched call that has not returned within the bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stall {
    /// What the call does ("sled flush", "store sync"...).
    pub(crate) op: &'static str,
    /// How long it has waited when reported.
    pub(crate) waited: Duration,
    /// How many watched calls were in progress then (this one included).
    pub(crate) in_progress: usize,
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the store has not answered for {:.1} s: {} is stuck",
            self.waited.as_secs_f64(),
            self.op
        )?;
        if self.in_progress > 1 {
            write!(f, " ({} calls waiting)", self.in_progress)?;
        }
        Ok(())
    }
}

/// What a stall does: called once per stalled call, on the watchdog's thread.
pub(crate) type OnStall = Box<dyn Fn(&Stall) + Send + Sync>;

/// Notices watched calls that do not return within a bound; see the module's doc.
pub(crate) struct Watchdog {
    inner: Arc<Inner>,
}

struct Inner {
    bound: Duration,
    on_stall: OnStall,
    calls: Mutex<Calls>,
}

/// The calls in progress, by a number given in the order they began: the first entry is the
/// oldest.
#[derive(Default)]
struct Calls {
    next: u64,
    open: BTreeMap<u64, (&'static str, Instant)>,
    /// The highest call number reported: none is reported twice.
    reported: Option<u64>,
}

/// A call in progress, from [`Watchdog::watch`] or [`watch`]; the call ends when this drops.
#[must_use = "the call is watched while this lives"]
pub(crate) struct Watch {
    call: Option<(Arc<Inner>, u64)>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some((inner, n)) = self.call.take() {
            inner.lock().open.remove(&n);
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Calls> {
        // A panic while holding the lock leaves the map consistent (each step is one insert
        // or remove), so a poisoned lock is used as it is.
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count `pause` as no call's waiting: the calls in progress began that much later.
    fn forgive(&self, pause: Duration) {
        if pause.is_zero() {
            return;
        }
        for (_, since) in self.lock().open.values_mut() {
            *since += pause;
        }
    }

    /// The oldest call, if it has waited the bound and was not reported yet (it is marked
    /// reported).
    fn overdue(&self, now: Instant) -> Option<Stall> {
        let mut calls = self.lock();
        let in_progress = calls.open.len();
        let (&n, &(op, since)) = calls.open.iter().find(|(&n, _)| Some(n) > calls.reported)?;
        let waited = now.saturating_duration_since(since);
        if waited < self.bound {
            return None;
        }
        calls.reported = Some(n);
        Some(Stall {
            op,
            waited,
            in_progress,
        })
    }
}

/// How long the process was stopped, judging by the watchdog's own sleep of `every` that
/// took `slept`: beyond a second of lateness (a busy machine is late by milliseconds), the
/// whole lateness. A process stopped (SIGSTOP, a terminal's Ctrl-Z) or a machine suspended
/// does not run its calls meanwhile, so that time is not the store's.
fn paused(slept: Duration, every: Duration) -> Duration {
    let late = slept.saturating_sub(every);
    if late > Duration::from_secs(1) {
        late
    } else {
        Duration::ZERO
    }
}

/// How often the watchdog looks: a few times per bound, at most once a second, at least every
/// 10 ms.
fn tick(bound: Duration) -> Duration {
    (bound / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

impl Watchdog {
    /// A watchdog reporting calls that have not returned within `bound` to `on_stall`. Its
    /// thread ends when the watchdog is dropped.
    pub(crate) fn new(
        bound: Duration,
        on_stall: impl Fn(&Stall) + Send + Sync + 'static,
    ) -> Watchdog {
        let inner = Arc::new(Inner {
            bound,
            on_stall: Box::new(on_stall),
            calls: Mutex::new(Calls::default()),
        });
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        let every = tick(bound);
        let spawned = std::thread::Builder::new()
            .name("highwater-watchdog".into())
            .spawn(move || {
                let mut last = Instant::now();
                loop {
                    std::thread::sleep(every);
                    let Some(inner) = weak.upgrade() else { return };
                    let now = Instant::now();
                    inner.forgive(paused(now.saturating_duration_since(last), every));
                    last = now;
                    if let Some(stall) = inner.overdue(now) {
                        (inner.on_stall)(&stall);
                    }
                }
            });
        if let Err(e) = spawned {
            // Without its thread the watchdog watches nothing; the job itself is unharmed.
            tracing::warn!("cannot start the store's watchdog thread: {e}");
        }
        Watchdog { inner }
    }

    /// Watch the call `op` until the returned [`Watch`] drops.
    pub(crate) fn watch(&self, op: &'static str) -> Watch {
        let mut calls = self.inner.lock();
        let n = calls.next;
        calls.next += 1;
        calls.open.insert(n, (op, Instant::now()));
        Watch {
            call: Some((self.inner.clone(), n)),
        }
    }
}

impl fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watchdog")
            .field("bound", &self.inner.bound)
            .finish_non_exhaustive()
    }
}

static INSTALLED: OnceLock<Watchdog> = OnceLock::new();

/// The process already has a watchdog: [`install`] was called before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a store watchdog is already installed")]
pub(crate) struct AlreadyInstalled;

/// Make `watchdog` the one that every store of this process reports its calls to ([`watch`]).
/// Once per process.
pub(crate) fn install(watchdog: Watchdog) -> Result<(), AlreadyInstalled> {
    INSTALLED.set(watchdog).map_err(|_| AlreadyInstalled)
}

/// Watch the call `op` with the installed watchdog, if there is one, until the returned
/// [`Watch`] drops.
pub(crate) fn watch(op: &'static str) -> Watch {
    match INSTALLED.get() {
        Some(w) => w.watch(op),
        None => Watch { call: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn reporting(bound: Duration) -> (Watchdog, mpsc::Receiver<Stall>) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let w = Watchdog::new(bound, move |s: &Stall| {
            let _ = tx.lock().unwrap().send(s.clone());
        });
        (w, rx)
    }

    #[test]
    fn a_call_that_does_not_return_is_reported_once_with_its_name() {
        let (w, rx) = reporting(Duration::from_millis(50));
        let _stuck = w.watch("sled flush");
        let stall = rx.recv_timeout(Duration::from_secs(30)).expect("a stall");
        assert_eq!(stall.op, "sled flush");
        assert!(stall.waited >= Duration::from_millis(50));
        assert_eq!(stall.in_progress, 1);
        // Reported once: the watchdog has ticked many times more by the time a later call
        // (begun after this point) is reported, and the first is not among the reports.
        let _later = w.watch("store sync");
        let next = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the later stall");
        assert_eq!(next.op, "store sync");
        assert_eq!(next.in_progress, 2);
    }

    #[test]
    fn calls_that_return_are_never_reported() {
        let (w, rx) = reporting(Duration::from_millis(20));
        for _ in 0..1000 {
            drop(w.watch("store record"));
        }
        // The check is by the watchdog's state, not by waiting: nothing is in progress, so
        // whatever the clock says, nothing is overdue.
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(w.inner.overdue(far), None);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn the_oldest_call_is_the_one_reported() {
        let (w, _rx) = reporting(Duration::from_secs(3600));
        let first = w.watch("sled flush");
        let _second = w.watch("store sync");
        let far = Instant::now() + Duration::from_secs(7200);
        let stall = w.inner.overdue(far).expect("overdue");
        assert_eq!((stall.op, stall.in_progress), ("sled flush", 2));
        // Reported once; the next overdue one is the second.
        let stall = w.inner.overdue(far).expect("the second is overdue too");
        assert_eq!(stall.op, "store sync");
        assert_eq!(w.inner.overdue(far), None);
        drop(first);
        assert_eq!(w.inner.lock().open.len(), 1);
    }

    #[test]
    fn a_call_within_its_bound_is_not_reported() {
        let (w, _rx) = reporting(Duration::from_secs(60));
        let _call = w.watch("store sync");
        assert_eq!(w.inner.overdue(Instant::now()), None);
        let later = Instant::now() + Duration::from_secs(61);
        assert!(w.inner.overdue(later).is_some());
    }

    #[test]
    fn without_an_installed_watchdog_a_watch_is_free() {
        // Nothing in this test binary installs one.
        assert!(watch("store sync").call.is_none());
    }

    #[test]
    fn time_the_process_was_stopped_is_not_waiting() {
        let (w, _rx) = reporting(Duration::from_secs(60));
        let _call = w.watch("store sync");
        // Stopped for an hour (Ctrl-Z, then fg): the watchdog's one-second sleep took an hour.
        let hour = Duration::from_secs(3600);
        let pause = paused(hour + Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(pause, hour);
        w.inner.forgive(pause);
        let after = Instant::now() + hour;
        assert_eq!(w.inner.overdue(after), None, "the pause counted as waiting");
        assert!(w.inner.overdue(after + Duration::from_secs(61)).is_some());
    }

    #[test]
    fn a_busy_machine_is_not_a_pause() {
        let second = Duration::from_secs(1);
        assert_eq!(
            paused(second + Duration::from_millis(300), second),
            Duration::ZERO
        );
        assert_eq!(paused(Duration::from_millis(10), second), Duration::ZERO);
    }

    #[test]
    fn the_tick_is_a_few_times_per_bound() {
        assert_eq!(tick(Duration::from_secs(60)), Duration::from_secs(1));
        assert_eq!(tick(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(tick(Duration::from_millis(8)), Duration::from_millis(10));
    }
}
