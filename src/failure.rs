//! Failure: what a failed attempt means, and what happens next.
//!
//! Every handler (HTTP, exec, a library user's closure) reports a failed attempt as one
//! [`Failure`]: the error class and message that the error table shows, and [`Next`], the
//! decision the engine acts on. The decision is made once, where the failure is understood
//! (the HTTP handler's classifier reads status codes and transport errors, the exec
//! handler's reads exit codes, the answer checks read the answer); the engine never looks at
//! a status code again. What each decision does:
//!
//! | [`Next`] | the item | the adaptive rate | outage detection |
//! |---|---|---|---|
//! | `Permanent` | fails now | an answer | an answer: the API is up |
//! | `Retry` | retried (backoff, or `after`) | an answer | an answer |
//! | `Pushback` | retried (backoff, or `after`) | slows down, unless it repeats on the same IDs | an answer |
//! | `TooMany` | retried (backoff, or `after`); uses no attempt, only retry time | slows down | an answer |
//! | `Unreachable` | retried (backoff, or `after`) | - | evidence the API is out |
//! | `TimedOut` | retried (backoff) | slows down | evidence the API is out |
//! | `Renewed` | retried at once; uses no attempt and no retry time (at most `MAX_RENEWALS` in a row) | an answer | an answer |
//! | `RenewedAlone` | the same, but at most `MAX_RENEWED_ALONE` between other errors: then it fails | an answer | an answer |
//! | `CredentialRejected` | stays pending: the run stops | - | - |
//! | `OutOfCredit` | stays pending: the run stops | - | - |
//!
//! Retries count against the job's attempts and retry time, except attempts that fail
//! while an outage is declared (see [`crate::throttle`]).
//!
//! This module depends on nothing else of the crate: the store keeps [`ErrorClass`] and
//! [`AttemptNote`] in its records.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What kind of failure an attempt had: the error table's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The server answered outside 2xx.
    Http,
    /// No answer within the timeout (HTTP), or a process killed at its timeout (exec).
    Timeout,
    /// The connection could not be made.
    Connect,
    /// The connection broke before a whole answer arrived.
    Connection,
    /// The answer could not be read (body error, too large).
    Body,
    /// The request could not be built from the ID (invalid header value, a program that
    /// cannot be started, and the like).
    Request,
    /// An answer that the job's checks refuse (`fail-if`, `retry-if`, or a check that
    /// failed on it): see [`crate::answer`].
    Invalid,
    /// A process of the exec handler exited with a code other than 0, or was killed.
    Exit,
    /// A failure reported by a handler of the library's user, without a class of its own.
    Handler,
    /// A batch endpoint's answers never mentioned the ID, even asked alone.
    Missing,
    /// The pages of a paginated ID's answer could not all be followed: a next request that
    /// loops back or is not one, more pages than the job allows.
    Pagination,
}

impl ErrorClass {
    /// Every class, in a fixed order (for counting, and for `--class`).
    pub const ALL: [ErrorClass; 11] = [
        ErrorClass::Http,
        ErrorClass::Timeout,
        ErrorClass::Connect,
        ErrorClass::Connection,
        ErrorClass::Body,
        ErrorClass::Request,
        ErrorClass::Invalid,
        ErrorClass::Exit,
        ErrorClass::Handler,
        ErrorClass::Missing,
        ErrorClass::Pagination,
    ];

    /// The class's name, as stored and as `--class` takes it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Http => "http",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Connect => "connect",
            ErrorClass::Connection => "connection",
            ErrorClass::Body => "body",
            ErrorClass::Request => "request",
            ErrorClass::Invalid => "invalid",
            ErrorClass::Exit => "exit",
            ErrorClass::Handler => "handler",
            ErrorClass::Missing => "missing",
            ErrorClass::Pagination => "pagination",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What happens after a failed attempt (see the module doc for what each one feeds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Fail the ID now: another attempt would get the same answer.
    Permanent,
    /// Try again: after `after` if the other side said so, else after the backoff.
    Retry {
        /// The delay the other side asked for (`Retry-After`), if any.
        after: Option<Duration>,
    },
    /// The other side is overloaded (HTTP 503, 529): try again, and slow down, unless such
    /// refusals are shown to repeat on the same IDs while others succeed (see
    /// [`crate::throttle`]): then they are the IDs', not the rate's.
    Pushback {
        /// The delay the other side asked for (`Retry-After`), if any.
        after: Option<Duration>,
    },
    /// The other side refuses the client's rate (HTTP 429, "too many requests"): try again
    /// and slow down. Never the ID's doing, so it uses none of the ID's attempts, only its
    /// retry time (which bounds an API that refuses for good).
    TooMany {
        /// The delay the other side asked for (`Retry-After`), if any.
        after: Option<Duration>,
    },
    /// The other side could not be reached (refused or dropped connection, a gateway's
    /// 5xx): try again; evidence that it is out.
    Unreachable {
        /// The delay the other side asked for (`Retry-After`), if any.
        after: Option<Duration>,
    },
    /// No answer in time: try again; both pushback and evidence of an outage.
    TimedOut,
    /// The other side refused the job's credential and it was renewed since the attempt
    /// (see [`crate::credential`]): try again at once with the new value. Not the ID's
    /// doing: it uses no attempt and no retry time.
    Renewed,
    /// As [`Next::Renewed`], but the refused value was accepted for a request made after
    /// this one: it had not expired, so the refusal may be the ID's own (an API that answers
    /// 401 for it alone). Tried again at once, a few times at most, then the ID fails.
    RenewedAlone,
    /// The job's credential is rejected (refused again right after its renewal, or its
    /// source refuses the client): the run stops, the ID stays pending, and a resume once
    /// the credential is fixed calls it.
    CredentialRejected,
    /// The other side says the account is out of credit (a metered API's 402, OpenAI's
    /// `insufficient_quota`, Anthropic's "credit balance is too low"): waiting does not help,
    /// only the account's owner does. The run stops, the ID stays pending, and a resume once
    /// credit is added calls it.
    OutOfCredit,
}

/// How many [`Next::RenewedAlone`] retries an item gets between other errors: past them, a
/// refusal that a fresh credential does not cure (an API that answers 401 for this ID alone)
/// fails the ID.
pub(crate) const MAX_RENEWED_ALONE: u32 = 3;

/// How many renewed retries ([`Next::Renewed`] or [`Next::RenewedAlone`]) in a row an item
/// gets. Each one follows a refusal of a value that had expired for every request, so this
/// many means values live for less than one of this item's requests: the ID fails rather
/// than loop.
pub(crate) const MAX_RENEWALS: u32 = 100;

impl Next {
    /// Whether the attempt is worth another one, and when: `None` for permanent (and for a
    /// rejected credential or a spent credit, which stop the run instead), `Some(Some(0))`
    /// for at once.
    pub fn retry_after(self) -> Option<Option<Duration>> {
        match self {
            Next::Permanent | Next::CredentialRejected | Next::OutOfCredit => None,
            Next::Renewed | Next::RenewedAlone => Some(Some(Duration::ZERO)),
            Next::Retry { after }
            | Next::Pushback { after }
            | Next::TooMany { after }
            | Next::Unreachable { after } => Some(after),
            Next::TimedOut => Some(None),
        }
    }
}

/// One failed attempt: what the error table shows, and what happens next. The message never
/// holds a secret (an expanded URL or header value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What happens after this attempt.
    pub next: Next,
    /// The kind of error, as counted and shown.
    pub class: ErrorClass,
    /// The HTTP status of the answer, when there was one.
    pub status: Option<u16>,
    /// What went wrong, for the user; never a secret.
    pub message: String,
}

