//! Reruns in the sled store: their ID lists, commit runs and job counts.

use super::*;

fn unknown(n: u64) -> std::collections::BTreeMap<String, u64> {
    [("unknown".to_string(), n)].into()
}

/// Rerun 1 (`--failed`) of one rerun bucket holding `items` (row, ID, job bucket), each
/// failed before.
fn failed_rerun(items: &[(u64, &str, u64)]) -> (RerunRecord, RerunBucket) {
    let n = items.len() as u64;
    let rerun = RerunRecord {
        number: 1,
        selection: RerunSelection::Failed,
        buckets: 1,
        ids: n,
        created_at_ms: 0,
    };
    let bucket = RerunBucket {
        offset: RerunOffset {
            rerun: 1,
            bucket: 0,
            items: n,
            before: items
                .iter()
                .map(|(_, _, bucket)| JobBucketShare {
                    bucket: *bucket,
                    ok: 0,
                    failed: 1,
                    failed_by_class: unknown(1),
                    usage: Default::default(),
                })
                .collect(),
            planned_at_ms: 0,
        },
        items: items
            .iter()
            .map(|(r, id, _)| (*r, id.to_string()))
            .collect(),
        values: Vec::new(),
    };
    (rerun, bucket)
}

/// A rerun's ID lists go to ids.log, not sled; a reopen followed by more planning (a grown
/// input) does not write over them; a format 3 rerun's inline lists still read, and
/// opening such a store marks it the current format.
#[tokio::test]
async fn rerun_id_lists_live_in_ids_log_and_survive_a_reopen_and_more_planning() {
    let dir = tempfile::tempdir().unwrap();
    async fn rerun_ids(s: &SledStore) -> Vec<String> {
        let offset = s.rerun_open_buckets(1).await.unwrap().remove(0);
        s.rerun_bucket_items(&offset)
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }
    let log_len = || {
        fs::metadata(dir.path().join(crate::store::sled_store::id_lists::FILE))
            .unwrap()
            .len()
    };
    {
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        let plan = vec![planned(0, &[(0, "a"), (1, "b")], 2)];
        s.plan(&plan, &PlannerState::default()).await.unwrap();
        let failed: Vec<(String, ItemRecord)> = [(0u64, "a"), (1, "b")]
            .iter()
            .map(|(row, id)| (id.to_string(), done(*row, 0, false)))
            .collect();
        s.record(&failed).await.unwrap();
        commit(
            &s,
            &[CommitRecord {
                bucket: 0,
                failed: 2,
                failed_by_class: unknown(2),
                ..CommitRecord::default()
            }],
        )
        .await;
        s.sync().await.unwrap();
        let before = log_len();
        let (rerun, bucket) = failed_rerun(&[(0, "a", 0), (1, "b", 0)]);
        s.create_rerun(&rerun, &[bucket]).await.unwrap();
        assert!(log_len() > before, "the list went to ids.log");
        let value = s
            .t()
            .unwrap()
            .rerun_ids
            .get(rerun_key(1, 0))
            .unwrap()
            .unwrap();
        assert_eq!(
            value.len(),
            ListRef::SIZE,
            "sled holds where it is, not the list"
        );
        s.sync().await.unwrap();
    }
    {
        let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
        // The input grew: a new bucket is planned after the rerun's list.
        let plan = vec![planned(1, &[(2, "c"), (3, "d")], 4)];
        s.plan(&plan, &PlannerState::default()).await.unwrap();
        s.sync().await.unwrap();
        assert_eq!(rerun_ids(&s).await, ["a", "b"]);
        // What format 3 wrote: the list inline in sled, the store marked 3.
        let t = s.t().unwrap();
        t.rerun_ids
            .insert(
                rerun_key(1, 0),
                encode_ids(&[(0, "a".to_string()), (1, "b".to_string())], &[]),
            )
            .unwrap();
        t.meta.insert("version", &3u32.to_be_bytes()).unwrap();
        t.flush().unwrap();
    }
    let marker = dir.path().join(MARKER);
    let text = fs::read_to_string(&marker).unwrap();
    fs::write(
        &marker,
        text.replace(&format!("\"version\":{FORMAT_VERSION}"), "\"version\":3"),
    )
    .unwrap();
    let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    assert_eq!(rerun_ids(&s).await, ["a", "b"]);
    let version = s.t().unwrap().meta.get("version").unwrap().unwrap();
    assert_eq!(version.as_ref(), FORMAT_VERSION.to_be_bytes());
    assert!(fs::read_to_string(&marker)
        .unwrap()
        .contains(&format!("\"version\":{FORMAT_VERSION}")));
    let items: Vec<String> = s
        .bucket_items(&s.offset(1).await.unwrap().unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(items, ["c", "d"]);
}

/// A rerun that heals IDs of several buckets of one commit run rewrites that run once,
/// moving each bucket's counts and keeping the others.
#[tokio::test]
async fn a_rerun_rewrites_the_commit_run_holding_its_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    let ids = ["a", "b", "c", "d"];
    let plan: Vec<PlannedBucket> = (0..4u64)
        .map(|i| planned(i, &[(i, ids[i as usize])], i + 1))
        .collect();
    s.plan(&plan, &PlannerState::default()).await.unwrap();
    let results: Vec<(String, ItemRecord)> = (0..4u64)
        .map(|i| (ids[i as usize].to_string(), done(i, i, i == 3)))
        .collect();
    s.record(&results).await.unwrap();
    let commits: Vec<CommitRecord> = (0..4u64)
        .map(|i| CommitRecord {
            bucket: i,
            ok: (i == 3) as u64,
            failed: (i != 3) as u64,
            committed_at_ms: 0,
            failed_by_class: if i == 3 { BTreeMap::new() } else { unknown(1) },
            usage: Default::default(),
        })
        .collect();
    commit(&s, &commits).await;
    assert_eq!(s.t().unwrap().commits.len(), 1);
    assert_eq!(s.commit_record(1).await.unwrap().unwrap().failed, 1);
    // Rerun bucket 0 holds a and c (buckets 0 and 2); both heal.
    let (rerun, bucket) = failed_rerun(&[(0, "a", 0), (2, "c", 2)]);
    s.create_rerun(&rerun, &[bucket]).await.unwrap();
    let healed: Vec<(String, ItemRecord)> = [(0u64, "a"), (2, "c")]
        .iter()
        .map(|(row, id)| {
            let mut r = done(*row, *row, true);
            r.rerun = Some(1);
            (id.to_string(), r)
        })
        .collect();
    s.record(&healed).await.unwrap();
    commit_rerun(
        &s,
        1,
        &[CommitRecord {
            bucket: 0,
            ok: 2,
            ..CommitRecord::default()
        }],
    )
    .await;
    assert_eq!(
        s.t().unwrap().commits.len(),
        1,
        "the run was rewritten in place"
    );
    let mut counts: Vec<(u64, u64)> = Vec::new();
    for b in 0..4 {
        let c = s.commit_record(b).await.unwrap().unwrap();
        counts.push((c.ok, c.failed));
    }
    assert_eq!(counts, vec![(1, 0), (0, 1), (1, 0), (1, 0)]);
    let failed: Vec<u64> = s
        .failed_buckets()
        .await
        .unwrap()
        .iter()
        .map(|c| c.bucket)
        .collect();
    assert_eq!(failed, vec![1]);
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.ok, stats.failed), (3, 1));
}

