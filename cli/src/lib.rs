//! The `shardfeed` command: [`run`] takes its arguments and returns its exit
//! code. The `shardfeed` binary (`cargo install --path cli`) calls it, and so
//! does the Python package's `shardfeed` command (`pip install ./python`),
//! so both are the same program.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use shardfeed_format::Location;
use shardfeed_format::size::{format_size, parse_size};
use shardfeed_preprocess::{InputFormat, ShardOptions, TokenizeOptions};

mod bench;
mod generate;
mod inspect;
mod progress;
mod report;
#[cfg(all(feature = "mimalloc", target_os = "linux"))]
mod trim;

/// shardfeed: shard datasets into zstd Parquet, then stream them to GPUs.
#[derive(Parser)]
#[command(name = "shardfeed", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Turn inputs (files, folders, globs) into zstd Parquet shards plus a manifest.
    ///
    /// Inputs: Parquet (any codec), Arrow IPC (file or stream), JSON Lines, CSV
    /// with a header, or a folder of files (one row per file: path, label from
    /// the parent folder, bytes). Formats are detected by extension.
    ///
    /// Memory: bounded by --memory-budget, whatever the input size. Readers hold
    /// at most two batches (~2 MiB each) per thread (five while a shuffle
    /// scatters) plus one input row group's pages; row groups are at most 1/8
    /// of the budget and those in flight between reading, encoding and
    /// writing are capped to a quarter of it; a --shuffle
    /// spills rows to buckets on disk, each sized to a quarter of the budget, and
    /// permutes one bucket at a time. Below the default budget, freed memory goes
    /// back to the OS whenever the process's resident size passes the budget
    /// plus 64 MiB (above it, it is kept for reuse).
    Shard(ShardArgs),
    /// Write the manifest of a split run (`shard --num-tasks N --task-index I`)
    /// once every task has finished: checks every task's record, schema and
    /// shards, and refuses (naming the missing tasks) until all are there.
    Commit {
        /// Dataset URL or path (the --output of the tasks).
        dataset: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// An object store option (repeatable).
        #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = storage_option)]
        storage_options: Vec<(String, String)>,
    },
    /// Write an index over existing Parquet files, read where they lie (no copy).
    ///
    /// Reads only the files' footers (one range request per file, many at
    /// once) and records, per file, its row groups, footer and a fingerprint
    /// (size, ETag/version or modification time, footer checksum) that the
    /// loader checks before it reads the file. `Loader(INDEX)` and `bench`
    /// then read the files in place like a dataset. Inputs: local files,
    /// folders (their `*.parquet` files) and globs, `s3://`, `gs://`,
    /// `az://` and `http(s)://` prefixes and globs, or Hugging Face Hub
    /// datasets (`hf://datasets/ORG/NAME[@REV]/PATH_GLOB`, pinned to the
    /// revision's commit; `HF_TOKEN` for private ones). All files must share
    /// one schema (a column may be nullable in some and not in others).
    Index {
        /// Parquet files, folders, globs or object store prefixes.
        #[arg(required = true)]
        inputs: Vec<String>,
        /// Where to write the index (a folder or prefix; it gets a manifest.json).
        #[arg(short, long)]
        output: String,
        /// Also read every byte once and record the whole file's and each
        /// column chunk's checksums, so the loader verifies the data.
        #[arg(long)]
        checksums: bool,
        /// Add files not yet in the index at OUTPUT, keeping its entries and order.
        #[arg(long, conflicts_with = "overwrite")]
        update: bool,
        /// Replace what OUTPUT holds.
        #[arg(long)]
        overwrite: bool,
        /// Files read at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// An object store option (repeatable).
        #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = storage_option)]
        storage_options: Vec<(String, String)>,
    },
    /// Print a dataset's summary: rows, shards, sizes, compression ratio, schema.
    Inspect {
        /// Dataset URL or path.
        dataset: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// An object store option (repeatable).
        #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = storage_option)]
        storage_options: Vec<(String, String)>,
        /// Also read the binary columns' image headers: formats and size ranges.
        #[arg(long)]
        images: bool,
        /// With --images: rows to read (in storage order), 0 for all.
        #[arg(long, default_value_t = 10_000)]
        sample: u64,
    },
    /// Read every shard fully; check sizes, checksums and row counts against the manifest.
    Verify {
        /// Dataset URL or path.
        dataset: String,
        /// Threads (0: all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// An object store option (repeatable).
        #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = storage_option)]
        storage_options: Vec<(String, String)>,
    },
    /// Stream a dataset through the loader: rows/s, MB/s, time to first batch,
    /// and with --step-ms the fraction of time a trainer would wait for data.
    Bench(bench::BenchArgs),
    /// Write a seeded synthetic dataset (tokens, tabular, images, kitchen-sink, text).
    Generate(generate::GenerateArgs),
    /// The main job on a built-in default: generate a token dataset, shard it,
    /// verify it, then stream it through the loader and report throughput.
    Demo {
        /// Work folder (a temporary folder by default).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Rows to generate.
        #[arg(long, default_value_t = 20_000)]
        rows: u64,
    },
}

