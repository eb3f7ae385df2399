//! `latency`: wide concurrency against a slow API. A server in this process answers every
//! request after a set delay (real enrichment APIs answer in 100 ms to 2 s, so
//! throughput is concurrency / latency); the binary runs with `--concurrency N` beside
//! `wrk -c N` on the same server, alternating. Reported: items/s against wrk's requests/s
//! and the ideal N / latency, and the binary's peak RSS (per item in flight).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::external::{run_binary, wrk, BinRun, WrkRun};
use super::{
    binary, finish_temp, kib_mib, loadavg, machine_facts, median, temp_dir, thousands, write_input,
    Args, Baseline, Proc,
};

/// The answer: a small JSON document, as an enrichment API's.
const BODY: &[u8] = br#"{"id":"id-000000001","score":7,"tags":["a","b"],"country":"NO"}"#;

/// A server answering every request with [`BODY`] after `delay`, holding as many
/// connections as the process may open; stops (every connection closed) when dropped.
struct SlowServer {
    addr: SocketAddr,
    calls: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowServer {
    async fn start(delay: Duration) -> Result<SlowServer> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind("127.0.0.1:0".parse().expect("an address"))?;
        // As deep as the kernel allows (somaxconn): thousands of clients connect at once.
        let listener = socket.listen(65535)?;
        let addr = listener.local_addr()?;
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.keep_alive(true);
            loop {
                tokio::select! {
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else {
                            // Out of descriptors: let connections end first.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let calls = counter.clone();
                        let service = hyper::service::service_fn(move |_req| {
                            calls.fetch_add(1, Ordering::Relaxed);
                            async move {
                                tokio::time::sleep(delay).await;
                                Ok::<_, Infallible>(
                                    hyper::Response::builder()
                                        .header("content-type", "application/json")
                                        .body(Full::new(Bytes::from_static(BODY)))
                                        .expect("a valid response"),
                                )
                            }
                        });
                        let conn = builder.serve_connection(TokioIo::new(stream), service);
                        conns.spawn(async move {
                            let _ = conn.await;
                        });
                    }
                }
            }
        });
        Ok(SlowServer { addr, calls, task })
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

impl Drop for SlowServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Round {
    wrk: WrkRun,
    after: BinRun,
    before: Option<BinRun>,
    /// Peak RSS of the bare client loop (KiB).
    bare_rss_kib: u64,
}

/// The hidden mode this example re-runs itself in for [`bare_client_rss`].
pub const REQWEST_LOOP: &str = "__reqwest-loop";

