//! A [`Credential`]: the current value of a secret, numbered by its generation, renewed
//! before it expires and when the other side refuses it (see [`crate::credential`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::error::CredentialError;
use super::fetched::REDACTED;
use super::source::CredentialSource;
use crate::failure::{Failure, Next};
use crate::secrets::Secrets;

/// The largest margin before `expires_in` runs out at which a token is renewed.
pub const MAX_EXPIRY_MARGIN: Duration = Duration::from_secs(60);

/// A credential's value as read for one request: the secret, its generation, and the
/// ticket of the read (reads are numbered in order, so an answer to a later read tells
/// whether the value still worked after this one was sent).
#[derive(Clone)]
pub struct CredentialValue {
    generation: u64,
    secret: Arc<str>,
    ticket: u64,
}

impl CredentialValue {
    /// The secret itself, to put in a request. Never log it.
    pub fn expose(&self) -> &str {
        &self.secret
    }

    /// Which value of the credential this is: 1 for the first, one more per renewal.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl fmt::Debug for CredentialValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialValue")
            .field("generation", &self.generation)
            .field("secret", &REDACTED)
            .finish()
    }
}

/// What a refusal of a value leads to ([`Credential::refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A newer value is there: retry with it.
    Renewed,
    /// A newer value is there, but the refused one was accepted for a request read after
    /// this one: it had not expired, so the refusal may be the request's own (an API that
    /// refuses one ID alone). Retry with the new value, a few times at most.
    RenewedAlone,
    /// The value was renewed because of a refusal and refused again before anything
    /// succeeded with it: the credential itself is rejected.
    Rejected,
}

/// A credential shared by every request of a run (behind an `Arc`): see the module doc.
pub struct Credential {
    name: String,
    source: CredentialSource,
    /// Renew at least this often.
    every: Option<Duration>,
    state: Mutex<State>,
    /// Held while renewing: one renewal at a time.
    renewing: tokio::sync::Mutex<()>,
    renewals: AtomicU64,
    /// Every value it had and its source's secrets, to mask in messages.
    secrets: Secrets,
    /// The next read's ticket.
    tickets: AtomicU64,
}

/// How many generations [`State::accepted`] remembers.
const ACCEPTED_GENERATIONS: usize = 4;

#[derive(Default)]
pub(super) struct State {
    pub(super) value: Option<CredentialValue>,
    /// When the value is due for renewal.
    pub(super) due: Option<Instant>,
    /// The value was fetched because the one before was refused.
    pub(super) after_refusal: bool,
    /// A request succeeded with the value.
    pub(super) proven: bool,
    /// When the value expires, if its source said.
    pub(super) expires: Option<Instant>,
    /// Renewals tried, and the error of the last one if it failed.
    pub(super) tries: u64,
    pub(super) last_error: Option<CredentialError>,
    /// Renewals that failed in a row, and when the next may be tried before the value is
    /// needed (see [`Credential::get`]).
    pub(super) failures: u32,
    pub(super) retry_at: Option<Instant>,
    /// For the last few generations, the latest ticket of a read whose request was
    /// accepted: a refusal of a read before it was not the value's expiry.
    pub(super) accepted: Vec<(u64, u64)>,
}

impl State {
    /// The value, if it has not expired (as far as its source said).
    fn usable(&self, now: Instant) -> Option<&CredentialValue> {
        self.value
            .as_ref()
            .filter(|_| self.expires.is_none_or(|e| now < e))
    }
}

