//! [`Work`]: what a job does for each ID, one variant per kind of work, and the flat fields
//! a spec stores it in.

use std::time::Duration;

use crate::handler::batch::BatchSpec;
use crate::handler::exec::ExecSpec;
use crate::handler::http::RequestSpec;
use crate::handler::paginate::PaginateSpec;
use crate::setting::Setting;

use super::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT};

/// What a job does for each ID: call a URL (one ID per request, several through a batch
/// endpoint, or page after page of one ID's answer), run a command, or run a library
/// program's own handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// An HTTP request for each ID.
    Request(RequestSpec),
    /// HTTP requests to a batch endpoint, several IDs in each.
    Batch {
        /// The request made for each batch.
        request: RequestSpec,
        /// How IDs are grouped into one request and its answer split back.
        batch: BatchSpec,
    },
    /// HTTP requests for each ID, one per page of its answer.
    Paged {
        /// The request for each ID's first page (the next pages' change it).
        request: RequestSpec,
        /// How the pages are followed and what is kept of each.
        paginate: PaginateSpec,
    },
    /// A command run for each ID.
    Exec {
        /// The command.
        exec: ExecSpec,
        /// How long one process may run.
        timeout: Duration,
        /// The connect timeout of the credentials' token requests.
        connect_timeout: Duration,
    },
    /// A library program's own handler (a job built with [`Job`](crate::job::Job)), by the
    /// name the program gave it: nothing of its work is stored.
    Library {
        /// The handler's name.
        name: String,
    },
}

/// Two kinds of work asked of one job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkConflict {
    /// A batch endpoint and a command: a command is run once per ID.
    #[error("{} goes with a URL: a command is run once per ID", Setting::BatchSize)]
    BatchWithCommand,
    /// Pages of a batch endpoint's answer: a batch answer is split by ID, not paged.
    #[error(
        "{} and {} do not go together: a batch answer is split by ID, not paged",
        Setting::Paginate,
        Setting::BatchSize
    )]
    PaginateWithBatch,
    /// Pages and a command: a command's output is one answer.
    #[error(
        "{} goes with a URL: a command's output is one answer",
        Setting::Paginate
    )]
    PaginateWithCommand,
}

/// A job's work as a spec stores it: a request always, and beside it a command, a library
/// handler's name, a batch endpoint or how pages are followed. Specs are stored (and read by older versions) in this
/// layout; [`Work`] is what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkFields {
    /// The request (of an exec job, only its timeouts count; of a library job, nothing).
    pub(crate) request: RequestSpec,
    /// The command run for each ID instead of a request.
    pub(crate) exec: Option<ExecSpec>,
    /// A library handler's name, which does the work instead of a request or command.
    pub(crate) handler: Option<String>,
    /// The batch endpoint the request calls.
    pub(crate) batch: Option<BatchSpec>,
    /// How the pages of each ID's answer are followed.
    pub(crate) paginate: Option<PaginateSpec>,
}

/// The request of a job that makes none: a GET of an empty URL template with the default
/// timeouts (what specs have always stored for it).
pub(crate) fn no_request(connect_timeout: Duration, timeout: Duration) -> RequestSpec {
    RequestSpec {
        method: "GET".into(),
        url: String::new(),
        headers: Vec::new(),
        body: None,
        connect_timeout,
        timeout,
    }
}

impl Work {
    /// The request this work makes for each ID (or batch), if it makes one.
    pub fn request(&self) -> Option<&RequestSpec> {
        match self {
            Work::Request(request) | Work::Batch { request, .. } | Work::Paged { request, .. } => {
                Some(request)
            }
            Work::Exec { .. } | Work::Library { .. } => None,
        }
    }

    /// The command run for each ID, if this work runs one.
    pub fn exec(&self) -> Option<&ExecSpec> {
        match self {
            Work::Exec { exec, .. } => Some(exec),
            _ => None,
        }
    }

    /// The batch endpoint the request calls, if it calls one.
    pub fn batch(&self) -> Option<&BatchSpec> {
        match self {
            Work::Batch { batch, .. } => Some(batch),
            _ => None,
        }
    }

    /// How the pages of each ID's answer are followed, if the work pages.
    pub fn paginate(&self) -> Option<&PaginateSpec> {
        match self {
            Work::Paged { paginate, .. } => Some(paginate),
            _ => None,
        }
    }

    /// The library handler's name, if a library program's own handler does the work.
    pub fn library(&self) -> Option<&str> {
        match self {
            Work::Library { name } => Some(name),
            _ => None,
        }
    }

    /// IDs handed to one call of the handler: a batch's size, else 1.
    pub fn ids_per_call(&self) -> usize {
        self.batch().map_or(1, |b| b.size.max(1))
    }

    /// What the work does for each ID, for logs: its URL or its command, as written (empty
    /// for a library handler).
    pub fn describe(&self) -> &str {
        match self {
            Work::Request(request) | Work::Batch { request, .. } | Work::Paged { request, .. } => {
                &request.url
            }
            Work::Exec { exec, .. } => &exec.command,
            Work::Library { .. } => "",
        }
    }

