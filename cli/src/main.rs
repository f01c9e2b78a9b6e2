//! The `shardfeed` binary: process set-up, then [`shardfeed_cli::run`].

use std::process::ExitCode;

/// Row groups and batches are large buffers that come and go all the time:
/// mimalloc reuses them without page faults and returns freed memory to the
/// OS, so the process stays near its configured budget (glibc's allocator
/// kept ~100 MB of freed heap mapped in the shuffle test).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// No huge page advice for mimalloc's arenas (why: the macro's docs).
#[cfg(feature = "mimalloc")]
shardfeed_format::mimalloc_without_huge_page_advice!();

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`shardfeed inspect | head`) like other tools.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Decoded row groups are large buffers freed and reallocated all the time:
    // keep freed memory instead of returning it to the OS, so it is reused
    // instead of page-faulted (and zeroed) in again. Memory stays bounded by
    // the configured budgets; `shard` under a small budget hands freed memory
    // back when the process passes it (`trim.rs`).
    // SAFETY: sets an allocator option; valid at any time.
    #[cfg(feature = "mimalloc")]
    unsafe {
        libmimalloc_sys::mi_option_set(shardfeed_cli::MI_OPTION_PURGE_DELAY, -1)
    };
    shardfeed_cli::keep_c_heap();
    ExitCode::from(shardfeed_cli::run(std::env::args_os()))
}
