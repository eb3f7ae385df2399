//! Where the database is and how to connect: a `postgres://` / `postgresql://` URL with
//! `${VAR}` expanded from the environment at run time (the templates' expansion,
//! [`crate::handler::expand_env`]; a value landing in the user info or a query value is
//! percent-encoded, so any password works), the libpq environment variables for whatever the URL
//! leaves out, TLS by `sslmode` (see `tls`), and per-connection `statement_timeout` and
//! `idle_in_transaction_session_timeout`.
//!
//! libpq variables honoured when the URL does not say: `PGHOST`, `PGPORT`, `PGUSER`,
//! `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGCONNECT_TIMEOUT`,
//! `PGAPPNAME`. Not (yet): `PGPASSFILE` / `~/.pgpass`, client certificates.
//!
//! Secrets: the expanded URL and the password live only in the [`PgTarget`]; its `Display`
//! and `Debug` show user, hosts and database, never the password, and so does every error.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use percent_encoding::percent_decode_str;
use tokio_postgres::config::Host;
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::PgError;
use super::tls::{self, Roots, SslMode};

/// Per-connection settings.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The server cancels any statement running longer.
    pub statement_timeout: Duration,
    /// The server ends a session idle inside a transaction for longer.
    pub idle_in_transaction_timeout: Duration,
    /// Used when neither the URL nor `PGCONNECT_TIMEOUT` sets one.
    pub connect_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            statement_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl ConnectOptions {
    /// These options for the connection of a worker session living `ttl`: a transaction
    /// that a stopped worker left open (paused, partitioned, its machine gone) ends within
    /// half the TTL, so its row locks never hold its buckets back from the others (whose
    /// `SKIP LOCKED` acquisitions pass locked rows by) once its session has expired.
    pub fn for_session(mut self, ttl: Duration) -> ConnectOptions {
        let bound = (ttl / 2).max(Duration::from_secs(1));
        self.idle_in_transaction_timeout = self.idle_in_transaction_timeout.min(bound);
        self
    }
}

/// A parsed, expanded database target, ready to connect. Shows without its password.
#[derive(Clone)]
pub struct PgTarget {
    config: tokio_postgres::Config,
    ssl: SslMode,
    tls: MakeRustlsConnect,
    connect_timeout_set: bool,
}

impl PgTarget {
    /// Whether `state` names a PostgreSQL database rather than a directory.
    pub fn is_url(state: &str) -> bool {
        state.starts_with("postgres://") || state.starts_with("postgresql://")
    }

    /// Parse `url`, expanding `${VAR}` and reading libpq variables from the process
    /// environment.
    pub fn parse(url: &str) -> Result<PgTarget, PgError> {
        Self::parse_with_env(url, &|name| std::env::var(name).ok())
    }

