//! The terminal progress bar (indicatif, feature `progress-bar`), and writing to standard
//! error above it: while a bar is shown, each line is printed above it (the bar is cleared,
//! the line written, the bar redrawn), so neither tears the other.

use std::io::{self, Write};
use std::sync::RwLock;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar on screen, if any.
static BAR: RwLock<Option<ProgressBar>> = RwLock::new(None);

/// Write bytes to standard error, above the bar if one is shown.
pub(crate) fn write_stderr(bytes: &[u8]) {
    let bar = BAR.read().ok().and_then(|b| b.clone());
    match bar {
        Some(bar) => bar.suspend(|| {
            let _ = io::stderr().write_all(bytes);
        }),
        None => {
            let _ = io::stderr().write_all(bytes);
        }
    }
}

/// The terminal progress bar of a run. Dropping it clears it from the screen.
pub(crate) struct Bar {
    bar: ProgressBar,
}

const COUNTING: &str = "{spinner} {elapsed_precise} {pos} rows done (counting the input...) {msg}";
const KNOWN: &str = "{spinner} {elapsed_precise} [{bar:30}] {pos}/{len} rows {msg}";

impl Bar {
    /// Show a bar on standard error (always `Some`; `None` only where the crate is built
    /// without the bar).
    pub(crate) fn show() -> Option<Bar> {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4));
        bar.set_style(style(COUNTING));
        bar.enable_steady_tick(Duration::from_millis(250));
        if let Ok(mut slot) = BAR.write() {
            *slot = Some(bar.clone());
        }
        Some(Bar { bar })
    }

    /// The input's row count became known.
    pub(crate) fn set_total(&self, rows: u64) {
        if self.bar.length().is_none() {
            self.bar.set_style(style(KNOWN));
        }
        self.bar.set_length(rows);
    }

    /// Rows settled (their IDs done, or duplicates and bad lines) and the rest of the line.
    pub(crate) fn update(&self, rows_done: u64, message: String) {
        self.bar.set_position(rows_done);
        self.bar.set_message(message);
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("the templates are valid")
        .progress_chars("=> ")
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Ok(mut slot) = BAR.write() {
            *slot = None;
        }
        self.bar.finish_and_clear();
    }
}
