//! Monitor: the watcher beside a running job, reporting on it everywhere users look.
//!
//! Owns the task that, from `Counters` and the store's figures taken once at the start
//! (never a store scan during the run), drives the terminal bar, the progress events every
//! `--progress-interval` and at the end (human lines or JSON), the falling-behind warning,
//! the live snapshot (`DIR/live.json`) once a second, and the job's history
//! (`DIR/history.log`, see [`crate::history`]) every `--history-interval`; the live speed
//! and the ETA over the last minute (beside the run's average); and the background count of
//! the input's rows that gives the bar its total and the ETA.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::console::{self, Bar};
use futures_util::future::BoxFuture;

use crate::clock::Clock;
use crate::history::{HistoryFile, Record, RunStart, Sampler};
use crate::input::{Cursor, InputReader, InputSpec};
use crate::live::{self, LiveSnapshot};
use crate::progress::{
    self, per_second, CounterSnapshot, Counters, Durations, IntervalLoad, JobFigures, ProgressEvent,
};
use crate::store::StoreStats;

/// How progress events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventFormat {
    /// A human line through the log.
    #[default]
    Text,
    /// One JSON object per line on standard error.
    Json,
}

/// What the monitor of a run is told at the start.
pub(crate) struct MonitorConfig {
    /// The job's input, whose rows are counted in the background for the total and the ETA.
    pub(crate) input: InputSpec,
    /// The directory `live.json` is published in (`status` reads it); `None`: not published.
    pub(crate) state: Option<PathBuf>,
    /// Time between progress events.
    pub(crate) interval: Duration,
    /// How progress events are written.
    pub(crate) format: EventFormat,
    /// Show the terminal bar (standard error is a terminal and not `-q`). Built without the
    /// feature `progress-bar`, no bar is shown and progress events are written instead.
    pub(crate) bar: bool,
    /// The run's concurrency cap, for the falling-behind diagnosis.
    pub(crate) concurrency: usize,
    /// `--rate`, if given.
    pub(crate) configured_rate: Option<f64>,
    /// How often a sample of the run goes to the job's history (`DIR/history.log`, beside
    /// `live.json`; zero: no history).
    pub(crate) history_interval: Duration,
    /// The job's spec as stored, for the history's record of the run's start.
    pub(crate) spec: serde_json::Value,
    /// Where the history goes without a state directory (a PostgreSQL job's store).
    pub(crate) history_sink: Option<HistorySink>,
}

/// Keeps a record of the job's history (as JSON) somewhere other than a state directory;
/// the future it returns ends when the record is kept.
pub(crate) type HistorySink =
    Arc<dyn Fn(serde_json::Value) -> BoxFuture<'static, ()> + Send + Sync>;

/// What the monitor, the metrics endpoint and the end of the run share.
pub(crate) struct RunView {
    /// The run's live counters.
    pub(crate) counters: Arc<Counters>,
    /// The store's figures when the run started.
    pub(crate) start: StoreStats,
    /// The job's id, stable across runs.
    pub(crate) job_id: String,
    /// This run's id, new each start.
    pub(crate) run_id: String,
    /// When the run started, for rates and elapsed times.
    pub(crate) started: Instant,
    /// When the run started, in Unix milliseconds.
    pub(crate) started_ms: u64,
    /// This worker among the job's (a shared store's session), for the metrics' `worker`
    /// label; `None` for a job with one worker at a time.
    pub(crate) worker: Option<String>,
    /// Where the run serves the job's dashboard (`host:port`), if it does.
    pub(crate) dashboard: Option<String>,
    /// The job's prices and budget, if it is priced: its spend is reported.
    pub(crate) pricing: Option<(crate::meter::Prices, Option<crate::meter::Money>)>,
    /// Rows in the whole input, once counted (`u64::MAX` until then).
    total_rows: AtomicU64,
    /// The run's wall clock: what snapshots, samples and events are stamped with.
    pub(crate) clock: Clock,
}

