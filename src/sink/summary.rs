//! What `status` says about a job's failures ([`FailureSummary`]): the buckets committed
//! with failures and the failed IDs by error class.

use serde::Serialize;

use crate::store::{BucketState, CommitRecord, ExportError, JobView, Store};

/// How many buckets with failures the human `status` names (`--json` has more).
const HUMAN_BUCKETS_SHOWN: usize = 20;

/// What `status` says about failures: the buckets committed with failures (the first
/// `cap`, with the total) and the failed IDs by error class.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FailureSummary {
    /// The first buckets committed with failures, in order.
    pub buckets: Vec<u64>,
    /// Buckets committed with failures, all of them.
    pub buckets_total: u64,
    /// Failed IDs by error class name.
    pub by_class: std::collections::BTreeMap<String, u64>,
}

impl FailureSummary {
    /// Read from the commit records (and the items of buckets they do not cover).
    pub async fn of(store: &impl Store, cap: usize) -> Result<FailureSummary, ExportError> {
        let failed = store.failed_buckets().await?;
        let open: Vec<u64> = store
            .open_buckets()
            .await?
            .iter()
            .map(|o| o.bucket)
            .collect();
        FailureSummary::counted(store, &failed, open, cap).await
    }

    /// [`FailureSummary::of`] every bucket `all` lists (the whole job's, in order), without
    /// reading the list again.
    pub async fn of_buckets(
        store: &impl Store,
        all: &[BucketState],
        cap: usize,
    ) -> Result<FailureSummary, ExportError> {
        let failed: Vec<CommitRecord> = all
            .iter()
            .filter_map(|b| b.commit.clone())
            .filter(|c| c.failed > 0)
            .collect();
        let open = all
            .iter()
            .filter(|b| b.commit.is_none())
            .map(|b| b.offset.bucket)
            .collect();
        FailureSummary::counted(store, &failed, open, cap).await
    }

    /// The summary of the buckets committed with failures (`failed`) and the buckets not
    /// committed yet (`open`).
    async fn counted(
        store: &impl Store,
        failed: &[CommitRecord],
        mut scan: Vec<u64>,
        cap: usize,
    ) -> Result<FailureSummary, ExportError> {
        let mut s = FailureSummary {
            buckets: failed.iter().take(cap).map(|c| c.bucket).collect(),
            buckets_total: failed.len() as u64,
            by_class: Default::default(),
        };
        // Commit records count their failures by class; only buckets committed before they
        // did, and buckets not committed yet, are counted from their items.
        for c in failed {
            if c.classes_complete() {
                for (class, n) in &c.failed_by_class {
                    *s.by_class.entry(class.clone()).or_default() += n;
                }
            } else {
                scan.push(c.bucket);
            }
        }
        for bucket in scan {
            store
                .for_each_failure(Some(bucket), &mut |_, r| {
                    *s.by_class.entry(crate::store::class_name(r)).or_default() += 1;
                    Ok(())
                })
                .await?;
        }
        Ok(s)
    }

    /// Human lines for `status`.
    pub fn render(&self) -> String {
        if self.buckets_total == 0 {
            return String::new();
        }
        let list: Vec<String> = self
            .buckets
            .iter()
            .take(HUMAN_BUCKETS_SHOWN)
            .map(u64::to_string)
            .collect();
        let more = self.buckets_total - list.len() as u64;
        let classes: Vec<String> = self
            .by_class
            .iter()
            .map(|(c, n)| format!("{c} {n}"))
            .collect();
        format!(
            "committed with failures: {} bucket(s): {}{}\nfailed by class: {}\n",
            self.buckets_total,
            list.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            classes.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ItemRecord, ItemStatus};

    #[test]
    fn the_failure_summary_names_a_few_buckets_and_counts_the_rest() {
        let s = FailureSummary {
            buckets: (0..100).collect(),
            buckets_total: 250,
            by_class: [("http".to_string(), 7), ("timeout".to_string(), 2)].into(),
        };
        let text = s.render();
        assert!(text.contains("250 bucket(s): 0, 1,"), "{text}");
        assert!(text.contains("19 and 230 more"), "{text}");
        assert!(text.contains("http 7, timeout 2"), "{text}");
        assert_eq!(FailureSummary::default().render(), "");
    }

    #[tokio::test]
    async fn classes_come_from_commit_records_or_from_the_items_of_older_ones() {
        use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};
        use crate::store::{
            Commit, CommitRecord, LeaseScope, Leases, OffsetRecord, PlannedBucket, PlannerState,
        };
        let dir = tempfile::tempdir().unwrap();
        let s =
            SledStore::open(dir.path(), OpenMode::CreateIfMissing, DEFAULT_CACHE_BYTES).unwrap();
        let row = |row| crate::input::Cursor {
            row,
            ..Default::default()
        };
        let offset = |bucket| OffsetRecord {
            bucket,
            start: row(bucket),
            end: row(bucket + 1),
            items: 1,
            duplicates: 0,
            bad_lines: 0,
            input: crate::input::Fingerprint { len: 1, xxh3: 1 },
            planned_at_ms: 0,
        };
        let planned = |bucket: u64, id: &str| PlannedBucket {
            offset: offset(bucket),
            items: vec![(bucket, id.to_string())],
            bad_lines: vec![],
            values: Vec::new(),
        };
        s.plan(
            &[planned(0, "a"), planned(1, "b")],
            &PlannerState::default(),
        )
        .await
        .unwrap();
        let failed = |bucket| {
            let mut r = ItemRecord::pending(bucket, bucket);
            r.status = ItemStatus::Failed;
            r.class = Some(crate::failure::ErrorClass::Http);
            r
        };
        s.record(&[("a".into(), failed(0)), ("b".into(), failed(1))])
            .await
            .unwrap();
        let lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
        let commits = [
            // Written before commit records counted classes: counted from the items.
            CommitRecord {
                bucket: 0,
                failed: 1,
                ..CommitRecord::default()
            },
            // Complete: taken as it is (the class differs on purpose, to tell them apart).
            CommitRecord {
                bucket: 1,
                failed: 1,
                failed_by_class: [("timeout".to_string(), 1)].into(),
                ..CommitRecord::default()
            },
        ];
        s.commit(&lease, Commit::Job(&commits)).await.unwrap();
        let summary = FailureSummary::of(&s, 10).await.unwrap();
        assert_eq!(summary.buckets, vec![0, 1]);
        assert_eq!(
            summary.by_class,
            [("http".to_string(), 1), ("timeout".to_string(), 1)].into()
        );
    }
}
