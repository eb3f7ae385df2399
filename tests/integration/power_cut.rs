//! Power cuts: the state directory on a filesystem that loses every write nobody synced
//! ([`LazyFs`]), the power cut at random moments (everything unsynced dropped, the run
//! killed), the job resumed with the same command: every ID exactly once, no resume refused,
//! the job never lost once it made a call, repeated calls bounded by what was in flight, no
//! quota window exceeded. And the files whose durability a sync promises are really synced.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use highwater::demo::api::{ApiConfig, ApiWindow, Fault};
use highwater::engine::max_unsynced_items;
use rand::Rng;

use crate::harness::*;
use crate::lazyfs::LazyFs;

const CONCURRENCY: usize = 16;

/// Where a cut falls: after the API saw this many more calls, or this long after the start.
#[derive(Debug, Clone, Copy)]
enum CutAt {
    Calls(u64),
    Millis(u64),
}

/// One job whose state directory lives on a [`LazyFs`], started with the same command line
/// every time (as a user's script or a supervisor would), and cut.
struct PowerCuts {
    h: Harness,
    fs: LazyFs,
    state: PathBuf,
    args: Vec<String>,
    cuts: usize,
    /// The job's id, once a cut found the job stored.
    job_id: Option<String>,
}

impl PowerCuts {
    fn new(config: ApiConfig, ids: &[String], extra: &[&str]) -> PowerCuts {
        let h = Harness::new(config);
        let fs = LazyFs::mount();
        let state = fs.path().join("state");
        let input = h.ids_file("ids.txt", ids);
        let url = h.url();
        let mut args: Vec<String> = new_job_args(&state, &input, &url)
            .into_iter()
            .map(String::from)
            .collect();
        let concurrency = CONCURRENCY.to_string();
        args.extend(
            [
                "--concurrency",
                &concurrency,
                "--timeout",
                "200ms",
                "--retry-initial",
                "5ms",
                "--retry-max",
                "50ms",
                "--progress-interval",
                "0",
            ]
            .map(String::from),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        PowerCuts {
            h,
            fs,
            state,
            args,
            cuts: 0,
            job_id: None,
        }
    }

    fn spawn(&self, args: &[String]) -> Child {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.h.spawn(&args)
    }

    /// Run `args` and cut the power at `at`; false (and nothing cut) if the run ended first,
    /// which must then be with exit 0 or 3. After the cut: the filesystem holds only what
    /// was synced, and the job, once it made a call, is still there, the same job.
    fn cut(&mut self, args: &[String], at: CutAt) -> bool {
        let calls_before = self.h.api.total_calls();
        let mut child = self.spawn(args);
        let reached = match at {
            CutAt::Calls(n) => self.h.wait_for_calls(&mut child, calls_before + n),
            CutAt::Millis(ms) => {
                let deadline = Instant::now() + Duration::from_millis(ms);
                loop {
                    if child.try_wait().unwrap().is_some() {
                        break false;
                    }
                    if Instant::now() >= deadline {
                        break true;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        if !reached {
            let run = finish(child);
            assert!(run.code == 0 || run.code == 3, "run ended early: {run:?}");
            return false;
        }
        // The power goes: from this instant nothing more reaches the disk.
        self.fs.cut();
        child.kill().expect("SIGKILL the run");
        let status = child.wait().expect("wait for the cut run");
        assert!(status.code().is_none(), "the run was cut, not exited");
        self.fs.remount();
        self.cuts += 1;
        let called = self.h.api.total_calls() > calls_before;
        if called || self.job_id.is_some() {
            // Calls are made only once the job and its first plan are durable.
            let status = self.h.status(&self.state);
            let id = status["job_id"].as_str().expect("a job id").to_string();
            match &self.job_id {
                Some(known) => assert_eq!(&id, known, "the cut replaced the job"),
                None => self.job_id = Some(id),
            }
        }
        true
    }

    /// Cut the job's run at `at` (see [`PowerCuts::cut`]).
    fn cut_run(&mut self, at: CutAt) -> bool {
        let args = self.args.clone();
        self.cut(&args, at)
    }

    /// The job's run to its end.
    fn finish(&self) -> Run {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.h.run(&args)
    }

    /// Repeated calls at most what each cut can have left in flight.
    #[track_caller]
    fn check_repeats(&self, expected_calls: u64) {
        let total = self.h.api.total_calls();
        assert!(
            total >= expected_calls,
            "fewer calls than a clean run needs: {total} < {expected_calls}"
        );
        let repeated = total - expected_calls;
        let bound = (self.cuts * max_unsynced_items(CONCURRENCY)) as u64;
        assert!(
            repeated <= bound,
            "{repeated} repeated calls after {} cuts; bound {bound}",
            self.cuts
        );
        eprintln!(
            "{} cuts, {repeated} repeated calls (bound {bound})",
            self.cuts
        );
    }
}

/// The calls a clean run makes for `id`: one, plus the failing attempts of a transient fault.
fn clean_calls(h: &Harness, id: &str) -> u64 {
    let transient = h.api.config().transient_attempts as u64;
    match h.api.fault(id) {
        Fault::None | Fault::NotFound => 1,
        Fault::Unavailable | Fault::Drop | Fault::Slow | Fault::Throttled => transient + 1,
    }
}

/// What the run asked of the filesystem that the model refuses, less the ID index's hole
/// punching (`fallocate` with PUNCH_HOLE | KEEP_SIZE = 0x3), which the index treats as
/// optional: refused, it keeps the space and changes no data.
fn modelled_or_harmless(fs: &LazyFs) -> Vec<String> {
    fs.unsupported()
        .into_iter()
        .filter(|op| !(op.starts_with("fallocate(") && op.ends_with("mode=0x3)")))
        .collect()
}

/// The faulty API, quick: its slow IDs answer after the runs' `--timeout`, so each of them
/// takes the attempts [`clean_calls`] counts.
fn quick_api() -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(4),
        slow_delay: Duration::from_millis(300),
        ..ApiConfig::faulty()
    }
}

/// Cuts at random moments of a running job (plans, group commits, checkpoints, reopens of
/// the database), then resumed: every ID once, repeats bounded, the job never replaced.
#[test]
fn power_cuts_at_random_moments_keep_every_id_once() {
    let ids = ids(6_000);
    let mut s = PowerCuts::new(
        quick_api(),
        &ids,
        &["--bucket-size", "50", "--store-reopen-after", "64KiB"],
    );
    let mut rng = rand::rng();
    let mut cuts = 0;
    while cuts < 10 {
        let at = CutAt::Calls(rng.random_range(50..700));
        if !s.cut_run(at) {
            break;
        }
        cuts += 1;
    }
    assert!(
        cuts >= 8,
        "only {cuts} cuts before the job finished; make it longer"
    );
    s.finish().expect_code(3);
    s.h.check_export_exactly_once(&s.h.export(&s.state), &ids);
    let unique: HashSet<&String> = ids.iter().collect();
    let expected: u64 = unique.iter().map(|id| clean_calls(&s.h, id)).sum();
    s.check_repeats(expected);
    assert_eq!(s.h.status(&s.state)["finished"], true);
    assert_eq!(
        modelled_or_harmless(&s.fs),
        Vec::<String>::new(),
        "operations the test filesystem does not model"
    );
}

/// A cut in the first moments of a new job (creating the directory, storing the job,
/// planning, the first group commits): the same command resumes it, the job is still there
/// once it made a call, and nothing is called twice beyond what was in flight.
#[test]
fn a_cut_in_the_first_second_of_a_new_job_keeps_the_job() {
    let mut rng = rand::rng();
    for round in 0..6 {
        let ids = ids(3_000);
        let mut s = PowerCuts::new(quick_api(), &ids, &["--bucket-size", "20"]);
        // Some cuts by time from the start (before any call, during planning), some by calls.
        let at = if round % 2 == 0 {
            CutAt::Millis(rng.random_range(0..400))
        } else {
            CutAt::Calls(rng.random_range(1..200))
        };
        let cut = s.cut_run(at);
        eprintln!("round {round}: cut at {at:?}: {cut}");
        s.finish().expect_code(3);
        s.h.check_export_exactly_once(&s.h.export(&s.state), &ids);
        let unique: HashSet<&String> = ids.iter().collect();
        let expected: u64 = unique.iter().map(|id| clean_calls(&s.h, id)).sum();
        s.check_repeats(expected);
    }
}

/// A cut right after the run reserved calls from a quota window: the resumed run does not
/// spend the reservation again, so the window is never exceeded (counted by the server).
#[test]
fn a_cut_after_a_quota_reservation_does_not_exceed_the_window() {
    let config = ApiConfig {
        windows: vec![ApiWindow {
            limit: 40,
            length: Duration::from_secs(4),
        }],
        latency_min: Duration::from_millis(1),
        latency_max: Duration::from_millis(1),
        ..ApiConfig::fast()
    };
    let ids = ids(120);
    let mut s = PowerCuts::new(config, &ids, &["--quota", "40/4s"]);
    let mut rng = rand::rng();
    // Cut within the first calls of a window's reservation, twice.
    for _ in 0..2 {
        let at = CutAt::Calls(rng.random_range(1..30));
        s.cut_run(at);
    }
    s.finish().expect_code(0);
    assert_eq!(s.h.api.window_refusals(), 0, "a window was exceeded");
    assert!(
        s.h.api.window_peaks()[0] <= 40,
        "{:?}",
        s.h.api.window_peaks()
    );
    s.h.check_export_exactly_once(&s.h.export(&s.state), &ids);
}

/// A rerun of the failed IDs cut part way (its record, plan and commits), then run again
/// with the same command: it resumes, every ID ends exactly once, only failed IDs called.
#[test]
fn a_cut_rerun_resumes_and_ends_exactly_once() {
    let ids = ids(1_500);
    let config = ApiConfig {
        unavailable_per_mille: 300,
        transient_attempts: 2,
        seed: 11,
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(2),
        ..ApiConfig::fast()
    };
    let mut s = PowerCuts::new(
        config,
        &ids,
        &["--max-attempts", "1", "--bucket-size", "50"],
    );
    s.finish().expect_code(3);
    let failed: Vec<String> =
        s.h.export(&s.state)
            .into_iter()
            .filter(|r| r["status"] == "failed")
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
    assert!(failed.len() > 100, "{} failed", failed.len());
    let before = s.h.api.calls_snapshot();
    let rerun: Vec<String> = [
        "rerun",
        "--state",
        p(&s.state),
        "--failed",
        "--concurrency",
        "4",
        "--max-attempts",
        "5",
        "--retry-initial",
        "5ms",
        "--retry-max",
        "20ms",
        "--progress-interval",
        "0",
        // Every ID of the rerun answers 503 at first: without this, adaptive control takes
        // that for overload and crawls.
        "--adaptive",
        "off",
    ]
    .map(String::from)
    .to_vec();
    let mut rng = rand::rng();
    let mut cuts = 0;
    for _ in 0..3 {
        if !s.cut(
            &rerun,
            CutAt::Calls(rng.random_range(5..(failed.len() as u64 / 3))),
        ) {
            break;
        }
        cuts += 1;
    }
    assert!(cuts >= 1, "the rerun ended before any cut");
    let args: Vec<&str> = rerun.iter().map(String::as_str).collect();
    s.h.run(&args).expect_code(0);
    let after = s.h.api.calls_snapshot();
    let called: BTreeMap<&String, u64> = after
        .iter()
        .filter_map(|(id, n)| {
            let was = before.get(id).copied().unwrap_or(0);
            (*n > was).then_some((id, n - was))
        })
        .collect();
    let failed_set: HashSet<&String> = failed.iter().collect();
    for id in called.keys() {
        assert!(failed_set.contains(id), "{id} was ok and called again");
    }
    s.h.check_export_exactly_once(&s.h.export(&s.state), &ids);
    assert_eq!(s.h.status(&s.state)["stats"]["failed"], 0);
}

/// Every file whose durability a sync promises is synced with a real fsync or fdatasync (the
/// test filesystem sees the calls), and the directories holding new entries are synced.
#[test]
fn a_run_syncs_every_file_a_sync_promises() {
    let ids = ids(2_000);
    let s = PowerCuts::new(quick_api(), &ids, &["--bucket-size", "100"]);
    s.finish().expect_code(3);
    let syncs = s.fs.syncs();
    // The marker is written through a temp file and a rename: its data is synced under the
    // temp name, and the rename is durable with the directory's sync checked below.
    for file in [
        "results.log",
        "positions",
        "ids.idx",
        "ids.log",
        "sled/db",
        "sled/conf",
        "history.log",
    ] {
        let c = syncs.of(Path::new("state").join(file));
        assert!(
            c.fsync + c.fdatasync > 0,
            "{file} was never synced: {syncs:?}"
        );
    }
    // The mount's root holds the new state directory; the state directory holds the files.
    for dir in ["", "state", "state/sled"] {
        assert!(
            syncs.of(dir).fsyncdir > 0,
            "directory {dir:?} was never synced: {syncs:?}"
        );
    }
}
