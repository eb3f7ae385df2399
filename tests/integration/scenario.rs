//! A test's story in one chain (just's `Test` idea): the fake API with chosen faults, the
//! IDs and the flags, then runs of the real binary, killed at random points and resumed, and
//! the export read back.
//!
//! ```ignore
//! let mut s = Scenario::new(ApiConfig::faulty())
//!     .ids(ids(5_000))
//!     .flags(&["--concurrency", "16"])
//!     .create_flags(&["--bucket-size", "250"]);
//! let kills = s.kill_at_random_points(12, 100..1200);
//! s.resume().expect_code(3);
//! s.export_exactly_once();
//! ```

#![allow(dead_code)]

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use highwater::demo::api::ApiConfig;
use rand::Rng;
use serde_json::Value;

use crate::harness::{finish, Harness, Run};

pub struct Scenario {
    h: Harness,
    ids: Vec<String>,
    /// Given to every start (`run --state S` is added in front).
    flags: Vec<String>,
    /// Given to the first start only, which creates the job (`--input` and `--url` too).
    create_flags: Vec<String>,
    /// Given, on top of `flags`, to every other restart.
    alternate_flags: Vec<String>,
    state: PathBuf,
    input: Option<PathBuf>,
    starts: usize,
    kills: usize,
}

impl Scenario {
    /// A fake API with this configuration and a scratch directory; no IDs yet.
    pub fn new(config: ApiConfig) -> Scenario {
        let h = Harness::new(config);
        let state = h.state();
        Scenario {
            h,
            ids: Vec::new(),
            flags: Vec::new(),
            create_flags: Vec::new(),
            alternate_flags: Vec::new(),
            state,
            input: None,
            starts: 0,
            kills: 0,
        }
    }

    /// The job's input, in order (repeats allowed).
    pub fn ids(mut self, ids: Vec<String>) -> Scenario {
        self.ids = ids;
        self
    }

    /// Flags every start gets.
    pub fn flags(mut self, flags: &[&str]) -> Scenario {
        self.flags.extend(flags.iter().map(|f| f.to_string()));
        self
    }

    /// Flags only the first start (the one creating the job) gets.
    pub fn create_flags(mut self, flags: &[&str]) -> Scenario {
        self.create_flags
            .extend(flags.iter().map(|f| f.to_string()));
        self
    }

    /// Flags every other restart gets on top of [`Scenario::flags`] (the 2nd, 4th, ... start).
    pub fn alternate_flags(mut self, flags: &[&str]) -> Scenario {
        self.alternate_flags
            .extend(flags.iter().map(|f| f.to_string()));
        self
    }

    pub fn harness(&self) -> &Harness {
        &self.h
    }

    pub fn state(&self) -> &PathBuf {
        &self.state
    }

    /// Starts made so far, and how many of them were killed.
    pub fn starts(&self) -> usize {
        self.starts
    }

    pub fn kills(&self) -> usize {
        self.kills
    }

    /// The arguments of the next start.
    fn next_args(&mut self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "run".into(),
            "--state".into(),
            self.state.to_str().expect("UTF-8 temp path").into(),
        ];
        args.extend(self.flags.iter().cloned());
        if self.starts == 0 {
            let input = self.h.ids_file("ids.txt", &self.ids);
            args.extend([
                "--input".into(),
                input.to_str().expect("UTF-8 temp path").into(),
                "--url".into(),
                self.h.url(),
            ]);
            args.extend(self.create_flags.iter().cloned());
            self.input = Some(input);
        } else if self.starts % 2 == 1 {
            args.extend(self.alternate_flags.iter().cloned());
        }
        self.starts += 1;
        args
    }

    /// Starts the job (creating it on the first start) and kills it with SIGKILL after a
    /// random number (from `calls_between`) of further calls, then sometimes a few
    /// milliseconds later still, `kills` times or until a start finishes by itself (which
    /// must exit 0 or 3). Returns the number of kills.
    pub fn kill_at_random_points(&mut self, kills: usize, calls_between: Range<u64>) -> usize {
        let mut rng = rand::rng();
        let mut done = 0;
        while done < kills {
            let args = self.next_args();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut child = self.h.spawn(&args);
            let target = self.h.api.total_calls() + rng.random_range(calls_between.clone());
            if !self.h.wait_for_calls(&mut child, target) {
                let run = finish(child);
                assert!(run.code == 0 || run.code == 3, "run ended early: {run:?}");
                break;
            }
            if rng.random_bool(0.5) {
                std::thread::sleep(Duration::from_millis(rng.random_range(0..30)));
            }
            child.kill().expect("SIGKILL the run");
            let status = child.wait().expect("wait for the killed run");
            assert!(
                status.code().is_none(),
                "the run was killed, not exited: {status:?}"
            );
            done += 1;
            self.kills += 1;
        }
        done
    }

    /// One start run to its end (creating the job if it is the first).
    pub fn resume(&mut self) -> Run {
        let args = self.next_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.h.run(&args)
    }

    /// The JSONL export, parsed.
    pub fn export(&self) -> Vec<Value> {
        self.h.export(&self.state)
    }

    /// The export, checked: every ID exactly once, in input order, with the result the fake
    /// API's fault for it calls for.
    #[track_caller]
    pub fn export_exactly_once(&self) -> Vec<Value> {
        let export = self.export();
        self.h.check_export_exactly_once(&export, &self.ids);
        export
    }

    /// `status --json`, parsed.
    pub fn status(&self) -> Value {
        self.h.status(&self.state)
    }
}
