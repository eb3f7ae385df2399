//! The fake API's tests: routes, faults, the outage switch, the hidden capacity, the quota
//! windows, the language-model routes, call counts.

use super::calls::{max_in_window, CallCounter};
use super::capacity::Bucket;
use super::faults::mix64;
use super::request::MAX_BODY;
use super::*;
use hyper::header::{CONTENT_TYPE, RETRY_AFTER};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use xxhash_rust::xxh3::xxh3_64;

mod answers;
mod calls;
mod capacity;
mod llm;
mod outage;
mod pages;
mod windows;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .retry(reqwest::retry::never())
        .build()
        .expect("client")
}

fn item_url(api: &FakeApi, id: &str) -> String {
    api.url_template().replace(
        "{id}",
        &utf8_percent_encode(id, NON_ALPHANUMERIC).to_string(),
    )
}

/// The first ID of the form `{prefix}{n}` with the given fault.
fn id_with(config: &ApiConfig, prefix: &str, fault: Fault) -> String {
    (0..100_000)
        .map(|n| format!("{prefix}{n}"))
        .find(|id| config.fault(id) == fault)
        .expect("an ID with that fault")
}

async fn get_json(client: &reqwest::Client, url: &str) -> (u16, serde_json::Value) {
    let resp = client.get(url).send().await.expect("request");
    let status = resp.status().as_u16();
    let body = resp.bytes().await.expect("body");
    (status, serde_json::from_slice(&body).expect("json body"))
}
