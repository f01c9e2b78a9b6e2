//! `shardfeed._native`: the thin Python binding over the loader and `shard`.
//!
//! Batches reach Python as numpy arrays that are views of the batch's slab
//! (no copy): every array's base is a small view object that keeps the batch,
//! and so its slab, leased until the last array over it is gone. numpy arrays
//! export DLPack, so `torch.from_dlpack` and `jax.dlpack.from_dlpack` take
//! them without a copy too.
//!
//! The GIL is released while the loader builds, while it waits for a batch
//! (checking for signals every 20 ms, so Ctrl-C interrupts the wait) and
//! while `shard` and `verify` run. A loader used in a forked child rebuilds
//! its threads there, at the position the parent had reached.
//!
//! Modules: `loader` (the `Loader` class), `arrays` (batches as numpy
//! arrays over their slab), `dataset` (`shard`, `commit`, `inspect`,
//! `verify`), `seeds` (numpy's seeding of a transform's
//! generator, without numpy), `args` (arguments converted with the option's name in every
//! error), `errors` (Rust errors as Python exceptions).

mod args;
mod arrays;
mod dataset;
mod errors;
mod loader;
mod seeds;

use pyo3::prelude::*;

use crate::arrays::SlabView;
use crate::dataset::{commit, index, inspect, shard, verify};
use crate::errors::ShardfeedError;
use crate::loader::PyLoader;

// The extension's allocations go to the system allocator, not to mimalloc as
// the `shardfeed` binary's do: a Python trainer forks (a DataLoader's
// workers, multiprocessing) while the loader's threads run, and glibc's malloc
// takes its locks around `fork`, while mimalloc has no fork handlers: a child
// forked while one of the loader's threads held one of mimalloc's locks (a
// thread starting or exiting) hung at its first allocation (1 fork in 3,000
// with loaders coming and going; none in 2,000 with glibc's malloc). jemalloc,
// fork-safe too, read token lists and tables 20-25% slower here
// (docs/performance-notes.md).

/// Run the `shardfeed` command with `argv` (the program's name first) and
/// return its exit code: the package's `shardfeed` console command. The GIL
/// is released while it runs.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    // The command's own process: the C heap kept between uses, as the binary
    // keeps it (with the system allocator, Rust's allocations too).
    shardfeed_cli::keep_c_heap();
    py.detach(|| i32::from(shardfeed_cli::run(argv)))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Log records go to Python's `logging` (loggers named after the Rust
    // modules, e.g. `shardfeed_loader.loader`).
    pyo3_log::init();
    m.add_class::<PyLoader>()?;
    m.add_class::<SlabView>()?;
    m.add_function(wrap_pyfunction!(shard, m)?)?;
    m.add_function(wrap_pyfunction!(commit, m)?)?;
    m.add_function(wrap_pyfunction!(index, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(seeds::_seed_state, m)?)?;
    m.add_class::<loader::SavedState>()?;
    m.add("ShardfeedError", m.py().get_type::<ShardfeedError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
