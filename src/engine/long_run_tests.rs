//! A 36-hour job in simulated time: two workers of a fleet (the in-memory store) against the
//! fake API, on a current-thread runtime whose tokio clock is paused, so the job's hours pass
//! as fast as the runtime has nothing to do. The run and the API read one
//! [`SimulatedClock`], which starts at noon UTC.
//!
//! What the hours bring, and what is checked of each:
//!
//! - an OAuth2 token that lives an hour: renewed once per lifetime (never sooner than its
//!   lifetime less the renewal margin after the one before), and never used expired (no 401);
//! - the API's quota windows, which the job keeps as its own quotas: 1000 calls a day (a
//!   day ends at midnight UTC) and 600 every 7 hours (aligned on the Unix epoch, so one of
//!   them crosses midnight): the API refuses no call for a window, the day's calls stop once
//!   its 1000 are spent and start again just after midnight UTC;
//! - a ten-minute outage of the API (and its token endpoint): ridden through, no ID fails;
//! - the wall clock jumping 30 minutes forward across a window's boundary, then back;
//! - a worker whose call is held for two hours while its session expires: another worker
//!   takes the bucket over, and the held worker's late result is fenced, not exported;
//! - every ID exported exactly once.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use crate::clock::{Clock, SimulatedClock};
use crate::credential::oauth2::{ClientAuth, OAuth2Config, OAuth2Source};
use crate::credential::{Credential, CredentialSource, MAX_EXPIRY_MARGIN};
use crate::demo::api::{ApiConfig, ApiWindow, FakeApi, CLIENT_ID, CLIENT_SECRET};
use crate::engine::{run, stop_pair};
use crate::failure::Failure;
use crate::handler::http::HttpHandler;
use crate::handler::{Credentials, Handler, Output};
use crate::progress::Counters;
use crate::quota::pacer::AnnouncedLimits;
use crate::spec::RunOptions;
use crate::store::mem::SharedMem;
use crate::store::{ItemStatus, JobView, Store};
use crate::throttle::{Rate, ThrottleOptions};

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

/// 2027-01-01T12:00:00Z, in Unix ms.
const NOON_MS: u64 = 1_798_804_800_000;

/// The job's IDs: two full days of quota and a little more for the third.
const IDS: usize = 2050;

/// How long a token lives.
const TOKEN_LIFE: Duration = HOUR;

/// A handler that, once armed, holds the answer of its next call for [`HELD_FOR`] before
/// returning it (a worker paused mid-call: a stop signal, a long GC, a suspended VM).
struct Pausing {
    inner: Arc<HttpHandler>,
    armed: AtomicBool,
    /// The ID whose answer was held, and when (Unix ms) it was returned at last.
    held: Mutex<Option<(String, Option<u64>)>>,
    clock: Clock,
}

/// How long the paused worker holds its call's answer.
const HELD_FOR: Duration = Duration::from_secs(2 * 3600);

impl Handler for Pausing {
    async fn call(&self, id: &str) -> Result<Output, Failure> {
        let answer = self.inner.call(id).await;
        if self.armed.swap(false, SeqCst) {
            *self.held.lock().unwrap() = Some((id.to_string(), None));
            tokio::time::sleep(HELD_FOR).await;
            *self.held.lock().unwrap() = Some((id.to_string(), Some(self.clock.now_ms())));
        }
        answer
    }

    fn announced_limits(&self) -> Option<Arc<AnnouncedLimits>> {
        self.inner.announced_limits()
    }
}

/// The calls the API received (every attempt, a repeat included) by tokio's `at`.
fn calls_by(api: &FakeApi, at: Instant) -> usize {
    let at = at.into_std();
    api.call_times().iter().filter(|&&t| t < at).count()
}

/// The most real time the simulated job may take. It takes seconds; a run whose simulated
/// time stops advancing (something waits on the real clock, or spins in steps too small to
/// reach the simulated deadline) would otherwise hang the test run instead of failing.
const REAL_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(240);

#[test]
fn thirty_six_hours_of_a_job_in_simulated_time() {
    let (done, finished) = std::sync::mpsc::channel();
    let job = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime");
        runtime.block_on(thirty_six_hours());
        let _ = done.send(());
    });
    match finished.recv_timeout(REAL_TIME_LIMIT) {
        // Sent after the checks passed; or the thread ended without sending: it panicked.
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = job.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
            "the simulated 36 hours took over {REAL_TIME_LIMIT:?} of real time: \
             simulated time stopped advancing"
        ),
    }
}

