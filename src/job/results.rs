//! Reading a job's results back as typed records, in input order: [`Results`] walks the
//! store a bucket at a time (memory stays flat), with the export's completeness check, and
//! yields each final record with its result deserialized into the caller's type (or kept as
//! raw JSON).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::place::StateDirPlace;
use crate::failure::ErrorClass;
use crate::store::sled_store::SledStore;
use crate::store::view::PAGE;
use crate::store::{BucketState, ItemRecord, ItemStatus, JobView, Store, StoreError};

/// One ID's final record.
#[derive(Debug, Clone)]
pub struct Record<T = Box<RawValue>> {
    /// The ID, as read from the input.
    pub id: String,
    /// [`ItemStatus::Ok`] or [`ItemStatus::Failed`].
    pub status: ItemStatus,
    /// The result of a successful ID, deserialized.
    pub result: Option<T>,
    /// Why a failed ID failed.
    pub error: Option<String>,
    /// The failure's class; none for an ok ID.
    pub class: Option<ErrorClass>,
    /// The HTTP status of the last answer, when there was one.
    pub http_status: Option<u16>,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// The bucket the ID belongs to.
    pub bucket: u64,
}

/// Errors while reading results.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the result of ID {id:?} does not deserialize into the type asked for: {source}")]
    Decode {
        id: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A walk over a job's final records in input order (pending IDs are not yielded).
pub struct Results<S> {
    store: Arc<S>,
    /// The next bucket to ask the store for.
    from: u64,
    buckets: VecDeque<BucketState>,
    records: VecDeque<(String, ItemRecord)>,
    only: Option<ItemStatus>,
    ended: bool,
}

impl Results<SledStore> {
    /// The results in the state directory `dir` (which no run may hold at the same time).
    pub fn open(dir: &Path) -> Result<Results<SledStore>, StoreError> {
        let store = StateDirPlace::new(dir).open_reader_now()?;
        Ok(Results::new(Arc::new(store)))
    }
}

impl<S: Store> Results<S> {
    /// The results in `store`.
    pub fn new(store: Arc<S>) -> Results<S> {
        Results {
            store,
            from: 0,
            buckets: VecDeque::new(),
            records: VecDeque::new(),
            only: None,
            ended: false,
        }
    }

    /// A new walk from the first record, over the same store (a state directory is opened
    /// once at a time).
    pub fn from_start(&self) -> Results<S> {
        Results::new(self.store.clone())
    }

    /// Only the failed IDs.
    pub fn failures(mut self) -> Results<S> {
        self.only = Some(ItemStatus::Failed);
        self
    }

    /// Only the IDs that succeeded.
    pub fn successes(mut self) -> Results<S> {
        self.only = Some(ItemStatus::Ok);
        self
    }

    /// The next record, its result deserialized as `T` (`Box<RawValue>` keeps it as raw
    /// JSON, `serde_json::Value` as a value); `None` after the last.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<Record<T>>, ReadError> {
        loop {
            if let Some((id, r)) = self.records.pop_front() {
                if self.only.is_some_and(|only| only != r.status) {
                    continue;
                }
                let r = self.store.with_pages(&id, r).await?;
                return record(id, r).map(Some);
            }
            if let Some(b) = self.buckets.pop_front() {
                let skip = match (self.only, &b.commit) {
                    (Some(ItemStatus::Failed), Some(c)) => c.failed == 0,
                    (Some(ItemStatus::Ok), Some(c)) => c.ok == 0,
                    _ => false,
                };
                if !skip {
                    self.records = self.store.final_items(&b).await?.into();
                }
                continue;
            }
            if self.ended {
                return Ok(None);
            }
            let page = self.store.buckets(self.from, PAGE).await?;
            match page.last() {
                Some(last) => self.from = last.offset.bucket + 1,
                None => self.ended = true,
            }
            self.buckets = page.into();
        }
    }

    /// Every remaining record.
    pub async fn all<T: DeserializeOwned>(mut self) -> Result<Vec<Record<T>>, ReadError> {
        let mut out = Vec::new();
        while let Some(r) = self.next().await? {
            out.push(r);
        }
        Ok(out)
    }
}

fn record<T: DeserializeOwned>(id: String, r: ItemRecord) -> Result<Record<T>, ReadError> {
    let result = match (&r.status, &r.body) {
        (ItemStatus::Ok, Some(body)) => match serde_json::from_str(body.get()) {
            Ok(v) => Some(v),
            Err(source) => return Err(ReadError::Decode { id, source }),
        },
        _ => None,
    };
    Ok(Record {
        id,
        status: r.status,
        result,
        error: r.error,
        class: r.class,
        http_status: r.http_status,
        attempts: r.attempts,
        bucket: r.bucket,
    })
}
