//! Outage detection: what an attempt's outcome tells the throttle ([`Observed`]), what it
//! knows of one item's earlier failures ([`ItemHistory`]), and the outage gate: failures in
//! a row declare the API out, every attempt is then held back but one probe at growing
//! intervals, and a failure that may be an outage starting waits for evidence before it
//! counts against its item ([`Throttle::charge`](crate::throttle::Throttle::charge)).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::failure::{ErrorClass, Failure, Next};

/// Failures in a row, with no answer in between, that mean the API is out rather than
/// failing some items.
pub(crate) const OUTAGE_AFTER_FAILURES: u64 = 20;
/// How long a possible-outage failure waits for evidence before it is decided without
/// (see [`Throttle::charge`](crate::throttle::Throttle::charge)).
pub(crate) const PROVISIONAL_WAIT: Duration = Duration::from_secs(2);

/// Whether an attempt counts, as first recorded.
pub(super) enum Verdict {
    Counted,
    Free,
    /// Decided by what happens next; the number of answers seen so far.
    Provisional(u64),
}
/// The first probe's delay after an outage starts; doubles up to [`MAX_PROBE_INTERVAL`].
pub(crate) const FIRST_PROBE_AFTER: Duration = Duration::from_millis(500);
pub(crate) const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// What an attempt's outcome tells the throttle: the one place that maps an outcome to
/// API pushback (for the adaptive controller) and to possible-outage evidence (for the
/// outage gate). See [`Observed::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observed {
    /// A 2xx answer, with its latency.
    Success(Duration),
    /// An answer that says "overloaded": 503 or 529, with or without `Retry-After` (rate
    /// limiters such as nginx's `limit_req` answer 503 by default, object stores say
    /// "503 Slow Down"). Pushback, unless it repeats on the same IDs while others succeed
    /// (see [`crate::throttle`]); the API is up.
    Pushback,
    /// An answer that refuses the client's rate: 429. Always pushback; the API is up.
    TooMany,
    /// No answer within the timeout: pushback (an overloaded API stops answering in time),
    /// and no answer at all, so possibly the API being out.
    Timeout,
    /// No connection to the API could be made (refused), or a gateway in front of it could
    /// get no answer from it (502, 504): the API may be out, and the ID is not the cause.
    Unreachable,
    /// No answer to a request sent (dropped connection), or a 5xx other than 503 (a gateway
    /// saying the API behind it failed): the API may be out, or this request breaks it.
    Down,
    /// Any other answer: the API works, the item does not.
    Answered,
}

impl Observed {
    /// What an attempt's result tells the throttle:
    ///
    /// | result | pushback | possible outage |
    /// |---|---|---|
    /// | 2xx | no (its latency is a signal) | no |
    /// | 429 | yes | no: an answer |
    /// | 503, 529 | yes, unless it repeats on the same IDs | no: an answer |
    /// | timeout | yes | yes, unless the ID fails alone |
    /// | refused connection, 502, 504 | no | yes, whatever the ID |
    /// | dropped connection, other 5xx | no | yes, unless the ID fails alone |
    /// | any other failure (4xx, unreadable body, bad request) | no | no |
    pub(crate) fn of<T>(result: &Result<T, Failure>, latency: Duration) -> Observed {
        match result {
            Ok(_) => Observed::Success(latency),
            // The handler decided what happens next; whether the request reached the other
            // side (so whether the ID may be the cause) is read from what failed.
            Err(f) => match f.next {
                Next::Pushback { .. } => Observed::Pushback,
                Next::TooMany { .. } => Observed::TooMany,
                Next::TimedOut => Observed::Timeout,
                Next::Unreachable { .. } => match (f.class, f.status) {
                    (_, Some(502 | 504)) | (ErrorClass::Connect, _) => Observed::Unreachable,
                    _ => Observed::Down,
                },
                // An answer, even a refusal or one its checks refused: no pushback, no outage.
                Next::Permanent
                | Next::Retry { .. }
                | Next::Renewed
                | Next::RenewedAlone
                | Next::CredentialRejected
                | Next::OutOfCredit => Observed::Answered,
            },
        }
    }

    /// The API is pushing back.
    pub(super) fn is_pushback(self) -> bool {
        matches!(
            self,
            Observed::Pushback | Observed::TooMany | Observed::Timeout
        )
    }

    /// Pushback that may be the ID's rather than the rate's, if it repeats on the same ID:
    /// all but 429 (see [`crate::throttle`]).
    pub(super) fn may_repeat(self) -> bool {
        matches!(self, Observed::Pushback | Observed::Timeout)
    }

    /// No usable answer: the API may be out.
    pub(super) fn may_be_down(self) -> bool {
        matches!(
            self,
            Observed::Timeout | Observed::Unreachable | Observed::Down
        )
    }

    /// No usable answer, and the request reached the API: the ID may be the cause.
    pub(super) fn may_be_the_ids(self) -> bool {
        matches!(self, Observed::Timeout | Observed::Down)
    }
}

/// What the throttle knows of one item's earlier attempts, kept by the item while it is
/// attempted (see [`Throttle::charge`](crate::throttle::Throttle::charge)).
#[derive(Debug, Default)]
pub(crate) struct ItemHistory {
    /// A possible-outage failure of this ID was found to be its own: the API answered
    /// another request after it failed, or no outage showed while it waited for evidence.
    pub(super) fails_alone: std::sync::atomic::AtomicBool,
    /// This ID's last attempt was pushback other than 429 (503, 529, a timeout): its next
    /// one is a repeat that tells whether such refusals are the ID's (see [`crate::throttle`]).
    pub(super) refused: std::sync::atomic::AtomicBool,
}

impl ItemHistory {
    pub(super) fn fails_alone(&self) -> bool {
        self.fails_alone.load(Relaxed)
    }
}

pub(super) struct Outage {
    /// When the current outage began (`None`: the API is up).
    pub(super) since: Option<tokio::time::Instant>,
    /// When the next probe may go.
    pub(super) next_probe: tokio::time::Instant,
    pub(super) probe_interval: Duration,
    /// A probe is in flight.
    pub(super) probing: bool,
}
