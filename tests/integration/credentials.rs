//! Credentials that renew themselves: an API whose tokens live 3 s, a job of 30 s and more,
//! every ID ok once, the credential renewed about once per token lifetime (not per request),
//! and the token in no file of the state, no log line at `-vv`, no export. A revoked client
//! secret stops the job (exit 4, nothing failed); restored, a resume finishes it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use highwater::demo::api::{ApiConfig, Fault, CLIENT_ID, CLIENT_SECRET};

use crate::harness::{files_under, ids, p, Harness, Run, QUICK};

/// How long the API's tokens live.
const LIFETIME: Duration = Duration::from_secs(3);
/// IDs and rate of a job that lasts 30 s.
const IDS: usize = 600;
const RATE: &str = "20";

fn api() -> Harness {
    let h = Harness::new(ApiConfig::fast());
    h.api.require_token(LIFETIME);
    h
}

/// `run` flags creating a job of `ids` against the API with a bearer token `${TOKEN}`.
fn job_args(h: &Harness, input: &Path, credential: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--state",
        p(&h.state()),
        "--input",
        p(input),
        "--url",
        &h.url(),
        "--header",
        "Authorization: Bearer ${TOKEN}",
        "--rate",
        RATE,
        "--concurrency",
        "4",
        "-vv",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(QUICK.iter().map(|s| s.to_string()));
    args.extend(credential.iter().cloned());
    args
}

/// The flags of an OAuth2 credential `TOKEN` from the fake API's token endpoint.
fn oauth2(h: &Harness) -> Vec<String> {
    vec![
        "--credential-oauth2".into(),
        format!("TOKEN={}", h.api.token_url()),
        "--oauth2-client-id".into(),
        CLIENT_ID.into(),
        "--oauth2-client-secret".into(),
        "${CLIENT_SECRET}".into(),
        "--oauth2-scope".into(),
        "items:read".into(),
    ]
}

fn run_with_secret(h: &Harness, args: &[String]) -> Run {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    h.run_env(&args, &[("CLIENT_SECRET", CLIENT_SECRET)], &[])
}

/// Renewals of a job of `elapsed` with tokens of [`LIFETIME`]: about one per lifetime,
/// nowhere near one per request.
#[track_caller]
fn assert_renewals_per_lifetime(renewals: u64, elapsed: Duration) {
    let lifetimes = elapsed.as_secs_f64() / LIFETIME.as_secs_f64();
    eprintln!("{renewals} renewals in {elapsed:?} of tokens living {LIFETIME:?}");
    assert!(
        renewals as f64 >= lifetimes / 2.0 && renewals as f64 <= 2.0 * lifetimes + 2.0,
        "{renewals} renewals in {elapsed:?} of tokens living {LIFETIME:?}"
    );
}

/// No token the API issued or saw, nor the client secret, in any file of the state, in the
/// runs' output, in the export or in `status`.
#[track_caller]
fn assert_no_secret(h: &Harness, runs: &[&Run]) {
    let mut secrets = h.api.tokens();
    assert!(!secrets.is_empty(), "the API saw tokens");
    secrets.push(CLIENT_SECRET.to_string());
    let export = h.run(&["export", "--state", p(&h.state())]);
    let status = h.run(&["status", "--state", p(&h.state()), "--json"]);
    let mut texts: Vec<(String, Vec<u8>)> = vec![
        ("export".into(), export.stdout.into_bytes()),
        ("status".into(), status.stdout.into_bytes()),
    ];
    for run in runs {
        texts.push(("stdout".into(), run.stdout.clone().into_bytes()));
        texts.push(("stderr".into(), run.stderr.clone().into_bytes()));
    }
    for file in files_under(&h.state()) {
        texts.push((file.display().to_string(), std::fs::read(&file).unwrap()));
    }
    for (place, bytes) in &texts {
        for secret in &secrets {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "a secret is in {place}");
        }
    }
}

/// Every ID ok exactly once, none failed.
#[track_caller]
fn assert_all_ok(h: &Harness, ids: &[String]) {
    let export = h.export(&h.state());
    h.check_export_exactly_once(&export, ids);
    let status = h.status(&h.state());
    assert_eq!(status["stats"]["failed"], 0, "{status}");
}

