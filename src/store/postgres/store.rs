//! [`PgStore`]: the PostgreSQL backend of the [`Store`] seam, one job of one database, seen
//! by one worker session.
//!
//! Reads go straight to the database. Writes keep the seam's contract with the fences of
//! [`super::results`]: `record` buffers results in memory and `sync` writes them in one
//! transaction, each under the lease of its bucket (a result of a bucket this session holds
//! no lease on is dropped there: a worker that lost a bucket writes nothing that counts);
//! `plan` writes its batch at once under the planner lease ([`super::planner`]), and
//! `create_rerun` the rerun with its buckets in one transaction. The leases themselves, the
//! commits and the session's heartbeat are in [`super::leases`].
//!
//! A result's row keeps the item's record as JSON (`record`, without the body) and the
//! API's answer byte for byte (`body`, `json`), so users can query `hw_result`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, Row};

use super::error::PgError;
use super::job::{find_job, to_i64};
use super::leases::Session;
use super::outage::Outage;
use super::rows::{
    commit_record, item_record, malformed, spec_from_json, spec_json, sql, BUCKET_COLUMNS,
};
use super::session::{register, WorkerInfo};
use super::writes::WriterConn;
use super::{connect, log_number, migrate, ConnectOptions, JobId, PgTarget, WorkerId};
use crate::quota::{QuotaGrant, QuotaLedger, QuotaWant};
use crate::store::{
    BadLine, BucketState, ItemRecord, Log, OffsetRecord, PlannedBucket, PlannerState, RerunBucket,
    RerunBucketState, RerunOffset, RerunRecord, Store, StoreError, StoreStats, StoredJob,
};

/// How a worker opens a job of a database.
#[derive(Debug, Clone)]
pub struct PgOpen {
    /// The job's name (`--job`).
    pub job: String,
    /// Create the job's row if there is none (a first run with its input); else a missing
    /// job is an error.
    pub create: bool,
    /// How long the session lives without a heartbeat.
    pub ttl: Duration,
    /// Register a worker session (a run). Without one (status, export) the store only
    /// reads, and takes no lease.
    pub worker: bool,
    pub connect: ConnectOptions,
}

impl PgOpen {
    pub fn new(job: impl Into<String>) -> PgOpen {
        PgOpen {
            job: job.into(),
            create: false,
            ttl: Duration::from_secs(30),
            worker: true,
            connect: ConnectOptions::default(),
        }
    }
}

/// The session of a store opened without one: no bucket is ever leased to it.
const NO_WORKER: &str = "00000000-0000-0000-0000-000000000000";

/// A job of a PostgreSQL database, as one worker session sees it (see the module doc).
pub struct PgStore {
    pub(super) inner: Arc<Inner>,
    heartbeat: tokio::task::JoinHandle<()>,
}

pub(super) struct Inner {
    pub(super) target: PgTarget,
    pub(super) options: ConnectOptions,
    pub(super) job: JobId,
    pub(super) name: String,
    pub(super) ttl: Duration,
    /// Whether this open created the job's row.
    pub(super) created: bool,
    /// The dispatcher's connection (leases, bucket reads) and everything else's but the
    /// planner's and the result writer's.
    conn: tokio::sync::Mutex<Option<Client>>,
    /// The planner's (connected once it plans): its batches never hold up the leases.
    planner_conn: tokio::sync::Mutex<Option<Client>>,
    /// The result writer's (connected at its first write, see [`super::writes`]).
    pub(super) writer: tokio::sync::Mutex<Option<WriterConn>>,
    pub(super) local: Mutex<Local>,
    /// Wakes the heartbeat early: the worker's idleness changed, its share should follow.
    pub(super) wake: Arc<tokio::sync::Notify>,
}

/// What the session holds in memory.
pub(super) struct Local {
    pub(super) session: Session,
    /// Results written but not synced.
    pub(super) results: Vec<(String, ItemRecord)>,
    /// IDs the planner noted (`first_rows`) and has not planned yet, with their rows.
    notes: HashMap<String, u64>,
    /// Bucket leases held: (log number, bucket) → token.
    pub(super) held: HashMap<(i32, u64), i64>,
    /// The job-wide lease held, if any: every bucket this session leased under it carries
    /// its token.
    pub(super) job_lease: Option<i64>,
    /// Results dropped by a fence since the store was opened.
    pub(super) fenced: u64,
    /// Results written (recorded) since the store was opened: the heartbeat reports them.
    pub(super) recorded: u64,
    /// The worker holds no bucket and found none to lease: its heartbeat gives its rate
    /// share back to the busy workers.
    pub(super) idle: bool,
}

