//! Reruns: calling chosen IDs of a job's committed buckets again, crash-safely.
//!
//! Owns what a rerun selects ([`RerunAsk`] → [`RerunSelection`]) and how it is written
//! ahead ([`choose`], then [`start`]): the selected IDs, in input order, are cut into rerun buckets of the
//! job's bucket size and stored with the rerun before any of them is called, so the
//! selection is fixed at creation and a resume (the same command after a kill -9) replays
//! exactly the same IDs, skipping those whose new result is already durable. The engine
//! runs a rerun with the same dispatcher and writer as a job (`engine::run_log`).
//!
//! Never rerun what is not asked: every failed ID and the failed IDs of some buckets select
//! only IDs whose record is failed; only all the IDs of some buckets (explicit) and a file of
//! IDs (an explicit list) select IDs that
//! succeeded.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::PathBuf;

use crate::failure::ErrorClass;
use crate::input::Fingerprint;
use crate::spec::JobSpec;
use crate::store::now_ms;
use crate::store::{
    class_label, ExportError, ItemRecord, ItemStatus, JobBucketShare, JobView, RerunBucket,
    RerunOffset, RerunRecord, RerunSelection, Store, StoreError,
};

/// What a rerun is asked to call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RerunAsk {
    /// Every failed ID.
    Failed,
    /// The failed IDs of these buckets, or all of their IDs.
    Buckets {
        /// Job bucket numbers, in any order, repeats allowed.
        buckets: Vec<u64>,
        /// Call every ID of them, not only the failed ones.
        all_items: bool,
    },
    /// The IDs listed in a file, one per line.
    Ids(PathBuf),
}