impl RunView {
    /// The view of a run starting now from `start`, with a new run id; the input's total is known only if `start` read it to its end.
    pub(crate) fn new(
        counters: Arc<Counters>,
        start: StoreStats,
        job_id: String,
        clock: Clock,
    ) -> RunView {
        let total = if start.input_exhausted {
            start.rows_read
        } else {
            u64::MAX
        };
        RunView {
            counters,
            start,
            job_id,
            run_id: new_run_id(clock.now_ms()),
            started: Instant::now(),
            started_ms: clock.now_ms(),
            worker: None,
            dashboard: None,
            pricing: None,
            total_rows: AtomicU64::new(total),
            clock,
        }
    }

    /// The view of one worker of a shared job ([`RunView::worker`]).
    pub(crate) fn with_worker(self, worker: Option<String>) -> RunView {
        RunView { worker, ..self }
    }

    /// The view of a run of a job with `prices` (and `budget`): its spend is reported.
    pub(crate) fn with_prices(
        self,
        prices: Option<crate::meter::Prices>,
        budget: Option<crate::meter::Money>,
    ) -> RunView {
        RunView {
            pricing: prices.map(|p| (p, budget)),
            ..self
        }
    }

    /// The job's spend at `f`, if it is priced: projected over the input's rows once counted.
    pub(crate) fn spend(&self, f: &JobFigures) -> Option<crate::meter::Spend> {
        let (prices, budget) = self.pricing?;
        Some(crate::meter::Spend::new(
            prices,
            f.usage,
            f.rows_done,
            self.total_rows(),
            budget,
        ))
    }

    /// The view of a run that serves the job's dashboard at `addr`.
    pub(crate) fn with_dashboard(self, addr: Option<String>) -> RunView {
        RunView {
            dashboard: addr,
            ..self
        }
    }

    /// Rows in the whole input, once counted; none before.
    pub(crate) fn total_rows(&self) -> Option<u64> {
        Some(self.total_rows.load(Relaxed)).filter(|n| *n != u64::MAX)
    }

    /// Job-wide figures: the store's at the start plus `run`.
    pub(crate) fn figures(&self, run: &CounterSnapshot) -> JobFigures {
        JobFigures::new(&self.start, run)
    }

    /// Where the run stood when it started, as a [`Sample`].
    fn start_sample(&self) -> Sample {
        Sample {
            at: self.started,
            done: 0,
            rows_done: self.figures(&CounterSnapshot::default()).rows_done,
        }
    }

    /// The speed at `run` (its figures `f`): over the window since `since` (the run's
    /// start when `None`) and over the whole run, and the ETA at the window's speed. Both
    /// count IDs (rows), whatever pages they have: see [`JobFigures::eta`].
    fn speed(&self, run: &CounterSnapshot, f: &JobFigures, since: Option<&Sample>) -> Speed {
        let start = self.start_sample();
        let since = since.unwrap_or(&start);
        let window = since.at.elapsed();
        let rows_per_second = per_second(f.rows_done.saturating_sub(since.rows_done), window);
        // The quotas' waits are part of the time left: at the least, what their windows
        // take to free the calls the rows left will make.
        let quotas = self.counters.quota_states();
        let eta_seconds = match (f.eta(self.total_rows(), rows_per_second), quotas.is_empty()) {
            (eta, true) => eta,
            (eta, false) => self.total_rows().and_then(|total| {
                let left = calls_left(total.saturating_sub(f.rows_done), run);
                let wait = crate::quota::least_wait(&quotas, left, self.clock.now_ms())?;
                Some(eta.unwrap_or(0).max(wait))
            }),
        };
        Speed {
            items_per_second: per_second(run.done().saturating_sub(since.done), window),
            average_items_per_second: per_second(run.done(), self.started.elapsed()),
            eta_seconds,
        }
    }

