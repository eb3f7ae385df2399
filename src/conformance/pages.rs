//! The pages of paginated IDs, for a store that keeps them ([`Store::keeps_pages`]): pages
//! synced survive a crash with their mark, unsynced ones come back as a prefix at most, a
//! page written again replaces itself, pages are read back in order within their generation,
//! and a page missing from a range asked for is damage, never a shorter list.

use super::backend::Backend;
use super::fixtures::{commit_of, lease, planned, planner_at, result};
use crate::handler::paginate::NextRequest;
use crate::store::*;

/// Page `page` of the ID at `row` in `generation`, its items `[{"k": K}, ...]` for `count`
/// items numbered on from the earlier pages' (`per` a page), with a next request unless
/// `last`.
fn page(row: u64, generation: u32, page: u32, per: u32, count: u32, last: bool) -> PageRecord {
    let before = u64::from(page) * u64::from(per);
    let items: Vec<serde_json::Value> = (0..count)
        .map(|i| serde_json::json!({"k": before + u64::from(i), "g": generation}))
        .collect();
    PageRecord {
        row,
        bucket: 0,
        generation,
        mark: PageMark {
            page,
            count,
            items_before: before,
            next: (!last)
                .then(|| NextRequest::Query(vec![("page".into(), (page + 2).to_string())])),
            attempts: page + 1,
            usage: None,
            first_attempt_ms: Some(1_700_000_000_000),
        },
        items: serde_json::value::to_raw_value(&items).unwrap(),
    }
}

/// The `k` of every item of `pages`, in order.
fn ks(pages: &[PageRecord]) -> Vec<u64> {
    pages
        .iter()
        .flat_map(|p| {
            let items: Vec<serde_json::Value> = serde_json::from_str(p.items.get()).unwrap();
            items.into_iter().map(|i| i["k"].as_u64().unwrap())
        })
        .collect()
}

