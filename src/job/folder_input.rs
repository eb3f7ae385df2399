//! A folder input on resume: the folder as it is now judged against the files the job
//! planned.
//!
//! Accepted: every planned file unchanged; the last planned one grown by appending rows (as a
//! grown file input, [`super::appended`]); new files whose names sort after the last planned
//! one. Their rows are a grown input: planned after the last bucket. Refused: a planned file
//! changed, removed or renamed, and a new file whose name sorts before or among the planned
//! ones (it would move the rows planned after it into other buckets).

use std::path::Path;

use crate::input::{folder_fingerprint, folder_list, folder_of, Fingerprint, InputFile, InputSpec};

use super::error::JobError;
use super::grown::{appended, GrownInput};

/// Judge the folder `input` names against the files `planned` (see the module doc): `None`
/// when it is as planned (files added since only if the names sort after them are new).
pub(super) fn judge(
    input: &InputSpec,
    planned: &[InputFile],
) -> Result<Option<GrownInput>, JobError> {
    let now = folder_list(&input.path)?;
    let dir = folder_of(&input.path);
    for (i, p) in planned.iter().enumerate() {
        match now.get(i) {
            Some(name) if *name == p.name => {}
            Some(name) if now.contains(&p.name) => {
                return Err(JobError::FolderChanged {
                    path: dir.join(name),
                    what: format!(
                        "this new file's name sorts before {}, a file already planned: its \
                         rows would move the planned rows after it into other buckets; a new \
                         file is accepted only with a name after {}",
                        p.name,
                        last_name(planned)
                    ),
                })
            }
            _ => {
                return Err(JobError::FolderChanged {
                    path: dir.join(&p.name),
                    what: "this planned file was removed or renamed".into(),
                })
            }
        }
    }
    let mut files = planned.to_vec();
    let mut grew = Vec::new();
    let mut skip = 0;
    for (i, p) in planned.iter().enumerate() {
        let path = dir.join(&p.name);
        let then = p.fingerprint();
        let current = Fingerprint::of_file(&path)?;
        if current == then {
            continue;
        }
        if i + 1 < planned.len() {
            return Err(JobError::InputChanged {
                path,
                what: "it is a planned file of the input folder, not the last (only the last \
                       may grow, by appending rows)"
                    .into(),
                then,
                now: current,
            });
        }
        let file = InputSpec {
            path: path.clone(),
            ..input.clone()
        };
        skip = appended(&file, &then, current)?;
        grew.push(format!(
            "{} grew from {} to {} bytes",
            p.name, then.len, current.len
        ));
        files[i] = file_of(&p.name, current);
    }
    let added = &now[planned.len()..];
    for name in added {
        files.push(file_of(name, Fingerprint::of_file(&dir.join(name))?));
    }
    match added {
        [] => {}
        [one] => grew.push(format!("a new file {one}")),
        [first, .., last] => grew.push(format!("{} new files ({first} to {last})", added.len())),
    }
    if grew.is_empty() {
        return Ok(None);
    }
    Ok(Some(GrownInput {
        fingerprint: folder_fingerprint(&files),
        files,
        skip,
        change: format!("input folder grew: {}", grew.join(", ")),
    }))
}

fn file_of(name: &str, f: Fingerprint) -> InputFile {
    InputFile {
        name: name.to_owned(),
        len: f.len,
        xxh3: f.xxh3,
    }
}

fn last_name(planned: &[InputFile]) -> &str {
    planned.last().map_or("", |f| f.name.as_str())
}

/// The files of the folder `dir` now, with their fingerprint: a new job's planned files.
pub(super) fn plan(dir: &Path) -> Result<(Vec<InputFile>, Fingerprint), JobError> {
    let files = crate::input::folder_files(dir)?;
    let fingerprint = folder_fingerprint(&files);
    Ok((files, fingerprint))
}

#[cfg(test)]
mod tests {
    use super::super::{open_job, JobRequest};
    use crate::input::{Cursor, InputFormat, InputSpec};
    use crate::store::sled_store::{OpenMode, SledStore, DEFAULT_CACHE_BYTES};
    use crate::store::{JobView, PlannerState, Store};

    /// A job over a folder of three text files, planned to its end.
    async fn planned_job() -> (tempfile::TempDir, SledStore, PlannerState) {
        planned_job_ending("d\ne\n").await
    }

