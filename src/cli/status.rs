//! `highwater status`: where a job stands, as text or one JSON line, once or watched; a
//! live run's snapshot when a run holds the state directory.

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::args::StatusArgs;
use super::exit;
use super::state::{over_place, OverPlace, Tuning};
use crate::console::shell_path;
#[cfg(feature = "postgres")]
use crate::job::Crew;
use crate::job::{JobPlace, JobSpec, Look};
use crate::sink;
use crate::store::{JobView, Store, StoreStats};

pub(crate) async fn status(args: StatusArgs) -> Result<u8> {
    let (state, job) = (args.state.clone(), args.job.clone());
    over_place(&state, job.as_deref(), Tuning::default(), Status(args)).await
}

/// `status` of the job at a place.
struct Status(StatusArgs);

impl OverPlace for Status {
    async fn over<P: JobPlace + Clone + 'static>(self, place: P) -> Result<u8> {
        status_of(&place, &self.0).await
    }
}

/// `status` of the job at `place`, once or watched.
async fn status_of<P: JobPlace>(place: &P, args: &StatusArgs) -> Result<u8> {
    if !args.watch {
        let (text, _) = status_once(place, args).await?;
        let _ = io::stdout().lock().write_all(text.as_bytes());
        return Ok(exit::OK);
    }
    let clear = std::io::IsTerminal::is_terminal(&io::stdout()) && !args.json;
    loop {
        let (text, live) = status_once(place, args).await?;
        let mut out = io::stdout().lock();
        // Home the cursor and clear the screen: refresh in place.
        let home: &[u8] = if clear { b"\x1b[H\x1b[2J" } else { b"" };
        let written = out
            .write_all(home)
            .and_then(|()| out.write_all(text.as_bytes()))
            .and_then(|()| out.flush());
        drop(out);
        // Nobody reads any more (a closed pipe, `| head`): stop watching.
        if !live || written.is_err() {
            return Ok(exit::OK);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The status text (or JSON line), and whether a run is live.
async fn status_once<P: JobPlace>(place: &P, args: &StatusArgs) -> Result<(String, bool)> {
    let names = place.names();
    let now = crate::job::now_ms();
    let state = Path::new(&names.state);
    let state_text = names.state.clone();
    let (store, last) = match place.look().await? {
        Look::Free { store, last } | Look::Running { store, live: last } => (store, last),
        // A run holds the store: show what it publishes.
        Look::Held { pid, live } => {
            let Some(s) = live else {
                return Ok((
                    if args.json {
                        format!(
                            "{}\n",
                            serde_json::json!({"state": state_text, "runner": "starting", "pid": pid, "finished": false})
                        )
                    } else {
                        format!(
                            "{} is in use by a run (pid {}) that has not published a live snapshot yet\n",
                            state.display(),
                            pid.map_or("?".into(), |p| p.to_string())
                        )
                    },
                    true,
                ));
            };
            let runner = s.runner(now);
            let text = if args.json {
                format!(
                    "{}\n",
                    serde_json::json!({
                        "state": state_text,
                        "job_id": s.job_id,
                        "runner": runner,
                        "live": s,
                        "stats": s.stats(),
                        "finished": false,
                    })
                )
            } else {
                s.render(state, runner, now)
            };
            return Ok((text, true));
        }
    };
    let spec = crate::job::stored_job(&*store)
        .await?
        .with_context(|| names.unmade.clone())?;
    #[cfg(feature = "postgres")]
    if let Some(crew) = place.crew(&store).await? {
        return status_crew(&*store, &spec, state, args.json, crew).await;
    }
    // No run holds the store, and none can start until the look lets go of it. A runner
    // marks its snapshot finished before it lets go of the lock, so a snapshot not marked
    // finished means the last runner died.
    let died = last.filter(|s| !s.finished);
    let runner = match &died {
        Some(_) => "died",
        None => "none",
    };
    let text = describe(&*store, &spec, state, args.json, runner, died, None).await?;
    Ok((text, false))
}

/// A job's status from its store: text, or one JSON line. `died`: the last run's snapshot
/// when it died unfinished; `workers`: a shared job's worker sessions.
pub(crate) async fn describe<S: Store>(
    store: &S,
    spec: &JobSpec,
    state: &Path,
    json: bool,
    runner: &str,
    died: Option<crate::live::LiveSnapshot>,
    workers: Option<(serde_json::Value, String)>,
) -> Result<String> {
    use crate::live;
    let state_text = state.display().to_string();
    let stats = store.stats().await?;
    let bad = store.bad_lines(5).await?;
    let failures = sink::FailureSummary::of(store, FAILED_BUCKETS_SHOWN).await?;
    let kept = spec.kept_quotas();
    let quotas: Vec<_> = if kept.is_empty() {
        Vec::new()
    } else {
        let ledger = store.quota_ledger().await?;
        let now = crate::store::now_ms();
        kept.iter().map(|q| ledger.state(q, now)).collect()
    };
    let spend = spend_of(spec, &stats);
    let learned = store.learned_limits().await?;
    let mut reruns = Vec::new();
    for r in store.reruns().await? {
        reruns.push((store.rerun_stats(r.number).await?, r));
    }
    Ok(if json {
        let mut value = serde_json::json!({
            "state": state_text,
            "job_id": spec.job_id,
            "input": spec.input.path.display().to_string(),
            "input_format": spec.input.format.to_string(),
            "input_bytes": spec.fingerprint.len,
            "url": spec.work.request().map_or("", |r| r.url.as_str()),
            "method": spec.work.request().map_or("GET", |r| r.method.as_str()),
            "exec": spec.work.exec().map(|e| &e.command),
            // Definitions as written: never a value.
            "credentials": spec.credentials.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "bucket_size": spec.bucket_size,
            "runner": runner,
            "last_run": died,
            "stats": stats,
            "finished": stats.finished(),
            "bad_line_examples": bad,
            "failures": failures,
            "reruns": reruns.iter().map(|(s, r)| serde_json::json!({
                "number": r.number,
                "selection": super::rerun::flags(&r.selection),
                "created_at_ms": r.created_at_ms,
                "ids": r.ids,
                "ok": s.ok,
                "failed": s.failed,
                "pending": s.pending,
                "finished": s.finished(),
            })).collect::<Vec<_>>(),
            "spec_history": spec.history,
            "quotas": quotas,
            "learned_limits": learned,
            "spend": spend,
        });
        if let Some((w, _)) = &workers {
            value["workers"] = w.clone();
        }
        format!("{value}\n")
    } else {
        let mut text = String::new();
        if let Some(s) = &died {
            text.push_str(&format!(
                "the last run (pid {}, run {}, started {}) died without finishing; its last snapshot was at {}. \
                 The figures below are the store's: resume with `highwater run --state {}`\n",
                s.pid,
                s.run_id,
                live::format_ms(s.started_ms),
                live::format_ms(s.updated_ms),
                shell_path(state)
            ));
        }
        text.push_str(&render_status(state, spec, &stats, &bad));
        if let Some(spend) = &spend {
            text.push_str(&format!("spend:      {}\n", spend.render()));
        }
        text.push_str(&failures.render());
        for q in &quotas {
            text.push_str(&format!("quotas:     {}\n", q.render()));
        }
        for l in &learned {
            text.push_str(&format!("learnt:     API limit {}\n", l.render()));
        }
        for (s, r) in &reruns {
            text.push_str(&format!(
                "rerun {}:    {}: {} ok, {} failed, {} pending of {} IDs{}\n",
                r.number,
                super::rerun::flags(&r.selection),
                s.ok,
                s.failed,
                s.pending,
                r.ids,
                if s.finished() { "" } else { " (not finished)" }
            ));
        }
        for change in &spec.history {
            text.push_str(&format!("spec change: {change}\n"));
        }
        if let Some((_, w)) = &workers {
            text.push_str(w);
        }
        text
    })
}

/// What a priced job spent, from its store's figures: projected over the input's rows
/// (estimated from the part read while it is not read to its end).
fn spend_of(spec: &JobSpec, stats: &crate::store::StoreStats) -> Option<crate::meter::Spend> {
    let prices = spec.prices?;
    let total = if stats.input_exhausted {
        Some(stats.rows_read)
    } else {
        (stats.input_bytes_read > 0).then(|| {
            (stats.rows_read as f64 * spec.fingerprint.len as f64 / stats.input_bytes_read as f64)
                .round() as u64
        })
    };
    Some(crate::meter::Spend::new(
        prices,
        stats.usage,
        stats.rows_read.saturating_sub(stats.pending),
        total,
        spec.budget,
    ))
}

/// How many buckets committed with failures `status` lists (it counts them all).
const FAILED_BUCKETS_SHOWN: usize = 100;

fn render_status(
    state: &Path,
    spec: &JobSpec,
    s: &StoreStats,
    bad: &[crate::store::BadLine],
) -> String {
    let read = if s.input_exhausted {
        "read to the end".to_string()
    } else if spec.fingerprint.len > 0 {
        format!(
            "{:.1}% read",
            100.0 * s.input_bytes_read as f64 / spec.fingerprint.len as f64
        )
    } else {
        String::new()
    };
    let mut text = format!(
        "state:      {}\njob:        {}\ninput:      {} ({}), {} rows {}\n{}\n\
         buckets:    {} planned, {} committed, {} in flight (size {})\n\
         IDs:        {} ok, {} failed, {} pending of {} planned\n\
         duplicates: {}\nbad lines:  {}\nfinished:   {}\n",
        state.display(),
        spec.job_id,
        spec.input.path.display(),
        spec.input.format,
        s.rows_read,
        read,
        match (spec.work.exec(), spec.work.request()) {
            (Some(exec), _) => format!("exec:       {}", exec.command),
            (None, Some(r)) => format!("request:    {} {}", r.method, r.url),
            (None, None) => "request:    GET ".to_string(),
        },
        s.buckets_planned,
        s.buckets_committed,
        s.buckets_in_flight,
        spec.bucket_size,
        s.ok,
        s.failed,
        s.pending,
        s.ids_planned,
        s.duplicates,
        s.bad_lines,
        if s.finished() { "yes" } else { "no" },
    );
    if !s.usage.is_zero() {
        text.push_str(&format!("usage:      {}\n", s.usage));
    }
    // A Parquet file has rows, not lines: its bad rows are named by their 1-based row.
    let place = match spec.input.format {
        crate::input::InputFormat::Parquet { .. } => "bad row",
        _ => "bad line",
    };
    for b in bad {
        text.push_str(&format!("  {place} {}: {}\n", b.line, b.reason));
    }
    for c in &spec.credentials {
        text.push_str(&format!("credential: {c}\n"));
    }
    text
}

/// `status` of a job several workers share, with its workers.
#[cfg(feature = "postgres")]
async fn status_crew<S: Store>(
    store: &S,
    spec: &JobSpec,
    state: &Path,
    json: bool,
    crew: Crew,
) -> Result<(String, bool)> {
    let runner = if crew.running() { "running" } else { "none" };
    let rendered = (
        serde_json::json!(crew.workers),
        format!("{}{}", render_planning(&crew), render_workers(&crew)),
    );
    let mut text = describe(store, spec, state, json, runner, None, Some(rendered)).await?;
    if json {
        // Where planning stands, beside the workers.
        let mut value: serde_json::Value = serde_json::from_str(&text)?;
        value["planner"] = serde_json::json!(crew.planning);
        text = format!("{value}\n");
    }
    Ok((text, false))
}

/// Where planning stands, one line of `status`.
#[cfg(feature = "postgres")]
fn render_planning(crew: &Crew) -> String {
    let p = &crew.planning;
    let who = p.planner.as_deref().map_or(String::new(), |w| {
        format!(" (worker {})", &w[..8.min(w.len())])
    });
    match p.state {
        "done" => "planner:    the input is planned to its end\n".into(),
        "planning" => format!("planner:    planning{who}\n"),
        _ => "planner:    the job waits for a worker with the input to plan the rest \
              (start one with --input FILE)\n"
            .into(),
    }
}

/// The worker table of `status`.
#[cfg(feature = "postgres")]
fn render_workers(crew: &Crew) -> String {
    let workers = &crew.workers;
    let mut text = format!("workers:    {}\n", workers.len());
    for w in workers {
        let share = w
            .rate_share
            .map_or("-".to_string(), |r| format!("{r:.1}/s"));
        let rate = w
            .stats
            .get("items_per_s")
            .and_then(serde_json::Value::as_f64)
            .map_or("-".to_string(), |r| format!("{r:.1}"));
        text.push_str(&format!(
            "  {} {}:{} started {}, heartbeat {:.1}s ago, {}, {} buckets held, rate share {}, {} items/s\n",
            &w.worker[..8.min(w.worker.len())],
            w.host,
            w.pid,
            crate::live::format_ms(w.started_ms),
            w.heartbeat_age_s,
            w.state,
            w.buckets_held,
            share,
            rate,
        ));
    }
    text
}
