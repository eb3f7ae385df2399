//! [`PgStore`]'s [`Store`] methods: the PostgreSQL backend of the seam, one job of one
//! database, seen by one worker session.
//!
//! Reads go straight to the database. Writes keep the seam's contract with the fences of
//! [`super::results`]: `record` buffers results in memory and `sync` writes them in one
//! transaction, each under the lease of its bucket (a result of a bucket this session holds
//! no lease on is dropped there: a worker that lost a bucket writes nothing that counts);
//! `plan` writes its batch at once under the planner lease ([`super::planner`]), and
//! `create_rerun` the rerun with its buckets in one transaction. The leases themselves, the
//! commits and the session's heartbeat are in `leases.rs` and `heartbeat.rs`; the SQL is in
//! the per-table modules ([`super::job`], [`super::planner`], `items.rs`, [`super::buckets`],
//! `reruns.rs`, [`super::stats`], [`super::history`], [`super::quota`]); none is here.
//!
//! A result's row keeps the item's record as JSON (`record`, without the body) and the
//! API's answer byte for byte (`body`, `json`), so users can query `hw_result`.

use std::collections::HashMap;

use tokio_postgres::Client;

use super::error::PgError;
use super::outage::Outage;
use super::rows::{commit_record, malformed, spec_from_json, spec_json};
use super::state::{Inner, PgStore};
use super::{buckets, history, items, job, learned, pages, planner, quota, reruns, stats};
use crate::quota::{KeptLimit, QuotaGrant, QuotaLedger, QuotaWant};
use crate::store::{
    BadLine, BucketState, ItemRecord, Log, OffsetRecord, PageMark, PageRecord, PlannedBucket,
    PlannerState, RerunBucket, RerunBucketState, RerunOffset, RerunRecord, Store, StoreError,
    StoreStats, StoredJob,
};

/// Run `$body` with the store's connection `$c` (or the one `$conn` gives) and its state
/// `$i`; its error said of the job.
/// A database outage (restarting, refusing connections) is waited out: the step is tried
/// again with backoff ([`Outage`]), on a new connection.
macro_rules! with_client {
    ($store:expr, |$c:ident, $i:ident| $body:block) => {
        with_client!($store, connection, |$c, $i| $body)
    };
    ($store:expr, $conn:ident, |$c:ident, $i:ident| $body:block) => {{
        let mut outage = Outage::default();
        loop {
            let result: Result<_, PgError> = async {
                let mut conn = $store.inner.$conn().await?;
                let $c: &mut Client = conn.as_mut().expect("connected by connection()");
                let $i: &Inner = &$store.inner;
                $body
            }
            .await;
            match result {
                Err(e) if outage.wait(&e).await => continue,
                result => break result.map_err(|e| $store.inner.err(e)),
            }
        }
    }};
}

impl Store for PgStore {
    async fn job(&self) -> Result<Option<StoredJob>, StoreError> {
        if let Some(spec) = self.inner.take_opened_spec() {
            return spec_from_json(&spec).map_err(|e| self.inner.err(e));
        }
        with_client!(self, |c, i| { job::read_spec(&*c, i.job).await })
    }

    async fn reserve_quota(
        &self,
        wants: &[QuotaWant],
        _now_ms: u64,
    ) -> Result<Vec<QuotaGrant>, StoreError> {
        // The database's clock, not the caller's: every worker counts the same windows.
        with_client!(self, quota_connection, |c, i| {
            quota::reserve(c, i.job, wants).await
        })
    }

    async fn quota_ledger(&self) -> Result<QuotaLedger, StoreError> {
        with_client!(self, |c, i| { quota::read(c, i.job).await })
    }

    async fn put_job(&self, job: &StoredJob) -> Result<(), StoreError> {
        let spec = spec_json(job);
        self.inner.take_opened_spec();
        with_client!(self, |c, i| { job::write_spec(&*c, i.job, &spec).await })
    }

    async fn planner(&self) -> Result<PlannerState, StoreError> {
        with_client!(self, planner_connection, |c, i| {
            planner::planner_state(&*c, i.job).await
        })
    }

