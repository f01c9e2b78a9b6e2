//! `shard`: the entry point. Resolve and stage the inputs, take the output,
//! then run the pipeline, as one run or as one task of a split run.

use std::time::Instant;

use shardfeed_format::Location;

use shardfeed_format::failpoint::Failpoints;

use crate::lock::{Lock, check_unlocked, run_id};
use crate::pipeline::{ShardSummary, write_dataset};
use crate::tokenize::TextTokenizer;
use crate::{PreprocessError, Result, ShardOptions, input, output, remote, task};

/// Turn `inputs` (files, folders, globs, local or object store URLs) into a dataset at `output`.
///
/// The manifest is written last, after every shard is in place; an error or
/// a kill at any point leaves no manifest (and so no dataset), and running
/// the same call again completes it. A second `shard` (or `commit`) into the
/// same output while one runs is refused (see [`crate::LOCK_FILE`]).
pub fn shard(inputs: &[String], output: &str, options: &ShardOptions) -> Result<ShardSummary> {
    let started = Instant::now();
    options.validate()?;
    let mut options = options.clone();
    options.attempt = run_id();
    options.failpoints = Failpoints::from_env().map_err(|reason| PreprocessError::BadOption {
        option: "SHARDFEED_FAILPOINTS",
        reason,
    })?;
    if options.task.is_some() && !options.shuffle_chosen {
        // A split run shuffles across tasks only when asked: that changes
        // how its tasks must run (all at once, or two rounds).
        options.shuffle_seed = None;
    }
    let options = &mut options;
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
    // A bad tokenizer or text column fails before any output is touched.
    options.text_tokenizer = options
        .tokenize
        .as_ref()
        .map(|t| {
            TextTokenizer::new(t, &inputs.schema, options.memory_budget / 2)
                .map(std::sync::Arc::new)
        })
        .transpose()?;
    let location = Location::parse_with_options(output, options.storage_options.iter().cloned())?;
    let handle = runtime.handle();
    let Some(split) = options.task else {
        if let Some(seed) = options.shuffle_seed {
            options.files_permuted = input::permute_files(&mut inputs, seed);
        }
        let lock = Lock::acquire(&location, handle, "shard", &options.attempt)?;
        output::prepare(&location, options.overwrite, handle)?;
        let summary = write_dataset(&inputs, &location, options, handle, started)?;
        lock.release()?;
        return Ok(summary);
    };
    // A task of a split run: no lock (tasks run side by side), but none may
    // be held by a single run or a commit.
    check_unlocked(&location, handle)?;
    options.run = match &options.run_id {
        Some(id) => id.clone(),
        None => task::run_fingerprint(&inputs, options, split.count)?,
    };
    task::claim_output(&location, options, handle)?;
    output::prepare(&location, options.overwrite, handle)?;
    inputs.sources = task::split(std::mem::take(&mut inputs.sources), split)?;
    if let Some(seed) = options.shuffle_seed {
        // One global permutation across tasks: scatter through the store.
        return task::shuffled(&inputs, &location, options, split, seed, handle, started);
    }
    write_dataset(&inputs, &location, options, handle, started)
}
