//! How `PgStore`'s rows read back as the store's records (and the job's spec is kept):
//! an item row as its `ItemRecord`, a bucket row's commit record, the spec as exact bytes,
//! a count as a bigint. No SQL of its own: the per-table modules use these.

use serde_json::value::RawValue;
use tokio_postgres::Row;

use super::error::PgError;
use crate::store::{CommitRecord, ItemRecord, ItemStatus, StoredJob};

pub(super) fn sql(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> PgError {
    PgError::sql(what)
}

pub(super) fn malformed(what: &str, e: impl std::fmt::Display) -> PgError {
    PgError::Malformed(format!("{what}: {e}"))
}

/// A count or number as PostgreSQL's bigint.
pub(super) fn to_i64(n: u64) -> Result<i64, PgError> {
    i64::try_from(n).map_err(|_| PgError::Malformed(format!("{n} does not fit a bigint")))
}

/// A stored item row (id, row, bucket, status, body text, record text, row values text) as
/// its record.
pub(super) fn item_record(row: &Row, at: usize) -> Result<(String, ItemRecord), PgError> {
    let id: String = row.get(at);
    let item_row = row.get::<_, i64>(at + 1) as u64;
    let bucket = row.get::<_, i64>(at + 2) as u64;
    let status: String = row.get(at + 3);
    let body: Option<String> = row.get(at + 4);
    let record: Option<String> = row.get(at + 5);
    let values: Option<String> = row.get(at + 6);
    let values = values.map(String::into_boxed_str);
    let Some(record) = record.filter(|_| status != "pending") else {
        let pending = ItemRecord::pending(item_row, bucket);
        return Ok((id, ItemRecord { values, ..pending }));
    };
    let mut r: ItemRecord =
        serde_json::from_str(&record).map_err(|e| malformed(&format!("the record of {id}"), e))?;
    let expected = match status.as_str() {
        "ok" => ItemStatus::Ok,
        _ => ItemStatus::Failed,
    };
    if r.status != expected {
        return Err(PgError::Malformed(format!(
            "the record of {id} says {:?}, its row {status}",
            r.status
        )));
    }
    r.body = body
        .map(RawValue::from_string)
        .transpose()
        .map_err(|e| malformed(&format!("the body of {id}"), e))?;
    r.values = values;
    Ok((id, r))
}

/// A bucket row's commit record, if committed (columns from `at`: bucket, committed, ok,
/// failed, failed_by_class, committed_at in ms, the offset record (not read here), usage
/// input, usage output).
pub(super) fn commit_record(row: &Row, at: usize) -> Result<Option<CommitRecord>, PgError> {
    if !row.get::<_, bool>(at + 1) {
        return Ok(None);
    }
    let by_class: Option<serde_json::Value> = row.get(at + 4);
    Ok(Some(CommitRecord {
        bucket: row.get::<_, i64>(at) as u64,
        ok: row.get::<_, Option<i64>>(at + 2).unwrap_or(0) as u64,
        failed: row.get::<_, Option<i64>>(at + 3).unwrap_or(0) as u64,
        committed_at_ms: row.get::<_, Option<f64>>(at + 5).unwrap_or(0.0).round() as u64,
        failed_by_class: match by_class {
            Some(v) => serde_json::from_value(v).map_err(|e| malformed("a commit's classes", e))?,
            None => Default::default(),
        },
        usage: crate::meter::Usage {
            input: row.get::<_, i64>(at + 7).max(0) as u64,
            output: row.get::<_, i64>(at + 8).max(0) as u64,
        },
    }))
}

pub(super) const BUCKET_COLUMNS: &str = "bucket, state = 'committed', ok, failed, failed_by_class,
    (extract(epoch FROM committed_at) * 1000)::float8, offset_record, usage_input, usage_output";

/// The job's spec as stored: exact bytes, as a JSON string when they are UTF-8 (readable
/// in SQL), else hex.
pub(super) fn spec_json(job: &StoredJob) -> serde_json::Value {
    match std::str::from_utf8(&job.spec) {
        // jsonb holds no NUL character.
        Ok(text) if !text.contains('\0') => {
            serde_json::json!({"id": job.id, "version": job.version, "text": text})
        }
        _ => {
            let hex: String = job.spec.iter().map(|b| format!("{b:02x}")).collect();
            serde_json::json!({"id": job.id, "version": job.version, "hex": hex})
        }
    }
}

pub(super) fn spec_from_json(v: &serde_json::Value) -> Result<Option<StoredJob>, PgError> {
    if v.is_null() {
        return Ok(None);
    }
    let bad = || PgError::Malformed("the job's stored spec".into());
    let id = v["id"].as_str().ok_or_else(bad)?.to_string();
    let version = u32::try_from(v["version"].as_u64().ok_or_else(bad)?).map_err(|_| bad())?;
    let spec = if let Some(text) = v["text"].as_str() {
        text.as_bytes().to_vec()
    } else {
        let hex = v["hex"].as_str().ok_or_else(bad)?;
        (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(bad)?
    };
    Ok(Some(StoredJob { id, version, spec }))
}
