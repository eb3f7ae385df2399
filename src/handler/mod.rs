//! Handler: the work done for one ID.
//!
//! The engine calls a [`Handler`] once per attempt, under the run's rate limit, adaptive
//! control, retries and outage detection, and stores what it returns exactly once. A handler
//! answers with an [`Output`] (the result to store) or a [`Failure`] that says what happens
//! next ([`crate::failure`]): all the engine's policies read only that, so they work the same
//! for every handler.
//!
//! Three kinds of handler:
//!
//! - any async closure or function of an ID, `Fn(String) -> impl Future<Output =
//!   Result<T, Failure>>` where `T: Into<Output>` (a library user's work, in a few lines);
//! - [`http::HttpHandler`]: one HTTP request per ID from the job's templates;
//! - [`exec::ExecHandler`]: one process per ID from the job's command.
//!
//! The HTTP and exec handlers read the job's [`Credentials`] (see [`crate::credential`]) for
//! each attempt; a library user's handler can hold a [`crate::credential::Credential`] and
//! read it the same way.
//!
//! ```
//! use highwater::handler::{Handler, Output};
//! use highwater::failure::Failure;
//!
//! let square = |id: String| async move {
//!     let n: u64 = id.parse().map_err(|_| Failure::permanent(format!("{id:?} is not a number")))?;
//!     Ok::<_, Failure>(serde_json::json!({ "square": n * n }))
//! };
//! # let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! # let output = runtime.block_on(square.call("12"));
//! # assert_eq!(output.unwrap().result.get(), r#"{"square":144}"#);
//! ```

use std::future::Future;
use std::time::Duration;

use serde_json::value::RawValue;

use crate::quota::pacer::AnnouncedLimits;
use crate::setting::Setting;

pub use crate::failure::{ErrorClass, Failure, Next};

pub mod batch;
mod credentials;
pub mod exec;
pub mod http;
mod template;

pub use credentials::{Credentials, REFUSED_EXIT_CODE};
pub use template::expand_env;

/// The work for one ID: one attempt, whose failure says what happens next.
///
/// Called concurrently from many tasks (`&self`), and again for the same ID when an attempt
/// is retried or a run is resumed after a crash: the work should be safe to repeat.
pub trait Handler: Send + Sync + 'static {
    /// One attempt for `id`.
    fn call(&self, id: &str) -> impl Future<Output = Result<Output, Failure>> + Send;

    /// One attempt for `id`, whose input row's kept columns are `row` (one JSON object; none
    /// when the job keeps no columns). By default the row is not used: [`Handler::call`].
    fn call_row(
        &self,
        id: &str,
        row: Option<&str>,
    ) -> impl Future<Output = Result<Output, Failure>> + Send {
        let _ = row;
        self.call(id)
    }

    /// One request for several IDs (each with its row's kept columns) to a batch endpoint:
    /// each ID's part of the answer ([`batch`]). By default the handler has none: the
    /// request fails for good.
    fn call_batch(
        &self,
        items: &[(&str, Option<&str>)],
    ) -> impl Future<Output = Result<batch::BatchAnswer, Failure>> + Send {
        let _ = items;
        std::future::ready(Err(Failure::permanent(
            "this handler has no batch endpoint",
        )))
    }

    /// The limits the API announced in its answers, if the handler reads them: every
    /// attempt of the run waits for them ([`AnnouncedLimits::wait`]). None by default.
    fn announced_limits(&self) -> Option<std::sync::Arc<AnnouncedLimits>> {
        None
    }
}

/// The input columns a job's request (URL, headers, body) or command names with `{column}`
/// slots, in order of first appearance: what its plan must keep of each row.
pub(crate) fn columns_used(
    request: &http::RequestSpec,
    exec: Option<&exec::ExecSpec>,
) -> Vec<String> {
    let mut out = Vec::new();
    match exec {
        Some(exec) => {
            for word in shlex::split(&exec.command).unwrap_or_default() {
                template::columns_in(&word, &mut out);
            }
        }
        None => {
            template::columns_in(&request.url, &mut out);
            for header in &request.headers {
                template::columns_in(header, &mut out);
            }
            if let Some(body) = &request.body {
                template::columns_in(body, &mut out);
            }
        }
    }
    out
}

