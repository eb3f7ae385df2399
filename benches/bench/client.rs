//! `client`: what each reqwest setting costs per request. The same loop (`concurrency`
//! tasks, GET, whole body read) runs against nginx with clients built one setting apart,
//! alternating, `--repeat` rounds; CPU per request is this process's user + system time
//! (nginx runs apart) over the requests.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use super::cpu::Nginx;
use super::{
    finish_temp, id_of, loadavg, machine_facts, median, process_cpu, temp_dir, thousands, Args,
    Baseline,
};

/// A client setting and how to build a client with it.
type Variant = (&'static str, fn() -> reqwest::ClientBuilder);

/// The settings compared, each one setting apart from highwater's client at aaa7d89.
fn variants() -> Vec<Variant> {
    fn highwater() -> reqwest::ClientBuilder {
        // As src/handler.rs built it at aaa7d89.
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true)
            .retry(reqwest::retry::never())
            .user_agent("highwater/bench")
    }
    vec![
        ("highwater's client at aaa7d89", highwater),
        ("+ no_proxy()", || highwater().no_proxy()),
        ("+ redirect(Policy::none())", || {
            highwater().redirect(reqwest::redirect::Policy::none())
        }),
        ("+ http1_only()", || highwater().http1_only()),
        ("+ pool_max_idle_per_host(usize::MAX)", || {
            highwater().pool_max_idle_per_host(usize::MAX)
        }),
        ("− timeout(30 s) (no timer per request)", || {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .pool_max_idle_per_host(1024)
                .tcp_nodelay(true)
                .retry(reqwest::retry::never())
                .user_agent("highwater/bench")
        }),
    ]
}

/// `n` GETs from `concurrency` tasks; the CPU this process spent.
async fn run(client: &reqwest::Client, base: &str, n: u64, concurrency: usize) -> Result<Duration> {
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let cpu = process_cpu();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next, errors, base) = (
            client.clone(),
            next.clone(),
            errors.clone(),
            base.to_string(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let ok = match client.get(format!("{base}{}", id_of(i))).send().await {
                    Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if !ok {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| anyhow!("client task: {e}"))?;
    }
    let errors = errors.load(Ordering::Relaxed);
    if errors > 0 {
        bail!("{errors} requests failed");
    }
    Ok(process_cpu().saturating_sub(cpu))
}

pub fn client(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let (n, c) = (args.ids, args.concurrency);
    let (guard, tmp) = temp_dir(args.keep)?;
    let nginx = Nginx::start(&tmp.join("nginx"))?;
    let base = format!("http://{}/items/", nginx.addr);
    let variants = variants();
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 1..=args.repeat {
        for (k, (label, build)) in variants.iter().enumerate() {
            let client = build().build()?;
            // Connections opened untimed.
            rt.block_on(run(&client, &base, c as u64 * 4, c))?;
            let spent = rt.block_on(run(&client, &base, n, c))?;
            let us = spent.as_secs_f64() * 1e6 / n as f64;
            eprintln!("round {round} (load {}): {label}: {us:.2} µs", loadavg());
            cpu[k].push(us);
        }
    }
    drop(nginx);
    let mut out = String::new();
    writeln!(
        out,
        "\n## reqwest settings: CPU per request against nginx\n"
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- per variant and round: a fresh client, {} untimed requests to open its connections, \
         then {} GETs from {c} tasks (body read whole); CPU = this process's user + system \
         time (nginx runs apart) / requests; variants alternate; {} rounds\n",
        thousands(c as u64 * 4),
        thousands(n),
        args.repeat
    )?;
    writeln!(
        out,
        "| client | CPU per request (median) | vs. the first | rounds |"
    )?;
    writeln!(out, "|---|---:|---:|---|")?;
    let first = median(&cpu[0]);
    for ((label, _), v) in variants.iter().zip(&cpu) {
        let m = median(v);
        writeln!(
            out,
            "| {label} | {m:.2} µs | {:+.1}% | {} |",
            100.0 * (m / first - 1.0),
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    print!("{out}");
    finish_temp(guard, &tmp);
    Ok(())
}
