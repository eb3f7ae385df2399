//! Bucket leases (`hw_bucket`): acquire and release. A lease is (bucket, token) held by a
//! worker session; it is valid while the bucket still carries that owner and token. There is
//! no rescuer and no time-based rescue of live workers: [`acquire`] takes open buckets and
//! the buckets of sessions that expired, in the same statement, each with a fresh token.

use tokio_postgres::GenericClient;

use super::error::PgError;
use super::job::to_i64;
use super::{log_number, JobId, Lease, WorkerId};
use crate::store::Log;

/// A bucket just leased.
#[derive(Debug, Clone)]
pub struct Acquired {
    pub lease: Lease,
    /// The bucket's write-ahead record as stored (an `OffsetRecord` or `RerunOffset`).
    pub offset_record: serde_json::Value,
    pub items: u64,
    /// Times the bucket was leased again after an earlier lease, this one included.
    pub owner_switches: u32,
    /// Taken from a session that expired (not open).
    pub taken_over: bool,
}

/// Lease up to `n` buckets of `log`, lowest first: open ones and those whose owner's session
/// expired, skipping rows other transactions hold. Nothing if this session is not live or
/// is draining.
pub async fn acquire(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    log: Log,
    n: u32,
) -> Result<Vec<Acquired>, PgError> {
    let rows = client
        .query(
            "WITH cand AS (
                 SELECT b.job_id, b.rerun, b.bucket, b.owner AS old_owner
                 FROM hw_bucket b
                 WHERE b.job_id = $1 AND b.rerun = $3 AND b.state <> 'committed'
                   AND (b.state = 'open' OR NOT EXISTS (
                         SELECT 1 FROM hw_worker w
                         WHERE w.job_id = b.job_id AND w.worker_id = b.owner
                           AND w.expires_at > now()))
                   AND EXISTS (
                         SELECT 1 FROM hw_worker me
                         WHERE me.job_id = $1 AND me.worker_id = $2::text::uuid
                           AND me.expires_at > now() AND NOT me.draining)
                 ORDER BY b.bucket
                 LIMIT $4
                 FOR UPDATE OF b SKIP LOCKED)
             UPDATE hw_bucket b
             SET state = 'leased', owner = $2::text::uuid,
                 lease_token = nextval('hw_lease_token'),
                 owner_switches = b.owner_switches + (b.lease_token IS NOT NULL)::integer
             FROM cand
             WHERE b.job_id = cand.job_id AND b.rerun = cand.rerun AND b.bucket = cand.bucket
             RETURNING b.bucket, b.lease_token, b.offset_record, b.items, b.owner_switches,
                       cand.old_owner IS NOT NULL",
            &[&job.0, &me.0, &log_number(log), &i64::from(n)],
        )
        .await
        .map_err(PgError::sql("acquiring buckets"))?;
    let mut acquired: Vec<Acquired> = rows
        .iter()
        .map(|r| Acquired {
            lease: Lease {
                log,
                bucket: r.get::<_, i64>(0) as u64,
                token: r.get(1),
            },
            offset_record: r.get(2),
            items: r.get::<_, i64>(3) as u64,
            owner_switches: r.get::<_, i32>(4) as u32,
            taken_over: r.get(5),
        })
        .collect();
    acquired.sort_by_key(|a| a.lease.bucket);
    Ok(acquired)
}

/// Give leased buckets back (open, no owner) so others take them at once. Only leases this
/// session still holds under the given tokens are released. Returns how many.
pub async fn release(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    leases: &[Lease],
) -> Result<u64, PgError> {
    let mut released = 0;
    for log in logs(leases) {
        let (buckets, tokens) = lease_arrays(leases.iter().filter(|l| l.log == log))?;
        released += client
            .execute(
                "UPDATE hw_bucket SET state = 'open', owner = NULL
                 WHERE job_id = $1 AND rerun = $3 AND owner = $2::text::uuid AND state = 'leased'
                   AND (bucket, lease_token) IN (SELECT * FROM unnest($4::bigint[], $5::bigint[]))",
                &[&job.0, &me.0, &log_number(log), &buckets, &tokens],
            )
            .await
            .map_err(PgError::sql("releasing buckets"))?;
    }
    Ok(released)
}

/// Release every bucket this session holds, in every log (a drain's last step).
pub async fn release_all(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
) -> Result<u64, PgError> {
    client
        .execute(
            "UPDATE hw_bucket SET state = 'open', owner = NULL
             WHERE job_id = $1 AND owner = $2::text::uuid AND state = 'leased'",
            &[&job.0, &me.0],
        )
        .await
        .map_err(PgError::sql("releasing buckets"))
}

/// The distinct logs of `leases`, in first-seen order.
pub(crate) fn logs(leases: &[Lease]) -> Vec<Log> {
    let mut logs = Vec::new();
    for l in leases {
        if !logs.contains(&l.log) {
            logs.push(l.log);
        }
    }
    logs
}

