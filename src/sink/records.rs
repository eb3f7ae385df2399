//! Which of a job's final records an export reads: all of them, or those of one status;
//! each whole, or a paginated ID's items page by page.

use std::io;

use crate::store::{ExportError, FinalVisit, ItemRecord, ItemStatus, JobView, Store};

/// An export's writer of records: each whole ([`Rows::row`]), or a paginated ID's items page
/// by page ([`FinalVisit`]).
pub(super) trait Rows: FinalVisit {
    /// Write a record whose result is in it.
    fn row(&mut self, id: &str, record: &ItemRecord) -> io::Result<()>;
}

/// Every final record, or only those with status `only`, to `rows`: a paginated ID's items
/// page by page, never joined. Failed records (which keep no pages as their result) are
/// found without reading the buckets that have none.
pub(super) async fn stream<R: Rows>(
    store: &impl Store,
    only: Option<ItemStatus>,
    rows: &mut R,
) -> Result<(), ExportError> {
    match only {
        Some(ItemStatus::Failed) => {
            store
                .for_each_failure(None, &mut |id, r| rows.row(id, r))
                .await
        }
        only => store.for_each_final_streamed(only, rows).await,
    }
}

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
