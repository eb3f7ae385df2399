//! `highwater run` on a state directory: check a new job before creating anything, open
//! or create it, and run it with the command line's reporters.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::args::RunArgs;
use super::{exit, halt_code, library_job, open_files, pg, refused, state_arg, StateArg};
use crate::console::shell_path;
use crate::job::{open_job, Job, JobHandler, JobSpec, Opened, RunOptions};
use crate::monitor::EventFormat;
use crate::say;
use crate::store::sled_store::{OpenMode, SledStore};
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
    match state_arg(&args.state, args.job.as_deref()) {
        Ok(StateArg::Dir) => {}
        Ok(StateArg::Pg { url, job }) => return pg::run(&args, request, url, job, metrics).await,
        Err(code) => return Ok(code),
    }
    // A new job needs --input and --url (or --exec): say so before creating anything.
    let fresh = std::fs::read_dir(&args.state).map_or(true, |mut d| d.next().is_none());
    if fresh && request.input.is_some() && request.url.is_none() && request.exec.is_none() {
        say!(
            "error: {} holds no job: give --input FILE and --url TEMPLATE (or --exec COMMAND) to create one",
            args.state.display()
        );
        return Ok(exit::USAGE);
    }
    // A new job's templates and input are checked before its state directory is created, so
    // a mistyped flag leaves nothing behind.
    if fresh {
        if let Err(e) = crate::job::check_new_job(&request)
            .and_then(|()| crate::job::check_new_job_environment(&request))
        {
            return refused(e);
        }
    }
    let mode = if request.input.is_some() {
        OpenMode::CreateIfMissing
    } else {
        OpenMode::Existing
    };
    let existed = args.state.exists();
    let store = SledStore::open(&args.state, mode, args.store_cache_mb << 20)?;
    store.set_reopen_after(args.store_reopen_after);
    let spec = match open_job(&store, &request).await {
        Ok(spec) => spec,
        Err(e) => {
            // Whatever the checks above could not foresee (the input changing under us, a
            // read error), a refused creation leaves nothing behind either.
            if fresh {
                drop(store);
                undo_creation(&args.state, existed);
            }
            return refused(e);
        }
    };
    if let Some(code) = library_job(&spec, &format!("the job in {}", args.state.display())) {
        return Ok(code);
    }
    if let Some(open) = crate::rerun::unfinished(&store).await? {
        say!(
            "note: rerun {} ({}) is not finished; resume it with: highwater rerun --state {} {}",
            open.number,
            super::rerun::flags(&open.selection),
            shell_path(&args.state),
            super::rerun::flags(&open.selection)
        );
    }
    let done = store.stats().await?;
    if done.finished() {
        say!(
            "the job in {} is already finished: {} ok, {} failed",
            args.state.display(),
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
    let resume = format!("highwater run --state {}", shell_path(&args.state));
    run_job(
        Arc::new(store),
        spec,
        handler,
        &args.options(),
        Some(&args.state),
        metrics,
        &resume,
    )
    .await
}

/// entries if it was empty. Best effort: the refusal is the error to report.
fn undo_creation(state: &Path, existed: bool) {
    if !existed {
        let _ = std::fs::remove_dir_all(state);
        return;
    }
    if let Ok(entries) = std::fs::read_dir(state) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

/// Run a job the command line opened through the library's [`Job`], print the summary, and
/// return the exit code. `live`: the state directory `live.json` goes to (none for a job of
/// a database); `resume` is the command that resumes it, suggested if it stops unfinished.
pub(crate) async fn run_job<S: Store + Leases>(
    store: Arc<S>,
    spec: JobSpec,
    handler: JobHandler,
    options: &RunOptions,
    live: Option<&Path>,
    metrics: Option<tokio::net::TcpListener>,
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
    let summary = cli_job(store, spec, handler, options, live, metrics)
        .run()
        .await?;
    say!("{}", summary.render());
    if let Some(halted) = &summary.halted {
        if !summary.job.finished() {
            say!("stopped: {halted}\nresume with: {resume}");
            return Ok(halt_code(halted.kind));
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
    spec.exec
        .as_ref()
        .map_or(spec.request.url.as_str(), |e| e.command.as_str())
}

/// The library's [`Job`] for a job (or a rerun, with [`Job::rerun`]) the command line
/// opened, with the command line's reporters: a second signal exits 130, progress events as
/// text or JSON lines (`--log-format`), the bar on a terminal, `live.json` in `live`, and
/// the metrics endpoint.
pub(crate) fn cli_job<S: Store + Leases>(
    store: Arc<S>,
    spec: JobSpec,
    handler: JobHandler,
    options: &RunOptions,
    live: Option<&Path>,
    metrics: Option<tokio::net::TcpListener>,
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
    if let Some(listener) = metrics {
        job = job.metrics(listener);
    }
    job
}
