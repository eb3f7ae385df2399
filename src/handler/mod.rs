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

pub use crate::failure::{ErrorClass, Failure, Next};

mod answered;
pub mod batch;
mod columns;
mod credentials;
mod credit;
mod error;
pub mod exec;
pub mod http;
mod link;
mod output;
mod page;
pub mod paginate;
mod template;
mod work;

pub use answered::Answered;
pub(crate) use columns::columns_used;
pub use credentials::Credentials;
pub use error::HandlerError;
pub(crate) use output::millis;
pub use output::Output;
pub use page::{Page, PageAt};
pub use template::expand_env;
pub use work::Handler;
