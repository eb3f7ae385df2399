//! `dashboard`: does a page watching a job slow it? The same job (IDs against the fake API,
//! which answers after 1 ms) runs alone, and with `highwater serve` on its state directory
//! polled every second for the page and each of its data endpoints, as an open page that
//! refreshes every second would be; the two alternate, round by round. Per case: items/s
//! (first call to last, median over the rounds) and the ratio watched ÷ alone.

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
    let (mut alone, mut watched) = (Vec::new(), Vec::new());
    let mut polls = 0;
    for round in 0..args.repeat {
        for watch in [false, true] {
            let state = tmp.join(format!("job-{round}-{watch}"));
            let (speed, answered) = run(rt, &bin, args, &input, &state, watch)?;
            eprintln!(
                "round {round}, {}: {speed:.0} items/s{}",
                if watch { "watched" } else { "alone" },
                if watch {
                    format!(", {answered} page requests answered")
                } else {
                    String::new()
                }
            );
            if watch {
                watched.push(speed);
                polls += answered;
            } else {
                alone.push(speed);
            }
        }
    }
    let (a, w) = (median(&alone), median(&watched));
    println!();
    println!("| case | items/s (median) | ratio |");
    println!("|---|---|---|");
    println!("| alone | {a:.0} | 1.000 |");
    println!(
        "| watched by `serve`, polled every second | {w:.0} | **{:.3}** |",
        w / a
    );
    println!("# {polls} page requests answered in all");
    finish_temp(guard, &tmp);
    Ok(())
}

/// One job to its end, watched or not: its items/s and how many page requests were answered.
fn run(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    args: &Args,
    input: &Path,
    state: &Path,
    watch: bool,
) -> Result<(f64, u64)> {
    let api = rt
        .block_on(FakeApi::start(ApiConfig {
            latency_min: Duration::from_millis(1),
            latency_max: Duration::from_millis(1),
            ..ApiConfig::fast()
        }))
        .context("starting the fake API")?;
    let job_log = state.with_extension("log");
    let mut job = Proc::spawn(
        bin,
        &run_args(Some(input), &api.url_template(), state, args.concurrency),
        &job_log,
    )?;
    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut serve = None;
    if watch {
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
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
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
