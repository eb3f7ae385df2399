//! The CLI's PostgreSQL side in a build without the `postgres` feature: every use of a
//! PostgreSQL `--state` is refused (exit 2).

use anyhow::Result;

use super::{exit, RunArgs};
use crate::job::JobRequest;

fn unsupported() -> u8 {
    crate::say!("error: --state postgres://...: this highwater was built without PostgreSQL support (cargo feature postgres)");
    exit::USAGE
}

pub(super) async fn run(
    _args: &RunArgs,
    _request: JobRequest,
    _url: String,
    _job: String,
    _metrics: Option<tokio::net::TcpListener>,
) -> Result<u8> {
    Ok(unsupported())
}

pub(super) async fn rerun(
    _args: &RunArgs,
    _ask: &crate::rerun::RerunAsk,
    _request: &JobRequest,
    _url: &str,
    _job: &str,
    _metrics: Option<tokio::net::TcpListener>,
) -> Result<u8> {
    Ok(unsupported())
}

pub(super) async fn status(_url: &str, _job: &str, _json: bool) -> Result<(String, bool)> {
    std::process::exit(i32::from(unsupported()))
}

pub(super) async fn open_reader(
    _url: &str,
    _job: &str,
) -> Result<(crate::store::mem::MemStore, ())> {
    std::process::exit(i32::from(unsupported()))
}