/// Errors while preparing a rerun.
#[derive(Debug, thiserror::Error)]
pub enum RerunError {
    /// The command asks for something that cannot be (a wrong bucket number and the like).
    #[error("{0}")]
    Usage(String),
    /// A line of the file of IDs names an ID the job has no final result for.
    #[error("{file}:{line}: {id:?} is not an ID of this job (no bucket of the job holds it); nothing was called")]
    UnknownId {
        /// The file of IDs.
        file: PathBuf,
        /// The line, from 1.
        line: u64,
        /// The ID as read (trimmed).
        id: String,
    },
    /// A line of the file of IDs cannot be read as an ID.
    #[error("{file}:{line}: {reason}")]
    IdsFile {
        /// The file of IDs.
        file: PathBuf,
        /// The line, from 1.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A bucket number the job does not have.
    #[error("the job has no bucket {bucket} (its buckets are 0 to {})", .planned.saturating_sub(1))]
    NoBucket {
        /// The number asked for.
        bucket: u64,
        /// Buckets the job has.
        planned: u64,
    },
    /// The last rerun, of another selection, is not finished.
    #[error("rerun {number} is not finished; finish it first")]
    Unfinished {
        /// The unfinished rerun's number.
        number: u32,
        /// What it selected.
        selection: RerunSelection,
    },
    /// The job's own run has buckets not committed (their count); a rerun waits for it.
    #[error("the job has {0} bucket(s) not committed yet; finish its run first, then rerun")]
    JobInFlight(u64),
    /// The file of IDs could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file of IDs.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file of IDs could not be fingerprinted.
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ExportError> for RerunError {
    fn from(e: ExportError) -> Self {
        match e {
            ExportError::Store(e) => RerunError::Store(e),
            ExportError::Write(e) => RerunError::Usage(format!("reading the store: {e}")),
            ExportError::Columns(e) => RerunError::Usage(e),
        }
    }
}

/// The rerun to run: a new one, or the unfinished one asked for again.
#[derive(Debug, Clone)]
pub enum Prepared {
    /// The selection is empty; nothing to call.
    Nothing(RerunSelection),
    /// Run this rerun (`resumed`: it existed, unfinished).
    Ready {
        /// The rerun, as stored.
        rerun: RerunRecord,
        /// It existed, unfinished.
        resumed: bool,
    },
}

/// The unfinished rerun, if any (only the last one can be).
pub async fn unfinished<S: Store>(store: &S) -> Result<Option<RerunRecord>, StoreError> {
    let Some(last) = store.reruns().await?.pop() else {
        return Ok(None);
    };
    Ok((!store.rerun_stats(last.number).await?.finished()).then_some(last))
}

/// What a rerun command will do, decided before anything is written.
#[derive(Debug)]
pub enum Chosen {
    /// The unfinished rerun asked for again.
    Resume(RerunRecord),
    /// The selection is empty; nothing to call.
    Nothing(RerunSelection),
    /// A new rerun of these IDs (in input order).
    New {
        /// The selection as stored (buckets sorted and deduplicated, a file canonicalized).
        selection: RerunSelection,
        /// The IDs it selects, in input order, each once.
        selected: Vec<Selected>,
    },
}

/// One selected ID and what its rerun bucket records of it: not its whole record (error text,
/// attempt history), which for a rerun of a million failures held 380 MB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The ID, as the store keys it.
    pub id: String,
    /// The 0-based input row of its first occurrence.
    pub row: u64,
    /// Its job bucket.
    pub bucket: u64,
    /// Its status before the rerun (final).
    pub status: ItemStatus,
    /// Its error class before the rerun; none unless failed.
    pub class: Option<ErrorClass>,
    /// Its input row's kept columns (a JSON object), when the job keeps any.
    pub values: Option<Box<str>>,
    /// What its calls cost before the rerun.
    pub usage: Option<crate::meter::Usage>,
}

impl Selected {
    fn of(id: &str, record: &ItemRecord) -> Selected {
        Selected {
            id: id.to_owned(),
            row: record.row,
            bucket: record.bucket,
            status: record.status,
            class: record.class,
            values: record.values.clone(),
            usage: record.usage,
        }
    }
}

/// Decide what `ask` means for this store, reading only: resume the unfinished rerun if
/// `ask` is the same, or select the IDs of a new one. Every refusal (an unfinished rerun of
/// another selection, buckets in flight, an unknown bucket or ID) comes before the command
/// writes anything, a spec change included; [`start`] then carries it out.
pub async fn choose<S: Store>(store: &S, ask: &RerunAsk) -> Result<Chosen, RerunError> {
    // An unfinished rerun of a file of IDs resumes from its stored IDs: the file is not needed any
    // more, and a file edited, moved or deleted since must not leave the rerun stuck.
    if let (RerunAsk::Ids(file), Some(open)) = (ask, unfinished(store).await?) {
        if let RerunSelection::Ids {
            file: stored,
            fingerprint,
        } = &open.selection
        {
            let same = match std::fs::canonicalize(file) {
                Ok(path) => &path == stored,
                Err(_) => std::path::absolute(file).is_ok_and(|path| &path == stored),
            };
            if same {
                if Fingerprint::of_file(stored).ok().as_ref() != Some(fingerprint) {
                    tracing::warn!(
                        file = %stored.display(),
                        "the file of IDs changed since rerun {} was created; it resumes with the IDs stored then",
                        open.number
                    );
                }
                return Ok(Chosen::Resume(open));
            }
        }
    }
    let selection = match ask {
        RerunAsk::Failed => RerunSelection::Failed,
        RerunAsk::Buckets { buckets, all_items } => {
            let mut buckets = buckets.clone();
            buckets.sort_unstable();
            buckets.dedup();
            RerunSelection::Buckets {
                buckets,
                all_items: *all_items,
            }
        }
        RerunAsk::Ids(file) => {
            let file = std::fs::canonicalize(file).map_err(|source| RerunError::Io {
                path: file.clone(),
                source,
            })?;
            let fingerprint = Fingerprint::of_file(&file)?;
            RerunSelection::Ids { file, fingerprint }
        }
    };
    if let Some(open) = unfinished(store).await? {
        if open.selection == selection {
            return Ok(Chosen::Resume(open));
        }
        return Err(RerunError::Unfinished {
            number: open.number,
            selection: open.selection,
        });
    }
    let in_flight = store.stats().await?.buckets_in_flight;
    if in_flight > 0 {
        return Err(RerunError::JobInFlight(in_flight));
    }
    let selected = select(store, &selection).await?;
    if selected.is_empty() {
        return Ok(Chosen::Nothing(selection));
    }
    Ok(Chosen::New {
        selection,
        selected,
    })
}

/// Carry out what [`choose`] decided: a new rerun is written with all its buckets and made
/// durable before this returns.
pub async fn start<S: Store>(
    store: &S,
    spec: &JobSpec,
    chosen: Chosen,
) -> Result<Prepared, RerunError> {
    let (selection, selected) = match chosen {
        Chosen::Resume(rerun) => {
            return Ok(Prepared::Ready {
                rerun,
                resumed: true,
            })
        }
        Chosen::Nothing(why) => return Ok(Prepared::Nothing(why)),
        Chosen::New {
            selection,
            selected,
        } => (selection, selected),
    };
    let number = store.reruns().await?.last().map_or(1, |r| r.number + 1);
    let ids = selected.len() as u64;
    let buckets = cut(number, selected, spec.bucket_size);
    let rerun = RerunRecord {
        number,
        selection,
        buckets: buckets.len() as u64,
        ids,
        created_at_ms: now_ms(),
    };
    store.create_rerun(&rerun, &buckets).await?;
    store.sync().await?;
    Ok(Prepared::Ready {
        rerun,
        resumed: false,
    })
}

/// The selected IDs, in input order.
async fn select<S: Store>(
    store: &S,
    selection: &RerunSelection,
) -> Result<Vec<Selected>, RerunError> {
    let mut out = Vec::new();
    match selection {
        RerunSelection::Failed => {
            store
                .for_each_failure(None, &mut |id, r| {
                    out.push(Selected::of(id, r));
                    Ok(())
                })
                .await?
        }
        RerunSelection::Buckets { buckets, all_items } => {
            let planned = store.stats().await?.buckets_planned;
            for &b in buckets {
                let Some(offset) = store.offset(b).await? else {
                    return Err(RerunError::NoBucket { bucket: b, planned });
                };
                if *all_items {
                    out.extend(
                        store
                            .bucket_items(&offset)
                            .await?
                            .iter()
                            .map(|(id, r)| Selected::of(id, r)),
                    );
                } else {
                    store
                        .for_each_failure(Some(b), &mut |id, r| {
                            out.push(Selected::of(id, r));
                            Ok(())
                        })
                        .await?;
                }
            }
        }
        RerunSelection::Ids { file, .. } => {
            let io = |source| RerunError::Io {
                path: file.clone(),
                source,
            };
            let reader = std::io::BufReader::new(std::fs::File::open(file).map_err(io)?);
            for (n, line) in reader.split(b'\n').enumerate() {
                let line_no = n as u64 + 1;
                let line = line.map_err(io)?;
                let text = std::str::from_utf8(&line).map_err(|_| RerunError::IdsFile {
                    file: file.clone(),
                    line: line_no,
                    reason: "the line is not UTF-8".into(),
                })?;
                let id = text.trim();
                // A repeated line is dropped with the other duplicates below.
                if id.is_empty() {
                    continue;
                }
                match store.item(id).await? {
                    Some(r) if r.is_final() => out.push(Selected::of(id, &r)),
                    _ => {
                        return Err(RerunError::UnknownId {
                            file: file.clone(),
                            line: line_no,
                            id: id.to_owned(),
                        })
                    }
                }
            }
            with_values(store, &mut out).await?;
        }
    }
    // Input order; an ID is never selected twice (an ID has one row: its first occurrence).
    out.sort_by_key(|s| s.row);
    out.dedup_by_key(|s| s.row);
    Ok(out)
}

/// A record read by its ID comes without its input row's kept columns, which the plan keeps
/// with the bucket's IDs: read each selected bucket's items once for them.
async fn with_values<S: Store>(store: &S, selected: &mut [Selected]) -> Result<(), RerunError> {
    selected.sort_by_key(|s| (s.bucket, s.row));
    for same in selected.chunk_by_mut(|a, b| a.bucket == b.bucket) {
        let Some(offset) = store.offset(same[0].bucket).await? else {
            continue;
        };
        let items = store.bucket_items(&offset).await?;
        if items.iter().all(|(_, r)| r.values.is_none()) {
            continue;
        }
        let values: HashMap<String, Option<Box<str>>> =
            items.into_iter().map(|(id, r)| (id, r.values)).collect();
        for s in same {
            s.values = values.get(&s.id).cloned().flatten();
        }
    }
    Ok(())
}

/// Cut the selection into rerun buckets of `bucket_size` IDs, in order.
fn cut(number: u32, selected: Vec<Selected>, bucket_size: u64) -> Vec<RerunBucket> {
    let planned_at_ms = now_ms();
    let size = bucket_size.max(1) as usize;
    let mut buckets = Vec::with_capacity(selected.len().div_ceil(size));
    let mut selected = selected.into_iter().peekable();
    while selected.peek().is_some() {
        let mut before: BTreeMap<u64, JobBucketShare> = BTreeMap::new();
        let mut items = Vec::with_capacity(size);
        let mut values = Vec::new();
        for s in selected.by_ref().take(size) {
            let share = before.entry(s.bucket).or_insert_with(|| JobBucketShare {
                bucket: s.bucket,
                ..JobBucketShare::default()
            });
            match s.status {
                ItemStatus::Ok => share.ok += 1,
                ItemStatus::Failed => {
                    share.failed += 1;
                    *share
                        .failed_by_class
                        .entry(class_label(s.class))
                        .or_default() += 1;
                }
                ItemStatus::Pending => {}
            }
            share.usage.add(s.usage.unwrap_or_default());
            items.push((s.row, s.id));
            values.extend(s.values.map(String::from));
        }
        buckets.push(RerunBucket {
            offset: RerunOffset {
                rerun: number,
                bucket: buckets.len() as u64,
                items: items.len() as u64,
                before: before.into_values().collect(),
                planned_at_ms,
            },
            items,
            values,
        });
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(row: u64, bucket: u64, ok: bool) -> (String, ItemRecord) {
        let mut r = ItemRecord::pending(row, bucket);
        r.status = if ok {
            ItemStatus::Ok
        } else {
            ItemStatus::Failed
        };
        (format!("id-{row}"), r)
    }

    #[test]
    fn cut_is_in_order_and_counts_shares_per_job_bucket() {
        let sel = [
            rec(0, 0, false),
            rec(3, 0, true),
            rec(5, 1, false),
            rec(9, 2, false),
            rec(11, 2, false),
        ];
        let sel = sel.iter().map(|(id, r)| Selected::of(id, r)).collect();
        let buckets = cut(4, sel, 2);
        assert_eq!(buckets.len(), 3);
        assert_eq!(
            buckets[0].items,
            vec![(0, "id-0".into()), (3, "id-3".into())]
        );
        assert_eq!(
            buckets[0].offset.before,
            vec![JobBucketShare {
                bucket: 0,
                ok: 1,
                failed: 1,
                failed_by_class: [("unknown".to_string(), 1)].into(),
                usage: Default::default(),
            }]
        );
        assert_eq!(buckets[1].offset.before.len(), 2);
        assert_eq!(buckets[2].offset.items, 1);
        assert!(buckets.iter().all(|b| b.offset.rerun == 4));
        assert_eq!(
            buckets.iter().map(|b| b.offset.bucket).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn continue_from_keeps_the_history() {
        let (_, mut prior) = rec(1, 0, false);
        prior.attempts = 3;
        prior.first_attempt_ms = Some(100);
        prior.attempt_errors = vec![crate::failure::AttemptNote {
            class: crate::failure::ErrorClass::Http,
            http_status: Some(503),
            free: false,
        }];
        let (_, mut now) = rec(1, 0, true);
        now.attempts = 1;
        now.first_attempt_ms = Some(900);
        now.last_attempt_ms = Some(900);
        now.continue_from(&prior);
        assert_eq!(now.attempts, 4);
        assert_eq!(now.first_attempt_ms, Some(100));
        assert_eq!(now.last_attempt_ms, Some(900));
        assert_eq!(now.attempt_errors.len(), 1);
    }
}