/// Any `Fn(String) -> Future<Output = Result<T, Failure>>` is a handler: the closure gets
/// the ID (owned, so its future may keep it) and returns anything that becomes an
/// [`Output`] (a `serde_json::Value`, an `Output`).
impl<F, Fut, T> Handler for F
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, Failure>> + Send,
    T: Into<Output>,
{
    fn call(&self, id: &str) -> impl Future<Output = Result<Output, Failure>> + Send {
        let attempt = self(id.to_owned());
        async move { attempt.await.map(Into::into) }
    }
}

/// What an attempt that got an answer made: its HTTP status, for the counters.
pub trait Answered {
    fn status(&self) -> Option<u16>;
}

impl Answered for Output {
    fn status(&self) -> Option<u16> {
        self.status
    }
}

impl Answered for batch::BatchAnswer {
    fn status(&self) -> Option<u16> {
        self.status
    }
}

/// A successful attempt: the result to store.
#[derive(Debug, Clone)]
pub struct Output {
    /// The result as one JSON document.
    pub result: Box<RawValue>,
    /// The HTTP status of the answer, when there was one.
    pub status: Option<u16>,
}

impl Output {
    /// A result from any value that serializes.
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Output, Failure> {
        serde_json::value::to_raw_value(value)
            .map(Output::from)
            .map_err(|e| {
                Failure::permanent(format!("the result does not serialize: {e}"))
                    .class(ErrorClass::Body)
            })
    }

    /// A result from text that must be one JSON document.
    pub fn json_text(text: &str) -> Result<Output, Failure> {
        RawValue::from_string(text.trim().to_owned())
            .map(Output::from)
            .map_err(|e| {
                Failure::permanent(format!("the result is not JSON: {e}")).class(ErrorClass::Body)
            })
    }

    /// Text or bytes stored as JSON when they are one JSON document, else as a JSON string
    /// (invalid UTF-8 replaced).
    pub fn text_or_json(bytes: Vec<u8>) -> Output {
        Output::from(crate::answer::body_as_json(bytes))
    }
}

impl From<Box<RawValue>> for Output {
    fn from(result: Box<RawValue>) -> Output {
        Output {
            result,
            status: None,
        }
    }
}

impl From<serde_json::Value> for Output {
    fn from(value: serde_json::Value) -> Output {
        Output::from(serde_json::value::to_raw_value(&value).expect("a Value always serializes"))
    }
}

/// Errors found while building a handler from a job's spec, before any attempt. `what`
/// names the setting.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("{what}: environment variable {name} is not set")]
    MissingVar { what: Setting, name: String },
    #[error("{what}: {reason}")]
    Invalid { what: Setting, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// How long an attempt took, in whole milliseconds, for records.
pub fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run<H: Handler>(h: &H, id: &str) -> Result<Output, Failure> {
        h.call(id).await
    }

    #[tokio::test]
    async fn a_closure_is_a_handler() {
        let h = |id: String| async move {
            if id == "bad" {
                return Err(Failure::permanent("no such thing"));
            }
            Ok(serde_json::json!({ "id": id }))
        };
        let out = run(&h, "a\"b").await.unwrap();
        assert_eq!(out.result.get(), r#"{"id":"a\"b"}"#);
        assert_eq!(out.status, None);
        let err = run(&h, "bad").await.unwrap_err();
        assert_eq!(
            (err.next, err.class),
            (Next::Permanent, ErrorClass::Handler)
        );
    }

    #[test]
    fn outputs_from_text() {
        assert_eq!(
            Output::json_text(" [1, 2] ").unwrap().result.get(),
            "[1, 2]"
        );
        assert!(Output::json_text("{").is_err());
        assert_eq!(
            Output::text_or_json(b"hi\n".to_vec()).result.get(),
            "\"hi\\n\""
        );
        assert_eq!(Output::json(&vec![1]).unwrap().result.get(), "[1]");
    }
}
