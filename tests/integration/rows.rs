//! Row templates: `{column}` in the URL, the body and `--exec` take the values of the ID's
//! input row, checked on the server's side for every request (first calls, replays after a
//! SIGKILL, retries, a rerun), and `export --columns` carries them out.

use std::collections::HashMap;
use std::time::Duration;

use highwater::demo::api::{ApiConfig, Fault};
use serde_json::{json, Value};

use crate::harness::*;

/// A company row: its ID and the values a request must carry.
#[derive(Debug, Clone)]
struct Company {
    id: String,
    name: String,
    domain: String,
    employees: u64,
}

/// `n` rows whose names hold commas, quotes, non-ASCII, `/`, `?`, `&`, `#`, `%`, `+` and
/// spaces, written as CSV with the columns `id,name,domain,employees`.
fn companies(h: &Harness, n: usize) -> (std::path::PathBuf, Vec<Company>) {
    let odd = [
        "Smith, Jones & Co.",
        "\"Quoted\" Ltd",
        "Zürich Rück AG",
        "a/b?c=d#e",
        "100% + more",
        "日本電気",
        "  padded  ",
    ];
    let rows: Vec<Company> = (0..n)
        .map(|i| Company {
            id: format!("c{i:05}"),
            name: format!("{} {i}", odd[i % odd.len()]),
            domain: format!("d{i}.example/x?y={i}"),
            employees: (i * 7) as u64,
        })
        .collect();
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["id", "name", "domain", "employees"])
        .unwrap();
    for r in &rows {
        w.write_record([&r.id, &r.name, &r.domain, &r.employees.to_string()])
            .unwrap();
    }
    let path = h.file("companies.csv", w.into_inner().unwrap());
    (path, rows)
}

/// The query's parameters of a request target, decoded.
fn query(target: &str) -> HashMap<String, String> {
    let q = target.split_once('?').map_or("", |(_, q)| q);
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let v = percent_encoding::percent_decode_str(v)
                .decode_utf8()
                .unwrap()
                .into_owned();
            (k.to_string(), v)
        })
        .collect()
}

/// Every request the server saw for each row carried exactly that row's values; returns
/// how many requests were checked.
#[track_caller]
fn check_requests(h: &Harness, rows: &[Company]) -> usize {
    let mut checked = 0;
    for r in rows {
        let seen = h.api.seen(&r.id);
        assert!(!seen.is_empty(), "no request for {}", r.id);
        for s in seen {
            assert_eq!(s.method, "POST");
            let q = query(&s.target);
            assert_eq!(q.get("name"), Some(&r.name), "{} {}", r.id, s.target);
            assert_eq!(q.get("domain"), Some(&r.domain), "{} {}", r.id, s.target);
            let body: Value = serde_json::from_str(&s.body).expect("the body is JSON");
            assert_eq!(
                body,
                json!({
                    "id": r.id,
                    "company": {"name": r.name, "domain": r.domain},
                    "label": format!("{} <{}>", r.name, r.domain),
                    "size": r.employees.to_string(),
                }),
                "{}",
                r.id
            );
            checked += 1;
        }
    }
    checked
}

fn run_args<'a>(state: &'a str, input: &'a str, url: &'a str, body: &'a str) -> Vec<&'a str> {
    let mut args = vec!["run", "--state", state, "--concurrency", "16"];
    args.extend(job_args(input, url, body));
    args
}

/// The flags that create a job of the companies' rows.
fn job_args<'a>(input: &'a str, url: &'a str, body: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "--input",
        input,
        "--id-column",
        "id",
        "--method",
        "POST",
        "--url",
        url,
        "--body",
        body,
        "--bucket-size",
        "100",
        "--max-attempts",
        "3",
    ];
    args.extend(QUICK);
    args
}

const BODY: &str = r#"{"id":"{id}","company":{"name":"{name}","domain":"{domain}"},"label":"{name} <{domain}>","size":"{employees}"}"#;

