//! [`Job`]: the library's front door. A builder that takes an input (a file, or any
//! iterator of IDs), a store (a state directory by default, or any [`Store`] + [`Leases`]),
//! a handler (any [`Handler`], closures included) and options, and runs the job to a
//! [`RunSummary`]; results are read back with [`super::Results`]. Reporters (signals,
//! progress, `live.json`, metrics) are opt-in.
//!
//! Resuming: run the same builder again on the same store. A file input must be the file
//! the job was created from (rows appended are accepted, as on the command line; a folder
//! may also have new files named after its last one). An
//! iterator of IDs is written to `ids.txt` in the state directory (one ID per line) before
//! the run, and a resume must give the same IDs in the same order (more may follow, as new
//! buckets): the file it writes is checked against the fingerprint of the first one, and
//! anything else is refused with [`RunError::IdsChanged`] before any work. A resume that
//! gives no input reads the IDs the first run stored.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{stop_pair, EngineError, Stop, StopHandle};
use crate::handler::Handler;
use crate::input::{InputFormat, InputSpec};
use crate::monitor::{EventFormat, MonitorConfig};
use crate::progress::RunSummary;
use crate::spec::{JobSpec, RetryPolicy, RunOptions};
use crate::store::{Leases, Log, Store, StoreError, StoreStats};

use super::error::JobError;
use super::place::{open_made, JobPlace, StateDirPlace};
use super::reporters::{Reporters, SecondSignal};
use super::request::{JobRequest, RetryOverrides};

/// Where a job's IDs come from.
pub enum JobInput {
    /// A file of IDs (text, CSV, JSON lines or Parquet), or a folder of such files read in
    /// name order as one input.
    File(InputSpec),
    /// IDs from an iterator, stored in the state directory before the run.
    Ids(Box<dyn Iterator<Item = String> + Send>),
}

/// The file an iterator's IDs are written to, in the state directory.
pub(super) const IDS_FILE: &str = "ids.txt";

/// A job to run: see the module's documentation.
pub struct Job<H, P = StateDirPlace> {
    handler: H,
    name: String,
    input: Option<JobInput>,
    /// Where the job is kept (none given yet), or the job [`Job::opened`] was given.
    store: Option<P>,
    bucket_size: Option<u64>,
    retry: RetryOverrides,
    reporting: Reporting,
}

/// A store and the job it holds, opened by the caller: see [`Job::opened`].
pub struct Opened<S> {
    store: Arc<S>,
    spec: JobSpec,
    log: Log,
    /// The job's statistics as the caller read them just before the run.
    stats: Option<StoreStats>,
}

/// How a run is done and reported, whatever the store: the per-run options and the opt-in
/// reporters.
struct Reporting {
    options: RunOptions,
    signals: Option<SecondSignal>,
    progress: Option<(Duration, EventFormat, bool)>,
    #[cfg(feature = "metrics")]
    metrics: Option<tokio::net::TcpListener>,
    /// Where `live.json` goes, if not in the state directory.
    live_dir: Option<PathBuf>,
    /// Where the program serves the job's dashboard, said in `live.json`.
    dashboard: Option<String>,
    stop: (StopHandle, Stop),
}

impl Reporting {
    fn new() -> Reporting {
        Reporting {
            options: RunOptions {
                progress_interval: Duration::ZERO,
                ..RunOptions::default()
            },
            signals: None,
            progress: None,
            #[cfg(feature = "metrics")]
            metrics: None,
            live_dir: None,
            dashboard: None,
            stop: stop_pair(),
        }
    }

