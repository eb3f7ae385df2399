//! The wall clock a run reads: a [`Clock`], carried by the run's options
//! ([`crate::RunOptions::clock`]) and given to whatever else of the run reads the date.
//!
//! A run keeps two kinds of time apart:
//!
//! - **monotonic time**, for every wait and every interval (the rate limit, the quota pacer,
//!   credential renewal, retries and their backoff, outage probes, a fleet's pause, progress
//!   rates), is read from tokio's clock ([`tokio::time::Instant`]) and nowhere else, so a
//!   test that pauses tokio's clock (`tokio::time::pause`, `start_paused`) moves all of it
//!   at once; the watchdog of the store's calls, the timings of store I/O, the store's own
//!   housekeeping (sled's periodic covers) and a PostgreSQL session's deadline read the
//!   real clock on purpose (a hung disk hangs in real time, a database server's clock does
//!   not pause);
//! - **wall time**, for what is stated in dates (quota windows aligned on the Unix epoch,
//!   a daily quota that resets at midnight UTC, record timestamps, the reset times and
//!   `Retry-After` dates an API announces), is read from the run's [`Clock`] and nowhere
//!   else.
//!
//! A [`Clock`] is the system's ([`Clock::system`], the default) or a [`SimulatedClock`]'s,
//! whose time is a chosen start, plus tokio's monotonic time elapsed since it was made, plus
//! the jumps a test makes ([`SimulatedClock::jump_forward`], [`SimulatedClock::jump_back`]):
//! so a paused tokio clock advances both kinds of time together, and a jump moves the wall
//! clock alone, as an operator setting the date or NTP stepping it would.
//!
//! Invariants:
//!
//! 1. A clock is a value, never a global: two runs in one process (two tests on two threads)
//!    each read their own, and a clone reads the same time as the original.
//! 2. Monotonic time never goes back, whatever the wall clock does; only the wall clock
//!    jumps, so a wait is never cut short or stretched by a jump, and what reads the date
//!    (a quota window) must cope with a date that goes back.
//! 3. A simulated clock's monotonic part is tokio's: read in a runtime whose clock is paused,
//!    it stands still until the runtime advances it.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wall clock a run reads: the system's, or a [`SimulatedClock`]'s. Cheap to clone;
/// clones read the same time.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    simulated: Option<SimulatedClock>,
}

impl Clock {
    /// The system's wall clock ([`SystemTime::now`]).
    pub fn system() -> Clock {
        Clock::default()
    }

    /// The wall time now.
    pub fn now(&self) -> SystemTime {
        match &self.simulated {
            None => SystemTime::now(),
            Some(s) => s.now(),
        }
    }

    /// The wall time now, in milliseconds since the Unix epoch (0 before it): what records
    /// and quota windows are stamped with.
    pub fn now_ms(&self) -> u64 {
        unix_ms(self.now())
    }

    /// Whether this is a simulated clock.
    pub fn is_simulated(&self) -> bool {
        self.simulated.is_some()
    }
}

impl From<SimulatedClock> for Clock {
    fn from(simulated: SimulatedClock) -> Clock {
        Clock {
            simulated: Some(simulated),
        }
    }
}

/// A wall clock for tests: a chosen start, plus tokio's monotonic time elapsed since the
/// clock was made, plus the jumps made with [`SimulatedClock::jump_forward`] and
/// [`SimulatedClock::jump_back`]. Cheap to clone; clones share the time and the jumps.
/// Give it to a run as a [`Clock`] (`Clock::from`).
#[derive(Clone, Debug)]
pub struct SimulatedClock {
    inner: Arc<Simulated>,
}

#[derive(Debug)]
struct Simulated {
    start: SystemTime,
    origin: tokio::time::Instant,
    /// The sum of the jumps, in nanoseconds (forward positive).
    jumped_ns: AtomicI64,
}

impl SimulatedClock {
    /// A clock that reads `start` now and moves with tokio's clock from here on (made in a
    /// runtime whose clock is paused, it moves only as the runtime advances it).
    pub fn starting_at(start: SystemTime) -> SimulatedClock {
        SimulatedClock {
            inner: Arc::new(Simulated {
                start,
                origin: tokio::time::Instant::now(),
                jumped_ns: AtomicI64::new(0),
            }),
        }
    }

    /// A clock that reads `ms` milliseconds after the Unix epoch now: see
    /// [`SimulatedClock::starting_at`].
    pub fn starting_at_ms(ms: u64) -> SimulatedClock {
        SimulatedClock::starting_at(UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// The wall time now.
    pub fn now(&self) -> SystemTime {
        let s = &self.inner;
        let moved = s.start + s.origin.elapsed();
        let jumped = s.jumped_ns.load(Relaxed);
        let by = Duration::from_nanos(jumped.unsigned_abs());
        if jumped >= 0 {
            moved + by
        } else {
            moved.checked_sub(by).unwrap_or(UNIX_EPOCH)
        }
    }

    /// The wall time now, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        unix_ms(self.now())
    }

    /// The wall clock jumps `by` into the future (monotonic time does not move).
    pub fn jump_forward(&self, by: Duration) {
        self.jump(i64::try_from(by.as_nanos()).unwrap_or(i64::MAX));
    }

    /// The wall clock jumps `by` into the past (monotonic time does not move).
    pub fn jump_back(&self, by: Duration) {
        self.jump(-i64::try_from(by.as_nanos()).unwrap_or(i64::MAX));
    }

    fn jump(&self, ns: i64) {
        let _ = self
            .inner
            .jumped_ns
            .fetch_update(Relaxed, Relaxed, |j| Some(j.saturating_add(ns)));
    }
}

/// `at` in milliseconds since the Unix epoch (0 before it).
fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const START_MS: u64 = 1_798_761_600_000; // 2027-01-01T00:00:00Z

    #[tokio::test(start_paused = true)]
    async fn a_simulated_clock_moves_with_tokio_time_and_jumps_alone() {
        let sim = SimulatedClock::starting_at_ms(START_MS);
        let clock = Clock::from(sim.clone());
        assert!(clock.is_simulated());
        assert_eq!(clock.now_ms(), START_MS);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(clock.now_ms(), START_MS + 3_600_000);
        let before = tokio::time::Instant::now();
        sim.jump_back(Duration::from_secs(7200));
        assert_eq!(clock.now_ms(), START_MS - 3_600_000);
        assert_eq!(
            tokio::time::Instant::now(),
            before,
            "a jump moves no monotonic time"
        );
        sim.jump_forward(Duration::from_secs(10_800));
        assert_eq!(clock.clone().now_ms(), START_MS + 7_200_000);
    }

    #[tokio::test(start_paused = true)]
    async fn two_simulated_clocks_do_not_share_their_jumps() {
        let a = SimulatedClock::starting_at_ms(START_MS);
        let b = SimulatedClock::starting_at_ms(START_MS);
        a.jump_forward(Duration::from_secs(60));
        assert_eq!(b.now_ms(), START_MS);
        assert_eq!(a.now_ms(), START_MS + 60_000);
    }

    #[test]
    fn a_jump_before_the_epoch_reads_the_epoch() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let sim = SimulatedClock::starting_at_ms(1000);
            sim.jump_back(Duration::from_secs(10));
            assert_eq!(Clock::from(sim).now_ms(), 0);
        });
    }

    #[test]
    fn the_system_clock_reads_the_system_time() {
        let before = SystemTime::now();
        let read = Clock::system().now();
        assert!(read >= before && read <= SystemTime::now());
    }
}
