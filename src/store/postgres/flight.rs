//! A transaction sent in flights: its `BEGIN` and `COMMIT` are statements of their own, sent
//! with the statements beside them (tokio-postgres pipelines the futures polled together on
//! one connection), where [`tokio_postgres::Client::transaction`] waits for `BEGIN`'s answer
//! before anything else goes, and `commit` is a round trip of its own: with the database
//! 10 ms away, each of those waits costs 20 ms.
//!
//! The rules of such a transaction, for whoever sends one:
//! - A statement that fails makes the server refuse every later one of the transaction, and
//!   its `COMMIT` then rolls back *without an error* (the answer's tag says `ROLLBACK`).
//!   So every statement's own result is checked; one error among them means nothing of the
//!   transaction was applied.
//! - A flight that does not end with [`end`] leaves the transaction open on the
//!   connection. When the caller decides not to go on (an error, a lease found lost), it
//!   sends [`rollback`] before it gives the connection back.

use tokio_postgres::Client;

use super::error::PgError;

/// Open a transaction, to be sent in one flight with the statements after it. `what` names
/// the transaction in the error.
pub(crate) async fn begin(client: &Client, what: &'static str) -> Result<(), PgError> {
    client
        .batch_execute("BEGIN")
        .await
        .map_err(PgError::sql(what))
}

/// Commit the transaction [`begin`] opened (see the module doc: a transaction one of whose
/// statements failed is rolled back, and that statement's error says so).
pub(crate) async fn end(client: &Client, what: &'static str) -> Result<(), PgError> {
    client
        .batch_execute("COMMIT")
        .await
        .map_err(PgError::sql(what))
}

/// Roll back the transaction [`begin`] opened and its flights left open.
pub(crate) async fn rollback(client: &Client) -> Result<(), PgError> {
    client
        .batch_execute("ROLLBACK")
        .await
        .map_err(PgError::sql("rolling a transaction back"))
}
