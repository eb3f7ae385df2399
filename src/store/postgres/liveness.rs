//! Whether a lease's holder is alive, as statements that lock or move a lease ask it: the
//! job's live sessions joined as one row (`live`), never a correlated sub-select per row.
//!
//! When such a statement meets a row another transaction changed after its snapshot,
//! PostgreSQL rechecks the row's newest version (EvalPlanQual). A relation joined in `FROM`
//! is rechecked against the row it was first joined to; a correlated `NOT EXISTS` on
//! `hw_worker` inside the recheck was seen to answer as if the new holder had no session:
//! PostgreSQL 15 handed a bucket a live worker had just leased to a second worker (the
//! bucket tests' concurrent acquirers, about one run in 50 on a loaded machine; none in 450
//! with the join).

/// The job's live sessions as one row, a `FROM` item named `live`: `live.ids`, the ids of
/// job `$1`'s sessions that have not expired, and `live.me_live`, whether session `$2` is
/// among them and not draining.
///
/// A holder is alive when `owner = ANY (live.ids)` (so taken over when `<> ALL`).
macro_rules! live_sessions {
    () => {
        "(SELECT coalesce(array_agg(s.worker_id) FILTER (WHERE s.expires_at > now()), '{}')
                     AS ids,
                 coalesce(bool_or(s.worker_id = $2::text::uuid AND s.expires_at > now()
                                  AND NOT s.draining), false) AS me_live
          FROM hw_worker s WHERE s.job_id = $1) live"
    };
}

pub(crate) use live_sessions;