    /// The live snapshot now, with the speed over the window since `since`.
    fn snapshot(
        &self,
        run: &CounterSnapshot,
        since: Option<&Sample>,
        finished: Option<&str>,
    ) -> LiveSnapshot {
        let f = self.figures(run);
        let speed = self.speed(run, &f, since);
        LiveSnapshot {
            pid: std::process::id(),
            job_id: self.job_id.clone(),
            run_id: self.run_id.clone(),
            started_ms: self.started_ms,
            updated_ms: self.clock.now_ms(),
            finished: finished.is_some(),
            outcome: finished.map(str::to_string),
            items_per_second: speed.items_per_second,
            average_items_per_second: speed.average_items_per_second,
            effective_rate: self.counters.effective_rate(),
            eta_seconds: speed.eta_seconds,
            ok: f.ok,
            failed: f.failed,
            pending: f.pending,
            buckets_committed: f.buckets_committed,
            buckets_planned: f.buckets_planned,
            rows_read: f.rows_read,
            input_rows: self.total_rows(),
            run_ok: run.ok,
            run_failed: run.failed,
            retries: run.retries,
            pages: run.pages,
            throttled: run.throttled,
            in_flight: run.in_flight,
            quotas: self.counters.quota_states(),
            announced: self.counters.announced_states(),
            dashboard: self.dashboard.clone(),
            usage: f.usage,
            spend: self.spend(&f),
        }
    }
}

/// How fast a run goes.
struct Speed {
    /// Items finished per second over the last [`WINDOW`] (less early in the run).
    items_per_second: f64,
    /// Items finished per second over the whole run.
    average_items_per_second: f64,
    /// Seconds until the input's rows are all settled, at the window's speed.
    eta_seconds: Option<u64>,
}

/// The span the live speed and the ETA are measured over.
const WINDOW: Duration = Duration::from_secs(60);

/// How far a run had come at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    /// Items this run finished.
    done: u64,
    /// Job-wide rows settled.
    rows_done: u64,
}

/// A run id: the start time (`now_ms`) and some randomness, in hex.
fn new_run_id(now_ms: u64) -> String {
    format!("{:x}-{:08x}", now_ms, rand::random::<u32>())
}

/// The running monitor; [`Monitor::finish`] writes the last event and snapshot.
pub(crate) struct Monitor {
    view: Arc<RunView>,
    config: Arc<MonitorConfig>,
    task: tokio::task::JoinHandle<State>,
    stop: Arc<tokio::sync::Notify>,
    counting: Arc<AtomicBool>,
}

/// The monitor task's memory between ticks.
struct State {
    last: CounterSnapshot,
    last_at: Instant,
    bar: Option<Bar>,
    /// Samples about a second apart; the first is the newest at least [`WINDOW`] old (or the
    /// run's start): the live speed is measured from it.
    window: VecDeque<Sample>,
    /// Intervals in a row below the `--rate` (idle intervals not counted).
    behind: progress::Sustained,
    /// The job's history, while it can be written.
    history: Option<History>,
}

/// The history being written by this run.
struct History {
    target: Target,
    sampler: Sampler,
    last: Instant,
}

/// Where this run's history goes.
enum Target {
    /// `DIR/history.log`.
    File(HistoryFile),
    Sink(HistorySink),
}

impl Target {
    /// Keep `record`: at once in the file (an error: it can no longer be written), or the
    /// sink's future.
    fn write(&mut self, record: &Record) -> std::io::Result<Option<BoxFuture<'static, ()>>> {
        match self {
            Target::File(file) => file.append(record).map(|()| None),
            Target::Sink(sink) => Ok(Some(sink(
                serde_json::to_value(record).expect("history records serialize"),
            ))),
        }
    }
}

impl History {
    /// Open the history (the state directory's file, else the sink) and note the run's
    /// start; `None` (said in the debug log) when the history is off or cannot be written.
    fn start(view: &RunView, config: &MonitorConfig) -> Option<History> {
        if config.history_interval.is_zero() {
            return None;
        }
        let target = match (&config.state, &config.history_sink) {
            (Some(dir), _) => match HistoryFile::open(dir) {
                Ok(file) => Target::File(file),
                Err(e) => {
                    tracing::debug!("cannot write the job's history in {}: {e}", dir.display());
                    return None;
                }
            },
            (None, Some(sink)) => Target::Sink(sink.clone()),
            (None, None) => return None,
        };
        let mut history = History {
            target,
            sampler: Sampler::new(
                view.run_id.clone(),
                view.worker.clone(),
                config.configured_rate,
            ),
            last: Instant::now(),
        };
        let start = Record::Run(RunStart {
            run_id: view.run_id.clone(),
            started_ms: view.started_ms,
            pid: std::process::id(),
            worker: view.worker.clone(),
            spec: config.spec.clone(),
        });
        match history.target.write(&start) {
            Ok(keep) => {
                if let Some(keep) = keep {
                    tokio::spawn(keep);
                }
                Some(history)
            }
            Err(e) => {
                tracing::debug!("cannot write the job's history: {e}");
                None
            }
        }
    }

