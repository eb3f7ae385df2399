//! What an attempt that got an answer made ([`Answered`]): a single ID's [`Output`] or a
//! batch's [`BatchAnswer`], each with its HTTP status.

use super::batch::BatchAnswer;
use super::output::Output;

/// What an attempt that got an answer made: its HTTP status, for the counters.
pub trait Answered {
    /// The answer's HTTP status; none for a handler without one (exec, closure).
    fn status(&self) -> Option<u16>;
}

impl Answered for Output {
    fn status(&self) -> Option<u16> {
        self.status
    }
}

impl Answered for BatchAnswer {
    fn status(&self) -> Option<u16> {
        self.status
    }
}
