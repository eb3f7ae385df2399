//! `highwater report`: the dashboard as one self-contained HTML file (data and charts
//! embedded; it opens without a network).

use anyhow::{Context, Result};

use super::args::ReportArgs;
use super::exit;
use super::state::{over_place, OverPlace, Tuning};
use crate::job::JobPlace;
use crate::say;

pub(crate) async fn report(args: ReportArgs) -> Result<u8> {
    let (state, job) = (args.state.clone(), args.job.clone());
    over_place(&state, job.as_deref(), Tuning::default(), Report(args)).await
}

/// `report` of the job at a place.
struct Report(ReportArgs);

impl OverPlace for Report {
    async fn over<P: JobPlace + Clone + 'static>(self, place: P) -> Result<u8> {
        report_at(&place, &self.0).await
    }
}

/// The report of the job at `place`, written to `--output`.
async fn report_at<P: JobPlace>(place: &P, args: &ReportArgs) -> Result<u8> {
    let html = crate::dashboard::report(place).await?;
    std::fs::write(&args.output, html.as_bytes()).with_context(|| {
        format!(
            "--output {}: cannot write the report",
            args.output.display()
        )
    })?;
    say!(
        "report of {} written to {} ({} KiB)",
        place.names().shown,
        args.output.display(),
        html.len() / 1024
    );
    Ok(exit::OK)
}
