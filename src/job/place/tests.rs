//! What opening a job at each place leaves behind when its creation is refused.

use std::path::{Path, PathBuf};

use super::{open_at, StateDirPlace};
use crate::input::{InputFormat, InputSpec};
use crate::job::{JobError, JobRequest};

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
    let place = super::PgPlace::at(db.target.clone(), db.target.to_string(), PgOpen::new("j"));
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
    std::sync::Arc::into_inner(store)
        .unwrap()
        .close()
        .await
        .unwrap();
    let err = open_at(&place, &changed(good(tmp.path()))).await.err();
    assert!(matches!(err, Some(JobError::MeaningChanged(_))), "{err:?}");
    let err = open_at(&place, &changed(JobRequest::default())).await.err();
    assert!(matches!(err, Some(JobError::MeaningChanged(_))), "{err:?}");
    assert_eq!(jobs().await, 1);
    let (store, joined) = open_at(&place, &JobRequest::default()).await.unwrap();
    assert_eq!(joined.job_id, spec.job_id);
    std::sync::Arc::into_inner(store)
        .unwrap()
        .close()
        .await
        .unwrap();
}
