//! `--dashboard` of `run` and `rerun`: the job's dashboard served by the run itself, which
//! alone may read the store it holds, so that every panel is live. Bound before anything is
//! created (an address in use stops the command first), served over the run's own store
//! ([`RunningPlace`]) once the job is open, and stopped before the store is closed.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::exit;
use crate::job::{JobPlace, RunningPlace};
use crate::say;

/// Listen on `addr`, if given; an address that cannot be listened on is said, with the exit
/// code it ends the command with.
pub(crate) async fn bind(addr: Option<SocketAddr>) -> Result<Option<TcpListener>, u8> {
    let Some(addr) = addr else { return Ok(None) };
    match crate::dashboard::bind(addr).await {
        Ok(listener) => Ok(Some(listener)),
        Err(e) => {
            say!("error: --dashboard {e}");
            Err(exit::ERROR)
        }
    }
}

/// The dashboard a run serves, while it does.
pub(crate) struct Served {
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    server: JoinHandle<()>,
}

impl Served {
    /// Serve on `listener` the dashboard of the job at `place`, which this process runs on
    /// `store`.
    pub(crate) fn start<P: JobPlace + Clone + 'static>(
        listener: TcpListener,
        place: &P,
        store: &std::sync::Arc<P::Store>,
    ) -> Served {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        say!("dashboard on http://{addr}/ (read-only, while the run lasts)");
        if !addr.ip().is_loopback() {
            tracing::warn!(
                "--dashboard {addr} is reachable from other machines: anyone who can reach it sees the job's figures, IDs, errors and spec"
            );
        }
        let place = RunningPlace::new(place.clone(), store.clone());
        Served {
            addr,
            server: tokio::spawn(crate::dashboard::serve(listener, place)),
        }
    }

    /// Stop serving; the readings under way, which hold the store, end first.
    pub(crate) async fn stop(self) {
        self.server.abort();
        let _ = self.server.await;
    }
}
