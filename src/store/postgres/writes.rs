//! The result writer's side of [`PgStore`]: buffered results written fenced by their
//! leases ([`super::results`]), and commits, on a connection of the writer's own
//! ([`WriterConn`]), so a result flush never queues behind the dispatcher's leases and bucket
//! reads or the planner's batches, and they never wait for its WAL flush. The writer's
//! statements are prepared once per connection (no parse and plan per flush), and a flush of the job's own results
//! is that one statement, committed by itself (no `BEGIN` and `COMMIT` round trips); with a
//! rerun's results (a lookup first, maybe two logs) it is a transaction. Either way the
//! results are durable when it returns (`synchronous_commit` as the server has it).
//!
//! Results are taken from the buffer under the writer connection's lock, so two flushes (the
//! writer's and the planner's sync, a commit) write them in the order they were recorded.
//!
//! No SQL here: the statements are [`super::results`]'s (and [`super::reruns`]'s lookup of
//! a rerun result's bucket).

use std::collections::HashMap;

use tokio_postgres::{Client, GenericClient, Statement};

use super::connect::connect;
use super::error::PgError;
use super::keys::{log_number, Lease};
use super::reruns;
use super::results::{
    write_results_as, ResultRow, COMMITTED_BUCKETS, COMMIT_BUCKET, WRITE_RESULTS,
};
use super::state::{Inner, Local, WriterConn};
use crate::store::{ItemRecord, Log};

impl WriterConn {
    /// `client` with the writer's hot statements prepared on it.
    pub(super) async fn prepared(client: Client) -> Result<WriterConn, PgError> {
        let prepare = |sql| client.prepare(sql);
        let (write, committed, commit) = tokio::try_join!(
            prepare(WRITE_RESULTS),
            prepare(COMMITTED_BUCKETS),
            prepare(COMMIT_BUCKET)
        )
        .map_err(PgError::sql("preparing the writer's statements"))?;
        Ok(WriterConn {
            client,
            write,
            committed,
            commit,
        })
    }
}

/// Whether `results` are written by one statement: the job's own, no rerun's (whose
/// buckets are looked up first).
pub(super) fn one_statement(results: &[(String, ItemRecord)]) -> bool {
    results.iter().all(|(_, r)| r.rerun.is_none())
}

impl Inner {
    /// The writer's connection, connected (again) if it is not.
    pub(super) async fn writer_connection(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<WriterConn>>, PgError> {
        let mut conn = self.writer.lock().await;
        if conn.as_ref().is_none_or(|w| w.client.is_closed()) {
            *conn = None;
            let client = connect(&self.target, &self.options).await?;
            *conn = Some(WriterConn::prepared(client).await?);
        }
        Ok(conn)
    }

    /// Write the buffered results, durable on return. On an error nothing of them counts as
    /// written: they are kept for the next flush (written again: the write is idempotent).
    pub(super) async fn sync_results(&self) -> Result<(), PgError> {
        let mut conn = self.writer_connection().await?;
        let w = conn.as_mut().expect("connected by writer_connection()");
        let results = std::mem::take(&mut self.local().results);
        if results.is_empty() {
            return Ok(());
        }
        let written = if one_statement(&results) {
            self.write_fenced(&w.client, &w.write, &results).await
        } else {
            async {
                let tx = w
                    .client
                    .transaction()
                    .await
                    .map_err(PgError::sql("starting a sync"))?;
                self.write_fenced(&tx, &w.write, &results).await?;
                tx.commit().await.map_err(PgError::sql("committing a sync"))
            }
            .await
        };
        if written.is_err() {
            self.keep_for_later(results);
        }
        written
    }

    /// Which lease covers a result, and its row as written: the job bucket's lease (or the
    /// job-wide one), or for a rerun's result the rerun bucket's, found in `rerun_buckets`.
    fn result_row(
        &self,
        local: &Local,
        id: &str,
        record: &ItemRecord,
        rerun_buckets: &HashMap<String, u64>,
    ) -> Result<Option<ResultRow>, PgError> {
        let (log, bucket) = match record.rerun {
            None => (Log::Job, record.bucket),
            Some(k) => match rerun_buckets.get(id) {
                Some(&b) => (Log::Rerun(k), b),
                None => return Ok(None),
            },
        };
        let token = local
            .held
            .get(&(log_number(log), bucket))
            .copied()
            .or(local.job_lease);
        let Some(token) = token else { return Ok(None) };
        let mut rest = record.clone();
        let body = rest.body.take().map(|b| b.get().to_string());
        Ok(Some(ResultRow {
            lease: Lease { log, bucket, token },
            id: id.to_string(),
            bucket: record.bucket,
            row: record.row,
            status: record.status,
            http_status: record.http_status,
            body,
            record: serde_json::to_string(&rest).map_err(|e| PgError::Malformed(e.to_string()))?,
        }))
    }

    /// Write `results` fenced by their leases on `tx` (a transaction, or the writer's
    /// connection when [`one_statement`] says so), the result write as `write` (prepared);
    /// the dropped ones are counted.
    pub(super) async fn write_fenced(
        &self,
        tx: &impl GenericClient,
        write: &Statement,
        results: &[(String, ItemRecord)],
    ) -> Result<(), PgError> {
        if results.is_empty() {
            return Ok(());
        }
        // A rerun's result is fenced by its rerun bucket's lease: find the buckets.
        let mut rerun_buckets: HashMap<u32, HashMap<String, u64>> = HashMap::new();
        for (id, r) in results {
            if let Some(k) = r.rerun {
                rerun_buckets.entry(k).or_default().insert(id.clone(), 0);
            }
        }
        for (k, ids) in &mut rerun_buckets {
            let wanted: Vec<&str> = ids.keys().map(String::as_str).collect();
            let found = reruns::buckets_of(tx, self.job, *k, &wanted).await?;
            *ids = found;
        }
        let (me, mut by_log, mut dropped) = {
            let local = self.local();
            let mut by_log: Vec<(Log, Vec<ResultRow>)> = Vec::new();
            let mut dropped = 0;
            let none = HashMap::new();
            for (id, r) in results {
                let buckets = r.rerun.and_then(|k| rerun_buckets.get(&k)).unwrap_or(&none);
                match self.result_row(&local, id, r, buckets)? {
                    Some(row) => match by_log.iter_mut().find(|(l, _)| *l == row.lease.log) {
                        Some((_, rows)) => rows.push(row),
                        None => by_log.push((row.lease.log, vec![row])),
                    },
                    None => dropped += 1,
                }
            }
            (local.session.me.clone(), by_log, dropped)
        };
        for (log, rows) in &mut by_log {
            let written = write_results_as(tx, write, self.job, &me, *log, rows).await?;
            dropped += written.fenced;
        }
        if dropped > 0 {
            tracing::warn!(
                results = dropped,
                "results of buckets whose lease this worker does not hold were not written"
            );
            self.local().fenced += dropped;
        }
        Ok(())
    }
}