    /// Run `log` of the job `spec` in `store` with `handler`; `dir` is the state directory,
    /// if any (`live.json` goes there unless [`Job::live_dir`] said otherwise).
    async fn run<S: Store + Leases, H: Handler>(
        self,
        store: Arc<S>,
        spec: JobSpec,
        handler: H,
        dir: Option<PathBuf>,
        (log, stats): (Log, Option<StoreStats>),
    ) -> Result<RunSummary, RunError> {
        let live = self.live_dir.or(dir);
        let monitor = self.progress.map(|(interval, format, bar)| MonitorConfig {
            input: spec.input.clone(),
            state: live,
            interval,
            format,
            bar,
            concurrency: self.options.concurrency,
            configured_rate: self.options.throttle.rate.map(|r| r.per_second()),
            history_interval: self.options.history_interval,
            spec: serde_json::to_value(&spec).unwrap_or_default(),
            history_sink: None,
        });
        let reporters = Reporters {
            signals: self.signals,
            monitor,
            #[cfg(feature = "metrics")]
            metrics: self.metrics,
            dashboard: self.dashboard,
            stats,
        };
        let summary = super::reporters::run_reported(
            store,
            spec,
            Arc::new(handler),
            &self.options,
            reporters,
            self.stop,
            log,
        )
        .await?;
        Ok(summary)
    }
}

/// Errors of [`Job::run`], found before any work unless said otherwise.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Neither a state directory nor a store was given.
    #[error("no store given: name a state directory or a store")]
    NoStore,
    /// The bucket size asked for is 0.
    #[error("the bucket size must be at least 1")]
    BucketSize,
    /// The store holds no job and no input was given to create one.
    #[error("no input given, and the store holds no job to resume")]
    NoJob,
    /// An ID of the iterator given cannot be stored one per line.
    #[error("ID number {index} ({id:?}) {reason}")]
    BadId {
        /// Its 0-based position in the iterator.
        index: u64,
        /// The ID as given.
        id: String,
        /// What is wrong: empty, a line break, whitespace around it.
        reason: &'static str,
    },
    /// The IDs could not be written to the state directory's IDs file.
    #[error("cannot store the IDs in {path}: {source}")]
    StoreIds {
        /// The file, or the directory it goes in.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A resume gave IDs other than those the job was created with (it may only add IDs at the end).
    #[error("the IDs given are not those the job was created with ({what}): a resume must give the same IDs in the same order (more may follow)")]
    IdsChanged {
        /// What differs.
        what: String,
    },
    /// The store holds a job of another meaning (input, work or bucket size); one line per difference.
    #[error("the store holds a different job:\n  {}", .0.join("\n  "))]
    JobChanged(Vec<String>),
    /// The job could not be created or resumed.
    #[error(transparent)]
    Job(JobError),
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run started and stopped on an error.
    #[error("the run stopped: {0}")]
    Engine(#[from] EngineError),
}

impl<H: Handler> Job<H, StateDirPlace> {
    /// A job whose work for each ID is `handler`.
    pub fn new(handler: H) -> Job<H, StateDirPlace> {
        Job {
            handler,
            name: "library".into(),
            input: None,
            store: None,
            bucket_size: None,
            retry: RetryOverrides::default(),
            reporting: Reporting::new(),
        }
    }

    /// Keep the job in the state directory `dir` (created if missing).
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.store = Some(StateDirPlace::new(dir));
        self
    }

    /// Keep the job in `store` instead of a state directory.
    pub fn store<S: Store + Leases>(self, store: Arc<S>) -> Job<H, Arc<S>> {
        Job {
            handler: self.handler,
            name: self.name,
            input: self.input,
            store: Some(store),
            bucket_size: self.bucket_size,
            retry: self.retry,
            reporting: self.reporting,
        }
    }
}

impl<H: Handler, S: Store + Leases> Job<H, Opened<S>> {
    /// Run the job `store` holds as `spec`, the job [`crate::job::open_job`] (or
    /// `crate::job::stored_job`) returned for it, with `handler` (built for that spec:
    /// `crate::job::job_handler` builds the one a spec's request or command names). For a
    /// program that creates, checks or changes the job itself before running it, as the
    /// command line does; nothing is checked against the store again. `live.json` is written
    /// only where [`Job::live_dir`] says.
    pub fn opened(store: Arc<S>, spec: JobSpec, handler: H) -> Job<H, Opened<S>> {
        Job {
            handler,
            name: String::new(),
            input: None,
            store: Some(Opened {
                store,
                spec,
                log: Log::Job,
                stats: None,
            }),
            bucket_size: None,
            retry: RetryOverrides::default(),
            reporting: Reporting::new(),
        }
    }

