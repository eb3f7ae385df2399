//! `dashboard`: does a page watching a job slow it? The same job (IDs against the fake API,
//! which answers after 1 ms) runs alone; with `highwater serve` on its state directory
//! polled every second for the page and each of its data endpoints, as an open page that
//! refreshes every second would be; and serving its own dashboard (`run --dashboard`, every
//! panel read from the store the run holds), polled the same way. The three alternate, round
//! by round. Per case: items/s (first call to last, median over the rounds) and the ratio
//! to alone.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use highwater::demo::api::{ApiConfig, FakeApi};

use super::{binary, finish_temp, id_of, loadavg, median, run_args, temp_dir, Args, Proc};

/// What an open page asks for at each refresh.
const PATHS: [&str; 6] = [
    "/",
    "/api/summary",
    "/api/history",
    "/api/buckets",
    "/api/failures",
    "/api/workers",
];

pub fn dashboard(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let bin = binary(args)?;
    let (guard, tmp) = temp_dir(args.keep)?;
    println!("# dashboard: {command}");
    println!(
        "# {} IDs, --concurrency {}, API answering after 1 ms; {} rounds; load {}",
        args.ids,
        args.concurrency,
        args.repeat,
        loadavg()
    );
    let ids: Vec<String> = (0..args.ids).map(id_of).collect();
    let input = tmp.join("ids.txt");
    std::fs::write(&input, ids.join("\n") + "\n")?;
    let cases = [Watch::Alone, Watch::Serve, Watch::Own];
    let mut speeds: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut polls = [0; 3];
    for round in 0..args.repeat {
        for (i, watch) in cases.iter().enumerate() {
            let state = tmp.join(format!("job-{round}-{i}"));
            let (speed, answered) = run(rt, &bin, args, &input, &state, *watch)?;
            eprintln!(
                "round {round}, {}: {speed:.0} items/s, {answered} page requests answered",
                watch.name()
            );
            speeds[i].push(speed);
            polls[i] += answered;
        }
    }
    let alone = median(&speeds[0]);
    println!();
    println!("| case | items/s (median) | ratio | per round |");
    println!("|---|---|---|---|");
    for (i, watch) in cases.iter().enumerate() {
        let m = median(&speeds[i]);
        let rounds: Vec<String> = speeds[i]
            .iter()
            .zip(&speeds[0])
            .map(|(s, a)| format!("{:.3}", s / a))
            .collect();
        println!(
            "| {} | {m:.0} | **{:.3}** | {} |",
            watch.name(),
            m / alone,
            rounds.join(", ")
        );
    }
    println!(
        "# page requests answered in all: {} through serve, {} by the run",
        polls[1], polls[2]
    );
    finish_temp(guard, &tmp);
    Ok(())
}

/// How a job is watched.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Watch {
    /// Not at all.
    Alone,
    /// By `serve` on its state directory (which reads what the run publishes).
    Serve,
    /// Through the dashboard the run serves itself.
    Own,
}

impl Watch {
    fn name(self) -> &'static str {
        match self {
            Watch::Alone => "alone",
            Watch::Serve => "watched by `serve`, polled every second",
            Watch::Own => "serving its own dashboard (`run --dashboard`), polled every second",
        }
    }
}

/// One job to its end, watched or not: its items/s and how many page requests were answered.
fn run(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    args: &Args,
    input: &Path,
    state: &Path,
    watch: Watch,
) -> Result<(f64, u64)> {
    let api = rt
        .block_on(FakeApi::start(ApiConfig {
            latency_min: Duration::from_millis(1),
            latency_max: Duration::from_millis(1),
            ..ApiConfig::fast()
        }))
        .context("starting the fake API")?;
    let job_log = state.with_extension("log");
    let free_addr = || -> Result<String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        Ok(format!("127.0.0.1:{port}"))
    };
    let mut job_args = run_args(Some(input), &api.url_template(), state, args.concurrency);
    let own = if watch == Watch::Own {
        let addr = free_addr()?;
        job_args.extend(["--dashboard".to_string(), addr.clone()]);
        Some(addr)
    } else {
        None
    };
    let mut job = Proc::spawn(bin, &job_args, &job_log)?;
    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut serve = None;
    if watch != Watch::Alone {
        // The page is opened once the job has made its state directory.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !state.join("live.json").exists() {
            if Instant::now() > deadline || job.reap(false)?.is_some() {
                bail!(
                    "the job made no live.json: {}",
                    std::fs::read_to_string(&job_log)?
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let addr = match own {
            Some(addr) => addr,
            None => {
                let addr = free_addr()?;
                let serve_args: Vec<String> = [
                    "serve",
                    "--state",
                    &state.display().to_string(),
                    "--addr",
                    &addr,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                serve = Some(Proc::spawn(
                    bin,
                    &serve_args,
                    &state.with_extension("serve.log"),
                )?);
                addr
            }
        };
        let (done, answered) = (done.clone(), answered.clone());
        rt.spawn(async move {
            let client = reqwest::Client::new();
            while !done.load(Ordering::Relaxed) {
                let tick = tokio::time::Instant::now();
                for path in PATHS {
                    let url = format!("http://{addr}{path}");
                    if let Ok(r) = client.get(&url).send().await {
                        if r.bytes().await.is_ok() {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                tokio::time::sleep_until(tick + Duration::from_secs(1)).await;
            }
        });
    }
    let exit = loop {
        if let Some(e) = job.reap(false)? {
            break e;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    done.store(true, Ordering::Relaxed);
    if let Some(mut s) = serve {
        s.kill()?;
    }
    if exit.code != Some(0) {
        bail!(
            "{} {}: {}",
            bin.display(),
            exit.describe(),
            std::fs::read_to_string(&job_log)?
        );
    }
    let times = api.call_times();
    let span = match (times.first(), times.last()) {
        (Some(a), Some(b)) if b > a => (*b - *a).as_secs_f64(),
        _ => bail!("no calls to time"),
    };
    Ok((
        api.total_calls() as f64 / span,
        answered.load(Ordering::Relaxed),
    ))
}
