//! `--state` (and `--job`): a state directory, or a job of a PostgreSQL database, read once
//! and opened as each command needs it (to run, or only to read). A database URL is shown
//! only without its password.

use std::path::Path;

use anyhow::{Context, Result};

use super::exit;
use crate::job::JobSpec;
use crate::say;
use crate::store::sled_store::{OpenMode, SledStore};

/// Where `--state` points: a state directory (sled), or a job of a PostgreSQL database.
pub(crate) enum StateArg {
    Dir,
    #[cfg(feature = "postgres")]
    Pg {
        url: String,
        job: String,
    },
}

/// Read `--state` and `--job`: a URL needs --job, a directory refuses it, and a build
/// without PostgreSQL refuses a URL (exit 2, said).
pub(crate) fn state_arg(state: &Path, job: Option<&str>) -> Result<StateArg, u8> {
    let text = state.to_string_lossy();
    let url = text.starts_with("postgres://") || text.starts_with("postgresql://");
    match (url, job) {
        #[cfg(feature = "postgres")]
        (true, Some(job)) => Ok(StateArg::Pg {
            url: text.into_owned(),
            job: job.to_string(),
        }),
        #[cfg(not(feature = "postgres"))]
        (true, Some(_)) => {
            say!("error: --state postgres://...: this highwater was built without PostgreSQL support (cargo feature postgres)");
            Err(exit::USAGE)
        }
        (true, None) => {
            say!("error: --job NAME is required with a PostgreSQL --state (a database holds many jobs)");
            Err(exit::USAGE)
        }
        (false, Some(_)) => {
            say!(
                "error: --job names a job of a PostgreSQL database (--state postgres://...); \
                 the state directory {} holds one job",
                state.display()
            );
            Err(exit::USAGE)
        }
        (false, None) => Ok(StateArg::Dir),
    }
}

/// The job `serve` and `report` show: `--state` (and `--job`) read as for every command.
#[cfg(feature = "dashboard")]
pub(crate) fn dashboard_source(
    state: &Path,
    job: Option<&str>,
) -> Result<crate::dashboard::Source, u8> {
    match state_arg(state, job)? {
        StateArg::Dir => Ok(crate::dashboard::Source::Dir(state.to_path_buf())),
        #[cfg(feature = "postgres")]
        StateArg::Pg { url, job } => Ok(crate::dashboard::Source::pg(url, job)),
    }
}

/// Open a state directory that holds a job, for a command that reads it.
pub(crate) async fn open_existing(state: &Path) -> Result<(SledStore, JobSpec)> {
    let store = SledStore::open(state, OpenMode::Existing, 16 << 20)?;
    let spec = crate::job::stored_job(&store).await?.with_context(|| {
        format!(
            "{} holds no job yet (its first run stopped before creating one)",
            state.display()
        )
    })?;
    Ok((store, spec))
}

/// A job of a PostgreSQL database, as the commands name and open it.
#[cfg(feature = "postgres")]
pub(crate) mod pg {
    use std::path::Path;
    use std::sync::Arc;

    use anyhow::Result;

    use super::exit;
    use crate::job::{JobSpec, PgPlace};
    use crate::say;
    use crate::store::postgres::{redact_url, PgOpen, PgStore, PgTarget};

    /// Parse the URL (its `${VAR}`s expanded); a bad one is a usage error, said.
    pub(crate) fn target(url: &str) -> Result<PgTarget, u8> {
        PgTarget::parse(url).map_err(|e| {
            say!("error: --state: {e}");
            exit::USAGE
        })
    }

    /// How the job is named in messages: its name and the database, without a password.
    pub(crate) fn shown(url: &str, job: &str) -> String {
        format!("job {job:?} of {}", redact_url(url))
    }

    /// `--state URL --job NAME` as a command that resumes the job takes them.
    pub(crate) fn state_flags(url: &str, job: &str) -> String {
        format!(
            "--state {} --job {}",
            redact_url(url),
            crate::console::shell_path(Path::new(job))
        )
    }

    /// The job as a worker's session opens it (`--lease-ttl`).
    pub(crate) fn place(url: &str, job: &str, ttl: std::time::Duration) -> Result<PgPlace, u8> {
        Ok(PgPlace {
            target: target(url)?,
            open: PgOpen {
                ttl,
                ..PgOpen::new(job)
            },
        })
    }

    /// Open the job without a session, for reading.
    pub(crate) async fn open_reader(url: &str, job: &str) -> Result<(PgStore, JobSpec)> {
        let target = match target(url) {
            Ok(t) => t,
            Err(code) => std::process::exit(i32::from(code)),
        };
        let open = PgOpen {
            worker: false,
            ..PgOpen::new(job)
        };
        let store = PgStore::open(&target, &open).await?;
        let spec = crate::job::stored_job(&store).await?.ok_or_else(|| {
            anyhow::anyhow!(
                "{} has no spec yet (its first run stopped before creating it)",
                shown(url, job)
            )
        })?;
        Ok((store, spec))
    }

    /// End the worker's session: what it still holds is released at once.
    pub(crate) async fn close(store: Arc<PgStore>) {
        match Arc::into_inner(store) {
            Some(store) => {
                if let Err(e) = store.close().await {
                    tracing::warn!("cannot end the worker's session (it expires by itself): {e}");
                }
            }
            None => tracing::warn!("the worker's session is left to expire by itself"),
        }
    }
}
