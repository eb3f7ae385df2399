//! A loopback API for measuring `--extract`: `GET /items/{id}` answers 200 with a JSON
//! document of about BYTES bytes (default 2048): `{"data": {"name": ..., "score": ...},
//! "padding": "xxx..."}`. Used for the disk figure of benches/README.md, "Answer checks":
//!
//! ```text
//! cargo run --release --example answer_server -- 127.0.0.1:8089 2048
//! ```

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8089".into());
    let bytes: usize = args
        .next()
        .map_or(2048, |b| b.parse().expect("BYTES is a number"));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("answering on http://{addr}/items/{{id}} with about {bytes} bytes");
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let id = req
                    .uri()
                    .path()
                    .rsplit('/')
                    .next()
                    .unwrap_or("")
                    .to_string();
                let head = format!(
                    r#"{{"data":{{"name":"item {id}","score":{}}},"padding":""#,
                    id.len() % 100
                );
                let pad = bytes.saturating_sub(head.len() + 2);
                let body = format!("{head}{}\"}}", "x".repeat(pad));
                async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body)))) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