    /// Parse with an explicit environment (tests, embedding).
    pub fn parse_with_env(
        url: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PgTarget, PgError> {
        if !Self::is_url(url) {
            return Err(PgError::Url {
                url: redact_url(url),
                reason: "a database URL starts with postgres:// or postgresql://".into(),
            });
        }
        let expanded = expand_url(url, env)?;
        // Shown as written (`${VAR}` unexpanded), a literal password redacted.
        let bad = |reason: String| PgError::Url {
            url: redact_url(url),
            reason,
        };
        // tokio-postgres knows only disable/prefer/require and no root certificates: take
        // those parameters out and handle them here.
        let (rest, params) = match expanded.split_once('?') {
            Some((base, query)) => (base.to_string(), query),
            None => (expanded.clone(), ""),
        };
        let mut kept = Vec::new();
        let mut sslmode = None;
        let mut rootcert = None;
        for pair in params.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded = || {
                percent_decode_str(value)
                    .decode_utf8()
                    .map(|v| v.into_owned())
                    .map_err(|_| bad(format!("parameter {key} is not UTF-8")))
            };
            match key {
                "sslmode" => sslmode = Some(decoded()?),
                "sslrootcert" => rootcert = Some(decoded()?),
                "sslcert" | "sslkey" => {
                    return Err(bad(
                        "client certificates (sslcert, sslkey) are not supported".into(),
                    ))
                }
                _ => kept.push(pair),
            }
        }
        let port_param = kept.iter().any(|p| p.starts_with("port="));
        let rest = match env("PGPORT").filter(|p| !p.is_empty()) {
            // The URL's hosts come with port 5432 unless they name one: PGPORT goes in first.
            Some(port) if !port_param => {
                port.parse::<u16>()
                    .map_err(|_| bad("PGPORT is not a port number".into()))?;
                with_default_port(&rest, &port)
            }
            _ => rest,
        };
        let url = if kept.is_empty() {
            rest
        } else {
            format!("{rest}?{}", kept.join("&"))
        };
        let mut config = tokio_postgres::Config::from_str(&url).map_err(|e| bad(e.to_string()))?;

        // libpq's environment, for what the URL leaves out.
        if config.get_hosts().is_empty() {
            match env("PGHOST").filter(|h| !h.is_empty()) {
                Some(hosts) => {
                    for host in hosts.split(',') {
                        if host.starts_with('/') {
                            config.host_path(host);
                        } else {
                            config.host(host);
                        }
                    }
                }
                None if std::path::Path::new("/var/run/postgresql").is_dir() => {
                    config.host_path("/var/run/postgresql");
                }
                None => {
                    config.host("localhost");
                }
            }
        }
        if config.get_ports().is_empty() {
            if let Some(port) = env("PGPORT").filter(|p| !p.is_empty()) {
                let port = port
                    .parse()
                    .map_err(|_| bad("PGPORT is not a port number".into()))?;
                config.port(port);
            }
        }
        if config.get_user().is_none() {
            if let Some(user) = env("PGUSER").filter(|u| !u.is_empty()) {
                config.user(user);
            }
        }
        if config.get_password().is_none() {
            if let Some(password) = env("PGPASSWORD") {
                config.password(password);
            }
        }
        if config.get_dbname().is_none() {
            if let Some(db) = env("PGDATABASE").filter(|d| !d.is_empty()) {
                config.dbname(db);
            }
        }
        let mut connect_timeout_set = config.get_connect_timeout().is_some();
        if !connect_timeout_set {
            if let Some(secs) = env("PGCONNECT_TIMEOUT").filter(|s| !s.is_empty()) {
                let secs: u64 = secs
                    .parse()
                    .map_err(|_| bad("PGCONNECT_TIMEOUT is not a number of seconds".into()))?;
                config.connect_timeout(Duration::from_secs(secs.max(2)));
                connect_timeout_set = true;
            }
        }
        if config.get_application_name().is_none() {
            config.application_name(env("PGAPPNAME").unwrap_or_else(|| "highwater".into()));
        }
        let sslmode = sslmode.or_else(|| env("PGSSLMODE").filter(|m| !m.is_empty()));
        let ssl = match sslmode.as_deref() {
            None => SslMode::Prefer,
            Some(m) => SslMode::parse(m).ok_or_else(|| {
                bad(format!(
                    "sslmode {m:?} is none of disable, allow, prefer, require, verify-ca, verify-full"
                ))
            })?,
        };
        let rootcert = rootcert.or_else(|| env("PGSSLROOTCERT").filter(|r| !r.is_empty()));
        let roots = rootcert.map(|r| {
            if r == "system" {
                Roots::System
            } else {
                Roots::File(r.into())
            }
        });
        // libpq: no TLS on unix sockets, whatever sslmode says.
        let all_unix = config
            .get_hosts()
            .iter()
            .all(|h| !matches!(h, Host::Tcp(_)));
        config.ssl_mode(if all_unix {
            tokio_postgres::config::SslMode::Disable
        } else {
            ssl.wire()
        });
        let client_config =
            tls::client_config(ssl, roots.as_ref()).map_err(|reason| PgError::Tls {
                target: describe(&config),
                reason,
            })?;
        Ok(PgTarget {
            config,
            ssl,
            tls: MakeRustlsConnect::new(client_config),
            connect_timeout_set,
        })
    }

    /// The libpq `sslmode` in effect.
    pub fn ssl_mode(&self) -> &'static str {
        match self.ssl {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe(&self.config))
    }
}

/// `postgresql://user@host:port/db`, from the effective settings; never the password.
fn describe(config: &tokio_postgres::Config) -> String {
    let mut out = String::from("postgresql://");
    if let Some(user) = config.get_user() {
        out.push_str(user);
        out.push('@');
    }
    let ports = config.get_ports();
    for (i, host) in config.get_hosts().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match host {
            Host::Tcp(h) if h.contains(':') => out.push_str(&format!("[{h}]")),
            Host::Tcp(h) => out.push_str(h),
            #[cfg(unix)]
            Host::Unix(p) => out.push_str(&format!("[{}]", p.display())),
        }
        if let Some(port) = ports.get(i).or(ports.first()) {
            out.push_str(&format!(":{port}"));
        }
    }
    out.push('/');
    out.push_str(config.get_dbname().unwrap_or(""));
    out
}