/// `__reqwest-loop URL-TEMPLATE IDS CONCURRENCY`: highwater's HTTP client alone
/// (`Handler::attempt`, nothing stored) over the IDs, in a process of its own.
pub fn reqwest_loop_child(args: &[String]) -> std::process::ExitCode {
    let run = || -> Result<()> {
        let [url, n, c] = args else {
            bail!("usage: {REQWEST_LOOP} URL-TEMPLATE IDS CONCURRENCY");
        };
        highwater::os::open_files_for(c.parse::<u64>()?).context("open files")?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        rt.block_on(super::reqwest_loop(url.clone(), n.parse()?, c.parse()?))?;
        Ok(())
    };
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Peak RSS (KiB) of highwater's HTTP client alone, `concurrency` calls in flight over `n`
/// IDs: what the client costs per connection, whatever the engine does.
fn bare_client_rss(url: &str, n: u64, concurrency: usize, log: &Path) -> Result<u64> {
    let me = std::env::current_exe().context("finding this executable")?;
    let args = [
        REQWEST_LOOP.to_string(),
        url.to_string(),
        n.to_string(),
        concurrency.to_string(),
    ];
    let mut proc = Proc::spawn(&me, &args, log)?;
    let exit = loop {
        if let Some(e) = proc.reap(true)? {
            break e;
        }
    };
    if exit.code != Some(0) {
        bail!(
            "the bare client loop: {}: {}",
            exit.describe(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    Ok(exit.max_rss_kib)
}

pub fn latency(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let bin = binary(args)?;
    let (n, c) = (args.ids, args.concurrency);
    // The server holds wrk's and the binary's connections, one side at a time.
    highwater::os::open_files_for(c as u64 + 1000)
        .context("raising this process's open-file limit for the server")?;
    let (guard, tmp) = temp_dir(args.keep)?;
    let input = tmp.join("ids.txt");
    write_input(&input, n)?;
    let server = rt.block_on(SlowServer::start(args.latency))?;
    let base = format!("http://{}/items/", server.addr);
    let ideal = c as f64 / args.latency.as_secs_f64();
    eprintln!(
        "server on {base}{{id}} answering after {} ms; {} IDs; {c} in flight; ideal {:.0}/s; binary {}",
        args.latency.as_millis(),
        thousands(n),
        ideal,
        bin.display()
    );
    let counted = || server.calls();
    let counted: &dyn Fn() -> u64 = &counted;
    let mut rounds = Vec::new();
    for round in 1..=args.repeat {
        let wrk = wrk(
            2,
            c,
            args.wrk_secs,
            &format!("{base}id-000000001"),
            &tmp.join(format!("wrk-{round}.log")),
        )?;
        eprintln!(
            "round {round} (load {}): wrk {:.0} req/s{}",
            loadavg(),
            wrk.requests_per_sec,
            wrk.errors
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
        let one = |label: &str, bin: &Path| -> Result<BinRun> {
            let run = run_binary(
                bin,
                &input,
                &format!("{base}{{id}}"),
                &tmp.join(format!("state-{label}-{round}")),
                c,
                n,
                Some(counted),
            )?;
            if run.calls != Some(n) {
                bail!(
                    "{label}: the server counted {:?} calls for {n} IDs",
                    run.calls
                );
            }
            eprintln!(
                "round {round} (load {}): {label}: {:.0} items/s ({:.0}/s steady), peak RSS {}, {:.1} µs CPU per item",
                loadavg(),
                run.items_per_sec(n),
                run.steady.unwrap_or(0.0),
                kib_mib(run.exit.max_rss_kib),
                run.exit.cpu.as_secs_f64() * 1e6 / n as f64
            );
            if !args.keep {
                let _ = std::fs::remove_dir_all(tmp.join(format!("state-{label}-{round}")));
            }
            Ok(run)
        };
        // Which binary runs first alternates: the run right after wrk was measured slower
        // (a median of 30.7 µs per item against 26.0 second, whichever binary it was).
        let baseline = |one: &dyn Fn(&str, &Path) -> Result<BinRun>| {
            args.before.as_deref().map(|b| one("before", b)).transpose()
        };
        let (after, before) = if round % 2 == 1 {
            let after = one("highwater", &bin)?;
            (after, baseline(&one)?)
        } else {
            let before = baseline(&one)?;
            (one("highwater", &bin)?, before)
        };
        let bare_rss_kib = bare_client_rss(
            &format!("{base}{{id}}"),
            (c as u64 * 10).min(n),
            c,
            &tmp.join(format!("bare-{round}.log")),
        )?;
        eprintln!(
            "round {round} (load {}): highwater's HTTP client alone: peak RSS {}",
            loadavg(),
            kib_mib(bare_rss_kib)
        );
        rounds.push(Round {
            wrk,
            after,
            before,
            bare_rss_kib,
        });
    }
    drop(server);

    let mut out = String::new();
    writeln!(
        out,
        "\n## highwater against a slow API: {c} in flight, {} ms latency\n",
        args.latency.as_millis()
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- server: hyper 1 HTTP/1.1 keep-alive in this process, every answer ({} bytes of \
         JSON) after {} ms; ideal = {c} / {} ms = {:.0}/s",
        BODY.len(),
        args.latency.as_millis(),
        args.latency.as_millis(),
        ideal
    )?;
    writeln!(
        out,
        "- per round: `wrk -t2 -c{c} -d{}s` on one URL, then `highwater run` (the binary, \
         {} IDs, `--concurrency {c} -q --progress-interval 0`, a fresh state dir){}; \
         items/s = IDs / (exit − spawn), start-up and tail included; steady = calls at the \
         server between 10% and 90% of the IDs; peak RSS = `ru_maxrss` from wait4\n",
        args.wrk_secs,
        thousands(n),
        if args.before.is_some() {
            " and the --before binary likewise, in turn first (odd rounds: this binary first)"
        } else {
            ""
        }
    )?;
    let table = |out: &mut String, label: &str, runs: &[&BinRun]| -> Result<()> {
        writeln!(out, "{label}:\n")?;
        writeln!(
            out,
            "| round | wrk (req/s) | items/s | steady items/s | items/s ÷ wrk | steady ÷ wrk | ÷ ideal | peak RSS | per item in flight | CPU per item |"
        )?;
        writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut cols: [Vec<f64>; 7] = Default::default();
        for (i, (run, round)) in runs.iter().zip(&rounds).enumerate() {
            let w = round.wrk.requests_per_sec;
            let r = run.items_per_sec(n);
            let s = run.steady.unwrap_or(0.0);
            let rss = run.exit.max_rss_kib as f64;
            let cpu = run.exit.cpu.as_secs_f64() * 1e6 / n as f64;
            for (k, v) in [w, r, s, r / w, s / w, rss, cpu].into_iter().enumerate() {
                cols[k].push(v);
            }
            writeln!(
                out,
                "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {} | {:.1} KiB | {:.1} µs |",
                i + 1,
                thousands(w as u64),
                thousands(r as u64),
                thousands(s as u64),
                r / w,
                s / w,
                r / ideal,
                kib_mib(rss as u64),
                rss / c as f64,
                cpu
            )?;
        }
        let m: Vec<f64> = cols.iter().map(|v| median(v)).collect();
        writeln!(
            out,
            "| **median** | **{}** | **{}** | **{}** | **{:.3}** | **{:.3}** | **{:.3}** | **{}** | **{:.1} KiB** | **{:.1} µs** |\n",
            thousands(m[0] as u64),
            thousands(m[1] as u64),
            thousands(m[2] as u64),
            m[3],
            m[4],
            m[1] / ideal,
            kib_mib(m[5] as u64),
            m[5] / c as f64,
            m[6]
        )?;
        Ok(())
    };
    let after: Vec<&BinRun> = rounds.iter().map(|r| &r.after).collect();
    table(&mut out, &format!("highwater ({})", bin.display()), &after)?;
    if let Some(b) = &args.before {
        let before: Vec<&BinRun> = rounds.iter().filter_map(|r| r.before.as_ref()).collect();
        table(&mut out, &format!("before ({})", b.display()), &before)?;
    }
    let bare: Vec<f64> = rounds.iter().map(|r| r.bare_rss_kib as f64).collect();
    writeln!(
        out,
        "highwater's HTTP client alone (`Handler::attempt` in a bare loop of {c} tasks, \
         nothing stored, {} IDs, a process of its own): peak RSS {} (median; rounds: {}), \
         {:.1} KiB per connection\n",
        thousands((c as u64 * 10).min(n)),
        kib_mib(median(&bare) as u64),
        bare.iter()
            .map(|k| kib_mib(*k as u64))
            .collect::<Vec<_>>()
            .join(", "),
        median(&bare) / c as f64
    )?;
    let errors: Vec<String> = rounds.iter().filter_map(|r| r.wrk.errors.clone()).collect();
    if !errors.is_empty() {
        writeln!(out, "wrk reported: {}", errors.join(" | "))?;
    }
    print!("{out}");
    finish_temp(guard, &tmp);
    Ok(())
}
