//! `highwater serve`: the job's dashboard, a read-only web page, until Ctrl-C.

use anyhow::Result;

use super::args::ServeArgs;
use super::exit;
use super::state::dashboard_source;
use crate::dashboard;
use crate::say;

pub(crate) async fn serve(args: ServeArgs) -> Result<u8> {
    let source = match dashboard_source(&args.state, args.job.as_deref()) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    // Say what is wrong with the job before listening.
    source.check().await?;
    let listener = match dashboard::bind(args.addr).await {
        Ok(l) => l,
        Err(e) => {
            say!("error: --addr {e}");
            return Ok(exit::ERROR);
        }
    };
    let addr = listener.local_addr().unwrap_or(args.addr);
    say!(
        "dashboard of {} on http://{addr}/ (read-only; Ctrl-C to stop)",
        source.shown()
    );
    if !addr.ip().is_loopback() {
        tracing::warn!(
            "--addr {addr} is reachable from other machines: anyone who can reach it sees the job's figures, IDs, errors and spec"
        );
    }
    let server = tokio::spawn(dashboard::serve(listener, source));
    wait_for_stop().await;
    server.abort();
    Ok(exit::OK)
}

/// Until SIGINT or SIGTERM.
async fn wait_for_stop() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
