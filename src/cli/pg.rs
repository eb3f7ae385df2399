//! The CLI's PostgreSQL side: `--state postgres://... --job NAME`.
//!
//! The first `run` with `--input` and `--url` creates the job in the database; any later
//! `run --state URL --job NAME` (on any machine, no input needed) joins it as a worker: it
//! registers a session, leases buckets as it goes, and exits by itself (0 or 3) once the
//! input is planned and every bucket committed. A stop (SIGINT/SIGTERM) finishes or abandons
//! the items in flight within `--shutdown-timeout`, then ends the session, which releases
//! every lease at once. `status`, `export` and `failures` read the job without a session;
//! `rerun` runs with a session of its own, as the rerun's one worker.
//! The URL is shown only without its password.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use super::{exit, refused, run_job, RunArgs};
use crate::job::{join_job, open_job, stored_job, JobRequest, JobSpec};
use crate::rerun::RerunAsk;
use crate::say;
use crate::store::postgres::{connect::redact_url, PgOpen, PgStore, PgTarget};
use crate::store::{JobView, StoreError};

/// Parse the URL (its `${VAR}`s expanded); a bad one is a usage error, said.
fn target(url: &str) -> Result<PgTarget, u8> {
    PgTarget::parse(url).map_err(|e| {
        say!("error: --state: {e}");
        exit::USAGE
    })
}

/// How the job is named in messages: its name and the database, without a password.
fn shown(url: &str, job: &str) -> String {
    format!("job {job:?} of {}", redact_url(url))
}

/// Open the job without a session, for reading.
pub(super) async fn open_reader(url: &str, job: &str) -> Result<(PgStore, JobSpec)> {
    let target = match target(url) {
        Ok(t) => t,
        Err(code) => std::process::exit(i32::from(code)),
    };
    let open = PgOpen {
        worker: false,
        ..PgOpen::new(job)
    };
    let store = PgStore::open(&target, &open).await?;
    let spec = stored_job(&store).await?.ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no spec yet (its first run stopped before creating it)",
            shown(url, job)
        )
    })?;
    Ok((store, spec))
}

/// `run` on a job of a database: create it (with `--input`) or join it.
pub(super) async fn run(
    args: &RunArgs,
    request: JobRequest,
    url: String,
    job: String,
    metrics: Option<tokio::net::TcpListener>,
) -> Result<u8> {
    let target = match target(&url) {
        Ok(t) => t,
        Err(code) => return Ok(code),
    };
    let creating = request.input.is_some();
    if creating && request.url.is_none() {
        if let Err(e) = crate::job::check_new_job(&request) {
            return refused(e);
        }
    }
    let open = PgOpen {
        create: creating,
        ttl: args.lease_ttl,
        ..PgOpen::new(job.clone())
    };
    let store = match PgStore::open(&target, &open).await {
        Ok(store) => store,
        Err(e) if matches!(e.root(), StoreError::NotAStore { .. }) => {
            say!(
                "error: there is no {}: create it with --input FILE --url TEMPLATE",
                shown(&url, &job)
            );
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e.into()),
    };
    let spec = if creating {
        let checked = if store.created_job() {
            crate::job::check_new_job(&request)
                .and_then(|()| crate::job::check_new_job_environment(&request))
        } else {
            Ok(())
        };
        let opened = match checked {
            Ok(()) => open_job(&store, &request).await,
            Err(e) => Err(e),
        };
        match opened {
            Ok(spec) => spec,
            Err(e) => {
                // A refused creation leaves no job behind.
                if let Err(undo) = store.discard_created_job().await {
                    tracing::warn!("cannot remove the refused job: {undo}");
                }
                return refused(e);
            }
        }
    } else {
        // The same checks of the flags as a directory resume: what changes the job's
        // meaning is refused, operational flags apply.
        match join_job(&store, &request).await {
            Ok(Some(spec)) => joining(spec),
            Err(e) => {
                store.close().await?;
                return refused(e);
            }
            Ok(None) => {
                say!(
                    "error: {} has no spec yet: its first run needs --input FILE --url TEMPLATE",
                    shown(&url, &job)
                );
                store.close().await?;
                return Ok(exit::USAGE);
            }
        }
    };
    if let Some(code) = super::library_job(&spec, &format!("the {}", shown(&url, &job))) {
        store.close().await?;
        return Ok(code);
    }
    let handler = match crate::job::job_handler(&spec) {
        Ok(h) => h,
        Err(e) => {
            store.close().await?;
            return Err(e.into());
        }
    };
    let done = store.stats().await?;
    if done.finished() {
        say!(
            "the {} is already finished: {} ok, {} failed",
            shown(&url, &job),
            done.ok,
            done.failed
        );
        store.close().await?;
        return Ok(if done.failed > 0 {
            exit::FAILURES
        } else {
            exit::OK
        });
    }
    let resume = format!(
        "highwater run --state {} --job {}",
        redact_url(&url),
        crate::console::shell_path(Path::new(&job))
    );
    let store = Arc::new(store);
    let code = run_job(
        store.clone(),
        spec,
        handler,
        &args.options(),
        None,
        metrics,
        &resume,
    )
    .await;
    close(store).await;
    code
}