    /// Run rerun `number` (written ahead by `crate::rerun::start`) instead of the job's
    /// own buckets.
    pub fn rerun(mut self, number: u32) -> Self {
        if let Some(opened) = &mut self.store {
            opened.log = Log::Rerun(number);
        }
        self
    }

    /// The job's statistics as the caller read them just before the run (the command line
    /// reads them to see whether the job is finished): the run starts from them rather than
    /// reading them again, a round trip fewer for a store across a network.
    #[cfg(feature = "cli")]
    pub(crate) fn stats_read(mut self, stats: StoreStats) -> Self {
        if let Some(opened) = &mut self.store {
            opened.stats = Some(stats);
        }
        self
    }

    /// The job's spec.
    pub fn spec(&self) -> &JobSpec {
        &self.given().spec
    }

    /// What [`Job::opened`] was given.
    fn given(&self) -> &Opened<S> {
        self.store.as_ref().expect("given by Job::opened")
    }

    /// Run the job (or the rerun) until it is finished or stopped.
    pub async fn run(self) -> Result<RunSummary, RunError> {
        let Some(Opened {
            store,
            spec,
            log,
            stats,
        }) = self.store
        else {
            unreachable!("given by Job::opened")
        };
        self.reporting
            .run(store, spec, self.handler, None, (log, stats))
            .await
    }
}

impl<H: Handler, P> Job<H, P> {
    /// IDs worked on at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.reporting.options.concurrency = n;
        self
    }

    /// Every per-run setting at once (rate limit, failure limit, durability, ...).
    pub fn options(mut self, options: RunOptions) -> Self {
        self.reporting.options = options;
        self
    }

    /// A handle that stops the run gracefully (items in flight finish, the rest stays
    /// pending for a resume).
    pub fn stop_handle(&self) -> StopHandle {
        self.reporting.stop.0.clone()
    }

    /// Stop gracefully on SIGINT/SIGTERM; a second signal exits the process (status 130).
    pub fn stop_on_signals(self) -> Self {
        self.stop_on_signals_then(Box::new(|| {
            crate::console::say("stopped at once; the state is consistent, resume to go on");
            std::process::exit(130);
        }))
    }

    /// Stop gracefully on SIGINT/SIGTERM; a second signal calls `second` (which typically
    /// says so and exits the process).
    pub fn stop_on_signals_then(mut self, second: SecondSignal) -> Self {
        self.reporting.signals = Some(second);
        self
    }

    /// Progress events every `interval` (through `tracing` as text, or JSON lines on
    /// standard error) and the `live.json` snapshot in the state directory.
    pub fn progress(mut self, interval: Duration, format: EventFormat) -> Self {
        self.reporting.options.progress_interval = interval;
        self.reporting.progress = Some((interval, format, false));
        self
    }

    /// The terminal progress bar on standard error.
    #[cfg(feature = "progress-bar")]
    pub fn progress_bar(mut self) -> Self {
        let (interval, format, _) =
            self.reporting
                .progress
                .unwrap_or((Duration::ZERO, EventFormat::Text, true));
        self.reporting.progress = Some((interval, format, true));
        self
    }

    /// Publish the `live.json` snapshot (with [`Job::progress`] or the bar) in `dir`
    /// instead of the state directory: for a store given, which has none.
    pub fn live_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.reporting.live_dir = Some(dir.into());
        self
    }

    /// Say in `live.json` that the program serves the job's dashboard at `addr` while the
    /// run lasts (over a [`crate::job::RunningPlace`]): a reader that cannot open the store
    /// the run holds (another process's dashboard, `status`) reaches the run's readings
    /// there.
    pub fn dashboard_served_at(mut self, addr: std::net::SocketAddr) -> Self {
        self.reporting.dashboard = Some(addr.to_string());
        self
    }

    /// Serve Prometheus metrics on `listener` while the run lasts.
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, listener: tokio::net::TcpListener) -> Self {
        self.reporting.metrics = Some(listener);
        self
    }
}

