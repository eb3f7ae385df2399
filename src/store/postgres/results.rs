//! Fenced result writes and commits (`hw_item`, `hw_bucket`).
//!
//! A result is written only if, in the same statement, the bucket row it belongs to still
//! holds the writer as owner under the writer's token, and that row is share-locked until
//! the transaction ends, so no acquire can move the lease between the check and the commit
//! of the write. The upsert also never replaces a row written under a newer token. A commit
//! updates the bucket only for its current owner and token (`state = 'leased'`); no row
//! updated means the lease was lost ([`PgError::LeaseLost`]). [`flush`] does a group flush's
//! results and commits in one transaction and one round trip per statement, so "results
//! durable before commit" holds by construction.

use std::collections::HashMap;

use tokio_postgres::{Client, GenericClient, ToStatement};

use super::error::PgError;
use super::job::to_i64;
use super::{log_number, JobId, Lease, WorkerId};
use crate::store::{CommitRecord, ItemStatus, Log};

/// One final result, written under `lease` (a bucket of the job's log or of a rerun's).
#[derive(Debug, Clone)]
pub struct ResultRow {
    pub lease: Lease,
    pub id: String,
    /// The job bucket and input row of the ID (used only if the ID was never planned).
    pub bucket: u64,
    pub row: u64,
    pub status: ItemStatus,
    pub http_status: Option<u16>,
    /// The API's answer, JSON text, stored byte for byte.
    pub body: Option<String>,
    /// The rest of the item's record, JSON text.
    pub record: String,
}

/// What a fenced write did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    pub written: u64,
    /// Rows not written: their lease is not held, or a newer token wrote the item.
    pub fenced: u64,
}

/// The fenced result write of [`write_results`] (one statement: check, share-lock, upsert).
pub const WRITE_RESULTS: &str = "WITH held AS (
                 SELECT b.bucket, b.lease_token FROM hw_bucket b
                 WHERE b.job_id = $1 AND b.rerun = $3 AND b.owner = $2::text::uuid
                   AND b.state = 'leased'
                   AND (b.bucket, b.lease_token) IN
                       (SELECT DISTINCT * FROM unnest($4::bigint[], $5::bigint[]))
                 FOR SHARE OF b),
             incoming AS (
                 SELECT * FROM unnest($4::bigint[], $5::bigint[], $6::text[], $7::bigint[],
                                      $8::bigint[], $9::text[], $10::integer[], $11::text[],
                                      $12::text[]) WITH ORDINALITY
                     AS u(lease_bucket, token, id, bucket, item_row, status, http_status,
                          body, record, ord))
             INSERT INTO hw_item AS i
                 (job_id, id, bucket, \"row\", status, http_status, body, record, lease_token)
             SELECT $1, u.id, u.bucket, u.item_row, u.status, u.http_status, u.body::json,
                    u.record::jsonb, u.token
             FROM incoming u JOIN held h ON h.bucket = u.lease_bucket AND h.lease_token = u.token
             ORDER BY u.ord
             ON CONFLICT (job_id, id) DO UPDATE
                 SET status = EXCLUDED.status, http_status = EXCLUDED.http_status,
                     body = EXCLUDED.body, record = EXCLUDED.record,
                     lease_token = EXCLUDED.lease_token
                 WHERE i.lease_token <= EXCLUDED.lease_token";

/// Write final results of one log, fenced by their leases (see the module doc). A later row
/// for the same ID in `rows` wins. One statement: by itself, or inside the transaction that
/// commits the buckets.
pub async fn write_results(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    log: Log,
    rows: &[ResultRow],
) -> Result<Written, PgError> {
    write_results_as(client, WRITE_RESULTS, job, me, log, rows).await
}

/// [`write_results`] by `statement`: [`WRITE_RESULTS`], or the same prepared.
pub async fn write_results_as<T: ?Sized + ToStatement + Sync + Send>(
    client: &impl GenericClient,
    statement: &T,
    job: JobId,
    me: &WorkerId,
    log: Log,
    rows: &[ResultRow],
) -> Result<Written, PgError> {
    if rows.iter().any(|r| r.lease.log != log) {
        return Err(PgError::Malformed(
            "results of several logs in one write".into(),
        ));
    }
    // ON CONFLICT DO UPDATE may touch a row once per statement: keep each ID's last result.
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        last.insert(&r.id, i);
    }
    let mut picked: Vec<usize> = last.into_values().collect();
    picked.sort_unstable();
    let n = picked.len();
    let (mut lease_buckets, mut tokens, mut ids, mut buckets, mut item_rows) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut statuses, mut http, mut bodies, mut records) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for &i in &picked {
        let r = &rows[i];
        lease_buckets.push(to_i64(r.lease.bucket)?);
        tokens.push(r.lease.token);
        ids.push(r.id.as_str());
        buckets.push(to_i64(r.bucket)?);
        item_rows.push(to_i64(r.row)?);
        statuses.push(status_name(r.status));
        http.push(r.http_status.map(i32::from));
        bodies.push(r.body.as_deref());
        records.push(r.record.as_str());
    }
    let written = client
        .execute(
            statement,
            &[
                &job.0,
                &me.0,
                &log_number(log),
                &lease_buckets,
                &tokens,
                &ids,
                &buckets,
                &item_rows,
                &statuses,
                &http,
                &bodies,
                &records,
            ],
        )
        .await
        .map_err(PgError::sql("writing results"))?;
    Ok(Written {
        written,
        fenced: rows.len() as u64 - written,
    })
}

