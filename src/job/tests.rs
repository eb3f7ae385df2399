//! The tests of creating and resuming a job: the checks, a resume's judgement of changed
//! flags, and inputs that grew or moved.

use std::time::Duration;

use super::grown::appended;
use super::*;
use crate::input::InputFormat;
use crate::input::{Fingerprint, InputSpec};
use crate::setting::Setting;
use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};
use crate::store::{JobView, Store};

fn setup() -> (tempfile::TempDir, SledStore, JobRequest) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.txt");
    std::fs::write(&input, "a\nb\n").unwrap();
    let store = SledStore::open(
        &dir.path().join("state"),
        OpenMode::CreateIfMissing,
        DEFAULT_CACHE_BYTES,
    )
    .unwrap();
    let request = JobRequest {
        input: Some(InputSpec {
            path: input,
            format: InputFormat::Text,
        }),
        url: Some("http://127.0.0.1:9/{id}?k=${TOKEN}".into()),
        headers: Some(vec!["Authorization: Bearer ${TOKEN}".into()]),
        ..JobRequest::default()
    };
    (dir, store, request)
}

#[tokio::test]
async fn create_then_resume_keeps_templates_and_applies_operational_changes() {
    let (_d, store, request) = setup();
    let created = open_job(&store, &request).await.unwrap();
    assert_eq!(created.bucket_size, DEFAULT_BUCKET_SIZE);
    assert_eq!(
        created.work.request().unwrap().headers,
        vec!["Authorization: Bearer ${TOKEN}".to_string()]
    );
    let resume = JobRequest {
        timeout: Some(Duration::from_secs(3)),
        retry: RetryOverrides {
            max_attempts: Some(9),
            ..RetryOverrides::default()
        },
        ..JobRequest::default()
    };
    let resumed = open_job(&store, &resume).await.unwrap();
    assert_eq!(resumed.job_id, created.job_id);
    assert_eq!(
        resumed.work.request().unwrap().timeout,
        Duration::from_secs(3)
    );
    assert_eq!(resumed.retry.max_attempts, 9);
    assert_eq!(stored_job(&store).await.unwrap().unwrap(), resumed);
}

#[tokio::test]
async fn meaning_changes_are_refused_and_named() {
    let (_d, store, request) = setup();
    open_job(&store, &request).await.unwrap();
    for (req, flag) in [
        (
            JobRequest {
                url: Some("http://other/{id}".into()),
                ..JobRequest::default()
            },
            Setting::Url,
        ),
        (
            JobRequest {
                bucket_size: Some(7),
                ..JobRequest::default()
            },
            Setting::BucketSize,
        ),
        (
            JobRequest {
                method: Some("post".into()),
                ..JobRequest::default()
            },
            Setting::Method,
        ),
        (
            JobRequest {
                body: Some("{}".into()),
                ..JobRequest::default()
            },
            Setting::Body,
        ),
    ] {
        let err = open_job(&store, &req).await.unwrap_err().to_string();
        assert!(err.contains(&flag.to_string()), "{err}");
    }
    // The same values given again are fine.
    open_job(&store, &request).await.unwrap();
}

#[tokio::test]
async fn moved_input_is_accepted_changed_input_is_not() {
    let (dir, store, request) = setup();
    open_job(&store, &request).await.unwrap();
    let moved = dir.path().join("moved.txt");
    std::fs::rename(&request.input.as_ref().unwrap().path, &moved).unwrap();
    let req = JobRequest {
        input: Some(InputSpec {
            path: moved.clone(),
            format: InputFormat::Text,
        }),
        ..JobRequest::default()
    };
    assert_eq!(open_job(&store, &req).await.unwrap().input.path, moved);
    std::fs::write(&moved, "a\nc\n").unwrap();
    let err = open_job(&store, &JobRequest::default()).await.unwrap_err();
    assert!(matches!(err, JobError::InputChanged { .. }), "{err}");
}

