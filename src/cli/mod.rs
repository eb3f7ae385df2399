//! CLI: the command line, turned once into validated library types, and the exit codes.
//!
//! Owns `main`, the dispatch to each subcommand, logging setup, `--state`'s reading (a
//! directory or a PostgreSQL job), and the mapping of refusals to exit codes. The clap
//! definitions are in `args`; each subcommand has its file. Nothing below this module sees
//! clap.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use crate::job::JobSpec;
use crate::store::sled_store::{OpenMode, SledStore};

use args::{Cli, Command, LogFormat, RunArgs};
use run::run_job;

mod args;
mod demo_command;
mod export;
mod failures;
mod flags;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(not(feature = "postgres"))]
#[path = "no_pg.rs"]
mod pg;
mod report;
mod rerun;
mod run;
mod serve;
mod status;
#[cfg(test)]
mod tests;

/// Where `--state` points: a state directory (sled), or a job of a PostgreSQL database.
enum StateArg {
    Dir,
    Pg { url: String, job: String },
}

/// Read `--state` and `--job`: a URL needs --job, a directory refuses it (exit 2, said).
fn state_arg(state: &Path, job: Option<&str>) -> Result<StateArg, u8> {
    let text = state.to_string_lossy();
    let url = text.starts_with("postgres://") || text.starts_with("postgresql://");
    match (url, job) {
        (true, Some(job)) => Ok(StateArg::Pg {
            url: text.into_owned(),
            job: job.to_string(),
        }),
        (true, None) => {
            crate::say!("error: --job NAME is required with a PostgreSQL --state (a database holds many jobs)");
            Err(exit::USAGE)
        }
        (false, Some(_)) => {
            crate::say!(
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
fn dashboard_source(state: &Path, job: Option<&str>) -> Result<crate::dashboard::Source, u8> {
    match state_arg(state, job)? {
        StateArg::Dir => Ok(crate::dashboard::Source::Dir(state.to_path_buf())),
        #[cfg(feature = "postgres")]
        StateArg::Pg { url, job } => Ok(crate::dashboard::Source::pg(url, job)),
        #[cfg(not(feature = "postgres"))]
        StateArg::Pg { .. } => {
            crate::say!("error: --state postgres://...: this highwater was built without PostgreSQL support (cargo feature postgres)");
            Err(exit::USAGE)
        }
    }
}

/// Print a line to standard error. A closed standard error (its reader went away) is no
/// reason to fail or abandon a job, so write errors are ignored.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        $crate::console::say(&format!($($arg)*));
    }};
}

/// Exit codes, as documented in `--help` and docs/exit-codes.md.
pub(crate) mod exit {
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
    /// Stopped by a signal.
    pub(crate) const SIGNAL: u8 = 130;
}

/// Parse the command line, run, and return the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    flags::install();
    init_logging(cli.verbose, cli.quiet, cli.log_format == LogFormat::Json);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            say!("error: {}", error_text(&e));
            ExitCode::from(exit::ERROR)
        }
    }
}

/// An error and its causes, joined by ": ", leaving out a cause whose text the message before
/// it already ends with (`cannot open input X: No such file or directory`, not that twice).
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn init_logging(verbose: u8, quiet: bool, json: bool) {
    crate::console::set_mode(json, quiet);
    let default = match (quiet, verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "highwater=debug,info",
        (false, _) => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file (nohup, systemd, a container) gets plain text.
    let colour = crate::console::stderr_is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| crate::console::LogWriter)
        .with_ansi(colour)
        .with_target(false);
    if json {
        fmt.json().init();
    } else {
        fmt.init();
    }
}

async fn dispatch(command: Command) -> Result<u8> {
    match command {
        Command::Run(args) => run::run(*args).await,
        Command::Status(args) => status::status(args).await,
        Command::Export(args) => export::export(args).await,
        Command::Failures(args) => failures::failures(args).await,
        Command::Rerun(args) => rerun::rerun(*args).await,
        Command::Serve(args) => serve::serve(args).await,
        Command::Report(args) => report::report(args).await,
        Command::Demo(args) => demo_command::run(args.dir, args.ids).await,
    }
}

/// The exit code of a run that halted itself, by the halt's kind.
fn halt_code(kind: crate::progress::HaltKind) -> u8 {
    use crate::progress::HaltKind;
    match kind {
        HaltKind::Internal | HaltKind::Outage | HaltKind::Failures => exit::ERROR,
        HaltKind::CredentialRejected => exit::CREDENTIAL,
        HaltKind::BudgetSpent => exit::BUDGET,
    }
}

/// A job made by a library program (its own handler) cannot be run from here: exit 2.
fn library_job(spec: &JobSpec, place: &str) -> Option<u8> {
    let name = spec.handler.as_ref()?;
    say!("error: {place} is run by a library program (its handler {name:?}): run it with that program");
    Some(exit::USAGE)
}

/// Raise the open-file limit to the hard one; a `--concurrency` that cannot have its
/// connections open is a usage error (exit 2), said before anything is created.
fn open_files(run: &RunArgs) -> Option<u8> {
    match crate::os::open_files_for(u64::from(run.concurrency)) {
        Ok(_) => None,
        Err(e) => {
            say!("error: --concurrency {}: {e}", run.concurrency);
            Some(exit::USAGE)
        }
    }
}

/// A job the command line asks for that cannot be: a usage error (2) for a wrong flag, a
/// --url, --header or --body that cannot make a request included (malformed, or naming a
/// variable missing from the environment), or a malformed answer check; 1 for a client that
/// cannot be built; anything else is the command's error.
fn refused(e: crate::job::JobError) -> Result<u8> {
    use crate::handler::HandlerError;
    use crate::job::JobError;
    let code = match &e {
        JobError::Usage(_)
        | JobError::Request(HandlerError::Invalid { .. } | HandlerError::MissingVar { .. })
        | JobError::Answer(_) => exit::USAGE,
        JobError::Request(_) => exit::ERROR,
        _ => return Err(e.into()),
    };
    say!("error: {e}");
    Ok(code)
}

async fn open_existing(state: &Path) -> Result<(SledStore, JobSpec)> {
    let store = SledStore::open(state, OpenMode::Existing, 16 << 20)?;
    let spec = crate::job::stored_job(&store).await?.with_context(|| {
        format!(
            "{} holds no job yet (its first run stopped before creating one)",
            state.display()
        )
    })?;
    Ok((store, spec))
}
