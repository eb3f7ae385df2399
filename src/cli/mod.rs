//! CLI: the command line, turned once into validated library types, and the exit codes.
//!
//! Owns `main`, the dispatch to each subcommand and logging setup. The clap definitions are
//! in `args`; `state` reads `--state` (a directory or a PostgreSQL job) into the place every
//! command is a function over; `exit` maps refusals to exit codes; `running` runs an opened
//! job with the command line's reporters; each subcommand has its file. Nothing below this
//! module sees clap.

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use args::{Cli, Command, LogFormat};

mod args;
mod demo_command;
mod exit;
mod export;
mod failures;
mod flags;
mod job_flags;
mod report;
mod rerun;
mod run;
mod run_dashboard;
mod running;
mod serve;
mod state;
mod status;
#[cfg(test)]
mod tests;

/// Print a line to standard error. A closed standard error (its reader went away) is no
/// reason to fail or abandon a job, so write errors are ignored.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        $crate::console::say(&format!($($arg)*));
    }};
}

/// Parse the command line, run, and return the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    flags::install();
    init_logging(cli.verbose, cli.quiet, cli.log_format == LogFormat::Json);
    watch_the_store(cli.store_timeout);
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

/// Install the store's watchdog: a store call that has not returned within `bound` is
/// logged and ends the process with [`exit::STALLED`]. A hung call cannot be cancelled, and
/// what the store made durable stays so, as after a kill: the same command resumes.
fn watch_the_store(bound: std::time::Duration) {
    if bound.is_zero() {
        return;
    }
    let watchdog = crate::watchdog::Watchdog::new(bound, |stall| {
        tracing::error!(
            op = stall.op,
            waited_ms = stall.waited.as_millis() as u64,
            "{stall}"
        );
        say!(
            "error: {stall}; stopping (exit {}): what is durable stays so, run the same command \
             to resume",
            exit::STALLED
        );
        std::process::exit(i32::from(exit::STALLED));
    });
    // Installed once, here, before any store opens.
    let _ = crate::watchdog::install(watchdog);
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
        // Not sled's internals: tens of thousands of lines a minute, and some are logged
        // from a thread's exit, after the log writer's thread-local buffer is gone, which
        // aborts the process (RUST_LOG=trace still shows them).
        (false, _) => "trace,sled=info",
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
