//! The throttle's unit tests, one file per concept: the rate limiter's schedule and bursts
//! ([`limiter`]), the control law and its pushback filter ([`controller`]), refusals bound
//! to IDs ([`repeats`]), and the throttle as workers use it: pushback, outage evidence, fleet
//! share and pause ([`throttle`]).

mod controller;
mod limiter;
mod repeats;
mod throttle;
