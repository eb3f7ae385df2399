//! The PostgreSQL store's errors. None of them ever holds a password: database targets are
//! named by their redacted form ([`super::PgTarget`]'s `Display`), and tokio-postgres'
//! own messages name options and servers, not values.

use crate::handler::HandlerError;

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// `${VAR}` in the database URL could not be expanded.
    #[error(transparent)]
    Env(#[from] HandlerError),
    #[error("invalid PostgreSQL URL {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("TLS setup for {target}: {reason}")]
    Tls { target: String, reason: String },
    #[error("cannot connect to {target}: {cause}")]
    Connect { target: String, cause: PgCause },
    /// A statement failed; `what` says which step.
    #[error("PostgreSQL error while {what}: {cause}")]
    Sql { what: &'static str, cause: PgCause },
    #[error(
        "migration {version} ({name}) applied to this database differs from this highwater's \
         (sha256 {applied} in the database, {embedded} here): the schema was changed by hand or \
         by another build; refusing to touch it"
    )]
    ChecksumMismatch {
        version: i32,
        name: String,
        applied: String,
        embedded: String,
    },
    #[error(
        "the database's highwater schema is version {found}, newer than this highwater's \
         {supported}: upgrade highwater"
    )]
    SchemaNewer { found: i32, supported: i32 },
    #[error("migration {version} ({name}) failed: {cause}")]
    Migration {
        version: i32,
        name: String,
        cause: PgCause,
    },
    #[error("no job named {0:?} in this database")]
    NoSuchJob(String),
    /// The worker's session expired (or was never registered): it holds nothing any more.
    #[error("worker session {0} has expired: its leases are void")]
    SessionExpired(String),
    /// A fenced write found the bucket under another token or owner.
    #[error("lease lost on bucket {bucket} of log {log} (token {token}): another worker holds it")]
    LeaseLost { log: i32, bucket: u64, token: i64 },
    #[error("the planner lease (token {token}) was lost")]
    PlannerLeaseLost { token: i64 },
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
