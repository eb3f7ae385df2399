//! [`JobHandler`]: the handler a job's spec describes (its request, batch endpoint or
//! command, with its answer checks and credentials), built with `${VAR}` expanded from the
//! process environment: the work of a job that is not a library program's own handler.

use super::error::JobError;
use crate::spec::{JobSpec, Work};

/// The handler a job's spec describes: its request or its command, with its answer checks
/// and credentials, `${VAR}` expanded from the process environment.
pub fn job_handler(spec: &JobSpec) -> Result<JobHandler, JobError> {
    let answer = crate::answer::Answer::compile(&spec.answer)?;
    let env = |name: &str| std::env::var(name).ok();
    let (connect_timeout, timeout) = match &spec.work {
        Work::Request(request) | Work::Batch { request, .. } | Work::Paged { request, .. } => {
            (request.connect_timeout, request.timeout)
        }
        Work::Exec {
            timeout,
            connect_timeout,
            ..
        } => (*connect_timeout, *timeout),
        Work::Library { name } => return Err(JobError::LibraryHandler(name.clone())),
    };
    let credentials =
        crate::handler::Credentials::build(&spec.credentials, connect_timeout, timeout, &env)?;
    let (request, batch, paginate) = match &spec.work {
        Work::Exec { exec, .. } => {
            return Ok(JobHandler::Exec(
                crate::handler::exec::ExecHandler::with_credentials(
                    exec,
                    timeout,
                    credentials,
                    &env,
                )?
                .with_answer(answer),
            ))
        }
        Work::Request(request) => (request, None, None),
        Work::Batch { request, batch } => (request, Some(batch), None),
        Work::Paged { request, paginate } => (request, None, Some(paginate)),
        Work::Library { name } => return Err(JobError::LibraryHandler(name.clone())),
    };
    let http = crate::handler::http::HttpHandler::with_credentials(request, credentials, &env)?
        .with_answer(answer);
    Ok(JobHandler::Http(match (batch, paginate) {
        (Some(batch), _) => http.with_batch(batch)?,
        (None, Some(paginate)) => http.with_pagination(paginate)?,
        (None, None) => http,
    }))
}

/// The handler of a job made from its spec: HTTP or exec.
#[derive(Debug)]
pub enum JobHandler {
    /// The job calls a URL for each ID.
    Http(crate::handler::http::HttpHandler),
    /// The job runs a command for each ID.
    Exec(crate::handler::exec::ExecHandler),
}

impl crate::handler::Handler for JobHandler {
    async fn call(&self, id: &str) -> Result<crate::handler::Output, crate::failure::Failure> {
        self.call_row(id, None).await
    }

    async fn call_row(
        &self,
        id: &str,
        row: Option<&str>,
    ) -> Result<crate::handler::Output, crate::failure::Failure> {
        match self {
            JobHandler::Http(h) => h.attempt_row(id, row).await,
            JobHandler::Exec(h) => h.attempt_row(id, row).await,
        }
    }

    async fn call_batch(
        &self,
        items: &[(&str, Option<&str>)],
    ) -> Result<crate::handler::batch::BatchAnswer, crate::failure::Failure> {
        match self {
            JobHandler::Http(h) => h.attempt_batch(items).await,
            JobHandler::Exec(_) => Err(crate::failure::Failure::permanent(
                "a command has no batch endpoint",
            )),
        }
    }

    async fn call_page(
        &self,
        id: &str,
        row: Option<&str>,
        at: &crate::handler::PageAt,
    ) -> Result<crate::handler::Page, crate::failure::Failure> {
        match self {
            JobHandler::Http(h) => h.attempt_page(id, row, at).await,
            JobHandler::Exec(_) => Err(crate::failure::Failure::permanent(
                "a command does not follow pages",
            )),
        }
    }

    fn announced_limits(&self) -> Option<std::sync::Arc<crate::quota::pacer::AnnouncedLimits>> {
        match self {
            JobHandler::Http(h) => h.announced_limits(),
            JobHandler::Exec(_) => None,
        }
    }

    fn estimate(&self, id: &str, row: Option<&str>) -> Option<crate::meter::Usage> {
        match self {
            JobHandler::Http(h) => h.estimate(id, row),
            JobHandler::Exec(_) => None,
        }
    }

    fn most(&self, id: &str, row: Option<&str>) -> Option<crate::meter::Usage> {
        match self {
            JobHandler::Http(h) => h.most(id, row),
            JobHandler::Exec(_) => None,
        }
    }
}
