//! What a job's records say, the same over every backend: statistics, the open buckets, the
//! export's walk (with its completeness check), failure listings, and what a rerun's commit
//! moves in the job's counts.
//!
//! Written once over the [`Store`] primitives ([`JobView`], implemented for every store), so
//! a backend implements none of it. Walks read the logs a page of buckets at a time
//! (`PAGE`): memory stays flat however many buckets a job has. A paginated ID's items are
//! read a range of its pages at a time, and either joined into its body (at most
//! `MAX_JOINED_BYTES`) or handed on page by page ([`FinalVisit`]), however many it has.

use std::collections::BTreeMap;
use std::future::Future;

use super::{
    class_name, BucketState, Commit, CommitRecord, ExportError, ItemRecord, ItemStatus, Lease,
    Leases, Log, OffsetRecord, PlannerState, RerunOffset, RerunStats, Store, StoreError,
    StoreStats,
};

/// Buckets read per call of [`Store::buckets`] in a walk.
pub(crate) const PAGE: usize = 4096;

/// Pages read at once while a paginated ID's items are read ([`each_page_items`]): with
/// pages of a megabyte, what one range holds stays a few percent of a run's memory.
const PAGES_AT_ONCE: u32 = 16;

/// The most bytes of items joined into one paginated ID's result (an export streams them
/// instead: [`JobView::for_each_final_streamed`]).
pub(crate) const MAX_JOINED_BYTES: usize = 512 << 20;

/// A callback a walk calls for each record it yields.
pub(crate) type Visit<'a> = &'a mut dyn FnMut(&str, &ItemRecord) -> std::io::Result<()>;

/// What [`JobView::for_each_final_streamed`] hands each final record to, as it reads it.
///
/// A record whose result is in it (a body, or none) comes whole, to [`FinalVisit::record`].
/// A paginated ID's record, whose result is its pages ([`ItemRecord::pages`]), comes in
/// parts: [`FinalVisit::begin`] with the record (no body in it), [`FinalVisit::items`] with
/// each page's items that holds any (and the page's number), then [`FinalVisit::end`]. Its
/// result is `[`, the items comma-joined, `]`: the body [`JobView::with_pages`] would join,
/// never held whole.
pub trait FinalVisit {
    /// A record whose result is in it.
    fn record(&mut self, id: &str, record: &ItemRecord) -> Result<(), ExportError>;
    /// The start of a paginated ID's record: `record` has no body, its items come next.
    fn begin(&mut self, id: &str, record: &ItemRecord) -> Result<(), ExportError>;
    /// The items of page `page` (from 0): the inside of its JSON array (one item or more,
    /// comma-separated).
    fn items(&mut self, page: u32, inner: &str) -> Result<(), ExportError>;
    /// The end of the record [`FinalVisit::begin`] started.
    fn end(&mut self) -> Result<(), ExportError>;
}

/// A paginated ID's items joined into one JSON array, at most [`MAX_JOINED_BYTES`].
struct Joined {
    body: String,
}

impl Joined {
    fn new() -> Joined {
        Joined {
            body: String::from("["),
        }
    }

    /// Add a page's items (the inside of its array) of `id`, which has `pages` pages.
    fn push(&mut self, id: &str, pages: u32, inner: &str) -> Result<(), StoreError> {
        if self.body.len() + inner.len() + 2 > MAX_JOINED_BYTES {
            return Err(StoreError::backend(format!(
                "{id:?}: its {pages} pages hold more than {} MiB of items, more than one record \
                 read whole holds (an export in JSON lines or CSV writes it page by page)",
                MAX_JOINED_BYTES >> 20
            )));
        }
        if self.body.len() > 1 {
            self.body.push(',');
        }
        self.body.push_str(inner);
        Ok(())
    }

    fn done(mut self, id: &str) -> Result<Box<serde_json::value::RawValue>, StoreError> {
        self.body.push(']');
        serde_json::value::RawValue::from_string(self.body)
            .map_err(|e| StoreError::corrupt(format!("{id:?}: its pages' items: {e}")))
    }
}

/// [`JobView::for_each_final`]'s visit: each paginated ID's items joined into its body.
struct Joining<'f> {
    f: Visit<'f>,
    /// The record begun, its ID and its items so far.
    open: Option<(String, ItemRecord, Joined)>,
}