impl Failure {
    fn new(next: Next, message: impl Into<String>) -> Failure {
        Failure {
            next,
            class: ErrorClass::Handler,
            status: None,
            message: message.into(),
        }
    }

    /// The ID fails now (class `handler` unless set with [`Failure::class`]).
    pub fn permanent(message: impl Into<String>) -> Failure {
        Failure::new(Next::Permanent, message)
    }

    /// The attempt is retried after the backoff.
    pub fn retry(message: impl Into<String>) -> Failure {
        Failure::new(Next::Retry { after: None }, message)
    }

    /// The attempt is retried after `after` (in place of the backoff).
    pub fn retry_after(message: impl Into<String>, after: Duration) -> Failure {
        Failure::new(Next::Retry { after: Some(after) }, message)
    }

    /// The other side is overloaded: retried, and the adaptive rate slows down.
    pub fn pushback(message: impl Into<String>, after: Option<Duration>) -> Failure {
        Failure::new(Next::Pushback { after }, message)
    }

    /// The other side refuses the rate ("too many requests"): retried without using an
    /// attempt, and the adaptive rate slows down.
    pub fn too_many(message: impl Into<String>, after: Option<Duration>) -> Failure {
        Failure::new(Next::TooMany { after }, message)
    }

    /// The other side says the account is out of credit: the run stops, the ID stays
    /// pending.
    pub fn out_of_credit(message: impl Into<String>) -> Failure {
        Failure::new(Next::OutOfCredit, message)
    }

    /// The other side cannot be reached: retried; enough of these in a row is an outage
    /// (the run pauses and probes, and the attempts made during it are free).
    pub fn unreachable(message: impl Into<String>) -> Failure {
        Failure::new(Next::Unreachable { after: None }, message)
    }

    /// No answer in time: retried; pushback and outage evidence both.
    pub fn timed_out(message: impl Into<String>) -> Failure {
        Failure {
            class: ErrorClass::Timeout,
            ..Failure::new(Next::TimedOut, message)
        }
    }

    /// The same failure, of class `class`.
    pub fn class(self, class: ErrorClass) -> Failure {
        Failure { class, ..self }
    }

    /// The same failure, with the HTTP status of its answer.
    pub fn status(self, status: u16) -> Failure {
        Failure {
            status: Some(status),
            ..self
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class, self.message)
    }
}

impl std::error::Error for Failure {}

/// One failed attempt, as kept in an item's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptNote {
    /// The attempt's error class.
    pub class: ErrorClass,
    /// The attempt's HTTP status, if it got an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// The attempt did not count against the item's attempts: it failed during an API
    /// outage, or the API refused it to slow the client down (429).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_round_trip_through_serde() {
        for class in ErrorClass::ALL {
            let json = serde_json::to_string(&class).unwrap();
            assert_eq!(json, format!("\"{}\"", class.name()));
            assert_eq!(serde_json::from_str::<ErrorClass>(&json).unwrap(), class);
        }
    }

    #[test]
    fn every_next_but_permanent_is_retried() {
        let after = Some(Duration::from_secs(2));
        assert_eq!(Next::Permanent.retry_after(), None);
        assert_eq!(Next::Retry { after }.retry_after(), Some(after));
        assert_eq!(Next::Pushback { after }.retry_after(), Some(after));
        assert_eq!(Next::TooMany { after }.retry_after(), Some(after));
        assert_eq!(Next::Unreachable { after: None }.retry_after(), Some(None));
        assert_eq!(Next::TimedOut.retry_after(), Some(None));
        assert_eq!(Next::OutOfCredit.retry_after(), None);
        let f = Failure::too_many("slow down", after).status(429);
        assert_eq!((f.class, f.status), (ErrorClass::Handler, Some(429)));
        assert_eq!(Failure::timed_out("late").class, ErrorClass::Timeout);
    }
}
