//! Running a job the command line opened, through the library's [`Job`] with the command
//! line's reporters, and saying how it ended: its summary, the command that resumes it, and
//! the exit code. `run`, `rerun` and `demo` all run through here.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::exit;
use crate::job::{Job, JobHandler, JobSpec, Opened, RunOptions};
use crate::monitor::EventFormat;
use crate::say;
use crate::store::{Leases, Store, StoreStats};

/// Run a job the command line opened through the library's [`Job`], print the summary, and
/// return the exit code. `live`: the state directory `live.json` goes to (none for a job of
/// a database); `resume` is the command that resumes it, suggested if it stops unfinished;
/// `stats`, the job's statistics if the caller just read them.
pub(crate) async fn run_job<S: Store + Leases>(
    store: Arc<S>,
    (spec, stats): (JobSpec, Option<StoreStats>),
    handler: JobHandler,
    options: &RunOptions,
    live: Option<&Path>,
    serving: Serving,
    resume: &str,
) -> Result<u8> {
    tracing::info!(
        job = %spec.job_id,
        input = %spec.input.path.display(),
        work = %work(&spec),
        bucket_size = spec.bucket_size,
        concurrency = options.concurrency,
        "running"
    );
    let mut job = cli_job(store, spec, handler, options, live, serving);
    if let Some(stats) = stats {
        job = job.stats_read(stats);
    }
    let summary = job.run().await?;
    say!("{}{}", summary.render(), crate::os::peak_memory_note());
    if let Some(halted) = &summary.halted {
        if !summary.job.finished() {
            say!("stopped: {halted}\nresume with: {resume}");
            return Ok(exit::halt_code(halted.kind));
        }
    }
    if summary.interrupted && !summary.job.finished() {
        say!("resume with: {resume}");
        return Ok(exit::SIGNAL);
    }
    Ok(if summary.job.failed > 0 {
        exit::FAILURES
    } else {
        exit::OK
    })
}

/// What a job does for each ID, for logs: its URL or its command (as written, `${VAR}`
/// unexpanded).
fn work(spec: &JobSpec) -> &str {
    spec.work.describe()
}

/// The library's [`Job`] for a job (or a rerun, with [`Job::rerun`]) the command line
/// opened, with the command line's reporters: a second signal exits 130, progress events as
/// text or JSON lines (`--log-format`), the bar on a terminal, `live.json` in `live`, and
/// what the run serves.
pub(crate) fn cli_job<S: Store + Leases>(
    store: Arc<S>,
    spec: JobSpec,
    handler: JobHandler,
    options: &RunOptions,
    live: Option<&Path>,
    serving: Serving,
) -> Job<JobHandler, Opened<S>> {
    let format = if crate::console::json() {
        EventFormat::Json
    } else {
        EventFormat::Text
    };
    let mut job = Job::opened(store, spec, handler)
        .options(options.clone())
        .stop_on_signals_then(Box::new(|| {
            say!("stopped at once; the state is consistent, resume with the same command");
            std::process::exit(i32::from(exit::SIGNAL));
        }))
        .progress(options.progress_interval, format);
    // No bar in JSON mode: every line on standard error is a JSON object.
    if crate::console::stderr_is_terminal() && !crate::console::quiet() && !crate::console::json() {
        job = job.progress_bar();
    }
    if let Some(dir) = live {
        job = job.live_dir(dir);
    }
    if let Some(listener) = serving.metrics {
        job = job.metrics(listener);
    }
    if let Some(addr) = serving.dashboard {
        job = job.dashboard_served_at(addr);
    }
    job
}

/// What a run serves over HTTP while it lasts, besides its work.
#[derive(Default)]
pub(crate) struct Serving {
    /// The metrics endpoint's listener.
    pub(crate) metrics: Option<tokio::net::TcpListener>,
    /// Where the command serves the job's dashboard (said in `live.json`).
    pub(crate) dashboard: Option<std::net::SocketAddr>,
}
