//! `highwater failures`: the error table of a job, filtered by bucket or class.

use std::io;

use anyhow::{Context, Result};

use super::args::FailuresArgs;
use super::exit;
use super::state::{open_reader, over_place, OverPlace, Tuning};
use crate::job::JobPlace;
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
    let (state, job) = (args.state.clone(), args.job.clone());
    over_place(&state, job.as_deref(), Tuning::default(), Failures(args)).await
}

/// `failures` of the job at a place.
struct Failures(FailuresArgs);

impl OverPlace for Failures {
    async fn over<P: JobPlace + Clone + 'static>(self, place: P) -> Result<u8> {
        let (store, _) = open_reader(&place).await?;
        failures_of(&*store, &self.0).await
    }
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
