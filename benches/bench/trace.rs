//! The adaptive controller's trace (for `rate` and `capacity`): every rate it set, captured
//! from its `tracing` events, and the bench's own log on standard error.

use std::time::Instant;

/// Every rate the adaptive controller set, with when: captured from the throttle's
/// `rate adjusted` debug events (the controller lives inside the engine).
static RATE_TRACE: std::sync::Mutex<Vec<(Instant, f64)>> = std::sync::Mutex::new(Vec::new());

/// A `tracing` layer that records the `rate` field of `highwater::throttle` events.
struct RateCapture;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RateCapture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Find(Option<f64>);
        impl tracing::field::Visit for Find {
            fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
                if field.name() == "rate" {
                    self.0 = Some(value);
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        let mut find = Find(None);
        event.record(&mut find);
        if let Some(rate) = find.0 {
            RATE_TRACE
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((Instant::now(), rate));
        }
    }
}

/// The controller capture (always), and highwater's log on stderr as `RUST_LOG` says
/// (default: warnings only).
pub fn install_tracing() {
    use tracing_subscriber::filter::{filter_fn, EnvFilter};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("highwater=warn")),
        );
    // The level hint matters: it sets the `log` crate's max level (sled logs through `log` at
    // trace level), so that, as in the CLI at its default level, sled's trace records are
    // dropped by one atomic load instead of each going through tracing's dispatch.
    let capture = RateCapture.with_filter(
        filter_fn(|m| m.is_event() && m.target().starts_with("highwater::throttle"))
            .with_max_level_hint(tracing::Level::DEBUG),
    );
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(capture)
        .try_init();
}

/// The controller's rate changes between `from` and `to`.
pub fn rate_trace_between(from: Instant, to: Instant) -> Vec<(Instant, f64)> {
    RATE_TRACE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(at, _)| *at >= from && *at <= to)
        .copied()
        .collect()
}

/// The controller's rate at `t`: the last change at or before it, else `initial`.
pub fn limit_at(trace: &[(Instant, f64)], t: Instant, initial: f64) -> f64 {
    let i = trace.partition_point(|(at, _)| *at <= t);
    if i == 0 {
        initial
    } else {
        trace[i - 1].1
    }
}
