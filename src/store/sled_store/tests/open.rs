//! Opening a state directory: old formats, sled's lock, a busy store, foreign and unknown directories.

use super::*;

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
                .insert(key, encode_ids(&b.items, &b.values))
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
        dir.path()
            .join(crate::store::sled_store::results_log::LOG_FILE),
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

#[test]
fn a_run_waits_for_a_reader_to_let_go_of_the_lock_instead_of_refusing() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap());
    let reader = SledStore::open(dir.path(), OpenMode::Read, DEFAULT_CACHE_BYTES).unwrap();
    let lock_text = std::fs::read_to_string(dir.path().join("lock")).unwrap();
    assert_eq!(lock_text.trim(), format!("{} reader", std::process::id()));
    let (held, release) = std::sync::mpsc::channel::<()>();
    let reading = std::thread::spawn(move || {
        // The reading lasts until the run below is waiting.
        let _ = release.recv();
        drop(reader);
    });
    let opener = {
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || SledStore::open(&path, OpenMode::Existing, DEFAULT_CACHE_BYTES))
    };
    // Give the run time to meet the held lock (it opens whether it does or not: the
    // outcome does not depend on this timing, only what the test covers does).
    std::thread::sleep(std::time::Duration::from_millis(200));
    held.send(()).unwrap();
    reading.join().unwrap();
    let run = opener.join().unwrap();
    assert!(run.is_ok(), "{:?}", run.err());
}
