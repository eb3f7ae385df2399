//! The store's log invariants: plans are durable once synced, results replace by ID and a
//! replay finds only pending IDs, commits are final and fenced by their lease, and a grown
//! input plans on without calling old IDs again.

use super::backend::Backend;
use super::fixtures::{commit_of, cursor, finals, lease, planned, planner_at, result};
use crate::store::*;

pub(super) async fn plans_are_durable_once_synced<B: Backend>(b: &mut B) {
    let s = b.create();
    assert!(s.job().await.unwrap().is_none());
    let job = StoredJob {
        id: "j1".into(),
        version: 3,
        spec: b"opaque \x00 bytes".to_vec(),
    };
    s.put_job(&job).await.unwrap();
    let rows = [(0, "a"), (1, "b"), (2, "a"), (3, "c")];
    assert_eq!(
        s.first_rows(&rows).await.unwrap(),
        vec![None, None, Some(0), None],
        "a repeat within the batch is judged too"
    );
    let plan = [planned(0, 0, &["a", "b"]), planned(1, 3, &["c"])];
    s.plan(&plan, &planner_at(2, 4, false)).await.unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    assert_eq!(
        s.job().await.unwrap(),
        Some(job),
        "the job is kept as it was given"
    );
    assert_eq!(s.planner().await.unwrap(), planner_at(2, 4, false));
    let buckets = s.buckets(0, 10).await.unwrap();
    let offsets: Vec<_> = buckets.iter().map(|b| b.offset.clone()).collect();
    assert_eq!(
        offsets,
        vec![plan[0].offset.clone(), plan[1].offset.clone()]
    );
    assert!(buckets.iter().all(|b| b.commit.is_none()));
    assert_eq!(
        s.buckets(1, 10).await.unwrap().len(),
        1,
        "a page from bucket 1"
    );
    assert_eq!(s.buckets(0, 1).await.unwrap().len(), 1, "at most `limit`");
    let items = s.bucket_items(&plan[0].offset).await.unwrap();
    assert_eq!(
        items
            .iter()
            .map(|(id, r)| (id.as_str(), r.row, r.status))
            .collect::<Vec<_>>(),
        vec![("a", 0, ItemStatus::Pending), ("b", 1, ItemStatus::Pending)]
    );
    // Planned IDs are noted with their first rows: read again later, they are repeats; the
    // same row read again (planning again after a crash) is not.
    assert_eq!(
        s.first_rows(&[(9, "b"), (3, "c"), (10, "new")])
            .await
            .unwrap(),
        vec![Some(1), None, None]
    );
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (
            stats.buckets_planned,
            stats.ids_planned,
            stats.pending,
            stats.rows_read
        ),
        (2, 3, 3, 4)
    );
    assert!(!stats.finished());
}

pub(super) async fn results_replace_by_id_and_a_replay_finds_only_pending_ids<B: Backend>(
    b: &mut B,
) {
    let s = b.create();
    let plan = [planned(0, 0, &["a", "b"]), planned(1, 2, &["c", "d"])];
    s.plan(&plan, &planner_at(2, 4, true)).await.unwrap();
    s.sync().await.unwrap();
    // Results are written under a lease (a fleet's backend drops the others).
    let _lease = lease(&*s).await;
    s.record(&[("a".into(), result(0, 0, false))])
        .await
        .unwrap();
    // The same ID again: its record is replaced, never added.
    s.record(&[
        ("a".into(), result(0, 0, true)),
        ("c".into(), result(2, 1, true)),
    ])
    .await
    .unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    let open: Vec<u64> = s
        .open_buckets()
        .await
        .unwrap()
        .iter()
        .map(|o| o.bucket)
        .collect();
    assert_eq!(open, vec![0, 1], "nothing is committed");
    let pending: Vec<String> = {
        let mut out = Vec::new();
        for o in s.open_buckets().await.unwrap() {
            for (id, r) in s.bucket_items(&o).await.unwrap() {
                if !r.is_final() {
                    out.push(id);
                }
            }
        }
        out
    };
    assert_eq!(pending, ["b", "d"], "a replay calls only these");
    assert_eq!(
        s.item("a").await.unwrap().map(|r| r.status),
        Some(ItemStatus::Ok)
    );
    assert!(s.item("b").await.unwrap().is_none_or(|r| !r.is_final()));
    assert_eq!(
        finals(&*s).await.unwrap(),
        vec![("a".into(), ItemStatus::Ok), ("c".into(), ItemStatus::Ok)]
    );
}

