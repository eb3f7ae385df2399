//! An [`Item`]: one ID to call, as the dispatcher queues it for the workers; and what is
//! left to call of a bucket whose records were read back ([`job_work`], [`rerun_work`]).

use crate::store::{ItemRecord, ItemStatus, Lease, PageMark, Store, StoreError, Tally};

pub(super) struct Item {
    pub(super) id: String,
    pub(super) row: u64,
    /// The job bucket the ID belongs to.
    pub(super) bucket: u64,
    /// The bucket whose commit waits for this item: the job bucket, or a rerun bucket.
    pub(super) track: u64,
    /// In a rerun: the record the result replaces.
    pub(super) prior: Option<Box<ItemRecord>>,
    /// In a fleet: the lease of the item's bucket, checked before the item is called (none:
    /// the run holds the whole job).
    pub(super) lease: Option<Lease>,
    /// The kept columns of the ID's input row (a JSON object), when the job keeps any.
    pub(super) values: Option<Box<str>>,
    /// A paginated ID whose pages a store kept: where they stand (it continues at the next).
    pub(super) resume: Option<Box<PageMark>>,
}

/// Where the pages of `items` stand in `generation` (0, or the rerun's number), when the job
/// pages (`paged`) into a store that keeps pages: each item continues at its next page.
pub(super) async fn with_marks<S: Store>(
    store: &S,
    paged: bool,
    generation: u32,
    items: &mut [Item],
) -> Result<(), StoreError> {
    if !paged || !store.keeps_pages() || items.is_empty() {
        return Ok(());
    }
    let ids: Vec<(u64, &str)> = items.iter().map(|i| (i.row, i.id.as_str())).collect();
    let marks = store.page_marks(generation, &ids).await?;
    for (item, mark) in items.iter_mut().zip(marks) {
        item.resume = mark.map(Box::new);
    }
    Ok(())
}

/// What is left of a job bucket: results already final, and the items to call.
pub(super) fn job_work(bucket: u64, items: Vec<(String, ItemRecord)>) -> (Tally, Vec<Item>) {
    let (mut done, mut todo) = (Tally::default(), Vec::new());
    for (id, record) in items {
        match record.status {
            ItemStatus::Ok | ItemStatus::Failed => done.add(&record),
            ItemStatus::Pending => todo.push(Item {
                id,
                row: record.row,
                bucket,
                track: bucket,
                prior: None,
                lease: None,
                values: record.values,
                resume: None,
            }),
        }
    }
    (done, todo)
}

/// What is left of a rerun bucket: results this rerun already made durable, and the items
/// to call (each with the history of the record it replaces, not its body).
pub(super) fn rerun_work(
    rerun: u32,
    bucket: u64,
    items: Vec<(String, ItemRecord)>,
) -> (Tally, Vec<Item>) {
    let (mut done, mut todo) = (Tally::default(), Vec::new());
    for (id, record) in items {
        match (record.rerun == Some(rerun), record.status) {
            (true, ItemStatus::Ok | ItemStatus::Failed) => done.add(&record),
            _ => todo.push(Item {
                id,
                row: record.row,
                bucket: record.bucket,
                track: bucket,
                values: record.values.clone(),
                prior: Some(Box::new(ItemRecord {
                    body: None,
                    values: None,
                    ..record
                })),
                lease: None,
                resume: None,
            }),
        }
    }
    (done, todo)
}
