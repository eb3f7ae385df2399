//! Many stores of one process flushing at once: none hangs. sled's own `flush_async` runs
//! on sled's small IO pool and waits there for a write queued on that same pool; with eight
//! databases flushing at once it deadlocked here within a second (see
//! `sled_files::flush_async`).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_databases_flushing_at_once_all_finish() {
    const DATABASES: usize = 16;
    const FLUSHES: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..DATABASES {
        let path = dir.path().join(format!("db{i}"));
        let trees = Trees::open(&path, DEFAULT_CACHE_BYTES).unwrap();
        tasks.spawn(async move {
            for k in 0..FLUSHES {
                trees.meta.insert(k.to_be_bytes(), vec![0u8; 200]).unwrap();
                trees.flush_async().await.unwrap();
            }
            trees.meta.len()
        });
    }
    // A bound only a hang reaches: each flush takes milliseconds.
    let sizes = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        let mut sizes = Vec::new();
        while let Some(done) = tasks.join_next().await {
            sizes.push(done.unwrap());
        }
        sizes
    })
    .await
    .expect("the databases' flushes hung");
    assert_eq!(sizes, vec![FLUSHES as usize; DATABASES]);
}
