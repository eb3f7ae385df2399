//! `highwater rerun`: choose the IDs to call again, write the rerun ahead, and run it, on a
//! state directory or on a job of a PostgreSQL database (this process is then the rerun's
//! one worker). The flags that name a selection are the command line's: [`flags`] writes a
//! stored selection back as them.

use std::sync::Arc;

use anyhow::Result;

use super::args::RerunArgs;
use super::exit::{self, library_job, open_files, refused};
use super::run_dashboard::Served;
use super::running::{cli_job, Serving};
use super::state::{over_place, Named, OverPlace, Tuning};
use crate::console::shell_path;
use crate::job::{open_job, JobPlace, JobRequest, RunOptions};
use crate::rerun::{Prepared, RerunAsk, RerunError};
use crate::say;
use crate::store::{JobView, Leases, RerunSelection, Store};

/// A selection as the flags that ask for it: `--failed`, `--buckets 1,2 --all-items`,
/// `--ids FILE`.
pub(crate) fn flags(selection: &RerunSelection) -> String {
    match selection {
        RerunSelection::Failed => "--failed".into(),
        RerunSelection::Buckets { buckets, all_items } => {
            let list: Vec<String> = buckets.iter().map(u64::to_string).collect();
            let all = if *all_items { " --all-items" } else { "" };
            format!("--buckets {}{all}", list.join(","))
        }
        RerunSelection::Ids { file, .. } => format!("--ids {}", shell_path(file)),
    }
}

pub(crate) async fn rerun(args: RerunArgs) -> Result<u8> {
    if let Some(code) = open_files(&args.run) {
        return Ok(code);
    }
    let mut request = match args.run.request() {
        Ok(r) => r,
        Err(message) => {
            say!("error: {message}");
            return Ok(exit::USAGE);
        }
    };
    request.command = "rerun".into();
    // Listen first: a bad --metrics-addr stops the rerun before anything is created.
    let metrics = match args.run.metrics_addr {
        Some(addr) => Some(
            crate::metrics::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("--metrics-addr {e}"))?,
        ),
        None => None,
    };
    let dashboard = match super::run_dashboard::bind(args.run.dashboard).await {
        Ok(listener) => listener,
        Err(code) => return Ok(code),
    };
    if args.all_items && args.buckets.is_empty() {
        say!("error: --all-items goes with --buckets (it redoes every ID of those buckets)");
        return Ok(exit::USAGE);
    }
    let ask = if args.failed {
        RerunAsk::Failed
    } else if let Some(file) = &args.ids {
        RerunAsk::Ids(file.clone())
    } else {
        RerunAsk::Buckets {
            buckets: args.buckets.clone(),
            all_items: args.all_items,
        }
    };
    let tuning = Tuning {
        cache_bytes: Some(args.run.store_cache_mb << 20),
        reopen_after: Some(args.run.store_reopen_after),
        lease_ttl: Some(args.run.lease_ttl),
    };
    let (state, job) = (args.run.state.clone(), args.run.job.clone());
    let rerun = Rerun {
        args: args.run,
        ask,
        request,
        metrics,
        dashboard,
    };
    over_place(&state, job.as_deref(), tuning, rerun).await
}

/// `rerun` of the job at a place: this process is the rerun's one worker (on a database, a
/// session of its own, ended when the rerun stops).
struct Rerun {
    args: super::args::RunArgs,
    ask: RerunAsk,
    request: JobRequest,
    metrics: Option<tokio::net::TcpListener>,
    /// The listener of the job's dashboard, served by the rerun.
    dashboard: Option<tokio::net::TcpListener>,
}

impl OverPlace for Rerun {
    async fn over<P: JobPlace + Clone + 'static>(self, place: P) -> Result<u8> {
        let store = match place.open(false).await {
            Ok((store, _)) => store,
            Err(e) if place.no_such_job(&e) => {
                say!("error: {} to rerun", place.names().absent);
                return Ok(exit::USAGE);
            }
            Err(e) => return Err(e.into()),
        };
        if store.job().await?.is_none() {
            say!("error: {}: nothing to rerun", place.names().unmade);
            place.close(store).await;
            return Ok(exit::USAGE);
        }
        let named = Named::of(&place);
        let dashboard = self
            .dashboard
            .map(|listener| Served::start(listener, &place, &store));
        let serving = Serving {
            metrics: self.metrics,
            dashboard: dashboard.as_ref().map(|d| d.addr),
        };
        let code = rerun_in(
            store.clone(),
            &self.ask,
            &self.request,
            &self.args.options(),
            serving,
            &named,
        )
        .await;
        if let Some(d) = dashboard {
            d.stop().await;
        }
        place.close(store).await;
        code
    }
}

