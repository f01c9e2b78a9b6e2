//! Datasets: `shard`, `commit`, `inspect` and `verify`.

use std::path::PathBuf;

use pyo3::prelude::*;
use shardfeed_format::Location;
use shardfeed_loader::Loader;
use shardfeed_preprocess::{InputFormat, ShardOptions};

use crate::args::*;
use crate::errors::*;

/// Shard `inputs` (paths, folders, globs or URLs) into a dataset at `output`;
/// returns the summary `shardfeed shard --json` prints. With `task_index` and
/// `num_tasks`, run that task of a split run (`shard --num-tasks N
/// --task-index I`; see `shardfeed.shard_task`). With `tokenizer` (a
/// `tokenizer.json`), `text_column` is tokenized into `tokens_column`
/// (`shard --tokenizer`).
#[pyfunction]
#[pyo3(signature = (
    inputs, output, *, shard_size=None, row_group_rows=None, row_group_size=None,
    zstd_level=None, shuffle=None, seed=0, memory_budget=None, threads=0, overwrite=false,
    format=None, storage_options=None, temp_dir=None, task_index=None, num_tasks=None,
    stage="both", wait_timeout=3600.0, tokenizer=None, text_column="text",
    tokens_column="input_ids", add_eos=false, eos_token=None, keep_text=false, strict=false,
    max_columns=None, follow_links=false,
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn shard<'py>(
    py: Python<'py>,
    inputs: Inputs,
    output: String,
    shard_size: Option<Size>,
    #[pyo3(from_py_with = crate::args::opt_row_group_rows)] row_group_rows: Option<u64>,
    row_group_size: Option<Size>,
    #[pyo3(from_py_with = crate::args::opt_zstd_level)] zstd_level: Option<i32>,
    shuffle: Option<bool>,
    #[pyo3(from_py_with = crate::args::seed)] seed: u64,
    memory_budget: Option<Size>,
    #[pyo3(from_py_with = crate::args::threads)] threads: usize,
    overwrite: bool,
    format: Option<String>,
    storage_options: Option<StorageOptions>,
    temp_dir: Option<PathBuf>,
    #[pyo3(from_py_with = crate::args::opt_task_index)] task_index: Option<usize>,
    #[pyo3(from_py_with = crate::args::opt_num_tasks)] num_tasks: Option<usize>,
    stage: &str,
    wait_timeout: f64,
    tokenizer: Option<PathBuf>,
    text_column: &str,
    tokens_column: &str,
    add_eos: bool,
    eos_token: Option<String>,
    keep_text: bool,
    strict: bool,
    #[pyo3(from_py_with = crate::args::opt_max_columns)] max_columns: Option<u64>,
    follow_links: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let inputs = inputs.into_vec();
    let mut options = ShardOptions::default()
        .with_threads(threads)
        .with_overwrite(overwrite);
    if let Some(s) = shard_size {
        options = options.with_shard_size(s.bytes("shard_size")?);
    }
    if let Some(rows) = row_group_rows {
        options = options.with_row_group_rows(rows);
    }
    if let Some(s) = row_group_size {
        options = options.with_row_group_bytes(s.bytes("row_group_size")?);
    }
    if let Some(level) = zstd_level {
        options = options.with_zstd_level(level);
    }
    // None: shuffled (for a split run, only when asked).
    match shuffle {
        Some(true) => options = options.with_shuffle(seed),
        Some(false) => options = options.without_shuffle(),
        None => {
            if seed != shardfeed_preprocess::DEFAULT_SHUFFLE_SEED {
                if num_tasks.is_some() {
                    return Err(bad_option(
                        "seed",
                        "a split run shuffles across its tasks only with shuffle=True (then every task runs at once, or in two rounds with stage=); add shuffle=True, or drop seed",
                    ));
                }
                options = options.with_shuffle(seed);
            }
        }
    }
    if let Some(columns) = max_columns {
        options = options.with_max_columns(columns);
    }
    options = options.with_follow_links(follow_links);
    if let Some(s) = memory_budget {
        options = options.with_memory_budget(s.bytes("memory_budget")?);
    }
    if let Some(f) = format {
        options = options.with_format(f.parse::<InputFormat>().map_err(preprocess_error)?);
    }
    if let Some(dir) = temp_dir {
        options = options.with_temp_dir(dir);
    }
    for (k, v) in storage_pairs(storage_options) {
        options = options.with_storage_option(k, v);
    }
    if let Some(path) = tokenizer {
        let mut t = shardfeed_preprocess::TokenizeOptions::new(path)
            .with_text_column(text_column)
            .with_tokens_column(tokens_column)
            .with_add_eos(add_eos)
            .with_keep_text(keep_text)
            .with_strict(strict);
        if let Some(eos) = eos_token {
            t = t.with_eos_token(eos);
        }
        options = options.with_tokenizer(t);
    }
    match (task_index, num_tasks) {
        (Some(index), Some(count)) => {
            options = options
                .with_task(index, count)
                .with_stage(stage.parse().map_err(preprocess_error)?)
                .with_wait_timeout(crate::args::seconds(wait_timeout, "wait_timeout")?);
        }
        (None, None) => {}
        _ => {
            return Err(bad_option(
                "task_index",
                "give both task_index and num_tasks",
            ));
        }
    }
    let summary = py
        .detach(|| shardfeed_preprocess::shard(&inputs, &output, &options))
        .map_err(preprocess_error)?;
    to_python(py, &summary)
}

