//! What an attempt that got an answer made ([`Answered`]): a single ID's [`Output`] or a
//! batch's [`BatchAnswer`], each with its HTTP status (and what the call cost).

use super::batch::BatchAnswer;
use super::output::Output;

/// What an attempt that got an answer made: its HTTP status, for the counters.
pub trait Answered {
    /// The answer's HTTP status; none for a handler without one (exec, closure).
    fn status(&self) -> Option<u16>;

    /// What the call cost, when its answer said. None by default.
    fn usage(&self) -> Option<crate::meter::Usage> {
        None
    }
}

impl Answered for Output {
    fn status(&self) -> Option<u16> {
        self.status
    }

    fn usage(&self) -> Option<crate::meter::Usage> {
        self.usage
    }
}

impl Answered for BatchAnswer {
    fn status(&self) -> Option<u16> {
        self.status
    }
}