impl FinalVisit for Joining<'_> {
    fn record(&mut self, id: &str, record: &ItemRecord) -> Result<(), ExportError> {
        Ok((self.f)(id, record)?)
    }

    fn begin(&mut self, id: &str, record: &ItemRecord) -> Result<(), ExportError> {
        self.open = Some((id.to_string(), record.clone(), Joined::new()));
        Ok(())
    }

    fn items(&mut self, _page: u32, inner: &str) -> Result<(), ExportError> {
        let (id, record, joined) = self.open.as_mut().expect("items come after begin");
        Ok(joined.push(id, record.pages.unwrap_or(0), inner)?)
    }

    fn end(&mut self) -> Result<(), ExportError> {
        let (id, mut record, joined) = self.open.take().expect("end comes after begin");
        record.body = Some(joined.done(&id)?);
        Ok((self.f)(&id, &record)?)
    }
}

/// Each page's items of `record` (of `id`), a paginated ID's record whose result is its
/// `pages` pages, in order: `f` gets each page's number and the inside of its JSON array,
/// for each page that holds any item. One range of pages ([`PAGES_AT_ONCE`]) is read at a time, so an ID's items are never
/// held whole; a page missing or out of place is [`StoreError::Corrupt`].
async fn each_page_items<S, E, F>(
    store: &S,
    id: &str,
    record: &ItemRecord,
    pages: u32,
    mut f: F,
) -> Result<(), E>
where
    S: Store + ?Sized,
    E: From<StoreError>,
    F: FnMut(u32, &str) -> Result<(), E>,
{
    let generation = record.rerun.unwrap_or(0);
    let mut from = 0;
    while from < pages {
        let count = (pages - from).min(PAGES_AT_ONCE);
        let read = store.pages(record.row, id, generation, from, count).await?;
        for (page, want) in read.iter().zip(from..) {
            if page.mark.page != want || page.generation != generation {
                return Err(StoreError::corrupt(format!(
                    "{id:?}: page {want} of generation {generation} read as page {} of \
                     generation {}",
                    page.mark.page, page.generation
                ))
                .into());
            }
            let text = page.items.get().trim();
            let inner = text
                .strip_prefix('[')
                .and_then(|t| t.strip_suffix(']'))
                .map_or("", str::trim);
            if !inner.is_empty() {
                f(want, inner)?;
            }
        }
        if read.len() != count as usize {
            return Err(StoreError::corrupt(format!(
                "{id:?}: {count} pages from page {from} asked for, {} read",
                read.len()
            ))
            .into());
        }
        from += count;
    }
    Ok(())
}

/// Derived reads and writes of a job, for every [`Store`].
pub trait JobView: Store {
    /// Figures for `status` and the run summary: counts from the commit records of
    /// committed buckets, from the items of the others.
    fn stats(&self) -> impl Future<Output = Result<StoreStats, StoreError>> + Send {
        async move {
            match self.counted_stats().await? {
                Some(s) => Ok(s),
                None => walked_stats(self).await,
            }
        }
    }

    /// Buckets with an offset record but no commit record, in bucket order.
    fn open_buckets(&self) -> impl Future<Output = Result<Vec<OffsetRecord>, StoreError>> + Send {
        async move {
            let mut open = Vec::new();
            let mut from = 0;
            loop {
                let page = self.buckets(from, PAGE).await?;
                let Some(last) = page.last() else { break };
                from = last.offset.bucket + 1;
                open.extend(
                    page.into_iter()
                        .filter(|b| b.commit.is_none())
                        .map(|b| b.offset),
                );
            }
            Ok(open)
        }
    }

    /// One bucket of the job's log, if it was planned.
    fn bucket(
        &self,
        bucket: u64,
    ) -> impl Future<Output = Result<Option<BucketState>, StoreError>> + Send {
        async move {
            let found = self.buckets(bucket, 1).await?.into_iter().next();
            Ok(found.filter(|b| b.offset.bucket == bucket))
        }
    }

    /// A planned bucket's offset record.
    fn offset(
        &self,
        bucket: u64,
    ) -> impl Future<Output = Result<Option<OffsetRecord>, StoreError>> + Send {
        async move { Ok(self.bucket(bucket).await?.map(|b| b.offset)) }
    }

    /// A bucket's commit record.
    fn commit_record(
        &self,
        bucket: u64,
    ) -> impl Future<Output = Result<Option<CommitRecord>, StoreError>> + Send {
        async move { Ok(self.bucket(bucket).await?.and_then(|b| b.commit)) }
    }