#[tokio::test]
async fn empty_input_and_missing_flags_are_refused() {
    let (_d, store, mut request) = setup();
    std::fs::write(&request.input.as_ref().unwrap().path, "\n  \n").unwrap();
    assert!(matches!(
        open_job(&store, &request).await,
        Err(JobError::EmptyInput(_))
    ));
    request.url = None;
    assert!(matches!(
        open_job(&store, &request).await,
        Err(JobError::NoJob)
    ));
}

#[tokio::test]
async fn request_changes_need_allow_spec_change_and_are_recorded() {
    let (_d, store, request) = setup();
    open_job(&store, &request).await.unwrap();
    let change = JobRequest {
        url: Some("http://127.0.0.1:9/v2/{id}".into()),
        command: "rerun".into(),
        ..JobRequest::default()
    };
    assert!(matches!(
        open_job(&store, &change).await,
        Err(JobError::MeaningChanged(_))
    ));
    let allowed = JobRequest {
        allow_spec_change: true,
        ..change.clone()
    };
    let spec = open_job(&store, &allowed).await.unwrap();
    assert_eq!(
        spec.work.request().unwrap().url,
        "http://127.0.0.1:9/v2/{id}"
    );
    assert_eq!(spec.history.len(), 1);
    assert_eq!(spec.history[0].command, "rerun");
    assert!(
        spec.history[0].changes[0].contains(&Setting::Url.to_string()),
        "{:?}",
        spec.history
    );
    assert_eq!(stored_job(&store).await.unwrap().unwrap(), spec);
    // A bucket size change stays refused, allowed or not.
    let bucket = JobRequest {
        bucket_size: Some(3),
        allow_spec_change: true,
        ..JobRequest::default()
    };
    let err = open_job(&store, &bucket).await.unwrap_err().to_string();
    assert!(err.contains(&Setting::BucketSize.to_string()), "{err}");
}

#[tokio::test]
async fn a_grown_input_reopens_the_planner_and_keeps_the_old_fingerprint() {
    let (_d, store, request) = setup();
    let created = open_job(&store, &request).await.unwrap();
    let exhausted = crate::store::PlannerState {
        next_bucket: 1,
        cursor: crate::input::Cursor {
            byte: 4,
            line: 3,
            row: 2,
        },
        exhausted: true,
    };
    store.set_planner(&exhausted).await.unwrap();
    let path = &request.input.as_ref().unwrap().path;
    std::fs::write(path, "a\nb\nc\n").unwrap();
    let spec = open_job(&store, &JobRequest::default()).await.unwrap();
    assert_eq!(spec.fingerprint, Fingerprint::of_file(path).unwrap());
    assert_eq!(spec.history[0].previous_input, Some(created.fingerprint));
    let planner = store.planner().await.unwrap();
    assert!(!planner.exhausted);
    assert_eq!(planner.cursor, exhausted.cursor);
}

#[test]
fn growth_edges_are_judged_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.txt");
    let spec = InputSpec {
        path: path.clone(),
        format: InputFormat::Text,
    };
    let check = |old: &str, new: &str| {
        std::fs::write(&path, old).unwrap();
        let then = Fingerprint::of_file(&path).unwrap();
        std::fs::write(&path, new).unwrap();
        let now = Fingerprint::of_file(&path).unwrap();
        appended(&spec, &then, now).map_err(|e| e.to_string())
    };
    assert_eq!(check("a\nb\n", "a\nb\nc\n"), Ok(0));
    assert_eq!(check("a\nb", "a\nb\nc\n"), Ok(1));
    assert_eq!(check("a\r\nb", "a\r\nb\r\nc\r\n"), Ok(2));
    let err = check("a\nb", "a\nbc\n").unwrap_err();
    assert!(err.contains("had no newline"), "{err}");
    let err = check("a\nb\n", "a\nx\nc\n").unwrap_err();
    assert!(err.contains("first 4 bytes"), "{err}");
    let err = check("a\nb\n", "a\n").unwrap_err();
    assert!(err.contains("shorter"), "{err}");
    let err = check("a\nb\n", "a\nc\n").unwrap_err();
    assert!(err.contains("same length"), "{err}");
}

