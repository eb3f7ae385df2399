//! Retry: the loop around an item's attempts, and how long to wait before the next one.
//!
//! Whether an attempt is worth another is not decided here but by the handler that made it
//! ([`crate::failure::Next`], one classifier per kind of work); this module runs the
//! attempts: exponential backoff with jitter from the `backoff` crate, bounded by attempts
//! and by elapsed time, a server-given delay (`after`) in place of the backoff interval for
//! that wait. The `backoff` crate stays behind this module so the engine never sees it.

use std::future::Future;
use std::time::Duration;

use backoff::backoff::Backoff;

use crate::failure::{AttemptNote, Failure, Next, MAX_RENEWALS, MAX_RENEWED_ALONE};
use crate::handler::Output;
use crate::spec::RetryPolicy;

/// How an item (or a batch of items, with the batch's parts as `T`) ended. `errors` lists
/// every failed attempt's error, oldest first.
#[derive(Debug)]
pub(crate) enum ItemOutcome<T = Output> {
    /// An attempt succeeded: the item is done.
    Ok {
        /// What the handler returned.
        output: T,
        /// Attempts made, the last included (free ones too: see [`Charge`]).
        attempts: u32,
        /// Every failed attempt's note, oldest first.
        errors: Vec<AttemptNote>,
    },
    /// Out of attempts or permanently refused: the last error.
    Failed {
        /// The last attempt's failure.
        error: Failure,
        /// Attempts made, free ones included.
        attempts: u32,
        /// Every failed attempt's note, oldest first.
        errors: Vec<AttemptNote>,
    },
    /// Stopped before a final answer (shutdown): the item stays pending and is replayed.
    Abandoned,
}

/// Whether an attempt counts against the item's attempts and retry time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charge {
    /// The attempt uses one of the item's attempts.
    Counted,
    /// The API refused the call to slow the client down (429): not the ID's doing, so it
    /// uses none of the item's attempts. It waits its backoff (or the server's delay) as a
    /// counted one does, and that time counts against the item's retry time, which bounds an
    /// API that refuses for good.
    Refused,
    /// The attempt failed because the whole API was out: it costs the item nothing.
    Free,
}

