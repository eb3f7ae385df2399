//! `highwater rerun`: choose the IDs to call again, write the rerun ahead, and run it.

use std::sync::Arc;

use anyhow::Result;

use super::args::RerunArgs;
use super::run::cli_job;
use super::{exit, library_job, open_files, refused, state_arg, StateArg};
use crate::console::shell_path;
use crate::job::open_job;
use crate::rerun::{Prepared, RerunAsk, RerunError};
use crate::say;
use crate::store::sled_store::{OpenMode, SledStore};
use crate::store::{JobView, Store};

pub(crate) async fn rerun(args: RerunArgs) -> Result<u8> {
    if let Some(code) = open_files(&args.run) {
        return Ok(code);
    }
    let state = args.run.state.clone();
    match state_arg(&state, args.run.job.as_deref()) {
        Ok(StateArg::Dir) => {}
        Ok(StateArg::Pg { .. }) => {
            say!("error: rerun of a PostgreSQL job is not supported yet");
            return Ok(exit::USAGE);
        }
        Err(code) => return Ok(code),
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
    let store = SledStore::open(&state, OpenMode::Existing, args.run.store_cache_mb << 20)?;
    store.set_reopen_after(args.run.store_reopen_after);
    if store.job().await?.is_none() {
        say!("error: {} holds no job to rerun", state.display());
        return Ok(exit::USAGE);
    }
    // Every refusal comes before anything is written (a spec change included).
    let chosen = match crate::rerun::choose(&store, &ask, &state).await {
        Ok(chosen) => chosen,
        Err(e @ (RerunError::Usage(_) | RerunError::Unfinished { .. })) => {
            say!("error: {e}");
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e.into()),
    };
    let spec = match open_job(&store, &request).await {
        Ok(spec) => spec,
        Err(e) => return refused(e),
    };
    if let Some(code) = library_job(&spec, &format!("the job in {}", state.display())) {
        return Ok(code);
    }
    // A missing ${VAR} is refused before the rerun is written.
    let handler = crate::job::job_handler(&spec)?;
    let rerun = match crate::rerun::start(&store, &spec, chosen).await {
        Ok(Prepared::Ready { rerun, resumed }) => {
            say!(
                "{} rerun {} ({}): {} IDs in {} rerun buckets",
                if resumed { "resuming" } else { "starting" },
                rerun.number,
                rerun.selection,
                rerun.ids,
                rerun.buckets
            );
            rerun
        }
        Ok(Prepared::Nothing(why)) => {
            say!("nothing to rerun: {why}");
            return Ok(exit::OK);
        }
        Err(e @ (RerunError::Usage(_) | RerunError::Unfinished { .. })) => {
            say!("error: {e}");
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e.into()),
    };
    let store = Arc::new(store);
    let summary = cli_job(
        store.clone(),
        spec,
        handler,
        &args.run.options(),
        Some(&state),
        metrics,
    )
    .rerun(rerun.number)
    .run()
    .await?;
    say!("{}", summary.render());
    let r = store.rerun_stats(rerun.number).await?;
    say!(
        "rerun {} ({}): {} ok, {} failed, {} pending of {} IDs",
        r.number,
        rerun.selection,
        r.ok,
        r.failed,
        r.pending,
        r.ids
    );
    if !r.finished() {
        if let Some(reason) = &summary.halted {
            say!(
                "stopped: {reason}\nresume with: highwater rerun --state {} {}",
                shell_path(&state),
                rerun.selection
            );
            return Ok(exit::ERROR);
        }
        say!(
            "resume with: highwater rerun --state {} {}",
            shell_path(&state),
            rerun.selection
        );
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
