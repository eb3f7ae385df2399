//! `throughput`: a bare hyper client loop (no storage), highwater's own HTTP client in the
//! same loop, and a full highwater run (sled store, group commit), alternating, in one
//! process, against the same fast fake API.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use highwater::demo::api::{ApiConfig, FakeApi};
use highwater::job::RunOptions;

use crate::args::Args;
use crate::in_process::{http_job, timed_run};
use crate::loops::{raw_client, raw_run, reqwest_run, Measured};
use crate::machine::{machine_facts, us_per, Baseline};
use crate::numbers::{median, mib, rate, thousands};
use crate::scratch::{finish_temp, temp_dir, write_input};

pub async fn throughput(args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let n = args.ids;
    let c = args.concurrency;
    let (guard, tmp) = temp_dir(args.keep)?;
    let input = tmp.join("ids.txt");
    let input_bytes = write_input(&input, n)?;
    let api = FakeApi::start(ApiConfig::fast())
        .await
        .context("starting the fake API")?;
    eprintln!(
        "fake API on http://{}; {} IDs in {} ({}); concurrency {c}; {} repetitions",
        api.addr(),
        thousands(n),
        input.display(),
        mib(input_bytes),
        args.repeat
    );

    let client = raw_client(c);
    // Untimed warm-up: every later run, raw or highwater, meets a server that has seen
    // every ID once (its call counter updates instead of inserting).
    let (warm, body_bytes) = raw_run(&client, &api, n, c).await?;
    eprintln!(
        "warm-up (raw, not in the table): {:.0} items/s",
        rate(n, warm.elapsed)
    );

    let mut raws = Vec::new();
    let mut reqs = Vec::new();
    let mut hws = Vec::new();
    for rep in 1..=args.repeat {
        let (raw, _) = raw_run(&client, &api, n, c).await?;
        eprintln!(
            "rep {rep}: raw       {:>9.0} items/s ({:.2} s, {:.1} us CPU/item)",
            rate(n, raw.elapsed),
            raw.elapsed.as_secs_f64(),
            us_per(raw.cpu, n)
        );
        let rq = reqwest_run(&api, n, c).await?;
        eprintln!(
            "rep {rep}: reqwest   {:>9.0} items/s ({:.2} s, {:.1} us CPU/item)",
            rate(n, rq.elapsed),
            rq.elapsed.as_secs_f64(),
            us_per(rq.cpu, n)
        );
        reqs.push(rq);
        let state = tmp.join(format!("state-{rep}"));
        let job = http_job(&api, &input, &state)?.options(RunOptions {
            concurrency: c,
            progress_interval: Duration::ZERO,
            ..RunOptions::default()
        });
        let hw = timed_run(job, &api, &state, n, args.keep).await?;
        eprintln!(
            "rep {rep}: highwater {:>9.0} items/s ({:.2} s, {:.1} us CPU/item), server calls {}; \
             {} store syncs ({:.0} ms in result syncs, {:.0} ms in plan syncs), {} waits for the writer",
            rate(n, hw.elapsed),
            hw.elapsed.as_secs_f64(),
            us_per(hw.cpu, n),
            thousands(hw.calls),
            hw.counters.store_syncs,
            hw.counters.result_sync_ns as f64 / 1e6,
            hw.counters.plan_sync_ns as f64 / 1e6,
            hw.counters.writer_backpressure,
        );
        raws.push(raw);
        hws.push(hw);
    }

    let raw_rates: Vec<f64> = raws.iter().map(|m: &Measured| rate(n, m.elapsed)).collect();
    let raw_cpu: Vec<f64> = raws.iter().map(|m| us_per(m.cpu, n)).collect();
    let hw_cpu: Vec<f64> = hws.iter().map(|h| us_per(h.cpu, n)).collect();
    let hw_rates: Vec<f64> = hws.iter().map(|h| rate(n, h.elapsed)).collect();
    let all_once = hws.iter().all(|h| h.calls == n);
    let mut out = String::new();
    writeln!(out, "\n## highwater throughput vs. a bare hyper client\n")?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- {} distinct IDs per run, {c} requests in flight, one process: the fake API \
         (`ApiConfig::fast()`: no latency, no faults), the client and highwater share one \
         tokio multi-thread runtime",
        thousands(n)
    )?;
    writeln!(
        out,
        "- raw: hyper-util legacy client, HTTP/1.1 keep-alive, `GET /items/<id>`, full body \
         read, nothing stored"
    )?;
    writeln!(
        out,
        "- highwater: the library's `Job` builder with the HTTP handler and a fresh sled state dir per run (open + plan + calls + \
         group commit: one sled flush per group of results), timed from opening the store \
         to the summary"
    )?;
    writeln!(
        out,
        "- reqwest: highwater's own HTTP client (`HttpHandler::attempt`: reqwest with rustls, \
         timeouts, the URL template, the body parsed as JSON) in the same bare loop, nothing \
         stored: the most any engine on this client could do"
    )?;
    writeln!(
        out,
        "- runs alternate raw, reqwest, highwater; {} rounds after one raw warm-up pass that is \
         not in the table; \"CPU per item\" is user + system time of the whole process (fake \
         API included) divided by the IDs\n",
        args.repeat
    )?;
    let rq_rates: Vec<f64> = reqs.iter().map(|m: &Measured| rate(n, m.elapsed)).collect();
    let rq_cpu: Vec<f64> = reqs.iter().map(|m| us_per(m.cpu, n)).collect();
    writeln!(
        out,
        "| run | raw hyper (items/s) | reqwest loop (items/s) | highwater (items/s) | reqwest / raw | highwater / raw | highwater / reqwest | CPU per item: raw, reqwest, highwater | exactly once |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")?;
    for (i, (r, h)) in raw_rates.iter().zip(&hws).enumerate() {
        let hr = rate(n, h.elapsed);
        let q = rq_rates[i];
        writeln!(
            out,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.1} / {:.1} / {:.1} µs | {} |",
            i + 1,
            thousands(*r as u64),
            thousands(q as u64),
            thousands(hr as u64),
            q / r,
            hr / r,
            hr / q,
            raw_cpu[i],
            rq_cpu[i],
            hw_cpu[i],
            if h.calls == n { "yes" } else { "**NO**" }
        )?;
    }
    let (mr, mq, mh) = (median(&raw_rates), median(&rq_rates), median(&hw_rates));
    writeln!(
        out,
        "| **median** | **{}** | **{}** | **{}** | **{:.2}** | **{:.2}** | **{:.2}** | **{:.1} / {:.1} / {:.1} µs** | {} |",
        thousands(mr as u64),
        thousands(mq as u64),
        thousands(mh as u64),
        mq / mr,
        mh / mr,
        mh / mq,
        median(&raw_cpu),
        median(&rq_cpu),
        median(&hw_cpu),
        if all_once { "yes" } else { "**NO**" }
    )?;
    let state = median(&hws.iter().map(|h| h.state_bytes as f64).collect::<Vec<_>>()) as u64;
    writeln!(
        out,
        "\nExactly-once check: each highwater run finished with {} ok and the server's call \
         count grew by exactly {} per run ({}); since every ID needs at least one call to be \
         ok, that is one call per ID.",
        thousands(n),
        thousands(n),
        if all_once { "passed" } else { "FAILED" }
    )?;
    writeln!(
        out,
        "State dir after a run: {} on disk ({:.0} bytes per ID; each result holds the API's \
         {:.0}-byte JSON body).",
        mib(state),
        state as f64 / n as f64,
        body_bytes as f64 / n as f64
    )?;
    print!("{out}");
    api.shutdown().await;
    finish_temp(guard, &tmp);
    if !all_once {
        bail!("the exactly-once check failed");
    }
    Ok(())
}
