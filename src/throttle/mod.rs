//! Throttle: how fast requests may start, and how that speed follows the API's pushback.
//!
//! Owns the request rate limit (`RateLimiter`: a GCRA virtual clock that absorbs late
//! wake-ups, with a default burst derived from the rate, and rate changes that keep the
//! schedule), the parsing of `--rate` values ([`Rate`]), and the control law that moves the
//! effective rate between a floor and a ceiling from what the API says (`RateController`).
//!
//! ## The control law
//!
//! Spark's PID rate estimator (proportional 1.0, integral 0.2, derivative 0.0) adjusts the
//! rate from the batch processing rate. Here the "processing rate" is what the API accepted,
//! and the integral term is driven by the API's pushback instead of scheduling delay. Every
//! tick (200 ms), with `rate` the current limit, `accepted` the answers per second that
//! were not pushback, and `p` the share of attempts that were pushback (429, 503, timeouts):
//!
//! ```text
//! pushback (p > 0, and more of it over the last second than a steady few percent: see
//! [`PushbackFilter`]):
//!     error      = rate - accepted
//!     historical = p * rate
//!     d_error    = (error - last_error) / tick
//!     new_rate   = rate - kp*error - ki*historical - kd*d_error
//!     new_rate   = max(new_rate, (1 - ki) * accepted)   (never far below what was accepted)
//! no pushback, but the tick's lowest latency above 3x its baseline and 10 ms above it:
//!     new_rate   = rate * (1 - ki/10)           (gently: latency is no measure of unused rate)
//! otherwise (the API keeps up):
//!     new_rate   = rate * (1 + increase * boost)     (10% per second, compounded per tick;
//!                                                    boost doubles per calm second, max 5)
//! new_rate is clamped to [min_rate, ceiling]
//! ```
//!
//! Against an API that accepts C requests/s and refuses the rest, a rate R > C drops in one
//! tick to about `max(C - ki*(R - C), (1 - ki)*C)`, just under capacity, then climbs 10% per
//! second until the next refusal: the rate saw-tooths just below C, refusals stay a few
//! percent of attempts. Without `--rate` the ceiling is unlimited: the limiter binds only
//! once the API pushes back; concurrency also adapts (x0.7 on pushback, +1 per calm tick).
//!
//! Refusals that repeat on the same IDs while other IDs succeed (a shard down for some keys)
//! are no overload and reach neither filter nor controller: see `repeats`.
//!
//! The parts, one file each: `rate` (the `--rate` value and the limiter), `controller`
//! (the control law, its pushback filter, adaptive concurrency), `repeats` (refusals bound
//! to IDs), `outage` (what an attempt tells the throttle, outage detection and probes),
//! `options` (what a run asks of the throttle) and `pacing` (the `Throttle` that ties
//! them together for a run, with the fleet's hold on a worker).

mod controller;
mod options;
mod outage;
mod pacing;
mod rate;
mod repeats;
#[cfg(test)]
mod tests;

pub use options::ThrottleOptions;
pub(crate) use outage::{ItemHistory, Observed};
pub(crate) use pacing::Throttle;
pub use rate::Rate;