/// Buckets and tokens as bigint arrays.
pub(crate) fn lease_arrays<'a>(
    leases: impl Iterator<Item = &'a Lease>,
) -> Result<(Vec<i64>, Vec<i64>), PgError> {
    let mut buckets = Vec::new();
    let mut tokens = Vec::new();
    for l in leases {
        buckets.push(to_i64(l.bucket)?);
        tokens.push(l.token);
    }
    Ok((buckets, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::test_db::{add_buckets, expire, with_job, worker};

    fn buckets(acquired: &[Acquired]) -> Vec<u64> {
        acquired.iter().map(|a| a.lease.bucket).collect()
    }

    #[tokio::test]
    async fn acquire_skips_rows_another_transaction_holds() {
        let (db, client, job) = with_job().await;
        add_buckets(&client, job, 3).await;
        let a = worker(&client, job).await;
        let mut other = db.connect().await;
        let locker = other.transaction().await.unwrap();
        locker
            .execute(
                "SELECT 1 FROM hw_bucket WHERE job_id = $1 AND bucket = 0 FOR UPDATE",
                &[&job.0],
            )
            .await
            .unwrap();
        let got = acquire(&client, job, &a, Log::Job, 10).await.unwrap();
        assert_eq!(
            buckets(&got),
            vec![1, 2],
            "bucket 0 is locked: skipped, not waited for"
        );
        locker.rollback().await.unwrap();
        let got = acquire(&client, job, &a, Log::Job, 10).await.unwrap();
        assert_eq!(buckets(&got), vec![0]);
        assert!(acquire(&client, job, &a, Log::Job, 10)
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn concurrent_acquirers_never_get_the_same_bucket() {
        let (db, client, job) = with_job().await;
        add_buckets(&client, job, 200).await;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let c = db.connect().await;
            let me = worker(&c, job).await;
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = acquire(&c, job, &me, Log::Job, 3).await.unwrap();
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(buckets(&got));
                }
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort_unstable();
        assert_eq!(
            all,
            (0..200).collect::<Vec<u64>>(),
            "each bucket exactly once"
        );
    }

    #[tokio::test]
    async fn expired_owners_buckets_are_taken_with_fresh_tokens_and_counted_switches() {
        let (_db, client, job) = with_job().await;
        add_buckets(&client, job, 5).await;
        let a = worker(&client, job).await;
        let b = worker(&client, job).await;
        let first = acquire(&client, job, &a, Log::Job, 3).await.unwrap();
        assert_eq!(buckets(&first), vec![0, 1, 2]);
        assert!(first.iter().all(|x| !x.taken_over && x.owner_switches == 0));
        // A live owner's buckets are not taken: B gets only the open ones.
        let second = acquire(&client, job, &b, Log::Job, 10).await.unwrap();
        assert_eq!(buckets(&second), vec![3, 4]);
        assert!(acquire(&client, job, &b, Log::Job, 10)
            .await
            .unwrap()
            .is_empty());

        expire(&client, job, &a).await;
        let taken = acquire(&client, job, &b, Log::Job, 10).await.unwrap();
        assert_eq!(buckets(&taken), vec![0, 1, 2]);
        let newest = first
            .iter()
            .chain(&second)
            .map(|x| x.lease.token)
            .max()
            .unwrap();
        for x in &taken {
            assert!(x.taken_over);
            assert_eq!(x.owner_switches, 1);
            assert!(x.lease.token > newest, "a fresh token from the sequence");
        }
        let owners: i64 = client
            .query_one(
                "SELECT count(*) FROM hw_bucket WHERE job_id = $1 AND owner = $2::text::uuid",
                &[&job.0, &b.0],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(owners, 5);
    }

    #[tokio::test]
    async fn an_expired_or_draining_session_acquires_nothing() {
        let (_db, client, job) = with_job().await;
        add_buckets(&client, job, 2).await;
        let a = worker(&client, job).await;
        expire(&client, job, &a).await;
        assert!(acquire(&client, job, &a, Log::Job, 10)
            .await
            .unwrap()
            .is_empty());
        let b = worker(&client, job).await;
        crate::store::postgres::session::drain(&client, job, &b)
            .await
            .unwrap();
        assert!(acquire(&client, job, &b, Log::Job, 10)
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn released_buckets_are_taken_at_once_and_stale_tokens_release_nothing() {
        let (_db, client, job) = with_job().await;
        add_buckets(&client, job, 2).await;
        let a = worker(&client, job).await;
        let b = worker(&client, job).await;
        let held = acquire(&client, job, &a, Log::Job, 2).await.unwrap();
        let stale = Lease {
            token: held[0].lease.token - 1,
            ..held[0].lease
        };
        assert_eq!(release(&client, job, &a, &[stale]).await.unwrap(), 0);
        assert_eq!(
            release(&client, job, &b, &[held[0].lease]).await.unwrap(),
            0,
            "not B's"
        );
        assert_eq!(
            release(&client, job, &a, &[held[0].lease]).await.unwrap(),
            1
        );
        // No TTL to wait for: B takes it now, as a switch of owner.
        let got = acquire(&client, job, &b, Log::Job, 10).await.unwrap();
        assert_eq!(buckets(&got), vec![0]);
        assert_eq!(got[0].owner_switches, 1);
        assert!(!got[0].taken_over);
        assert_eq!(release_all(&client, job, &a).await.unwrap(), 1);
    }
}