    /// The work in the layout a spec stores.
    pub(crate) fn to_fields(&self) -> WorkFields {
        let none = |request| WorkFields {
            request,
            exec: None,
            handler: None,
            batch: None,
            paginate: None,
        };
        match self {
            Work::Request(request) => none(request.clone()),
            Work::Batch { request, batch } => WorkFields {
                batch: Some(batch.clone()),
                ..none(request.clone())
            },
            Work::Paged { request, paginate } => WorkFields {
                paginate: Some(paginate.clone()),
                ..none(request.clone())
            },
            Work::Exec {
                exec,
                timeout,
                connect_timeout,
            } => WorkFields {
                exec: Some(exec.clone()),
                ..none(no_request(*connect_timeout, *timeout))
            },
            Work::Library { name } => WorkFields {
                handler: Some(name.clone()),
                ..none(no_request(DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT))
            },
        }
    }

    /// The work the stored layout describes: a library handler's name first (its job
    /// stores nothing else that counts), then a command, then a batch endpoint, then pages,
    /// then a request. A command with a batch endpoint or pages, and pages of a batch
    /// endpoint, are refused.
    pub(crate) fn from_fields(fields: WorkFields) -> Result<Work, WorkConflict> {
        let WorkFields {
            request,
            exec,
            handler,
            batch,
            paginate,
        } = fields;
        Ok(match (handler, exec, batch, paginate) {
            (Some(name), _, _, _) => Work::Library { name },
            (None, Some(_), Some(_), _) => return Err(WorkConflict::BatchWithCommand),
            (None, Some(_), None, Some(_)) => return Err(WorkConflict::PaginateWithCommand),
            (None, Some(exec), None, None) => Work::Exec {
                exec,
                timeout: request.timeout,
                connect_timeout: request.connect_timeout,
            },
            (None, None, Some(_), Some(_)) => return Err(WorkConflict::PaginateWithBatch),
            (None, None, Some(batch), None) => Work::Batch { request, batch },
            (None, None, None, Some(paginate)) => Work::Paged { request, paginate },
            (None, None, None, None) => Work::Request(request),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paginate() -> PaginateSpec {
        PaginateSpec {
            style: crate::handler::paginate::PageStyle::Link,
            items: ".[]".into(),
            max_pages: 10,
        }
    }

    fn request(url: &str) -> RequestSpec {
        RequestSpec {
            url: url.into(),
            ..no_request(DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT)
        }
    }

    #[test]
    fn every_kind_of_work_reads_back_from_the_stored_layout() {
        let batch = BatchSpec {
            size: 10,
            separator: ",".into(),
            split: ".[]".into(),
        };
        let exec = ExecSpec {
            command: "echo {id}".into(),
            retry_exit_codes: vec![75],
        };
        for work in [
            Work::Request(request("http://x/{id}")),
            Work::Batch {
                request: request("http://x/?ids={ids}"),
                batch,
            },
            Work::Exec {
                exec,
                timeout: Duration::from_secs(3),
                connect_timeout: Duration::from_secs(2),
            },
            Work::Library {
                name: "double".into(),
            },
            Work::Paged {
                request: request("http://x/{id}"),
                paginate: paginate(),
            },
        ] {
            assert_eq!(Work::from_fields(work.to_fields()), Ok(work.clone()));
        }
    }

    #[test]
    fn a_command_with_a_batch_endpoint_is_refused_and_a_handler_name_wins() {
        let fields = |exec: bool, handler: bool| WorkFields {
            request: request("http://x/{id}"),
            exec: exec.then(|| ExecSpec {
                command: "true".into(),
                retry_exit_codes: vec![75],
            }),
            handler: handler.then(|| "mine".to_string()),
            batch: Some(BatchSpec {
                size: 2,
                separator: ",".into(),
                split: ".[]".into(),
            }),
            paginate: None,
        };
        assert_eq!(
            Work::from_fields(fields(true, false)),
            Err(WorkConflict::BatchWithCommand)
        );
        assert_eq!(
            Work::from_fields(fields(true, true)),
            Ok(Work::Library {
                name: "mine".into()
            })
        );
    }

    #[test]
    fn pages_go_with_a_request_alone() {
        let paged = |exec: bool, batch: bool| WorkFields {
            request: request("http://x/{id}"),
            exec: exec.then(|| ExecSpec {
                command: "true".into(),
                retry_exit_codes: vec![75],
            }),
            handler: None,
            batch: batch.then(|| BatchSpec {
                size: 2,
                separator: ",".into(),
                split: ".[]".into(),
            }),
            paginate: Some(paginate()),
        };
        assert_eq!(
            Work::from_fields(paged(true, false)),
            Err(WorkConflict::PaginateWithCommand)
        );
        assert_eq!(
            Work::from_fields(paged(false, true)),
            Err(WorkConflict::PaginateWithBatch)
        );
        assert_eq!(
            Work::from_fields(paged(true, true)),
            Err(WorkConflict::BatchWithCommand)
        );
        let work = Work::from_fields(paged(false, false)).unwrap();
        assert_eq!(work.paginate(), Some(&paginate()));
        assert_eq!(work.describe(), "http://x/{id}");
        assert_eq!(work.ids_per_call(), 1);
    }
}