#[tokio::test]
async fn a_rerun_commit_moves_the_job_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    s.plan(
        &[
            planned(0, &[(0, "a"), (1, "b")], 2),
            planned(1, &[(2, "c"), (3, "d")], 4),
        ],
        &PlannerState::default(),
    )
    .await
    .unwrap();
    s.record(&[
        ("a".into(), done(0, 0, true)),
        ("b".into(), done(1, 0, false)),
        ("c".into(), done(2, 1, false)),
        ("d".into(), done(3, 1, false)),
    ])
    .await
    .unwrap();
    commit(
        &s,
        &[
            CommitRecord {
                bucket: 0,
                ok: 1,
                failed: 1,
                committed_at_ms: 0,
                failed_by_class: unknown(1),
                usage: Default::default(),
            },
            CommitRecord {
                bucket: 1,
                ok: 0,
                failed: 2,
                committed_at_ms: 0,
                failed_by_class: unknown(2),
                usage: Default::default(),
            },
        ],
    )
    .await;
    let mut failed = vec![];
    s.for_each_failure(None, &mut |id, _| {
        failed.push(id.to_string());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(failed, ["b", "c", "d"]);
    assert_eq!(s.failed_buckets().await.unwrap().len(), 2);

    let (rerun, bucket) = failed_rerun(&[(1, "b", 0), (2, "c", 1)]);
    s.create_rerun(&rerun, &[bucket]).await.unwrap();
    assert_eq!(s.reruns().await.unwrap(), vec![rerun]);
    let open = s.rerun_open_buckets(1).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(s.rerun_bucket_items(&open[0]).await.unwrap().len(), 2);
    assert!(!s.rerun_stats(1).await.unwrap().finished());

    // b heals, c fails again.
    let mut b = done(1, 0, true);
    b.rerun = Some(1);
    let mut c = done(2, 1, false);
    c.rerun = Some(1);
    s.record(&[("b".into(), b), ("c".into(), c)]).await.unwrap();
    let commit = CommitRecord {
        bucket: 0,
        ok: 1,
        failed: 1,
        ..CommitRecord::default()
    };
    commit_rerun(&s, 1, std::slice::from_ref(&commit)).await;
    commit_rerun(&s, 1, &[commit]).await; // a repeat moves nothing
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.ok, stats.failed), (2, 2));
    let (c0, c1) = (
        s.commit_record(0).await.unwrap().unwrap(),
        s.commit_record(1).await.unwrap().unwrap(),
    );
    assert_eq!((c0.failed, c0.failed_by_class.len()), (0, 0));
    assert_eq!((c1.failed, c1.failed_by_class.clone()), (2, unknown(2)));
    assert!(c0.classes_complete() && c1.classes_complete());
    assert_eq!(s.failed_buckets().await.unwrap().len(), 1);
    let r = s.rerun_stats(1).await.unwrap();
    assert!(r.finished());
    assert_eq!((r.ok, r.failed, r.pending), (1, 1, 0));
    assert!(s.rerun_open_buckets(1).await.unwrap().is_empty());
}