#[test]
fn a_changed_parquet_input_is_never_a_grown_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.parquet");
    let spec = InputSpec {
        path: path.clone(),
        format: InputFormat::Parquet {
            column: "id".into(),
        },
    };
    crate::input::parquet_test_file::ids(&path, &[vec![Some("a"), Some("b")]], 10);
    let then = Fingerprint::of_file(&path).unwrap();
    crate::input::parquet_test_file::ids(&path, &[vec![Some("a"), Some("b")], vec![Some("c")]], 10);
    let now = Fingerprint::of_file(&path).unwrap();
    assert!(now.len > then.len);
    let err = appended(&spec, &then, now).unwrap_err().to_string();
    assert!(err.contains("cannot have grown by appending rows"), "{err}");
    assert!(err.contains("in.parquet"), "{err}");
}

#[tokio::test]
async fn answer_checks_are_part_of_the_meaning() {
    let (_d, store, mut request) = setup();
    request.answer.fail_if = Some(".error != null".into());
    let created = open_job(&store, &request).await.unwrap();
    assert_eq!(created.answer.fail_if.as_deref(), Some(".error != null"));
    // Not given again: kept.
    assert_eq!(
        open_job(&store, &JobRequest::default()).await.unwrap(),
        created
    );
    let change = JobRequest {
        answer: AnswerRequest {
            fail_if: Some(".error".into()),
            expect_json: Some(true),
            ..AnswerRequest::default()
        },
        ..JobRequest::default()
    };
    let err = open_job(&store, &change).await.unwrap_err().to_string();
    assert!(
        err.contains(&Setting::FailIf.to_string())
            && err.contains(&Setting::ExpectJson.to_string()),
        "{err}"
    );
    let spec = open_job(
        &store,
        &JobRequest {
            allow_spec_change: true,
            ..change
        },
    )
    .await
    .unwrap();
    assert_eq!(spec.answer.fail_if.as_deref(), Some(".error"));
    assert!(spec.answer.expect_json);
    assert!(spec.history[0]
        .changes
        .iter()
        .any(|c| c.contains(&Setting::FailIf.to_string())));
    // An empty program removes the check; a malformed one is refused, nothing stored.
    let bad = JobRequest {
        answer: AnswerRequest {
            extract: Some("{".into()),
            ..AnswerRequest::default()
        },
        allow_spec_change: true,
        ..JobRequest::default()
    };
    assert!(matches!(
        open_job(&store, &bad).await,
        Err(JobError::Answer(_))
    ));
    assert_eq!(stored_job(&store).await.unwrap().unwrap(), spec);
    let removed = JobRequest {
        answer: AnswerRequest {
            fail_if: Some(String::new()),
            ..AnswerRequest::default()
        },
        allow_spec_change: true,
        ..JobRequest::default()
    };
    assert_eq!(
        open_job(&store, &removed).await.unwrap().answer.fail_if,
        None
    );
}

#[tokio::test]
async fn an_exec_job_stores_its_command_as_written() {
    let (_d, store, mut request) = setup();
    request.url = None;
    request.headers = None;
    request.exec = Some("echo ${TOKEN} {id}".into());
    let created = open_job(&store, &request).await.unwrap();
    let exec = created.work.exec().unwrap().clone();
    assert_eq!(exec.command, "echo ${TOKEN} {id}");
    assert_eq!(exec.retry_exit_codes, [75]);
    // Exit codes are operational; the command is part of the meaning.
    let codes = JobRequest {
        retry_exit_codes: Some(vec![75, 69]),
        ..JobRequest::default()
    };
    let resumed = open_job(&store, &codes).await.unwrap();
    assert_eq!(resumed.work.exec().unwrap().retry_exit_codes, [75, 69]);
    let url = JobRequest {
        url: Some("http://127.0.0.1:9/{id}".into()),
        ..JobRequest::default()
    };
    let err = open_job(&store, &url).await.unwrap_err().to_string();
    assert!(
        err.contains(&Setting::Exec.to_string()) && err.contains(&Setting::Url.to_string()),
        "{err}"
    );
    let changed = JobRequest {
        exec: Some("printf %s {id}".into()),
        allow_spec_change: true,
        ..JobRequest::default()
    };
    let spec = open_job(&store, &changed).await.unwrap();
    assert_eq!(spec.work.exec().unwrap().command, "printf %s {id}");
    assert_eq!(spec.work.exec().unwrap().retry_exit_codes, [75, 69], "kept");
    // Exit codes for a job that calls a URL, and both at once, are refused.
    let (_d, store, mut request) = setup();
    request.retry_exit_codes = Some(vec![1]);
    assert!(matches!(
        open_job(&store, &request).await,
        Err(JobError::Usage(_))
    ));
    request.exec = Some("echo {id}".into());
    assert!(matches!(
        open_job(&store, &request).await,
        Err(JobError::Usage(_))
    ));
}

