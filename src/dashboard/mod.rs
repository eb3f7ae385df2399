//! Dashboard: a job seen in a browser, live while it runs and as a report after.
//!
//! Owns `serve` and `report`: a read-only web page (progress and a smoothed ETA,
//! throughput against the rate limit, latency percentiles, answers and failures by class
//! over the whole job with restarts marked, the bucket map, the failures table, the
//! workers, the spec and its history) over a job wherever it is kept (any
//! [`crate::job::JobPlace`]). One reading of it is `source` (and why a state directory held
//! by a running job shows less); what each endpoint answers is `data`; the page is `page`; the HTTP server is
//! `server`. A report is the same page as one file with the data embedded.
//!
//! Nothing here writes to the job: the page has no actions, the server answers GET only,
//! and the spec shown is the stored one, whose secrets are only `${VAR}` references.

mod data;
mod page;
mod server;
mod source;

pub use server::{bind, serve, BindError};
pub use source::DashboardError;
pub(crate) use source::{read, FailureQuery, Wants};

/// Failed items a report lists at most (its filters work on those).
pub(crate) const REPORT_FAILURES: usize = 1000;

/// The whole page of the job at `place` with its data embedded: one self-contained HTML file.
pub async fn report<P: crate::job::JobPlace>(place: &P) -> Result<String, DashboardError> {
    let wants = Wants {
        buckets: true,
        failures: Some(FailureQuery {
            limit: REPORT_FAILURES,
            ..FailureQuery::default()
        }),
    };
    let r = read(place, &wants).await?;
    let data = serde_json::json!({
        "summary": data::summary(&r),
        "history": data::history(&r, data::DEFAULT_POINTS),
        "buckets": data::buckets(&r, data::DEFAULT_CELLS),
        "failures": data::failures(&r),
        "workers": data::workers(&r),
    });
    Ok(page::report(&data))
}
