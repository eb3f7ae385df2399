//! The exec handler: one process per ID from the job's command, and the classifier that
//! turns its exit into a result or a [`Failure`].
//!
//! The command ([`ExecSpec`]) is split into arguments like a POSIX shell would (quotes and
//! backslashes), with no shell in between unless the command names one (`sh -c '...'`).
//! `{id}` is replaced by the ID inside whichever argument it stands, always within that one
//! argument (an ID with spaces or quotes stays one argument); `${VAR}` is expanded from the
//! environment when the handler is built, never stored expanded. The process gets no
//! standard input and inherits the environment and working directory. Each of the job's
//! credentials is also in its environment, under the credential's name, and a `${NAME}` of
//! one in the command is its current value; a process that exits with
//! `REFUSED_EXIT_CODE` says the credential was refused: it is renewed and the ID run
//! again ([`super::Credentials`]).
//!
//! | the process | class | next |
//! |---|---|---|
//! | exits 0 | - | its standard output is the result (then the job's answer checks) |
//! | exits with a code of `retry_exit_codes` (default 75, `EX_TEMPFAIL`) | `exit` | retry |
//! | runs past the timeout: its whole process group is killed | `timeout` | timed out |
//! | exits with any other code, or is killed by a signal | `exit` | permanent |
//! | writes more than `MAX_OUTPUT_BYTES` to standard output | `body` | permanent |
//! | cannot be started: not found, not executable | `request` | permanent |
//! | cannot be started for now (too many processes or open files) | `request` | retry |
//!
//! Standard output is stored as JSON when it is one JSON document, else as a JSON string,
//! trailing newlines removed (as `$(...)` does in a shell). A failure's message ends with the
//! last `STDERR_TAIL_BYTES` of standard error, masked ([`crate::secrets`]) of the `${VAR}`
//! values the command expanded and of every value its credentials had.
//!
//! No process outlives highwater or its attempt: each runs in its own process group, killed
//! whole at the timeout, when its attempt is abandoned (a stop) and after it exits (its
//! stray background children); on Linux each also gets `SIGKILL` when highwater dies, even
//! by `SIGKILL` (`crate::os::contain_child`). That parent-death signal fires when the
//! *thread* that forked the child ends, and the async runtime's threads come and go, so
//! every process is forked by one spawner thread that lives as long as the process.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};

use super::credentials::{Credentials, REFUSED_EXIT_CODE};
use super::error::HandlerError;
use super::output::Output;
use super::template::{row_values, IdEncoding, Template};
use super::work::Handler;
use crate::answer::Answer;
use crate::failure::{ErrorClass, Failure};
use crate::secrets::Secrets;
use crate::setting::Setting;

/// The largest standard output kept (as for an HTTP answer body); more fails the ID.
pub(crate) const MAX_OUTPUT_BYTES: usize = super::http::MAX_BODY_BYTES;

/// How much of the end of standard error a failure's message keeps.
pub(crate) const STDERR_TAIL_BYTES: usize = 2000;

/// The exit code retried by default: `EX_TEMPFAIL` of sysexits.h.
pub const DEFAULT_RETRY_EXIT_CODES: [i32; 1] = [75];

/// The command run for each ID, as written (stored in the job's spec).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Program and arguments, split like a shell would: `{id}` stands for the ID inside one
    /// argument, `${VAR}` comes from the environment at run time.
    pub command: String,
    /// Exit codes that mean "try again later".
    pub retry_exit_codes: Vec<i32>,
}

/// Runs one process for an ID. Cheap to share behind an `Arc`.
pub struct ExecHandler {
    /// Program and arguments, `${VAR}` expanded.
    argv: Vec<Template>,
    timeout: Duration,
    retry_exit_codes: Vec<i32>,
    answer: Answer,
    /// The job's credentials, in the environment of every process.
    credentials: Credentials,
    /// What its command expanded and its credentials' values: masked in failures.
    secrets: Secrets,
}

