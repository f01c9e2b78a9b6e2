//! A terminal progress bar for `shard`.

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use shardfeed_preprocess::Progress;

/// Rows, MB/s and ETA on stderr.
pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    /// A bar when stdout and stderr are terminals; `None` otherwise.
    pub fn new_if_terminal() -> Option<Arc<Bar>> {
        if !crate::interactive() {
            return None;
        }
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>8} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} ({prefix} rows)",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_message("shard");
        Some(Arc::new(Bar { bar }))
    }

    /// Clear the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bar {
    fn start(&self, input_bytes: u64) {
        self.bar.set_length(input_bytes);
    }
    fn advance(&self, rows: u64, bytes: u64) {
        self.bar.inc(bytes);
        let done: u64 = self.bar.prefix().parse().unwrap_or(0) + rows;
        self.bar.set_prefix(done.to_string());
    }
    fn phase(&self, name: &str) {
        self.bar.set_message(name.to_string());
    }
}