/// Rerun what `ask` selects of the job in `store`, opened for it.
pub(crate) async fn rerun_in<S: Store + Leases>(
    store: Arc<S>,
    ask: &RerunAsk,
    request: &JobRequest,
    options: &RunOptions,
    serving: Serving,
    named: &Named<'_>,
) -> Result<u8> {
    // Every refusal comes before anything is written (a spec change included).
    let chosen = match crate::rerun::choose(&*store, ask).await {
        Ok(chosen) => chosen,
        Err(e) => return refused_rerun(e, named),
    };
    let spec = match open_job(&*store, request).await {
        Ok(spec) => spec,
        Err(e) => return refused(e),
    };
    if let Some(code) = library_job(&spec, &named.job) {
        return Ok(code);
    }
    // A missing ${VAR} is refused before the rerun is written.
    let handler = crate::job::job_handler(&spec)?;
    let rerun = match crate::rerun::start(&*store, &spec, chosen).await {
        Ok(Prepared::Ready { rerun, resumed }) => {
            say!(
                "{} rerun {} ({}): {} IDs in {} rerun buckets",
                if resumed { "resuming" } else { "starting" },
                rerun.number,
                flags(&rerun.selection),
                rerun.ids,
                rerun.buckets
            );
            rerun
        }
        Ok(Prepared::Nothing(selection)) => {
            match selection {
                RerunSelection::Ids { .. } => say!("nothing to rerun: the --ids file lists no IDs"),
                _ => say!(
                    "nothing to rerun: no failed IDs to rerun ({})",
                    flags(&selection)
                ),
            }
            return Ok(exit::OK);
        }
        Err(e) => return refused_rerun(e, named),
    };
    let summary = cli_job(store.clone(), spec, handler, options, named.live, serving)
        .rerun(rerun.number)
        .run()
        .await?;
    say!("{}{}", summary.render(), crate::os::peak_memory_note());
    let selection = flags(&rerun.selection);
    let r = store.rerun_stats(rerun.number).await?;
    say!(
        "rerun {} ({selection}): {} ok, {} failed, {} pending of {} IDs",
        r.number,
        r.ok,
        r.failed,
        r.pending,
        r.ids
    );
    if !r.finished() {
        let resume = format!("highwater rerun {} {selection}", named.state);
        if let Some(halted) = &summary.halted {
            say!("stopped: {halted}\nresume with: {resume}");
            return Ok(exit::halt_code(halted.kind));
        }
        say!("resume with: {resume}");
        return Ok(if summary.interrupted {
            exit::SIGNAL
        } else {
            exit::ERROR
        });
    }
    Ok(if r.failed > 0 {
        exit::FAILURES
    } else {
        exit::OK
    })
}

/// A rerun that cannot be: a usage error (2) for what the command asks (an unfinished rerun
/// of another selection, an unknown bucket), said with the flags; 1 for a job still running;
/// anything else is the command's error.
fn refused_rerun(e: RerunError, named: &Named<'_>) -> Result<u8> {
    match e {
        RerunError::Usage(message) => say!("error: {message}"),
        RerunError::NoBucket { .. } => say!("error: --buckets: {e}"),
        RerunError::Unfinished { number, selection } => {
            let selection = flags(&selection);
            say!(
                "error: rerun {number} ({selection}) is not finished; finish it first with the same command: highwater rerun {} {selection}",
                named.state
            );
        }
        RerunError::JobInFlight(n) => {
            say!(
                "error: the job has {n} bucket(s) not committed yet; finish the run first (highwater run {}), then rerun",
                named.state
            );
            return Ok(exit::ERROR);
        }
        e => return Err(e.into()),
    }
    Ok(exit::USAGE)
}