fn status_name(status: ItemStatus) -> &'static str {
    match status {
        ItemStatus::Pending => "pending",
        ItemStatus::Ok => "ok",
        ItemStatus::Failed => "failed",
    }
}

/// Commit a bucket with its commit record's counts and time, for its current owner and
/// token only. [`PgError::LeaseLost`] if another session leased it since (nothing is
/// changed).
pub async fn commit_bucket(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    lease: &Lease,
    tally: &CommitRecord,
) -> Result<(), PgError> {
    commit_bucket_as(client, COMMIT_BUCKET, job, me, lease, tally).await
}

/// The update of [`commit_bucket`].
pub const COMMIT_BUCKET: &str = "UPDATE hw_bucket
             SET state = 'committed', ok = $6, failed = $7, failed_by_class = $8,
                 committed_at = to_timestamp($9::float8 / 1000)
             WHERE job_id = $1 AND rerun = $3 AND bucket = $4 AND owner = $2::text::uuid
               AND lease_token = $5 AND state = 'leased'";

/// [`commit_bucket`] by `statement`: [`COMMIT_BUCKET`], or the same prepared.
pub async fn commit_bucket_as<T: ?Sized + ToStatement + Sync + Send>(
    client: &impl GenericClient,
    statement: &T,
    job: JobId,
    me: &WorkerId,
    lease: &Lease,
    tally: &CommitRecord,
) -> Result<(), PgError> {
    let by_class = serde_json::to_value(&tally.failed_by_class)
        .map_err(|e| PgError::Malformed(e.to_string()))?;
    let n = client
        .execute(
            statement,
            &[
                &job.0,
                &me.0,
                &log_number(lease.log),
                &to_i64(lease.bucket)?,
                &lease.token,
                &to_i64(tally.ok)?,
                &to_i64(tally.failed)?,
                &by_class,
                &(tally.committed_at_ms as f64),
            ],
        )
        .await
        .map_err(PgError::sql("committing a bucket"))?;
    if n == 0 {
        return Err(PgError::LeaseLost {
            log: log_number(lease.log),
            bucket: lease.bucket,
            token: lease.token,
        });
    }
    Ok(())
}

/// What a group flush did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flushed {
    pub results: Written,
    /// Buckets committed now.
    pub committed: Vec<Lease>,
    /// Leases found lost at commit: forget these buckets (their results were not written).
    pub lost: Vec<Lease>,
}