/// Write the manifest of a split run once every task has finished; raises
/// `ShardfeedError` naming the missing tasks otherwise.
#[pyfunction]
#[pyo3(signature = (output, *, storage_options=None))]
pub(crate) fn commit<'py>(
    py: Python<'py>,
    output: String,
    storage_options: Option<StorageOptions>,
) -> PyResult<Bound<'py, PyAny>> {
    let options = storage_pairs(storage_options);
    let summary = py
        .detach(|| shardfeed_preprocess::commit(&output, &options))
        .map_err(preprocess_error)?;
    to_python(py, &summary)
}

/// Write an index over existing Parquet files (read where they lie, only
/// their footers), as `shardfeed index`; returns its summary.
#[pyfunction]
#[pyo3(signature = (inputs, output, *, checksums=false, update=false, overwrite=false, concurrency=64, storage_options=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn index<'py>(
    py: Python<'py>,
    inputs: Inputs,
    output: String,
    checksums: bool,
    update: bool,
    overwrite: bool,
    concurrency: usize,
    storage_options: Option<StorageOptions>,
) -> PyResult<Bound<'py, PyAny>> {
    if update && overwrite {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "update and overwrite: choose one",
        ));
    }
    let options = shardfeed_preprocess::IndexOptions {
        checksums,
        update,
        overwrite,
        storage_options: storage_pairs(storage_options),
        concurrency,
    };
    let summary = py
        .detach(|| shardfeed_preprocess::index(&inputs.into_vec(), &output, &options))
        .map_err(preprocess_error)?;
    to_python(py, &summary)
}

/// The dataset's summary, as `shardfeed inspect --json` prints it; with
/// `images=True` also the binary columns' image formats and sizes over the
/// first `sample` rows (0: all), under `"images"`.
#[pyfunction]
#[pyo3(signature = (url, *, storage_options=None, images=false, sample=10_000))]
pub(crate) fn inspect<'py>(
    py: Python<'py>,
    url: &str,
    storage_options: Option<StorageOptions>,
    images: bool,
    #[pyo3(from_py_with = crate::args::sample)] sample: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let pairs = storage_pairs(storage_options);
    let location =
        Location::parse_with_options(url, pairs.iter().cloned()).map_err(format_error)?;
    let manifest = py.detach(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ShardfeedError::new_err(format!("starting a runtime: {e}")))?
            .block_on(location.read_manifest())
            .map_err(format_error)
    })?;
    let out = to_python(py, &manifest.summary(location.url()))?;
    if images {
        let mut builder = Loader::builder(url);
        for (k, v) in pairs {
            builder = builder.storage_option(k, v);
        }
        let summary = py
            .detach(|| shardfeed_loader::image_summary(builder, &manifest, sample))
            .map_err(loader_error)?;
        out.set_item("images", to_python(py, &summary)?)?;
    }
    Ok(out)
}

/// Read every shard fully and check sizes, checksums and row counts against
/// the manifest. Returns the report (with `"ok"`); damaged shards are listed
/// in `"problems"`, not raised.
#[pyfunction]
#[pyo3(signature = (url, *, threads=0, storage_options=None))]
pub(crate) fn verify<'py>(
    py: Python<'py>,
    url: &str,
    #[pyo3(from_py_with = crate::args::threads)] threads: usize,
    storage_options: Option<StorageOptions>,
) -> PyResult<Bound<'py, PyAny>> {
    let pairs = storage_pairs(storage_options);
    let location =
        Location::parse_with_options(url, pairs.iter().cloned()).map_err(format_error)?;
    let report = py
        .detach(|| shardfeed_loader::verify_dataset_with(&location, &pairs, threads))
        .map_err(loader_error)?;
    let out = to_python(py, &report)?;
    out.set_item("ok", report.ok())?;
    Ok(out)
}
