//! Which of a job's final records an export reads: all of them, or those of one status.

use std::io;

use crate::store::{ExportError, ItemRecord, ItemStatus, JobView, Store};

/// Every final record, or only those with status `only` (failed ones are found without
/// reading the buckets that have none).
pub(super) async fn for_each(
    store: &impl Store,
    only: Option<ItemStatus>,
    f: &mut dyn FnMut(&str, &ItemRecord) -> io::Result<()>,
) -> Result<(), ExportError> {
    match only {
        Some(ItemStatus::Failed) => store.for_each_failure(None, f).await,
        Some(status) => {
            store
                .for_each_final(&mut |id, r| {
                    if r.status == status {
                        f(id, r)?;
                    }
                    Ok(())
                })
                .await
        }
        None => store.for_each_final(f).await,
    }
}
