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

use std::sync::Arc;

use anyhow::Result;

use super::args::RunArgs;
use super::exit::{self, library_job, open_files, refused};
use super::rerun::flags;
use super::run_dashboard::Served;
use super::running::{run_job, Serving};
use super::state::{over_place, Named, OverPlace, Tuning};
use crate::job::{open_at, JobError, JobPlace, JobRequest};
use crate::say;
use crate::store::{JobView, Leases, Store};

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
    let dashboard = match super::run_dashboard::bind(args.dashboard).await {
        Ok(listener) => listener,
        Err(code) => return Ok(code),
    };
    let tuning = Tuning {
        cache_bytes: Some(args.store_cache_mb << 20),
        reopen_after: Some(args.store_reopen_after),
        lease_ttl: Some(args.lease_ttl),
    };
    let (state, job) = (args.state.clone(), args.job.clone());
    let run = Run {
        args,
        request,
        metrics,
        dashboard,
    };
    over_place(&state, job.as_deref(), tuning, run).await
}

/// `run` of the job at a place.
struct Run {
    args: RunArgs,
    request: JobRequest,
    metrics: Option<tokio::net::TcpListener>,
    /// The listener of the job's dashboard, served by the run.
    dashboard: Option<tokio::net::TcpListener>,
}

impl OverPlace for Run {
    async fn over<P: JobPlace + Clone + 'static>(self, place: P) -> Result<u8> {
        let named = Named::of(&place);
        let (store, spec) = match open(&place, &self.request).await? {
            Ok(opened) => opened,
            Err(code) => return Ok(code),
        };
        let dashboard = self
            .dashboard
            .map(|listener| Served::start(listener, &place, &store));
        let serving = Serving {
            metrics: self.metrics,
            dashboard: dashboard.as_ref().map(|d| d.addr),
        };
        let code = run_opened(&self.args, store.clone(), spec, &named, serving).await;
        if let Some(d) = dashboard {
            d.stop().await;
        }
        place.close(store).await;
        code
    }
}

/// Open the job at `place` as `request` asks ([`open_at`]), or the exit code of its refusal,
/// said (a place that holds no job of this name is the user's to fix).
async fn open<P: JobPlace>(
    place: &P,
    request: &JobRequest,
) -> Result<Result<(Arc<P::Store>, crate::job::JobSpec), u8>> {
    match open_at(place, request).await {
        Ok(opened) => Ok(Ok(opened)),
        Err(JobError::NoJob) => {
            say!(
                "error: {}: give --input FILE and --url TEMPLATE (or --exec COMMAND) to create one",
                place.names().absent
            );
            Ok(Err(exit::USAGE))
        }
        Err(JobError::Store(e)) if place.no_such_job(&e) => {
            say!(
                "error: {}: create it with --input FILE --url TEMPLATE",
                place.names().absent
            );
            Ok(Err(exit::USAGE))
        }
        Err(JobError::Store(e)) => Err(e.into()),
        Err(e) => refused(e).map(Err),
    }
}

/// Run a job `open` opened, unless it is a library program's or already finished.
async fn run_opened<S: Store + Leases>(
    args: &RunArgs,
    store: Arc<S>,
    spec: crate::job::JobSpec,
    named: &Named<'_>,
    serving: Serving,
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
        (spec, Some(done)),
        handler,
        &args.options(),
        named.live,
        serving,
        &resume,
    )
    .await
}
