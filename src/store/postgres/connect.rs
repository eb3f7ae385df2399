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
pub(crate) async fn connect(
    target: &PgTarget,
    options: &ConnectOptions,
) -> Result<Client, PgError> {
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
pub(crate) fn redact_url(url: &str) -> String {
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

/// A connection being opened ahead, for its first user.
pub(super) type Connecting = tokio::task::JoinHandle<Result<Client, PgError>>;

/// What a connection opened ahead came to (none: its task ended without an answer, and
/// the first user connects).
pub(super) async fn opened(connecting: Connecting) -> Option<Result<Client, PgError>> {
    connecting.await.ok()
}