    /// A sample of `run`, and the future that keeps it, if any; an error when the history
    /// can no longer be written.
    fn sample(
        &mut self,
        view: &RunView,
        run: &CounterSnapshot,
    ) -> std::io::Result<Option<BoxFuture<'static, ()>>> {
        self.last = Instant::now();
        let sample = self.sampler.sample(
            &view.counters,
            run,
            &view.figures(run),
            view.total_rows(),
            view.clock.now_ms(),
        );
        self.target.write(&Record::Sample(sample)).inspect_err(|e| {
            tracing::debug!("cannot write the job's history: {e}");
        })
    }
}

impl State {
    /// Note where the run stands, at most once a second.
    fn sample(&mut self, view: &RunView, run: &CounterSnapshot) {
        if self
            .window
            .back()
            .is_some_and(|s| s.at.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.window.push_back(Sample {
            at: Instant::now(),
            done: run.done(),
            rows_done: view.figures(run).rows_done,
        });
        while self.window.get(1).is_some_and(|s| s.at.elapsed() >= WINDOW) {
            self.window.pop_front();
        }
    }

    /// Where the window starts.
    fn since(&self) -> Option<&Sample> {
        self.window.front()
    }
}

impl Monitor {
    /// Start the monitor's tasks (events, bar, live snapshot, history) for the run `view` shows.
    pub(crate) fn start(view: Arc<RunView>, config: MonitorConfig) -> Monitor {
        let config = Arc::new(config);
        let counting = Arc::new(AtomicBool::new(true));
        if view.total_rows().is_none() {
            count_rows(view.clone(), config.input.clone(), counting.clone());
        }
        let stop = Arc::new(tokio::sync::Notify::new());
        let state = State {
            last: view.counters.snapshot(),
            last_at: Instant::now(),
            bar: config.bar.then(Bar::show).flatten(),
            window: VecDeque::from([view.start_sample()]),
            behind: progress::Sustained::default(),
            history: History::start(&view, &config),
        };
        let task = tokio::spawn(watch(view.clone(), config.clone(), state, stop.clone()));
        Monitor {
            view,
            config,
            task,
            stop,
            counting,
        }
    }