impl PgStore {
    /// Connect, bring the schema up to date, find (or with `create`, create) the job and
    /// register this process's worker session, kept alive by a heartbeat until the store is
    /// dropped or [`PgStore::close`]d.
    pub async fn open(target: &PgTarget, open: &PgOpen) -> Result<PgStore, StoreError> {
        let place = format!("job {:?} of {target}", open.job);
        let at = |e: PgError| StoreError::at(&place, e.into());
        let options = if open.worker {
            open.connect.clone().for_session(open.ttl)
        } else {
            open.connect.clone()
        };
        let mut client = connect(target, &options).await.map_err(at)?;
        migrate(&mut client).await.map_err(at)?;
        let (job, created) = match find_job(&client, &open.job).await {
            Ok(job) => (job, false),
            Err(PgError::NoSuchJob(_)) if open.create => {
                let (job, created) = super::job::create_job(
                    &client,
                    &super::job::NewJob {
                        name: &open.job,
                        spec: &serde_json::Value::Null,
                        input_fingerprint: None,
                        bucket_size: 1,
                        rate_per_s: None,
                        burst: None,
                    },
                )
                .await
                .map_err(at)?;
                (job, created)
            }
            Err(e) => return Err(at(e)),
        };
        let me = if open.worker {
            register_here(&client, job, open.ttl).await.map_err(at)?
        } else {
            WorkerId(NO_WORKER.into())
        };
        let inner = Arc::new(Inner {
            target: target.clone(),
            options,
            job,
            name: open.job.clone(),
            ttl: open.ttl,
            created,
            conn: tokio::sync::Mutex::new(Some(client)),
            planner_conn: tokio::sync::Mutex::new(None),
            writer: tokio::sync::Mutex::new(None),
            local: Mutex::new(Local {
                session: Session::new(me, Instant::now() + open.ttl),
                results: Vec::new(),
                notes: HashMap::new(),
                held: HashMap::new(),
                job_lease: None,
                fenced: 0,
                recorded: 0,
                idle: false,
            }),
            wake: Arc::new(tokio::sync::Notify::new()),
        });
        let heartbeat = if open.worker {
            tokio::spawn(super::leases::keep_alive(Arc::downgrade(&inner)))
        } else {
            tokio::spawn(async {})
        };
        Ok(PgStore { inner, heartbeat })
    }

    /// Whether this open created the job's row (a first run).
    pub fn created_job(&self) -> bool {
        self.inner.created
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Results dropped by a fence since the store was opened (their bucket's lease was not
    /// held any more).
    pub fn fenced(&self) -> u64 {
        self.inner.local().fenced
    }

    /// This process's worker session.
    pub fn worker(&self) -> WorkerId {
        self.inner.local().session.me.clone()
    }

    /// End the session: release every lease at once (no one waits for a TTL) and delete the
    /// session's row.
    pub async fn close(self) -> Result<(), StoreError> {
        self.heartbeat.abort();
        let me = self.worker();
        let mut conn = self.inner.client().await?;
        let client = conn.as_mut().expect("connected by client()");
        super::session::end(client, self.inner.job, &me)
            .await
            .map_err(|e| self.inner.err(e))?;
        Ok(())
    }

    /// The job's workers, for `status`.
    pub async fn workers(&self) -> Result<Vec<super::session::WorkerRow>, StoreError> {
        let conn = self.inner.client().await?;
        let c = conn.as_ref().expect("connected by client()");
        super::session::workers(c, self.inner.job)
            .await
            .map_err(|e| self.inner.err(e))
    }

    /// Where planning stands, for `status`.
    pub async fn planning(&self) -> Result<super::stats::Planning, StoreError> {
        let conn = self.inner.client().await?;
        let c = conn.as_ref().expect("connected by client()");
        super::stats::planning(c, self.inner.job)
            .await
            .map_err(|e| self.inner.err(e))
    }

    /// Remove the job this open created (its creation was refused after all).
    pub async fn discard_created_job(self) -> Result<(), StoreError> {
        self.heartbeat.abort();
        if !self.inner.created {
            return Ok(());
        }
        let conn = self.inner.client().await?;
        conn.as_ref()
            .expect("connected by client()")
            .execute("DELETE FROM hw_job WHERE job_id = $1", &[&self.inner.job.0])
            .await
            .map_err(|e| self.inner.err(PgError::sql("removing the new job")(e)))?;
        Ok(())
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Dropped without close (a crash, in tests): the session lives on until its TTL.
        self.heartbeat.abort();
    }
}

/// Register a session for this process, named by its host and pid.
pub(super) async fn register_here(
    client: &Client,
    job: JobId,
    ttl: Duration,
) -> Result<WorkerId, PgError> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let info = WorkerInfo {
        host: &host,
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION"),
    };
    register(client, job, &info, ttl).await
}

impl Inner {
    pub(super) fn local(&self) -> MutexGuard<'_, Local> {
        // Every change under the lock is complete before it is released.
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn me(&self) -> WorkerId {
        self.local().session.me.clone()
    }

