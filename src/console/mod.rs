//! Console: everything a run writes to standard error goes through here.
//!
//! Owns the terminal progress bar (`bar`, indicatif, feature `progress-bar`; shown only when
//! standard error is a terminal) and the one path by which log lines, `say!` lines and JSON
//! progress events reach standard error: while a bar is shown, each line is printed above it
//! (the bar is cleared, the line written, the bar redrawn), so neither tears the other. Write
//! errors are ignored: a closed standard error is no reason to fail a job.

#[cfg(feature = "cli")]
use std::io::{self, IsTerminal, Write};

#[cfg(feature = "progress-bar")]
mod bar;
#[cfg(not(feature = "progress-bar"))]
mod no_bar;
#[cfg(feature = "progress-bar")]
pub(crate) use bar::{write_stderr, Bar};
#[cfg(not(feature = "progress-bar"))]
pub(crate) use no_bar::{write_stderr, Bar};

/// Write one line to standard error (a newline is added).
pub(crate) fn line(text: &str) {
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(b'\n');
    write_stderr(&bytes);
}

/// A message for the user (the `say!` macro): the line itself, or with `--log-format json`
/// a JSON object shaped like the log lines, so every line on standard error parses.
pub(crate) fn say(text: &str) {
    if json() {
        let value = serde_json::json!({
            "timestamp": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            "level": "INFO",
            "fields": {"message": text},
        });
        line(&value.to_string());
    } else {
        line(text);
    }
}

/// Standard error for the log subscriber: each event arrives as one write of a whole line.
#[cfg(feature = "cli")]
pub(crate) struct LogWriter;

#[cfg(feature = "cli")]
impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write_stderr(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// Whether a bar can be shown: standard error is a terminal and `TERM` is not `dumb`.
#[cfg(feature = "cli")]
pub(crate) fn stderr_is_terminal() -> bool {
    io::stderr().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb")
}

/// How the process was asked to log, set once at start-up.
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
#[cfg(feature = "cli")]
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Record `--log-format json` and `-q` for the parts that report.
#[cfg(feature = "cli")]
pub(crate) fn set_mode(json: bool, quiet: bool) {
    JSON.store(json, std::sync::atomic::Ordering::Relaxed);
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// `--log-format json` was given.
pub(crate) fn json() -> bool {
    JSON.load(std::sync::atomic::Ordering::Relaxed)
}

/// `-q` was given.
#[cfg(feature = "cli")]
pub(crate) fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

/// `text` as one POSIX shell word, quoted only when it must be, so a command the console
/// suggests (`resume with: highwater run --state DIR`) can be pasted as it is whatever the
/// path holds (spaces, quotes, `$`, non-ASCII).
pub(crate) fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=./:,@%+".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// A path as one shell word (see [`shell_word`]).
pub(crate) fn shell_path(path: &std::path::Path) -> String {
    shell_word(&path.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_survive_a_posix_shell() {
        assert_eq!(shell_word("/tmp/state-1"), "/tmp/state-1");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word(""), "''");
        // Each quoted word, read back by sh, is the text itself.
        for text in [
            "a b",
            "it's",
            "$HOME",
            "x;rm -rf y",
            "naïve dir",
            "back\\slash",
            "*",
        ] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_word(text)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
        }
    }
}
