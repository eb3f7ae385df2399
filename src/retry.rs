//! Retry: what a failed attempt means, and how long to wait before the next one.
//!
//! Owns the one classifier that turns an attempt's failure into a [`Verdict`] (retry, maybe
//! after a server-given delay, or give up now), and the retry loop around an item's attempts:
//! exponential backoff with jitter from the `backoff` crate, bounded by attempts and by
//! elapsed time. The `backoff` crate stays behind this module so the engine never sees it.
//!
//! Rules: 408, 429 and 5xx answers, timeouts, refused or dropped connections are retried;
//! any other answer outside 2xx is a permanent failure at once; a request that cannot even be
//! built (an ID that makes an invalid header) is permanent too. A 2xx answer refused by the
//! job's answer checks ([`crate::answer`]) carries its own verdict: `retry-if` retries,
//! `fail-if` and a program's error do not; a body that is not JSON under `expect json` is of
//! class `body`, retried like a broken read. A usable `Retry-After` (seconds
//! or HTTP date, in the future) replaces the backoff interval for that wait; zero, negative or
//! unparseable values fall back to backoff so a server can never make us spin.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use backoff::backoff::Backoff;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::job::RetryPolicy;

/// The longest `Retry-After` we honour; a larger one is clamped to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// What kind of failure an attempt had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The server answered outside 2xx.
    Http,
    /// No answer within the timeout.
    Timeout,
    /// The connection could not be made.
    Connect,
    /// The connection broke before a whole answer arrived.
    Connection,
    /// The answer could not be read (body error, too large).
    Body,
    /// The request could not be built from the ID (invalid header value and the like).
    Request,
    /// A 2xx answer that the job's checks refuse (`fail-if`, `retry-if`, or a check that
    /// failed on it): see [`crate::answer`].
    Invalid,
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorClass::Http => "http",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Connect => "connect",
            ErrorClass::Connection => "connection",
            ErrorClass::Body => "body",
            ErrorClass::Request => "request",
            ErrorClass::Invalid => "invalid",
        })
    }
}

/// One failed attempt. The message never holds the expanded URL or header values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptError {
    pub class: ErrorClass,
    pub http_status: Option<u16>,
    pub message: String,
    /// The server's `Retry-After`, when it gave a usable one.
    pub retry_after: Option<Duration>,
    /// Set by a check that knows what its failure means (the answer checks of
    /// [`crate::answer`]: `retry-if` retries, `fail-if` does not); `None`: [`classify`]
    /// decides from the class and status.
    pub verdict: Option<Verdict>,
}

/// A successful answer.
#[derive(Debug, Clone)]
pub struct Success {
    pub http_status: u16,
    /// The body as JSON: the body itself when it parses, otherwise a JSON string of it.
    pub body: Box<RawValue>,
    pub latency: Duration,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Try again; wait `after` if the server said so, else back off.
    Retry { after: Option<Duration> },
    /// Give up on this item now.
    Permanent,
}

/// The one place that decides whether a failure is worth another attempt.
pub fn classify(error: &AttemptError) -> Verdict {
    if let Some(verdict) = error.verdict {
        return verdict;
    }
    let retry = Verdict::Retry {
        after: error.retry_after,
    };
    match error.class {
        ErrorClass::Timeout | ErrorClass::Connect | ErrorClass::Connection | ErrorClass::Body => {
            retry
        }
        // Without a verdict of its own, a refused answer is refused for good.
        ErrorClass::Request | ErrorClass::Invalid => Verdict::Permanent,
        ErrorClass::Http => match error.http_status {
            Some(408) | Some(429) => retry,
            Some(s) if (500..600).contains(&s) => retry,
            _ => Verdict::Permanent,
        },
    }
}

/// Parse a `Retry-After` value (delay-seconds or HTTP-date) into a usable wait, or `None`
/// when it is zero, in the past, or unparseable.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else if let Ok(secs) = value.parse::<f64>() {
        if !secs.is_finite() || secs <= 0.0 {
            return None;
        }
        Duration::from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64()))
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(now).ok()?
    };
    if wait.is_zero() {
        None
    } else {
        Some(wait.min(MAX_RETRY_AFTER))
    }
}

/// How an item ended. `errors` lists every failed attempt's error, oldest first.
#[derive(Debug)]
pub enum ItemOutcome {
    Ok {
        success: Success,
        attempts: u32,
        errors: Vec<AttemptNote>,
    },
    /// Out of attempts or permanently refused: the last error.
    Failed {
        error: AttemptError,
        attempts: u32,
        errors: Vec<AttemptNote>,
    },
    /// Stopped before a final answer (shutdown): the item stays pending and is replayed.
    Abandoned,
}

/// One failed attempt, as kept in an item's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptNote {
    pub class: ErrorClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// The attempt failed during an API outage and did not count against the item.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free: bool,
}

/// Whether an attempt counts against the item's attempts and retry time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    Counted,
    /// The attempt failed because the whole API was out: it costs the item nothing.
    Free,
}