#[tokio::test]
async fn credentials_are_stored_as_written_and_change_like_the_request() {
    use crate::credential::{CredentialKind, CredentialSpec};
    let (_d, store, mut request) = setup();
    let oauth2 = |scope: Option<&str>| {
        vec![CredentialSpec {
            name: "TOKEN".into(),
            kind: CredentialKind::OAuth2 {
                token_url: "http://127.0.0.1:9/token".into(),
                client_id: "me".into(),
                client_secret: "${CLIENT_SECRET}".into(),
                scope: scope.map(Into::into),
                client_auth: Default::default(),
            },
            every: None,
            renew_on_403: false,
        }]
    };
    request.credentials = Some(oauth2(None));
    let created = open_job(&store, &request).await.unwrap();
    let stored = String::from_utf8(created.to_stored().spec).unwrap();
    assert!(stored.contains("${CLIENT_SECRET}"), "{stored}");
    // Not given again: kept; given the same: accepted.
    assert_eq!(
        open_job(&store, &JobRequest::default()).await.unwrap(),
        created
    );
    assert_eq!(open_job(&store, &request).await.unwrap(), created);
    // Changed: refused, unless allowed (then recorded).
    let change = JobRequest {
        credentials: Some(oauth2(Some("read"))),
        ..JobRequest::default()
    };
    let err = open_job(&store, &change).await.unwrap_err().to_string();
    assert!(err.contains("credentials"), "{err}");
    let spec = open_job(
        &store,
        &JobRequest {
            allow_spec_change: true,
            ..change
        },
    )
    .await
    .unwrap();
    assert!(
        spec.history[0].changes[0].contains("scope"),
        "{:?}",
        spec.history
    );
    // A name templates cannot use, or one defined twice, is refused.
    let (_d, store, mut request) = setup();
    let mut bad = oauth2(None);
    bad[0].name = "MY-TOKEN".into();
    request.credentials = Some(bad);
    assert!(matches!(
        open_job(&store, &request).await,
        Err(JobError::Usage(_))
    ));
    let mut twice = oauth2(None);
    twice.extend(oauth2(None));
    request.credentials = Some(twice);
    assert!(matches!(
        open_job(&store, &request).await,
        Err(JobError::Usage(_))
    ));
}

#[tokio::test]
async fn specs_stored_before_answer_checks_existed_still_load() {
    let (_d, store, request) = setup();
    let spec = open_job(&store, &request).await.unwrap();
    let value = serde_json::to_value(&spec).unwrap();
    assert!(
        value.get("answer").is_none(),
        "a plain spec is stored as before"
    );
    let old: JobSpec = serde_json::from_value(value).unwrap();
    assert!(old.answer.is_plain());
}

#[tokio::test]
async fn specs_stored_before_the_history_existed_still_load() {
    let (_d, store, request) = setup();
    let spec = open_job(&store, &request).await.unwrap();
    let mut value = serde_json::to_value(&spec).unwrap();
    value.as_object_mut().unwrap().remove("history");
    let old: JobSpec = serde_json::from_value(value).unwrap();
    assert_eq!(old, spec);
}
