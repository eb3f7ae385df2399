//! The HTTP handler: one request per ID from the job's templates, and the classifier that
//! turns its answer into a result or a [`Failure`].
//!
//! Owns the request templates ([`RequestSpec`]: `{id}` placed and encoded for where it
//! stands, `${VAR}` expanded from the environment once, when the handler is built), the one
//! shared reqwest client (rustls, keep-alive pool, explicit timeouts), and the reading of an
//! answer: the HTTP status first (`classify_status`), then, for a 2xx answer, the job's
//! answer checks ([`crate::answer`]). What each failure means:
//!
//! | what happened | class | next |
//! |---|---|---|
//! | 429, or 403 with a rate-limit header saying nothing remains | `http` | too many: pushback using no attempt, after `Retry-After` (or the announced reset) |
//! | 503, 529 ("overloaded"), with or without `Retry-After` | `http` | pushback, after `Retry-After` |
//! | 402, 429 `insufficient_quota`, 400 "credit balance is too low" (read in `credit.rs`) | `http` | out of credit: the run stops |
//! | 408 | `http` | retry, after `Retry-After` |
//! | other 5xx | `http` | unreachable (a gateway's error), after `Retry-After` |
//! | any other status outside 2xx | `http` | permanent |
//! | no answer within `timeout` | `timeout` | timed out |
//! | connection refused, reset or dropped | `connect`, `connection` | unreachable |
//! | a body that cannot be read, or larger than `MAX_BODY_BYTES` | `body` | retry |
//! | an ID that makes no valid request | `request` | permanent |
//!
//! Every answer's rate-limit headers (`RateLimit`/`RateLimit-Policy`, `X-RateLimit-*` and the
//! like: `crate::quota::announced`) feed the handler's [`AnnouncedLimits`], which paces the
//! run's attempts ([`Handler::announced_limits`]); so does every answer's status: a 429 with
//! its `Retry-After`, or a call the API counted, from which it learns the windows nobody
//! announces (`crate::quota::learned`).
//!
//! A usable `Retry-After` (seconds or HTTP date, in the future) replaces the backoff interval
//! for that wait; zero, negative or unparseable values fall back to backoff so a server can
//! never make us spin.
//!
//! A 401 (or a 403 when the job says so) to a request made with the job's credentials is
//! decided by them ([`super::Credentials`]): renewed and retried at once, or the credential
//! rejected.
//!
//! Secrets: expanded values live only inside [`HttpHandler`]; its `Debug` output and every
//! error message it makes leave them out: reqwest errors are stripped of their URL, and every
//! failure's message is masked ([`crate::secrets`]) of the `${VAR}` values its templates
//! expanded and of every value its credentials had, in whatever the answer quotes (an API
//! that echoes the request in its error). A 2xx answer's body is kept as it came.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};

use super::credentials::Credentials;
use super::error::HandlerError;
use super::output::Output;
use super::template::{row_values, RowValues, Template};
use super::work::Handler;

pub use compiled::RequestSpec;
pub(crate) use compiled::{check_batch, check_templates};
use compiled::{check_batch_templates, Compiled};

use super::batch::{splitter, BatchAnswer, BatchSpec};
use crate::answer::{Answer, Splitter};
use crate::clock::Clock;
use crate::failure::{ErrorClass, Failure, Next};
use crate::quota::announced::read_announced;
use crate::quota::pacer::AnnouncedLimits;
use crate::secrets::Secrets;
use crate::setting::Setting;

mod compiled;
mod cost;
mod page;
mod target;

/// Largest answer body we keep; a larger one fails the attempt.
pub(crate) const MAX_BODY_BYTES: usize = 16 << 20;

/// How much of an answer outside 2xx its failure quotes.
const SNIPPET_BYTES: usize = 200;

