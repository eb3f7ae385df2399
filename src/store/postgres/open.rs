//! How a worker opens a job of a database ([`PgOpen`]) and the store's life around its
//! `Store` methods: open (connect, migrate, find or create the job, register the session and
//! start its heartbeat), what `status` reads of the fleet, and close (the session's end, or
//! the removal of a job whose creation was refused).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::connect::{connect, opened, ConnectOptions, Connecting, PgTarget};
use super::error::PgError;
use super::heartbeat::keep_alive;
use super::job::{create_job, delete_job, find_job, open_row, NewJob};
use super::keys::WorkerId;
use super::migrate::migrate;
use super::session::{self, WorkerRow};
use super::state::{Inner, Local, PgStore, Session, WriterConn};
use super::stats::{self, Planning};
use crate::store::StoreError;

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
    /// Per-connection settings (timeouts).
    pub connect: ConnectOptions,
}

impl PgOpen {
    /// Open `job` as a worker with a 30 s session, without creating it.
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
        // A worker's other connections connect while its own connects and opens the job:
        // each costs several round trips (TCP, startup, a password exchange), and the
        // planner's, the quotas' and the heartbeat's are on the way to the first bucket.
        let early = open.worker.then(|| Early::connect(target, &options));
        let mut client = connect(target, &options).await.map_err(at)?;
        migrate(&mut client).await.map_err(at)?;
        let new_job = NewJob {
            name: &open.job,
            spec: &serde_json::Value::Null,
            input_fingerprint: None,
            bucket_size: 1,
            rate_per_s: None,
            burst: None,
        };
        let host = session::hostname();
        let info = session::WorkerInfo::here(&host);
        let worker = open.worker.then_some((&info, open.ttl));
        let (job, created, me, spec) = match open_row(&client, &new_job, open.create, worker)
            .await
            .map_err(at)?
        {
            Some(row) => (row.job, row.created, row.me, Some(row.spec)),
            // None visible to that statement: there is none, or another worker's creation
            // committed after it began. Each statement of the long way sees it.
            None => {
                let (job, created) = match find_job(&client, &open.job).await {
                    Ok(job) => (job, false),
                    Err(PgError::NoSuchJob(_)) if open.create => {
                        create_job(&client, &new_job).await.map_err(at)?
                    }
                    Err(e) => return Err(at(e)),
                };
                let me = match worker {
                    Some((info, ttl)) => Some(
                        session::register(&client, job, info, ttl)
                            .await
                            .map_err(at)?,
                    ),
                    None => None,
                };
                (job, created, me, None)
            }
        };
        let me = me.unwrap_or_else(|| WorkerId(NO_WORKER.into()));
        let inner = Arc::new(Inner {
            target: target.clone(),
            options,
            job,
            name: open.job.clone(),
            ttl: open.ttl,
            created,
            conn: tokio::sync::Mutex::new(Some(client)),
            opened_spec: Mutex::new(spec),
            planner_conn: tokio::sync::Mutex::new(None),
            quota_conn: tokio::sync::Mutex::new(None),
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
                rejoined: None,
            }),
            wake: Arc::new(tokio::sync::Notify::new()),
        });
        let heartbeat = match early {
            Some(early) => {
                tokio::spawn(warm_up(
                    inner.clone(),
                    early.planner,
                    early.quota,
                    early.writer,
                ));
                tokio::spawn(keep_alive(Arc::downgrade(&inner), Some(early.heartbeat)))
            }
            None => tokio::spawn(async {}),
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
        let conn = self.inner.client().await?;
        let client = conn.as_ref().expect("connected by client()");
        session::end(client, self.inner.job, &me)
            .await
            .map_err(|e| self.inner.err(e))?;
        Ok(())
    }

    /// The job's workers, for `status`.
    pub async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        let conn = self.inner.client().await?;
        let c = conn.as_ref().expect("connected by client()");
        session::workers(c, self.inner.job)
            .await
            .map_err(|e| self.inner.err(e))
    }

    /// Where planning stands, for `status`.
    pub async fn planning(&self) -> Result<Planning, StoreError> {
        let conn = self.inner.client().await?;
        let c = conn.as_ref().expect("connected by client()");
        stats::planning(c, self.inner.job)
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
        let c = conn.as_ref().expect("connected by client()");
        delete_job(c, self.inner.job)
            .await
            .map_err(|e| self.inner.err(e))?;
        Ok(())
    }
}

/// A worker's other connections, opened ahead ([`PgStore::open`]).
struct Early {
    planner: Connecting,
    quota: Connecting,
    writer: Connecting,
    heartbeat: Connecting,
}

impl Early {
    fn connect(target: &PgTarget, options: &ConnectOptions) -> Early {
        let one = || {
            let (target, options) = (target.clone(), options.clone());
            tokio::spawn(async move { connect(&target, &options).await })
        };
        Early {
            planner: one(),
            quota: one(),
            writer: one(),
            heartbeat: one(),
        }
    }
}

/// Give a worker's planner, quotas and result writer the connections opened for them
/// while the job opened ([`Early`]), not each at its first statement: with the database
/// some milliseconds away a connection costs several round trips, and the planner's and
/// the quotas' are on the way to the first bucket. Their slots are held until then, so a
/// first user waits for the connection on its way rather than opening another. One that
/// failed is opened again, and its error said, by its first user.
async fn warm_up(inner: Arc<Inner>, planner: Connecting, quota: Connecting, writer: Connecting) {
    let (mut planner_slot, mut quota_slot, mut writer_slot) = tokio::join!(
        inner.planner_conn.lock(),
        inner.quota_conn.lock(),
        inner.writer.lock()
    );
    let (planner, quota, writer) = tokio::join!(opened(planner), opened(quota), opened(writer));
    for (which, slot, client) in [
        ("planner", &mut *planner_slot, planner),
        ("quotas", &mut *quota_slot, quota),
    ] {
        match client {
            Some(Ok(client)) if slot.is_none() => *slot = Some(client),
            Some(Err(e)) => tracing::debug!("the {which}'s connection, opened ahead: {e}"),
            _ => {}
        }
    }
    drop((planner_slot, quota_slot));
    let prepared = match writer {
        Some(Ok(client)) if writer_slot.is_none() => WriterConn::prepared(client).await,
        Some(Err(e)) => Err(e),
        _ => return,
    };
    match prepared {
        Ok(conn) => *writer_slot = Some(conn),
        Err(e) => tracing::debug!("the writer's connection, opened ahead: {e}"),
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Dropped without close (a crash, in tests): the session lives on until its TTL.
        self.heartbeat.abort();
    }
}
