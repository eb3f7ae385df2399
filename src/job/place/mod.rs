//! Where a job is kept, behind one trait every entry point opens it through: a state
//! directory ([`StateDirPlace`]), a job of a PostgreSQL database (`PgPlace`), or a store a
//! library program built (an `Arc` of any [`crate::store::Store`] + [`crate::store::Leases`]);
//! and any of them as the process that runs its job reads it ([`RunningPlace`]).
//!
//! A [`JobPlace`] says what its job is called in messages ([`PlaceNames`]), opens its store
//! to run the job (creating it when asked, and undoing that creation when the job is
//! refused: [`open_at`]), opens it for a reader (export, failures), takes one look at it
//! while a run may hold it ([`Look`]: the one rule for reading a store a run holds is the
//! state directory's, in [`StateDirPlace`]'s look), and reads its history. The command line, the
//! dashboard and the library's [`super::Job`] are functions over a place; a new backend is one
//! more implementation.

mod dir;
mod given;
mod job_place;
mod open_at;
#[cfg(feature = "postgres")]
mod pg;
mod running;
#[cfg(test)]
mod tests;

pub use dir::StateDirPlace;
#[cfg(feature = "postgres")]
pub use job_place::Crew;
pub use job_place::{HistoryError, JobPlace, Look, OpenedStore, PlaceNames};
pub use open_at::open_at;
pub(crate) use open_at::open_made;
#[cfg(feature = "postgres")]
pub use pg::PgPlace;
pub use running::RunningPlace;