impl fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgTarget({self}, sslmode={})", self.ssl_mode())
    }
}

/// Open one connection with `options`' timeouts; its driver runs on the current runtime.
pub async fn connect(target: &PgTarget, options: &ConnectOptions) -> Result<Client, PgError> {
    let mut config = target.config.clone();
    if !target.connect_timeout_set {
        config.connect_timeout(options.connect_timeout);
    }
    // Set at startup, so no statement runs without them.
    let timeouts = format!(
        "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
        options.statement_timeout.as_millis().max(1),
        options.idle_in_transaction_timeout.as_millis().max(1)
    );
    let startup = match config.get_options() {
        Some(user) if !user.is_empty() => format!("{user} {timeouts}"),
        _ => timeouts,
    };
    config.options(startup);
    let (client, connection) =
        config
            .connect(target.tls.clone())
            .await
            .map_err(|e| PgError::Connect {
                target: target.to_string(),
                cause: super::error::PgCause(e),
            })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// Expand `${VAR}` in a URL template. Values that land in the user info or in a query
/// value are percent-encoded, so a password holding `@`, `/`, `:` or `&` works as written
/// (and cannot break the URL apart); elsewhere (hosts, database) they go in as they are.
fn expand_url(template: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, PgError> {
    const WHAT: &crate::setting::Setting = &crate::setting::Setting::DatabaseUrl;
    let encoded = |name: &str| {
        env(name).map(|v| percent_encoding::utf8_percent_encode(&v, COMPONENT).to_string())
    };
    let expand = |part: &str, encode: bool| {
        if encode {
            crate::handler::expand_env(part, WHAT, &encoded)
        } else {
            crate::handler::expand_env(part, WHAT, env)
        }
    };
    let start = template.find("://").map_or(0, |i| i + 3);
    let rest = &template[start..];
    let authority_end = start + rest.find(['/', '?']).unwrap_or(rest.len());
    let hosts_start = template[start..authority_end]
        .rfind('@')
        .map_or(start, |i| start + i + 1);
    let (path, query) = match template[authority_end..].split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (&template[authority_end..], None),
    };
    let mut out = String::from(&template[..start]);
    out.push_str(&expand(&template[start..hosts_start], true)?);
    out.push_str(&expand(&template[hosts_start..authority_end], false)?);
    out.push_str(&expand(path, false)?);
    if let Some(query) = query {
        let pairs: Result<Vec<String>, PgError> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) => Ok(format!("{}={}", expand(k, false)?, expand(v, true)?)),
                None => Ok(expand(pair, false)?),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs?.join("&"));
    }
    Ok(out)
}

/// What a `${VAR}` value is percent-encoded with in the user info and query values.
const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `url` (without its query) with `port` given to each host of its authority that names
/// none; unchanged if it names no host.
fn with_default_port(url: &str, port: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let after = &url[scheme_end..];
    let authority_end = scheme_end + after.find('/').unwrap_or(after.len());
    let hosts_start = url[scheme_end..authority_end]
        .rfind('@')
        .map_or(scheme_end, |i| scheme_end + i + 1);
    let hosts = &url[hosts_start..authority_end];
    if hosts.is_empty() {
        return url.to_string();
    }
    let chunks: Vec<String> = hosts
        .split(',')
        .map(|chunk| {
            let host_end = if chunk.starts_with('[') {
                chunk.find(']').map_or(chunk.len(), |i| i + 1)
            } else {
                0
            };
            if chunk[host_end..].contains(':') {
                chunk.to_string()
            } else {
                format!("{chunk}:{port}")
            }
        })
        .collect();
    format!(
        "{}{}{}",
        &url[..hosts_start],
        chunks.join(","),
        &url[authority_end..]
    )
}

/// `url` with the userinfo's password and any `password=` parameter replaced by `***`:
/// for messages about a URL that did not parse.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{hosts}"),
            None => format!("{userinfo}@{hosts}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    match scheme {
        Some(s) => format!("{s}://{authority}{tail}"),
        None => format!("{authority}{tail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::test_db::{self, fresh, Db};

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
        let url =
            |host: &str, query: &str| format!("postgresql://hw@{host}:{port}/postgres?{query}");
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
            let t = PgTarget::parse_with_env(&format!("postgresql://h/db?sslmode={mode}"), &none)
                .unwrap();
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
}