/// The longest `Retry-After` we honour; a larger one is clamped to this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Makes one HTTP attempt for an ID. Cheap to share behind an `Arc`.
pub struct HttpHandler {
    client: reqwest::Client,
    request: Compiled,
    /// The job's checks of a 2xx answer and what of it is kept.
    answer: Answer,
    /// What the API announces of its limits, read from every answer.
    limits: Arc<AnnouncedLimits>,
    /// The job's credentials, read for each request.
    credentials: Credentials,
    /// The job's batch endpoint, if it has one.
    batch: Option<Box<Batch>>,
    /// How the job follows the pages of an answer, if it does.
    pager: Option<Box<crate::handler::paginate::Pager>>,
    /// What its templates expanded and its credentials' values: masked in failures.
    secrets: Secrets,
    /// The wall clock `Retry-After` dates and announced resets are read against.
    clock: Clock,
}

impl fmt::Debug for HttpHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpHandler")
            .field("method", &self.request.method)
            .finish_non_exhaustive()
    }
}

impl Handler for HttpHandler {
    fn call(&self, id: &str) -> impl std::future::Future<Output = Result<Output, Failure>> + Send {
        self.attempt(id)
    }

    fn call_row(
        &self,
        id: &str,
        row: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Output, Failure>> + Send {
        self.attempt_row(id, row)
    }

    fn call_batch(
        &self,
        items: &[(&str, Option<&str>)],
    ) -> impl std::future::Future<Output = Result<super::batch::BatchAnswer, Failure>> + Send {
        self.attempt_batch(items)
    }

    fn call_page(
        &self,
        id: &str,
        row: Option<&str>,
        at: &super::PageAt,
    ) -> impl std::future::Future<Output = Result<super::Page, Failure>> + Send {
        self.attempt_page(id, row, at)
    }

    fn announced_limits(&self) -> Option<Arc<AnnouncedLimits>> {
        Some(self.limits.clone())
    }

    fn estimate(&self, id: &str, row: Option<&str>) -> Option<crate::meter::Usage> {
        self.expected_cost(id, row)
    }

    fn most(&self, id: &str, row: Option<&str>) -> Option<crate::meter::Usage> {
        self.most_cost(id, row)
    }
}

impl HttpHandler {
    /// Build from the stored spec, expanding `${VAR}` from the process environment.
    pub fn new(spec: &RequestSpec) -> Result<HttpHandler, HandlerError> {
        Self::with_env(spec, &|name| std::env::var(name).ok())
    }