#[derive(Args)]
struct ShardArgs {
    /// Input files, folders or globs.
    #[arg(required = true)]
    inputs: Vec<String>,
    /// The dataset to write (path or URL).
    #[arg(long, short)]
    output: String,
    /// Target compressed bytes per shard (e.g. 64MiB, 1GB).
    #[arg(long, default_value = "128MiB")]
    shard_size: String,
    /// Rows per row group (default: sized by --row-group-size).
    #[arg(long)]
    row_group_rows: Option<u64>,
    /// Target uncompressed bytes per row group, when --row-group-rows is not
    /// given (default: 8MiB, and 2MiB once rows average over 64KiB: images,
    /// audio).
    #[arg(long)]
    row_group_size: Option<String>,
    /// zstd compression level (1-22).
    #[arg(long, default_value_t = shardfeed_preprocess::DEFAULT_ZSTD_LEVEL)]
    zstd_level: i32,
    /// Shuffle all rows globally (the default for a single run; works for
    /// inputs larger than memory). A split run shuffles across its tasks only
    /// with --shuffle: then every task must run at once, or in two rounds (--stage).
    #[arg(long, conflicts_with = "no_shuffle")]
    shuffle: bool,
    /// Keep the input order, for data that must stay ordered (the loader then
    /// mixes only within its windows).
    #[arg(long)]
    no_shuffle: bool,
    /// Seed of the shuffle.
    #[arg(long, default_value_t = shardfeed_preprocess::DEFAULT_SHUFFLE_SEED)]
    seed: u64,
    /// Memory budget for in-flight data.
    #[arg(long, default_value = "1GiB")]
    memory_budget: String,
    /// Threads for reading, encoding and compression (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Replace an existing dataset.
    #[arg(long)]
    overwrite: bool,
    /// The most columns a dataset may have (default: what the memory budget
    /// holds at about 64 KiB a column while shards are written).
    #[arg(long)]
    max_columns: Option<u64>,
    /// Read files that symbolic links in a folder input lead to outside the
    /// folder (by default such links are skipped and listed).
    #[arg(long)]
    follow_links: bool,
    /// Input format, instead of detecting it: parquet, arrow, jsonl, csv, files.
    #[arg(long)]
    format: Option<String>,
    /// Arrow schema (JSON, as in a manifest's "schema") for JSON Lines and CSV inputs.
    #[arg(long)]
    schema: Option<PathBuf>,
    /// Folder for shuffle spill files.
    #[arg(long)]
    temp_dir: Option<PathBuf>,
    /// Split the run into this many independent tasks (see --task-index and `commit`).
    #[arg(long, requires = "task_index")]
    num_tasks: Option<usize>,
    /// Which task of --num-tasks this is (0-based): reads a deterministic part of
    /// the inputs (Parquet row groups, or whole files of other formats), writes its
    /// own shards and a task record; `shardfeed commit` then writes the manifest.
    /// With --shuffle, the tasks exchange rows through the output store (scatter,
    /// then gather), so the committed dataset is one global permutation.
    #[arg(long, requires = "num_tasks")]
    task_index: Option<usize>,
    /// Stages of a shuffled task: `both` (scatter, wait for every task's scatter,
    /// gather: all tasks must run at once), or `scatter` then `gather` as two
    /// rounds of tasks.
    #[arg(long, default_value = "both", requires = "num_tasks")]
    stage: String,
    /// The split run's identity (e.g. the engine's job id), the same for
    /// every task; by default a fingerprint of the inputs and options.
    /// `commit` refuses task records of different runs.
    #[arg(long, requires = "num_tasks")]
    run_id: Option<String>,
    /// Seconds a shuffled task waits for the other tasks' scatter.
    #[arg(long, default_value_t = 3600)]
    wait_timeout: u64,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
    /// An object store option for the output, e.g. aws_endpoint=http://127.0.0.1:9000
    /// (repeatable). Credentials also come from each cloud's environment variables.
    #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = storage_option)]
    storage_options: Vec<(String, String)>,
    /// Tokenize a text column with this Hugging Face tokenizer file
    /// (tokenizer.json): the ids go to --tokens-column (`list<int32>`) with
    /// num_tokens beside them, and the text column is dropped.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The string column to tokenize.
    #[arg(long, default_value = "text", requires = "tokenizer")]
    text_column: String,
    /// The column the token ids go to.
    #[arg(long, default_value = "input_ids", requires = "tokenizer")]
    tokens_column: String,
    /// Append the tokenizer's end-of-text token to every document.
    #[arg(long, requires = "tokenizer")]
    add_eos: bool,
    /// The end-of-text token, when the tokenizer marks none.
    #[arg(long, requires = "tokenizer")]
    eos_token: Option<String>,
    /// Keep the text column beside the token ids.
    #[arg(long, requires = "tokenizer")]
    keep_text: bool,
    /// Refuse a null text (by default rows with a null text are skipped and counted).
    #[arg(long, requires = "tokenizer")]
    strict: bool,
}

