//! The pages of paginated IDs (`hw_page`): written fenced by their bucket's lease, at once
//! and durably (one statement on the writer's connection, before any result recorded after
//! them is flushed), read back by ID, generation and number.
//!
//! A page is written only if, in the same statement, the bucket row of its lease still holds
//! the writer as owner under the lease's token (share-locked until the statement ends), as a
//! result is ([`super::results`]); the upsert never replaces a page written under a newer
//! token. A rerun's pages (generation `k`) are fenced by the lease of the rerun bucket their
//! ID is in.

use std::collections::HashMap;

use tokio_postgres::GenericClient;

use super::error::PgError;
use super::keys::{log_number, JobId, WorkerId};
use super::reruns;
use super::results::held_leases;
use super::rows::to_i64;
use super::state::Inner;
use super::typed::typed;
use crate::store::{Log, PageMark, PageRecord};

/// The fenced page write (one statement: check, share-lock, upsert).
const WRITE_PAGES: &str = concat!(
    held_leases!(),
    "
             incoming AS (
                 SELECT * FROM unnest($4::bigint[], $5::bigint[], $6::text[], $7::integer[],
                                      $8::integer[], $9::bigint[], $10::bigint[], $11::text[],
                                      $12::text[]) WITH ORDINALITY
                     AS u(lease_bucket, token, id, generation, page, bucket, item_row, mark,
                          items, ord))
             INSERT INTO hw_page AS p
                 (job_id, id, generation, page, bucket, \"row\", mark, items, lease_token)
             SELECT $1, u.id, u.generation, u.page, u.bucket, u.item_row, u.mark::jsonb,
                    u.items::json, u.token
             FROM incoming u JOIN held h ON h.bucket = u.lease_bucket AND h.lease_token = u.token
             ORDER BY u.ord
             ON CONFLICT (job_id, id, generation, page) DO UPDATE
                 SET bucket = EXCLUDED.bucket, \"row\" = EXCLUDED.\"row\", mark = EXCLUDED.mark,
                     items = EXCLUDED.items, lease_token = EXCLUDED.lease_token
                 WHERE p.lease_token <= EXCLUDED.lease_token"
);

/// One page as written: the lease bucket and token it is fenced by, its key and its columns.
struct PageRow<'a> {
    lease_bucket: i64,
    token: i64,
    id: &'a str,
    page: &'a PageRecord,
    mark: String,
}

impl Inner {
    /// Write `pages` fenced by their leases, durable on return; the pages of buckets whose
    /// lease this worker does not hold are dropped (counted, with a warning). Pages of one
    /// generation per statement (a generation is a log: the job's, or a rerun's).
    pub(super) async fn write_pages(&self, pages: &[(String, PageRecord)]) -> Result<(), PgError> {
        let mut conn = self.writer_connection().await?;
        let w = conn.as_mut().expect("connected by writer_connection()");
        let client = &w.client;
        let mut generations: Vec<u32> = pages.iter().map(|(_, p)| p.generation).collect();
        generations.sort_unstable();
        generations.dedup();
        let me = self.me();
        let mut dropped = 0;
        for generation in generations {
            let log = match generation {
                0 => Log::Job,
                k => Log::Rerun(k),
            };
            let of: Vec<&(String, PageRecord)> = pages
                .iter()
                .filter(|(_, p)| p.generation == generation)
                .collect();
            let rerun_buckets = match log {
                Log::Job => HashMap::new(),
                Log::Rerun(k) => {
                    let ids: Vec<&str> = of.iter().map(|(id, _)| id.as_str()).collect();
                    reruns::buckets_of(client, self.job, k, &ids).await?
                }
            };
            let rows = {
                let local = self.local();
                let mut rows = Vec::with_capacity(of.len());
                for (id, page) in of {
                    let bucket = match log {
                        Log::Job => Some(page.bucket),
                        Log::Rerun(_) => rerun_buckets.get(id).copied(),
                    };
                    let token = bucket.and_then(|b| {
                        local
                            .held
                            .get(&(log_number(log), b))
                            .copied()
                            .or(local.job_lease)
                    });
                    let (Some(bucket), Some(token)) = (bucket, token) else {
                        dropped += 1;
                        continue;
                    };
                    rows.push(PageRow {
                        lease_bucket: to_i64(bucket)?,
                        token,
                        id,
                        page,
                        mark: serde_json::to_string(&page.mark)
                            .map_err(|e| PgError::Malformed(e.to_string()))?,
                    });
                }
                rows
            };
            let sent = rows.len() as u64;
            let written = write_rows(client, self.job, &me, log, &rows).await?;
            dropped += sent - written;
        }
        if dropped > 0 {
            tracing::warn!(
                pages = dropped,
                "pages of buckets whose lease this worker does not hold were not written"
            );
            self.local().fenced += dropped;
        }
        Ok(())
    }
}