    /// `e`, said of this job.
    pub(super) fn err(&self, e: PgError) -> StoreError {
        StoreError::at(format!("job {:?} of {}", self.name, self.target), e.into())
    }

    /// The store's connection, connected again first if it was lost (a restarted
    /// database).
    pub(super) async fn client(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, StoreError> {
        self.connection().await.map_err(|e| self.err(e))
    }

    /// [`Inner::client`], its error as the database said it.
    pub(super) async fn connection(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, PgError> {
        self.connected(&self.conn).await
    }

    /// The planner's connection, as [`Inner::connection`].
    pub(super) async fn planner_connection(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, PgError> {
        self.connected(&self.planner_conn).await
    }

    /// `conn`, connected (again) if it is not.
    async fn connected<'a>(
        &self,
        conn: &'a tokio::sync::Mutex<Option<Client>>,
    ) -> Result<tokio::sync::MutexGuard<'a, Option<Client>>, PgError> {
        let mut conn = conn.lock().await;
        if conn.as_ref().is_none_or(Client::is_closed) {
            *conn = None;
            *conn = Some(connect(&self.target, &self.options).await?);
        }
        Ok(conn)
    }
}

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
        with_client!(self, |c, i| {
            let row = c
                .query_one("SELECT spec FROM hw_job WHERE job_id = $1", &[&i.job.0])
                .await
                .map_err(sql("reading the job"))?;
            spec_from_json(&row.get(0))
        })
    }

    async fn reserve_quota(
        &self,
        wants: &[QuotaWant],
        _now_ms: u64,
    ) -> Result<Vec<QuotaGrant>, StoreError> {
        // The database's clock, not the caller's: every worker counts the same windows.
        with_client!(self, |c, i| {
            super::quota::reserve(c, i.job, wants).await
        })
    }

    async fn quota_ledger(&self) -> Result<QuotaLedger, StoreError> {
        with_client!(self, |c, i| { super::quota::read(c, i.job).await })
    }

    async fn put_job(&self, job: &StoredJob) -> Result<(), StoreError> {
        let spec = spec_json(job);
        with_client!(self, |c, i| {
            c.execute(
                "UPDATE hw_job SET spec = $2 WHERE job_id = $1",
                &[&i.job.0, &spec],
            )
            .await
            .map_err(sql("storing the job"))?;
            Ok(())
        })
    }

    async fn planner(&self) -> Result<PlannerState, StoreError> {
        with_client!(self, planner_connection, |c, i| {
            super::planner::planner_state(&*c, i.job).await
        })
    }