/// Parse `KEY=VALUE`.
pub(crate) fn storage_option(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| "expected KEY=VALUE".to_string())
}

fn size_arg(option: &str, value: &str) -> Result<u64> {
    parse_size(value).with_context(|| format!("invalid {option}"))
}

fn shard_options(args: &ShardArgs) -> Result<ShardOptions> {
    let mut options = ShardOptions::default()
        .with_shard_size(size_arg("--shard-size", &args.shard_size)?)
        .with_zstd_level(args.zstd_level)
        .with_memory_budget(size_arg("--memory-budget", &args.memory_budget)?)
        .with_threads(args.threads)
        .with_overwrite(args.overwrite)
        .with_follow_links(args.follow_links);
    if let Some(size) = &args.row_group_size {
        options = options.with_row_group_bytes(size_arg("--row-group-size", size)?);
    }
    if let Some(columns) = args.max_columns {
        options = options.with_max_columns(columns);
    }
    if let Some(rows) = args.row_group_rows {
        options = options.with_row_group_rows(rows);
    }
    if args.no_shuffle {
        options = options.without_shuffle();
    } else if args.shuffle {
        options = options.with_shuffle(args.seed);
    } else if args.seed != shardfeed_preprocess::DEFAULT_SHUFFLE_SEED {
        if args.num_tasks.is_some() {
            bail!(
                "--seed: a split run shuffles across its tasks only with --shuffle (then every task runs at once, or in two rounds with --stage); add --shuffle, or drop --seed"
            );
        }
        options = options.with_shuffle(args.seed);
    }
    if let Some(format) = &args.format {
        options = options.with_format(format.parse::<InputFormat>()?);
    }
    if let Some(path) = &args.schema {
        let text = std::fs::read(path)
            .with_context(|| format!("cannot read --schema {}", path.display()))?;
        let schema: arrow_schema::Schema = serde_json::from_slice(&text).with_context(|| {
            format!("--schema {} is not an Arrow schema in JSON", path.display())
        })?;
        options = options.with_schema(Arc::new(schema));
    }
    if let Some(dir) = &args.temp_dir {
        options = options.with_temp_dir(dir);
    }
    for (key, value) in &args.storage_options {
        options = options.with_storage_option(key, value);
    }
    if let Some(path) = &args.tokenizer {
        let mut t = TokenizeOptions::new(path)
            .with_text_column(&args.text_column)
            .with_tokens_column(&args.tokens_column)
            .with_add_eos(args.add_eos)
            .with_keep_text(args.keep_text)
            .with_strict(args.strict);
        if let Some(eos) = &args.eos_token {
            t = t.with_eos_token(eos);
        }
        options = options.with_tokenizer(t);
    }
    if let (Some(count), Some(index)) = (args.num_tasks, args.task_index) {
        options = options
            .with_task(index, count)
            .with_stage(args.stage.parse()?)
            .with_wait_timeout(std::time::Duration::from_secs(args.wait_timeout));
        if let Some(run) = &args.run_id {
            options = options.with_run_id(run);
        }
    }
    options.validate()?;
    Ok(options)
}