/// How long after a failed renewal a value that still works is used before the next try:
/// doubling from 1 s, at most 30 s.
fn retry_after_failures(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.min(5)).min(Duration::from_secs(30))
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("name", &self.name)
            .field("renewals", &self.renewals())
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// A credential named `name` (as `${NAME}` in templates) from `source`, renewed at least
    /// every `every` if given. Its first value is fetched by the first [`Credential::get`].
    pub fn new(name: impl Into<String>, source: CredentialSource, every: Option<Duration>) -> Self {
        let secrets = Secrets::new();
        for secret in source.secrets() {
            secrets.add(&secret);
        }
        Credential {
            secrets,
            name: name.into(),
            source,
            every: every.filter(|d| !d.is_zero()),
            state: Mutex::new(State::default()),
            renewing: tokio::sync::Mutex::new(()),
            renewals: AtomicU64::new(0),
            tickets: AtomicU64::new(0),
        }
    }

    /// The name templates know it by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Values fetched so far (the first one included).
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Relaxed)
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current value, renewed first if there is none yet or it is due.
    ///
    /// A due value that has not expired yet outlives a renewal that fails for now: it is
    /// used meanwhile, and the renewal tried again after a backoff (1 s, doubling up to
    /// 30 s), so a token endpoint's blip during the margin before expiry costs no request.
    pub async fn get(&self) -> Result<CredentialValue, CredentialError> {
        let mut value = self.current().await?;
        value.ticket = self.tickets.fetch_add(1, Relaxed);
        Ok(value)
    }

    async fn current(&self) -> Result<CredentialValue, CredentialError> {
        let now = Instant::now();
        let (seen, tries) = {
            let state = self.state();
            if let Some(v) = &state.value {
                let due = state.due.is_some_and(|due| now >= due);
                let waiting = state.retry_at.is_some_and(|at| now < at);
                if !due || (waiting && state.usable(now).is_some()) {
                    return Ok(v.clone());
                }
            }
            (
                state.value.as_ref().map_or(0, |v| v.generation),
                state.tries,
            )
        };
        match self.renew(seen, tries, false).await {
            Err(e @ CredentialError::Unavailable { .. }) => {
                let state = self.state();
                match state.usable(Instant::now()) {
                    Some(v) if v.generation == seen => Ok(v.clone()),
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// The other side refused `used` (HTTP 401, or 403 when the job says so): renew from
    /// it, once however many requests report it, and say whether to retry or stop.
    pub async fn refused(&self, used: &CredentialValue) -> Result<Refusal, CredentialError> {
        let (tries, renewed) = {
            let state = self.state();
            let alone = state
                .accepted
                .iter()
                .any(|&(g, ticket)| g == used.generation && ticket > used.ticket);
            let renewed = if alone {
                Refusal::RenewedAlone
            } else {
                Refusal::Renewed
            };
            let current = state.value.as_ref().map_or(0, |v| v.generation);
            if current != used.generation {
                return Ok(renewed);
            }
            if state.after_refusal && !state.proven {
                return Ok(Refusal::Rejected);
            }
            (state.tries, renewed)
        };
        tracing::debug!(credential = %self.name, generation = used.generation, "refused: renewing");
        self.renew(used.generation, tries, true).await?;
        Ok(renewed)
    }

    /// The attempt that used `used` was refused (`failure`, its 401): renew, and return the
    /// failure with what happens next: [`Next::Renewed`] (retry at once with the new value),
    /// [`Next::CredentialRejected`] (the run stops), or the source out of reach (retried).
    pub async fn after_refusal(&self, used: &CredentialValue, failure: Failure) -> Failure {
        match self.refused(used).await {
            Ok(Refusal::Renewed) => Failure {
                next: Next::Renewed,
                ..failure
            },
            Ok(Refusal::RenewedAlone) => Failure {
                next: Next::RenewedAlone,
                ..failure
            },
            Ok(Refusal::Rejected) => Failure {
                next: Next::CredentialRejected,
                message: format!(
                    "credential {} was rejected: refused again right after its renewal ({})",
                    self.name, failure.message
                ),
                ..failure
            },
            Err(e) => e.into_failure(),
        }
    }

    /// A request made with `used` succeeded (or was refused for a reason not its
    /// credential's): the value works.
    pub fn accepted(&self, used: &CredentialValue) {
        let mut state = self.state();
        if state.value.as_ref().map(|v| v.generation) == Some(used.generation) {
            state.proven = true;
        }
        match state
            .accepted
            .iter_mut()
            .find(|(g, _)| *g == used.generation)
        {
            Some((_, ticket)) => *ticket = (*ticket).max(used.ticket),
            None => {
                state.accepted.push((used.generation, used.ticket));
                state.accepted.sort_unstable();
                if state.accepted.len() > ACCEPTED_GENERATIONS {
                    state.accepted.remove(0);
                }
            }
        }
    }

    /// Renew from generation `seen`, unless another caller did meanwhile. `tries`: the
    /// renewals tried when the caller looked, so that callers who waited on a renewal that
    /// failed get its error instead of trying again at once, one after the other.
    async fn renew(
        &self,
        seen: u64,
        tries: u64,
        after_refusal: bool,
    ) -> Result<CredentialValue, CredentialError> {
        let _one_at_a_time = self.renewing.lock().await;
        {
            let state = self.state();
            if let Some(v) = &state.value {
                if v.generation != seen {
                    return Ok(v.clone());
                }
            }
            if state.tries != tries {
                if let Some(e) = &state.last_error {
                    return Err(e.clone());
                }
            }
        }
        let fetched = self.source.fetch(&self.name, &self.secrets).await;
        let mut state = self.state();
        state.tries += 1;
        let fetched = match fetched {
            Ok(f) if f.value.is_empty() => Err(CredentialError::Unavailable {
                name: self.name.clone(),
                message: "the source gave an empty value".into(),
            }),
            other => other,
        };
        let fetched = match fetched {
            Ok(f) => f,
            Err(e) => {
                let e = self.redacted_error(e);
                // Said at once (the attempts that needed it only show as unreachable), and
                // again after 2, 4, 8... failures in a row.
                if (state.failures + 1).is_power_of_two() {
                    tracing::warn!("{e}");
                } else {
                    tracing::debug!("{e}");
                }
                state.last_error = Some(e.clone());
                state.retry_at = Some(Instant::now() + retry_after_failures(state.failures));
                state.failures = state.failures.saturating_add(1);
                return Err(e);
            }
        };
        // Known to every masker before any request can carry it.
        self.secrets.add(&fetched.value);
        let generation = seen.max(state.value.as_ref().map_or(0, |v| v.generation)) + 1;
        let value = CredentialValue {
            generation,
            secret: Arc::from(fetched.value),
            ticket: 0,
        };
        let now = Instant::now();
        state.due = due_in(fetched.expires_in, self.every).map(|d| now + d);
        state.expires = fetched.expires_in.map(|d| now + d);
        state.failures = 0;
        state.retry_at = None;
        state.value = Some(value.clone());
        state.after_refusal = after_refusal;
        state.proven = false;
        state.last_error = None;
        self.renewals.fetch_add(1, Relaxed);
        tracing::debug!(
            credential = %self.name,
            generation,
            expires_in = ?fetched.expires_in,
            "renewed"
        );
        Ok(value)
    }

    fn redacted_error(&self, e: CredentialError) -> CredentialError {
        let clean = |m: String| self.secrets.mask(&m);
        match e {
            CredentialError::Unavailable { name, message } => CredentialError::Unavailable {
                name,
                message: clean(message),
            },
            CredentialError::Rejected { name, message } => CredentialError::Rejected {
                name,
                message: clean(message),
            },
        }
    }

    /// `text` with every secret of this credential (each value it had, its client secret,
    /// what was expanded to define it) replaced by [`crate::secrets::MASK`].
    pub fn redact(&self, text: &str) -> String {
        self.secrets.mask(text)
    }

    /// Its secrets: each value it had and its source's, and whatever a caller adds (the
    /// values expanded to define it). [`Secrets::feed`] them to a job's masker.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }
}

/// How long a value is used before it is renewed: its lifetime minus the margin (the
/// smaller of 10% and [`MAX_EXPIRY_MARGIN`]), or `every`, whichever is shorter; `None`
/// when neither is known (renewed only when refused).
pub fn due_in(expires_in: Option<Duration>, every: Option<Duration>) -> Option<Duration> {
    let by_expiry = expires_in.map(|life| life - (life / 10).min(MAX_EXPIRY_MARGIN));
    match (by_expiry, every) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