    /// Build with an explicit environment (tests, embedding).
    pub fn with_env(
        spec: &RequestSpec,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<HttpHandler, HandlerError> {
        Self::with_credentials(spec, Credentials::none(), env)
    }

    /// Build with credentials: a `${NAME}` of one of them in the templates is its current
    /// value for each request, not an environment variable.
    pub fn with_credentials(
        spec: &RequestSpec,
        credentials: Credentials,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<HttpHandler, HandlerError> {
        let secrets = Secrets::new();
        credentials.secrets().feed(&secrets);
        let request = Compiled::new(spec, &secrets.recording(env), &credentials.names())?;
        let mut client = reqwest::Client::builder();
        if !proxy_in_env() {
            // Nothing for reqwest's system proxy to find, but it would still look each
            // request's host up in its (empty) rules: 1.5k instructions per request.
            client = client.no_proxy();
        }
        let client = client
            .connect_timeout(spec.connect_timeout)
            .timeout(spec.timeout)
            // Every idle connection was opened by a call in flight, so the pool never
            // holds more than --concurrency: a cap below that (it was 1024) closes
            // connections that the next calls open again, at 4,000 in flight.
            .pool_max_idle_per_host(usize::MAX)
            .tcp_nodelay(true)
            // Retries are ours (crate::retry): one attempt per call, counted.
            .retry(reqwest::retry::never())
            .user_agent(concat!("highwater/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HandlerError::Client(e.to_string()))?;
        Ok(HttpHandler {
            client,
            request,
            answer: Answer::default(),
            limits: Arc::new(AnnouncedLimits::new(Clock::system())),
            credentials,
            batch: None,
            pager: None,
            secrets,
            clock: Clock::system(),
        })
    }

    /// Read `Retry-After` dates and the resets the API announces against `clock` (the
    /// system's by default): give it the run's ([`crate::RunOptions::clock`]).
    pub fn with_clock(mut self, clock: Clock) -> HttpHandler {
        self.limits = Arc::new(AnnouncedLimits::new(clock.clone()));
        self.clock = clock;
        self
    }

    /// Judge every 2xx answer with `answer` (the job's answer checks) before it counts as
    /// a success.
    pub fn with_answer(mut self, answer: Answer) -> HttpHandler {
        self.answer = answer;
        self
    }

    /// Call the job's batch endpoint: up to `spec.size` IDs per request, answers split by
    /// `spec.split` ([`crate::handler::batch`]).
    pub fn with_batch(mut self, spec: &BatchSpec) -> Result<HttpHandler, HandlerError> {
        let splitter = splitter(&spec.split)?;
        check_batch_templates(&self.request)?;
        self.batch = Some(Box::new(Batch {
            separator: spec.separator.clone(),
            splitter,
            source: spec.split.clone(),
        }));
        Ok(self)
    }

    /// One attempt for `id`.
    pub async fn attempt(&self, id: &str) -> Result<Output, Failure> {
        self.attempt_row(id, None).await
    }

    /// One attempt for `id`, with its input row's kept columns (`{column}` in the templates).
    /// A batch job's one ID is a batch of one.
    pub async fn attempt_row(&self, id: &str, row: Option<&str>) -> Result<Output, Failure> {
        self.one(id, row).await.map_err(|f| self.masked(f))
    }

    /// `failure` with its message masked of the job's secrets.
    fn masked(&self, failure: Failure) -> Failure {
        Failure {
            message: self.secrets.mask(&failure.message),
            ..failure
        }
    }

    async fn one(&self, id: &str, row: Option<&str>) -> Result<Output, Failure> {
        if self.batch.is_some() {
            return self.alone(id, row).await;
        }
        let row = row_values(row)?;
        self.check_id(id)?;
        let (status, headers, bytes) = self.exchange(Fill::One(id, row.as_ref()), None).await?;
        let usage = self.answer.usage(
            Some(status),
            || headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
            &bytes,
        );
        let result = self.answer.judge(
            Some(status),
            || headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
            bytes,
        )?;
        Ok(Output {
            result,
            status: Some(status),
            usage,
        })
    }

    /// Refuse an ID that cannot stand where the URL template puts it.
    fn check_id(&self, id: &str) -> Result<(), Failure> {
        if self.request.id_is_path_segment && (id == "." || id == "..") {
            return Err(Failure::permanent(format!(
                "the ID {id:?} cannot stand as a URL path segment (it would name another path)"
            ))
            .class(ErrorClass::Request));
        }
        Ok(())
    }

    /// One request for a batch of IDs (each with its row's kept columns), its answer split
    /// into each ID's result ([`Answer::split`]); IDs the answer does not mention are not in
    /// it. A failure is the whole request's (a status outside 2xx, no answer, an answer that
    /// cannot be split).
    pub async fn attempt_batch(
        &self,
        items: &[(&str, Option<&str>)],
    ) -> Result<BatchAnswer, Failure> {
        let mut answer = self
            .batch_unmasked(items)
            .await
            .map_err(|f| self.masked(f))?;
        for (_, part) in &mut answer.parts {
            if let Err(f) = part {
                f.message = self.secrets.mask(&f.message);
            }
        }
        Ok(answer)
    }

    async fn batch_unmasked(&self, items: &[(&str, Option<&str>)]) -> Result<BatchAnswer, Failure> {
        let Some(batch) = &self.batch else {
            return Err(
                Failure::permanent("this job has no batch endpoint").class(ErrorClass::Request)
            );
        };
        let rows = items
            .iter()
            .map(|(_, row)| row_values(*row))
            .collect::<Result<Vec<_>, _>>()?;
        let filled: Vec<(&str, Option<&RowValues>)> = items
            .iter()
            .zip(&rows)
            .map(|((id, _), row)| (*id, row.as_ref()))
            .collect();
        let (status, headers, bytes) = self
            .exchange(Fill::Batch(&filled, &batch.separator), None)
            .await?;
        let parts = self.answer.split(
            &batch.splitter,
            Some(status),
            || headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
            &bytes,
        )?;
        let parts = parts
            .into_iter()
            .map(|(id, result)| {
                // What the batch cost is the request's, not one ID's.
                let output = result.map(|result| Output {
                    result,
                    status: Some(status),
                    usage: None,
                });
                (id, output)
            })
            .collect();
        Ok(BatchAnswer {
            status: Some(status),
            parts,
        })
    }

    /// A batch job's request for one ID: its part of the answer, or a retryable failure of
    /// class `missing` when the answer does not mention it.
    async fn alone(&self, id: &str, row: Option<&str>) -> Result<Output, Failure> {
        let answer = self.attempt_batch(&[(id, row)]).await?;
        let mine = answer.parts.into_iter().find(|(key, _)| key == id);
        match mine {
            Some((_, result)) => result,
            None => Err(Failure::retry(format!(
                "the batch answer does not mention the ID (asked alone; {} {:?})",
                Setting::Split,
                self.batch.as_ref().map_or("", |b| b.source.as_str())
            ))
            .class(ErrorClass::Missing)),
        }
    }

    /// Send the request the templates make of `fill` and read its answer: the status, the
    /// headers and the body of a 2xx answer, or why there is none.
    ///
    /// A page of a paginated ID (`page`) is the first request changed as its next request
    /// says; the URLs of the first request and of the one sent are kept in `page`.
    async fn exchange(
        &self,
        fill: Fill<'_>,
        mut page: Option<&mut target::PageTarget<'_>>,
    ) -> Result<(u16, HeaderMap, Vec<u8>), Failure> {
        let r = &self.request;
        let unusable = |message: String| Failure::permanent(message).class(ErrorClass::Request);
        let used = self.credentials.values().await?;
        let values: Vec<&str> = used.iter().map(|v| v.expose()).collect();
        let mut url = r
            .url
            .url(&fill.render(&r.url.template, &values))
            .map_err(|e| unusable(format!("the ID makes an invalid URL ({e})")))?;
        if let Some(page) = page.as_deref_mut() {
            url = page.url(url)?;
        }
        let mut request = self.client.request(r.method.clone(), url);
        for (name, value) in &r.headers {
            let mut value = HeaderValue::from_str(&fill.render(value, &values)).map_err(|_| {
                unusable(format!("the ID makes an invalid value for header {name}"))
            })?;
            if !used.is_empty() {
                value.set_sensitive(true);
            }
            request = request.header(name.clone(), value);
        }
        let body = r.body.as_ref().map(|body| fill.render(body, &values));
        let body = match page.as_deref() {
            Some(page) => page.body(body)?,
            None => body,
        };
        if let Some(body) = body {
            if r.json_body {
                request = request.header(CONTENT_TYPE, "application/json");
            }
            request = request.body(body);
        }
        let sent = tokio::time::Instant::now();
        let mut response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        let now = self.clock.now();
        let mut retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, now));
        let announced = read_announced(response.headers(), now);
        self.limits.observe(&announced);
        // Some APIs refuse a spent quota with 403 and their rate-limit headers, not 429:
        // that is the client's rate, not the ID, until the announced reset.
        let spent = announced
            .iter()
            .filter(|a| a.remaining == 0)
            .map(|a| a.reset)
            .max();
        let status_code = match (status.as_u16(), spent) {
            (403, Some(reset)) => {
                retry_after = retry_after.or(Some(reset).filter(|r| !r.is_zero()));
                429
            }
            (code, _) => code,
        };
        // What the learner of the windows nobody announces reads: a refusal of the rate
        // pointing at when it ends, or a call the API counted.
        match (status_code, retry_after) {
            (429, Some(after)) => self.limits.refused(sent, after),
            (429, None) => {}
            _ => self.limits.accepted(sent),
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
            if bytes.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(Failure::retry(format!(
                    "answer body is larger than {MAX_BODY_BYTES} bytes"
                ))
                .class(ErrorClass::Body)
                .status(status.as_u16()));
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            // Masked before it is cut, so that no part of a secret is left at the cut.
            let window = bytes.len().min(SNIPPET_BYTES + self.secrets.longest());
            let text = String::from_utf8_lossy(&bytes[..window]);
            let snippet = self
                .secrets
                .mask_prefix(&text, SNIPPET_BYTES)
                .trim()
                .to_string();
            // Read before the status: OpenAI says "out of credit" with a 429, Anthropic with
            // a 400, and neither is helped by waiting or is the ID's doing.
            let next = if super::credit::out_of_credit(status.as_u16(), &bytes) {
                Next::OutOfCredit
            } else {
                classify_status(status_code, retry_after)
            };
            let failure = Failure {
                next,
                class: ErrorClass::Http,
                status: Some(status.as_u16()),
                message: if snippet.is_empty() {
                    format!("HTTP {status}")
                } else {
                    format!("HTTP {status}: {snippet}")
                },
            };
            // A 403 that announces a spent quota is the rate's, not the credential's.
            if status_code == status.as_u16() && self.credentials.refuses(status_code) {
                return Err(self.credentials.refused(&used, failure).await);
            }
            self.credentials.accepted(&used);
            return Err(failure);
        }
        self.credentials.accepted(&used);
        Ok((
            status.as_u16(),
            std::mem::take(response.headers_mut()),
            bytes,
        ))
    }
}

/// What a request's templates are filled in with.
enum Fill<'a> {
    /// One ID and its row's kept columns.
    One(&'a str, Option<&'a RowValues>),
    /// A batch's IDs with their rows, and the separator of `{ids}`.
    Batch(&'a [(&'a str, Option<&'a RowValues>)], &'a str),
}

impl Fill<'_> {
    fn render(&self, template: &Template, credentials: &[&str]) -> String {
        match self {
            Fill::One(id, row) => template.render_row(id, *row, credentials),
            Fill::Batch(items, separator) => template.render_batch(items, separator, credentials),
        }
    }
}

/// A job's batch endpoint, compiled.
struct Batch {
    separator: String,
    splitter: Splitter,
    /// The split program as written, for messages.
    source: String,
}

/// Whether the environment names a proxy for reqwest's system proxy (the variables it reads
/// on Linux, as curl does); without one, `no_proxy()` changes nothing but its cost.
fn proxy_in_env() -> bool {
    [
        "ALL_PROXY",
        "all_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some())
}

/// What an answer outside 2xx means (see the module doc): 429, 503 and 529 are the API
/// pushing back (429 refuses the client's rate; nginx's `limit_req` answers 503 by default,
/// so do gateways and object stores: "503 Slow Down"; LLM APIs say 529 "overloaded"; 503s
/// that are not about load, a steady few percent or the same IDs refused every time, do not
/// move the rate, see [`crate::throttle`]), 408 a retry, another 5xx evidence that the API
/// may be out, anything else a refusal for good.
pub(crate) fn classify_status(status: u16, retry_after: Option<Duration>) -> Next {
    match status {
        429 => Next::TooMany { after: retry_after },
        503 | 529 => Next::Pushback { after: retry_after },
        408 => Next::Retry { after: retry_after },
        500..=599 => Next::Unreachable { after: retry_after },
        _ => Next::Permanent,
    }
}

/// Parse a `Retry-After` value (delay-seconds or HTTP-date) into a usable wait, or `None`
/// when it is zero, in the past, or unparseable.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
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

/// What a request that got no (whole) answer means: a timeout is pushback and outage
/// evidence, a refused or dropped connection is the API out of reach, a body that broke
/// mid-read is retried, a request reqwest cannot build is refused.
fn transport_error(e: reqwest::Error) -> Failure {
    let e = e.without_url();
    let message = error_chain(&e);
    if e.is_timeout() {
        Failure::timed_out(message)
    } else if e.is_connect() {
        Failure::unreachable(message).class(ErrorClass::Connect)
    } else if e.is_body() || e.is_decode() {
        Failure::retry(message).class(ErrorClass::Body)
    } else if e.is_builder() {
        Failure::permanent(message).class(ErrorClass::Request)
    } else {
        Failure::unreachable(message).class(ErrorClass::Connection)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests;
