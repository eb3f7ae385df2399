//! The whole suite ([`run_all`]): every check, in order, against one backend, and the check
//! that failed ([`CheckFailed`]).

use std::any::Any;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use super::backend::Backend;
use super::{damage, engine, log, pages, quota, reruns};

/// A check of the suite that the backend failed: its name and what its assertion said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store conformance check `{check}` failed: {message}")]
pub struct CheckFailed {
    /// The check's name (a sentence in snake case: what a backend must do).
    pub check: &'static str,
    /// The failed assertion's message.
    pub message: String,
}

/// Run every check against `backend`, in order, and stop at the first that fails.
///
/// Each check creates its stores with [`Backend::create`]. A check asserts, so a failure
/// also prints its panic message on standard error; the error returned names the check.
/// Call it inside a multi-threaded Tokio runtime (`#[tokio::test(flavor =
/// "multi_thread")]`): the engine's check runs the real engine, which spawns tasks and a
/// planner thread, against a fake API on 127.0.0.1.
pub async fn run_all<B: Backend>(backend: &mut B) -> Result<(), CheckFailed> {
    macro_rules! check {
        ($file:ident :: $check:ident) => {
            let run = AssertUnwindSafe($file::$check(&mut *backend)).catch_unwind();
            if let Err(panic) = run.await {
                return Err(CheckFailed {
                    check: stringify!($check),
                    message: panic_message(&*panic),
                });
            }
        };
    }
    check!(log::plans_are_durable_once_synced);
    check!(log::results_replace_by_id_and_a_replay_finds_only_pending_ids);
    check!(log::commits_are_final_and_fenced_by_their_lease);
    check!(reruns::a_rerun_moves_the_job_counts_once);
    check!(log::a_grown_input_plans_on_and_old_ids_stay_duplicates);
    check!(log::kept_columns_come_back_with_their_ids);
    check!(pages::pages_are_durable_as_a_prefix_and_read_back_in_order);
    check!(damage::damage_is_refused_never_read_as_less);
    check!(engine::the_engine_stops_and_resumes_every_id_exactly_once);
    check!(quota::quota_reservations_are_durable_and_never_exceed_a_limit);
    check!(quota::learnt_limits_are_kept_and_replaced);
    Ok(())
}

/// The message a panic carried (an assertion's), or a word that it had none.
fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "a panic without a message".to_string()
    }
}