pub(super) async fn commits_are_final_and_fenced_by_their_lease<B: Backend>(b: &mut B) {
    let s = b.create();
    let plan = [
        planned(0, 0, &["a"]),
        planned(1, 1, &["b"]),
        planned(2, 2, &["c"]),
    ];
    s.plan(&plan, &planner_at(3, 3, true)).await.unwrap();
    let old = lease(&*s).await;
    let (ra, rb, rc) = (result(0, 0, true), result(1, 1, false), result(2, 2, true));
    s.record(&[
        ("a".into(), ra.clone()),
        ("b".into(), rb.clone()),
        ("c".into(), rc.clone()),
    ])
    .await
    .unwrap();
    s.sync().await.unwrap();
    let new = lease(&*s).await;
    assert!(
        new.token > old.token,
        "a later lease carries a larger token"
    );
    let c0 = commit_of(0, &[&ra]);
    let refused = s.commit(&old, Commit::Job(std::slice::from_ref(&c0))).await;
    assert!(
        matches!(
            refused.as_ref().map_err(StoreError::root),
            Err(StoreError::LeaseLost { .. })
        ),
        "a superseded lease commits nothing: {refused:?}"
    );
    assert!(s.commit_record(0).await.unwrap().is_none());
    s.renew(&new).await.unwrap();
    assert!(s.renew(&old).await.is_err());
    s.commit(&new, Commit::Job(&[c0.clone(), commit_of(1, &[&rb])]))
        .await
        .unwrap();
    // A bucket is committed once: a second commit of it changes nothing.
    let again = CommitRecord {
        ok: 5,
        ..c0.clone()
    };
    s.commit(&new, Commit::Job(&[again, commit_of(2, &[&rc])]))
        .await
        .unwrap();
    s.sync().await.unwrap();
    s.release(&new).await.unwrap();
    let late = s.commit(&new, Commit::Job(&[])).await;
    assert!(late.is_err(), "a released lease commits nothing");
    let s = b.crash(s);
    assert_eq!(s.commit_record(0).await.unwrap(), Some(c0));
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (
            stats.buckets_committed,
            stats.ok,
            stats.failed,
            stats.pending
        ),
        (3, 2, 1, 0)
    );
    assert!(stats.finished());
    let failed: Vec<u64> = s
        .failed_buckets()
        .await
        .unwrap()
        .iter()
        .map(|c| c.bucket)
        .collect();
    assert_eq!(failed, vec![1]);
    let mut failures = Vec::new();
    s.for_each_failure(None, &mut |id, _| {
        failures.push(id.to_string());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(failures, ["b"]);
}

pub(super) async fn a_grown_input_plans_on_and_old_ids_stay_duplicates<B: Backend>(b: &mut B) {
    let s = b.create();
    let rows = [(0, "a"), (1, "b")];
    assert_eq!(s.first_rows(&rows).await.unwrap(), vec![None, None]);
    s.plan(&[planned(0, 0, &["a", "b"])], &planner_at(1, 2, true))
        .await
        .unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    // The input grew: the planner goes on from where it stopped.
    s.set_planner(&planner_at(1, 2, false)).await.unwrap();
    let grown = [(2, "c"), (3, "a")];
    assert_eq!(
        s.first_rows(&grown).await.unwrap(),
        vec![None, Some(0)],
        "an old ID in the new rows is a duplicate"
    );
    let mut next = planned(1, 2, &["c"]);
    next.offset.end = cursor(4);
    next.offset.duplicates = 1;
    s.plan(&[next], &planner_at(2, 4, true)).await.unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (
            stats.buckets_planned,
            stats.ids_planned,
            stats.duplicates,
            stats.rows_read
        ),
        (2, 3, 1, 4)
    );
    assert!(stats.input_exhausted);
}

/// The kept columns of each ID's input row come back with it, pending or final, after a
/// crash, in the export's walk and in a rerun's buckets: a replay, a rerun and a fleet's
/// workers send the request the first attempt sent.
pub(super) async fn kept_columns_come_back_with_their_ids<B: Backend>(b: &mut B) {
    let s = b.create();
    let values = |id: &str| format!(r#"{{"name":"{id} & Co, \"é\"","n":7}}"#);
    let mut plan = [planned(0, 0, &["a", "b"]), planned(1, 2, &["c"])];
    for bucket in &mut plan {
        bucket.values = bucket.items.iter().map(|(_, id)| values(id)).collect();
    }
    s.plan(&plan, &planner_at(2, 3, true)).await.unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    let kept = |items: &[(String, ItemRecord)]| -> Vec<(String, Option<String>)> {
        items
            .iter()
            .map(|(id, r)| (id.clone(), r.values.as_deref().map(String::from)))
            .collect()
    };
    let expect = |ids: &[&str]| -> Vec<(String, Option<String>)> {
        ids.iter()
            .map(|id| (id.to_string(), Some(values(id))))
            .collect()
    };
    let items = s.bucket_items(&plan[0].offset).await.unwrap();
    assert_eq!(kept(&items), expect(&["a", "b"]), "pending items");
    let l = lease(&*s).await;
    let done = [
        ("a".to_string(), result(0, 0, true)),
        ("b".to_string(), result(1, 0, false)),
    ];
    s.record(&done).await.unwrap();
    s.sync().await.unwrap();
    s.commit(&l, Commit::Job(&[commit_of(0, &[&done[0].1, &done[1].1])]))
        .await
        .unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    let items = s.bucket_items(&plan[0].offset).await.unwrap();
    assert_eq!(kept(&items), expect(&["a", "b"]), "final records");
    let mut walked = Vec::new();
    s.for_each_final(&mut |id, r| {
        walked.push((id.to_string(), r.values.as_deref().map(String::from)));
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(walked, expect(&["a", "b"]), "the export's walk");
    // A rerun of b: its bucket's items carry b's values.
    let rerun = RerunRecord {
        number: 1,
        selection: RerunSelection::Failed,
        buckets: 1,
        ids: 1,
        created_at_ms: 0,
    };
    let bucket = RerunBucket {
        offset: RerunOffset {
            rerun: 1,
            bucket: 0,
            items: 1,
            before: vec![],
            planned_at_ms: 0,
        },
        items: vec![(1, "b".into())],
        values: vec![values("b")],
    };
    s.create_rerun(&rerun, std::slice::from_ref(&bucket))
        .await
        .unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    let items = s.rerun_bucket_items(&bucket.offset).await.unwrap();
    assert_eq!(kept(&items), expect(&["b"]), "a rerun's items");
}
