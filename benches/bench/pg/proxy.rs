//! A TCP proxy between a worker and PostgreSQL that counts what goes over the wire: bytes
//! each way, round trips (a client flight that follows the server's answer) and the
//! statements sent (the protocol's `Query` and `Execute` messages), over every connection.
//! With a delay ([`Proxy::start_delayed`]), each chunk is forwarded that long after it was
//! read, each way: a database that far away, its bandwidth and order kept (chunks queue with
//! their due time; the reader never waits for the writer).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy saw, over all its connections.
#[derive(Debug, Default)]
pub struct Counts {
    pub connections: AtomicU64,
    pub to_server: AtomicU64,
    pub to_client: AtomicU64,
    pub round_trips: AtomicU64,
    pub statements: AtomicU64,
}

/// A proxy on a free 127.0.0.1 port to `upstream` on 127.0.0.1; stops when dropped.
pub struct Proxy {
    pub port: u16,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Result<Proxy> {
        Proxy::start_delayed(upstream, Duration::ZERO).await
    }

    /// [`Proxy::start`], each chunk forwarded `delay` after it was read, both ways.
    pub async fn start_delayed(upstream: u16, delay: Duration) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        let port = listener.local_addr()?.port();
        let counts = Arc::new(Counts::default());
        let shared = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counts = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = relay(client, upstream, counts, delay).await {
                        eprintln!("proxy: a connection ended with {e}");
                    }
                });
            }
        });
        Ok(Proxy { port, counts, task })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    client: TcpStream,
    upstream: u16,
    counts: Arc<Counts>,
    delay: Duration,
) -> std::io::Result<()> {
    let server = TcpStream::connect(("127.0.0.1", upstream)).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    counts.connections.fetch_add(1, Ordering::Relaxed);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Whether the server spoke last on this connection.
    let server_spoke = Arc::new(AtomicBool::new(true));
    let up = pump(
        client_read,
        server_write,
        Side::Client(Messages::default()),
        server_spoke.clone(),
        counts.clone(),
        delay,
    );
    let down = pump(
        server_read,
        client_write,
        Side::Server,
        server_spoke,
        counts,
        delay,
    );
    let (a, b) = tokio::join!(up, down);
    a.and(b)
}

enum Side {
    Client(Messages),
    Server,
}

async fn pump(
    mut from: OwnedReadHalf,
    to: OwnedWriteHalf,
    mut side: Side,
    server_spoke: Arc<AtomicBool>,
    counts: Arc<Counts>,
    delay: Duration,
) -> std::io::Result<()> {
    // Chunks with their due time, to the task that writes them (None: the end).
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let writer = tokio::spawn(forward(rx, to));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let k = match from.read(&mut buf).await {
            Ok(k) => k,
            Err(e) => {
                let _ = tx.send(None);
                let _ = writer.await;
                return Err(e);
            }
        };
        if k == 0 {
            let _ = tx.send(None);
            return writer.await.unwrap_or(Ok(()));
        }
        match &mut side {
            Side::Client(messages) => {
                counts.to_server.fetch_add(k as u64, Ordering::Relaxed);
                if server_spoke.swap(false, Ordering::Relaxed) {
                    counts.round_trips.fetch_add(1, Ordering::Relaxed);
                }
                messages.feed(&buf[..k], &counts);
            }
            Side::Server => {
                counts.to_client.fetch_add(k as u64, Ordering::Relaxed);
                server_spoke.store(true, Ordering::Relaxed);
            }
        }
        let due = tokio::time::Instant::now() + delay;
        if tx.send(Some((due, buf[..k].to_vec()))).is_err() {
            // The writer failed: its error is the connection's.
            return writer.await.unwrap_or(Ok(()));
        }
    }
}

/// Write each chunk at its due time, in order; shut the write half down at the end.
async fn forward(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Option<(tokio::time::Instant, Vec<u8>)>>,
    mut to: OwnedWriteHalf,
) -> std::io::Result<()> {
    while let Some(Some((due, chunk))) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        to.write_all(&chunk).await?;
    }
    let _ = to.shutdown().await;
    Ok(())
}

/// The client's side of the protocol, cut into messages: untyped ones first (an
/// SSLRequest, the startup message), then a type byte and a length each.
#[derive(Default)]
struct Messages {
    started: bool,
    header: Vec<u8>,
    skip: usize,
}

/// The codes of the untyped requests after which another untyped message follows.
const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;

impl Messages {
    fn feed(&mut self, mut data: &[u8], counts: &Counts) {
        while !data.is_empty() {
            if self.skip > 0 {
                let k = self.skip.min(data.len());
                self.skip -= k;
                data = &data[k..];
                continue;
            }
            let need = if self.started { 5 } else { 8 };
            let k = (need - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..k]);
            data = &data[k..];
            if self.header.len() < need {
                return;
            }
            let word = |at: usize| {
                u32::from_be_bytes([
                    self.header[at],
                    self.header[at + 1],
                    self.header[at + 2],
                    self.header[at + 3],
                ]) as usize
            };
            if self.started {
                self.skip = word(1).saturating_sub(4);
                if matches!(self.header[0], b'Q' | b'E') {
                    counts.statements.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                self.skip = word(0).saturating_sub(8);
                let code = word(4) as u32;
                self.started = code != SSL_REQUEST && code != GSSENC_REQUEST;
            }
            self.header.clear();
        }
    }
}
