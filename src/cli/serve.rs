//! `highwater serve`: the job's dashboard, a read-only web page, until Ctrl-C.

use anyhow::Result;

use super::args::ServeArgs;
use super::exit;
use super::state::{over_place, OverPlace, Tuning};
use crate::dashboard;
use crate::job::JobPlace;
use crate::say;

pub(crate) async fn serve(args: ServeArgs) -> Result<u8> {
    let (state, job) = (args.state.clone(), args.job.clone());
    over_place(&state, job.as_deref(), Tuning::default(), Serve(args)).await
}

/// `serve` of the job at a place.
struct Serve(ServeArgs);

impl OverPlace for Serve {
    async fn over<P: JobPlace + Clone + 'static>(self, place: P) -> Result<u8> {
        serve_at(place, self.0).await
    }
}

/// The dashboard of the job at `place`, until a signal.
async fn serve_at<P: JobPlace + Clone + 'static>(place: P, args: ServeArgs) -> Result<u8> {
    // Say what is wrong with the place before listening (a run may hold it).
    place.look().await?;
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
        place.names().shown
    );
    if !addr.ip().is_loopback() {
        tracing::warn!(
            "--addr {addr} is reachable from other machines: anyone who can reach it sees the job's figures, IDs, errors and spec"
        );
    }
    let server = tokio::spawn(dashboard::serve(listener, place));
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
