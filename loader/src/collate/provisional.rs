//! A pass's provisional first window: sent to the collator before it is
//! permuted, so that the first batch need not wait for the permutation,
//! and replaced by its permuted version between batches.

use std::time::Instant;

use super::{Collator, HeldWindow};
use crate::error::Result;
use crate::shuffle::LoadedWindow;
use crate::stats::Counters;

/// Batches a provisional window (a pass's first window, sent before it is
/// permuted) serves before the collator waits for its permuted version. Its
/// rows are gathered at random from every column of the decoded window, a
/// cache miss each where the window is large, on a core the permutation
/// needs: a 40-column table read in place, whose one window is its 1.15 M
/// rows, had nearly every batch of an epoch gathered so (its collate stage
/// busy 650 ms in 3 epochs, 170 ms without) while the permutation, done
/// twice over, arrived near the end; waiting after the first batch, its
/// first epoch ran 9% faster (docs/performance-notes.md). The first batch
/// still need not wait.
pub(crate) const PROVISIONAL_BATCHES: usize = 1;

impl Collator {
    /// Keep a received window; the permuted version of a window held
    /// provisionally waits for [`Collator::upgrade`] (rows of the batch being
    /// gathered may point into the provisional one).
    pub(super) fn hold(&mut self, window: LoadedWindow) {
        if self.windows.iter().any(|w| w.index == window.index) {
            self.upgrades.push(window);
        } else {
            self.windows.push(HeldWindow::new(window));
        }
    }

    /// Between batches: replace provisional windows by their permuted
    /// versions, received already or arrived since, or, once a provisional
    /// window has served [`PROVISIONAL_BATCHES`], waited for. The shuffle
    /// stage sends a window's permuted version (or its failure) right after
    /// the provisional one: a failure received here is that window's, and
    /// is the error of the next batch.
    pub(super) fn upgrade(&mut self) -> Result<()> {
        for window in std::mem::take(&mut self.upgrades) {
            if let Some(held) = self.windows.iter_mut().find(|w| w.index == window.index) {
                *held = HeldWindow::new(window);
            }
        }
        while self.windows.iter().any(|w| w.provisional) {
            let received = if self.provisional_batches >= PROVISIONAL_BATCHES {
                // Its permuted version is the next window the shuffle stage
                // sends; a stage that stopped is reported by `load`.
                let waiting = Instant::now();
                let received = self.windows_in.recv();
                Counters::add_time(&self.counters.collate_blocked_in_ns, waiting.elapsed());
                received.ok()
            } else {
                self.windows_in.try_recv().ok()
            };
            let Some(received) = received else {
                return Ok(());
            };
            match received {
                Ok(window) if self.windows.iter().any(|w| w.index == window.index) => {
                    let held = self
                        .windows
                        .iter_mut()
                        .find(|w| w.index == window.index)
                        .expect("found above");
                    *held = HeldWindow::new(window);
                }
                Err(e) => return Err(e),
                other => {
                    // A later window: for `load`, in order.
                    self.ahead.push_back(other);
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}
