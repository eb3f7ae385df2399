//! `highwater run`: create a job or resume it, in a state directory or in a PostgreSQL
//! database, through the library's one way to open a job ([`open_at`]), then run it with
//! the command line's reporters.
//!
//! On a database, the first `run` with `--input` creates the job; any later `run --state
//! URL --job NAME` (on any machine, no input needed) joins it as one more worker: it
//! registers a session, leases buckets as it goes, and exits by itself (0 or 3) once the
//! input is planned and every bucket committed. A stop (SIGINT/SIGTERM) finishes or abandons
//! the items in flight within `--shutdown-timeout`, then ends the session, which releases
//! every lease at once.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::args::RunArgs;
use super::exit::{self, library_job, open_files, refused};
use super::rerun::flags;
use super::running::run_job;
use super::state::{state_arg, StateArg};
use crate::console::shell_path;
use crate::job::{open_at, JobError, JobPlace, JobRequest, StateDirPlace};
use crate::say;
use crate::store::{JobView, Leases, Store, StoreError};

pub(crate) async fn run(args: RunArgs) -> Result<u8> {
    let request = match args.request() {
        Ok(r) => r,
        Err(message) => {
            say!("error: {message}");
            return Ok(exit::USAGE);
        }
    };
    if let Some(code) = open_files(&args) {
        return Ok(code);
    }
    // Listen first: a bad --metrics-addr stops the run before anything is created.
    let metrics = match args.metrics_addr {
        Some(addr) => Some(
            crate::metrics::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("--metrics-addr {e}"))?,
        ),
        None => None,
    };
    match state_arg(&args.state, args.job.as_deref()) {
        Ok(StateArg::Dir) => {
            let place = StateDirPlace {
                dir: args.state.clone(),
                cache_bytes: args.store_cache_mb << 20,
                reopen_after: args.store_reopen_after,
            };
            let named = Named {
                job: format!("the job in {}", args.state.display()),
                no_job: format!("{} holds no job", args.state.display()),
                state: format!("--state {}", shell_path(&args.state)),
                live: Some(&args.state),
            };
            let (store, spec) = match open(&place, &request, &named, |_| None).await? {
                Ok(opened) => opened,
                Err(code) => return Ok(code),
            };
            let store = Arc::new(store);
            run_opened(&args, store, spec, &named, metrics).await
        }
        #[cfg(feature = "postgres")]
        Ok(StateArg::Pg { url, job }) => {
            use super::state::pg;
            let place = match pg::place(&url, &job, args.lease_ttl) {
                Ok(place) => place,
                Err(code) => return Ok(code),
            };
            let named = Named {
                job: format!("the {}", pg::shown(&url, &job)),
                no_job: format!("there is no {}", pg::shown(&url, &job)),
                state: pg::state_flags(&url, &job),
                live: None,
            };
            let missing = |e: &StoreError| {
                matches!(e.root(), StoreError::NotAStore { .. }).then(|| {
                    format!(
                        "there is no {}: create it with --input FILE --url TEMPLATE",
                        pg::shown(&url, &job)
                    )
                })
            };
            let (store, spec) = match open(&place, &request, &named, missing).await? {
                Ok(opened) => opened,
                Err(code) => return Ok(code),
            };
            let store = Arc::new(store);
            let code = run_opened(&args, store.clone(), spec, &named, metrics).await;
            pg::close(store).await;
            code
        }
        Err(code) => Ok(code),
    }
}

/// How the messages name the job a run opened.
struct Named<'a> {
    /// The job, in a sentence: `the job in DIR`.
    job: String,
    /// The place, when it holds no job: `DIR holds no job`.
    no_job: String,
    /// `--state ...` (with `--job ...` for a database) as a command that resumes it takes them.
    state: String,
    /// The state directory `live.json` goes to, if any.
    live: Option<&'a Path>,
}

/// Open the job at `place` as `request` asks ([`open_at`]), or the exit code of its refusal,
/// said (`missing`: the words for a store that is not there, if that is the user's to fix).
async fn open<P: JobPlace>(
    place: &P,
    request: &JobRequest,
    named: &Named<'_>,
    missing: impl Fn(&StoreError) -> Option<String>,
) -> Result<Result<(P::Store, crate::job::JobSpec), u8>> {
    match open_at(place, request).await {
        Ok(opened) => Ok(Ok(opened)),
        Err(JobError::NoJob) => {
            say!(
                "error: {}: give --input FILE and --url TEMPLATE (or --exec COMMAND) to create one",
                named.no_job
            );
            Ok(Err(exit::USAGE))
        }
        Err(JobError::Store(e)) => match missing(&e) {
            Some(words) => {
                say!("error: {words}");
                Ok(Err(exit::USAGE))
            }
            None => Err(e.into()),
        },
        Err(e) => refused(e).map(Err),
    }
}

/// Run a job `open` opened, unless it is a library program's or already finished.
async fn run_opened<S: Store + Leases>(
    args: &RunArgs,
    store: Arc<S>,
    spec: crate::job::JobSpec,
    named: &Named<'_>,
    metrics: Option<tokio::net::TcpListener>,
) -> Result<u8> {
    if let Some(code) = library_job(&spec, &named.job) {
        return Ok(code);
    }
    if let Some(open) = crate::rerun::unfinished(&*store).await? {
        say!(
            "note: rerun {} ({}) is not finished; resume it with: highwater rerun {} {}",
            open.number,
            flags(&open.selection),
            named.state,
            flags(&open.selection)
        );
    }
    let done = store.stats().await?;
    if done.finished() {
        say!(
            "{} is already finished: {} ok, {} failed",
            named.job,
            done.ok,
            done.failed
        );
        return Ok(if done.failed > 0 {
            exit::FAILURES
        } else {
            exit::OK
        });
    }
    let handler = crate::job::job_handler(&spec)?;
    let resume = format!("highwater run {}", named.state);
    run_job(
        store,
        spec,
        handler,
        &args.options(),
        named.live,
        metrics,
        &resume,
    )
    .await
}
