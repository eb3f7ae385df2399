//! Serving connections: the accept loop, the outage switch's closing and binding again of the
//! listener, and one HTTP/1.1 connection.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::routes::handle;
use super::shared::{SetDown, Shared};

/// Backlog of the listener bound again by [`FakeApi::set_down`]`(false)` (tokio's default).
pub(super) const LISTEN_BACKLOG: u32 = 1024;

pub(super) async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    mut set_down: mpsc::UnboundedReceiver<SetDown>,
) {
    // `None` while down.
    let mut listener = Some(listener);
    let mut conns = JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.keep_alive(true);
    loop {
        tokio::select! {
            biased;
            // Ok (true was sent) or Err (every FakeApi was dropped): stop either way.
            _ = shutdown.changed() => break,
            Some(SetDown { down, done }) = set_down.recv() => {
                if down {
                    shared.down.store(true, Ordering::SeqCst);
                    // Closing the listening socket makes new connections refused (and
                    // resets those still in its backlog); aborting the connection tasks
                    // closes their sockets.
                    listener = None;
                    conns.shutdown().await;
                } else if listener.is_none() {
                    listener = rebind_retrying(addr, &mut shutdown).await;
                    if listener.is_some() {
                        shared.down.store(false, Ordering::SeqCst);
                    }
                }
                let _ = done.send(());
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((stream, _peer)) => {
                    let conn = serve(&builder, stream, shared.clone());
                    conns.spawn(conn);
                }
                Err(e) => {
                    tracing::warn!("fake API: accept failed: {e}");
                    if !is_per_connection_error(&e) {
                        // EMFILE, ENFILE, ENOBUFS...: give other tasks time to free some.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            },
        }
    }
    drop(listener);
    conns.shutdown().await;
}

/// Accepts on `listener`, or never completes if there is none (the server is down).
pub(super) async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// A new listener on `addr` (the port the server had), with `SO_REUSEADDR` so the
/// connections just closed (in TIME_WAIT) do not prevent it.
pub(super) fn rebind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// [`rebind`], retried every 10 ms for about 5 s; `None` if that failed or the server is
/// being shut down.
pub(super) async fn rebind_retrying(
    addr: SocketAddr,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<TcpListener> {
    let mut last_error = None;
    for _ in 0..500 {
        match rebind(addr) {
            Ok(listener) => return Some(listener),
            Err(e) => last_error = Some(e),
        }
        tokio::select! {
            _ = shutdown.changed() => return None,
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
    if let Some(e) = last_error {
        tracing::error!("fake API: binding {addr} again failed, staying down: {e}");
    }
    None
}

/// Errors that only concern the connection being accepted, after which the next
/// accept can be tried at once.
pub(super) fn is_per_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

pub(super) fn serve(
    builder: &hyper::server::conn::http1::Builder,
    stream: TcpStream,
    shared: Arc<Shared>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| handle(shared.clone(), req));
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    async move {
        if let Err(e) = conn.await {
            // Includes the connections closed on purpose by `Fault::Drop`.
            tracing::debug!("fake API: connection ended: {e}");
        }
    }
}
