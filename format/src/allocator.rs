//! What the `shardfeed` command and the Python extension, which both
//! allocate with mimalloc, set before their first allocation.

/// Defines a hook, run when the binary or shared library that expands it is
/// loaded (before `main`, or before a Python extension's init, and so
/// before the first allocation reserves mimalloc's first arena): unless
/// `MIMALLOC_ALLOW_THP` is set in the environment, mimalloc does not advise
/// transparent huge pages (`MADV_HUGEPAGE`) for its arenas, and the
/// system's policy applies (with the common `madvise` policy, 4 KiB pages).
///
/// Why: each first touch of an advised huge page zeroes 2 MiB, and on a
/// virtual machine whose host takes back free guest memory (free page
/// reporting) it is faulted in again on the host too: there a fresh `bench`
/// spent 85% of its time before the first batch in that zeroing, and its
/// first epoch ran at half the steady rate (docs/performance-notes.md, "No huge page
/// advice"). mimalloc is initialised first, so that the option only drops
/// the advice: set before, mimalloc would turn huge pages off for the whole
/// process (in a Python trainer, torch's and numpy's memory too).
///
/// The expanding crate depends on `libc` and `libmimalloc-sys` (v3's
/// option numbering).
#[macro_export]
macro_rules! mimalloc_without_huge_page_advice {
    () => {
        #[cfg(target_os = "linux")]
        #[used]
        #[unsafe(link_section = ".init_array")]
        static NO_HUGE_PAGE_ADVICE: extern "C" fn() = {
            /// mimalloc's `allow_thp` option.
            const MI_OPTION_ALLOW_THP: ::libmimalloc_sys::mi_option_t = 43;
            extern "C" fn no_huge_page_advice() {
                // SAFETY: reads the environment (a NUL-terminated name)
                // before any thread of ours starts; allocates nothing.
                if unsafe { ::libc::getenv(c"MIMALLOC_ALLOW_THP".as_ptr()) }.is_null() {
                    // SAFETY: mimalloc's initialisation (idempotent) and an
                    // option; valid at any time.
                    unsafe {
                        ::libmimalloc_sys::mi_process_init();
                        ::libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0);
                    }
                }
            }
            no_huge_page_advice
        };
    };
}
