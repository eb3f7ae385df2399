//! The [`Handler`] trait: the work for one ID, one attempt at a time, whose failure says
//! what happens next; any async closure or function of an ID is a handler.

use std::future::Future;

use super::batch;
use super::output::Output;
use super::page::{Page, PageAt};
use crate::failure::Failure;
use crate::quota::pacer::AnnouncedLimits;

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

    /// One request for a page of `id`'s answer (with its row's kept columns `row`): the
    /// items kept of it and the request for the next page ([`super::paginate`]). By default
    /// the handler does not follow pages: the request fails for good.
    fn call_page(
        &self,
        id: &str,
        row: Option<&str>,
        at: &PageAt,
    ) -> impl Future<Output = Result<Page, Failure>> + Send {
        let _ = (id, row, at);
        std::future::ready(Err(Failure::permanent(
            "this handler does not follow pages",
        )))
    }

    /// The limits the API announced in its answers, if the handler reads them: every
    /// attempt of the run waits for them (`AnnouncedLimits::wait`). None by default.
    fn announced_limits(&self) -> Option<std::sync::Arc<AnnouncedLimits>> {
        None
    }

    /// What an attempt for `id` (with its row's kept columns `row`) is expected to cost,
    /// asked before it starts while a limit the API announced counts tokens
    /// (a call then takes what it is expected to cost of such a limit). None (unknown) by
    /// default.
    fn estimate(&self, id: &str, row: Option<&str>) -> Option<crate::meter::Usage> {
        let _ = (id, row);
        None
    }

    /// What an attempt for `id` may cost at the most, asked before it starts while the job
    /// has a budget in money (a call then holds its most of the budget until its answer
    /// says what it cost, so that calls in flight never overspend it). None (unknown) by
    /// default: the call then holds what it is expected to cost ([`Handler::estimate`]),
    /// and a budget may be overspent by what calls in flight cost beyond it.
    fn most(&self, id: &str, row: Option<&str>) -> Option<crate::meter::Usage> {
        let _ = (id, row);
        None
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{ErrorClass, Next};

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
}
