use std::time::Duration;

use crate::store::postgres::connect::*;
use crate::store::postgres::test_db::{self, fresh, Db};
use crate::store::postgres::PgError;

const PASSWORD: &str = "s3cret-Pw.42";

/// A login role `hw` with [`PASSWORD`], for TCP (SCRAM) connections.
async fn with_role() -> Db {
    let db = fresh().await;
    // Tests run at once: two may both see no role and both create it, so the loser's
    // duplicate is caught, not checked for beforehand.
    let sql = format!("DO $$ BEGIN CREATE ROLE hw LOGIN PASSWORD '{PASSWORD}'; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$");
    db.psql(&sql);
    db
}

fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

async fn current_db(target: &PgTarget) -> String {
    connect(target, &ConnectOptions::default())
        .await
        .unwrap()
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn pgpassword_and_url_variables_authenticate_over_tcp() {
    let db = with_role().await;
    // PGPASSWORD for a URL without a password.
    let env = env_of(&[("PGPASSWORD", PASSWORD)]);
    let target = PgTarget::parse_with_env(&db.db.tcp_url("hw"), &env).unwrap();
    assert_eq!(current_db(&target).await, db.db.name);
    // ${VAR} in the URL, expanded at run time.
    let url = format!(
        "postgres://hw:${{DB_PASSWORD}}@127.0.0.1:{}/{}?sslmode=disable",
        db.db.port(),
        db.db.name
    );
    let env = env_of(&[("DB_PASSWORD", PASSWORD)]);
    let target = PgTarget::parse_with_env(&url, &env).unwrap();
    assert_eq!(current_db(&target).await, db.db.name);
    assert_eq!(target.ssl_mode(), "disable");
    // A password with the URL's own delimiters, through ${VAR}: encoded, so it works.
    let odd = "p@ss/w:rd&x=1%?";
    // Its own role: other tests log in as hw at the same time.
    db.psql(&format!("CREATE ROLE hw_odd LOGIN PASSWORD '{odd}'"));
    let url = format!(
        "postgres://hw_odd:${{DB_PASSWORD}}@127.0.0.1:{}/{}?sslmode=disable&application_name=${{APP}}",
        db.db.port(),
        db.db.name
    );
    let env = |k: &str| match k {
        "DB_PASSWORD" => Some(odd.to_string()),
        "APP" => Some("a&b=c".to_string()),
        _ => None,
    };
    let target = PgTarget::parse_with_env(&url, &env).unwrap();
    let client = connect(&target, &ConnectOptions::default()).await.unwrap();
    let app: String = client
        .query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(app, "a&b=c");
    for shown in [target.to_string(), format!("{target:?}")] {
        assert!(
            !shown.contains("p@ss") && !shown.contains("w:rd"),
            "{shown}"
        );
    }
    // A missing variable names the variable, not a value.
    let err = PgTarget::parse_with_env(&url, &|_| None).unwrap_err();
    assert!(err.to_string().contains("DB_PASSWORD"), "{err}");
}

#[tokio::test]
async fn libpq_variables_fill_what_the_url_leaves_out() {
    let db = fresh().await;
    let host = db.db.socket_dir().display().to_string();
    let port = db.db.port().to_string();
    let name = db.db.name.clone();
    let env = move |k: &str| match k {
        "PGHOST" => Some(host.clone()),
        "PGPORT" => Some(port.clone()),
        "PGUSER" => Some("postgres".into()),
        "PGDATABASE" => Some(name.clone()),
        "PGSSLMODE" => Some("require".into()),
        _ => None,
    };
    let target = PgTarget::parse_with_env("postgresql://", &env).unwrap();
    assert_eq!(target.ssl_mode(), "require");
    // A unix socket never uses TLS (as libpq), so `require` does not stop it.
    assert_eq!(current_db(&target).await, db.db.name);
    assert!(
        target.to_string().starts_with("postgresql://postgres@["),
        "{target}"
    );
    // The URL wins over the environment.
    let url = format!("postgresql:///{}?sslmode=disable", db.db.name);
    let env2 = |k: &str| match k {
        "PGDATABASE" => Some("no_such_db".into()),
        "PGSSLMODE" => Some("verify-full".into()),
        other => env(other),
    };
    let target = PgTarget::parse_with_env(&url, &env2).unwrap();
    assert_eq!(target.ssl_mode(), "disable");
    assert_eq!(current_db(&target).await, db.db.name);
}

#[tokio::test]
async fn no_password_appears_in_errors_or_in_the_target_shown() {
    let db = with_role().await;
    // Wrong password in the URL: the server refuses; the message does not echo it.
    let wrong = "Wr0ng-Secret!";
    let url = format!(
        "postgresql://hw:{wrong}@127.0.0.1:{}/{}?sslmode=disable",
        db.db.port(),
        db.db.name
    );
    let target = PgTarget::parse_with_env(&url, &|_| None).unwrap();
    for shown in [target.to_string(), format!("{target:?}")] {
        assert!(!shown.contains(wrong), "{shown}");
    }
    let err = connect(&target, &ConnectOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, PgError::Connect { .. }), "{err:?}");
    let chain = error_chain(&err);
    assert!(chain.contains("password authentication failed"), "{chain}");
    assert!(!chain.contains(wrong), "{chain}");
    assert!(!format!("{err:?}").contains(wrong));
    // From PGPASSWORD: same.
    let env = |k: &str| (k == "PGPASSWORD").then(|| wrong.to_string());
    let target = PgTarget::parse_with_env(&db.db.tcp_url("hw"), &env).unwrap();
    let err = connect(&target, &ConnectOptions::default())
        .await
        .unwrap_err();
    assert!(!error_chain(&err).contains(wrong));
    assert!(!format!("{err:?} {target:?}").contains(wrong));
    // URLs that do not parse: the message shows the URL redacted.
    for bad in [
        format!("postgresql://hw:{wrong}@127.0.0.1:notaport/db"),
        format!("postgresql://hw:{wrong}@127.0.0.1/db?sslmode=sometimes"),
        format!("postgresql://hw@127.0.0.1/db?password={wrong}&nosuchoption=1"),
        format!("postgresql://hw:{wrong}@127.0.0.1/db?sslcert=/x"),
    ] {
        let err = PgTarget::parse_with_env(&bad, &|_| None).unwrap_err();
        let text = format!("{} {err:?}", error_chain(&err));
        assert!(matches!(err, PgError::Url { .. }), "{text}");
        assert!(!text.contains(wrong), "{text}");
        assert!(text.contains("***") || !bad.contains(":Wr0ng"), "{text}");
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[tokio::test]
async fn every_connection_has_the_statement_and_idle_timeouts() {
    let db = fresh().await;
    let options = ConnectOptions {
        statement_timeout: Duration::from_secs(3),
        idle_in_transaction_timeout: Duration::from_secs(7),
        ..ConnectOptions::default()
    };
    let url = format!("{}%20-c%20work_mem%3D8MB", db.db.url);
    let target = PgTarget::parse_with_env(&url, &|_| None).unwrap();
    let client = connect(&target, &options).await.unwrap();
    let show = |name: &'static str| {
        let client = &client;
        async move {
            client
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .unwrap()
                .get::<_, String>(0)
        }
    };
    assert_eq!(show("statement_timeout").await, "3s");
    assert_eq!(show("idle_in_transaction_session_timeout").await, "7s");
    assert_eq!(
        show("work_mem").await,
        "8MB",
        "the URL's own options are kept"
    );
    assert_eq!(show("application_name").await, "highwater");
    // The server enforces it.
    let err = client
        .batch_execute("SELECT pg_sleep(10)")
        .await
        .unwrap_err();
    let err = super::super::error::PgCause(err).to_string();
    assert!(err.contains("statement timeout"), "{err}");
}

#[tokio::test]
async fn sslmode_require_refuses_a_server_without_tls() {
    let db = fresh().await;
    let url = format!(
        "postgresql://postgres@127.0.0.1:{}/{}?sslmode=require",
        db.db.port(),
        db.db.name
    );
    let target = PgTarget::parse_with_env(&url, &|_| None).unwrap();
    let err = connect(&target, &ConnectOptions::default())
        .await
        .unwrap_err();
    assert!(error_chain(&err).contains("TLS"), "{}", error_chain(&err));
}

#[tokio::test]
async fn tls_by_sslmode_against_a_server_with_a_test_ca() {
    let cluster = tokio::task::spawn_blocking(test_db::PgCluster::start_tls)
        .await
        .unwrap();
    let sql = format!("CREATE ROLE hw LOGIN PASSWORD '{PASSWORD}'");
    cluster.psql("postgres", &sql);
    let ca = cluster.ca_pem().unwrap().display().to_string();
    let port = cluster.port();
    let env = |k: &str| (k == "PGPASSWORD").then(|| PASSWORD.to_string());
    let url = |host: &str, query: &str| format!("postgresql://hw@{host}:{port}/postgres?{query}");
    let encrypted = |target: PgTarget| async move {
        let client = connect(&target, &ConnectOptions::default()).await?;
        let row = client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        Ok::<bool, PgError>(row.get(0))
    };
    let parse = |u: String| PgTarget::parse_with_env(&u, &env).unwrap();
    // Encrypted whenever the server offers it; require and prefer do not authenticate it.
    for query in [
        "sslmode=require".to_string(),
        "sslmode=prefer".to_string(),
        String::new(),
    ] {
        assert!(
            encrypted(parse(url("127.0.0.1", &query))).await.unwrap(),
            "{query}"
        );
    }
    // verify-full: the chain and the name.
    let full = format!("sslmode=verify-full&sslrootcert={ca}");
    assert!(encrypted(parse(url("localhost", &full))).await.unwrap());
    let err = encrypted(parse(url("127.0.0.1", &full))).await.unwrap_err();
    let chain = error_chain(&err);
    assert!(
        chain.contains("not valid for name") || chain.contains("NotValidForName"),
        "{chain}"
    );
    // verify-ca: the chain only.
    let ca_only = format!("sslmode=verify-ca&sslrootcert={ca}");
    assert!(encrypted(parse(url("127.0.0.1", &ca_only))).await.unwrap());
    // require with a root certificate checks the chain (libpq): the system's roots do not
    // know the test CA.
    let system = "sslmode=verify-full&sslrootcert=system";
    let err = encrypted(parse(url("localhost", system)))
        .await
        .unwrap_err();
    assert!(matches!(err, PgError::Connect { .. }), "{err:?}");
    let other_ca = format!(
        "sslmode=require&sslrootcert={}",
        cluster.socket_dir().join("server.ext").display()
    );
    assert!(
        PgTarget::parse_with_env(&url("localhost", &other_ca), &env).is_err(),
        "not a PEM certificate"
    );
}

#[test]
fn bad_settings_are_refused_with_their_name() {
    let none = |_: &str| None;
    for (url, says) in [
        ("mysql://x/y", "postgres://"),
        ("postgresql://h/db?sslmode=maybe", "sslmode \"maybe\""),
        (
            "postgresql://h/db?sslmode=verify-full&sslrootcert=/no/such.pem",
            "/no/such.pem",
        ),
    ] {
        let err = PgTarget::parse_with_env(url, &none).unwrap_err();
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    let err = PgTarget::parse_with_env("postgresql://h/db", &|k: &str| {
        (k == "PGPORT").then(|| "x".into())
    })
    .unwrap_err();
    assert!(err.to_string().contains("PGPORT"), "{err}");
    let port = |k: &str| (k == "PGPORT").then(|| "6543".to_string());
    for (url, shown) in [
        ("postgresql://u:p@h/db", "postgresql://u@h:6543/db"),
        ("postgresql://h:5/db", "postgresql://h:5/db"),
        (
            "postgresql://h1,[::1]/db",
            "postgresql://h1:6543,[::1]:6543/db",
        ),
    ] {
        let t = PgTarget::parse_with_env(url, &port).unwrap();
        assert_eq!(t.to_string(), shown, "{url}");
    }
    for mode in [
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ] {
        let t =
            PgTarget::parse_with_env(&format!("postgresql://h/db?sslmode={mode}"), &none).unwrap();
        assert_eq!(t.ssl_mode(), mode);
    }
}

#[test]
fn redaction_hides_passwords_only() {
    assert_eq!(
        redact_url("postgresql://u:p%40ss@h:5/db?password=x&sslmode=require"),
        "postgresql://u:***@h:5/db?password=***&sslmode=require"
    );
    assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    assert_eq!(redact_url("postgres://u:a@b@h/db"), "postgres://u:***@h/db");
}
