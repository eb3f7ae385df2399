//! Creating a job in a store or resuming the one it holds: the stored spec read back, the
//! flags of a resume judged against it, and an input that grew (or moved) accepted.

use crate::handler::exec::{ExecSpec, DEFAULT_RETRY_EXIT_CODES};
use crate::input::Fingerprint;
use crate::setting::Setting;
use crate::spec::{JobSpec, SpecChange, Work};
use crate::store::{now_ms, JobView, Store, StoreError};

use super::checks::{
    check_new_job, check_new_job_environment, check_request, check_work,
    retry_exit_codes_without_command,
};
use super::error::JobError;
use super::folder_input;
use super::grown::{appended, GrownInput};
use super::request::JobRequest;

/// The quotas `request` changes, as a line of the spec history.
fn quota_change(stored: &JobSpec, request: &JobRequest) -> Option<String> {
    let asked = request.quotas.as_ref().filter(|q| **q != stored.quotas)?;
    let list = |q: &[crate::quota::Quota]| {
        if q.is_empty() {
            "none".to_string()
        } else {
            q.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    Some(format!(
        "quotas changed from {} to {} (usage counted so far is kept)",
        list(&stored.quotas),
        list(asked)
    ))
}

/// The prices, the budget and the cost programs `request` changes, as lines of the spec
/// history.
fn money_changes(stored: &JobSpec, request: &JobRequest) -> Vec<String> {
    let mut changes = Vec::new();
    let program = |p: &Option<String>| p.as_deref().map_or("none".into(), |p| format!("{p:?}"));
    for (setting, asked, was) in [
        (Setting::Usage, &request.answer.usage, &stored.answer.usage),
        (
            Setting::Estimate,
            &request.answer.estimate,
            &stored.answer.estimate,
        ),
    ] {
        let Some(asked) = asked else { continue };
        let asked = Some(asked.clone()).filter(|p| !p.trim().is_empty());
        if asked != *was {
            changes.push(format!(
                "{setting} changed from {} to {}",
                program(was),
                program(&asked)
            ));
        }
    }
    let prices = request.prices(stored.prices);
    if prices != stored.prices {
        let text = |p: Option<crate::meter::Prices>| {
            p.map_or("none".to_string(), |p| {
                format!("{} read, {} written", p.input, p.output)
            })
        };
        changes.push(format!(
            "prices changed from {} to {}",
            text(stored.prices),
            text(prices)
        ));
    }
    if let Some(budget) = request.budget.filter(|b| *b != stored.budget) {
        let text = |b: Option<crate::meter::Money>| b.map_or("none".into(), |b| b.to_string());
        changes.push(format!(
            "budget changed from {} to {} (what was spent so far is kept)",
            text(stored.budget),
            text(budget)
        ));
    }
    changes
}

/// The job `store` holds, decoded.
pub async fn stored_job<S: Store>(store: &S) -> Result<Option<JobSpec>, StoreError> {
    store
        .job()
        .await?
        .map(|j| JobSpec::from_stored(&j))
        .transpose()
}

/// Create the job in `store`, or resume the one it holds, and check the input.
///
/// Creation needs an input and work for each ID (a URL, a command or a library handler;
/// else [`JobError::NoJob`]); it runs the checks of a new job once (`check_new_job`),
/// fingerprints the input and refuses an empty one, before the job is stored. The command
/// line's `super::open_at` also builds its handler from the environment first, and undoes
/// what a refused creation made of its place. Resume refuses meaning-changing flags that differ from the stored ones and an input whose
/// fingerprint changed; changed operational settings are stored.
pub async fn open_job<S: Store>(store: &S, request: &JobRequest) -> Result<JobSpec, JobError> {
    open_checked(store, request, false).await
}

/// [`open_job`], and with `environment` a new job's handler is built from the process
/// environment before it is stored ([`check_new_job_environment`]), as [`super::open_at`]
/// asks for the command line.
pub(super) async fn open_checked<S: Store>(
    store: &S,
    request: &JobRequest,
    environment: bool,
) -> Result<JobSpec, JobError> {
    use crate::input::Cursor;
    check_request(request)?;
    let stored = stored_job(store).await?;
    match stored {
        None => {
            let (Some(input), true) = (&request.input, request.has_work()) else {
                return Err(JobError::NoJob);
            };
            check_new_job(request)?;
            if environment {
                check_new_job_environment(request)?;
            }
            let probe = request.new_spec(input, Fingerprint { len: 0, xxh3: 0 })?;
            let (input_files, fingerprint) = if crate::input::is_folder_input(&input.path) {
                folder_input::plan(&input.path)?
            } else {
                (Vec::new(), Fingerprint::of_file(&input.path)?)
            };
            let spec = JobSpec {
                fingerprint,
                input_files,
                ..probe
            };
            if spec.input_reader(Cursor::default())?.next_row()?.is_none() {
                return Err(JobError::EmptyInput(input.path.clone()));
            }
            store.put_job(&spec.to_stored()).await?;
            Ok(spec)
        }
        Some(stored) => {
            let mut asked = resumed_spec(&stored, request)?;
            // The input may have moved (a new --input path) or grown by appending, but
            // what was planned from it never changes.
            let moved = asked.input.path != stored.input.path;
            let grown = grown_input(&stored, &asked).map_err(|e| match e {
                JobError::InputChanged {
                    path,
                    what,
                    then,
                    now,
                } if moved => JobError::InputChanged {
                    what: format!(
                        "{what}; the job was created from {}, not from this file",
                        stored.input.path.display()
                    ),
                    path,
                    then,
                    now,
                },
                e => e,
            })?;
            if let Some(grown) = grown {
                let mut planner = store.planner().await?;
                if planner.cursor.byte == stored.fingerprint.len {
                    // The old last line had no newline: the appended newline still ends it.
                    planner.cursor.byte += grown.skip;
                }
                planner.exhausted = false;
                store.set_planner(&planner).await?;
                asked.history.push(SpecChange {
                    at_ms: now_ms(),
                    command: request.command.clone(),
                    changes: vec![format!(
                        "{} (new rows become new buckets from bucket {})",
                        grown.change, planner.next_bucket
                    )],
                    previous_input: Some(stored.fingerprint),
                });
                asked.fingerprint = grown.fingerprint;
                asked.input_files = grown.files;
            }
            if moved {
                // The same content (or the same with rows appended) at a new place: the job is
                // the same; say so, and keep it in the job's history.
                let change = format!(
                    "input moved from {} to {} (its content checked against the job's \
                     fingerprint)",
                    stored.input.path.display(),
                    asked.input.path.display()
                );
                tracing::warn!("{change}");
                asked.history.push(SpecChange {
                    at_ms: now_ms(),
                    command: request.command.clone(),
                    changes: vec![change],
                    previous_input: None,
                });
            }
            let changes: Vec<String> = quota_change(&asked, request)
                .into_iter()
                .chain(money_changes(&stored, request))
                .collect();
            if !changes.is_empty() {
                asked.history.push(SpecChange {
                    at_ms: now_ms(),
                    command: request.command.clone(),
                    changes,
                    previous_input: None,
                });
            }
            request.apply_operational(&mut asked);
            check_work(&asked)?;
            if asked != stored {
                store.put_job(&asked.to_stored()).await?;
            }
            Ok(asked)
        }
    }
}

/// The stored job as a resume (or a joining worker) asks for it: meaning-changing flags that
/// differ from the stored ones refused ([`JobError::MeaningChanged`]; with
/// `allow_spec_change`, accepted and recorded), the input not looked at. Operational flags
/// are applied by the caller.
fn resumed_spec(stored: &JobSpec, request: &JobRequest) -> Result<JobSpec, JobError> {
    request.check_prices(stored.prices)?;
    let mut asked = stored.clone();
    if let Some(input) = &request.input {
        asked.input = input.clone();
    }
    if let Some(b) = request.bucket_size {
        asked.bucket_size = b;
    }
    // The asked work, changed in the stored layout (a request beside a command, a handler's
    // name or a batch endpoint), then read back as one kind of work.
    let mut work = asked.work.to_fields();
    if let Some(m) = &request.method {
        work.request.method = m.to_ascii_uppercase();
    }
    if let Some(u) = &request.url {
        work.request.url = u.clone();
        work.exec = None;
    }
    if let Some(command) = &request.exec {
        let retry_exit_codes = work
            .exec
            .take()
            .map_or_else(|| DEFAULT_RETRY_EXIT_CODES.to_vec(), |e| e.retry_exit_codes);
        work.exec = Some(ExecSpec {
            command: command.clone(),
            retry_exit_codes,
        });
        work.request.url = String::new();
    }
    if request.retry_exit_codes.is_some() && work.exec.is_none() {
        return Err(retry_exit_codes_without_command());
    }
    if work.exec.is_some() {
        // A command's job keeps no request: what would shape one is refused, never dropped.
        let http: Vec<String> = [
            (request.method.is_some(), Setting::Method),
            (request.body.is_some(), Setting::Body),
        ]
        .iter()
        .filter(|(given, _)| *given)
        .map(|(_, s)| s.to_string())
        .collect();
        if !http.is_empty() {
            return Err(JobError::Usage(format!(
                "{} shape an HTTP request, but this job runs a command ({}); give {} to call an API instead",
                http.join(" and "),
                Setting::Exec,
                Setting::Url
            )));
        }
    }
    if request.handler.is_some() || request.url.is_some() || request.exec.is_some() {
        work.handler = request.handler.clone();
    }
    if request.body.is_some() {
        work.request.body = request.body.clone();
    }
    if request.batch.is_some() {
        work.batch = request.batch.clone();
    }
    if request.paginate.is_some() {
        work.paginate = request.paginate.clone();
    }
    asked.work = Work::from_fields(work).map_err(|e| JobError::Usage(e.to_string()))?;
    if let Some(credentials) = &request.credentials {
        asked.credentials = credentials.clone();
    }
    request.answer.apply(&mut asked.answer);
    crate::answer::Answer::compile(&asked.answer)?;
    check_columns(stored, &asked, request)?;
    let fixed = stored.fixed_changes(&asked);
    let changes = stored.meaning_changes(&asked);
    if !fixed.is_empty() || (!changes.is_empty() && !request.allow_spec_change) {
        return Err(JobError::MeaningChanged(changes));
    }
    if !changes.is_empty() {
        asked.history.push(SpecChange {
            at_ms: now_ms(),
            command: request.command.clone(),
            changes,
            previous_input: None,
        });
    }
    Ok(asked)
}

/// The columns a resume's templates name or asks to keep must be ones the job keeps: its
/// planned rows kept those only.
fn check_columns(stored: &JobSpec, asked: &JobSpec, request: &JobRequest) -> Result<(), JobError> {
    let mut wanted = asked.columns_used();
    wanted.extend(request.keep_columns.iter().flatten().cloned());
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|c| !stored.columns.contains(c))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let kept = if stored.columns.is_empty() {
        "none".to_string()
    } else {
        stored.columns.join(", ")
    };
    Err(JobError::Usage(format!(
        "this job keeps the input columns {kept} of each row, fixed when it was created; \
         {} cannot be used ({} or {{column}} in a template): start a new state directory for a \
         job that uses {}",
        missing.join(", "),
        Setting::KeepColumns,
        if missing.len() == 1 { "it" } else { "them" }
    )))
}

/// Join a job a shared store holds as one more worker, without its input: the same checks
/// of the flags as a resume ([`open_job`]), the operational ones stored, but no input to
/// check. The worker plans only if the stored input is here, unchanged; else the spec it
/// gets has no input path, and other workers plan.
pub(crate) async fn join_job<S: Store>(
    store: &S,
    request: &JobRequest,
) -> Result<Option<JobSpec>, JobError> {
    check_request(request)?;
    let Some(stored) = stored_job(store).await? else {
        return Ok(None);
    };
    let mut asked = resumed_spec(&stored, request)?;
    request.apply_operational(&mut asked);
    check_work(&asked)?;
    if asked != stored {
        store.put_job(&asked.to_stored()).await?;
    }
    let here = asked.input_fingerprint_now().ok();
    if here != Some(asked.fingerprint) {
        tracing::info!(
            input = %asked.input.path.display(),
            "the job's input is not here (or differs): this worker does not plan"
        );
        asked.input.path = std::path::PathBuf::new();
    }
    Ok(Some(asked))
}

/// How the input `asked` names grew since `stored` was planned: `None` when unchanged;
/// refused when changed otherwise than by growing.
fn grown_input(stored: &JobSpec, asked: &JobSpec) -> Result<Option<GrownInput>, JobError> {
    let was_folder = !stored.input_files.is_empty();
    if was_folder != crate::input::is_folder_input(&asked.input.path) {
        let (was, is) = if was_folder {
            ("folder", "not a folder")
        } else {
            ("file", "a folder")
        };
        return Err(JobError::Usage(format!(
            "the job's input is a {was} ({}); {} is {is}",
            stored.input.path.display(),
            asked.input.path.display()
        )));
    }
    if was_folder {
        return folder_input::judge(&asked.input, &stored.input_files);
    }
    let now = Fingerprint::of_file(&asked.input.path)?;
    if now == stored.fingerprint {
        return Ok(None);
    }
    let skip = appended(&asked.input, &stored.fingerprint, now)?;
    Ok(Some(GrownInput {
        files: Vec::new(),
        fingerprint: now,
        skip,
        change: format!(
            "input grew from {} to {} bytes",
            stored.fingerprint.len, now.len
        ),
    }))
}
