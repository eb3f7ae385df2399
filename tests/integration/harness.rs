//! The test harness: a fake API on loopback, a scratch directory, and the binary.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use highwater::demo::api::{ApiConfig, FakeApi, Fault};
use serde_json::Value;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_highwater");

pub struct Harness {
    pub api: FakeApi,
    pub dir: tempfile::TempDir,
    // Declared last: the server's tasks live on this runtime.
    rt: tokio::runtime::Runtime,
}

/// A finished command: exit code and its two streams as text.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Run {
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Run {
        assert_eq!(
            self.code, code,
            "exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// The rate limits the progress lines on its stderr showed, in order.
    pub fn rate_limits(&self) -> Vec<f64> {
        self.stderr
            .lines()
            .filter_map(|l| l.split(", rate limit ").nth(1))
            .filter_map(|r| r.split('/').next()?.parse().ok())
            .collect()
    }

    #[track_caller]
    pub fn expect_stderr(&self, needle: &str) -> &Run {
        assert!(
            self.stderr.contains(needle),
            "stderr lacks {needle:?}:\n{}",
            self.stderr
        );
        self
    }
}

impl Harness {
    pub fn new(config: ApiConfig) -> Harness {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let api = rt
            .block_on(FakeApi::start(config))
            .expect("the fake API starts");
        Harness {
            api,
            dir: tempfile::tempdir().unwrap(),
            rt,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn state(&self) -> PathBuf {
        self.path("state")
    }

    /// Write `content` to a file in the scratch directory.
    pub fn file(&self, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(content.as_ref())
            .unwrap();
        path
    }

    /// Write `ids` one per line to `name`.
    pub fn ids_file(&self, name: &str, ids: &[String]) -> PathBuf {
        let mut text = String::new();
        for id in ids {
            text.push_str(id);
            text.push('\n');
        }
        self.file(name, text)
    }

    pub fn url(&self) -> String {
        self.api.url_template()
    }

    /// A command for the binary with a clean environment for logs.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        cmd
    }

    /// Run to completion.
    pub fn run(&self, args: &[&str]) -> Run {
        self.cmd(args).output().expect("the binary runs").into()
    }

    /// Start without waiting.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts")
    }

    /// Wait until the server has seen `calls` calls in total, or the child exited. Returns
    /// false if the child exited first.
    pub fn wait_for_calls(&self, child: &mut Child, calls: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if self.api.total_calls() >= calls {
                return true;
            }
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "no progress to {calls} calls in 120 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The JSONL export of a state, parsed.
    pub fn export(&self, state: &Path) -> Vec<Value> {
        let out = self.run(&["export", "--state", state.to_str().unwrap()]);
        out.expect_code(0);
        out.stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("export lines are JSON"))
            .collect()
    }

    /// `status --json`, parsed.
    pub fn status(&self, state: &Path) -> Value {
        let out = self.run(&["status", "--state", state.to_str().unwrap(), "--json"]);
        out.expect_code(0);
        serde_json::from_str(out.stdout.trim()).expect("status --json is one JSON object")
    }

    /// What a clean run should record for `id`: ok with the server's body, or failed 404
    /// (or 503, for an ID the API refuses on more attempts than a job makes).
    #[track_caller]
    pub fn check_record(&self, record: &Value) {
        let id = record["id"].as_str().expect("records have an id");
        match self.api.fault(id) {
            Fault::NotFound => {
                assert_eq!(record["status"], "failed", "{record}");
                assert_eq!(record["http_status"], 404, "{record}");
            }
            Fault::Unavailable if self.api.config().transient_attempts == u32::MAX => {
                assert_eq!(record["status"], "failed", "{record}");
                assert_eq!(record["http_status"], 503, "{record}");
            }
            _ => {
                assert_eq!(record["status"], "ok", "{record}");
                assert_eq!(record["body"], self.api.expected_body(id), "{record}");
            }
        }
    }

    /// Every one of `ids` is in `export` exactly once, in input order, with the right result.
    #[track_caller]
    pub fn check_export_exactly_once(&self, export: &[Value], ids: &[String]) {
        let mut first_seen = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for id in ids {
            if seen.insert(id.as_str()) {
                first_seen.push(id.as_str());
            }
        }
        let exported: Vec<&str> = export.iter().map(|r| r["id"].as_str().unwrap()).collect();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for id in &exported {
            *counts.entry(id).or_default() += 1;
        }
        let dupes: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(dupes.is_empty(), "IDs exported more than once: {dupes:?}");
        let missing: Vec<_> = first_seen
            .iter()
            .filter(|id| !counts.contains_key(*id))
            .take(10)
            .collect();
        assert!(
            missing.is_empty(),
            "IDs missing from the export: {missing:?}"
        );
        assert_eq!(exported, first_seen, "the export is in input order");
        for record in export {
            self.check_record(record);
        }
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

/// `n` IDs: plain ones, and every 37th with characters that need encoding.
pub fn ids(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            if i % 37 == 5 {
                format!("odd/{i} ?#%+&=é")
            } else {
                format!("id-{i:06}")
            }
        })
        .collect()
}

/// Send a signal to a child.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill failed");
}

