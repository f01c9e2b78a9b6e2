//! `shard`: the entry point. Resolve and stage the inputs, take the output,
//! then run the pipeline, as one run or as one task of a split run.

use std::time::Instant;

use shardfeed_format::Location;

use crate::pipeline::{ShardSummary, write_dataset};
use crate::{PreprocessError, Result, ShardOptions, input, output, remote, task};

/// Turn `inputs` (files, folders, globs, local or object store URLs) into a dataset at `output`.
///
/// The manifest is written last, after every shard is in place; an error or
/// a kill at any point leaves no manifest (and so no dataset), and running
/// the same call again completes it.
pub fn shard(inputs: &[String], output: &str, options: &ShardOptions) -> Result<ShardSummary> {
    let started = Instant::now();
    options.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("shardfeed-io")
        .enable_all()
        .build()
        .map_err(|e| PreprocessError::io("start I/O runtime for", output, e))?;
    // Remote inputs are staged on local disk first (deleted at the end).
    let (local_inputs, _staged) = remote::stage(inputs, options, runtime.handle())?;
    let given = inputs.to_vec();
    let mut inputs = input::resolve(&local_inputs, options)?;
    // Messages name the inputs as the user gave them.
    inputs.given = given;
    let location = Location::parse_with_options(output, options.storage_options.iter().cloned())?;
    let handle = runtime.handle();
    output::prepare(&location, options.overwrite, handle)?;
    if let Some(task) = options.task {
        inputs.sources = task::split(std::mem::take(&mut inputs.sources), task)?;
        if let Some(seed) = options.shuffle_seed {
            // One global permutation across tasks: scatter through the store.
            return task::shuffled(&inputs, &location, options, task, seed, handle, started);
        }
    }
    write_dataset(&inputs, &location, options, handle, started)
}