/// End the worker's session: what it still holds is released at once.
async fn close(store: Arc<PgStore>) {
    match Arc::into_inner(store) {
        Some(store) => {
            if let Err(e) = store.close().await {
                tracing::warn!("cannot end the worker's session (it expires by itself): {e}");
            }
        }
        None => tracing::warn!("the worker's session is left to expire by itself"),
    }
}

/// `rerun` on a job of a database, as on a directory: this process is the rerun's one
/// worker (a session of its own, ended when the rerun stops).
pub(super) async fn rerun(
    args: &RunArgs,
    ask: &RerunAsk,
    request: &JobRequest,
    url: &str,
    job: &str,
    metrics: Option<tokio::net::TcpListener>,
) -> Result<u8> {
    let target = match target(url) {
        Ok(t) => t,
        Err(code) => return Ok(code),
    };
    let open = PgOpen {
        ttl: args.lease_ttl,
        ..PgOpen::new(job)
    };
    let store = match PgStore::open(&target, &open).await {
        Ok(store) => store,
        Err(e) if matches!(e.root(), StoreError::NotAStore { .. }) => {
            say!("error: there is no {} to rerun", shown(url, job));
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e.into()),
    };
    let store = Arc::new(store);
    if stored_job(&*store).await?.is_none() {
        say!(
            "error: the {} has no spec yet (its first run stopped before creating it): nothing to rerun",
            shown(url, job)
        );
        close(store).await;
        return Ok(exit::USAGE);
    }
    let place = super::rerun::Place {
        job: format!("the {}", shown(url, job)),
        state: format!(
            "--state {} --job {}",
            redact_url(url),
            crate::console::shell_path(Path::new(job))
        ),
        live: None,
    };
    let code = super::rerun::rerun_in(
        store.clone(),
        ask,
        request,
        &args.options(),
        metrics,
        &place,
    )
    .await;
    close(store).await;
    code
}

/// A joining worker's spec: the stored one. It plans only if the job's input is here,
/// unchanged; else its input is left unreadable and other workers plan.
fn joining(mut spec: JobSpec) -> JobSpec {
    let here = spec.input_fingerprint_now().ok();
    if here != Some(spec.fingerprint) {
        tracing::info!(
            input = %spec.input.path.display(),
            "the job's input is not here (or differs): this worker does not plan"
        );
        spec.input.path = PathBuf::new();
    }
    spec
}

/// `status` of a job of a database, with its workers.
pub(super) async fn status(url: &str, job: &str, json: bool) -> Result<(String, bool)> {
    let (store, spec) = open_reader(url, job).await?;
    let workers = store.workers().await?;
    let planning = store.planning().await?;
    let live = workers.iter().any(|w| w.state != "expired");
    let runner = if live { "running" } else { "none" };
    let rendered = (
        serde_json::json!(workers),
        format!("{}{}", render_planning(&planning), render_workers(&workers)),
    );
    let mut text = super::status::describe(
        &store,
        &spec,
        Path::new(&redact_url(url)),
        json,
        runner,
        None,
        Some(rendered),
    )
    .await?;
    if json {
        // Where planning stands, beside the workers.
        let mut value: serde_json::Value = serde_json::from_str(&text)?;
        value["planner"] = serde_json::json!(planning);
        text = format!("{value}\n");
    }
    Ok((text, false))
}

/// Where planning stands, one line of `status`.
fn render_planning(p: &crate::store::postgres::stats::Planning) -> String {
    let who = p.planner.as_deref().map_or(String::new(), |w| {
        format!(" (worker {})", &w[..8.min(w.len())])
    });
    match p.state {
        "done" => "planner:    the input is planned to its end\n".into(),
        "planning" => format!("planner:    planning{who}\n"),
        _ => "planner:    the job waits for a worker with the input to plan the rest \
              (start one with --input FILE)\n"
            .into(),
    }
}

/// The worker table of `status`.
fn render_workers(workers: &[crate::store::postgres::session::WorkerRow]) -> String {
    let mut text = format!("workers:    {}\n", workers.len());
    for w in workers {
        let share = w
            .rate_share
            .map_or("-".to_string(), |r| format!("{r:.1}/s"));
        let rate = w
            .stats
            .get("items_per_s")
            .and_then(serde_json::Value::as_f64)
            .map_or("-".to_string(), |r| format!("{r:.1}"));
        text.push_str(&format!(
            "  {} {}:{} started {}, heartbeat {:.1}s ago, {}, {} buckets held, rate share {}, {} items/s\n",
            &w.worker[..8.min(w.worker.len())],
            w.host,
            w.pid,
            crate::live::format_ms(w.started_ms),
            w.heartbeat_age_s,
            w.state,
            w.buckets_held,
            share,
            rate,
        ));
    }
    text
}