#[test]
fn every_request_carries_its_rows_values_through_kills_retries_and_a_rerun() {
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(1),
        latency_max: Duration::from_millis(3),
        not_found_per_mille: 10,
        unavailable_per_mille: 20,
        transient_attempts: 1,
        seed: 11,
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let (input, rows) = companies(&h, 20_000);
    let state = h.state();
    let url = format!(
        "http://{}/items?name={{name}}&domain={{domain}}",
        h.api.addr()
    );
    let args = run_args(p(&state), p(&input), &url, BODY);

    // Killed three times part way, then resumed to the end: replayed buckets read their
    // rows' values back from the store.
    let mut kills = 0;
    for at in [2_000, 7_000, 12_000] {
        let mut child = h.spawn(&args);
        if h.wait_for_calls(&mut child, at) {
            signal(&child, libc::SIGKILL);
            kills += 1;
        }
        finish(child);
    }
    assert_eq!(kills, 3, "the job finished before it was killed thrice");
    let resume = [
        "run",
        "--state",
        p(&state),
        "--max-attempts",
        "3",
        "--progress-interval",
        "0",
    ];
    h.run(&resume).expect_code(3); // the 404 IDs fail
    let export = h.export(&state);
    assert_eq!(export.len(), rows.len());
    let checked = check_requests(&h, &rows);
    assert!(checked > rows.len(), "retries and repeats were checked too");

    // A rerun of the failed IDs calls them with their rows' values.
    let failed: Vec<&Company> = rows
        .iter()
        .filter(|r| h.api.fault(&r.id) == Fault::NotFound)
        .collect();
    assert!(!failed.is_empty());
    let before: HashMap<&str, usize> = failed
        .iter()
        .map(|r| (r.id.as_str(), h.api.seen(&r.id).len()))
        .collect();
    h.run(&[
        "rerun",
        "--state",
        p(&state),
        "--failed",
        "--progress-interval",
        "0",
    ])
    .expect_code(3);
    for r in &failed {
        assert!(
            h.api.seen(&r.id).len() > before[r.id.as_str()],
            "{} rerun",
            r.id
        );
    }
    check_requests(&h, &rows);

    // The export carries the columns asked for, beside each result, in every format.
    let out = h.run(&["export", "--state", p(&state), "--columns", "name,domain"]);
    out.expect_code(0);
    let by_id: HashMap<&str, &Company> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut n = 0;
    for line in out.stdout.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        let r = by_id[record["id"].as_str().unwrap()];
        assert_eq!(record["name"], r.name.as_str(), "{record}");
        assert_eq!(record["domain"], r.domain.as_str(), "{record}");
        n += 1;
    }
    assert_eq!(n, rows.len());
    let out = h.run(&[
        "export",
        "--state",
        p(&state),
        "--format",
        "csv",
        "--columns",
        "employees,name",
    ]);
    out.expect_code(0);
    let mut csv = csv::Reader::from_reader(out.stdout.as_bytes());
    let header: Vec<String> = csv.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(&header[header.len() - 2..], ["employees", "name"]);
    for record in csv.records() {
        let record = record.unwrap();
        let r = by_id[&record[0]];
        assert_eq!(&record[header.len() - 2], r.employees.to_string());
        assert_eq!(&record[header.len() - 1], r.name);
    }
}

#[test]
fn columns_are_checked_before_anything_is_created() {
    let h = Harness::new(ApiConfig::fast());
    let (input, _) = companies(&h, 10);
    let url = format!("http://{}/items?name={{nmae}}", h.api.addr());
    let state = h.state();
    let args = run_args(p(&state), p(&input), &url, BODY);
    h.run(&args).expect_refused(
        1,
        &["no column \"nmae\"", "companies.csv", "columns: id, name"],
    );
    assert!(!state.exists(), "a refused job leaves no state directory");

    // A text input has no columns.
    let text = h.ids_file("ids.txt", &ids(5));
    let url = format!("http://{}/items/{{id}}?q={{name}}", h.api.addr());
    h.run(&new_job_args(&state, &text, &url))
        .expect_refused(1, &["ids.txt", "no columns"]);
    assert!(!state.exists());

    // A row without a value for a column is a bad line: it stops the job, or is skipped
    // and recorded with --skip-bad-lines.
    let short = h.file("short.csv", "id,name\na,Alpha\nb\nc,Gamma\n");
    let url = format!("http://{}/items/{{id}}?q={{name}}", h.api.addr());
    let mut args = new_job_args(&state, &short, &url);
    args.extend(["--id-column", "id"]);
    h.run(&args)
        .expect_refused(1, &["short.csv:3", "no value for the column \"name\""]);
    std::fs::remove_dir_all(&state).unwrap();
    args.push("--skip-bad-lines");
    h.run(&args).expect_code(0);
    assert_eq!(h.status(&state)["stats"]["bad_lines"], 1);
    assert_eq!(
        h.api.seen("c").len(),
        0,
        "requests are not kept unless asked"
    );

    // The columns are fixed at creation: a resume may not use another one.
    let url2 = format!(
        "http://{}/items/{{id}}?q={{name}}&x={{other}}",
        h.api.addr()
    );
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--url",
        &url2,
        "--allow-spec-change",
    ])
    .expect_refused(2, &["keeps the input columns name", "other"]);
    // The export may carry kept columns only.
    h.run(&["export", "--state", p(&state), "--columns", "domain"])
        .expect_refused(
            2,
            &["--columns", "no input column \"domain\"", "it keeps: name"],
        );
    h.run(&["export", "--state", p(&state), "--columns", "status"])
        .expect_refused(2, &["--columns", "no input column \"status\""]);
}