impl std::fmt::Debug for ExecHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The arguments may hold expanded secrets.
        f.debug_struct("ExecHandler")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Handler for ExecHandler {
    fn call(&self, id: &str) -> impl std::future::Future<Output = Result<Output, Failure>> + Send {
        self.run(id, None)
    }

    fn call_row(
        &self,
        id: &str,
        row: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Output, Failure>> + Send {
        self.run(id, row)
    }
}

const WHAT: &Setting = &Setting::Exec;

/// Split `command` into argument templates, expanding `${VAR}` with `env`.
fn parse(
    command: &str,
    env: &dyn Fn(&str) -> Option<String>,
    credentials: &[&str],
) -> Result<Vec<Template>, HandlerError> {
    let invalid = |reason: &str| HandlerError::Invalid {
        what: WHAT.clone(),
        reason: reason.into(),
    };
    let words = shlex::split(command)
        .ok_or_else(|| invalid("unbalanced quotes or a trailing backslash"))?;
    let argv = words
        .iter()
        .map(|w| Template::parse_with(w, WHAT, IdEncoding::Raw, env, credentials))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(program) = argv.first() else {
        return Err(invalid("no program given"));
    };
    if program.has_credential() {
        return Err(invalid(
            "a credential may not stand in the program's name (give it as an argument)",
        ));
    }
    if program.has_id() || program.columns().next().is_some() {
        return Err(invalid(
            "{id} or a {column} may not stand in the program's name (give it as an argument)",
        ));
    }
    if !argv.iter().any(Template::has_id) {
        return Err(invalid(
            "{id} appears in no argument: every process would be the same",
        ));
    }
    Ok(argv)
}

/// Check the command's syntax without the environment: what must hold before a job is
/// stored. `credentials`: the names of the job's credentials.
pub(crate) fn check_command(spec: &ExecSpec, credentials: &[&str]) -> Result<(), HandlerError> {
    parse(&spec.command, &|_| Some("x".into()), credentials).map(|_| ())
}

impl ExecHandler {
    /// Build from the stored spec, expanding `${VAR}` from the process environment and
    /// finding the program; `timeout` is the job's.
    pub fn new(spec: &ExecSpec, timeout: Duration) -> Result<ExecHandler, HandlerError> {
        Self::with_env(spec, timeout, &|name| std::env::var(name).ok())
    }

    /// Build with an explicit environment (tests, embedding).
    pub fn with_env(
        spec: &ExecSpec,
        timeout: Duration,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ExecHandler, HandlerError> {
        Self::with_credentials(spec, timeout, Credentials::none(), env)
    }

    /// Build with credentials: each is in every process's environment under its name, and a
    /// `${NAME}` of one in the command is its current value, not an environment variable.
    pub fn with_credentials(
        spec: &ExecSpec,
        timeout: Duration,
        credentials: Credentials,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ExecHandler, HandlerError> {
        let secrets = Secrets::new();
        credentials.secrets().feed(&secrets);
        let argv = parse(&spec.command, &secrets.recording(env), &credentials.names())?;
        let program = argv[0].render("");
        if find_program(Path::new(&program)).is_none() {
            return Err(HandlerError::Invalid {
                what: WHAT.clone(),
                reason: format!(
                    "program {:?} not found (or not executable)",
                    secrets.mask(&program)
                ),
            });
        }
        Ok(ExecHandler {
            argv,
            timeout,
            retry_exit_codes: spec.retry_exit_codes.clone(),
            answer: Answer::default(),
            credentials,
            secrets,
        })
    }

    /// Judge every output of a process that exited 0 with `answer` (the job's answer
    /// checks) before it counts as a success.
    pub fn with_answer(mut self, answer: Answer) -> ExecHandler {
        self.answer = answer;
        self
    }

    /// One process for `id`, as a boxed future. Unboxed it is about 5 KB (the process, its
    /// two pipe readers and the timeout), and a caller holding an HTTP or an exec attempt
    /// (`job::JobHandler`) would reserve that much for each HTTP call in flight too, whose own
    /// future is under 300 bytes: 19 MiB at 4,000 in flight (benches/README.md, "Slow API,
    /// wide concurrency"). One allocation beside a process spawn costs nothing.
    pub fn attempt<'a>(
        &'a self,
        id: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Output, Failure>> + Send + 'a>> {
        self.attempt_row(id, None)
    }

    /// [`ExecHandler::attempt`], with the ID's input row's kept columns (`{column}` in the
    /// arguments).
    pub fn attempt_row<'a>(
        &'a self,
        id: &'a str,
        row: Option<&'a str>,
    ) -> Pin<Box<dyn Future<Output = Result<Output, Failure>> + Send + 'a>> {
        Box::pin(async move {
            self.run(id, row).await.map_err(|f| Failure {
                message: self.secrets.mask(&f.message),
                ..f
            })
        })
    }

    async fn run(&self, id: &str, row: Option<&str>) -> Result<Output, Failure> {
        let row = row_values(row)?;
        let used = self.credentials.values().await?;
        let values: Vec<&str> = used.iter().map(|v| v.expose()).collect();
        let argv: Vec<String> = self
            .argv
            .iter()
            .map(|a| a.render_row(id, row.as_ref(), &values))
            .collect();
        let mut command = Command::new(&argv[0]);
        for (credential, value) in self.credentials.list().iter().zip(&values) {
            command.env(credential.name(), value);
        }
        command
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        crate::os::contain_child(&mut command);
        let mut child = spawn(command).await.map_err(|e| {
            let message = format!("cannot start {:?}: {e}", argv[0]);
            match e.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => {
                    Failure::permanent(message)
                }
                _ => Failure::retry(message),
            }
            .class(ErrorClass::Request)
        })?;
        // Whatever happens to this attempt from here (an error, a timeout, the attempt
        // abandoned at a stop), the process group goes with it.
        let _group = child.id().map(KillGroupOnDrop);
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let run = async {
            // More than the tail kept, so that a secret standing across its cut is masked
            // whole, not cut into an unmasked part.
            let keep = STDERR_TAIL_BYTES + self.secrets.longest();
            let (out, err) = tokio::join!(read_capped(stdout), read_tail(stderr, keep));
            let status = child.wait().await;
            (out, err, status)
        };
        let (out, err, status) = match tokio::time::timeout(self.timeout, run).await {
            Ok(done) => done,
            Err(_) => {
                return Err(Failure::timed_out(format!(
                    "the process ran past the timeout of {} and was killed with its process group",
                    humantime::format_duration(self.timeout)
                )))
            }
        };
        let stderr = self.stderr_tail(&err);
        let tail = |message: String| with_stderr(message, &stderr);
        let status = status.map_err(|e| {
            Failure::retry(format!("cannot wait for the process: {e}")).class(ErrorClass::Exit)
        })?;
        let out = match out {
            Ok(out) => out,
            Err(ReadError::TooLarge) => {
                return Err(Failure::permanent(tail(format!(
                    "standard output is larger than {MAX_OUTPUT_BYTES} bytes"
                )))
                .class(ErrorClass::Body))
            }
            Err(ReadError::Io(e)) => {
                return Err(
                    Failure::retry(tail(format!("cannot read standard output: {e}")))
                        .class(ErrorClass::Body),
                )
            }
        };
        match status.code() {
            Some(0) => self.credentials.accepted(&used),
            Some(REFUSED_EXIT_CODE) if !used.is_empty() => {
                let refused = Failure::retry(tail(format!(
                    "exit code {REFUSED_EXIT_CODE} (the credential was refused)"
                )))
                .class(ErrorClass::Exit);
                return Err(self.credentials.refused(&used, refused).await);
            }
            Some(code) if self.retry_exit_codes.contains(&code) => {
                return Err(Failure::retry(tail(format!("exit code {code} (retried)")))
                    .class(ErrorClass::Exit))
            }
            Some(code) => {
                return Err(
                    Failure::permanent(tail(format!("exit code {code}"))).class(ErrorClass::Exit)
                )
            }
            None => {
                return Err(Failure::permanent(tail(format!(
                    "the process was {}",
                    killed_by(&status)
                )))
                .class(ErrorClass::Exit))
            }
        }
        let out = trim_newlines(out);
        let usage = self.answer.usage(None, std::iter::empty, &out);
        let result = self.answer.judge(None, std::iter::empty, out)?;
        Ok(Output {
            usage,
            ..Output::from(result)
        })
    }
}

