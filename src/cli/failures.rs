//! `highwater failures`: the error table of a job, filtered by bucket or class.

use std::io;

use anyhow::{Context, Result};

use super::args::FailuresArgs;
use super::exit;
use super::state::{open_existing, state_arg, StateArg};
use crate::say;
use crate::sink;
use crate::store::{JobView, Store};

pub(crate) async fn failures(args: FailuresArgs) -> Result<u8> {
    if let Some(class) = &args.class {
        let names = crate::failure::ErrorClass::ALL.map(|c| c.name());
        if !names.contains(&class.as_str()) {
            say!(
                "error: --class {class:?} is not an error class (one of: {})",
                names.join(", ")
            );
            return Ok(exit::USAGE);
        }
    }
    match state_arg(&args.state, args.job.as_deref()) {
        Ok(StateArg::Dir) => {}
        #[cfg(feature = "postgres")]
        Ok(StateArg::Pg { url, job }) => {
            let (store, _) = super::state::pg::open_reader(&url, &job).await?;
            return failures_of(&store, &args).await;
        }
        Err(code) => return Ok(code),
    }
    let (store, _) = open_existing(&args.state).await?;
    failures_of(&store, &args).await
}

/// `failures` over an opened store.
async fn failures_of<S: Store>(store: &S, args: &FailuresArgs) -> Result<u8> {
    if let Some(b) = args.bucket {
        if store.offset(b).await?.is_none() {
            say!(
                "error: --bucket {b}: the job has no bucket {b} ({} planned)",
                store.stats().await?.buckets_planned
            );
            return Ok(exit::USAGE);
        }
    }
    let filter = sink::FailureFilter {
        bucket: args.bucket,
        class: args.class.clone(),
    };
    let mut out = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
    match sink::failures(store, args.format, &filter, &mut out).await {
        Ok(_) => {}
        Err(crate::store::ExportError::Write(e)) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(e).context("listing failures to standard output"),
    }
    Ok(exit::OK)
}