    /// [`planned_job`] with `last` as its last file (two rows).
    async fn planned_job_ending(last: &str) -> (tempfile::TempDir, SledStore, PlannerState) {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        std::fs::create_dir(&input).unwrap();
        for (name, ids) in [("p0", "a\nb\n"), ("p1", "c\n"), ("p2", last)] {
            std::fs::write(input.join(name), ids).unwrap();
        }
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
            url: Some("http://127.0.0.1:9/{id}".into()),
            ..JobRequest::default()
        };
        let spec = open_job(&store, &request).await.unwrap();
        assert_eq!(spec.input_files.len(), 3);
        let len = 6 + last.len() as u64;
        assert_eq!(spec.fingerprint.len, len);
        let end = PlannerState {
            next_bucket: 2,
            cursor: Cursor {
                byte: len,
                line: 3,
                row: 5,
            },
            exhausted: true,
        };
        store.set_planner(&end).await.unwrap();
        (dir, store, end)
    }

    fn input(dir: &tempfile::TempDir) -> std::path::PathBuf {
        dir.path().join("in")
    }

    async fn resume(store: &SledStore) -> Result<crate::spec::JobSpec, String> {
        open_job(store, &JobRequest::default())
            .await
            .map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn files_added_after_the_last_are_a_grown_input() {
        let (dir, store, end) = planned_job().await;
        // Unchanged, or with a file that is not data: nothing to do.
        std::fs::write(input(&dir).join("_SUCCESS"), "").unwrap();
        let same = resume(&store).await.unwrap();
        assert!(same.history.is_empty());
        std::fs::write(input(&dir).join("p3"), "f\n").unwrap();
        std::fs::write(input(&dir).join("p4"), "g\n").unwrap();
        let spec = resume(&store).await.unwrap();
        let names: Vec<_> = spec.input_files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
        assert_eq!(spec.fingerprint.len, 14);
        let change = &spec.history[0];
        assert_eq!(change.previous_input, Some(same.fingerprint));
        assert!(
            change.changes[0].contains("2 new files (p3 to p4)")
                && change.changes[0].contains("from bucket 2"),
            "{change}"
        );
        let planner = store.planner().await.unwrap();
        assert!(!planner.exhausted);
        assert_eq!(planner.cursor, end.cursor);
        // The planner reads on from its cursor: only the new files' rows.
        let mut reader = spec.input_reader(planner.cursor).unwrap();
        let mut rows = vec![];
        while let Some(row) = reader.next_row().unwrap() {
            rows.push((row.index, row.id.unwrap()));
        }
        assert_eq!(rows, [(5, "f".to_string()), (6, "g".to_string())]);
    }

    #[tokio::test]
    async fn the_last_planned_file_may_grow_by_appending_rows() {
        let (dir, store, _) = planned_job().await;
        std::fs::write(input(&dir).join("p2"), "d\ne\nf\n").unwrap();
        let spec = resume(&store).await.unwrap();
        assert!(
            spec.history[0].changes[0].contains("p2 grew from 4 to 6 bytes"),
            "{:?}",
            spec.history
        );
        std::fs::write(input(&dir).join("p2"), "d\nE\nf\n").unwrap();
        let err = resume(&store).await.unwrap_err();
        assert!(err.contains("p2") && err.contains("changed"), "{err}");
    }

    #[tokio::test]
    async fn a_changed_removed_or_inserted_planned_file_is_refused_naming_it() {
        let (dir, store, _) = planned_job().await;
        let p1 = input(&dir).join("p1");
        std::fs::write(&p1, "c\nx\n").unwrap();
        let err = resume(&store).await.unwrap_err();
        assert!(
            err.contains(&p1.display().to_string()) && err.contains("not the last"),
            "{err}"
        );
        std::fs::remove_file(&p1).unwrap();
        let err = resume(&store).await.unwrap_err();
        assert!(
            err.contains(&p1.display().to_string()) && err.contains("removed or renamed"),
            "{err}"
        );
        std::fs::write(&p1, "c\n").unwrap();
        std::fs::write(input(&dir).join("p10"), "z\n").unwrap();
        let err = resume(&store).await.unwrap_err();
        assert!(
            err.contains("p10") && err.contains("sorts before p2"),
            "{err}"
        );
        std::fs::remove_file(input(&dir).join("p10")).unwrap();
        resume(&store).await.unwrap();
    }

    #[tokio::test]
    async fn a_last_file_grown_and_new_files_at_once_are_read_on_from_the_cursor() {
        // The old last line had no newline: the appended part starts with one.
        let (dir, store, _) = planned_job_ending("d\ne").await;
        std::fs::write(input(&dir).join("p2"), "d\ne\nf\n").unwrap();
        std::fs::write(input(&dir).join("p3"), "g\n").unwrap();
        let spec = resume(&store).await.unwrap();
        let change = &spec.history[0].changes[0];
        assert!(
            change.contains("p2 grew from 3 to 6 bytes") && change.contains("a new file p3"),
            "{change}"
        );
        let planner = store.planner().await.unwrap();
        let mut reader = spec.input_reader(planner.cursor).unwrap();
        let mut rows = vec![];
        while let Some(row) = reader.next_row().unwrap() {
            rows.push((row.index, row.line, row.id.unwrap()));
        }
        assert_eq!(rows, [(5, 3, "f".to_string()), (6, 1, "g".to_string())]);
    }

    #[tokio::test]
    async fn a_moved_folder_resumes_and_a_file_in_its_place_is_refused() {
        let (dir, store, _) = planned_job().await;
        let moved = dir.path().join("moved");
        std::fs::rename(input(&dir), &moved).unwrap();
        let request = |path: std::path::PathBuf| JobRequest {
            input: Some(InputSpec {
                path,
                format: InputFormat::Text,
            }),
            ..JobRequest::default()
        };
        let spec = open_job(&store, &request(moved.clone())).await.unwrap();
        assert_eq!(spec.input.path, moved);
        assert!(
            spec.history[0].changes[0].contains("input moved"),
            "{:?}",
            spec.history
        );
        let file = dir.path().join("ids.txt");
        std::fs::write(&file, "a\n").unwrap();
        let err = open_job(&store, &request(file))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("the job's input is a folder"), "{err}");
    }
}