/// Run `attempt` until it succeeds, fails permanently, or the policy runs out.
///
/// `attempt` gets the 1-based number of the attempt and returns its result, whether it
/// counts ([`Charge`]) and how long it took once its gates let it through (the rate limit,
/// an outage, a spent quota window: those waits are the run's, never the item's retry
/// time), or `None` when it gave up before sending (the run is stopping);
/// free attempts (during an outage) neither use up attempts nor advance the backoff, and
/// refused ones (429) use up retry time but no attempt. An attempt whose credential was
/// renewed ([`Next::Renewed`]) is made again at once, using neither, up to [`MAX_RENEWALS`]
/// times in a row, and [`MAX_RENEWED_ALONE`] times when the refused value still worked for
/// later requests (then the refusal is the ID's: it fails). `stopping` resolves when the run is
/// shutting down: the loop then gives up instead of waiting for a backoff to pass, and the
/// item is [`ItemOutcome::Abandoned`].
pub(crate) async fn run<T, F, Fut, S>(
    policy: &RetryPolicy,
    mut attempt: F,
    stopping: S,
) -> ItemOutcome<T>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Option<(Result<T, Failure>, Charge, Duration)>>,
    S: Future<Output = ()>,
{
    tokio::pin!(stopping);
    let mut backoff = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(policy.initial)
        .with_max_interval(policy.max_interval)
        .with_multiplier(2.0)
        .with_randomization_factor(0.5)
        // Elapsed time is bounded here (`charged_time`, in tokio's time), never by the
        // backoff, so its clock (std's) is never read for a decision.
        .with_max_elapsed_time(None)
        .build();
    let max_attempts = policy.max_attempts.max(1);
    let mut charged = 0;
    let mut made = 0;
    let mut charged_time = Duration::ZERO;
    let mut renewed = 0;
    let mut alone = 0;
    let mut errors = Vec::new();
    loop {
        made += 1;
        let Some((result, charge, took)) = attempt(made).await else {
            return ItemOutcome::Abandoned;
        };
        let error = match result {
            Ok(output) => {
                return ItemOutcome::Ok {
                    output,
                    attempts: made,
                    errors,
                }
            }
            Err(error) => error,
        };
        let renewal = matches!(error.next, Next::Renewed | Next::RenewedAlone);
        errors.push(AttemptNote {
            class: error.class,
            http_status: error.status,
            free: charge != Charge::Counted || renewal,
        });
        if renewal {
            renewed += 1;
            alone += u32::from(error.next == Next::RenewedAlone);
            if renewed > MAX_RENEWALS || alone > MAX_RENEWED_ALONE {
                return ItemOutcome::Failed {
                    error,
                    attempts: made,
                    errors,
                };
            }
            continue;
        }
        renewed = 0;
        alone = 0;
        let wait = match (error.next.retry_after(), charge) {
            (None, _) => {
                return ItemOutcome::Failed {
                    error,
                    attempts: made,
                    errors,
                }
            }
            // The outage gate holds the next attempt back; only avoid a hot loop here.
            (Some(_), Charge::Free) => policy.initial.min(Duration::from_millis(100)),
            (Some(after), counted_or_refused) => {
                if counted_or_refused == Charge::Counted {
                    charged += 1;
                }
                charged_time += took;
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

    fn http(status: u16) -> Failure {
        let failure = if status == 404 {
            Failure::permanent(format!("HTTP {status}"))
        } else {
            Failure::pushback(format!("HTTP {status}"), None)
        };
        failure.status(status)
    }

    fn ok() -> Output {
        Output::json_text("1").unwrap()
    }

    fn policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            initial: Duration::from_millis(1),
            max_interval: Duration::from_millis(2),
            max_elapsed: Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn retries_until_success() {
        let outcome: ItemOutcome = run(
            &policy(5),
            |n| async move {
                let r = if n < 3 { Err(http(503)) } else { Ok(ok()) };
                Some((r, Charge::Counted, Duration::ZERO))
            },
            std::future::pending(),
        )
        .await;
        assert!(matches!(outcome, ItemOutcome::Ok { attempts: 3, .. }));
    }

    // Paused: an hour at the gates passes at once.
    #[tokio::test(start_paused = true)]
    async fn waits_at_the_gates_use_no_retry_time() {
        // Each attempt first waits an hour for a spent quota window, then its call takes
        // 20 ms: a retry time of a minute is never used up.
        let outcome: ItemOutcome = run(
            &policy(5),
            |n| async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                let r = if n < 3 { Err(http(503)) } else { Ok(ok()) };
                Some((r, Charge::Counted, Duration::from_millis(20)))
            },
            std::future::pending(),
        )
        .await;
        assert!(
            matches!(outcome, ItemOutcome::Ok { attempts: 3, .. }),
            "{outcome:?}"
        );
    }

    #[tokio::test]
    async fn permanent_is_not_retried() {
        let outcome: ItemOutcome = run(
            &policy(5),
            |_| async { Some((Err(http(404)), Charge::Counted, Duration::ZERO)) },
            std::future::pending(),
        )
        .await;
        assert!(matches!(outcome, ItemOutcome::Failed { attempts: 1, .. }));
    }

    #[tokio::test]
    async fn out_of_attempts_keeps_the_last_error() {
        let outcome: ItemOutcome = run(
            &policy(3),
            |n| async move {
                Some((
                    Err(http(if n == 3 { 502 } else { 503 })),
                    Charge::Counted,
                    Duration::ZERO,
                ))
            },
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
                assert_eq!(error.status, Some(502));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_given_delay_replaces_the_backoff() {
        let mut p = policy(2);
        p.initial = Duration::from_secs(3600);
        p.max_interval = Duration::from_secs(3600);
        let started = std::time::Instant::now();
        let outcome: ItemOutcome = run(
            &p,
            |n| async move {
                let r = if n == 1 {
                    Err(Failure::retry_after("later", Duration::from_millis(1)))
                } else {
                    Ok(ok())
                };
                Some((r, Charge::Counted, Duration::ZERO))
            },
            std::future::pending(),
        )
        .await;
        assert!(matches!(outcome, ItemOutcome::Ok { attempts: 2, .. }));
        assert!(started.elapsed() < Duration::from_secs(3600));
    }

    #[tokio::test]
    async fn free_attempts_do_not_use_up_the_item() {
        let outcome: ItemOutcome = run(
            &policy(2),
            |n| async move {
                Some(match n {
                    1..=6 => (Err(http(503)), Charge::Free, Duration::ZERO),
                    7 => (Err(http(503)), Charge::Counted, Duration::ZERO),
                    _ => (Ok(ok()), Charge::Counted, Duration::ZERO),
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
    async fn refusals_use_no_attempt_but_use_up_retry_time() {
        // Nine 429s, then an answer, with 3 attempts: the refusals cost none of them.
        let outcome: ItemOutcome = run(
            &policy(3),
            |n| async move {
                Some(if n <= 9 {
                    (Err(http(429)), Charge::Refused, Duration::ZERO)
                } else {
                    (Ok(ok()), Charge::Counted, Duration::ZERO)
                })
            },
            std::future::pending(),
        )
        .await;
        match outcome {
            ItemOutcome::Ok {
                attempts, errors, ..
            } => {
                assert_eq!(attempts, 10);
                assert!(errors.iter().all(|e| e.free && e.http_status == Some(429)));
            }
            other => panic!("{other:?}"),
        }
        // An API that refuses for good: the item fails once its retry time is used up,
        // however many attempts it has left.
        let mut p = policy(3);
        p.max_elapsed = Duration::from_millis(200);
        let outcome: ItemOutcome = run(
            &p,
            |_| async { Some((Err(http(429)), Charge::Refused, Duration::ZERO)) },
            std::future::pending(),
        )
        .await;
        match outcome {
            ItemOutcome::Failed { attempts, .. } => assert!(attempts > 3, "{attempts}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_renewed_credential_is_retried_at_once_and_free_a_few_times_alone() {
        let refused = |next| Err(Failure { next, ..http(401) });
        let mut p = policy(1);
        p.initial = Duration::from_secs(3600);
        p.max_elapsed = Duration::from_millis(1);
        // Two renewals then an answer, with one attempt and no retry time: both free.
        let outcome: ItemOutcome = run(
            &p,
            |n| async move {
                Some((
                    if n <= 2 {
                        refused(Next::RenewedAlone)
                    } else {
                        Ok(ok())
                    },
                    Charge::Counted,
                    Duration::ZERO,
                ))
            },
            std::future::pending(),
        )
        .await;
        match outcome {
            ItemOutcome::Ok {
                attempts, errors, ..
            } => {
                assert_eq!(attempts, 3);
                assert!(errors.iter().all(|e| e.free));
            }
            other => panic!("{other:?}"),
        }
        let fails_after = |pattern: fn(u32) -> Next| {
            let p = p.clone();
            async move {
                let outcome: ItemOutcome = run(
                    &p,
                    |n| async move { Some((refused(pattern(n)), Charge::Counted, Duration::ZERO)) },
                    std::future::pending(),
                )
                .await;
                match outcome {
                    ItemOutcome::Failed { attempts, .. } => attempts,
                    other => panic!("{other:?}"),
                }
            }
        };
        // Refused whatever the credential while it works for later requests: the ID fails
        // after a few renewals, however many expired values come between.
        assert_eq!(
            fails_after(|_| Next::RenewedAlone).await,
            MAX_RENEWED_ALONE + 1
        );
        assert_eq!(
            fails_after(|n| if n % 2 == 0 {
                Next::RenewedAlone
            } else {
                Next::Renewed
            })
            .await,
            2 * (MAX_RENEWED_ALONE + 1)
        );
        // Values that expired for every request (tokens living less than a request's wait
        // for its turn) are no evidence against the ID: retried many more times.
        assert_eq!(fails_after(|_| Next::Renewed).await, MAX_RENEWALS + 1);
    }

    #[tokio::test]
    async fn stopping_abandons_during_a_wait() {
        let mut p = policy(5);
        p.initial = Duration::from_secs(3600);
        p.max_interval = Duration::from_secs(3600);
        p.max_elapsed = Duration::from_secs(100_000);
        let outcome: ItemOutcome = run(
            &p,
            |_| async { Some((Err(http(503)), Charge::Counted, Duration::ZERO)) },
            async {},
        )
        .await;
        assert!(matches!(outcome, ItemOutcome::Abandoned));
    }
}
