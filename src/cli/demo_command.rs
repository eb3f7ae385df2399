//! `highwater demo`: start the fake API ([`crate::demo::api`]) in this process, write the
//! demo's input and run (or resume) its job through [`super::running::run_job`], as `highwater run`
//! does.

use std::borrow::Cow;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::demo::{api, demo_ids, API_VAR};
use crate::handler::http::HttpHandler;
use crate::input::{InputFormat, InputSpec};
use crate::job::{open_made, JobError, JobRequest, RetryOverrides, RunOptions, StateDirPlace};
use crate::say;

/// Run the demo in `dir` (a new temporary directory if `None`) with `ids` IDs.
pub(super) async fn run(dir: Option<PathBuf>, ids: u64) -> Result<u8> {
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            d
        }
        None => tempfile::Builder::new()
            .prefix("highwater-demo-")
            .tempdir()
            .context("creating a temporary directory")?
            .keep(),
    };
    let dir = std::fs::canonicalize(&dir)?;
    let input = dir.join("ids.txt");
    let state = dir.join("state");
    if !input.exists() {
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(&input).with_context(|| format!("{}", input.display()))?,
        );
        for id in demo_ids(ids) {
            writeln!(out, "{id}")?;
        }
        out.flush()?;
    }
    let api = api::FakeApi::start(api::ApiConfig::demo())
        .await
        .context("starting the demo API")?;
    let addr = api.addr().to_string();
    say!("demo API listening on http://{addr} (latency 5-40 ms, some 503s, dropped connections, slow answers, 404s)");
    say!("input: {}\nstate: {}", input.display(), state.display());

    let request = JobRequest {
        input: Some(InputSpec {
            path: input.clone(),
            format: InputFormat::Text,
        }),
        bucket_size: Some(500),
        url: Some(format!("http://${{{API_VAR}}}/items/{{id}}")),
        timeout: Some(Duration::from_secs(1)),
        retry: RetryOverrides {
            max_attempts: Some(4),
            initial: Some(Duration::from_millis(200)),
            max_interval: Some(Duration::from_secs(2)),
            max_elapsed: None,
        },
        ..JobRequest::default()
    };
    // The handler's API is this process's: its address is given to the handler below, not
    // read from the environment.
    let place = StateDirPlace::new(&state);
    let (store, spec) = open_made(&place, true, false, |_| {
        Ok::<_, JobError>(Cow::Borrowed(&request))
    })
    .await?;
    let request = spec
        .work
        .request()
        .context("the demo's job calls its API")?;
    let handler = HttpHandler::with_env(request, &|name| {
        if name == API_VAR {
            Some(addr.clone())
        } else {
            std::env::var(name).ok()
        }
    })?;
    let handler = crate::job::JobHandler::Http(handler);
    let options = RunOptions {
        concurrency: 64,
        progress_interval: Duration::from_secs(5),
        ..RunOptions::default()
    };
    let me = std::env::current_exe()
        .ok()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "highwater".into());
    // The demo's API lives in this process: only the demo itself can resume its job.
    let resume = format!(
        "{} demo --dir {}",
        crate::console::shell_word(&me),
        crate::console::shell_path(&dir)
    );
    let code = super::running::run_job(
        store,
        (spec, None),
        handler,
        &options,
        Some(&state),
        Default::default(),
        &resume,
    )
    .await?;
    api.shutdown().await;
    say!(
        "\nnext:\n  {me} status --state {s}\n  {me} export --state {s} --output {d}/results.jsonl\n  \
         {me} demo --dir {d}    # resumes this demo if it was stopped",
        me = crate::console::shell_word(&me),
        s = crate::console::shell_path(&state),
        d = crate::console::shell_path(&dir),
    );
    Ok(code)
}