    async fn first_rows(&self, rows: &[(u64, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        let ids: Vec<&str> = rows.iter().map(|(_, id)| *id).collect();
        let planned: HashMap<String, u64> = with_client!(self, planner_connection, |c, i| {
            items::planned_rows(&*c, i.job, &ids).await
        })?;
        let mut local = self.inner.local();
        Ok(rows
            .iter()
            .map(|&(row, id)| {
                let first = planned
                    .get(id)
                    .or_else(|| local.notes.get(id))
                    .copied()
                    .unwrap_or(row);
                if first < row {
                    Some(first)
                } else {
                    local.notes.insert(id.to_string(), row);
                    None
                }
            })
            .collect())
    }

    async fn plan(
        &self,
        buckets: &[PlannedBucket],
        planner: &PlannerState,
    ) -> Result<(), StoreError> {
        let (job_lease, me) = {
            let local = self.inner.local();
            (local.job_lease, local.session.me.clone())
        };
        with_client!(self, planner_connection, |c, i| {
            if buckets.is_empty() {
                return planner::move_planner(c, i.job, &me, planner).await;
            }
            let plan_buckets: Vec<planner::PlanBucket> = buckets
                .iter()
                .map(|b| planner::PlanBucket {
                    bucket: b.offset.bucket,
                    items: b.items.clone(),
                    values: b.values.clone(),
                })
                .collect();
            let bad: Vec<BadLine> = buckets
                .iter()
                .flat_map(|b| b.bad_lines.iter().cloned())
                .collect();
            let records: HashMap<u64, String> = buckets
                .iter()
                .map(|b| Ok((b.offset.bucket, serde_json::to_string(&b.offset)?)))
                .collect::<Result<_, serde_json::Error>>()
                .map_err(|e| malformed("an offset record", e))?;
            let batch = planner::Plan {
                buckets: &plan_buckets,
                bad_lines: &bad,
                position: *planner,
            };
            let counts = planner::plan(
                c,
                i.job,
                &me,
                &batch,
                |b| records[&b.bucket].clone(),
                job_lease,
            )
            .await?;
            for (count, b) in counts.iter().zip(buckets) {
                if count.items != b.offset.items {
                    tracing::warn!(
                        bucket = b.offset.bucket,
                        "the database found {} of the bucket's {} IDs planned before",
                        count.duplicates,
                        b.items.len()
                    );
                }
            }
            Ok(())
        })?;
        let mut local = self.inner.local();
        for b in buckets {
            for (_, id) in &b.items {
                local.notes.remove(id);
            }
        }
        Ok(())
    }

    async fn record(&self, results: &[(String, ItemRecord)]) -> Result<(), StoreError> {
        let mut local = self.inner.local();
        local.results.extend_from_slice(results);
        local.recorded += results.len() as u64;
        Ok(())
    }

    async fn sync(&self) -> Result<(), StoreError> {
        let mut outage = Outage::default();
        loop {
            match self.inner.sync_results().await {
                Err(e) if outage.wait(&e).await => continue,
                synced => return synced.map_err(|e| self.inner.err(e)),
            }
        }
    }

    fn over_network(&self) -> bool {
        true
    }

    fn keeps_pages(&self) -> bool {
        true
    }

    async fn record_pages(&self, pages: &[(String, PageRecord)]) -> Result<(), StoreError> {
        let mut outage = Outage::default();
        loop {
            match self.inner.write_pages(pages).await {
                Err(e) if outage.wait(&e).await => continue,
                written => return written.map_err(|e| self.inner.err(e)),
            }
        }
    }

    async fn page_marks(
        &self,
        generation: u32,
        ids: &[(u64, &str)],
    ) -> Result<Vec<Option<PageMark>>, StoreError> {
        with_client!(self, |c, i| {
            pages::marks(&*c, i.job, generation, ids).await
        })
    }

    async fn pages(
        &self,
        _row: u64,
        id: &str,
        generation: u32,
        from: u32,
        count: u32,
    ) -> Result<Vec<PageRecord>, StoreError> {
        with_client!(self, |c, i| {
            pages::pages(&*c, i.job, id, generation, from, count).await
        })
    }

    async fn buckets(&self, from: u64, limit: usize) -> Result<Vec<BucketState>, StoreError> {
        with_client!(self, |c, i| {
            let rows = buckets::bucket_rows(c, i.job, Log::Job, from, limit).await?;
            rows.iter()
                .map(|r| {
                    let offset: OffsetRecord = serde_json::from_value(r.get(6))
                        .map_err(|e| malformed("an offset record", e))?;
                    Ok(BucketState {
                        offset,
                        commit: commit_record(r, 0)?,
                    })
                })
                .collect()
        })
    }

    async fn bucket_items(
        &self,
        bucket: &OffsetRecord,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        with_client!(self, |c, i| {
            items::bucket_items(&*c, i.job, bucket.bucket).await
        })
    }

    async fn item(&self, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        with_client!(self, |c, i| {
            let item = items::item(&*c, i.job, id).await?;
            Ok(item.filter(ItemRecord::is_final))
        })
    }

    async fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError> {
        with_client!(self, |c, i| { items::bad_lines(&*c, i.job, limit).await })
    }

    async fn reruns(&self) -> Result<Vec<RerunRecord>, StoreError> {
        with_client!(self, |c, i| { reruns::reruns(c, i.job).await })
    }

    async fn create_rerun(
        &self,
        rerun: &RerunRecord,
        buckets: &[RerunBucket],
    ) -> Result<(), StoreError> {
        let (job_lease, me) = {
            let local = self.inner.local();
            (local.job_lease, local.session.me.clone())
        };
        with_client!(self, |c, i| {
            reruns::create_rerun(c, i.job, &me, job_lease, rerun, buckets).await
        })
    }

    async fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        with_client!(self, |c, i| {
            reruns::rerun_buckets(c, i.job, rerun, from, limit).await
        })
    }

    async fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        with_client!(self, |c, i| {
            reruns::rerun_bucket_items(&*c, i.job, offset.rerun, offset.bucket).await
        })
    }

    async fn counted_stats(&self) -> Result<Option<StoreStats>, StoreError> {
        with_client!(self, |c, i| { stats::counted(&*c, i.job).await.map(Some) })
    }

    async fn append_history(&self, records: &[serde_json::Value]) -> Result<(), StoreError> {
        with_client!(self, |c, i| { history::append(c, i.job, records).await })
    }

    async fn history(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        with_client!(self, |c, i| { history::read(&*c, i.job).await })
    }

    async fn learned_limits(&self) -> Result<Vec<KeptLimit>, StoreError> {
        with_client!(self, quota_connection, |c, i| {
            learned::read(&*c, i.job).await
        })
    }

    async fn keep_learned_limits(&self, limits: &[KeptLimit]) -> Result<(), StoreError> {
        with_client!(self, quota_connection, |c, i| {
            learned::write(&*c, i.job, limits).await
        })
    }
}