/// The command's program found as the OS would find it: a path with a `/` as it is, a bare
/// name on `PATH`.
fn find_program(program: &Path) -> Option<PathBuf> {
    let executable = |p: &Path| {
        let Ok(meta) = p.metadata() else { return false };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            meta.is_file() && meta.permissions().mode() & 0o111 != 0
        }
        #[cfg(not(unix))]
        meta.is_file()
    };
    if program.components().count() > 1 || program.is_absolute() {
        return executable(program).then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// How a process without an exit code ended.
fn killed_by(status: &std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("killed by signal {signal}");
        }
    }
    format!("ended without an exit code ({status})")
}

/// `message`, then the end of standard error when there is any.
fn with_stderr(message: String, stderr: &str) -> String {
    let text = stderr.trim();
    if text.is_empty() {
        message
    } else {
        format!("{message}; stderr: {text}")
    }
}

fn trim_newlines(mut out: Vec<u8>) -> Vec<u8> {
    while matches!(out.last(), Some(b'\n' | b'\r')) {
        out.pop();
    }
    out
}

enum ReadError {
    TooLarge,
    Io(io::Error),
}

/// All of standard output, at most [`MAX_OUTPUT_BYTES`].
async fn read_capped(stream: impl AsyncRead + Unpin) -> Result<Vec<u8>, ReadError> {
    let mut out = Vec::new();
    stream
        .take(MAX_OUTPUT_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .await
        .map_err(ReadError::Io)?;
    if out.len() > MAX_OUTPUT_BYTES {
        return Err(ReadError::TooLarge);
    }
    Ok(out)
}

/// The last `keep` bytes of standard error (all of it is read, so the process never blocks on
/// a full pipe), and whether some was left out before them.
async fn read_tail(mut stream: impl AsyncRead + Unpin, keep: usize) -> (Vec<u8>, bool) {
    let mut tail = Vec::new();
    let mut cut = false;
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * keep {
                    tail.drain(..tail.len() - keep);
                    cut = true;
                }
            }
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
        cut = true;
    }
    (tail, cut)
}

