//! [`open_at`]: the one way to create or resume a job wherever it is kept, a state
//! directory ([`StateDirPlace`]) or a job of a PostgreSQL database (`PgPlace`).
//!
//! A [`JobPlace`] opens its store, creating it when the request brings an input, and says
//! whether this open made it. [`open_at`] then creates the job with its checks (once, in
//! [`super::open_job`]), resumes it, or (where the place is shared) joins it as one more worker; a
//! creation refused by any check is undone by the place ([`JobPlace::discard`]), so a
//! refused creation leaves the directory, or the database, as it was. The command line
//! only says the result in its own words, with flags and exit codes.

use std::future::Future;
use std::path::{Path, PathBuf};

use super::checks::check_request;
use super::error::JobError;
use super::open::{join_job, open_checked};
use super::request::JobRequest;
use crate::spec::JobSpec;
use crate::store::sled_store::{OpenMode, SledStore};
use crate::store::{Leases, Store, StoreError};

/// Where a job is kept: see the module's documentation.
pub trait JobPlace: Send + Sync {
    /// The store a job kept here is opened as.
    type Store: Store + Leases;
    /// What an open made, for [`JobPlace::discard`] to undo.
    type Made: Send;

    /// Open the store, creating it when `create` and it is missing; with it, what this open
    /// made, if it made it (nothing was there before).
    fn open(
        &self,
        create: bool,
    ) -> impl Future<Output = Result<(Self::Store, Option<Self::Made>), StoreError>> + Send;

    /// Undo the open that made `store`: the place is left as it was before.
    fn discard(
        &self,
        store: Self::Store,
        made: Self::Made,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Close `store` when its job was refused: a database's worker session ends at once
    /// instead of expiring. Dropping it is enough by default.
    fn close(&self, store: Self::Store) -> impl Future<Output = ()> + Send {
        drop(store);
        async {}
    }

    /// Whether a process without the job's input joins it as one more worker instead of
    /// resuming it (a job several workers share; a joining worker does not read the input).
    fn joinable(&self) -> bool {
        false
    }
}

/// Create the job `request` describes at `place`, or resume (or join) the one it holds.
///
/// A new job is checked once, before it is stored (its flags, templates, answer checks,
/// input and environment); whatever refuses it, the place is left as it was. A resume is
/// judged against the stored job ([`super::open_job`]). With no input, a place that holds no job
/// is [`JobError::NoJob`], and a store that is not there is the store's error.
pub async fn open_at<P: JobPlace>(
    place: &P,
    request: &JobRequest,
) -> Result<(P::Store, JobSpec), JobError> {
    check_request(request)?;
    let (store, made) = place.open(request.input.is_some()).await?;
    let opened = if made.is_none() && request.input.is_none() && place.joinable() {
        join_job(&store, request)
            .await
            .and_then(|spec| spec.ok_or(JobError::NoJob))
    } else {
        open_checked(&store, request, true).await
    };
    match (opened, made) {
        (Ok(spec), _) => Ok((store, spec)),
        (Err(e), None) => {
            place.close(store).await;
            Err(e)
        }
        (Err(e), Some(made)) => {
            if let Err(undo) = place.discard(store, made).await {
                tracing::warn!("cannot remove what the refused creation made: {undo}");
            }
            Err(e)
        }
    }
}

/// A state directory (the sled store), as the command line opens it.
#[derive(Debug, Clone)]
pub struct StateDirPlace {
    /// The directory.
    pub dir: PathBuf,
    /// The store's cache, in bytes.
    pub cache_bytes: u64,
    /// Reopen the store after this many bytes written (see [`SledStore::set_reopen_after`]);
    /// 0 never.
    pub reopen_after: u64,
}

/// What opening a state directory made.
#[derive(Debug)]
pub enum MadeDir {
    /// This directory, the outermost of the state directory and its parents that was missing.
    Created(PathBuf),
    /// The state directory's entries: it was there, empty.
    Filled,
}

impl JobPlace for StateDirPlace {
    type Store = SledStore;
    type Made = MadeDir;

