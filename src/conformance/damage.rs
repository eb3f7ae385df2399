//! Damage: a damaged result is refused, never read as less data.

use super::backend::Backend;
use super::fixtures::{commit_of, finals, lease, planned, planner_at, result};
use crate::store::*;

pub(super) async fn damage_is_refused_never_read_as_less<B: Backend>(b: &mut B) {
    let s = b.create();
    let plan = [planned(0, 0, &["a", "b"])];
    s.plan(&plan, &planner_at(1, 2, true)).await.unwrap();
    let l = lease(&*s).await;
    let (ra, rb) = (result(0, 0, true), result(1, 0, true));
    s.record(&[("a".into(), ra.clone()), ("b".into(), rb.clone())])
        .await
        .unwrap();
    s.sync().await.unwrap();
    s.commit(&l, Commit::Job(&[commit_of(0, &[&ra, &rb])]))
        .await
        .unwrap();
    s.sync().await.unwrap();
    match b.damage_result(s, "b") {
        Err(e) => assert!(matches!(e.root(), StoreError::Corrupt { .. }), "{e}"),
        Ok(s) => {
            let export = finals(&*s).await;
            assert!(
                matches!(&export, Err(ExportError::Store(e)) if matches!(e.root(), StoreError::Corrupt { .. })),
                "a committed bucket that lost a result is refused, not exported short: {export:?}"
            );
        }
    }
}
