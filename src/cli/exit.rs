//! Exit codes, as documented in `--help` and docs/exit-codes.md, and how the library's
//! refusals map to them: a usage error is the user's to fix (2), the rest the job's.

use anyhow::Result;

use super::args::RunArgs;
use crate::job::{JobError, JobSpec};
use crate::say;

/// Every ID succeeded.
pub(crate) const OK: u8 = 0;
/// The job could not proceed (input, state or store error).
pub(crate) const ERROR: u8 = 1;
/// Usage error (clap uses 2 as well).
pub(crate) const USAGE: u8 = 2;
/// The run completed but some IDs failed permanently.
pub(crate) const FAILURES: u8 = 3;
/// A credential was rejected: the user fixes it and resumes.
pub(crate) const CREDENTIAL: u8 = 4;
/// The job's budget is spent: the user raises it and resumes.
pub(crate) const BUDGET: u8 = 5;
/// The API says the account is out of credit: its owner adds credit, the user resumes.
pub(crate) const OUT_OF_CREDIT: u8 = 7;
/// The store stopped answering (the watchdog): a supervisor restarts, the job resumes.
pub(crate) const STALLED: u8 = 6;
/// Stopped by a signal.
pub(crate) const SIGNAL: u8 = 130;

/// The exit code of a run that halted itself, by the halt's kind.
pub(crate) fn halt_code(kind: crate::progress::HaltKind) -> u8 {
    use crate::progress::HaltKind;
    match kind {
        HaltKind::Internal | HaltKind::Outage | HaltKind::Failures => ERROR,
        HaltKind::CredentialRejected => CREDENTIAL,
        HaltKind::BudgetSpent => BUDGET,
        HaltKind::OutOfCredit => OUT_OF_CREDIT,
    }
}

/// A job made by a library program (its own handler) cannot be run from here: exit 2.
pub(crate) fn library_job(spec: &JobSpec, place: &str) -> Option<u8> {
    let name = spec.work.library()?;
    say!("error: {place} is run by a library program (its handler {name:?}): run it with that program");
    Some(USAGE)
}

/// Raise the open-file limit to the hard one; a `--concurrency` that cannot have its
/// connections open is a usage error (exit 2), said before anything is created.
pub(crate) fn open_files(run: &RunArgs) -> Option<u8> {
    match crate::os::open_files_for(u64::from(run.concurrency)) {
        Ok(_) => None,
        Err(e) => {
            say!("error: --concurrency {}: {e}", run.concurrency);
            Some(USAGE)
        }
    }
}

/// A job the command line asks for that cannot be: a usage error (2) for a wrong flag, a
/// --url, --header or --body that cannot make a request included (malformed, or naming a
/// variable missing from the environment), or a malformed answer check; 1 for a client that
/// cannot be built; anything else is the command's error.
pub(crate) fn refused(e: JobError) -> Result<u8> {
    use crate::handler::HandlerError;
    let code = match &e {
        JobError::Usage(_)
        | JobError::NoJob
        | JobError::Request(HandlerError::Invalid { .. } | HandlerError::MissingVar { .. })
        | JobError::Answer(_) => USAGE,
        JobError::Request(_) => ERROR,
        _ => return Err(e.into()),
    };
    say!("error: {e}");
    Ok(code)
}
