//! Quotas over windows longer than a second, and the job's budget: kept across a kill and a
//! resume, a spent window pausing the job (and saying until when), a spent budget stopping
//! it cleanly, counted by the server.

use std::time::{Duration, Instant};

use highwater::demo::api::{Announce, ApiConfig, ApiWindow};

use crate::harness::*;

fn fast_with_latency(ms: u64) -> ApiConfig {
    ApiConfig {
        latency_min: Duration::from_millis(ms),
        latency_max: Duration::from_millis(ms),
        ..ApiConfig::fast()
    }
}

/// A budget stops the job cleanly (exit 5, every finished result kept, no ID failed); a
/// larger one continues it from where it stopped; every ID ends up exactly once.
#[test]
fn a_spent_budget_stops_the_job_and_a_larger_one_continues_it() {
    let h = Harness::new(fast_with_latency(1));
    let ids = ids(120);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let run = h.run_new(&state, &input, &h.url(), &["--quota", "50/job"]);
    run.expect_code(5).expect_stderr("budget");
    assert!(h.api.total_calls() <= 50, "{} calls", h.api.total_calls());
    let done = h.export(&state);
    assert!(done.iter().all(|r| r["status"] == "ok"), "no ID failed");
    assert!(
        done.len() >= 40 && done.len() <= 50,
        "{} results",
        done.len()
    );
    // The same budget again: nothing left to spend, nothing called.
    let calls = h.api.total_calls();
    h.resume(&state, &[]).expect_code(5);
    assert_eq!(h.api.total_calls(), calls);
    // Raised: the job goes on and finishes.
    h.resume(&state, &["--quota", "200/job"]).expect_code(0);
    assert!(h.api.total_calls() <= 200);
    h.check_export_exactly_once(&h.export(&state), &ids);
    let status = h.status(&state);
    let history = status.to_string();
    assert!(
        history.contains("quotas changed from 50/job to 200/job"),
        "{history}"
    );
    let used = status["quotas"][0]["used"].as_u64().unwrap();
    assert!((120..=200).contains(&used), "{status}");
    // `none` removes the quotas; with another quota it is refused.
    h.resume(&state, &["--quota", "none", "--quota", "5/h"])
        .expect_refused(2, &["--quota none"]);
    h.resume(&state, &["--quota", "none"]).expect_code(0);
    assert_eq!(h.status(&state)["quotas"], serde_json::json!([]));
}