    /// The run ended: the last progress event, and the snapshot marked finished with
    /// `outcome`. The bar is cleared.
    pub(crate) async fn finish(self, outcome: &str) {
        self.counting.store(false, Relaxed);
        self.stop.notify_one();
        let run = self.view.counters.snapshot();
        match self.task.await {
            Ok(mut state) => {
                state.bar = None;
                if let Some(Ok(Some(keep))) =
                    state.history.as_mut().map(|h| h.sample(&self.view, &run))
                {
                    keep.await;
                }
                if !self.config.interval.is_zero() {
                    report(&self.view, &self.config, &mut state, &run, true);
                }
                publish(&self.view, &self.config, &run, state.since(), Some(outcome));
            }
            // The task panicked (its bar is gone with it): the snapshot must still say the
            // run ended, or `status` would take the run for dead.
            Err(e) => {
                tracing::debug!("the monitor task failed: {e}");
                publish(&self.view, &self.config, &run, None, Some(outcome));
            }
        }
    }
}

fn publish(
    view: &RunView,
    config: &MonitorConfig,
    run: &CounterSnapshot,
    since: Option<&Sample>,
    finished: Option<&str>,
) {
    let Some(state) = &config.state else {
        return;
    };
    if let Err(e) = live::publish(state, &view.snapshot(run, since, finished)) {
        tracing::debug!("cannot write {}: {e}", live::path(state).display());
    }
}

async fn watch(
    view: Arc<RunView>,
    config: Arc<MonitorConfig>,
    mut state: State,
    stop: Arc<tokio::sync::Notify>,
) -> State {
    // The bar moves four times a second; the snapshot is published about once a second.
    let tick = if state.bar.is_some() {
        Duration::from_millis(250)
    } else if config.interval.is_zero() {
        Duration::from_secs(1)
    } else {
        config.interval.min(Duration::from_secs(1))
    };
    let mut ticker = tokio::time::interval(tick);
    let mut last_publish: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.notified() => return state,
        }
        // One copy of the counters per tick: every figure shown agrees with the others.
        let run = view.counters.snapshot();
        state.sample(&view, &run);
        if last_publish.is_none_or(|t| t.elapsed() >= Duration::from_millis(900)) {
            publish(&view, &config, &run, state.since(), None);
            last_publish = Some(Instant::now());
        }
        if let Some(bar) = &state.bar {
            draw(&view, bar, &run, state.since());
        }
        let due = state
            .history
            .as_ref()
            // A tick late by a few milliseconds still takes the sample it is due.
            .is_some_and(|h| h.last.elapsed() + tick / 4 >= config.history_interval);
        if due {
            match state.history.as_mut().map(|h| h.sample(&view, &run)) {
                Some(Ok(Some(keep))) => drop(tokio::spawn(keep)),
                Some(Err(_)) => state.history = None,
                _ => {}
            }
        }
        let events = config.format == EventFormat::Json || state.bar.is_none();
        if !config.interval.is_zero() && state.last_at.elapsed() >= config.interval {
            if events {
                report(&view, &config, &mut state, &run, false);
            } else {
                warn_if_behind(&view, &config, &mut state, &run);
            }
        }
    }
}

fn draw(view: &RunView, bar: &Bar, run: &CounterSnapshot, since: Option<&Sample>) {
    let f = view.figures(run);
    if let Some(total) = view.total_rows() {
        bar.set_total(total);
    }
    let speed = view.speed(run, &f, since);
    let mut msg = format!(
        "| {} ok {} failed | {:.1} items/s",
        f.ok, f.failed, speed.items_per_second
    );
    if let Some(rate) = view.counters.effective_rate() {
        msg.push_str(&format!(" | limit {rate:.0}/s"));
    }
    if let Some(eta) = speed.eta_seconds {
        msg.push_str(&format!(
            " | ETA {}",
            humantime::format_duration(Duration::from_secs(eta))
        ));
    }
    bar.update(f.rows_done, msg);
}

/// The interval's load, and the warning if the run stays behind its `--rate`. Returns the
/// counters at the interval's start.
fn warn_if_behind(
    view: &RunView,
    config: &MonitorConfig,
    state: &mut State,
    now: &CounterSnapshot,
) -> CounterSnapshot {
    let seconds = state.last_at.elapsed().as_secs_f64();
    if let Some(configured) = config.configured_rate {
        let load = IntervalLoad {
            seconds,
            attempts: now.attempts - state.last.attempts,
            in_flight: now.in_flight,
            throttled: now.throttled - state.last.throttled,
            unavailable: now.unavailable - state.last.unavailable,
            refused_ids: now.refused_ids - state.last.refused_ids,
            durations: Durations::between(now, &state.last),
            backpressure: now.writer_backpressure - state.last.writer_backpressure,
            concurrency: config.concurrency,
            outage: view
                .counters
                .throttle()
                .is_some_and(|t| t.outage().is_some()),
        };
        // Not at the tail of a job: there too few items are left to keep the rate.
        let f = view.figures(now);
        let tail = view.total_rows().is_some_and(|t| t == f.rows_read)
            && (f.pending as usize) < 2 * config.concurrency;
        let effective = view.counters.effective_rate();
        if let Some(warning) = state.behind.check(configured, effective, &load, tail) {
            tracing::warn!("{warning}");
        }
    }
    let last = state.last;
    state.last = *now;
    state.last_at = Instant::now();
    last
}

