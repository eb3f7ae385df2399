//! Reporters: what a run tells the world while it works, each one opt-in. Signals (a first
//! SIGINT/SIGTERM stops gracefully, a second one calls the program's own handler), the
//! progress monitor (events, the terminal bar under the `progress-bar` feature, `live.json`)
//! and the Prometheus endpoint (under the `metrics` feature). [`run_reported`] runs the
//! engine with the reporters asked for; the [`super::Job`] builder runs through it (and the
//! command line through the builder).

use std::sync::Arc;

use crate::engine::{self, EngineError, Stop, StopHandle};
use crate::handler::Handler;
use crate::monitor::{Monitor, MonitorConfig, RunView};
use crate::progress::{Counters, RunSummary};
use crate::spec::{JobSpec, RunOptions};
use crate::store::{worker_label, JobView, Leases, Log, Store, StoreStats};

/// What a second stop signal does (the first one stops the run gracefully): typically say
/// so and exit the process at once.
pub type SecondSignal = Box<dyn Fn() + Send + Sync>;

/// The reporters of one run; none by default.
#[derive(Default)]
pub(crate) struct Reporters {
    /// Stop on SIGINT/SIGTERM: the first one finishes the items in flight, a second one
    /// calls this.
    pub(crate) signals: Option<SecondSignal>,
    /// Progress events, the bar and the `live.json` snapshot.
    pub(crate) monitor: Option<MonitorConfig>,
    /// Serve `/metrics` on this listener while the run lasts.
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Option<tokio::net::TcpListener>,
    /// Where the program serves the job's dashboard, said in `live.json`.
    pub(crate) dashboard: Option<String>,
    /// The job's statistics as read just before the run (none: the run reads them).
    pub(crate) stats: Option<StoreStats>,
}

/// Run `log` of the job in `store` with `reporters`, until it ends or `stop` is asked for
/// (`handle` is the one the signal reporter pulls).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_reported<S: Store + Leases, H: Handler>(
    store: Arc<S>,
    spec: JobSpec,
    handler: Arc<H>,
    options: &RunOptions,
    reporters: Reporters,
    (handle, stop): (StopHandle, Stop),
    log: Log,
) -> Result<RunSummary, EngineError> {
    let signals = reporters
        .signals
        .map(|second| tokio::spawn(watch_signals(handle.clone(), second)));
    let counters = Arc::new(Counters::default());
    let view = Arc::new(
        RunView::new(
            counters.clone(),
            match reporters.stats {
                Some(stats) => stats,
                None => store.stats().await?,
            },
            spec.job_id.to_string(),
            options.clock.clone(),
        )
        .with_worker(worker_label(&store))
        .with_prices(spec.prices, spec.budget)
        .with_dashboard(reporters.dashboard),
    );
    #[cfg(feature = "metrics")]
    let metrics = reporters.metrics.map(|listener| {
        tracing::info!(
            "metrics on http://{}/metrics",
            listener.local_addr().map_or("?".into(), |a| a.to_string())
        );
        tokio::spawn(crate::metrics::serve(listener, view.clone()))
    });
    let monitor = reporters.monitor.map(|mut config| {
        // A store that keeps the job's history (PostgreSQL) takes it when there is no state
        // directory to keep it in.
        let store = store.clone();
        config.history_sink = Some(Arc::new(move |record: serde_json::Value| {
            let store = store.clone();
            Box::pin(async move {
                if let Err(e) = store.append_history(&[record]).await {
                    tracing::debug!("cannot write the job's history: {e}");
                }
            })
        }));
        Monitor::start(view, config)
    });
    // The store's lock is held until the finished snapshot is written: `status` takes a
    // free lock as proof that no runner is active, so the snapshot must be final by then.
    let lock = store.clone();
    let outcome =
        engine::run_log(store, Arc::new(spec), handler, options, counters, stop, log).await;
    if let Some(monitor) = monitor {
        // A rerun runs on a finished job: what ended is the rerun's own work.
        let finished = match (&outcome, log) {
            (Ok(s), Log::Job) => s.job.finished(),
            (Ok(_), Log::Rerun(k)) => lock.rerun_stats(k).await.is_ok_and(|r| r.finished()),
            (Err(_), _) => false,
        };
        let ending = match &outcome {
            Ok(_) if finished => "finished",
            Ok(s) if s.halted.is_some() => "halted",
            Ok(s) if s.interrupted => "stopped",
            Ok(_) => "not finished",
            Err(_) => "failed",
        };
        monitor.finish(ending).await;
    }
    drop(lock);
    // Held until here: a stop pair whose handle is gone counts as a stop.
    drop(handle);
    #[cfg(feature = "metrics")]
    if let Some(m) = metrics {
        m.abort();
    }
    if let Some(s) = signals {
        s.abort();
    }
    outcome
}

/// Stop on the first SIGINT or SIGTERM; call `second` on the next one.
async fn watch_signals(stop: StopHandle, second: SecondSignal) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot install signal handlers; SIGINT/SIGTERM will kill the run without a graceful stop");
        return;
    };
    for n in 0.. {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        if n == 0 {
            tracing::warn!(
                "stop requested: finishing the items in flight (signal again to exit at once)"
            );
            stop.stop();
        } else {
            second();
        }
    }
}
