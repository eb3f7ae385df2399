//! The whole suite ([`run_all`]): every check, in order, against one backend.

use super::backend::Backend;
use super::{damage, engine, log, quota, reruns};

/// Run every check against `backend`.
pub(crate) async fn run_all<B: Backend>(backend: &mut B) {
    log::plans_are_durable_once_synced(backend).await;
    log::results_replace_by_id_and_a_replay_finds_only_pending_ids(backend).await;
    log::commits_are_final_and_fenced_by_their_lease(backend).await;
    reruns::a_rerun_moves_the_job_counts_once(backend).await;
    log::a_grown_input_plans_on_and_old_ids_stay_duplicates(backend).await;
    log::kept_columns_come_back_with_their_ids(backend).await;
    damage::damage_is_refused_never_read_as_less(backend).await;
    engine::the_engine_stops_and_resumes_every_id_exactly_once(backend).await;
    quota::quota_reservations_are_durable_and_never_exceed_a_limit(backend).await;
    quota::learnt_limits_are_kept_and_replaced(backend).await;
}