/// Wait for a child and collect its output.
pub fn finish(child: Child) -> Run {
    child.wait_with_output().expect("wait for the child").into()
}

// ---------------------------------------------------------------------------
// Helpers for the bad-input and whole-job tests.

/// A path as the `&str` the command line wants.
/// `run` arguments creating a job in `state` from `input` against `url`, with [`QUICK`].
pub fn new_job_args<'a>(state: &'a Path, input: &'a Path, url: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--state",
        p(state),
        "--input",
        p(input),
        "--url",
        url,
    ];
    args.extend(QUICK);
    args
}

pub fn p(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// The canonical form of a path, as the binary names input files in its messages.
pub fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path)
        .expect("the path exists")
        .display()
        .to_string()
}

/// Every regular file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The names of the entries of `dir`, sorted.
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Flags every test run gets: short retry waits and no progress lines.
pub const QUICK: [&str; 6] = [
    "--retry-initial",
    "5ms",
    "--retry-max",
    "20ms",
    "--progress-interval",
    "0",
];

impl Run {
    /// Neither stream shows a panic.
    #[track_caller]
    pub fn expect_no_panic(&self) -> &Run {
        for (name, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            assert!(
                !text.contains("panicked") && !text.contains("RUST_BACKTRACE"),
                "{name} shows a panic:\n--- stdout\n{}\n--- stderr\n{}",
                self.stdout,
                self.stderr
            );
        }
        self
    }

    /// A refusal: exit `code`, no panic, and every one of `needles` in stderr.
    #[track_caller]
    pub fn expect_refused(&self, code: i32, needles: &[&str]) -> &Run {
        self.expect_no_panic().expect_code(code);
        for needle in needles {
            self.expect_stderr(needle);
        }
        self
    }
}

impl Harness {
    /// `run` creating a job in `state` from `input` against `url`, with [`QUICK`] and `extra`.
    pub fn run_new(&self, state: &Path, input: &Path, url: &str, extra: &[&str]) -> Run {
        let mut args = new_job_args(state, input, url);
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// `run --state` (a resume), with [`QUICK`] and `extra`.
    pub fn resume(&self, state: &Path, extra: &[&str]) -> Run {
        let mut args = vec!["run", "--state", p(state)];
        args.extend(QUICK);
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// Run to completion with extra environment variables set and others removed.
    pub fn run_env(&self, args: &[&str], set: &[(&str, &str)], remove: &[&str]) -> Run {
        let mut cmd = self.cmd(args);
        for (k, v) in set {
            cmd.env(k, v);
        }
        for k in remove {
            cmd.env_remove(k);
        }
        cmd.output().expect("the binary runs").into()
    }

    /// A finished job over `ids` (path template, [`QUICK`], `extra`): its input and state.
    /// Asserts the run exits 0 or 3.
    pub fn finished_job(&self, ids: &[String], extra: &[&str]) -> (PathBuf, PathBuf) {
        let input = self.ids_file("ids.txt", ids);
        let state = self.state();
        let run = self.run_new(&state, &input, &self.url(), extra);
        assert!(
            run.code == 0 || run.code == 3,
            "the job should finish: {run:?}"
        );
        (input, state)
    }
}

/// GET `path` from `addr` over HTTP/1.0: status line and body.
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// Parse the text exposition format: (name with labels, value) per sample; every line is
/// a comment or a sample.
pub fn parse_metrics(body: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("sample lines are 'name value'");
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {l:?}"));
            (name.to_string(), value)
        })
        .collect()
}

/// The value of the metric sample `name` (labels included) among `samples`.
pub fn sample(samples: &[(String, f64)], name: &str) -> f64 {
    samples
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no sample {name}"))
        .1
}

/// The peak memory (MiB) a command's closing line reports (`; peak memory N MiB`): the
/// process's own figure, read from the kernel as it ends (a child reaped with wait4 would
/// report the test process's peak as well, which it shared until its exec).
#[track_caller]
pub fn peak_mib(run: &Run) -> u64 {
    run.stderr
        .split("peak memory ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak memory said: {}", run.stderr))
}
