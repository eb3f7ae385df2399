//! The results' dictionary is recorded in `meta` before any record uses it, and an open
//! refuses a store whose `results.dict` is missing or is another one.

use super::*;
use compression::{DICT_FILE, TRAIN_SAMPLES};

fn answer(row: u64) -> ItemRecord {
    let mut r = done(row, row, true);
    let body = crate::demo::api::profile_body(&format!("id{row}"));
    r.body = Some(serde_json::value::to_raw_value(&body).unwrap());
    r
}

/// A closed store of `n` one-row buckets whose records were written before and after its
/// dictionary was trained; returns how many rows it recorded.
async fn store_with_a_dictionary(path: &Path) -> u64 {
    let n = TRAIN_SAMPLES as u64 + 400;
    let s = SledStore::open(path, OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    s.plan(&one_row_buckets(n), &PlannerState::default())
        .await
        .unwrap();
    let mut row = 0;
    while row < n && !(s.bodies.trained() && row > TRAIN_SAMPLES as u64 + 10) {
        if row >= TRAIN_SAMPLES as u64 {
            // Training runs on its own thread.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        s.record(&[(format!("id{row}"), answer(row))])
            .await
            .unwrap();
        row += 1;
    }
    assert!(s.bodies.trained(), "a dictionary was trained and is used");
    let t = s.t().unwrap();
    let recorded = t
        .meta
        .get(DICT_META_KEY)
        .unwrap()
        .expect("recorded in meta");
    let file = fs::read(path.join(DICT_FILE)).unwrap();
    let recorded = DictRecord::from_bytes(&recorded).unwrap();
    assert_eq!(recorded.file_crc, crc32fast::hash(&file));
    assert_eq!(recorded.file_len, file.len() as u64);
    drop(t);
    s.sync().await.unwrap();
    row
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "lock" {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

async fn reads_every_answer(path: &Path, rows: u64) {
    let s = SledStore::open(path, OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    for row in 0..rows {
        let got = s.item(&format!("id{row}")).await.unwrap().unwrap();
        assert_eq!(
            got.body.unwrap().get(),
            answer(row).body.unwrap().get(),
            "row {row}"
        );
    }
}

fn refused(path: &Path) -> String {
    match SledStore::open(path, OpenMode::Existing, DEFAULT_CACHE_BYTES) {
        Err(e) if e.to_string().contains("corrupt") => e.to_string(),
        Err(e) => panic!("not a corrupt store: {e:?}"),
        Ok(_) => panic!("the store opened"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_or_replaced_dictionary_is_refused_and_never_trained_again() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let rows = store_with_a_dictionary(&a).await;
    reads_every_answer(&a, rows).await;

    // Lost: the open refuses, and no new dictionary appears.
    let lost = dir.path().join("lost");
    copy_dir(&a, &lost);
    fs::remove_file(lost.join(DICT_FILE)).unwrap();
    let err = refused(&lost);
    assert!(
        err.contains("results.dict") && err.contains("missing"),
        "{err}"
    );
    assert!(!lost.join(DICT_FILE).exists(), "never trained again");

    // Replaced by another dictionary, whole (its own checksum right): one of another ID, and
    // one of the same ID with other content.
    let dict_file = fs::read(a.join(DICT_FILE)).unwrap();
    let id_at = 12 + 4; // after the file's header and zstd's magic
    for at in [id_at, dict_file.len() - 100] {
        let replaced = dir.path().join(format!("replaced{at}"));
        copy_dir(&a, &replaced);
        let mut other = dict_file.clone();
        other[at] ^= 0x5a;
        let crc = crc32fast::hash(&other[12..]);
        other[8..12].copy_from_slice(&crc.to_le_bytes());
        fs::write(replaced.join(DICT_FILE), &other).unwrap();
        let err = refused(&replaced);
        assert!(err.contains("not the dictionary"), "{err}");
    }

    // Written, but not recorded (a crash between the two): recorded at the open, and read.
    let unrecorded = dir.path().join("unrecorded");
    copy_dir(&a, &unrecorded);
    {
        let t = Trees::open(&unrecorded.join("sled"), DEFAULT_CACHE_BYTES).unwrap();
        t.meta.remove(DICT_META_KEY).unwrap();
        t.flush().unwrap();
    }
    reads_every_answer(&unrecorded, rows).await;
    let t = Trees::open(&unrecorded.join("sled"), DEFAULT_CACHE_BYTES).unwrap();
    assert!(t.meta.get(DICT_META_KEY).unwrap().is_some());
}
