//! The ID index inside the store: IDs whose hash fragments collide are told apart by their
//! rows' IDs (noted by the planner, then read from ids.log), and an index of the layout
//! before 8-byte slots is built again on open.

use super::*;

#[tokio::test]
async fn ids_sharing_a_fragment_keep_their_own_first_rows_before_and_after_their_plan() {
    let (a, b) = id_index::colliding_ids();
    let dir = tempfile::tempdir().unwrap();
    let s = SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
    // Noted, not planned yet: b meets a's slot, whose row holds a (in memory).
    assert_eq!(
        s.first_rows(&[(0, a.as_str()), (1, b.as_str()), (2, b.as_str())])
            .await
            .unwrap(),
        vec![None, None, Some(1)]
    );
    s.plan(
        &[planned(0, &[(0, a.as_str()), (1, b.as_str())], 3)],
        &PlannerState::default(),
    )
    .await
    .unwrap();
    s.sync().await.unwrap();
    // Planned: the rows' IDs come from ids.log.
    assert_eq!(
        s.first_rows(&[(3, b.as_str()), (4, a.as_str())])
            .await
            .unwrap(),
        vec![Some(1), Some(0)]
    );
    s.record(&[
        (a.clone(), done(0, 0, true)),
        (b.clone(), done(1, 0, false)),
    ])
    .await
    .unwrap();
    s.sync().await.unwrap();
    drop(s);
    let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    assert_eq!(s.item(&a).await.unwrap().unwrap().row, 0);
    assert_eq!(s.item(&b).await.unwrap().unwrap().row, 1);
    assert_eq!(first_row(&s, &b, 5).await, Some(1));
}

#[tokio::test]
async fn an_index_of_16_byte_slots_is_built_again() {
    let (dir, s) = store_of_one_row_buckets(3000).await;
    s.sync().await.unwrap();
    drop(s);
    // The header of the older layout (version 1) in both copies.
    let path = dir.path().join(INDEX_FILE);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    use std::os::unix::fs::FileExt;
    for copy in [0, 100 * 1024] {
        let mut header = vec![0u8; 8 + 4 + 4 + 8 + 4096 * 24 + 4];
        file.read_exact_at(&mut header, copy).unwrap();
        header[8..12].copy_from_slice(&1u32.to_le_bytes());
        let end = header.len() - 4;
        let crc = crc32fast::hash(&header[..end]);
        header[end..].copy_from_slice(&crc.to_le_bytes());
        file.write_all_at(&header, copy).unwrap();
    }
    drop(file);
    let s = SledStore::open(dir.path(), OpenMode::Existing, DEFAULT_CACHE_BYTES).unwrap();
    for i in [0, 1, 1234, 2999] {
        assert_eq!(first_row(&s, &format!("id{i}"), 5000 + i).await, Some(i));
    }
    assert_eq!(first_row(&s, "new", 3000).await, None);
    let mut version = [0u8; 4];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut version, 8)
        .unwrap();
    assert_eq!(u32::from_le_bytes(version), 2);
}
