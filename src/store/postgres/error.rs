//! The PostgreSQL store's errors. None of them ever holds a password: database targets are
//! named by their redacted form ([`super::PgTarget`]'s `Display`), and tokio-postgres'
//! own messages name options and servers, not values.

use crate::handler::HandlerError;

/// Errors of the PostgreSQL store.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// `${VAR}` in the database URL could not be expanded.
    #[error(transparent)]
    Env(#[from] HandlerError),
    /// The database URL does not parse.
    #[error("invalid PostgreSQL URL {url}: {reason}")]
    Url {
        /// The URL, redacted.
        url: String,
        /// Why it does not parse.
        reason: String,
    },
    /// TLS could not be set up for the connection.
    #[error("TLS setup for {target}: {reason}")]
    Tls {
        /// The database, redacted.
        target: String,
        /// Why no TLS configuration could be built (no usable root certificates, a bad option).
        reason: String,
    },
    /// The database could not be reached, or refused the connection.
    #[error("cannot connect to {target}: {cause}")]
    Connect {
        /// The database, redacted.
        target: String,
        /// The driver's error.
        cause: PgCause,
    },
    /// A statement failed; `what` says which step.
    #[error("PostgreSQL error while {what}: {cause}")]
    Sql {
        /// The step, e.g. "acquiring buckets".
        what: &'static str,
        /// The server's or driver's error.
        cause: PgCause,
    },
    /// A migration already applied differs from the one built in.
    #[error(
        "migration {version} ({name}) applied to this database differs from this highwater's \
         (sha256 {applied} in the database, {embedded} here): the schema was changed by hand or \
         by another build; refusing to touch it"
    )]
    ChecksumMismatch {
        /// The migration's number.
        version: i32,
        /// The migration's name.
        name: String,
        /// Its SHA-256 as recorded in the database (hex).
        applied: String,
        /// Its SHA-256 as built into this binary (hex).
        embedded: String,
    },
    /// The database's schema is newer than this build knows.
    #[error(
        "the database's highwater schema is version {found}, newer than this highwater's \
         {supported}: upgrade highwater"
    )]
    SchemaNewer {
        /// The database's schema version.
        found: i32,
        /// The newest this build knows.
        supported: i32,
    },
    /// A migration failed to apply; its transaction was rolled back.
    #[error("migration {version} ({name}) failed: {cause}")]
    Migration {
        /// The migration's number.
        version: i32,
        /// The migration's name.
        name: String,
        /// The server's error.
        cause: PgCause,
    },
    /// The database holds no job of this name.
    #[error("no job named {0:?} in this database")]
    NoSuchJob(String),
    /// The worker's session expired (or was never registered): it holds nothing any more.
    #[error("worker session {0} has expired: its leases are void")]
    SessionExpired(String),
    /// A fenced write found the bucket under another token or owner.
    #[error("lease lost on bucket {bucket} of log {log} (token {token}): another worker holds it")]
    LeaseLost {
        /// The log: 0 for the job's own, a rerun's number otherwise.
        log: i32,
        /// The bucket in that log.
        bucket: u64,
        /// The lease the write carried.
        token: i64,
    },
    /// The planner's lease expired or another worker took it; nothing of the planner's write was applied.
    #[error("the planner lease (token {token}) was lost")]
    PlannerLeaseLost {
        /// The planner lease the write carried.
        token: i64,
    },
    /// A row read back does not decode (a JSON column, a value out of range).
    #[error("stored data is malformed: {0}")]
    Malformed(String),
}

impl PgError {
    /// Wrap a statement's error with the step it belonged to.
    pub fn sql(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> PgError {
        move |e| PgError::Sql {
            what,
            cause: PgCause(e),
        }
    }
}

/// tokio-postgres' error, shown with the server's message (its own `Display` says only
/// "db error" for those).
#[derive(Debug)]
pub struct PgCause(pub tokio_postgres::Error);

impl PgCause {
    /// The server's SQLSTATE, if the server answered with an error.
    pub fn code(&self) -> Option<&tokio_postgres::error::SqlState> {
        self.0.code()
    }
}

impl std::fmt::Display for PgCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{db}"),
            None => {
                // Its causes (the TLS or I/O error) are not in its own text.
                let mut text = self.0.to_string();
                let mut source = std::error::Error::source(&self.0);
                while let Some(cause) = source {
                    let cause_text = cause.to_string();
                    if !text.ends_with(&cause_text) {
                        text.push_str(": ");
                        text.push_str(&cause_text);
                    }
                    source = cause.source();
                }
                f.write_str(&text)
            }
        }
    }
}

impl From<PgError> for crate::store::StoreError {
    fn from(e: PgError) -> Self {
        use crate::store::StoreError;
        match e {
            PgError::LeaseLost { log, bucket, token } => StoreError::LeaseLost {
                scope: match log {
                    0 => format!("bucket {bucket}"),
                    k => format!("bucket {bucket} of rerun {k}"),
                },
                token: token as u64,
            },
            PgError::PlannerLeaseLost { token } => StoreError::LeaseLost {
                scope: "the planner".into(),
                token: token as u64,
            },
            PgError::NoSuchJob(name) => StoreError::NotAStore {
                kind: "job",
                reason: format!("no job named {name:?} in this database"),
            },
            PgError::Malformed(reason) => StoreError::Corrupt { reason },
            e => StoreError::backend(e.to_string()),
        }
    }
}