    async fn first_rows(&self, rows: &[(u64, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        let ids: Vec<&str> = rows.iter().map(|(_, id)| *id).collect();
        let planned: HashMap<String, u64> = with_client!(self, planner_connection, |c, i| {
            // One primary-key probe per ID, whatever the table's statistics say: with
            // `id = ANY($2)` the planner (no statistics yet on a new job's rows: `job_id`
            // looks selective) scanned every row of the job per batch, quadratic in the job.
            let found = c
                .query(
                    "SELECT u.id, i.\"row\" FROM unnest($2::text[]) AS u(id)
                     CROSS JOIN LATERAL (SELECT \"row\" FROM hw_item
                                         WHERE job_id = $1 AND id = u.id LIMIT 1) i",
                    &[&i.job.0, &ids],
                )
                .await
                .map_err(sql("looking up planned IDs"))?;
            Ok(found
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
                .collect())
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
                return move_planner(c, i.job, &me, planner).await;
            }
            let token = super::planner::acquire_planner(&*c, i.job, &me)
                .await?
                .ok_or(PgError::PlannerLeaseLost { token: 0 })?;
            let plan_buckets: Vec<super::planner::PlanBucket> = buckets
                .iter()
                .map(|b| super::planner::PlanBucket {
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
            let batch = super::planner::Plan {
                buckets: &plan_buckets,
                bad_lines: &bad,
                position: *planner,
            };
            let counts = super::planner::plan(
                c,
                i.job,
                &me,
                token,
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

    async fn buckets(&self, from: u64, limit: usize) -> Result<Vec<BucketState>, StoreError> {
        with_client!(self, |c, i| {
            let rows = bucket_rows(c, i.job, Log::Job, from, limit).await?;
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
            let rows = c
                .query(
                    "SELECT id, \"row\", bucket, status, body::text, record::text, row_values::text
                     FROM hw_item
                     WHERE job_id = $1 AND bucket = $2 ORDER BY \"row\"",
                    &[&i.job.0, &to_i64(bucket.bucket)?],
                )
                .await
                .map_err(sql("reading a bucket's items"))?;
            rows.iter().map(|r| item_record(r, 0)).collect()
        })
    }

    async fn item(&self, id: &str) -> Result<Option<ItemRecord>, StoreError> {
        with_client!(self, |c, i| {
            let row = c
                .query_opt(
                    "SELECT id, \"row\", bucket, status, body::text, record::text, row_values::text
                     FROM hw_item
                     WHERE job_id = $1 AND id = $2",
                    &[&i.job.0, &id],
                )
                .await
                .map_err(sql("reading an item"))?;
            match row {
                Some(r) => Ok(Some(item_record(&r, 0)?.1).filter(ItemRecord::is_final)),
                None => Ok(None),
            }
        })
    }

    async fn bad_lines(&self, limit: usize) -> Result<Vec<BadLine>, StoreError> {
        with_client!(self, |c, i| {
            let rows = c
                .query(
                    "SELECT \"row\", line, reason FROM hw_bad_line WHERE job_id = $1
                     ORDER BY \"row\" LIMIT $2",
                    &[&i.job.0, &(limit.min(i64::MAX as usize) as i64)],
                )
                .await
                .map_err(sql("reading bad lines"))?;
            Ok(rows
                .iter()
                .map(|r| BadLine {
                    row: r.get::<_, i64>(0) as u64,
                    line: r.get::<_, i64>(1) as u64,
                    reason: r.get(2),
                })
                .collect())
        })
    }

    async fn reruns(&self) -> Result<Vec<RerunRecord>, StoreError> {
        with_client!(self, |c, i| { super::reruns::reruns(c, i.job).await })
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
            super::reruns::create_rerun(c, i.job, &me, job_lease, rerun, buckets).await
        })
    }

    async fn rerun_buckets(
        &self,
        rerun: u32,
        from: u64,
        limit: usize,
    ) -> Result<Vec<RerunBucketState>, StoreError> {
        with_client!(self, |c, i| {
            super::reruns::rerun_buckets(c, i.job, rerun, from, limit).await
        })
    }

    async fn rerun_bucket_items(
        &self,
        offset: &RerunOffset,
    ) -> Result<Vec<(String, ItemRecord)>, StoreError> {
        with_client!(self, |c, i| {
            super::reruns::rerun_bucket_items(c, i.job, offset).await
        })
    }

    async fn counted_stats(&self) -> Result<Option<StoreStats>, StoreError> {
        with_client!(self, |c, i| {
            super::stats::counted(&*c, i.job).await.map(Some)
        })
    }

    async fn append_history(&self, records: &[serde_json::Value]) -> Result<(), StoreError> {
        with_client!(self, |c, i| {
            super::history::append(c, i.job, records).await
        })
    }

    async fn history(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        with_client!(self, |c, i| { super::history::read(&*c, i.job).await })
    }
}

/// A page of a log's bucket rows ([`BUCKET_COLUMNS`]).
pub(super) async fn bucket_rows(
    c: &Client,
    job: JobId,
    log: Log,
    from: u64,
    limit: usize,
) -> Result<Vec<Row>, PgError> {
    c.query(
        &format!(
            "SELECT {BUCKET_COLUMNS} FROM hw_bucket
             WHERE job_id = $1 AND rerun = $2 AND bucket >= $3 ORDER BY bucket LIMIT $4"
        ),
        &[
            &job.0,
            &log_number(log),
            &to_i64(from)?,
            &(limit.min(i64::MAX as usize) as i64),
        ],
    )
    .await
    .map_err(sql("reading buckets"))
}

/// Move the planner without planning (the input grew, or was found at its end), unless
/// another live session holds the planner lease.
async fn move_planner(
    c: &Client,
    job: JobId,
    me: &WorkerId,
    p: &PlannerState,
) -> Result<(), PgError> {
    let n = c
        .execute(
            "UPDATE hw_job j SET next_bucket = $3, cursor_byte = $4, cursor_line = $5,
                 cursor_row = $6, planner_exhausted = $7
             WHERE j.job_id = $1 AND (j.planner IS NULL OR j.planner = $2::text::uuid
                 OR NOT EXISTS (SELECT 1 FROM hw_worker w WHERE w.job_id = j.job_id
                                AND w.worker_id = j.planner AND w.expires_at > now()))",
            &[
                &job.0,
                &me.0,
                &to_i64(p.next_bucket)?,
                &to_i64(p.cursor.byte)?,
                &to_i64(p.cursor.line)?,
                &to_i64(p.cursor.row)?,
                &p.exhausted,
            ],
        )
        .await
        .map_err(sql("moving the planner"))?;
    if n == 0 {
        return Err(PgError::PlannerLeaseLost { token: 0 });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{PgOpen, PgStore};
    use crate::store::postgres::test_db::{add_buckets, expire, migrated};
    use crate::store::Log;

    /// A worker stopped in the middle of a transaction (SIGSTOP, a partition) holds
    /// its bucket rows' locks; once its session expires, the others take its buckets over
    /// within the TTL and a few seconds, not when the server's default idle timeout (60 s)
    /// would end that transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_stopped_inside_a_transaction_does_not_keep_its_buckets() {
        let db = migrated().await;
        let open = PgOpen {
            create: true,
            ttl: Duration::from_secs(2),
            ..PgOpen::new("stalled")
        };
        let stalled = PgStore::open(&db.target, &open).await.unwrap();
        let job = stalled.inner.job;
        let admin = db.connect().await;
        add_buckets(&admin, job, 2).await;
        let held = stalled.acquire_buckets(Log::Job, 1).await.unwrap();
        assert_eq!(held.len(), 1);
        let bucket = held[0].lease.bucket as i64;
        // It stops: no heartbeat, and its connection idle inside a transaction that locks
        // its bucket's row (as a commit does).
        stalled.heartbeat.abort();
        {
            let conn = stalled.inner.client().await.unwrap();
            let c = conn.as_ref().unwrap();
            c.batch_execute("BEGIN").await.unwrap();
            c.execute(
                "SELECT 1 FROM hw_bucket WHERE job_id = $1 AND bucket = $2 FOR UPDATE",
                &[&job.0, &bucket],
            )
            .await
            .unwrap();
        }
        expire(&admin, job, &stalled.worker()).await;
        let other = PgStore::open(
            &db.target,
            &PgOpen {
                create: false,
                ..open
            },
        )
        .await
        .unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(20);
        let mut taken = false;
        while !taken && Instant::now() < deadline {
            let got = other.acquire_buckets(Log::Job, 2).await.unwrap();
            taken = got.iter().any(|a| a.lease.bucket as i64 == bucket);
            if !taken {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        assert!(
            taken,
            "bucket {bucket} of the expired session not taken over within {:?}",
            started.elapsed()
        );
    }
}
