//! `highwater report`: the dashboard as one self-contained HTML file (data and charts
//! embedded; it opens without a network).

use anyhow::{Context, Result};

use super::args::ReportArgs;
use super::exit;
use super::state::dashboard_source;
use crate::say;

pub(crate) async fn report(args: ReportArgs) -> Result<u8> {
    let source = match dashboard_source(&args.state, args.job.as_deref()) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let html = crate::dashboard::report(&source).await?;
    std::fs::write(&args.output, html.as_bytes()).with_context(|| {
        format!(
            "--output {}: cannot write the report",
            args.output.display()
        )
    })?;
    say!(
        "report of {} written to {} ({} KiB)",
        source.shown(),
        args.output.display(),
        html.len() / 1024
    );
    Ok(exit::OK)
}
