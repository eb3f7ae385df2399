//! `--state` (and `--job`): read once into the place the job is kept in (a state directory,
//! or a job of a PostgreSQL database: a [`JobPlace`]), which every command is a function
//! over ([`OverPlace`]). A database URL is shown only without its password.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::exit;
use crate::job::{JobPlace, JobSpec, StateDirPlace};
use crate::say;

/// A command, as a function over the place `--state` names.
pub(crate) trait OverPlace {
    /// Run the command over the job at `place`; its exit code.
    async fn over<P: JobPlace + Clone + 'static>(self, place: P) -> Result<u8>;
}

/// How a command that runs the job opens its store: the flags that tune it (none: the
/// place's defaults, as for a command that only reads).
#[derive(Default)]
pub(crate) struct Tuning {
    /// `--store-cache-mb`, in bytes.
    pub(crate) cache_bytes: Option<u64>,
    /// `--store-reopen-after`.
    pub(crate) reopen_after: Option<u64>,
    /// `--lease-ttl`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) lease_ttl: Option<Duration>,
}

/// Read `--state` and `--job` into a place and run `command` over it: a URL needs --job, a
/// directory refuses it, a build without PostgreSQL refuses a URL, and a URL that does not
/// parse is refused (exit 2, said).
pub(crate) async fn over_place<C: OverPlace>(
    state: &Path,
    job: Option<&str>,
    tuning: Tuning,
    command: C,
) -> Result<u8> {
    let text = state.to_string_lossy();
    let url = text.starts_with("postgres://") || text.starts_with("postgresql://");
    match (url, job) {
        #[cfg(feature = "postgres")]
        (true, Some(job)) => match crate::job::PgPlace::new(&text, job) {
            Ok(mut place) => {
                place.open.ttl = tuning.lease_ttl.unwrap_or(place.open.ttl);
                command.over(place).await
            }
            Err(e) => {
                say!("error: --state: {e}");
                Ok(exit::USAGE)
            }
        },
        #[cfg(not(feature = "postgres"))]
        (true, Some(_)) => {
            say!("error: --state postgres://...: this highwater was built without PostgreSQL support (cargo feature postgres)");
            Ok(exit::USAGE)
        }
        (true, None) => {
            say!("error: --job NAME is required with a PostgreSQL --state (a database holds many jobs)");
            Ok(exit::USAGE)
        }
        (false, Some(_)) => {
            say!(
                "error: --job names a job of a PostgreSQL database (--state postgres://...); \
                 the state directory {} holds one job",
                state.display()
            );
            Ok(exit::USAGE)
        }
        (false, None) => {
            let mut place = StateDirPlace::new(state);
            place.cache_bytes = tuning.cache_bytes.unwrap_or(place.cache_bytes);
            place.reopen_after = tuning.reopen_after.unwrap_or(place.reopen_after);
            command.over(place).await
        }
    }
}

/// How a command's messages name the job at a place.
pub(crate) struct Named<'a> {
    /// The job, in a sentence: `the job in DIR`.
    pub(crate) job: String,
    /// `--state ...` (with `--job ...` for a database) as a command that resumes it takes them.
    pub(crate) state: String,
    /// The state directory `live.json` goes to, if any.
    pub(crate) live: Option<&'a Path>,
}

impl Named<'_> {
    /// The names of `place`.
    pub(crate) fn of<P: JobPlace>(place: &P) -> Named<'_> {
        let names = place.names();
        let mut state = format!("--state {}", names.state_word);
        if let Some(job) = &names.job_word {
            state.push_str(&format!(" --job {job}"));
        }
        Named {
            job: names.job,
            state,
            live: place.dir(),
        }
    }
}

/// Open the job at `place` for a command that reads it: its store and the job it holds.
pub(crate) async fn open_reader<P: JobPlace>(place: &P) -> Result<(Arc<P::Store>, JobSpec)> {
    let store = place.open_reader().await?;
    let spec = crate::job::stored_job(&*store)
        .await?
        .with_context(|| place.names().unmade)?;
    Ok((store, spec))
}
