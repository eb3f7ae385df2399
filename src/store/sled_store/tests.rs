//! The sled backend's own tests (the conformance suite runs the shared ones).

use super::*;
use std::fs::File;
use std::os::fd::AsRawFd;

/// Commit job buckets under a lease, as a run does.
async fn commit(s: &SledStore, commits: &[CommitRecord]) {
    let lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
    s.commit(&lease, Commit::Job(commits)).await.unwrap();
}

/// Commit rerun buckets under a lease, with the counts they move.
async fn commit_rerun(s: &SledStore, rerun: u32, commits: &[CommitRecord]) {
    let lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
    super::super::view::commit(s, &lease, Log::Rerun(rerun), commits)
        .await
        .unwrap();
}

async fn first_row(s: &SledStore, id: &str, row: u64) -> Option<u64> {
    s.first_rows(&[(row, id)]).await.unwrap()[0]
}

fn offset(bucket: u64, start: u64, end: u64, items: u64) -> OffsetRecord {
    OffsetRecord {
        bucket,
        start: Cursor {
            row: start,
            line: start + 1,
            byte: start * 2,
        },
        end: Cursor {
            row: end,
            line: end + 1,
            byte: end * 2,
        },
        items,
        duplicates: 0,
        bad_lines: 0,
        input: Fingerprint { len: 10, xxh3: 1 },
        planned_at_ms: 0,
    }
}

fn planned(bucket: u64, ids: &[(u64, &str)], end: u64) -> PlannedBucket {
    let start = ids.first().map(|i| i.0).unwrap_or(end);
    PlannedBucket {
        offset: offset(bucket, start, end, ids.len() as u64),
        items: ids.iter().map(|(r, i)| (*r, i.to_string())).collect(),
        bad_lines: vec![],
    }
}

/// Buckets 0..n of one row each, holding the IDs "id0", "id1", ...
fn one_row_buckets(n: u64) -> Vec<PlannedBucket> {
    (0..n)
        .map(|i| planned(i, &[(i, &format!("id{i}"))], i + 1))
        .collect()
}

/// A new store with [`one_row_buckets`]`(n)` planned.
async fn store_of_one_row_buckets(n: u64) -> (tempfile::TempDir, SledStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    s.plan(&one_row_buckets(n), &PlannerState::default())
        .await
        .unwrap();
    (dir, s)
}

fn done(row: u64, bucket: u64, ok: bool) -> ItemRecord {
    let mut r = ItemRecord::pending(row, bucket);
    r.status = if ok {
        ItemStatus::Ok
    } else {
        ItemStatus::Failed
    };
    r.attempts = 1;
    if ok {
        r.body = Some(serde_json::value::to_raw_value(&serde_json::json!({"v": row})).unwrap());
    } else {
        r.error = Some("HTTP 404".into());
    }
    r
}

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
            commits.push(CommitRecord::new(b, tally));
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
        .append(&[encode_ids(&[(0, "a".to_string())])])
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

/// A format 1 store (one offset record per bucket, results in sled) opens, is upgraded to
/// the current format (its results moved to the results log), and reads.
#[tokio::test]
async fn format_1_stores_open_and_read() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        for b in [
            planned(0, &[(0, "a"), (1, "b")], 2),
            planned(1, &[(2, "c")], 3),
            planned(2, &[(3, "d")], 4),
        ] {
            let key = b.offset.bucket.to_be_bytes();
            s.t().unwrap().offsets.insert(key, json(&b.offset)).unwrap();
            s.t()
                .unwrap()
                .ids
                .insert(key, encode_ids(&b.items))
                .unwrap();
        }
        let commit = CommitRecord {
            bucket: 2,
            ok: 1,
            ..CommitRecord::default()
        };
        s.t()
            .unwrap()
            .commits
            .insert(2u64.to_be_bytes(), json(&commit))
            .unwrap();
        // Format 1 and 2 kept each result in sled, under its ID.
        let items = &s.t().unwrap().items;
        items.insert("d", json(&done(3, 2, true))).unwrap();
        s.t()
            .unwrap()
            .meta
            .insert("version", &1u32.to_be_bytes())
            .unwrap();
        items.insert("a", json(&done(0, 0, true))).unwrap();
        s.sync().await.unwrap();
    }
    // What an upgrade that stopped half way left: it starts over.
    fs::write(
        dir.path().join(super::super::results_log::LOG_FILE),
        b"half an upgrade",
    )
    .unwrap();
    let marker = dir.path().join(MARKER);
    let text = fs::read_to_string(&marker).unwrap();
    let current = format!("\"version\":{FORMAT_VERSION}");
    fs::write(&marker, text.replace(&current, "\"version\":1")).unwrap();
    assert!(fs::read_to_string(&marker)
        .unwrap()
        .contains("\"version\":1"));
    let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    assert!(fs::read_to_string(&marker).unwrap().contains(&current));
    assert!(s.t().unwrap().items.is_empty(), "moved out of sled");
    assert!(s.item("a").await.unwrap().is_some() && s.item("b").await.unwrap().is_none());
    assert_eq!(first_row(&s, "b", 9).await, Some(1), "the IDs were indexed");
    assert_eq!(s.item("d").await.unwrap().map(|r| r.row), Some(3));
    assert_eq!(
        s.t()
            .unwrap()
            .meta
            .get("version")
            .unwrap()
            .unwrap()
            .as_ref(),
        FORMAT_VERSION.to_be_bytes()
    );
    let open: Vec<u64> = s
        .open_buckets()
        .await
        .unwrap()
        .iter()
        .map(|o| o.bucket)
        .collect();
    assert_eq!(open, vec![0, 1]);
    let items = s
        .bucket_items(&s.offset(0).await.unwrap().unwrap())
        .await
        .unwrap();
    assert_eq!(
        items
            .iter()
            .map(|(id, r)| (id.as_str(), r.is_final()))
            .collect::<Vec<_>>(),
        vec![("a", true), ("b", false)]
    );
    assert_eq!(s.commit_record(2).await.unwrap().map(|c| c.ok), Some(1));
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (stats.ids_planned, stats.ok, stats.buckets_committed),
        (4, 2, 1)
    );
    // New plans and commits are written as segments and runs beside the old records.
    s.plan(
        &[planned(3, &[(4, "e")], 5), planned(4, &[(5, "f")], 6)],
        &PlannerState::default(),
    )
    .await
    .unwrap();
    commit(
        &s,
        &[CommitRecord {
            bucket: 3,
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
    assert_eq!(open, vec![0, 1, 4]);
    // An upgrade that stopped between the database and the marker is finished.
    drop(s);
    let text = fs::read_to_string(&marker).unwrap();
    fs::write(&marker, text.replace(&current, "\"version\":1")).unwrap();
    drop(SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap());
    assert!(fs::read_to_string(&marker).unwrap().contains(&current));
}

/// sled's own file lock, still held for a moment by the threads of a handle just dropped,
/// does not fail the next open: it waits for it.
#[tokio::test]
async fn an_open_waits_for_sleds_lock_to_be_let_go() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap());
    let db = File::open(dir.path().join("sled").join("db")).unwrap();
    // SAFETY: flock on a file descriptor we own.
    assert_eq!(unsafe { libc::flock(db.as_raw_fd(), libc::LOCK_EX) }, 0);
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(db);
    });
    let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES);
    release.join().unwrap();
    assert!(s.is_ok(), "{:?}", s.err());
}