/// A window spent mid-job (a daily quota, shortened to seconds) pauses the job: no ID fails
/// and no attempt is spent while it waits, `status` says which window and until when, and
/// the job finishes once the window frees calls.
#[test]
fn a_spent_window_pauses_the_job_and_status_says_until_when() {
    let h = Harness::new(fast_with_latency(1));
    let ids = ids(90);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(["--quota", "40/4s", "--progress-interval", "100ms"]);
    let mut child = h.spawn(&args);
    let deadline = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        assert!(
            Instant::now() < deadline,
            "status never said the quota was spent"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the job ended before its window was spent"
        );
        let out = h.run(&["status", "--state", p(&state)]);
        if out.stdout.contains("spent until") {
            break out.stdout;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(seen.contains("quota 40/4s"), "{seen}");
    let run = finish(child);
    run.expect_code(0);
    let export = h.export(&state);
    h.check_export_exactly_once(&export, &ids);
    assert!(
        export.iter().all(|r| r["attempts"] == 1),
        "no attempt spent waiting"
    );
    assert_eq!(h.api.total_calls(), 90);
}

/// The API of the issue: 50 calls per 2 s and 200 per 10 s, fixed windows on the epoch,
/// answering 429 above either.
fn windowed(announce: Announce) -> ApiConfig {
    ApiConfig {
        windows: vec![
            ApiWindow {
                limit: 50,
                length: Duration::from_secs(2),
            },
            ApiWindow {
                limit: 200,
                length: Duration::from_secs(10),
            },
        ],
        announce,
        ..fast_with_latency(2)
    }
}

/// Run `ids` against `h`'s API with `extra`, returning the calls per second the run made
/// between its first and its last call, and the run.
fn calls_per_second(h: &Harness, ids: &[String], extra: &[&str]) -> (f64, Run) {
    let input = h.ids_file("ids.txt", ids);
    let state = h.state();
    let run = h.run_new(&state, &input, &h.url(), extra);
    run.expect_code(0);
    h.check_export_exactly_once(&h.export(&state), ids);
    let times = h.api.call_times();
    let span = (*times.last().unwrap() - times[0]).as_secs_f64();
    ((times.len() - 1) as f64 / span, run)
}

/// Without any flag, the windows announced in headers pace the run: at least 95% of what
/// the windows allow (20 calls/s over the run), at most 1% of answers 429, no ID failed.
#[test]
fn announced_windows_pace_the_run_to_what_they_allow() {
    for announce in [Announce::Ietf, Announce::XRateLimit] {
        let h = Harness::new(windowed(announce));
        let ids = ids(400);
        let (speed, run) = calls_per_second(
            &h,
            &ids,
            &["--concurrency", "16", "--progress-interval", "2s"],
        );
        // The progress lines say what the API announced.
        let policy = match announce {
            Announce::Ietf => "API limit w1: ",
            _ => "API limit x-ratelimit: ",
        };
        run.expect_stderr(policy);
        let refused = h.api.window_refusals();
        let calls = h.api.total_calls();
        assert!(
            speed >= 0.95 * 20.0,
            "{announce:?}: {speed:.2} calls/s of 20 allowed"
        );
        assert!(
            refused * 100 <= calls,
            "{announce:?}: {refused} of {calls} answers 429"
        );
        let peaks = h.api.window_peaks();
        assert!(peaks[0] <= 50 && peaks[1] <= 200, "{peaks:?}");
    }
}

/// The same windows given as flags, the API announcing nothing: not one 429.
#[test]
fn windows_given_as_quotas_meet_no_429_at_all() {
    let h = Harness::new(windowed(Announce::None));
    let ids = ids(300);
    let (speed, _) = calls_per_second(
        &h,
        &ids,
        &[
            "--concurrency",
            "16",
            "--quota",
            "50/2s",
            "--quota",
            "200/10s",
        ],
    );
    assert_eq!(h.api.window_refusals(), 0);
    assert_eq!(h.api.total_calls(), 300);
    assert!(speed > 10.0, "{speed:.2} calls/s");
}

/// Killed with SIGKILL in the middle of a window and resumed at once: the resumed run does
/// not exceed the window the killed one had spent part of (its usage is stored).
#[test]
fn a_resume_after_a_kill_keeps_to_the_window_the_killed_run_used() {
    let h = Harness::new(ApiConfig {
        windows: vec![ApiWindow {
            limit: 40,
            length: Duration::from_secs(4),
        }],
        ..fast_with_latency(1)
    });
    let ids = ids(120);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(["--quota", "40/4s"]);
    for kill_at in [10, 55] {
        let mut child = h.spawn(&args);
        if h.wait_for_calls(&mut child, kill_at) {
            signal(&child, libc::SIGKILL);
        }
        let _ = child.wait();
    }
    h.resume(&state, &[]).expect_code(0);
    assert_eq!(h.api.window_refusals(), 0, "a window was exceeded");
    assert!(h.api.window_peaks()[0] <= 40);
    h.check_export_exactly_once(&h.export(&state), &ids);
}

/// Windows nobody announces are learnt from the API's refusals: the progress lines say what
/// was learnt and from how many refusals, and refusals stay a few of the calls (unlearnt,
/// a run met one 429 in nine); every ID is exported exactly once.
#[test]
fn windows_nobody_announces_are_learnt_from_the_refusals() {
    let h = Harness::new(ApiConfig {
        windows: vec![ApiWindow {
            limit: 30,
            length: Duration::from_secs(1),
        }],
        ..fast_with_latency(2)
    });
    let ids = ids(300);
    let (_, run) = calls_per_second(
        &h,
        &ids,
        &["--concurrency", "16", "--progress-interval", "1s"],
    );
    run.expect_stderr("API limit learnt from ");
    let refused = h.api.window_refusals();
    let calls = h.api.total_calls();
    assert!(refused * 20 <= calls, "{refused} of {calls} answers 429");
}

/// A window learnt from refusals is kept with the job: killed with SIGKILL once it paced
/// the run for a few windows, the resumed run paces by it from its first call (it says so)
/// instead of learning it again through a burst of 429s; `status` says what the job learnt
/// and from how many refusals.
#[test]
fn a_resume_paces_by_the_windows_the_killed_run_learnt() {
    let h = Harness::new(ApiConfig {
        windows: vec![ApiWindow {
            limit: 20,
            length: Duration::from_secs(2),
        }],
        ..fast_with_latency(2)
    });
    let ids = ids(240);
    let input = h.ids_file("ids.txt", &ids);
    let state = h.state();
    let url = h.url();
    let mut args = new_job_args(&state, &input, &url);
    args.extend(["--concurrency", "8"]);
    // Started as one of the API's windows begins: a run starting inside a window reads
    // its first one short (its length from the first call to the boundary) and may learn
    // half a window (the learner's known limit; not what this test is about).
    let epoch_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    while epoch_ms() % 2000 > 20 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut child = h.spawn(&args);
    // Learnt (two refusals at least), then 50 calls accepted: the API lets 20 through per
    // window, so they span two of its windows whole, while the run keeps what it learnt
    // every second.
    let deadline = Instant::now() + Duration::from_secs(120);
    while h.api.window_refusals() < 2 {
        assert!(Instant::now() < deadline, "no refusal to learn from");
        assert!(child.try_wait().unwrap().is_none(), "the run ended first");
        std::thread::sleep(Duration::from_millis(2));
    }
    let learnt_at = h.api.accepted();
    while h.api.accepted() < learnt_at + 50 {
        assert!(Instant::now() < deadline, "no progress after learning");
        assert!(child.try_wait().unwrap().is_none(), "the run ended first");
        std::thread::sleep(Duration::from_millis(2));
    }
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
    let resumed_at = Instant::now();
    let resumed = h.resume(&state, &[]);
    resumed.expect_code(0);
    resumed.expect_stderr("pacing by an API limit the job learnt before: ");
    // Its first two windows meet one refusal at most: a learnt window's phase and length
    // are only as exact as the API's whole-second Retry-After, so its boundary may fall a
    // little off the API's. (A run learning the window again sends a burst: 7 or 8.)
    let early = h
        .api
        .window_refusal_times()
        .into_iter()
        .filter(|&t| t > resumed_at && t < resumed_at + Duration::from_secs(4))
        .count();
    assert!(
        early <= 1,
        "{early} refusals in the resumed run's first 4 s: it learnt the window again"
    );
    h.check_export_exactly_once(&h.export(&state), &ids);
    let status = h.status(&state);
    let learnt = &status["learned_limits"][0];
    assert!(
        learnt["limit"]
            .as_u64()
            .is_some_and(|l| (15..=22).contains(&l)),
        "{status}"
    );
    // Its length as the refusals' whole-second Retry-Afters let it be read (each boundary
    // up to a second late).
    assert!(
        learnt["length_ms"]
            .as_u64()
            .is_some_and(|l| (1500..=3100).contains(&l)),
        "{status}"
    );
    assert!(
        learnt["refusals"].as_u64().is_some_and(|r| r >= 2),
        "{status}"
    );
    let text = h.run(&["status", "--state", p(&state)]);
    text.expect_code(0);
    assert!(
        text.stdout.contains("learnt:     API limit ") && text.stdout.contains(" refusals"),
        "{}",
        text.stdout
    );
}