/// [`WRITE_PAGES`] for `rows` (one log's): the pages written. A later row for the same key
/// wins.
async fn write_rows(
    client: &impl GenericClient,
    job: JobId,
    me: &WorkerId,
    log: Log,
    rows: &[PageRow<'_>],
) -> Result<u64, PgError> {
    if rows.is_empty() {
        return Ok(0);
    }
    // ON CONFLICT DO UPDATE may touch a row once per statement: keep each key's last page.
    let mut last: HashMap<(&str, u32), usize> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        last.insert((r.id, r.page.mark.page), i);
    }
    let mut picked: Vec<usize> = last.into_values().collect();
    picked.sort_unstable();
    let mut columns = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for &i in &picked {
        let r = &rows[i];
        columns.0.push(r.lease_bucket);
        columns.1.push(r.token);
        columns.2.push(r.id);
        columns.3.push(r.page.generation as i32);
        columns.4.push(r.page.mark.page as i32);
        columns.5.push(to_i64(r.page.bucket)?);
        columns.6.push(to_i64(r.page.row)?);
        columns.7.push(r.mark.as_str());
        columns.8.push(r.page.items.get());
    }
    let written = client
        .execute_typed(
            WRITE_PAGES,
            &typed![
                job.0,
                me.0,
                log_number(log),
                columns.0,
                columns.1,
                columns.2,
                columns.3,
                columns.4,
                columns.5,
                columns.6,
                columns.7,
                columns.8
            ],
        )
        .await
        .map_err(PgError::sql("writing pages"))?;
    Ok(written)
}

/// The mark of each of `ids`' last page in `generation` (none for an ID without one).
pub(super) async fn marks(
    c: &impl GenericClient,
    job: JobId,
    generation: u32,
    ids: &[(u64, &str)],
) -> Result<Vec<Option<PageMark>>, PgError> {
    let wanted: Vec<&str> = ids.iter().map(|(_, id)| *id).collect();
    let rows = c
        .query_typed(
            "SELECT DISTINCT ON (id) id, mark FROM hw_page
                 WHERE job_id = $1 AND generation = $2 AND id = ANY($3)
                 ORDER BY id, page DESC",
            &typed![job.0, (generation as i32), wanted],
        )
        .await
        .map_err(PgError::sql("reading where pages stand"))?;
    let mut by_id: HashMap<String, PageMark> = HashMap::with_capacity(rows.len());
    for r in rows {
        let mark: PageMark = serde_json::from_value(r.get(1))
            .map_err(|e| PgError::Malformed(format!("a page's mark: {e}")))?;
        by_id.insert(r.get(0), mark);
    }
    Ok(ids.iter().map(|(_, id)| by_id.remove(*id)).collect())
}

/// Pages `from..from + count` of `id` in `generation`, in order; one missing is damage.
pub(super) async fn pages(
    c: &impl GenericClient,
    job: JobId,
    id: &str,
    generation: u32,
    from: u32,
    count: u32,
) -> Result<Vec<PageRecord>, PgError> {
    let rows = c
        .query_typed(
            "SELECT page, bucket, \"row\", mark, items::text FROM hw_page
                 WHERE job_id = $1 AND id = $2 AND generation = $3
                   AND page >= $4 AND page < $5::bigint
                 ORDER BY page",
            &typed![
                job.0,
                id,
                (generation as i32),
                (from as i32),
                (i64::from(from) + i64::from(count))
            ],
        )
        .await
        .map_err(PgError::sql("reading pages"))?;
    let mut out = Vec::with_capacity(rows.len());
    for (r, want) in rows.iter().zip(from..) {
        let page: i32 = r.get(0);
        if page as u32 != want {
            break;
        }
        let mark: PageMark = serde_json::from_value(r.get(3))
            .map_err(|e| PgError::Malformed(format!("a page's mark: {e}")))?;
        let items: String = r.get(4);
        out.push(PageRecord {
            row: r.get::<_, i64>(2) as u64,
            bucket: r.get::<_, i64>(1) as u64,
            generation,
            mark,
            items: serde_json::value::RawValue::from_string(items)
                .map_err(|e| PgError::Malformed(format!("a page's items: {e}")))?,
        });
    }
    if out.len() != count as usize {
        return Err(PgError::Malformed(format!(
            "page {} of {id:?} (generation {generation}) is missing",
            from + out.len() as u32
        )));
    }
    Ok(out)
}