    /// Commit records of buckets committed with failures, in bucket order.
    fn failed_buckets(&self) -> impl Future<Output = Result<Vec<CommitRecord>, StoreError>> + Send {
        async move {
            let mut out = Vec::new();
            let mut from = 0;
            loop {
                let page = self.buckets(from, PAGE).await?;
                let Some(last) = page.last() else { break };
                from = last.offset.bucket + 1;
                out.extend(
                    page.into_iter()
                        .filter_map(|b| b.commit)
                        .filter(|c| c.failed > 0),
                );
            }
            Ok(out)
        }
    }

    /// Every final record in input order, a paginated ID's with its items joined into its
    /// body ([`JobView::with_pages`]). A committed bucket's results are all final, as its
    /// record counts them: one missing now was lost, and the walk refuses to leave it out
    /// silently.
    fn for_each_final(&self, f: Visit<'_>) -> impl Future<Output = Result<(), ExportError>> {
        async move {
            let mut joining = Joining { f, open: None };
            self.for_each_final_streamed(None, &mut joining).await
        }
    }

    /// Every final record in input order (of status `only`, if given), handed to `visit` as
    /// it is read: a paginated ID's items page by page, never joined ([`FinalVisit`]). A
    /// committed bucket's results are all final, as [`JobView::for_each_final`] checks.
    fn for_each_final_streamed(
        &self,
        only: Option<ItemStatus>,
        visit: &mut dyn FinalVisit,
    ) -> impl Future<Output = Result<(), ExportError>> {
        async move {
            let mut from = 0;
            loop {
                let page = self.buckets(from, PAGE).await?;
                let Some(last) = page.last() else { break };
                from = last.offset.bucket + 1;
                for b in page {
                    for (id, record) in self.final_items(&b).await? {
                        if only.is_some_and(|only| only != record.status) {
                            continue;
                        }
                        let Some(pages) = record.pages.filter(|_| record.body.is_none()) else {
                            visit.record(&id, &record)?;
                            continue;
                        };
                        visit.begin(&id, &record)?;
                        each_page_items(self, &id, &record, pages, |page, inner| {
                            visit.items(page, inner)
                        })
                        .await?;
                        visit.end()?;
                    }
                }
            }
            Ok(())
        }
    }

    /// `record` (of `id`) with its result as its body: a paginated ID's items read from the
    /// pages the store keeps ([`ItemRecord::pages`]), joined in order into one JSON array;
    /// any other record as it is. At most 512 MiB of items, one range of pages at a
    /// time: one ID's result is held, never a bucket's.
    fn with_pages(
        &self,
        id: &str,
        record: ItemRecord,
    ) -> impl Future<Output = Result<ItemRecord, StoreError>> + Send {
        async move {
            let mut record = record;
            let Some(pages) = record.pages.filter(|_| record.body.is_none()) else {
                return Ok(record);
            };
            let mut joined = Joined::new();
            each_page_items(self, id, &record, pages, |_, inner| {
                joined.push(id, pages, inner)
            })
            .await?;
            record.body = Some(joined.done(id)?);
            Ok(record)
        }
    }

    /// The final records of bucket `b` in input order. A committed bucket's results are
    /// all final, as its record counts them: one missing now was lost, and this refuses to
    /// leave it out silently.
    fn final_items(
        &self,
        b: &BucketState,
    ) -> impl Future<Output = Result<Vec<(String, ItemRecord)>, StoreError>> + Send {
        async move {
            let mut records = self.bucket_items(&b.offset).await?;
            records.retain(|(_, r)| r.is_final());
            if let Some(c) = &b.commit {
                let finals = records.len() as u64;
                if finals != c.ok + c.failed {
                    return Err(StoreError::corrupt(format!(
                        "bucket {} is committed with {} results, but {finals} are found \
                         (the results files were damaged)",
                        b.offset.bucket,
                        c.ok + c.failed
                    )));
                }
            }
            Ok(records)
        }
    }