/// Stop glibc's allocator from handing memory back to the OS between uses.
///
/// Rust's allocations go to mimalloc; the C allocator serves libzstd, whose
/// compression context (1-2 MB) parquet's writer makes afresh for every
/// column chunk. With glibc's adaptive thresholds each one was mapped (or
/// trimmed off the heap) and page-faulted back in, zeroed: 318,000 page
/// faults (1.2 GB) and a third of the CPU time in the kernel for `shard` of a
/// 600 MB, 40-column table. Fixed thresholds keep freed contexts for the next
/// column chunk; what is kept is bounded by what libzstd used at once.
pub fn keep_c_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` sets allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// Bytes a `shard` process holds beside its `--memory-budget` before it hands
/// freed memory back (the binary, its threads' stacks and allocator caches,
/// parquet's and the readers' working buffers).
#[cfg(all(feature = "mimalloc", target_os = "linux"))]
const PROCESS_BYTES: u64 = 64 << 20;

/// mimalloc's `purge_delay` option (milliseconds before freed memory goes back to the OS).
#[cfg(feature = "mimalloc")]
pub const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn run_shard(args: &ShardArgs) -> Result<()> {
    let mut options = shard_options(args)?;
    // A budget below the default was asked for: freed memory goes back to
    // the system whenever the process passes the budget plus
    // [`PROCESS_BYTES`] (the binary's allocator; the Python package's has
    // its own decay).
    #[cfg(all(feature = "mimalloc", target_os = "linux"))]
    let _trim = (options.memory_budget < shardfeed_preprocess::DEFAULT_MEMORY_BUDGET)
        .then(|| trim::Trim::start(options.memory_budget.saturating_add(PROCESS_BYTES)));
    #[cfg(all(feature = "mimalloc", not(target_os = "linux")))]
    if options.memory_budget < shardfeed_preprocess::DEFAULT_MEMORY_BUDGET {
        // SAFETY: sets an allocator option; valid at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    }
    let bar = progress::Bar::new_if_terminal();
    if let Some(bar) = &bar {
        options = options.with_progress(bar.clone());
    }
    let summary = shardfeed_preprocess::shard(&args.inputs, &args.output, &options);
    if let Some(bar) = &bar {
        bar.finish();
    }
    let summary = summary?;
    if args.json {
        bench::emit(&format!("{}\n", serde_json::to_string_pretty(&summary)?))?;
    } else {
        println!(
            "wrote {} rows in {} shards ({} row groups) to {}\n  input {} -> output {} (ratio {:.2}) in {:.2} s: {:.1} MB/s with {} threads",
            summary.rows,
            summary.shards,
            summary.row_groups,
            summary.dataset,
            format_size(summary.input_bytes),
            format_size(summary.output_bytes),
            summary.compression_ratio,
            summary.seconds,
            summary.input_mb_per_s,
            summary.threads,
        );
        if let Some(tokens) = summary.tokens {
            println!(
                "  {tokens} tokens ({:.1} per row){}",
                tokens as f64 / summary.rows.max(1) as f64,
                if summary.null_texts_skipped > 0 {
                    format!(
                        "; {} rows with a null text skipped (--strict refuses them)",
                        summary.null_texts_skipped
                    )
                } else {
                    String::new()
                }
            );
        }
        if !summary.skipped_inputs.is_empty() {
            println!(
                "  left out {} input files or folders:",
                summary.skipped_inputs.len()
            );
            for skip in summary.skipped_inputs.iter().take(10) {
                println!("    {} ({})", skip.path, skip.reason);
            }
            if summary.skipped_inputs.len() > 10 {
                println!("    ... (--json lists them all)");
            }
        }
    }
    Ok(())
}

fn run_commit(dataset: &str, json: bool, storage_options: &[(String, String)]) -> Result<()> {
    let summary = shardfeed_preprocess::commit(dataset, storage_options)?;
    if json {
        bench::emit(&format!("{}\n", serde_json::to_string_pretty(&summary)?))?;
    } else {
        println!(
            "{} {}: {} rows in {} shards from {} tasks",
            if summary.already_committed {
                "already committed"
            } else {
                "committed"
            },
            summary.dataset,
            summary.rows,
            summary.shards,
            summary.tasks
        );
    }
    Ok(())
}

fn run_index(
    inputs: &[String],
    output: &str,
    options: &shardfeed_preprocess::IndexOptions,
    json: bool,
) -> Result<()> {
    let summary = shardfeed_preprocess::index(inputs, output, options)?;
    if json {
        bench::emit(&format!("{}\n", serde_json::to_string_pretty(&summary)?))?;
    } else {
        println!(
            "indexed {}: {} files ({} added), {} rows in {} row groups, {}{}",
            summary.index,
            summary.files,
            summary.added,
            summary.rows,
            summary.row_groups,
            shardfeed_format::size::format_size(summary.bytes),
            if summary.checksums {
                ", with checksums"
            } else {
                ""
            }
        );
        if !summary.gone.is_empty() || !summary.changed.is_empty() {
            println!(
                "  kept as indexed, refused by loaders: {} no longer found, {} changed (index again with --overwrite to drop or re-read them)",
                summary.gone.len(),
                summary.changed.len()
            );
        }
    }
    Ok(())
}

fn run_verify(
    dataset: &str,
    threads: usize,
    json: bool,
    storage_options: &[(String, String)],
) -> Result<bool> {
    let location = Location::parse_with_options(dataset, storage_options.iter().cloned())?;
    let report = shardfeed_loader::verify_dataset_with(&location, storage_options, threads)?;
    if json {
        bench::emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else if report.ok() {
        println!(
            "ok: {} shards, {} rows, {} verified",
            report.shards,
            report.rows,
            format_size(report.bytes)
        );
    } else {
        for p in &report.problems {
            eprintln!("bad shard {}: {}", p.shard, p.problem);
        }
        eprintln!(
            "{} of {} shards failed verification",
            report.problems.len(),
            report.shards
        );
    }
    Ok(report.ok())
}

fn run_demo(dir: Option<PathBuf>, rows: u64) -> Result<()> {
    let temp;
    let dir = match dir {
        Some(d) => d,
        None => {
            temp = tempfile_dir()?;
            temp.clone()
        }
    };
    let raw = dir.join("raw");
    let dataset = dir.join("dataset");
    println!("generating {rows} token rows under {}", raw.display());
    let files = shardfeed_fixtures::write_dataset(
        &raw,
        shardfeed_fixtures::Kind::Tokens,
        rows,
        4,
        0,
        shardfeed_fixtures::FileFormat::Parquet(parquet::basic::Compression::SNAPPY),
    )?;
    let options = ShardOptions::default()
        .with_shard_size(32 << 20)
        .with_shuffle(0)
        .with_overwrite(true);
    let inputs: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let summary = shardfeed_preprocess::shard(&inputs, &dataset.display().to_string(), &options)?;
    println!(
        "shard: {} rows -> {} shards, {} -> {} (ratio {:.2}), {:.1} MB/s",
        summary.rows,
        summary.shards,
        format_size(summary.input_bytes),
        format_size(summary.output_bytes),
        summary.compression_ratio,
        summary.input_mb_per_s
    );
    if !run_verify(&dataset.display().to_string(), 0, false, &[])? {
        bail!("the demo dataset failed verification");
    }
    println!("stream: shuffled batches of 256 rows through the loader");
    let args = bench::BenchArgs {
        dataset: Some(dataset.display().to_string()),
        batch_size: 256,
        columns: None,
        threads: 0,
        epochs: 1,
        step_ms: None,
        pad_to: None,
        no_shuffle: false,
        seed: 0,
        window: None,
        prefetch: None,
        byte_budget: "1GiB".into(),
        pinning: "auto".into(),
        json: false,
        inject_latency_ms: None,
        inject_failure_rate: None,
        storage_options: Vec::new(),
        cache_dir: None,
        cache_limit: None,
        pread: false,
        on_error: "fail".into(),
        max_skipped: shardfeed_loader::DEFAULT_MAX_SKIPPED,
        trace: None,
        report: None,
        mix: Vec::new(),
        mix_stop: "first_exhausted".into(),
        pack_to: None,
        pack_mode: "split".into(),
        eos_id: None,
        pack_window: None,
        max_batches: None,
        decode_images: None,
        image_size: "224".into(),
        crop: "random_resized".into(),
        flip: false,
        decode_only: false,
        rebuild_each_epoch: false,
    };
    bench::print(&bench::measure(&args)?, false)?;
    println!("dataset: {}", dataset.display());
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("shardfeed-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Run the command line `args` (the program's name first, as
/// `std::env::args_os` gives it) and return the exit code: 0 on success, 1
/// when the command failed (its error is printed on stderr), 2 for a command
/// line clap refuses. The process's allocator settings and signal
/// dispositions are the caller's (see the binary's `main`).
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    // Warnings (skipped row groups, retries) on stderr; `SHARDFEED_LOG` (or
    // `RUST_LOG`) sets the filter, e.g. `SHARDFEED_LOG=shardfeed_loader=debug`.
    // Where a subscriber or logger is already set (the Python package's
    // command forwards to Python's `logging`), that one stays.
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHARDFEED_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print on stdout and succeed.
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let result = match cli.command {
        Command::Shard(args) => run_shard(&args).map(|()| true),
        Command::Commit {
            dataset,
            json,
            storage_options,
        } => run_commit(&dataset, json, &storage_options).map(|()| true),
        Command::Index {
            inputs,
            output,
            checksums,
            update,
            overwrite,
            concurrency,
            json,
            storage_options,
        } => {
            let options = shardfeed_preprocess::IndexOptions {
                checksums,
                update,
                overwrite,
                storage_options,
                concurrency,
            };
            run_index(&inputs, &output, &options, json).map(|()| true)
        }
        Command::Inspect {
            dataset,
            json,
            storage_options,
            images,
            sample,
        } => {
            inspect::run(&dataset, json, &storage_options, images.then_some(sample)).map(|()| true)
        }
        Command::Verify {
            dataset,
            threads,
            json,
            storage_options,
        } => run_verify(&dataset, threads, json, &storage_options),
        Command::Generate(args) => generate::run(&args).map(|()| true),
        Command::Bench(args) if args.decode_only => bench::decode_only(&args)
            .and_then(|r| {
                if args.json {
                    bench::emit(&format!("{}\n", serde_json::to_string_pretty(&r)?))?;
                } else {
                    println!(
                        "decode only: {} images on {} threads in {:.2} s: {:.0} images/s, {:.1} MB/s",
                        r.images, r.threads, r.seconds, r.images_per_s, r.mb_per_s
                    );
                }
                Ok(())
            })
            .map(|()| true),
        Command::Bench(args) => bench::measure(&args)
            .and_then(|r| bench::print(&r, args.json))
            .map(|()| true),
        Command::Demo { dir, rows } => run_demo(dir, rows).map(|()| true),
    };
    match result {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            // Each cause once: library errors often repeat their source's
            // message in their own.
            let mut message = e.to_string();
            for cause in e.chain().skip(1) {
                let cause = cause.to_string();
                if !message.contains(&cause) {
                    message = format!("{message}: {cause}");
                }
            }
            eprintln!("error: {message}");
            1
        }
    }
}

/// Whether progress bars should be drawn: only when a person is watching.
pub(crate) fn interactive() -> bool {
    std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}
