//! A credential from a command: its standard output, trimmed, is the value (the
//! `gh auth token`, `gcloud auth print-access-token` pattern).
//!
//! The command runs with no standard input, inheriting the environment, killed if it runs
//! past its timeout. Exit 0 with something printed is a value; anything else (a non-zero
//! exit, nothing printed, a command that cannot be started, a timeout) is the source being
//! unavailable for now, with the end of its standard error in the message.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use super::error::CredentialError;
use super::fetched::Fetched;
use crate::secrets::Secrets;

/// How much of the end of standard error a message keeps.
const STDERR_TAIL_BYTES: usize = 1000;

/// A command printing the value: program and arguments, already split.
#[derive(Debug, Clone)]
pub struct CommandSource {
    argv: Vec<String>,
    timeout: Duration,
}

impl CommandSource {
    /// Run `argv` (program first), allowing it `timeout`. `None` if `argv` is empty.
    pub fn new(argv: Vec<String>, timeout: Duration) -> Option<CommandSource> {
        (!argv.is_empty()).then_some(CommandSource { argv, timeout })
    }

    pub(super) async fn fetch(
        &self,
        name: &str,
        secrets: &Secrets,
    ) -> Result<Fetched, CredentialError> {
        let unavailable = |message: String| CredentialError::Unavailable {
            name: name.to_string(),
            message,
        };
        let program = &self.argv[0];
        let mut command = Command::new(program);
        command
            .args(&self.argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|e| unavailable(format!("cannot start {program:?}: {e}")))?;
        let output = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                unavailable(format!(
                    "{program:?} ran past {} and was killed",
                    humantime::format_duration(self.timeout)
                ))
            })?
            .map_err(|e| unavailable(format!("cannot read the output of {program:?}: {e}")))?;
        let stderr = tail(&output.stderr, secrets);
        let with_stderr = |m: String| {
            if stderr.is_empty() {
                m
            } else {
                format!("{m}; stderr: {stderr}")
            }
        };
        if !output.status.success() {
            let how = match output.status.code() {
                Some(code) => format!("exit code {code}"),
                None => format!("ended without an exit code ({})", output.status),
            };
            return Err(unavailable(with_stderr(format!(
                "{program:?} failed: {how}"
            ))));
        }
        let value = String::from_utf8(output.stdout)
            .map_err(|_| unavailable(with_stderr(format!("{program:?} printed no UTF-8"))))?;
        let value = value.trim();
        if value.is_empty() {
            return Err(unavailable(with_stderr(format!(
                "{program:?} printed nothing"
            ))));
        }
        Ok(Fetched {
            value: value.to_string(),
            expires_in: None,
        })
    }
}

/// The end of standard error, trimmed, cut at a character boundary, `secrets` masked (before
/// the cut, so that no part of one is left at it).
fn tail(stderr: &[u8], secrets: &Secrets) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    let end = secrets.mask_suffix(text, STDERR_TAIL_BYTES);
    if text.len() <= STDERR_TAIL_BYTES {
        end
    } else {
        format!("…{end}")
    }
}