    /// Every failed record (of `bucket` only, if given) in input order. Buckets committed
    /// without failures are not read.
    fn for_each_failure(
        &self,
        bucket: Option<u64>,
        f: Visit<'_>,
    ) -> impl Future<Output = Result<(), ExportError>> {
        async move {
            let (mut from, limit) = match bucket {
                Some(b) => (b, 1),
                None => (0, PAGE),
            };
            loop {
                let page = self.buckets(from, limit).await?;
                let Some(last) = page.last() else { break };
                from = last.offset.bucket + 1;
                for b in page {
                    if bucket.is_some_and(|only| only != b.offset.bucket) {
                        return Ok(());
                    }
                    if b.commit.as_ref().is_some_and(|c| c.failed == 0) {
                        continue;
                    }
                    for (id, record) in self.bucket_items(&b.offset).await? {
                        if record.status == ItemStatus::Failed {
                            f(&id, &record)?;
                        }
                    }
                }
                if bucket.is_some() {
                    break;
                }
            }
            Ok(())
        }
    }

    /// Move the planner (the input grew: planning goes on from where it stopped).
    fn set_planner(
        &self,
        planner: &PlannerState,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.plan(&[], planner)
    }

    /// A rerun's buckets without a commit record, in bucket order.
    fn rerun_open_buckets(
        &self,
        rerun: u32,
    ) -> impl Future<Output = Result<Vec<RerunOffset>, StoreError>> + Send {
        async move {
            let mut open = Vec::new();
            let mut from = 0;
            loop {
                let page = self.rerun_buckets(rerun, from, PAGE).await?;
                let Some(last) = page.last() else { break };
                from = last.offset.bucket + 1;
                open.extend(
                    page.into_iter()
                        .filter(|b| b.commit.is_none())
                        .map(|b| b.offset),
                );
            }
            Ok(open)
        }
    }

    /// Where a rerun stands.
    fn rerun_stats(
        &self,
        rerun: u32,
    ) -> impl Future<Output = Result<RerunStats, StoreError>> + Send {
        async move {
            let mut s = RerunStats {
                number: rerun,
                ..RerunStats::default()
            };
            let Some(record) = self.reruns().await?.into_iter().find(|r| r.number == rerun) else {
                return Ok(s);
            };
            s.buckets = record.buckets;
            s.ids = record.ids;
            let mut from = 0;
            loop {
                let page = self.rerun_buckets(rerun, from, PAGE).await?;
                let Some(last) = page.last() else { break };
                from = last.offset.bucket + 1;
                for b in page {
                    match b.commit {
                        Some(c) => {
                            s.buckets_committed += 1;
                            s.ok += c.ok;
                            s.failed += c.failed;
                        }
                        None => {
                            for (_, r) in self.rerun_bucket_items(&b.offset).await? {
                                if r.rerun == Some(rerun) {
                                    match r.status {
                                        ItemStatus::Ok => s.ok += 1,
                                        ItemStatus::Failed => s.failed += 1,
                                        ItemStatus::Pending => {}
                                    }
                                }
                            }
                        }
                    }
                }
            }
            s.pending = s.ids.saturating_sub(s.ok + s.failed);
            Ok(s)
        }
    }

