//! [`open_at`]: the one way to create or resume a job wherever it is kept.
//!
//! The place opens its store, creating it when the request brings an input, and says
//! whether this open made it. The job is then created with its checks (once, in
//! [`crate::job::open_job`]'s path), resumed, or (where the place is shared) joined by one
//! more worker; a creation refused by any check is undone by the place
//! ([`JobPlace::discard`]), so a refused creation leaves the directory, or the database, as
//! it was. The command line only says the result in its own words, with flags and exit
//! codes; the library maps it to its own errors.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use super::job_place::JobPlace;
use crate::job::checks::check_request;
use crate::job::error::JobError;
use crate::job::open::{join_job, open_checked};
use crate::job::request::JobRequest;
use crate::spec::JobSpec;

/// Create the job `request` describes at `place`, or resume (or join) the one it holds.
///
/// A new job is checked once, before it is stored (its flags, templates, answer checks,
/// input and environment); whatever refuses it, the place is left as it was. A resume is
/// judged against the stored job ([`crate::job::open_job`]). With no input, a place that
/// holds no job is [`JobError::NoJob`], and a store that is not there is the store's error.
pub async fn open_at<P: JobPlace>(
    place: &P,
    request: &JobRequest,
) -> Result<(Arc<P::Store>, JobSpec), JobError> {
    check_request(request)?;
    open_made(place, request.input.is_some(), true, |_| {
        Ok::<_, JobError>(Cow::Borrowed(request))
    })
    .await
}

/// [`open_at`], with the request made once the store is open (`create`: whether it may be
/// created), from the place's directory if it has one: the library writes the IDs it is
/// given there. A request that cannot be made is undone like a refused job. Without
/// `environment`, a new job's handler is not built from the process environment first (the
/// demo gives its handler the address of an API only it knows).
pub(crate) async fn open_made<'r, P, E>(
    place: &P,
    create: bool,
    environment: bool,
    request: impl FnOnce(Option<&Path>) -> Result<Cow<'r, JobRequest>, E>,
) -> Result<(Arc<P::Store>, JobSpec), E>
where
    P: JobPlace,
    E: From<JobError>,
{
    let (store, made) = place.open(create).await.map_err(JobError::from)?;
    let opened = match request(place.dir()) {
        Ok(request) => open_job_at(place, &store, made.is_none(), environment, &request)
            .await
            .map_err(E::from),
        Err(e) => Err(e),
    };
    match (opened, made) {
        (Ok(spec), _) => Ok((store, spec)),
        (Err(e), None) => {
            place.close(store).await;
            Err(e)
        }
        (Err(e), Some(made)) => {
            if let Err(undo) = place.discard(store, made).await {
                tracing::warn!("cannot remove what the refused creation made: {undo}");
            }
            Err(e)
        }
    }
}

/// Create, resume or join the job in `store`, opened at `place` (`found`: not made by
/// this open).
async fn open_job_at<P: JobPlace>(
    place: &P,
    store: &P::Store,
    found: bool,
    environment: bool,
    request: &JobRequest,
) -> Result<JobSpec, JobError> {
    if found && request.input.is_none() && place.joinable() {
        join_job(store, request)
            .await
            .and_then(|spec| spec.ok_or(JobError::NoJob))
    } else {
        open_checked(store, request, environment).await
    }
}