/// One group flush: the results, then the commits of buckets whose last results these are,
/// in one transaction. A lost lease costs only its own bucket.
pub async fn flush(
    client: &mut Client,
    job: JobId,
    me: &WorkerId,
    log: Log,
    rows: &[ResultRow],
    commits: &[(Lease, CommitRecord)],
) -> Result<Flushed, PgError> {
    let tx = client
        .transaction()
        .await
        .map_err(PgError::sql("starting a flush"))?;
    let mut flushed = Flushed {
        results: write_results(&tx, job, me, log, rows).await?,
        ..Flushed::default()
    };
    for (lease, tally) in commits {
        match commit_bucket(&tx, job, me, lease, tally).await {
            Ok(()) => flushed.committed.push(*lease),
            Err(PgError::LeaseLost { .. }) => flushed.lost.push(*lease),
            Err(e) => return Err(e),
        }
    }
    tx.commit()
        .await
        .map_err(PgError::sql("committing a flush"))?;
    Ok(flushed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::buckets::acquire;
    use crate::store::postgres::test_db::{add_buckets, expire, with_job, worker};

    fn result(lease: Lease, id: &str, body: &str) -> ResultRow {
        ResultRow {
            lease,
            id: id.into(),
            bucket: lease.bucket,
            row: 0,
            status: ItemStatus::Ok,
            http_status: Some(200),
            body: Some(body.into()),
            record: r#"{"attempts":1}"#.into(),
        }
    }

    fn bucket_results(lease: Lease, body: &str) -> Vec<ResultRow> {
        (0..3)
            .map(|i| result(lease, &format!("b{}-{i}", lease.bucket), body))
            .collect()
    }

    fn tally(ok: u64) -> CommitRecord {
        CommitRecord {
            ok,
            ..CommitRecord::default()
        }
    }

    async fn item(client: &Client, job: JobId, id: &str) -> (String, Option<String>, i64) {
        let r = client
            .query_one(
                "SELECT status, body::text, lease_token FROM hw_item WHERE job_id = $1 AND id = $2",
                &[&job.0, &id],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    }

    #[tokio::test]
    async fn a_stale_owner_writes_nothing_and_its_commit_is_refused() {
        let (_db, mut client, job) = with_job().await;
        add_buckets(&client, job, 1).await;
        let a = worker(&client, job).await;
        let b = worker(&client, job).await;
        let old = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
        expire(&client, job, &a).await;
        let new = acquire(&client, job, &b, Log::Job, 1).await.unwrap()[0].lease;
        assert!(new.token > old.token);

        // A (paused past its TTL) wakes up and flushes its bucket: nothing counts.
        let stale = bucket_results(old, r#"{"from":"a"}"#);
        let err = {
            let tx = client.transaction().await.unwrap();
            let w = write_results(&tx, job, &a, Log::Job, &stale).await.unwrap();
            assert_eq!(
                w,
                Written {
                    written: 0,
                    fenced: 3
                }
            );
            let err = commit_bucket(&tx, job, &a, &old, &tally(3))
                .await
                .unwrap_err();
            tx.commit().await.unwrap();
            err
        };
        assert!(
            matches!(err, PgError::LeaseLost { bucket: 0, token, .. } if token == old.token),
            "{err:?}"
        );
        assert_eq!(
            item(&client, job, "b0-0").await,
            ("pending".into(), None, 0)
        );

        // The current owner's flush counts.
        let fresh = bucket_results(new, r#"{"from": "b"}"#);
        let flushed = flush(&mut client, job, &b, Log::Job, &fresh, &[(new, tally(3))])
            .await
            .unwrap();
        assert_eq!(
            flushed.results,
            Written {
                written: 3,
                fenced: 0
            }
        );
        assert_eq!(flushed.committed, vec![new]);
        assert!(flushed.lost.is_empty());
        // Stored byte for byte (json, not jsonb), under the new token.
        assert_eq!(
            item(&client, job, "b0-0").await,
            ("ok".into(), Some(r#"{"from": "b"}"#.into()), new.token)
        );
        let row = client
            .query_one(
                "SELECT state, ok, owner::text FROM hw_bucket WHERE job_id = $1 AND bucket = 0",
                &[&job.0],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "committed");
        assert_eq!(row.get::<_, Option<i64>>(1), Some(3));
        assert_eq!(row.get::<_, Option<String>>(2), Some(b.0.clone()));
        // And A, late again, still cannot touch it.
        let late = flush(&mut client, job, &a, Log::Job, &stale, &[(old, tally(3))])
            .await
            .unwrap();
        assert_eq!(late.results.written, 0);
        assert_eq!(late.lost, vec![old]);
    }

    #[tokio::test]
    async fn an_upsert_never_replaces_a_row_written_under_a_newer_token() {
        let (_db, client, job) = with_job().await;
        add_buckets(&client, job, 1).await;
        // Rerun 1's bucket 0 holds the job bucket's ID b0-0.
        client
            .execute(
                "INSERT INTO hw_bucket (job_id, rerun, bucket, offset_record, items)
                 VALUES ($1, 1, 0, '{}', 1)",
                &[&job.0],
            )
            .await
            .unwrap();
        let a = worker(&client, job).await;
        let b = worker(&client, job).await;
        let job_lease = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
        let rerun_lease = acquire(&client, job, &b, Log::Rerun(1), 1).await.unwrap()[0].lease;
        assert!(rerun_lease.token > job_lease.token);
        let mut newer = result(rerun_lease, "b0-0", r#""rerun""#);
        newer.bucket = 0;
        let w = write_results(&client, job, &b, Log::Rerun(1), &[newer])
            .await
            .unwrap();
        assert_eq!(w.written, 1);
        // A still holds the job bucket, but its token is older than the row's.
        let w = write_results(
            &client,
            job,
            &a,
            Log::Job,
            &[result(job_lease, "b0-0", r#""job""#)],
        )
        .await
        .unwrap();
        assert_eq!(
            w,
            Written {
                written: 0,
                fenced: 1
            }
        );
        assert_eq!(
            item(&client, job, "b0-0").await,
            ("ok".into(), Some(r#""rerun""#.into()), rerun_lease.token)
        );
    }

    #[tokio::test]
    async fn a_written_lease_cannot_be_taken_before_its_transaction_ends() {
        let (db, mut client, job) = with_job().await;
        add_buckets(&client, job, 1).await;
        let a = worker(&client, job).await;
        let other = db.connect().await;
        let b = worker(&other, job).await;
        let lease = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
        let tx = client.transaction().await.unwrap();
        let w = write_results(&tx, job, &a, Log::Job, &bucket_results(lease, "1"))
            .await
            .unwrap();
        assert_eq!(w.written, 3);
        // A's session expires while its flush is in progress: B cannot take the bucket from
        // under the flush (it is share-locked), so A's commit still holds.
        expire(&other, job, &a).await;
        assert!(acquire(&other, job, &b, Log::Job, 1)
            .await
            .unwrap()
            .is_empty());
        commit_bucket(&tx, job, &a, &lease, &tally(3))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert!(acquire(&other, job, &b, Log::Job, 1)
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn a_flush_loses_only_the_buckets_whose_lease_moved() {
        let (_db, mut client, job) = with_job().await;
        add_buckets(&client, job, 2).await;
        let a = worker(&client, job).await;
        let b = worker(&client, job).await;
        let held = acquire(&client, job, &a, Log::Job, 2).await.unwrap();
        let (l0, l1) = (held[0].lease, held[1].lease);
        expire(&client, job, &a).await;
        let taken = acquire(&client, job, &b, Log::Job, 1).await.unwrap();
        assert_eq!(taken[0].lease.bucket, 0);
        let mut rows = bucket_results(l0, "0");
        rows.extend(bucket_results(l1, "1"));
        let flushed = flush(
            &mut client,
            job,
            &a,
            Log::Job,
            &rows,
            &[(l0, tally(3)), (l1, tally(3))],
        )
        .await
        .unwrap();
        // Bucket 1 is still A's under its token (nobody took it): that counts.
        assert_eq!(
            flushed.results,
            Written {
                written: 3,
                fenced: 3
            }
        );
        assert_eq!(flushed.committed, vec![l1]);
        assert_eq!(flushed.lost, vec![l0]);
        assert_eq!(item(&client, job, "b0-1").await.0, "pending");
        assert_eq!(item(&client, job, "b1-1").await.0, "ok");
    }

    #[tokio::test]
    async fn a_token_from_an_earlier_lease_of_the_same_session_is_refused() {
        let (_db, mut client, job) = with_job().await;
        add_buckets(&client, job, 1).await;
        let a = worker(&client, job).await;
        let old = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
        crate::store::postgres::buckets::release(&client, job, &a, &[old])
            .await
            .unwrap();
        let new = acquire(&client, job, &a, Log::Job, 1).await.unwrap()[0].lease;
        assert!(new.token > old.token);
        // Same owner, older token: a flush left over from the first lease counts for nothing.
        let late = flush(
            &mut client,
            job,
            &a,
            Log::Job,
            &bucket_results(old, "1"),
            &[(old, tally(3))],
        )
        .await
        .unwrap();
        assert_eq!(
            late.results,
            Written {
                written: 0,
                fenced: 3
            }
        );
        assert_eq!(late.lost, vec![old]);
        let now = flush(
            &mut client,
            job,
            &a,
            Log::Job,
            &bucket_results(new, "2"),
            &[(new, tally(3))],
        )
        .await
        .unwrap();
        assert_eq!(now.committed, vec![new]);
    }
}