impl<H: Handler, P: JobPlace> Job<H, P> {
    /// The handler's name, stored with the job: a resume with another name is refused.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Read the IDs from a text file, one per line.
    pub fn input_file(self, path: impl Into<PathBuf>) -> Self {
        self.input(InputSpec {
            path: path.into(),
            format: InputFormat::Text,
        })
    }

    /// Read the IDs from a file in any input format, or from a folder of such files (its
    /// data files in name order, as one input; files added later after the last name are
    /// a grown input on resume).
    pub fn input(mut self, spec: InputSpec) -> Self {
        self.input = Some(JobInput::File(spec));
        self
    }

    /// Take the IDs from an iterator (see the module's documentation for resuming).
    pub fn ids<I>(mut self, ids: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String> + 'static,
        I::IntoIter: Send + 'static,
    {
        self.input = Some(JobInput::Ids(Box::new(ids.into_iter().map(Into::into))));
        self
    }

    /// Rows per bucket (the default is [`crate::spec::DEFAULT_BUCKET_SIZE`]); fixed at creation.
    pub fn bucket_size(mut self, rows: u64) -> Self {
        self.bucket_size = Some(rows);
        self
    }

    /// How failed attempts are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = RetryOverrides {
            max_attempts: Some(policy.max_attempts),
            initial: Some(policy.initial),
            max_interval: Some(policy.max_interval),
            max_elapsed: Some(policy.max_elapsed),
        };
        self
    }

    /// Create the job (or resume the one the store holds) and run it until it is finished
    /// or stopped.
    pub async fn run(self) -> Result<RunSummary, RunError> {
        if self.bucket_size == Some(0) {
            return Err(RunError::BucketSize);
        }
        let place = self.store.as_ref().ok_or(RunError::NoStore)?;
        // Kept until the run ends: an iterator's IDs when there is no state directory.
        let mut scratch = None;
        let mut previous = None;
        let from_ids = matches!(self.input, Some(JobInput::Ids(_)));
        let create = self.input.is_some();
        let (input, bucket_size, name, retry) =
            (self.input, self.bucket_size, self.name, self.retry);
        let request = |dir: Option<&Path>| {
            let input = match input {
                None => None,
                Some(JobInput::File(spec)) => Some(spec),
                Some(JobInput::Ids(ids)) => {
                    let dir = match dir {
                        Some(dir) => dir.to_path_buf(),
                        None => {
                            let tmp = tempfile::tempdir().map_err(|source| RunError::StoreIds {
                                path: std::env::temp_dir(),
                                source,
                            })?;
                            let path = tmp.path().to_path_buf();
                            scratch = Some(tmp);
                            path
                        }
                    };
                    let ids = store_ids(ids, &dir.join(IDS_FILE))?;
                    previous = Previous::new(&ids.path);
                    Some(ids)
                }
            };
            Ok::<_, RunError>(Cow::Owned(JobRequest {
                input,
                bucket_size,
                handler: Some(name),
                retry,
                command: "library".into(),
                ..JobRequest::default()
            }))
        };
        let opened = open_made(place, create, true, request)
            .await
            .map_err(|e| match e {
                RunError::Job(JobError::InputChanged { what, .. }) if from_ids => {
                    RunError::IdsChanged { what }
                }
                e => e,
            });
        if let Some(previous) = previous {
            previous.settle(opened.is_ok());
        }
        let (store, spec) = opened?;
        let dir = place.dir().map(Path::to_path_buf);
        let summary = self
            .reporting
            .run(store, spec, self.handler, dir, (Log::Job, None))
            .await?;
        drop(scratch);
        Ok(summary)
    }
}

