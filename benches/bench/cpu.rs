//! `cpu`: the cost of an item on a fast API. nginx on 127.0.0.1 serves static JSON (one
//! worker, keep-alive without a request limit); the binary runs over the IDs with
//! `--concurrency N` beside `wrk -c N` on the same nginx, alternating. Reported: CPU per
//! item (user + system of the whole process, durable results included) and items/s against
//! wrk's requests/s, per round and the median.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::external::{run_binary, wrk, BinRun, WrkRun};
use super::{
    binary, finish_temp, loadavg, machine_facts, median, temp_dir, thousands, write_input, Args,
    Baseline, Proc,
};

/// What nginx answers to every request (the size of a small enrichment answer).
const BODY: &str = r#"{"id":"id-000000001","score":7,"tags":["a","b"],"country":"NO"}"#;

/// nginx as a child process serving [`BODY`] on a free loopback port; killed on drop.
pub struct Nginx {
    pub addr: SocketAddr,
    _proc: Proc,
}

impl Nginx {
    pub fn start(dir: &Path) -> Result<Nginx> {
        std::fs::create_dir_all(dir)?;
        // A free port: bound and let go (nginx binds it next; nothing else here races).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {dir}/nginx.pid;\n\
             error_log {dir}/error.log warn;\nevents {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 100000000;\n  \
             keepalive_timeout 300s;\n  server {{\n    listen {addr};\n    \
             location / {{ default_type application/json; return 200 '{BODY}'; }}\n  }}\n}}\n",
            dir = dir.display()
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let args = [
            "-p".to_string(),
            dir.display().to_string(),
            "-e".into(),
            dir.join("error.log").display().to_string(),
            "-c".into(),
            conf_path.display().to_string(),
        ];
        let mut proc = Proc::spawn(Path::new("nginx"), &args, &dir.join("nginx.out"))
            .context("starting nginx (apt-get install nginx)")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            if let Some(e) = proc.reap(false)? {
                bail!(
                    "nginx {}: {}",
                    e.describe(),
                    std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("nginx did not listen on {addr} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Nginx { addr, _proc: proc })
    }
}

struct Round {
    wrk: WrkRun,
    after: BinRun,
    before: Option<BinRun>,
}

pub fn cpu(args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let bin = binary(args)?;
    let (n, c) = (args.ids, args.concurrency);
    let (guard, tmp) = temp_dir(args.keep)?;
    let input = tmp.join("ids.txt");
    write_input(&input, n)?;
    let nginx = Nginx::start(&tmp.join("nginx"))?;
    let base = format!("http://{}/items/", nginx.addr);
    eprintln!(
        "nginx on {base}{{id}}; {} IDs; {c} in flight; binary {}",
        thousands(n),
        bin.display()
    );
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
            "round {round} (load {}): wrk {:.0} req/s, {:.1} µs CPU per request{}",
            loadavg(),
            wrk.requests_per_sec,
            wrk.cpu_per_request.as_secs_f64() * 1e6,
            wrk.errors
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
        let one = |label: &str, bin: &Path| -> Result<BinRun> {
            let state = tmp.join(format!("state-{label}-{round}"));
            let run = run_binary(bin, &input, &format!("{base}{{id}}"), &state, c, n, None)?;
            eprintln!(
                "round {round} (load {}): {label}: {:.0} items/s, {:.1} µs CPU per item ({:.1} system)",
                loadavg(),
                run.items_per_sec(n),
                run.exit.cpu.as_secs_f64() * 1e6 / n as f64,
                run.exit.sys.as_secs_f64() * 1e6 / n as f64
            );
            if !args.keep {
                let _ = std::fs::remove_dir_all(&state);
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
        rounds.push(Round { wrk, after, before });
    }
    drop(nginx);

    let mut out = String::new();
    writeln!(
        out,
        "\n## highwater CPU per item against nginx (static JSON), {c} in flight\n"
    )?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- nginx: one worker, `return 200` of {} bytes of JSON, keep-alive without a request \
         limit, no access log",
        BODY.len()
    )?;
    writeln!(
        out,
        "- per round: `wrk -t2 -c{c} -d{}s` on one URL, then `highwater run` (the binary, \
         {} IDs, `--concurrency {c} -q --progress-interval 0`, a fresh state dir, sync \
         durability){}; items/s = IDs / (exit − spawn), start-up included; CPU = user + \
         system of the whole process (`wait4`) / IDs\n",
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
            "| round | wrk (req/s) | wrk CPU per request | items/s | items/s ÷ wrk | CPU per item | of which system |"
        )?;
        writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut cols: [Vec<f64>; 6] = Default::default();
        for (i, (run, round)) in runs.iter().zip(&rounds).enumerate() {
            let w = round.wrk.requests_per_sec;
            let wc = round.wrk.cpu_per_request.as_secs_f64() * 1e6;
            let r = run.items_per_sec(n);
            let cpu = run.exit.cpu.as_secs_f64() * 1e6 / n as f64;
            let sys = run.exit.sys.as_secs_f64() * 1e6 / n as f64;
            for (k, v) in [w, wc, r, r / w, cpu, sys].into_iter().enumerate() {
                cols[k].push(v);
            }
            writeln!(
                out,
                "| {} | {} | {:.1} µs | {} | {:.3} | {:.1} µs | {:.1} µs |",
                i + 1,
                thousands(w as u64),
                wc,
                thousands(r as u64),
                r / w,
                cpu,
                sys
            )?;
        }
        let m: Vec<f64> = cols.iter().map(|v| median(v)).collect();
        writeln!(
            out,
            "| **median** | **{}** | **{:.1} µs** | **{}** | **{:.3}** | **{:.1} µs** | **{:.1} µs** |\n",
            thousands(m[0] as u64),
            m[1],
            thousands(m[2] as u64),
            m[3],
            m[4],
            m[5]
        )?;
        Ok(())
    };
    let after: Vec<&BinRun> = rounds.iter().map(|r| &r.after).collect();
    table(&mut out, &format!("highwater ({})", bin.display()), &after)?;
    if let Some(b) = &args.before {
        let before: Vec<&BinRun> = rounds.iter().filter_map(|r| r.before.as_ref()).collect();
        table(&mut out, &format!("before ({})", b.display()), &before)?;
    }
    let errors: Vec<String> = rounds.iter().filter_map(|r| r.wrk.errors.clone()).collect();
    if !errors.is_empty() {
        writeln!(out, "wrk reported: {}", errors.join(" | "))?;
    }
    print!("{out}");
    finish_temp(guard, &tmp);
    Ok(())
}
