//! What the throttle is asked to do for a run ([`ThrottleOptions`]): the rate and its
//! burst, whether it adapts, and the control law's constants.

use std::time::Duration;

use super::rate::Rate;

/// What the throttle is asked to do for a run.
#[derive(Debug, Clone)]
pub struct ThrottleOptions {
    /// Requests per second at most (the ceiling when adaptive). `None`: no rate limit.
    pub rate: Option<Rate>,
    /// Requests that may start at once above the rate (`--burst`); `None`: derived from the
    /// rate (`default_grants`).
    pub burst: Option<u32>,
    /// Follow the API's pushback (rate when `rate` is set, concurrency otherwise).
    pub adaptive: bool,
    /// Floor of the adaptive rate (default: a hundredth of the ceiling, at least 0.1/s).
    pub min_rate: Option<Rate>,
    /// Starting rate (default: the ceiling).
    pub initial_rate: Option<Rate>,
    /// Proportional gain of the control law (see [`crate::throttle`]).
    pub kp: f64,
    /// Integral gain of the control law.
    pub ki: f64,
    /// Derivative gain of the control law.
    pub kd: f64,
    /// Controller tick.
    pub tick: Duration,
    /// How long the API may be out before the run stops.
    pub max_outage: Duration,
}

impl Default for ThrottleOptions {
    fn default() -> Self {
        ThrottleOptions {
            rate: None,
            burst: None,
            adaptive: true,
            min_rate: None,
            initial_rate: None,
            kp: 1.0,
            ki: 0.2,
            kd: 0.0,
            tick: Duration::from_millis(200),
            max_outage: Duration::from_secs(30 * 60),
        }
    }
}