async fn thirty_six_hours() {
    let real_start = std::time::Instant::now();
    let t0 = Instant::now();
    let sim = SimulatedClock::starting_at_ms(NOON_MS);
    let clock = Clock::from(sim.clone());
    let api = FakeApi::start_with_clock(
        ApiConfig {
            latency_min: Duration::from_millis(20),
            latency_max: Duration::from_millis(80),
            windows: vec![
                ApiWindow {
                    limit: 1000,
                    length: 24 * HOUR,
                },
                ApiWindow {
                    limit: 600,
                    length: 7 * HOUR,
                },
            ],
            ..ApiConfig::fast()
        },
        clock.clone(),
    )
    .await
    .unwrap();
    api.require_token(TOKEN_LIFE);

    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..IDS).map(|n| format!("id-{n:05}")).collect();
    let input = dir.path().join("ids.txt");
    std::fs::write(&input, ids.join("\n")).unwrap();
    let shared = SharedMem::new();
    let (a, b) = (Arc::new(shared.worker()), Arc::new(shared.worker()));
    let mut spec = super::tests::url_job(&*a, input, api.url_template(), 50).await;
    spec.quotas = vec!["1000/day".parse().unwrap(), "600/7h".parse().unwrap()];
    let mut request = spec.work.request().unwrap().clone();
    request
        .headers
        .push("Authorization: Bearer ${TOKEN}".into());
    if let crate::spec::Work::Request(r) = &mut spec.work {
        *r = request.clone();
    }
    a.put_job(&spec.to_stored()).await.unwrap();
    let spec = Arc::new(spec);

    // One token for the fleet's two workers, as one process's workers share it.
    let source = OAuth2Source::new(
        OAuth2Config {
            token_url: api.token_url(),
            client_id: CLIENT_ID.into(),
            client_secret: CLIENT_SECRET.into(),
            scope: None,
            client_auth: ClientAuth::Basic,
        },
        Duration::from_secs(5),
        Duration::from_secs(5),
    )
    .unwrap();
    let token = Arc::new(Credential::new(
        "TOKEN",
        CredentialSource::OAuth2(source),
        None,
    ));
    let credentials = Credentials::from_list(vec![token], false);
    let http = Arc::new(
        HttpHandler::with_credentials(&request, credentials, &|_| None)
            .unwrap()
            .with_clock(clock.clone()),
    );
    let pausing = Arc::new(Pausing {
        inner: http.clone(),
        armed: AtomicBool::new(false),
        held: Mutex::new(None),
        clock: clock.clone(),
    });
    let options = RunOptions {
        concurrency: 2,
        progress_interval: Duration::ZERO,
        history_interval: Duration::ZERO,
        throttle: ThrottleOptions {
            // 100 calls an hour for the fleet: the windows, not the rate, end each day.
            rate: Rate::new(100.0 / 3600.0),
            adaptive: false,
            // A controller with nothing to adapt (a fixed rate) ticks slowly: 36 hours of
            // ticks and fleet reads cost real time, even paused.
            tick: Duration::from_secs(4),
            ..ThrottleOptions::default()
        },
        clock: clock.clone(),
        ..RunOptions::default()
    };

    let run_a = tokio::spawn({
        let (store, spec, options) = (a.clone(), spec.clone(), options.clone());
        let handler = pausing.clone();
        async move {
            let counters = Arc::new(Counters::default());
            run(store, spec, handler, &options, counters, stop_pair().1).await
        }
    });
    let run_b = tokio::spawn({
        let (store, spec, options) = (b.clone(), spec.clone(), options.clone());
        let handler = http.clone();
        async move {
            let counters = Arc::new(Counters::default());
            run(store, spec, handler, &options, counters, stop_pair().1).await
        }
    });

    // 14:00 to 14:10: the API is out.
    sleep_until(t0 + 2 * HOUR).await;
    api.set_down(true).await;
    sleep_until(t0 + 2 * HOUR + 10 * MINUTE).await;
    api.set_down(false).await;
    // 17:45: the wall clock jumps to 18:15, into the next 7-hour window; at 19:00 it is set
    // back to the right time.
    sleep_until(t0 + 5 * HOUR + 45 * MINUTE).await;
    sim.jump_forward(30 * MINUTE);
    sleep_until(t0 + 7 * HOUR).await;
    sim.jump_back(30 * MINUTE);
    // 20:00: worker A's next call is held two hours; a minute in, its session expires (its
    // heartbeats would have stopped with it).
    sleep_until(t0 + 8 * HOUR).await;
    pausing.armed.store(true, SeqCst);
    let held = loop {
        if let Some((id, _)) = pausing.held.lock().unwrap().clone() {
            break id;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    tokio::time::sleep(MINUTE).await;
    a.expire();

    // A job that does not end by the middle of its third day fails here, in simulated time,
    // rather than running on.
    let deadline = t0 + 40 * HOUR;
    let summary_a = tokio::time::timeout_at(deadline, run_a).await;
    let summary_b = tokio::time::timeout_at(deadline, run_b).await;
    let summary_a = summary_a.expect("worker A still running at 04:00 of day 3");
    let summary_b = summary_b.expect("worker B still running at 04:00 of day 3");
    let (summary_a, summary_b) = (summary_a.unwrap().unwrap(), summary_b.unwrap().unwrap());
    let finished = Instant::now();
    let real = real_start.elapsed();

    // The windows: the API refused no call for them; day 1 (noon to midnight) spent its
    // 1000 and called nothing in its last hour, day 2 spent its 1000 too, and the calls
    // started again just after midnight UTC.
    assert_eq!(api.window_refusals(), 0, "the job exceeded a window");
    let midnight = t0 + 12 * HOUR;
    let day_1 = calls_by(&api, midnight);
    let day_2 = calls_by(&api, midnight + 24 * HOUR) - day_1;
    assert!(day_1 <= 1000 && day_1 > 950, "day 1: {day_1} calls");
    assert!(day_2 <= 1000 && day_2 > 950, "day 2: {day_2} calls");
    assert_eq!(
        calls_by(&api, midnight - HOUR),
        day_1,
        "calls in day 1's last hour, its quota spent"
    );
    assert!(
        calls_by(&api, midnight + 15 * MINUTE) > day_1,
        "no call in the first quarter hour of day 2"
    );
    assert!(
        calls_by(&api, midnight + 24 * HOUR + 15 * MINUTE) > day_1 + day_2,
        "no call in the first quarter hour of day 3"
    );

    // The job ended in its third day, every ID answered.
    assert!(summary_b.job.finished(), "{:?}", summary_b.job);
    assert!(summary_a.halted.is_none() && summary_b.halted.is_none());
    let ran = finished - t0;
    assert!(ran > 36 * HOUR && ran < 37 * HOUR, "the job took {ran:?}");
    let stats = b.stats().await.unwrap();
    assert_eq!(
        (stats.ok, stats.failed),
        (IDS as u64, 0),
        "the outage failed no ID"
    );

    // Every ID exported exactly once, in input order.
    let mut exported = Vec::new();
    b.for_each_final(&mut |id, record| {
        assert_eq!(record.status, ItemStatus::Ok, "{id}");
        exported.push(id.to_string());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(exported, ids, "every ID once, in input order");

    // The token: renewed once per lifetime, never used expired.
    assert_eq!(
        api.refused_401(),
        0,
        "a request went out with an expired token"
    );
    let issued = api.token_issue_times();
    let due = TOKEN_LIFE - (TOKEN_LIFE / 10).min(MAX_EXPIRY_MARGIN);
    for pair in issued.windows(2) {
        assert!(
            pair[1] - pair[0] >= due - Duration::from_secs(1),
            "a token renewed {:?} after the one before, sooner than its lifetime allows",
            pair[1] - pair[0]
        );
    }
    assert!(
        issued.len() >= 20,
        "{} tokens in 36 hours of hourly tokens",
        issued.len()
    );

    // The held call's late answer was fenced; the ID was called again by the other worker
    // and kept once.
    assert!(a.fenced() >= 1, "the expired worker's late result was kept");
    assert_eq!(
        api.calls(&held),
        2,
        "{held}: its call and the other worker's"
    );
    let returned_ms = pausing.held.lock().unwrap().clone().and_then(|(_, at)| at);
    let kept = b.item(&held).await.unwrap().unwrap();
    assert!(
        returned_ms.is_some() && kept.finished_at_ms < returned_ms,
        "{held}: the result kept is the held call's, returned at {returned_ms:?} ({kept:?})"
    );

    eprintln!("{ran:?} of the job in {real:?} of real time");
}