impl From<JobError> for RunError {
    fn from(e: JobError) -> RunError {
        match e {
            JobError::MeaningChanged(lines) => RunError::JobChanged(lines),
            JobError::NoJob => RunError::NoJob,
            JobError::Store(e) => RunError::Store(e),
            e => RunError::Job(e),
        }
    }
}

/// The IDs file a resume replaced, put back if the new IDs are refused.
struct Previous {
    path: PathBuf,
    kept: PathBuf,
}

impl Previous {
    fn new(path: &Path) -> Option<Previous> {
        let kept = path.with_extension("txt.previous");
        kept.exists().then(|| Previous {
            path: path.to_path_buf(),
            kept,
        })
    }

    fn settle(self, accepted: bool) {
        // Best effort: a leftover copy is replaced by the next resume.
        let _ = if accepted {
            std::fs::remove_file(&self.kept)
        } else {
            std::fs::rename(&self.kept, &self.path)
        };
    }
}

/// Write `ids` to `path`, one per line, replacing it atomically (the file it replaces is
/// kept beside it until the job accepts the new one).
fn store_ids(
    ids: Box<dyn Iterator<Item = String> + Send>,
    path: &Path,
) -> Result<InputSpec, RunError> {
    let io = |source| RunError::StoreIds {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    let mut out = std::io::BufWriter::new(tmp);
    for (index, id) in ids.enumerate() {
        let reason = if id.trim().is_empty() {
            Some("is empty")
        } else if id.contains(['\n', '\r']) {
            Some("holds a line break")
        } else if id.trim() != id {
            Some("has whitespace around it")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(RunError::BadId {
                index: index as u64,
                id,
                reason,
            });
        }
        out.write_all(id.as_bytes()).map_err(io)?;
        out.write_all(b"\n").map_err(io)?;
    }
    let tmp = out.into_inner().map_err(|e| io(e.into_error()))?;
    tmp.as_file().sync_all().map_err(io)?;
    if path.exists() {
        std::fs::rename(path, path.with_extension("txt.previous")).map_err(io)?;
    }
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(InputSpec {
        path: path.to_path_buf(),
        format: InputFormat::Text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Failure;
    use crate::job::Results;
    use crate::store::mem::MemStore;
    use crate::store::ItemStatus;

    async fn double(id: String) -> Result<serde_json::Value, Failure> {
        let n: u64 = id.parse().map_err(|_| Failure::permanent("not a number"))?;
        Ok(serde_json::json!(n * 2))
    }

    fn numbers(n: u64) -> impl Iterator<Item = String> + Send {
        (0..n).map(|i| i.to_string())
    }

    async fn read(dir: &Path) -> Vec<(String, u64)> {
        Results::open(dir)
            .unwrap()
            .all::<u64>()
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.id, r.result.unwrap()))
            .collect()
    }

    #[tokio::test]
    async fn a_resume_must_give_the_same_ids_in_the_same_order_and_may_give_more() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let job = || Job::new(double).state_dir(&state).bucket_size(7);
        let s = job().ids(numbers(100)).run().await.unwrap();
        assert_eq!((s.job.ok, s.job.failed, s.job.finished()), (100, 0, true));
        // The same IDs again: nothing to do.
        let s = job().ids(numbers(100)).run().await.unwrap();
        assert_eq!((s.job.ok, s.run.done()), (100, 0));
        // Other IDs: refused, and the stored IDs are kept.
        let err = job()
            .ids((0..100).rev().map(|i: u64| i.to_string()))
            .run()
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::IdsChanged { .. }), "{err}");
        assert!(!err.to_string().contains("--"), "no flag named: {err}");
        let kept = std::fs::read_to_string(state.join(IDS_FILE)).unwrap();
        assert!(kept.starts_with("0\n1\n2\n"));
        // No input: the stored IDs. More IDs after the same ones: new buckets.
        job().run().await.unwrap();
        let s = job().ids(numbers(130)).run().await.unwrap();
        assert_eq!((s.job.ok, s.run.done()), (130, 30));
        let results = read(&state).await;
        let expected: Vec<(String, u64)> = (0..130).map(|i| (i.to_string(), i * 2)).collect();
        assert_eq!(results, expected);
    }

    #[tokio::test]
    async fn ids_that_a_line_cannot_hold_are_refused_before_any_work() {
        let dir = tempfile::tempdir().unwrap();
        for (bad, why) in [("a\nb", "line break"), (" a", "whitespace"), ("", "empty")] {
            let err = Job::new(double)
                .state_dir(dir.path().join("state"))
                .ids(["1".to_string(), bad.to_string()])
                .run()
                .await
                .unwrap_err();
            assert!(
                matches!(err, RunError::BadId { index: 1, .. }) && err.to_string().contains(why),
                "{err}"
            );
        }
        let err = Job::new(double)
            .ids(numbers(3))
            .bucket_size(0)
            .state_dir(dir.path().join("state"))
            .run()
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::BucketSize), "{err}");
        let err = Job::new(double).ids(numbers(3)).run().await.unwrap_err();
        assert!(matches!(err, RunError::NoStore), "{err}");
    }

    #[tokio::test]
    async fn another_handler_name_is_another_job() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let job = |name: &str| {
            Job::new(double)
                .name(name)
                .state_dir(&state)
                .ids(numbers(5))
        };
        job("double").run().await.unwrap();
        let err = job("triple").run().await.unwrap_err();
        match &err {
            RunError::JobChanged(lines) => {
                assert_eq!(lines, &[r#"handler: stored "double", given "triple""#])
            }
            e => panic!("{e}"),
        }
    }

    #[tokio::test]
    async fn an_opened_job_runs_the_rerun_its_caller_wrote() {
        use crate::rerun::{choose, start, Prepared, RerunAsk};
        use crate::store::JobView;
        let store = Arc::new(MemStore::new());
        let ids = ["1", "x", "3"].map(String::from);
        let s = Job::new(double)
            .store(store.clone())
            .ids(ids)
            .run()
            .await
            .unwrap();
        assert_eq!((s.job.ok, s.job.failed), (2, 1));
        let spec = crate::job::stored_job(&*store).await.unwrap().unwrap();
        let chosen = choose(&*store, &RerunAsk::Failed).await.unwrap();
        let Prepared::Ready { rerun, .. } = start(&*store, &spec, chosen).await.unwrap() else {
            panic!("one failed ID to rerun");
        };
        // The fault is fixed: any ID is accepted now.
        let lenient = |id: String| async move { Ok::<_, Failure>(serde_json::json!(id.len())) };
        let job = Job::opened(store.clone(), spec, lenient).rerun(rerun.number);
        assert_eq!(job.spec().bucket_size, crate::spec::DEFAULT_BUCKET_SIZE);
        job.run().await.unwrap();
        let r = store.rerun_stats(rerun.number).await.unwrap();
        assert!(r.finished() && (r.ok, r.failed) == (1, 0), "{r:?}");
        let stats = store.stats().await.unwrap();
        assert_eq!((stats.ok, stats.failed), (3, 0));
    }

    #[tokio::test]
    async fn any_store_and_the_stop_handle() {
        let store = Arc::new(MemStore::new());
        let job = Job::new(double).store(store.clone()).bucket_size(10);
        let stop = job.stop_handle();
        stop.stop();
        let s = job.ids(numbers(50)).run().await.unwrap();
        assert!(s.interrupted && !s.job.finished(), "{s:?}");
        let s = Job::new(double)
            .store(store.clone())
            .bucket_size(10)
            .ids(numbers(50))
            .run()
            .await
            .unwrap();
        assert!(s.job.finished() && s.job.ok == 50, "{s:?}");
        let records = Results::new(store)
            .all::<serde_json::Value>()
            .await
            .unwrap();
        assert_eq!(records.len(), 50);
        assert!(records.iter().all(|r| r.status == ItemStatus::Ok));
    }
}