    /// What committing `commits` (rerun buckets of `rerun`) writes: the commit records of
    /// the rerun buckets not committed yet (a repeat moves nothing), and the job buckets'
    /// commit records with their counts moved: per job bucket, the statuses of the rerun
    /// bucket's IDs now against before the rerun.
    fn rerun_moves(
        &self,
        rerun: u32,
        commits: &[CommitRecord],
    ) -> impl Future<Output = Result<(Vec<CommitRecord>, Vec<CommitRecord>), StoreError>> + Send
    {
        async move {
            #[derive(Default)]
            struct Moved {
                ok: i64,
                failed: i64,
                classes: BTreeMap<String, i64>,
                /// Input and output units.
                usage: [i64; 2],
            }
            let mut moved: BTreeMap<u64, Moved> = BTreeMap::new();
            let mut fresh = Vec::new();
            for c in commits {
                let found = self
                    .rerun_buckets(rerun, c.bucket, 1)
                    .await?
                    .into_iter()
                    .next();
                let Some(b) = found.filter(|b| b.offset.bucket == c.bucket) else {
                    return Err(StoreError::corrupt(format!(
                        "rerun {rerun} commits bucket {} it never planned",
                        c.bucket
                    )));
                };
                if b.commit.is_some() {
                    continue; // already committed: its move is already applied
                }
                for share in &b.offset.before {
                    let m = moved.entry(share.bucket).or_default();
                    m.ok -= share.ok as i64;
                    m.failed -= share.failed as i64;
                    for (class, n) in &share.failed_by_class {
                        *m.classes.entry(class.clone()).or_default() -= *n as i64;
                    }
                    m.usage[0] -= share.usage.input as i64;
                    m.usage[1] -= share.usage.output as i64;
                }
                for (_, record) in self.rerun_bucket_items(&b.offset).await? {
                    let m = moved.entry(record.bucket).or_default();
                    if record.status != ItemStatus::Pending {
                        let usage = record.usage.unwrap_or_default();
                        m.usage[0] += usage.input as i64;
                        m.usage[1] += usage.output as i64;
                    }
                    match record.status {
                        ItemStatus::Ok => m.ok += 1,
                        ItemStatus::Failed => {
                            m.failed += 1;
                            *m.classes.entry(class_name(&record)).or_default() += 1;
                        }
                        ItemStatus::Pending => {}
                    }
                }
                fresh.push(c.clone());
            }
            let mut job = Vec::new();
            for (bucket, m) in moved {
                if m.ok == 0
                    && m.failed == 0
                    && m.classes.values().all(|n| *n == 0)
                    && m.usage == [0, 0]
                {
                    continue;
                }
                let Some(mut c) = self.commit_record(bucket).await? else {
                    continue;
                };
                c.ok = (c.ok as i64 + m.ok).max(0) as u64;
                c.failed = (c.failed as i64 + m.failed).max(0) as u64;
                c.usage.input = (c.usage.input as i64 + m.usage[0]).max(0) as u64;
                c.usage.output = (c.usage.output as i64 + m.usage[1]).max(0) as u64;
                for (class, n) in m.classes {
                    let count = c.failed_by_class.entry(class.clone()).or_default();
                    *count = (*count as i64 + n).max(0) as u64;
                    if *count == 0 {
                        c.failed_by_class.remove(&class);
                    }
                }
                job.push(c);
            }
            Ok((fresh, job))
        }
    }
}

/// [`JobView::stats`] the long way: the commit records of committed buckets, the items of the
/// others, a page of buckets at a time.
pub(crate) async fn walked_stats<S: Store + ?Sized>(store: &S) -> Result<StoreStats, StoreError> {
    let planner = store.planner().await?;
    let mut s = StoreStats {
        input_exhausted: planner.exhausted,
        rows_read: planner.cursor.row,
        input_bytes_read: planner.cursor.byte,
        ..StoreStats::default()
    };
    let mut from = 0;
    loop {
        let page = store.buckets(from, PAGE).await?;
        let Some(last) = page.last() else { break };
        from = last.offset.bucket + 1;
        for b in page {
            s.buckets_planned += 1;
            s.ids_planned += b.offset.items;
            s.duplicates += b.offset.duplicates;
            s.bad_lines += b.offset.bad_lines;
            match b.commit {
                Some(c) => {
                    s.buckets_committed += 1;
                    s.ok += c.ok;
                    s.failed += c.failed;
                    s.usage.add(c.usage);
                }
                None => {
                    s.buckets_in_flight += 1;
                    for (_, r) in store.bucket_items(&b.offset).await? {
                        if r.status != ItemStatus::Pending {
                            s.usage.add(r.usage.unwrap_or_default());
                        }
                        match r.status {
                            ItemStatus::Ok => s.ok += 1,
                            ItemStatus::Failed => s.failed += 1,
                            ItemStatus::Pending => {}
                        }
                    }
                }
            }
        }
    }
    s.pending = s.ids_planned.saturating_sub(s.ok + s.failed);
    Ok(s)
}

impl<S: Store> JobView for S {}

/// Write commit records of `log` under `lease`: a job's as they are, a rerun's with the
/// counts they move in the job's commit log. Callers made the buckets' results durable.
pub(crate) async fn commit<S: Store + Leases>(
    store: &S,
    lease: &Lease,
    log: Log,
    commits: &[CommitRecord],
) -> Result<(), StoreError> {
    match log {
        Log::Job => store.commit(lease, Commit::Job(commits)).await,
        Log::Rerun(rerun) => {
            let (buckets, moved) = store.rerun_moves(rerun, commits).await?;
            if buckets.is_empty() {
                return Ok(());
            }
            let commit = Commit::Rerun {
                rerun,
                buckets: &buckets,
                moved: &moved,
            };
            store.commit(lease, commit).await
        }
    }
}
