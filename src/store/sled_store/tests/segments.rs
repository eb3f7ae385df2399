//! Planning, recording, committing and reopening: segments, commit runs, the run cache, corruption.

use super::*;

/// Past the threshold a sync closes and reopens sled (so it writes a snapshot): every
/// write before and after is kept, in this handle and after a new open; while someone
/// still holds the database the reopen gives up and nothing changes.
#[tokio::test]
async fn a_sync_past_the_threshold_reopens_the_database_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state");
    let ok = |b: u64| b % 3 != 0;
    // Results and ID lists no longer go to sled, offset and commit records do: plans of
    // 2,000 one-row buckets each, every one past the threshold (at least 1/32 of the
    // store's size on disk) while the store stays small.
    let id = |b: u64| format!("id{b}");
    let bucket = |b: u64| planned(b, &[(b, &id(b))], b + 1);
    let n = 12_000;
    let round = 2_000;
    let planner = |b: u64| PlannerState {
        next_bucket: b,
        cursor: Cursor {
            byte: b,
            line: b + 1,
            row: b,
        },
        exhausted: false,
    };
    {
        let s = SledStore::open(&path, OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        s.sync().await.unwrap();
        assert_eq!(
            s.reopens(),
            0,
            "nothing written yet past the default threshold"
        );
        s.set_reopen_after(1);

        // A reader holding the database: the reopen waits for it, then gives up.
        let before = s.reopens();
        let held = s.t().unwrap();
        let first: Vec<_> = (0..round).map(bucket).collect();
        s.plan(&first, &planner(round)).await.unwrap();
        s.sync().await.unwrap();
        assert_eq!(s.reopens(), before, "reopened under a reader");
        assert!(held.offsets.contains_key(0u64.to_be_bytes()).unwrap());
        drop(held);
        // The same writes, nobody holding the database now: this sync reopens it.
        s.sync().await.unwrap();
        assert_eq!(s.reopens(), before + 1);

        for b in (round..n).step_by(round as usize) {
            let next: Vec<_> = (b..b + round).map(bucket).collect();
            s.plan(&next, &planner(b + round)).await.unwrap();
            s.sync().await.unwrap();
        }
        let results: Vec<_> = (0..n).map(|b| (id(b), done(b, b, ok(b)))).collect();
        s.record(&results).await.unwrap();
        s.sync().await.unwrap();
        let mut commits = Vec::new();
        for b in 0..n {
            let mut tally = Tally::default();
            tally.add(&done(b, b, ok(b)));
            commits.push(CommitRecord::new(b, tally, crate::store::now_ms()));
        }
        commit(&s, &commits).await;
        s.sync().await.unwrap();
        assert!(s.reopens() >= before + 5, "{} reopens", s.reopens());
        for b in 0..n {
            let r = s.item(&id(b)).await.unwrap().expect("kept across reopens");
            assert_eq!((r.row, r.is_final()), (b, true));
        }
    }
    let s = SledStore::open(&path, OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    let stats = s.stats().await.unwrap();
    let oks = (0..n).filter(|b| ok(*b)).count() as u64;
    assert_eq!(
        (
            stats.buckets_committed,
            stats.ok,
            stats.failed,
            stats.pending
        ),
        (n, oks, n - oks, 0)
    );
    let mut seen = Vec::new();
    s.for_each_final(&mut |id, r| {
        seen.push((id.to_string(), r.row));
        Ok(())
    })
    .await
    .unwrap();
    let expected: Vec<_> = (0..n).map(|b| (id(b), b)).collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn plan_record_commit_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state");
    {
        let s = SledStore::open(&path, OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        let p = PlannerState {
            next_bucket: 2,
            cursor: Cursor {
                row: 4,
                line: 5,
                byte: 8,
            },
            exhausted: true,
        };
        s.plan(
            &[
                planned(0, &[(0, "a"), (1, "b")], 2),
                planned(1, &[(2, "c"), (3, "d")], 4),
            ],
            &p,
        )
        .await
        .unwrap();
        s.sync().await.unwrap();
        assert!(s.item("c").await.unwrap().is_none());
        // Planned IDs are noted with their first rows: a repeat is a duplicate.
        assert_eq!(first_row(&s, "c", 7).await, Some(2));
        assert_eq!(first_row(&s, "c", 2).await, None, "the same row again");
        assert_eq!(first_row(&s, "new", 8).await, None);
        assert_eq!(first_row(&s, "new", 9).await, Some(8));
        s.record(&[
            ("a".into(), done(0, 0, true)),
            ("b".into(), done(1, 0, false)),
        ])
        .await
        .unwrap();
        s.sync().await.unwrap();
        assert!(s.item("a").await.unwrap().is_some_and(|r| r.is_final()));
        commit(
            &s,
            &[CommitRecord {
                bucket: 0,
                ok: 1,
                failed: 1,
                ..CommitRecord::default()
            }],
        )
        .await;
        s.record(&[("d".into(), done(3, 1, true))]).await.unwrap();
        s.sync().await.unwrap();
    }
    let s = SledStore::open(&path, OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    let open = s.open_buckets().await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].bucket, 1);
    let items = s.bucket_items(&open[0]).await.unwrap();
    assert_eq!(
        items.iter().map(|i| i.0.as_str()).collect::<Vec<_>>(),
        vec!["c", "d"]
    );
    assert!(!items[0].1.is_final());
    assert!(items[1].1.is_final());
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.ok, stats.failed, stats.pending), (2, 1, 1));
    assert_eq!(
        (
            stats.buckets_planned,
            stats.buckets_committed,
            stats.buckets_in_flight
        ),
        (2, 1, 1)
    );
    assert!(!stats.finished());
    let mut seen = vec![];
    s.for_each_final(&mut |id, r| {
        seen.push((id.to_string(), r.status));
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(
        seen,
        vec![
            ("a".into(), ItemStatus::Ok),
            ("b".into(), ItemStatus::Failed),
            ("d".into(), ItemStatus::Ok)
        ]
    );
}

/// Buckets planned together share one offset record; every reader sees each bucket.
#[tokio::test]
async fn one_row_buckets_share_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    // Rows 0..5, one per bucket; row 2 repeats row 0's ID (no items); bucket 7 follows a
    // gap in the bucket numbers, so it starts a segment of its own.
    let mut first: Vec<PlannedBucket> = ["a", "b", "", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let i = i as u64;
            if id.is_empty() {
                let mut b = planned(i, &[], i + 1);
                b.offset.start = offset(i, i, i + 1, 0).start;
                b.offset.duplicates = 1;
                b
            } else {
                planned(i, &[(i, id)], i + 1)
            }
        })
        .collect();
    first.push(planned(7, &[(9, "z")], 10));
    let p = PlannerState::default();
    s.plan(&first, &p).await.unwrap();
    s.plan(
        &[planned(5, &[(5, "e")], 6), planned(6, &[(6, "f")], 7)],
        &p,
    )
    .await
    .unwrap();
    assert_eq!(s.t().unwrap().offsets.len(), 3, "segments: 0..=4, 7, 5..=6");
    for b in first.iter().chain([&planned(5, &[(5, "e")], 6)]) {
        assert_eq!(
            s.offset(b.offset.bucket).await.unwrap().as_ref(),
            Some(&b.offset)
        );
    }
    assert_eq!(s.offset(8).await.unwrap(), None);
    assert_eq!(s.offset(70).await.unwrap(), None);
    let open: Vec<u64> = s
        .open_buckets()
        .await
        .unwrap()
        .iter()
        .map(|o| o.bucket)
        .collect();
    assert_eq!(open, vec![0, 1, 2, 3, 4, 5, 6, 7]);
    s.record(&[
        ("c".into(), done(3, 3, true)),
        ("f".into(), done(6, 6, false)),
    ])
    .await
    .unwrap();
    commit(
        &s,
        &[CommitRecord {
            bucket: 3,
            ok: 1,
            ..CommitRecord::default()
        }],
    )
    .await;
    commit(
        &s,
        &[CommitRecord {
            bucket: 2,
            ..CommitRecord::default()
        }],
    )
    .await;
    let open: Vec<u64> = s
        .open_buckets()
        .await
        .unwrap()
        .iter()
        .map(|o| o.bucket)
        .collect();
    assert_eq!(open, vec![0, 1, 4, 5, 6, 7]);
    let items = s
        .bucket_items(&s.offset(4).await.unwrap().unwrap())
        .await
        .unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!((items[0].0.as_str(), items[0].1.row), ("d", 4));
    assert!(s
        .bucket_items(&s.offset(2).await.unwrap().unwrap())
        .await
        .unwrap()
        .is_empty());
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (
            stats.buckets_planned,
            stats.buckets_committed,
            stats.buckets_in_flight
        ),
        (8, 2, 6)
    );
    assert_eq!(
        (stats.ids_planned, stats.ok, stats.failed, stats.pending),
        (7, 1, 1, 5)
    );
    assert_eq!(stats.duplicates, 1);
    let mut seen = vec![];
    s.for_each_final(&mut |id, _| {
        seen.push(id.to_string());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(seen, vec!["c", "f"]);
    let mut failed = vec![];
    s.for_each_failure(None, &mut |id, r| {
        failed.push((id.to_string(), r.bucket));
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(failed, vec![("f".to_string(), 6)]);
}

/// Buckets committed by one write share a commit record per consecutive run; a bucket is
/// committed once.
#[tokio::test]
async fn commits_are_stored_in_runs_and_are_final() {
    let (_dir, s) = store_of_one_row_buckets(8).await;
    let c = |bucket: u64, ok: u64| CommitRecord {
        bucket,
        ok,
        failed: 1 - ok,
        ..CommitRecord::default()
    };
    commit(&s, &[c(3, 1), c(1, 1), c(2, 0), c(5, 1), c(3, 1)]).await;
    assert_eq!(s.t().unwrap().commits.len(), 2, "runs 1..=3 and 5");
    assert_eq!(s.commit_record(2).await.unwrap(), Some(c(2, 0)));
    assert_eq!(s.commit_record(4).await.unwrap(), None);
    assert_eq!(s.commit_record(0).await.unwrap(), None);
    // 2 is committed already and keeps its record; 4 joins the log.
    commit(&s, &[c(2, 1), c(4, 1)]).await;
    assert_eq!(s.commit_record(2).await.unwrap(), Some(c(2, 0)));
    assert_eq!(s.commit_record(4).await.unwrap(), Some(c(4, 1)));
    commit(&s, &[c(0, 1), c(1, 1), c(6, 1), c(7, 1)]).await;
    assert_eq!(s.commit_record(1).await.unwrap(), Some(c(1, 1)));
    let mut committed = Vec::new();
    for b in 0..9 {
        if s.commit_record(b).await.unwrap().is_some() {
            committed.push(b);
        }
    }
    assert_eq!(committed, (0..8).collect::<Vec<_>>());
    assert!(s.open_buckets().await.unwrap().is_empty());
    let failed: Vec<u64> = s
        .failed_buckets()
        .await
        .unwrap()
        .iter()
        .map(|c| c.bucket)
        .collect();
    assert_eq!(failed, vec![2]);
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.buckets_committed, stats.ok, stats.failed), (8, 7, 1));
}

/// The run cache is neither used nor filled while a rewrite of runs is in progress (an
/// odd generation), and what was cached before it is not served after it.
#[tokio::test]
async fn the_run_cache_never_serves_a_run_across_a_rewrite() {
    let (_dir, s) = store_of_one_row_buckets(2).await;
    let c = |bucket: u64, ok: u64| CommitRecord {
        bucket,
        ok,
        ..CommitRecord::default()
    };
    commit(&s, &[c(0, 1), c(1, 1)]).await;
    assert_eq!(s.commit_record(1).await.unwrap().unwrap().ok, 1); // cached now
                                                                  // A rewrite starts; sled gets the new run while it is in progress.
    let rewriting = Rewriting::start(&s.runs_rewritten);
    s.t()
        .unwrap()
        .commits
        .insert(0u64.to_be_bytes(), json(&[c(0, 7), c(1, 7)]))
        .unwrap();
    assert_eq!(s.commit_record(1).await.unwrap().unwrap().ok, 7);
    s.t()
        .unwrap()
        .commits
        .insert(0u64.to_be_bytes(), json(&[c(0, 8), c(1, 8)]))
        .unwrap();
    assert_eq!(
        s.commit_record(0).await.unwrap().unwrap().ok,
        8,
        "nothing cached mid-rewrite"
    );
    drop(rewriting);
    assert_eq!(s.commit_record(1).await.unwrap().unwrap().ok, 8);
    assert_eq!(s.commit_record(0).await.unwrap().unwrap().ok, 8);
}

/// A long run of commits is split into records of at most [`MAX_COMMIT_RUN`] buckets.
#[tokio::test]
async fn long_commit_runs_are_split() {
    let n = 2 * MAX_COMMIT_RUN as u64 + 88;
    let (_dir, s) = store_of_one_row_buckets(n).await;
    assert_eq!(s.t().unwrap().offsets.len(), 1);
    let commits: Vec<CommitRecord> = (0..n)
        .map(|bucket| CommitRecord {
            bucket,
            ok: 1,
            ..CommitRecord::default()
        })
        .collect();
    commit(&s, &commits).await;
    assert_eq!(s.t().unwrap().commits.len(), 3);
    for b in [0, 255, 256, 511, 512, n - 1] {
        assert_eq!(s.commit_record(b).await.unwrap().map(|c| c.bucket), Some(b));
    }
    assert_eq!(s.commit_record(n).await.unwrap(), None);
    assert!(s.open_buckets().await.unwrap().is_empty());
    assert_eq!(s.stats().await.unwrap().ok, n);
}

/// A segment whose ID list disagrees with its counts is reported as corrupt.
#[tokio::test]
async fn a_segment_with_missing_ids_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    s.plan(
        &[planned(0, &[(0, "a")], 1), planned(1, &[(1, "b")], 2)],
        &PlannerState::default(),
    )
    .await
    .unwrap();
    let short = s
        .id_lists
        .append(&[encode_ids(&[(0, "a".to_string())], &[])])
        .unwrap()[0];
    s.t()
        .unwrap()
        .ids
        .insert(0u64.to_be_bytes(), &short.to_bytes())
        .unwrap();
    let err = s
        .bucket_items(&s.offset(1).await.unwrap().unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(err.root(), StoreError::Corrupt { .. })
            && err.to_string().contains("buckets 0..=1"),
        "{err}"
    );
    assert!(s.stats().await.is_err());
    assert!(s.for_each_final(&mut |_, _| Ok(())).await.is_err());
}