fn report(
    view: &RunView,
    config: &MonitorConfig,
    state: &mut State,
    now: &CounterSnapshot,
    last_event: bool,
) {
    let now = *now;
    // The last event covers the whole run; the others the interval since the one before.
    let (last, interval) = if last_event {
        (CounterSnapshot::default(), view.started.elapsed())
    } else {
        let interval = state.last_at.elapsed();
        (warn_if_behind(view, config, state, &now), interval)
    };
    let f = view.figures(&now);
    let speed = view.speed(&now, &f, state.since());
    let event = ProgressEvent {
        event: "progress",
        job_id: view.job_id.clone(),
        run_id: view.run_id.clone(),
        timestamp: humantime::format_rfc3339_millis(view.clock.now()).to_string(),
        last: last_event,
        elapsed_s: round3(view.started.elapsed().as_secs_f64()),
        interval_s: round3(interval.as_secs_f64()),
        buckets_committed: f.buckets_committed,
        buckets_planned: f.buckets_planned,
        ok: f.ok,
        failed: f.failed,
        pending: f.pending,
        rows_read: f.rows_read,
        input_rows: view.total_rows(),
        eta_s: speed.eta_seconds,
        run_ok: now.ok,
        run_failed: now.failed,
        input_rows_per_second: round3(per_second(now.rows_planned - last.rows_planned, interval)),
        processed_items_per_second: round3(per_second(now.done() - last.done(), interval)),
        attempts_per_second: round3(per_second(now.attempts - last.attempts, interval)),
        effective_rate: view.counters.effective_rate().map(round3),
        configured_rate: config.configured_rate,
        in_flight: now.in_flight,
        retries: now.retries,
        pages: now.pages,
        throttled: now.throttled,
        unavailable: now.unavailable,
        writer_backpressure: now.writer_backpressure,
        store_syncs: now.store_syncs,
        checkpoints: now.checkpoints,
        duration_ms: Durations::between(&now, &last),
        quotas: view.counters.quota_states(),
        announced: view.counters.announced_states(),
        usage: f.usage,
        run_usage: now.usage,
        spend: view.spend(&f),
    };
    match config.format {
        EventFormat::Json => {
            console::line(&serde_json::to_string(&event).expect("events serialize"))
        }
        EventFormat::Text => tracing::info!("{}", event.render()),
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Count the input's rows in a background thread, at low priority, with the readers' own
/// definition of a row (CSV records, blank lines skipped; a Parquet file's footer says it),
/// so the bar's total and the ETA are known early. A read error leaves the total unknown; the planner reports its own errors.
fn count_rows(view: Arc<RunView>, input: InputSpec, counting: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new()
        .name("count-rows".into())
        .spawn(move || {
            crate::os::lower_thread_priority();
            let Ok(mut reader) = InputReader::open(&input, Cursor::default()) else {
                return;
            };
            if let Some(rows) = reader.rows_in_file() {
                view.total_rows.store(rows, Relaxed);
                return;
            }
            let mut rows = 0u64;
            loop {
                if rows % 4096 == 0 && !counting.load(Relaxed) {
                    return;
                }
                match reader.next_row() {
                    Ok(Some(_)) => rows += 1,
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
            view.total_rows.store(rows, Relaxed);
        });
    if let Err(e) = spawned {
        tracing::debug!("cannot count the input's rows: {e}");
    }
}

/// The calls `rows` rows left will make, at this run's calls per finished item so far (at
/// least one each): an ID of a paginated job is a call per page, and retries are calls too.
fn calls_left(rows: u64, run: &CounterSnapshot) -> u64 {
    let done = run.done();
    if done == 0 || run.attempts <= done {
        return rows;
    }
    let per_item = run.attempts as f64 / done as f64;
    (rows as f64 * per_item).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calls_left_count_each_finished_items_calls() {
        let run = |attempts, ok| CounterSnapshot {
            attempts,
            ok,
            ..CounterSnapshot::default()
        };
        assert_eq!(
            calls_left(100, &run(0, 0)),
            100,
            "nothing finished: a call a row"
        );
        assert_eq!(
            calls_left(100, &run(90, 100)),
            100,
            "never fewer than a call a row"
        );
        // A paginated job whose IDs took 40 pages each.
        assert_eq!(calls_left(100, &run(400, 10)), 4000);
        assert_eq!(calls_left(3, &run(5, 2)), 8);
    }

    #[test]
    fn a_paginated_runs_eta_is_the_rows_left_at_the_rows_speed_however_many_pages_an_id_has() {
        // 500 of 1,000 IDs settled, 300 of them in the last minute, of 1, 40 or 400 pages each.
        for pages_each in [1, 40, 400] {
            let counters = Arc::new(Counters::default());
            let mut view = RunView::new(
                counters.clone(),
                StoreStats::default(),
                "j".into(),
                Clock::system(),
            );
            let now = Instant::now();
            view.started = now - Duration::from_secs(600);
            view.total_rows.store(1000, Relaxed);
            Counters::add(&counters.ok, 500);
            Counters::add(&counters.rows_planned, 500);
            Counters::add(&counters.ids_planned, 500);
            Counters::add(&counters.pages, 500 * pages_each);
            Counters::add(&counters.attempts, 500 * pages_each);
            let run = counters.snapshot();
            let minute_ago = Sample {
                at: now - Duration::from_secs(60),
                done: 200,
                rows_done: 200,
            };
            let speed = view.speed(&run, &view.figures(&run), Some(&minute_ago));
            assert!(
                (speed.items_per_second - 5.0).abs() < 0.1,
                "{pages_each} pages an ID: {}",
                speed.items_per_second
            );
            assert!(
                matches!(speed.eta_seconds, Some(100..=101)),
                "{pages_each} pages an ID: {:?}",
                speed.eta_seconds
            );
        }
    }

    #[test]
    fn the_live_speed_and_the_eta_come_from_the_last_minute_the_average_from_the_run() {
        let counters = Arc::new(Counters::default());
        let mut view = RunView::new(
            counters.clone(),
            StoreStats::default(),
            "j".into(),
            Clock::system(),
        );
        let now = Instant::now();
        view.started = now - Duration::from_secs(600);
        view.total_rows.store(1000, Relaxed);
        Counters::add(&counters.ok, 500);
        Counters::add(&counters.rows_planned, 500);
        Counters::add(&counters.ids_planned, 500);
        let run = counters.snapshot();
        let f = view.figures(&run);
        // 300 items and rows in the last minute: 5/s, 500 rows left take 100 s.
        let minute_ago = Sample {
            at: now - Duration::from_secs(60),
            done: 200,
            rows_done: 200,
        };
        let speed = view.speed(&run, &f, Some(&minute_ago));
        assert!(
            (speed.items_per_second - 5.0).abs() < 0.1,
            "{}",
            speed.items_per_second
        );
        let average = speed.average_items_per_second;
        assert!((average - 500.0 / 600.0).abs() < 0.01, "{average}");
        assert!(
            matches!(speed.eta_seconds, Some(100..=101)),
            "{:?}",
            speed.eta_seconds
        );
        // No window yet: the run's start.
        let speed = view.speed(&run, &f, None);
        assert!((speed.items_per_second - average).abs() < 0.01);

        // The window keeps the newest sample at least a minute old, and no older one.
        let at = |secs: u64| Sample {
            at: now - Duration::from_secs(secs),
            done: 0,
            rows_done: 0,
        };
        let mut state = State {
            last: run,
            last_at: now,
            bar: None,
            window: VecDeque::from([view.start_sample(), at(120), at(61), at(30)]),
            behind: progress::Sustained::default(),
            history: None,
        };
        state.sample(&view, &run);
        let ages: Vec<u64> = state
            .window
            .iter()
            .map(|s| s.at.elapsed().as_secs())
            .collect();
        assert_eq!(ages.len(), 3, "{ages:?}");
        assert!(ages[0] >= 61 && ages[1] >= 30 && ages[2] < 30, "{ages:?}");
        assert_eq!(state.window.back().unwrap().done, 500);
    }
}