    async fn open(&self, create: bool) -> Result<(SledStore, Option<MadeDir>), StoreError> {
        let missing = self
            .dir
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .last()
            .map(Path::to_path_buf);
        let empty = std::fs::read_dir(&self.dir).is_ok_and(|mut d| d.next().is_none());
        let mode = if create {
            OpenMode::CreateIfMissing
        } else {
            OpenMode::Existing
        };
        let store = SledStore::open(&self.dir, mode, self.cache_bytes)?;
        store.set_reopen_after(self.reopen_after);
        let made = match (create, missing) {
            (false, _) => None,
            (true, Some(dir)) => Some(MadeDir::Created(dir)),
            (true, None) => empty.then_some(MadeDir::Filled),
        };
        Ok((store, made))
    }

    async fn discard(&self, store: SledStore, made: MadeDir) -> Result<(), StoreError> {
        // Closed first: its files are removed below.
        drop(store);
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |e: std::io::Error| StoreError::at(path.display(), e.into())
        };
        match made {
            MadeDir::Created(dir) => std::fs::remove_dir_all(&dir).map_err(at(&dir)),
            MadeDir::Filled => {
                for entry in std::fs::read_dir(&self.dir).map_err(at(&self.dir))? {
                    let path = entry.map_err(at(&self.dir))?.path();
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path).map_err(at(&path))?;
                    } else {
                        std::fs::remove_file(&path).map_err(at(&path))?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// A job of a PostgreSQL database, as the command line opens it: a worker's session.
#[cfg(feature = "postgres")]
#[derive(Clone)]
pub struct PgPlace {
    /// The database.
    pub target: crate::store::postgres::PgTarget,
    /// The job's name and how its session is opened (`create` is set by [`open_at`]).
    pub open: crate::store::postgres::PgOpen,
}

#[cfg(feature = "postgres")]
impl JobPlace for PgPlace {
    type Store = crate::store::postgres::PgStore;
    type Made = ();

    async fn open(
        &self,
        create: bool,
    ) -> Result<(crate::store::postgres::PgStore, Option<()>), StoreError> {
        let open = crate::store::postgres::PgOpen {
            create,
            ..self.open.clone()
        };
        let store = crate::store::postgres::PgStore::open(&self.target, &open).await?;
        let made = store.created_job().then_some(());
        Ok((store, made))
    }

    async fn discard(
        &self,
        store: crate::store::postgres::PgStore,
        (): (),
    ) -> Result<(), StoreError> {
        store.discard_created_job().await
    }

    async fn close(&self, store: crate::store::postgres::PgStore) {
        if let Err(e) = store.close().await {
            tracing::warn!("cannot end the worker's session (it expires by itself): {e}");
        }
    }

    fn joinable(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{InputFormat, InputSpec};

    /// New jobs refused, each by a different check: the flags, the input, the answer
    /// checks, the environment, the work to do.
    fn refused(dir: &Path) -> Vec<(&'static str, JobRequest)> {
        let ids = dir.join("ids.txt");
        std::fs::write(&ids, "a\nb\n").unwrap();
        let empty = dir.join("empty.txt");
        std::fs::write(&empty, "").unwrap();
        let job = |input: &Path| JobRequest {
            input: Some(InputSpec {
                path: input.to_path_buf(),
                format: InputFormat::Text,
            }),
            url: Some("http://127.0.0.1:9/{id}".into()),
            ..JobRequest::default()
        };
        let mut no_work = job(&ids);
        no_work.url = None;
        let mut unset = job(&ids);
        unset.url = Some("http://127.0.0.1:9/{id}?k=${HW_PLACE_TEST_NEVER_SET}".into());
        let mut check = job(&ids);
        check.answer.fail_if = Some(".[".into());
        let mut zero = job(&ids);
        zero.bucket_size = Some(0);
        vec![
            ("no work for each ID", no_work),
            ("a variable missing from the environment", unset),
            ("an answer check that does not parse", check),
            ("a bucket size of 0", zero),
            ("a missing input", job(&dir.join("missing.txt"))),
            ("an empty input", job(&empty)),
        ]
    }

    /// A request that resumes a job created from `good` and changes its URL.
    fn changed(mut good: JobRequest) -> JobRequest {
        good.url = Some("http://127.0.0.1:9/other/{id}".into());
        good
    }

    fn good(dir: &Path) -> JobRequest {
        let ids = dir.join("good.txt");
        std::fs::write(&ids, "a\nb\n").unwrap();
        JobRequest {
            input: Some(InputSpec {
                path: ids,
                format: InputFormat::Text,
            }),
            url: Some("http://127.0.0.1:9/{id}".into()),
            ..JobRequest::default()
        }
    }

    fn dir_place(dir: PathBuf) -> StateDirPlace {
        StateDirPlace {
            dir,
            cache_bytes: 1 << 20,
            reopen_after: 0,
        }
    }

    #[tokio::test]
    async fn a_refused_creation_leaves_a_directory_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        for (why, request) in refused(tmp.path()) {
            // Missing, with missing parents: none of them is left.
            let nested = dir_place(tmp.path().join("a/b/state"));
            let err = open_at(&nested, &request).await.err();
            assert!(err.is_some(), "{why}: refused");
            assert!(!tmp.path().join("a").exists(), "{why}: nothing left");
            // There, empty: left empty.
            let empty = tmp.path().join("empty-state");
            std::fs::create_dir_all(&empty).unwrap();
            assert!(open_at(&dir_place(empty.clone()), &request).await.is_err());
            assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "{why}");
        }
        // A job created, then a resume refused: the job is kept as it was.
        let place = dir_place(tmp.path().join("state"));
        let (store, spec) = open_at(&place, &good(tmp.path())).await.unwrap();
        drop(store);
        let err = open_at(&place, &changed(good(tmp.path()))).await.err();
        assert!(matches!(err, Some(JobError::MeaningChanged(_))), "{err:?}");
        let (store, again) = open_at(&place, &JobRequest::default()).await.unwrap();
        assert_eq!(again, spec);
        drop(store);
        // Without an input, a place with nothing there is the store's error, and stays so.
        let none = dir_place(tmp.path().join("none"));
        let err = open_at(&none, &JobRequest::default()).await.err();
        assert!(matches!(err, Some(JobError::Store(_))), "{err:?}");
        assert!(!tmp.path().join("none").exists());
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn a_refused_creation_leaves_a_database_as_it_was() {
        use crate::store::postgres::{test_db, PgOpen};
        let tmp = tempfile::tempdir().unwrap();
        let db = test_db::migrated().await;
        let client = db.connect().await;
        let place = PgPlace {
            target: db.target.clone(),
            open: PgOpen::new("j"),
        };
        let jobs = || async {
            let row = client
                .query_one("SELECT count(*) FROM hw_job", &[])
                .await
                .unwrap();
            row.get::<_, i64>(0)
        };
        for (why, request) in refused(tmp.path()) {
            assert!(open_at(&place, &request).await.is_err(), "{why}: refused");
            assert_eq!(jobs().await, 0, "{why}: no job left");
        }
        // A worker with no input joining a job that is not there: the store's error.
        let err = open_at(&place, &JobRequest::default()).await.err();
        assert!(matches!(err, Some(JobError::Store(_))), "{err:?}");
        // A job created, then a resume refused: the job is kept as it was; a worker
        // without the input joins it.
        let (store, spec) = open_at(&place, &good(tmp.path())).await.unwrap();
        store.close().await.unwrap();
        let err = open_at(&place, &changed(good(tmp.path()))).await.err();
        assert!(matches!(err, Some(JobError::MeaningChanged(_))), "{err:?}");
        let err = open_at(&place, &changed(JobRequest::default())).await.err();
        assert!(matches!(err, Some(JobError::MeaningChanged(_))), "{err:?}");
        assert_eq!(jobs().await, 1);
        let (store, joined) = open_at(&place, &JobRequest::default()).await.unwrap();
        assert_eq!(joined.job_id, spec.job_id);
        store.close().await.unwrap();
    }
}