/// Run `attempt` until it succeeds, fails permanently, or the policy runs out.
///
/// `attempt` gets the 1-based number of the attempt and returns its result and whether it
/// counts ([`Charge`]), or `None` when it gave up before sending (the run is stopping); free attempts (during an outage) neither use up attempts nor advance
/// the backoff. `stopping` resolves when the run is shutting down: the loop then gives up
/// instead of waiting for a backoff to pass, and the item is [`ItemOutcome::Abandoned`].
pub async fn run<F, Fut, S>(policy: &RetryPolicy, mut attempt: F, stopping: S) -> ItemOutcome
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Option<(Result<Success, AttemptError>, Charge)>>,
    S: Future<Output = ()>,
{
    tokio::pin!(stopping);
    let mut backoff = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(policy.initial)
        .with_max_interval(policy.max_interval)
        .with_multiplier(2.0)
        .with_randomization_factor(0.5)
        .with_max_elapsed_time(None)
        .build();
    let max_attempts = policy.max_attempts.max(1);
    let mut charged = 0;
    let mut made = 0;
    let mut charged_time = Duration::ZERO;
    let mut errors = Vec::new();
    loop {
        made += 1;
        let started = Instant::now();
        let Some((result, charge)) = attempt(made).await else {
            return ItemOutcome::Abandoned;
        };
        let error = match result {
            Ok(success) => {
                return ItemOutcome::Ok {
                    success,
                    attempts: made,
                    errors,
                }
            }
            Err(error) => error,
        };
        errors.push(AttemptNote {
            class: error.class,
            http_status: error.http_status,
            free: charge == Charge::Free,
        });
        let wait = match (classify(&error), charge) {
            (Verdict::Permanent, _) => {
                return ItemOutcome::Failed {
                    error,
                    attempts: made,
                    errors,
                }
            }
            // The outage gate holds the next attempt back; only avoid a hot loop here.
            (Verdict::Retry { .. }, Charge::Free) => policy.initial.min(Duration::from_millis(100)),
            (Verdict::Retry { after }, Charge::Counted) => {
                charged += 1;
                charged_time += started.elapsed();
                let wait = after
                    .or_else(|| backoff.next_backoff())
                    .unwrap_or(policy.max_interval);
                if charged >= max_attempts || charged_time + wait > policy.max_elapsed {
                    return ItemOutcome::Failed {
                        error,
                        attempts: made,
                        errors,
                    };
                }
                charged_time += wait;
                wait
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut stopping => return ItemOutcome::Abandoned,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16) -> AttemptError {
        AttemptError {
            class: ErrorClass::Http,
            http_status: Some(status),
            message: String::new(),
            retry_after: None,
            verdict: None,
        }
    }

    fn ok() -> Success {
        Success {
            http_status: 200,
            body: RawValue::from_string("1".into()).unwrap(),
            latency: Duration::ZERO,
        }
    }

    fn policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            initial: Duration::from_millis(1),
            max_interval: Duration::from_millis(2),
            max_elapsed: Duration::from_secs(60),
        }
    }

    #[test]
    fn classification() {
        for s in [408, 429, 500, 502, 503, 504, 599] {
            assert!(matches!(classify(&http(s)), Verdict::Retry { .. }), "{s}");
        }
        for s in [400, 401, 403, 404, 410, 422, 302] {
            assert_eq!(classify(&http(s)), Verdict::Permanent, "{s}");
        }
        for class in [
            ErrorClass::Timeout,
            ErrorClass::Connect,
            ErrorClass::Connection,
        ] {
            let e = AttemptError {
                class,
                http_status: None,
                message: String::new(),
                retry_after: None,
                verdict: None,
            };
            assert!(matches!(classify(&e), Verdict::Retry { .. }));
        }
        let e = AttemptError {
            class: ErrorClass::Request,
            http_status: None,
            message: String::new(),
            retry_after: None,
            verdict: None,
        };
        assert_eq!(classify(&e), Verdict::Permanent);
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("0", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("99999", now), Some(MAX_RETRY_AFTER));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), None);
    }

    #[tokio::test]
    async fn retries_until_success() {
        let outcome = run(
            &policy(5),
            |n| async move {
                let r = if n < 3 { Err(http(503)) } else { Ok(ok()) };
                Some((r, Charge::Counted))
            },
            std::future::pending(),
        )
        .await;
        assert!(matches!(outcome, ItemOutcome::Ok { attempts: 3, .. }));
    }

    #[tokio::test]
    async fn permanent_is_not_retried() {
        let outcome = run(
            &policy(5),
            |_| async { Some((Err(http(404)), Charge::Counted)) },
            std::future::pending(),
        )
        .await;
        assert!(matches!(outcome, ItemOutcome::Failed { attempts: 1, .. }));
    }

    #[tokio::test]
    async fn out_of_attempts_keeps_the_last_error() {
        let outcome = run(
            &policy(3),
            |n| async move { Some((Err(http(if n == 3 { 502 } else { 503 })), Charge::Counted)) },
            std::future::pending(),
        )
        .await;
        match outcome {
            ItemOutcome::Failed {
                error,
                attempts,
                errors,
            } => {
                assert_eq!(errors.len(), 3);
                assert_eq!(attempts, 3);
                assert_eq!(error.http_status, Some(502));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn free_attempts_do_not_use_up_the_item() {
        let outcome = run(
            &policy(2),
            |n| async move {
                Some(match n {
                    1..=6 => (Err(http(503)), Charge::Free),
                    7 => (Err(http(503)), Charge::Counted),
                    _ => (Ok(ok()), Charge::Counted),
                })
            },
            std::future::pending(),
        )
        .await;
        match outcome {
            ItemOutcome::Ok {
                attempts, errors, ..
            } => {
                assert_eq!(attempts, 8);
                assert_eq!(errors.iter().filter(|e| e.free).count(), 6);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn stopping_abandons_during_a_wait() {
        let mut p = policy(5);
        p.initial = Duration::from_secs(3600);
        p.max_interval = Duration::from_secs(3600);
        p.max_elapsed = Duration::from_secs(100_000);
        let outcome = run(
            &p,
            |_| async { Some((Err(http(503)), Charge::Counted)) },
            async {},
        )
        .await;
        assert!(matches!(outcome, ItemOutcome::Abandoned));
    }
}
