//! Listening for a small HTTP server of ours (the metrics endpoint, the dashboard): binding
//! the address, and the error that names it (the CLI puts its flag's name in front).

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// Listening on an address failed.
#[derive(Debug, thiserror::Error)]
#[error("{addr}: cannot listen: {error}")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// The operating system's error.
    pub error: std::io::Error,
}

/// Listen on `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| BindError { addr, error })
}