pub(super) async fn pages_are_durable_as_a_prefix_and_read_back_in_order<B: Backend>(b: &mut B) {
    let s = b.create();
    if !s.keeps_pages() {
        return;
    }
    let plan = [planned(0, 0, &["a", "b", "c"])];
    s.plan(&plan, &planner_at(1, 3, true)).await.unwrap();
    s.sync().await.unwrap();
    let ids = [(0, "a"), (1, "b"), (2, "c")];
    assert_eq!(s.page_marks(0, &ids).await.unwrap(), vec![None, None, None]);
    // Pages are written under a lease, as results are (a fleet's backend drops the others).
    let _lease = lease(&*s).await;

    // a: three pages synced, then a fourth not; b: two synced, one rewritten; c: none.
    let a: Vec<_> = (0..3)
        .map(|p| ("a".to_string(), page(0, 0, p, 2, 2, false)))
        .collect();
    s.record_pages(&a).await.unwrap();
    s.record_pages(&[("b".into(), page(1, 0, 0, 2, 2, false))])
        .await
        .unwrap();
    s.record_pages(&[("b".into(), page(1, 0, 1, 2, 1, true))])
        .await
        .unwrap();
    s.sync().await.unwrap();
    s.record_pages(&[("a".into(), page(0, 0, 3, 2, 2, false))])
        .await
        .unwrap();
    // A page written again replaces itself: b's page 1 asked again, now with 2 items.
    let b1 = page(1, 0, 1, 2, 2, true);
    s.record_pages(&[("b".into(), b1.clone())]).await.unwrap();
    s.sync().await.unwrap();
    // Unsynced: a's page 4.
    s.record_pages(&[("a".into(), page(0, 0, 4, 2, 2, false))])
        .await
        .unwrap();
    let s = b.crash(s);

    let marks = s.page_marks(0, &ids).await.unwrap();
    let a_mark = marks[0]
        .clone()
        .expect("a's synced pages survive the crash");
    assert!(
        a_mark.page == 3 || a_mark.page == 4,
        "a's pages stand at the last synced page or, a prefix, past it: {a_mark:?}"
    );
    assert_eq!(
        marks[1],
        Some(b1.mark.clone()),
        "b's rewritten page is its last"
    );
    assert_eq!(marks[2], None, "c has no page");
    assert_eq!(
        s.page_marks(1, &ids).await.unwrap(),
        vec![None, None, None],
        "no page of another generation"
    );

    let read = s.pages(0, "a", 0, 0, 4).await.unwrap();
    assert_eq!(
        read.iter().map(|p| p.mark.page).collect::<Vec<_>>(),
        vec![0, 1, 2, 3],
        "pages come back in order"
    );
    assert_eq!(
        ks(&read),
        (0..8).collect::<Vec<_>>(),
        "with their items, in order"
    );
    assert_eq!(
        read[2].mark,
        page(0, 0, 2, 2, 2, false).mark,
        "with their marks"
    );
    let tail = s.pages(0, "a", 0, 2, 2).await.unwrap();
    assert_eq!(ks(&tail), vec![4, 5, 6, 7], "a range from a later page");
    let b_pages = s.pages(1, "b", 0, 0, 2).await.unwrap();
    assert_eq!(
        ks(&b_pages),
        vec![0, 1, 2, 3],
        "b's page 1 is the one written last"
    );

    // A rerun's pages are another generation: the job's are neither replaced nor mixed in.
    // The bucket is finished and committed first (a rerun takes IDs of committed buckets).
    let l = lease(&*s).await;
    let mut finals = Vec::new();
    for (row, id, pages) in [(0, "a", 5), (1, "b", 2), (2, "c", 0)] {
        let mut record = result(row, 0, true);
        if pages > 0 {
            record.body = None;
            record.pages = Some(pages);
        }
        finals.push((id.to_string(), record));
    }
    s.record_pages(&[("a".into(), page(0, 0, 4, 2, 0, true))])
        .await
        .unwrap();
    s.record(&finals).await.unwrap();
    s.sync().await.unwrap();
    let records: Vec<&ItemRecord> = finals.iter().map(|(_, r)| r).collect();
    s.commit(&l, Commit::Job(&[commit_of(0, &records)]))
        .await
        .unwrap();
    s.sync().await.unwrap();
    s.release(&l).await.unwrap();
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
            before: vec![JobBucketShare {
                bucket: 0,
                ok: 1,
                failed: 0,
                failed_by_class: Default::default(),
                usage: Default::default(),
            }],
            planned_at_ms: 0,
        },
        items: vec![(1, "b".into())],
        values: Vec::new(),
    };
    s.create_rerun(&rerun, std::slice::from_ref(&bucket))
        .await
        .unwrap();
    s.sync().await.unwrap();
    let _lease = lease(&*s).await;
    s.record_pages(&[("b".into(), page(1, 1, 0, 2, 1, true))])
        .await
        .unwrap();
    let mut record = result(1, 0, true);
    record.body = None;
    record.pages = Some(1);
    record.rerun = Some(1);
    s.record(&[("b".into(), record)]).await.unwrap();
    s.sync().await.unwrap();
    let s = b.crash(s);
    let exported = finals_with_bodies(&*s).await;
    assert_eq!(
        exported,
        vec![
            ("a".to_string(), (0..8).collect::<Vec<u64>>()),
            ("b".to_string(), vec![0]),
            ("c".to_string(), vec![2]),
        ],
        "the export reads each ID's result from its pages, the rerun's for b"
    );
    let again = s.pages(1, "b", 1, 0, 1).await.unwrap();
    assert_eq!((again.len(), again[0].generation), (1, 1));
    assert_eq!(
        ks(&s.pages(1, "b", 0, 0, 2).await.unwrap()),
        vec![0, 1, 2, 3]
    );
    let final_b = s.item("b").await.unwrap().expect("b's record");
    assert_eq!(final_b.pages, Some(1), "a record counts its pages");

    // A page missing from a range asked for is damage, never a shorter list.
    // (A backend may say where: the error is looked through to its root.)
    match s.pages(2, "c", 0, 0, 1).await {
        Err(e) if matches!(e.root(), StoreError::Corrupt { .. }) => {}
        other => panic!("a missing page must be Corrupt, got {other:?}"),
    }
    match s.pages(1, "b", 0, 0, 3).await {
        Err(e) if matches!(e.root(), StoreError::Corrupt { .. }) => {}
        other => panic!("a range past the last page must be Corrupt, got {other:?}"),
    }
}

/// Every final record's result as the export reads it: its items' `k` (a page's), or a plain
/// body's number (the fixtures' bodies are their rows).
async fn finals_with_bodies<S: Store>(s: &S) -> Vec<(String, Vec<u64>)> {
    let mut out = Vec::new();
    s.for_each_final(&mut |id, r| {
        let body: serde_json::Value = serde_json::from_str(r.body.as_ref().unwrap().get()).unwrap();
        let ks = match body {
            serde_json::Value::Array(items) => {
                items.iter().map(|i| i["k"].as_u64().unwrap()).collect()
            }
            other => vec![other.as_u64().unwrap()],
        };
        out.push((id.to_string(), ks));
        Ok(())
    })
    .await
    .unwrap();
    out
}