#[test]
fn jsonl_fields_go_in_as_json_and_exec_arguments_take_columns() {
    let h = Harness::new(ApiConfig::fast());
    h.api.keep_requests();
    let input = h.file(
        "rows.jsonl",
        concat!(
            r#"{"key":"k1","geo":{"lat":1.5,"lon":-3},"n":7,"tag":"a b"}"#,
            "\n",
            r#"{"key":"k2","geo":[1,2],"n":8.25,"tag":"é/?"}"#,
            "\n",
        ),
    );
    let state = h.state();
    let url = format!("http://{}/items?tag={{tag}}", h.api.addr());
    let body = r#"{"id":"{id}","where":{geo:json},"n":{n:json},"tag":{tag:json},"text":"{geo}"}"#;
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--id-field",
        "key",
        "--method",
        "POST",
        "--url",
        &url,
        "--body",
        body,
        "--keep-columns",
        "n",
        "--progress-interval",
        "0",
    ])
    .expect_code(0);
    let seen = h.api.seen("k1");
    assert_eq!(query(&seen[0].target)["tag"], "a b");
    let sent: Value = serde_json::from_str(&seen[0].body).unwrap();
    assert_eq!(
        sent,
        json!({"id": "k1", "where": {"lat": 1.5, "lon": -3}, "n": 7, "tag": "a b",
               "text": r#"{"lat":1.5,"lon":-3}"#})
    );
    let sent: Value = serde_json::from_str(&h.api.seen("k2")[0].body).unwrap();
    assert_eq!(sent["where"], json!([1, 2]));
    assert_eq!(sent["tag"], "é/?");
    let out = h.run(&["export", "--state", p(&state), "--columns", "n,geo"]);
    out.expect_code(0);
    let first: Value = serde_json::from_str(out.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["n"], 7);
    assert_eq!(first["geo"], json!({"lat": 1.5, "lon": -3}));

    // A command's argument takes a column's value as one argument.
    let state = h.path("exec");
    h.run(&[
        "run",
        "--state",
        p(&state),
        "--input",
        p(&input),
        "--id-field",
        "key",
        "--exec",
        "printf %s|%s {id} {tag}",
        "--progress-interval",
        "0",
    ])
    .expect_code(0);
    let export = h.export(&state);
    assert_eq!(export[0]["body"], "k1|a b");
    assert_eq!(export[1]["body"], "k2|é/?");
}

/// A fleet's workers have no input: a worker that joins without it sends each row's values
/// from the database, and the export from the database carries them.
#[cfg(feature = "postgres")]
#[test]
fn a_fleet_worker_without_the_input_sends_each_rows_values() {
    use crate::pg_cluster;
    let h = Harness::new(ApiConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(4),
        ..ApiConfig::fast()
    });
    h.api.keep_requests();
    let db = pg_cluster::fresh_db();
    let (input, rows) = companies(&h, 3_000);
    let url = format!(
        "http://{}/items?name={{name}}&domain={{domain}}",
        h.api.addr()
    );
    let pg = [
        "--state",
        db.url.as_str(),
        "--job",
        "rows",
        "--lease-ttl",
        "2s",
    ];
    let mut first = vec!["run", "--concurrency", "2"];
    first.extend(pg);
    first.extend(job_args(p(&input), &url, BODY));
    let mut creator = h.spawn(&first);
    assert!(
        h.wait_for_calls(&mut creator, 200),
        "the first worker started"
    );
    let mut join = vec!["run", "--concurrency", "2", "--progress-interval", "0"];
    join.extend(pg);
    let joined = finish(h.spawn(&join));
    finish(creator).expect_code(0);
    joined.expect_code(0);
    let did = joined
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("this run: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .expect("the joined worker's summary");
    assert!(
        did > 0,
        "the worker without the input called IDs: {}",
        joined.stderr
    );
    check_requests(&h, &rows);
    let out = h.run(&[
        "export",
        "--state",
        &db.url,
        "--job",
        "rows",
        "--columns",
        "domain",
    ]);
    out.expect_code(0);
    let by_id: HashMap<&str, &Company> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut n = 0;
    for line in out.stdout.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            record["domain"],
            by_id[record["id"].as_str().unwrap()].domain.as_str()
        );
        n += 1;
    }
    assert_eq!(n, rows.len());
}