#[tokio::test]
async fn second_open_is_busy_and_names_the_pid() {
    let dir = tempfile::tempdir().unwrap();
    let _s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    let err = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES)
        .err()
        .unwrap();
    match err.root() {
        StoreError::Busy { pid, .. } => assert_eq!(*pid, Some(std::process::id())),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn foreign_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = SledStore::open(
        &dir.path().join("nope"),
        OpenMode::Existing,
        DEFAULT_CACHE_BYTES,
    )
    .err()
    .unwrap();
    assert!(matches!(err.root(), StoreError::NotAStore { .. }), "{err}");
    fs::write(dir.path().join("file.txt"), "x").unwrap();
    let err = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES)
        .err()
        .unwrap();
    assert!(matches!(err.root(), StoreError::NotAStore { .. }), "{err}");
    let err = SledStore::open(
        &dir.path().join("file.txt"),
        OpenMode::CreateIfMissing,
        DEFAULT_CACHE_BYTES,
    )
    .err()
    .unwrap();
    assert!(matches!(err.root(), StoreError::NotAStore { .. }), "{err}");
}

#[tokio::test]
async fn unknown_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap());
    fs::write(
        dir.path().join(MARKER),
        r#"{"format":"highwater-state","version":99}"#,
    )
    .unwrap();
    let err = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES)
        .err()
        .unwrap();
    assert!(
        matches!(err.root(), StoreError::Version { found: 99, .. }),
        "{err}"
    );
}

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
                })
                .collect(),
            planned_at_ms: 0,
        },
        items: items
            .iter()
            .map(|(r, id, _)| (*r, id.to_string()))
            .collect(),
    };
    (rerun, bucket)
}

/// A rerun's ID lists go to ids.log, not sled; a reopen followed by more planning (a grown
/// input) does not write over them; a format 3 rerun's inline lists still read, and
/// opening such a store marks it format 4.
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
        fs::metadata(dir.path().join(super::super::id_lists::FILE))
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
                encode_ids(&[(0, "a".to_string()), (1, "b".to_string())]),
            )
            .unwrap();
        t.meta.insert("version", &3u32.to_be_bytes()).unwrap();
        t.db.flush().unwrap();
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
            },
            CommitRecord {
                bucket: 1,
                ok: 0,
                failed: 2,
                committed_at_ms: 0,
                failed_by_class: unknown(2),
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

#[tokio::test]
async fn records_written_before_the_newer_fields_still_load() {
    let old = r#"{"bucket":4,"ok":9,"failed":1,"committed_at_ms":5}"#;
    let c: CommitRecord = serde_json::from_str(old).unwrap();
    assert!(c.failed_by_class.is_empty() && !c.classes_complete());
    let old = r#"{"row":3,"bucket":0,"status":"failed","http_status":404,"class":"http","error":"HTTP 404","attempts":1}"#;
    let r: ItemRecord = serde_json::from_str(old).unwrap();
    assert_eq!(r.status, ItemStatus::Failed);
    assert_eq!(
        (r.first_attempt_ms, r.last_attempt_ms, r.rerun),
        (None, None, None)
    );
}
