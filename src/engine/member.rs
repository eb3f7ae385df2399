//! What an item worker asks of the fleet its run belongs to, through one small handle
//! ([`Member`]): whether its leases are surely still valid, whether it still holds an item's
//! bucket, and a pause for every worker when the API says `Retry-After`. A run that holds
//! the whole job is in no fleet ([`Alone`]); a worker of a fleet has a [`FleetMember`], which
//! also keeps its throttle on the rate share the store grants it.
//!
//! One rate for the fleet: `--rate` is the job's total ([`Fleet::set_fleet_rate`]), and
//! this worker's throttle follows the share the store grants it ([`Fleet::fleet_rate`], read
//! [`FOLLOWS_PER_TICK`] times per tick of the throttle's controller, every 50 ms at the
//! default tick: the share is its ceiling, a share of 0 waits). A `Retry-After`
//! seen here pauses this worker at once and the others through the store
//! ([`Fleet::pause_fleet`]), as they next learn their share.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::store::{Fleet, Lease};
use crate::throttle::Throttle;

/// What an item worker asks of its run's fleet, if any.
pub(super) trait Member: Send + Sync {
    /// Whether this worker's leases are surely still valid: no call starts until they are.
    fn alive(&self) -> bool;
    /// Whether this worker still holds `lease`: an item whose lease is lost is not called
    /// (its result would be fenced out).
    fn holds(&self, lease: &Lease) -> bool;
    /// The API said `Retry-After` (`after`) for every caller: pause the fleet.
    fn pause(&self, after: Duration);
}

/// A run that holds the whole job: its lease lasts as long as the run, and it pauses no
/// other worker (the throttle pauses this one).
pub(super) struct Alone;

impl Member for Alone {
    fn alive(&self) -> bool {
        true
    }

    fn holds(&self, _lease: &Lease) -> bool {
        true
    }

    fn pause(&self, _after: Duration) {}
}

/// How many times per tick of the throttle's controller it reads the share the store last
/// granted (a read in memory): the controller acts on what it read by its next tick.
const FOLLOWS_PER_TICK: u32 = 4;

/// A worker of a fleet: its store (a shared one) and its throttle.
pub(super) struct FleetMember<S> {
    store: Arc<S>,
    throttle: Arc<Throttle>,
}

impl<S: Fleet> FleetMember<S> {
    /// Join the fleet: the throttle takes the share the store granted (a worker starts
    /// nothing before its share is known) and follows it until the task returned is
    /// aborted.
    pub(super) fn join(store: Arc<S>, throttle: Arc<Throttle>) -> (Arc<Self>, JoinHandle<()>) {
        let member = Arc::new(FleetMember { store, throttle });
        member.apply_rate();
        let every =
            (member.throttle.tick_interval() / FOLLOWS_PER_TICK).max(Duration::from_millis(1));
        let follower = tokio::spawn({
            let member = member.clone();
            async move {
                loop {
                    tokio::time::sleep(every).await;
                    member.apply_rate();
                }
            }
        });
        (member, follower)
    }

    /// Apply the store's grant (share, shared pause, a return from idle) to the throttle:
    /// every [`FOLLOWS_PER_TICK`]th of a tick, and at once when this worker's source leased
    /// a bucket after holding none (before its items are called).
    pub(super) fn apply_rate(&self) {
        let f = self.store.fleet_rate();
        if let Some(workers) = f.workers {
            self.throttle.count_fleet(workers);
        }
        self.throttle.follow_fleet(f.share, f.burst, f.paused_until);
        self.throttle.follow_rejoin(f.rejoined);
    }
}

impl<S: Fleet> Member for FleetMember<S> {
    fn alive(&self) -> bool {
        self.store.alive()
    }

    fn holds(&self, lease: &Lease) -> bool {
        self.store.holds(lease)
    }

    /// This worker holds at once, and the job's shared pause is written (once per pause,
    /// not per answer that says so).
    fn pause(&self, after: Duration) {
        if !self.throttle.pause_for(after) {
            return;
        }
        let (store, throttle) = (self.store.clone(), self.throttle.clone());
        tokio::spawn(async move {
            match store.pause_fleet(after).await {
                Ok(left) => {
                    throttle.pause_for(left);
                }
                Err(e) => tracing::warn!("could not pause the other workers: {e}"),
            }
        });
    }
}
