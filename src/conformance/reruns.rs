//! Reruns: a rerun moves the job's counts (and what its calls cost) once, whatever crashes in
//! between.

use super::backend::Backend;
use super::fixtures::{commit_of, lease, planned, planner_at, result};
use crate::store::*;

pub(super) async fn a_rerun_moves_the_job_counts_once<B: Backend>(b: &mut B) {
    let s = b.create();
    let plan = [planned(0, 0, &["a", "b"]), planned(1, 2, &["c", "d"])];
    s.plan(&plan, &planner_at(2, 4, true)).await.unwrap();
    let cost = |input, output| Some(crate::meter::Usage { input, output });
    let mut a = result(0, 0, true);
    a.usage = cost(10, 1);
    let mut b0 = result(1, 0, false);
    b0.usage = cost(5, 0);
    let first = [
        ("a".to_string(), a),
        ("b".to_string(), b0),
        ("c".to_string(), result(2, 1, false)),
        ("d".to_string(), result(3, 1, false)),
    ];
    let l = lease(&*s).await;
    s.record(&first).await.unwrap();
    s.sync().await.unwrap();
    let commits = [
        commit_of(0, &[&first[0].1, &first[1].1]),
        commit_of(1, &[&first[2].1, &first[3].1]),
    ];
    s.commit(&l, Commit::Job(&commits)).await.unwrap();
    s.sync().await.unwrap();
    // Rerun 1 of b and c, in one rerun bucket.
    let share = |bucket, input| JobBucketShare {
        bucket,
        ok: 0,
        failed: 1,
        failed_by_class: [("unknown".to_string(), 1)].into(),
        usage: crate::meter::Usage { input, output: 0 },
    };
    let rerun = RerunRecord {
        number: 1,
        selection: RerunSelection::Failed,
        buckets: 1,
        ids: 2,
        created_at_ms: 0,
    };
    let bucket = RerunBucket {
        offset: RerunOffset {
            rerun: 1,
            bucket: 0,
            items: 2,
            before: vec![share(0, 5), share(1, 0)],
            planned_at_ms: 0,
        },
        items: vec![(1, "b".into()), (2, "c".into())],
        values: Vec::new(),
    };
    s.create_rerun(&rerun, std::slice::from_ref(&bucket))
        .await
        .unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    assert_eq!(s.reruns().await.unwrap(), vec![rerun]);
    assert_eq!(
        s.rerun_open_buckets(1).await.unwrap(),
        vec![bucket.offset.clone()]
    );
    assert!(!s.rerun_stats(1).await.unwrap().finished());
    // b heals, c fails again.
    let l = lease(&*s).await;
    let mut healed = result(1, 0, true);
    healed.rerun = Some(1);
    // What b cost before the rerun and in it.
    healed.usage = cost(5 + 7, 3);
    let mut again = result(2, 1, false);
    again.rerun = Some(1);
    s.record(&[("b".into(), healed.clone()), ("c".into(), again.clone())])
        .await
        .unwrap();
    s.sync().await.unwrap();
    let rc = commit_of(0, &[&healed, &again]);
    view::commit(&*s, &l, Log::Rerun(1), std::slice::from_ref(&rc))
        .await
        .unwrap();
    view::commit(&*s, &l, Log::Rerun(1), &[rc]).await.unwrap(); // a repeat moves nothing
    s.sync().await.unwrap();
    let s = b.crash(s);
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.ok, stats.failed), (2, 2));
    assert_eq!(stats.usage, cost(10 + 12, 1 + 3).unwrap());
    let c0 = s.commit_record(0).await.unwrap().unwrap();
    assert_eq!((c0.ok, c0.failed, c0.failed_by_class.len()), (2, 0, 0));
    assert_eq!(
        c0.usage,
        cost(22, 4).unwrap(),
        "the rerun's spend moved once"
    );
    let c1 = s.commit_record(1).await.unwrap().unwrap();
    assert_eq!((c1.ok, c1.failed), (0, 2));
    assert!(c1.usage.is_zero());
    let items = s.bucket_items(&plan[0].offset).await.unwrap();
    assert_eq!(items[0].1.usage, cost(10, 1));
    assert_eq!(items[1].1.usage, cost(12, 3));
    assert!(c0.classes_complete() && c1.classes_complete());
    let r = s.rerun_stats(1).await.unwrap();
    assert!(r.finished());
    assert_eq!((r.ok, r.failed, r.pending), (1, 1, 0));
    assert!(s.rerun_open_buckets(1).await.unwrap().is_empty());
    let items = s.rerun_bucket_items(&bucket.offset).await.unwrap();
    assert_eq!(items.len(), 2);
}