#[test]
fn an_oauth2_token_is_renewed_before_it_expires_through_a_30_second_job() {
    let h = api();
    let ids = ids(IDS);
    let input = h.ids_file("ids.txt", &ids);
    let started = Instant::now();
    let run = run_with_secret(&h, &job_args(&h, &input, &oauth2(&h)));
    let elapsed = started.elapsed();
    run.expect_code(0);
    assert!(
        elapsed >= Duration::from_secs(29),
        "the job lasted {elapsed:?}"
    );
    assert_all_ok(&h, &ids);
    assert_renewals_per_lifetime(h.api.tokens_issued(), elapsed);
    assert_no_secret(&h, &[&run]);
}

/// A script printing a token the fake API accepts, counting its runs in `runs`.
fn token_script(h: &Harness) -> (PathBuf, PathBuf) {
    let runs = h.path("token-runs");
    let script = format!(
        "n=$(cat '{runs}' 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > '{runs}'\necho '{prefix}'$n\n",
        runs = runs.display(),
        prefix = h.api.command_token_prefix(),
    );
    (h.file("token.sh", script), runs)
}

fn count(path: &Path) -> u64 {
    std::fs::read_to_string(path).map_or(0, |t| t.trim().parse().expect("a count"))
}

#[test]
fn a_command_token_is_renewed_when_the_api_refuses_it_through_a_30_second_job() {
    let h = api();
    let ids = ids(IDS);
    let input = h.ids_file("ids.txt", &ids);
    let (script, runs) = token_script(&h);
    let credential = vec![
        "--credential-command".to_string(),
        format!("TOKEN=sh {}", p(&script)),
    ];
    let started = Instant::now();
    let run = run_with_secret(&h, &job_args(&h, &input, &credential));
    let elapsed = started.elapsed();
    run.expect_code(0);
    assert!(
        elapsed >= Duration::from_secs(29),
        "the job lasted {elapsed:?}"
    );
    assert_all_ok(&h, &ids);
    // Renewed on 401 only: once per lifetime, however many requests were refused.
    assert_renewals_per_lifetime(count(&runs), elapsed);
    assert!(h.api.refused_401() > 0, "the tokens expired under the job");
    assert_no_secret(&h, &[&run]);
}

