//! Freed memory handed back to the system only when the process passes its
//! limit, for `shard` under a budget below the default.
//!
//! The binary's allocator (mimalloc) keeps freed memory by default, so that
//! the large buffers `shard` frees and allocates all the time (read buffers,
//! decoded pages, row groups) are reused rather than faulted (and zeroed) in
//! again. Under a small `--memory-budget` the process must stay near the
//! budget; handing freed memory back at once did that at a high price: on
//! the blob set of docs/performance-notes.md a `shard --memory-budget 256MiB` took 3x the
//! time of the default budget (573,000 page faults against 41,000). Here
//! freed memory is kept while the process's resident size is under its
//! limit, and a watcher thread hands it all back once the resident size
//! passes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::MI_OPTION_PURGE_DELAY;

/// How often the watcher reads the resident size (a read of
/// `/proc/self/statm`, a few microseconds). Between two reads the process
/// allocates at most a few tens of MiB past its limit.
const EVERY: Duration = Duration::from_millis(5);

/// Milliseconds before mimalloc hands back freed memory by itself: long
/// enough that a run under its limit never pays for it, while freed memory
/// is still marked for the watcher's forced collection (mimalloc marks
/// nothing where purging is off).
const PURGE_DELAY_MS: libc::c_long = 1000;

/// The watcher: stops and joins when dropped.
pub(crate) struct Trim {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Trim {
    /// Start watching: whenever the resident size passes `limit` bytes,
    /// every freed page the allocator holds goes back to the system.
    /// `None` where the resident size cannot be read (then freed memory
    /// goes back at once, as the only bound left).
    pub(crate) fn start(limit: u64) -> Option<Trim> {
        if resident_bytes().is_none() {
            // SAFETY: sets an allocator option; valid at any time.
            unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
            return None;
        }
        // SAFETY: sets an allocator option; valid at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("shardfeed-trim".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    if resident_bytes().is_some_and(|r| r > limit) {
                        // SAFETY: a collection of this thread's (empty) heap
                        // and a forced purge of the freed memory every thread
                        // handed back to the allocator's arenas.
                        unsafe { libmimalloc_sys::mi_collect(true) };
                    }
                    std::thread::park_timeout(EVERY);
                }
            })
            .ok()?;
        Some(Trim {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Trim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// The process's resident size (`/proc/self/statm`), `None` where the
/// system does not say.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page).ok()?)
}