impl ExecHandler {
    /// The last [`STDERR_TAIL_BYTES`] of what [`read_tail`] kept, masked, marked `…` where
    /// it was cut.
    fn stderr_tail(&self, (tail, cut): &(Vec<u8>, bool)) -> String {
        // Skip a partial UTF-8 character at a cut start.
        let start = if *cut {
            tail.iter().position(|b| (*b as i8) >= -0x40).unwrap_or(0)
        } else {
            0
        };
        let text = String::from_utf8_lossy(&tail[start..]);
        let masked = self.secrets.mask_suffix(&text, STDERR_TAIL_BYTES);
        if *cut || text.len() > STDERR_TAIL_BYTES {
            format!("…{masked}")
        } else {
            masked
        }
    }
}

/// Kills a process group (the attempt's process and whatever it started) when dropped.
struct KillGroupOnDrop(u32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        crate::os::kill_process_group(self.0);
    }
}

type SpawnRequest = (
    Command,
    tokio::runtime::Handle,
    tokio::sync::oneshot::Sender<io::Result<Child>>,
);

/// Fork `command` on the spawner thread (see the module doc), registered with the caller's
/// runtime.
async fn spawn(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<io::Result<std::sync::mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("highwater-spawner".into())
            .spawn(move || {
                for (mut command, runtime, reply) in rx {
                    let _entered = runtime.enter();
                    let _ = reply.send(command.spawn());
                }
            })?;
        Ok(tx)
    });
    let spawner = spawner
        .as_ref()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start the spawner thread: {e}")))?;
    let (reply, answer) = tokio::sync::oneshot::channel();
    spawner
        .send((command, tokio::runtime::Handle::current(), reply))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    answer
        .await
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler(command: &str, timeout: Duration) -> ExecHandler {
        let spec = ExecSpec {
            command: command.into(),
            retry_exit_codes: DEFAULT_RETRY_EXIT_CODES.to_vec(),
        };
        ExecHandler::with_env(&spec, timeout, &|name| {
            (name == "GREETING").then(|| "hello world".to_string())
        })
        .unwrap()
    }

    fn spec(command: &str) -> ExecSpec {
        ExecSpec {
            command: command.into(),
            retry_exit_codes: vec![75],
        }
    }

    #[test]
    fn commands_are_split_like_a_shell_and_checked() {
        let env = |_: &str| Some("a b".to_string());
        let argv = parse(r#"prog --x='{id} y' "${V}" {id}"#, &env, &[]).unwrap();
        let words: Vec<String> = argv.iter().map(|t| t.render("i d")).collect();
        assert_eq!(words, ["prog", "--x=i d y", "a b", "i d"]);
        for (bad, says) in [
            ("prog 'open {id}", "unbalanced"),
            ("", "no program"),
            ("{id} x", "program's name"),
            ("prog x", "appears in no argument"),
        ] {
            let err = check_command(&spec(bad), &[]).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains("exec"), "{bad}: {err}");
        }
        let err = ExecHandler::with_env(
            &spec("no-such-program-here {id}"),
            Duration::from_secs(1),
            &|_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not found"), "{err}");
        let err =
            ExecHandler::with_env(&spec("echo ${NOPE} {id}"), Duration::from_secs(1), &|_| {
                None
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("NOPE"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exits_are_classified() {
        let h = handler(
            r#"sh -c 'case "$1" in ok) echo "{\"id\": \"$1\"}";; text) printf "%s\n\n" "${GREETING}";; again) echo busy >&2; exit 75;; *) echo "no such $1" >&2; exit 3;; esac' sh {id}"#,
            Duration::from_secs(20),
        );
        let out = h.attempt("ok").await.unwrap();
        assert_eq!(out.result.get(), r#"{"id": "ok"}"#);
        assert_eq!(out.status, None);
        let out = h.attempt("text").await.unwrap();
        assert_eq!(out.result.get(), r#""hello world""#);
        let e = h.attempt("again").await.unwrap_err();
        assert_eq!(
            (e.class, e.next),
            (
                ErrorClass::Exit,
                crate::failure::Next::Retry { after: None }
            )
        );
        assert_eq!(e.message, "exit code 75 (retried); stderr: busy");
        let e = h.attempt("x y'z").await.unwrap_err();
        assert_eq!(
            (e.class, e.next),
            (ErrorClass::Exit, crate::failure::Next::Permanent)
        );
        assert_eq!(e.message, "exit code 3; stderr: no such x y'z");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expanded_value_is_masked_in_stderr_even_across_the_cut() {
        // `hello world`, then 1990 zeros: the value stands across the tail's cut.
        let h = handler(
            "sh -c 'printf \"%s\" \"$1\" >&2; printf \"%01990d\" 0 >&2; exit 3' sh ${GREETING} {id}",
            Duration::from_secs(20),
        );
        let e = h.attempt("x").await.unwrap_err();
        assert!(e.message.contains("stderr: …***000"), "{}", e.message);
        assert!(!e.message.contains("world"), "{}", e.message);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_stderr_keeps_its_tail() {
        let h = handler(
            "sh -c 'i=0; while [ $i -lt 2000 ]; do echo \"line $i of $1\" >&2; i=$((i+1)); done; exit 1' sh {id}",
            Duration::from_secs(20),
        );
        let e = h.attempt("x").await.unwrap_err();
        assert!(e.message.ends_with("line 1999 of x"), "{}", e.message);
        assert!(e.message.contains("stderr: …"), "{}", e.message);
        assert!(e.message.len() < STDERR_TAIL_BYTES + 100);
    }
}