/// The exec job's program: checks `$TOKEN` against the API's ledger of issued tokens (exit
/// 77, "credential refused", when it is missing or expired), then prints its result.
const CHECK_TOKEN: &str = r#"line=$(grep "^$TOKEN " "$1") || exit 77
expiry=${line#* }
now=$(date +%s%3N)
[ "$now" -lt "$expiry" ] || exit 77
printf '{"id":"%s"}\n' "$2"
"#;

#[test]
fn an_exec_job_gets_a_fresh_token_in_its_environment_through_a_30_second_job() {
    let h = api();
    let ids: Vec<String> = (0..IDS).map(|i| format!("id-{i:06}")).collect();
    let input = h.ids_file("ids.txt", &ids);
    let ledger = h.path("tokens.txt");
    h.api.write_tokens_to(ledger.clone());
    let program = h.file("check.sh", CHECK_TOKEN);
    let state = h.state();
    let command = format!("sh {} {} {{id}}", p(&program), p(&ledger));
    let mut args = vec![
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--exec",
        &command,
        "--rate",
        RATE,
        "--concurrency",
        "4",
        "-vv",
    ];
    args.extend(QUICK);
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.extend(oauth2(&h));
    let started = Instant::now();
    let run = run_with_secret(&h, &args);
    let elapsed = started.elapsed();
    run.expect_code(0);
    assert!(
        elapsed >= Duration::from_secs(29),
        "the job lasted {elapsed:?}"
    );
    let export = h.export(&h.state());
    assert_eq!(export.len(), ids.len());
    for (record, id) in export.iter().zip(&ids) {
        assert_eq!(record["status"], "ok", "{record}");
        assert_eq!(record["body"], serde_json::json!({ "id": id }), "{record}");
    }
    assert_renewals_per_lifetime(h.api.tokens_issued(), elapsed);
    assert_no_secret(&h, &[&run]);
}

#[test]
fn a_revoked_client_secret_stops_the_job_with_nothing_failed_and_a_resume_finishes_it() {
    let h = api();
    let ids = ids(300);
    let input = h.ids_file("ids.txt", &ids);
    let args = job_args(&h, &input, &oauth2(&h));
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    // Its -vv log goes to a file: a pipe nobody reads while the job runs would fill up.
    let (out, err) = (h.path("stopped.out"), h.path("stopped.err"));
    let mut child = h
        .cmd(&arg_refs)
        .env("CLIENT_SECRET", CLIENT_SECRET)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    assert!(h.wait_for_calls(&mut child, 20), "the job runs");
    h.api.revoke_client_secret(true);
    let status = child.wait().unwrap();
    let stopped = Run {
        code: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(&out).unwrap(),
        stderr: std::fs::read_to_string(&err).unwrap(),
    };
    stopped
        .expect_code(4)
        .expect_stderr("credential TOKEN was rejected")
        .expect_stderr("invalid_client");
    let status = h.status(&h.state());
    assert_eq!(status["stats"]["failed"], 0, "{status}");
    assert!(status["stats"]["pending"].as_u64().unwrap() > 0, "{status}");
    let shown = status["credentials"][0].as_str().unwrap();
    assert!(shown.starts_with("TOKEN from OAuth2"), "{shown}");

    h.api.revoke_client_secret(false);
    let resumed = run_with_secret(&h, &args);
    resumed.expect_code(0);
    assert_all_ok(&h, &ids);
    assert_no_secret(&h, &[&stopped, &resumed]);
}

#[test]
fn a_credential_is_not_needed_in_the_environment_but_its_client_secret_is() {
    let h = api();
    let ids = ids(3);
    let input = h.ids_file("ids.txt", &ids);
    let args = job_args(&h, &input, &oauth2(&h));
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    // TOKEN is the credential's: not looked up. CLIENT_SECRET is missing: a usage error.
    h.run_env(&arg_refs, &[], &["CLIENT_SECRET", "TOKEN"])
        .expect_refused(2, &["--oauth2-client-secret", "CLIENT_SECRET"]);
    assert!(!h.state().exists(), "nothing created");
    // A secret written out is refused: it would be stored.
    let mut literal = args.clone();
    let at = literal
        .iter()
        .position(|a| a == "${CLIENT_SECRET}")
        .unwrap();
    literal[at] = CLIENT_SECRET.into();
    let literal: Vec<&str> = literal.iter().map(String::as_str).collect();
    h.run(&literal)
        .expect_refused(2, &["--oauth2-client-secret"]);
    // Flags that need a credential, a credential without its client, a malformed one.
    let (url, state) = (h.url(), h.state());
    let base = [
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--url",
        &url,
    ];
    for (extra, says) in [
        (vec!["--credential-every", "5m"], "--credential-every"),
        (vec!["--oauth2-scope", "x"], "--oauth2-scope"),
        (
            vec!["--credential-oauth2", "TOKEN=http://127.0.0.1:9/t"],
            "--oauth2-client-id",
        ),
        (vec!["--credential-command", "gh auth token"], "NAME=VALUE"),
        (
            vec!["--credential-command", "TOKEN=echo x"],
            "credential TOKEN: no ${NAME} of a credential appears",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend(extra);
        h.run(&args).expect_refused(2, &[says]);
    }
    assert!(!h.state().exists(), "nothing created");
}

/// A worker of a PostgreSQL fleet on job `creds`, its -vv log in files named `name`.
#[cfg(feature = "postgres")]
fn fleet_worker(h: &Harness, name: &str, url: &str, extra: &[String]) -> std::process::Child {
    let mut args: Vec<String> = ["run", "--state", url, "--job", "creds", "--lease-ttl", "5s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(QUICK.iter().map(|s| s.to_string()));
    args.push("-vv".to_string());
    args.extend(extra.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    h.cmd(&args)
        .env("CLIENT_SECRET", CLIENT_SECRET)
        .stdout(std::fs::File::create(h.path(&format!("{name}.out"))).unwrap())
        .stderr(std::fs::File::create(h.path(&format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap()
}

#[cfg(feature = "postgres")]
#[test]
fn each_worker_of_a_postgres_fleet_renews_its_own_token_through_a_30_second_job() {
    use crate::pg_cluster;

    let h = api();
    let db = pg_cluster::fresh_db();
    let ids = ids(IDS);
    let input = h.ids_file("ids.txt", &ids);
    let mut create: Vec<String> = [
        "--input",
        p(&input),
        "--url",
        &h.url(),
        "--header",
        "Authorization: Bearer ${TOKEN}",
        "--bucket-size",
        "20",
        "--rate",
        RATE,
        "--concurrency",
        "4",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    create.extend(oauth2(&h));
    let started = Instant::now();
    let mut first = fleet_worker(&h, "w1", &db.url, &create);
    assert!(h.wait_for_calls(&mut first, 10), "the first worker runs");
    // The second joins with no flag of the job: the stored credential, its own token.
    let second = fleet_worker(&h, "w2", &db.url, &["--rate".into(), RATE.into()]);
    let done: Vec<Run> = [("w1", first), ("w2", second)]
        .into_iter()
        .map(|(name, mut child)| {
            let status = child.wait().unwrap();
            Run {
                code: status.code().unwrap_or(-1),
                stdout: std::fs::read_to_string(h.path(&format!("{name}.out"))).unwrap(),
                stderr: std::fs::read_to_string(h.path(&format!("{name}.err"))).unwrap(),
            }
        })
        .collect();
    let elapsed = started.elapsed();
    for run in &done {
        run.expect_code(0);
    }
    assert!(
        elapsed >= Duration::from_secs(29),
        "the job lasted {elapsed:?}"
    );
    let export = h.run(&["export", "--state", &db.url, "--job", "creds"]);
    export.expect_code(0);
    let records: Vec<serde_json::Value> = export
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    h.check_export_exactly_once(&records, &ids);
    // Two workers, each renewing its own token about once per lifetime.
    let issued = h.api.tokens_issued();
    eprintln!("{issued} tokens issued to 2 workers in {elapsed:?}");
    let lifetimes = elapsed.as_secs_f64() / LIFETIME.as_secs_f64();
    assert!(
        issued as f64 >= lifetimes / 2.0 && issued as f64 <= 2.0 * (2.0 * lifetimes + 2.0),
        "{issued} tokens in {elapsed:?}"
    );
    // No secret in the workers' logs, the export, or any row of the job's tables.
    let mut secrets = h.api.tokens();
    secrets.push(CLIENT_SECRET.to_string());
    let tables = pg_cluster::shared().psql(
        &db.name,
        &format!(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = '{}'",
            db.schema
        ),
    );
    let mut texts = vec![export.stdout.clone()];
    for table in tables.lines() {
        texts.push(pg_cluster::shared().psql(
            &db.name,
            &format!("SELECT t::text FROM {}.{table} t", db.schema),
        ));
    }
    for run in &done {
        texts.push(run.stdout.clone());
        texts.push(run.stderr.clone());
    }
    for text in &texts {
        for secret in &secrets {
            assert!(!text.contains(secret.as_str()), "a secret leaked");
        }
    }
}

#[test]
fn a_failing_credential_command_is_an_outage_that_stops_the_job_and_a_resume_finishes_it() {
    let h = api();
    let ids = ids(100);
    let input = h.ids_file("ids.txt", &ids);
    let script = h.file("token.sh", "echo 'vault is sealed' >&2\nexit 1\n");
    let credential = vec![
        "--credential-command".to_string(),
        format!("TOKEN=sh {}", p(&script)),
    ];
    let mut args = job_args(&h, &input, &credential);
    args.retain(|a| a != "-vv");
    args.extend(["--max-outage".into(), "2s".into()]);
    let stopped = run_with_secret(&h, &args);
    stopped
        .expect_code(1)
        .expect_stderr("credential TOKEN")
        .expect_stderr("vault is sealed")
        .expect_stderr("unreachable");
    let status = h.status(&h.state());
    assert_eq!(status["stats"]["failed"], 0, "{status}");
    assert_eq!(h.api.total_calls(), 0, "no request went without its token");
    // Fixed: the command (the same file) prints a token again.
    assert_eq!(token_script(&h).0, script);
    let resumed = run_with_secret(&h, &args);
    resumed.expect_code(0);
    assert_all_ok(&h, &ids);
}

/// The API key the masking test's URL carries: a space, a `/`, a `+` and `=`, so that the
/// request carries it percent-encoded.
const API_KEY: &str = "sk live/9+Zq==xyz";

/// An API whose errors quote the request (the URL with its `?key=`, every header with the
/// bearer token) fails some IDs for good and some once: the key expanded from `${VAR}` and
/// every token the credential command printed (renewed as they expire under the job) are
/// masked as `***` in every error highwater keeps or shows, and an ok answer is kept whole.
#[test]
fn secrets_an_api_echoes_in_its_errors_are_masked_in_everything_kept_or_shown() {
    let h = Harness::new(ApiConfig {
        not_found_per_mille: 300,
        unavailable_per_mille: 300,
        transient_attempts: 1,
        ..ApiConfig::fast()
    });
    h.api.require_token(LIFETIME);
    h.api.echo_requests(true);
    let ids = ids(300);
    let input = h.ids_file("ids.txt", &ids);
    let (script, runs) = token_script(&h);
    let state = h.state();
    let url = format!("{}?key=${{HW_SECRET_KEY}}", h.url());
    let credential = format!("TOKEN=sh {}", p(&script));
    let mut args = vec![
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--url",
        &url,
        "--header",
        "Authorization: Bearer ${TOKEN}",
        "--credential-command",
        &credential,
        // 300 IDs at 50/s outlive a token: renewed under the job.
        "--rate",
        "50",
        "-v",
    ];
    args.extend(QUICK);
    let run = h.run_env(&args, &[("HW_SECRET_KEY", API_KEY)], &[]);
    run.expect_code(3);
    assert!(count(&runs) >= 2, "the token was renewed under the job");
    let export = h.export(&state);
    assert_eq!(export.len(), ids.len());
    for record in &export {
        let id = record["id"].as_str().unwrap();
        if h.api.fault(id) == Fault::NotFound {
            assert_eq!(record["http_status"], 404, "{record}");
        } else if record["status"] == "ok" {
            // An ok answer is kept as it came.
            assert_eq!(record["body"], h.api.expected_body(id), "{record}");
        }
    }

    let out = |args: &[&str]| {
        let run = h.run(args);
        run.expect_code(0);
        run.stdout.into_bytes()
    };
    let s = p(&state);
    let jsonl_failures = out(&["failures", "--state", s, "--format", "jsonl"]);
    let failures = String::from_utf8_lossy(&jsonl_failures).into_owned();
    assert!(
        failures.contains("not found: GET /items/")
            && failures.contains("?key=***")
            && failures.contains("Bearer ***"),
        "the failures quote the request, masked: {failures}"
    );
    let report = h.path("report.html");
    out(&["report", "--state", s, "--output", p(&report)]);
    let mut texts: Vec<(String, Vec<u8>)> = vec![
        ("failures jsonl".into(), jsonl_failures),
        ("failures table".into(), out(&["failures", "--state", s])),
        (
            "failures csv".into(),
            out(&["failures", "--state", s, "--format", "csv"]),
        ),
        ("export jsonl".into(), out(&["export", "--state", s])),
        (
            "export csv".into(),
            out(&["export", "--state", s, "--format", "csv"]),
        ),
        (
            "decoded export".into(),
            serde_json::to_vec(&export).unwrap(),
        ),
        ("status".into(), out(&["status", "--state", s, "--json"])),
        ("report".into(), std::fs::read(&report).unwrap()),
        ("run stdout".into(), run.stdout.clone().into_bytes()),
        ("run stderr".into(), run.stderr.clone().into_bytes()),
    ];
    for file in files_under(&state) {
        texts.push((file.display().to_string(), std::fs::read(&file).unwrap()));
    }
    let tokens = h.api.tokens();
    assert!(tokens.len() >= 2, "the API saw the renewed tokens");
    // The key as written, as the request carried it (its space encoded), and a piece of it.
    let mut secrets = vec![
        API_KEY.to_string(),
        API_KEY.replace(' ', "%20"),
        "9+Zq==xyz".to_string(),
    ];
    secrets.extend(tokens);
    for (place, bytes) in &texts {
        for secret in &secrets {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "a secret ({secret:?}) is in {place}");
        }
    }
}
