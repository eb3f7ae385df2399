//! Batch endpoints: one request for up to `size` IDs of a bucket, its answer split into each
//! ID's result.
//!
//! Many APIs take a list of IDs per call (`GET /users?ids=1,2,3`, a JSON array in a POST
//! body) and count one call against their limits. A batch job's templates write the IDs with
//! `{ids}` (and `{rows}`, see the templates' module); its answer is split by a jq program
//! (`split`) into `{key, value}` objects, matched to the IDs by key, never by position. What a
//! batch's answer means for each ID, and what the engine does then, is
//! [`crate::engine`]'s: an ID the answer does not mention is asked again alone; a batch
//! refused with a 4xx that would fail one ID is split in halves until the culprit stands
//! alone; the answer checks judge each ID's value.

use serde::{Deserialize, Serialize};

use super::error::HandlerError;
use super::output::Output;
use crate::answer::Splitter;
use crate::failure::Failure;
use crate::setting::Setting;

/// Each ID's part of a batch's answer: its result, or why its attempt failed. IDs the answer
/// does not mention are not in it.
pub type BatchParts = Vec<(String, Result<Output, Failure>)>;

/// A batch request's answer: its status and each ID's part.
#[derive(Debug)]
pub struct BatchAnswer {
    /// The batch answer's HTTP status, if it got one.
    pub status: Option<u16>,
    /// Each ID's part.
    pub parts: BatchParts,
}

/// Whether a batch request's failure may be one of its IDs' doing, so that the batch is worth
/// asking again in halves: refused for good with a 4xx that is not about the credential or
/// the rate (401, 407, 429).
pub(crate) fn may_be_one_ids(error: &Failure) -> bool {
    error.next == crate::failure::Next::Permanent
        && error.class == crate::failure::ErrorClass::Http
        && matches!(error.status, Some(400..=499))
        && !matches!(error.status, Some(401 | 407 | 429))
}

/// Compile a batch's split program; a malformed one names `--split`'s setting.
pub(crate) fn splitter(source: &str) -> Result<Splitter, HandlerError> {
    Splitter::compile(source).map_err(|e| HandlerError::Invalid {
        what: Setting::Split,
        reason: format!("{:?} is not a valid jq program: {}", e.program, e.reason),
    })
}

/// The separator of `{ids}` in a URL or header unless the job says otherwise.
pub const DEFAULT_SEPARATOR: &str = ",";

/// A job's batch endpoint, as stored in its spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSpec {
    /// IDs per request at most (at least 2).
    pub size: usize,
    /// Between two IDs of `{ids}` in the URL or a header (not encoded).
    pub separator: String,
    /// The jq program splitting an answer into `{key, value}` objects.
    pub split: String,
}
