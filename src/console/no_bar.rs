//! Built without the feature `progress-bar`: no bar can be shown, so [`Bar::show`] says
//! `None` and the monitor reports by progress events instead; standard error is written
//! directly.

use std::io::{self, Write};

/// Write bytes to standard error.
pub(crate) fn write_stderr(bytes: &[u8]) {
    let _ = io::stderr().write_all(bytes);
}

/// No bar: this build has none (a value of it cannot exist).
pub(crate) enum Bar {}

impl Bar {
    /// Always `None`: the crate was built without the feature `progress-bar`.
    pub(crate) fn show() -> Option<Bar> {
        None
    }

    /// Never called: no `Bar` exists.
    pub(crate) fn set_total(&self, _rows: u64) {
        match *self {}
    }

    /// Never called: no `Bar` exists.
    pub(crate) fn update(&self, _rows_done: u64, _message: String) {
        match *self {}
    }
}
