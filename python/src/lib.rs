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

mod args;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::create_exception;
use pyo3::exceptions::{
    PyException, PyFileExistsError, PyFileNotFoundError, PyPermissionError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use shardfeed_format::fault::FaultConfig;
use shardfeed_format::size::parse_size;
use shardfeed_format::{FormatError, Location};
use shardfeed_loader::{
    Batch, Loader, LoaderBuilder, LoaderError, LoaderState, Mixture, MixtureBuilder, MixtureState,
    PackMode,
};
use shardfeed_preprocess::{InputFormat, PreprocessError, ShardOptions};

/// The extension's own allocations (decoded row groups, slabs) use mimalloc,
/// keeping freed memory for reuse instead of page-faulting it in again each
/// row group; Python's objects keep Python's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

// No huge page advice for mimalloc's arenas (why: the macro's docs).
shardfeed_format::mimalloc_without_huge_page_advice!();

create_exception!(
    shardfeed,
    ShardfeedError,
    PyException,
    "A shardfeed failure other than a missing file, a permission problem or a bad option. The message is the Rust error's, naming the shard, row group, file or option."
);

/// Which Python exception a failure maps to.
enum Kind {
    NotFound,
    Permission,
    Exists,
    Value,
    Other,
}

fn store_kind(e: &object_store::Error) -> Kind {
    match e {
        object_store::Error::NotFound { .. } => Kind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => Kind::Permission,
        object_store::Error::AlreadyExists { .. } => Kind::Exists,
        _ => Kind::Other,
    }
}

fn io_kind(e: &std::io::Error) -> Kind {
    match e.kind() {
        std::io::ErrorKind::NotFound => Kind::NotFound,
        std::io::ErrorKind::PermissionDenied => Kind::Permission,
        std::io::ErrorKind::AlreadyExists => Kind::Exists,
        _ => Kind::Other,
    }
}

fn format_kind(e: &FormatError) -> Kind {
    match e {
        FormatError::Store { error, .. } => store_kind(error.inner()),
        FormatError::LocalPath { source, .. } => io_kind(source),
        FormatError::BadLocation { .. } | FormatError::BadSize { .. } => Kind::Value,
        _ => Kind::Other,
    }
}

fn raise(kind: Kind, message: String) -> PyErr {
    match kind {
        Kind::NotFound => PyFileNotFoundError::new_err(message),
        Kind::Permission => PyPermissionError::new_err(message),
        Kind::Exists => PyFileExistsError::new_err(message),
        Kind::Value => PyValueError::new_err(message),
        Kind::Other => ShardfeedError::new_err(message),
    }
}

fn loader_error(e: LoaderError) -> PyErr {
    let kind = match &e {
        LoaderError::Format(f) => format_kind(f),
        LoaderError::MissingShard { .. } => Kind::NotFound,
        LoaderError::Store { error, .. } => store_kind(error.inner()),
        LoaderError::Io { source, .. } => io_kind(source),
        LoaderError::BadOption { .. } | LoaderError::BadState { .. } => Kind::Value,
        _ => Kind::Other,
    };
    raise(kind, e.to_string())
}

fn preprocess_error(e: PreprocessError) -> PyErr {
    let kind = match &e {
        PreprocessError::Format(f) => format_kind(f),
        PreprocessError::InputNotFound { .. } | PreprocessError::NoMatch { .. } => Kind::NotFound,
        PreprocessError::Io { source, .. } => io_kind(source),
        PreprocessError::BadOption { .. }
        | PreprocessError::UnknownFormat { .. }
        | PreprocessError::NoInputs => Kind::Value,
        PreprocessError::DatasetExists { .. } => Kind::Exists,
        _ => Kind::Other,
    };
    raise(kind, e.to_string())
}

fn format_error(e: FormatError) -> PyErr {
    raise(format_kind(&e), e.to_string())
}

fn bad_option(option: &str, reason: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("invalid option {option}: {reason}"))
}

/// A size given as bytes (int) or as text such as `"128MiB"`.
#[derive(FromPyObject)]
enum Size {
    Bytes(i128),
    Text(String),
}

impl Size {
    fn bytes(&self, option: &str) -> PyResult<u64> {
        match self {
            Size::Bytes(b) => u64::try_from(*b)
                .map_err(|_| bad_option(option, format!("{b} bytes is out of range"))),
            Size::Text(t) => parse_size(t).map_err(|e| bad_option(option, e)),
        }
    }
}

/// One or several input paths.
#[derive(FromPyObject)]
enum Inputs {
    One(String),
    Many(Vec<String>),
}

fn json_module(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static JSON: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    JSON.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("json")?.into_any().unbind())
    })
    .map(|m| m.bind(py))
}

/// A serde value as Python objects (through `json`).
fn to_python<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| ShardfeedError::new_err(e.to_string()))?;
    json_module(py)?.call_method1("loads", (text,))
}

/// Object store options as a dict or as (key, value) pairs.
#[derive(FromPyObject)]
enum StorageOptions {
    Map(std::collections::BTreeMap<String, String>),
    Pairs(Vec<(String, String)>),
}

fn storage_pairs(options: Option<StorageOptions>) -> Vec<(String, String)> {
    match options {
        None => Vec::new(),
        Some(StorageOptions::Map(m)) => m.into_iter().collect(),
        Some(StorageOptions::Pairs(p)) => p,
    }
}

/// A plain loader, or a mixture (several datasets, or packing).
enum AnyLoader {
    Plain(Box<Loader>),
    Mix(Box<Mixture>),
}

/// What builds an [`AnyLoader`] (again, in a forked child).
#[derive(Clone)]
enum AnyBuilder {
    Plain(LoaderBuilder),
    Mix(MixtureBuilder),
}

/// Either kind of state.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum AnyState {
    Plain(LoaderState),
    Mix(Box<MixtureState>),
}

impl AnyBuilder {
    fn build(&self) -> Result<AnyLoader, LoaderError> {
        Ok(match self {
            AnyBuilder::Plain(b) => AnyLoader::Plain(Box::new(b.clone().build()?)),
            AnyBuilder::Mix(b) => AnyLoader::Mix(Box::new(b.clone().build()?)),
        })
    }
}

impl AnyLoader {
    fn state(&self) -> AnyState {
        match self {
            AnyLoader::Plain(l) => AnyState::Plain(l.state()),
            AnyLoader::Mix(m) => AnyState::Mix(Box::new(m.state())),
        }
    }

    /// Resume from one state (JSON text) or, for a mixture, every rank's.
    fn resume(&mut self, states: &[String], allow_changed: bool) -> Result<(), LoaderError> {
        match self {
            AnyLoader::Plain(l) => match states {
                [one] => l.resume(&LoaderState::from_json(one)?),
                many => {
                    let parsed = many
                        .iter()
                        .map(|t| LoaderState::from_json(t))
                        .collect::<Result<Vec<_>, _>>()?;
                    l.resume_elastic(&parsed)
                }
            },
            AnyLoader::Mix(m) => {
                let parsed = states
                    .iter()
                    .map(|t| MixtureState::from_json(t))
                    .collect::<Result<Vec<_>, _>>()?;
                match parsed.as_slice() {
                    [one] if allow_changed => m.resume_changed(one),
                    many => m.resume_elastic(many),
                }
            }
        }
    }

    fn stop(&mut self) {
        match self {
            AnyLoader::Plain(l) => l.stop(),
            AnyLoader::Mix(m) => m.stop(),
        }
    }

    fn next_interruptible(
        &mut self,
        interrupted: impl FnMut() -> bool,
    ) -> Option<Result<Batch, LoaderError>> {
        match self {
            AnyLoader::Plain(l) => l.next_interruptible(interrupted),
            AnyLoader::Mix(m) => m.next_interruptible(interrupted),
        }
    }
}

struct Inner {
    loader: Option<AnyLoader>,
    closed: bool,
}

/// Streams a shardfeed dataset (or a weighted mixture of several) as
/// batches: `dict[str, numpy.ndarray]` whose arrays are zero-copy views of
/// one pooled (pinned when CUDA is present) slab. Iterating yields the
/// current epoch's batches for this rank; the next iteration continues with
/// the following epoch unless `set_epoch` is called.
#[pyclass(name = "Loader", module = "shardfeed._native", frozen)]
struct PyLoader {
    /// Everything `Loader(...)` was given, kept to rebuild the loader in a
    /// forked child.
    builder: AnyBuilder,
    /// The process that built `inner`'s threads; another pid means we are a
    /// forked child whose copy of the loader has no threads.
    pid: AtomicU32,
    inner: Mutex<Inner>,
}

impl PyLoader {
    /// Lock the loader, rebuilding it first in a forked child. Call without
    /// the GIL (building reads the manifest; locking may wait for `next`).
    fn lock(&self) -> PyResult<MutexGuard<'_, Inner>> {
        let me = std::process::id();
        if self.pid.load(Ordering::SeqCst) != me {
            let mut inner = self.inner.try_lock().map_err(|_| {
                ShardfeedError::new_err(
                    "this loader was in use by another thread when the process forked; create a new Loader in the child",
                )
            })?;
            if let Some(old) = inner.loader.take() {
                // Its threads and runtime exist only in the parent: never
                // join or drop them here. Continue where the parent was.
                let state = serde_json::to_string(&old.state()).expect("states serialize");
                std::mem::forget(old);
                let mut fresh = self.builder.build().map_err(loader_error)?;
                fresh.resume(&[state], false).map_err(loader_error)?;
                inner.loader = Some(fresh);
            }
            self.pid.store(me, Ordering::SeqCst);
            return Ok(inner);
        }
        self.inner
            .lock()
            .map_err(|_| ShardfeedError::new_err("the loader is unusable after a panic"))
    }

    fn with_any<T>(&self, f: impl FnOnce(&mut AnyLoader) -> PyResult<T>) -> PyResult<T> {
        let mut inner = self.lock()?;
        if inner.closed {
            return Err(ShardfeedError::new_err("the loader is closed"));
        }
        let loader = inner.loader.as_mut().expect("open loaders hold one");
        f(loader)
    }
}

impl Drop for PyLoader {
    fn drop(&mut self) {
        if self.pid.load(Ordering::SeqCst) != std::process::id() {
            // A forked child's copy: the threads to join live in the parent.
            if let Ok(inner) = self.inner.get_mut() {
                std::mem::forget(inner.loader.take());
            }
        }
    }
}

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (
        url, batch_size, columns=None, shuffle=true, seed=0, epoch=0, rank=None, world_size=None,
        drop_last=true, pad_to=None, pad_value=0.0, prefetch=None, threads=None,
        storage_options=None, cache_dir=None, *, cache_limit=None, window=None, byte_budget=None,
        pinning="auto", io_concurrency=None, inject_latency_ms=None, inject_failure_rate=None,
        on_error="fail", max_skipped=None, trace=None,
        slow_warning=Some(shardfeed_loader::DEFAULT_SLOW_WARNING), pack_to=None, pack_mode="split",
        pack_column=None, eos_id=None, pad_id=0, pack_window=None, max_segments=None,
        mix_stop="first_exhausted", read_batch=None, decode_images=None, image_size=None,
        crop="random_resized", scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), flip=false,
        channels_first=false, max_image_pixels=None, decode_niceness=None, mapped_reads=true,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::batch_size)] batch_size: usize,
        columns: Option<Vec<String>>,
        shuffle: bool,
        #[pyo3(from_py_with = args::seed)] seed: u64,
        #[pyo3(from_py_with = args::epoch)] epoch: u64,
        #[pyo3(from_py_with = args::opt_rank)] rank: Option<u64>,
        #[pyo3(from_py_with = args::opt_world_size)] world_size: Option<u64>,
        drop_last: bool,
        #[pyo3(from_py_with = args::opt_pad_to)] pad_to: Option<usize>,
        pad_value: f64,
        #[pyo3(from_py_with = args::opt_prefetch)] prefetch: Option<usize>,
        #[pyo3(from_py_with = args::opt_threads)] threads: Option<usize>,
        storage_options: Option<StorageOptions>,
        cache_dir: Option<PathBuf>,
        cache_limit: Option<Size>,
        #[pyo3(from_py_with = args::opt_window)] window: Option<usize>,
        byte_budget: Option<Size>,
        pinning: &str,
        #[pyo3(from_py_with = args::opt_io_concurrency)] io_concurrency: Option<usize>,
        inject_latency_ms: Option<f64>,
        inject_failure_rate: Option<f64>,
        on_error: &str,
        #[pyo3(from_py_with = args::opt_max_skipped)] max_skipped: Option<u64>,
        trace: Option<PathBuf>,
        slow_warning: Option<(f64, u64)>,
        #[pyo3(from_py_with = args::opt_pack_to)] pack_to: Option<usize>,
        pack_mode: &str,
        pack_column: Option<String>,
        #[pyo3(from_py_with = args::opt_eos_id)] eos_id: Option<i32>,
        #[pyo3(from_py_with = args::pad_id)] pad_id: i32,
        #[pyo3(from_py_with = args::opt_pack_window)] pack_window: Option<usize>,
        #[pyo3(from_py_with = args::opt_max_segments)] max_segments: Option<usize>,
        mix_stop: &str,
        #[pyo3(from_py_with = args::opt_read_batch)] read_batch: Option<usize>,
        decode_images: Option<&Bound<'_, PyAny>>,
        image_size: Option<&Bound<'_, PyAny>>,
        crop: &str,
        scale: (f64, f64),
        ratio: (f64, f64),
        flip: bool,
        channels_first: bool,
        #[pyo3(from_py_with = args::opt_max_image_pixels)] max_image_pixels: Option<u64>,
        #[pyo3(from_py_with = args::opt_decode_niceness)] decode_niceness: Option<u8>,
        mapped_reads: bool,
    ) -> PyResult<Self> {
        // A str is one dataset; a dict maps datasets to weights.
        let sources: Option<Vec<(String, f64)>> = match url.extract::<String>() {
            Ok(_) => None,
            Err(_) => Some(
                url.extract::<std::collections::BTreeMap<String, f64>>()
                    .map_err(|_| bad_option("url", "must be a str, or a dict of str to weight"))?
                    .into_iter()
                    .collect(),
            ),
        };
        // Keep the dict's order (BTreeMap sorts): read it again as pairs.
        let sources = match sources {
            None => None,
            Some(_) => Some(
                url.call_method0("items")?
                    .try_iter()?
                    .map(|item| item?.extract::<(String, f64)>())
                    .collect::<PyResult<Vec<_>>>()?,
            ),
        };
        let first = match &sources {
            Some(list) => list.first().map(|s| s.0.clone()).unwrap_or_default(),
            None => url.extract::<String>()?,
        };
        let mut b = Loader::builder(&first)
            .batch_size(batch_size)
            .shuffle(shuffle)
            .seed(seed)
            .epoch(epoch)
            .drop_last(drop_last)
            .pinning(pinning.parse().map_err(loader_error)?)
            .on_error(on_error.parse().map_err(loader_error)?);
        if let Some(n) = max_skipped {
            b = b.max_skipped(n);
        }
        match decode_images {
            Some(columns) => {
                let columns: Vec<String> = match columns.extract::<String>() {
                    Ok(one) => vec![one],
                    Err(_) => columns.extract().map_err(|_| {
                        bad_option("decode_images", "must be a column name or a list of them")
                    })?,
                };
                let (height, width) = match image_size {
                    None => (224, 224),
                    Some(size) => match size.extract::<u32>() {
                        Ok(side) => (side, side),
                        Err(_) => size.extract::<(u32, u32)>().map_err(|_| {
                            bad_option("image_size", "must be an int or a (height, width) pair")
                        })?,
                    },
                };
                b = b.images(shardfeed_loader::ImageOptions {
                    columns,
                    height,
                    width,
                    crop: crop.parse().map_err(loader_error)?,
                    scale,
                    ratio,
                    flip,
                    channels_first,
                    max_pixels: max_image_pixels
                        .unwrap_or(shardfeed_loader::DEFAULT_MAX_IMAGE_PIXELS),
                });
            }
            None if image_size.is_some() || flip || channels_first || crop != "random_resized" => {
                return Err(bad_option(
                    "decode_images",
                    "image_size, crop, flip and channels_first apply to the columns named in decode_images",
                ));
            }
            None => {}
        }
        if let Some(path) = trace {
            b = b.trace(path);
        }
        b = b.slow_warning(slow_warning);
        if let Some(columns) = columns {
            b = b.columns(columns);
        }
        if let Some(rank) = rank {
            b = b.rank(rank);
        }
        if let Some(world_size) = world_size {
            b = b.world_size(world_size);
        }
        if let Some(n) = pad_to {
            b = b.pad_to(n, pad_value);
        }
        if let Some(n) = prefetch {
            b = b.prefetch(n);
        }
        if let Some(n) = threads {
            b = b.decode_threads(n);
        }
        for (k, v) in storage_pairs(storage_options) {
            b = b.storage_option(k, v);
        }
        if let Some(dir) = cache_dir {
            b = b.cache_dir(dir);
        }
        if let Some(limit) = cache_limit {
            b = b.cache_limit(limit.bytes("cache_limit")?);
        }
        b = b.mapped_reads(mapped_reads);
        if let Some(n) = window {
            b = b.window(n);
        }
        if let Some(budget) = byte_budget {
            b = b.byte_budget(budget.bytes("byte_budget")?);
        }
        if let Some(n) = io_concurrency {
            b = b.io_concurrency(n);
        }
        if let Some(n) = decode_niceness {
            b = b.decode_niceness(n);
        }
        if inject_latency_ms.is_some() || inject_failure_rate.is_some() {
            b = b.inject_faults(FaultConfig {
                transient_rate: inject_failure_rate.unwrap_or(0.0),
                latency: args::seconds(
                    inject_latency_ms.unwrap_or(0.0) / 1000.0,
                    "inject_latency_ms",
                )?,
                ..FaultConfig::default()
            });
        }
        let mixing = sources.is_some() || pack_to.is_some();
        let builder = if mixing {
            let list = sources.unwrap_or_else(|| vec![(first.clone(), 1.0)]);
            let mut m = Loader::builder_mixture(list)
                .configure(|_| b)
                .mix_stop(mix_stop.parse().map_err(loader_error)?);
            if let Some(n) = read_batch {
                m = m.read_batch(n);
            }
            if let Some(length) = pack_to {
                let mut options = shardfeed_loader::PackOptions::new(length);
                options.mode = pack_mode.parse::<PackMode>().map_err(loader_error)?;
                options.eos_id = eos_id;
                options.pad_id = pad_id;
                if let Some(w) = pack_window {
                    options.window = w;
                }
                options.max_segments = max_segments;
                m = m.pack(options);
                if let Some(c) = pack_column {
                    m = m.pack_column(c);
                }
            } else if pack_column.is_some() || eos_id.is_some() || pack_window.is_some() {
                return Err(bad_option(
                    "pack_to",
                    "pack_column, eos_id and pack_window need pack_to",
                ));
            }
            AnyBuilder::Mix(m)
        } else {
            if mix_stop != "first_exhausted" || read_batch.is_some() {
                return Err(bad_option(
                    "mix_stop",
                    "mix_stop and read_batch apply to mixtures (a dict of datasets) and packing",
                ));
            }
            AnyBuilder::Plain(b)
        };
        let loader = py.detach(|| builder.build()).map_err(loader_error)?;
        Ok(PyLoader {
            builder,
            pid: AtomicU32::new(std::process::id()),
            inner: Mutex::new(Inner {
                loader: Some(loader),
                closed: false,
            }),
        })
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let mut signal: Option<PyErr> = None;
        let next = py.detach(|| {
            self.with_any(|loader| {
                Ok(loader.next_interruptible(|| {
                    Python::attach(|py| match py.check_signals() {
                        Ok(()) => false,
                        Err(e) => {
                            signal = Some(e);
                            true
                        }
                    })
                }))
            })
        })?;
        match next {
            None => Ok(None),
            Some(Ok(batch)) => batch_dict(py, batch).map(Some),
            Some(Err(LoaderError::Interrupted)) => {
                Err(signal.unwrap_or_else(|| ShardfeedError::new_err("interrupted while waiting")))
            }
            Some(Err(e)) => Err(loader_error(e)),
        }
    }

    /// Batches per epoch for this rank (the same on every rank). A packed
    /// loader, or a mixture with `mix_stop="never"`, has no length
    /// (`TypeError`): its epochs end with its documents' tokens.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let len = py.detach(|| {
            self.with_any(|l| {
                Ok(match l {
                    AnyLoader::Plain(l) => Some(l.len()),
                    AnyLoader::Mix(m) => m.len(),
                })
            })
        })?;
        len.map(|n| n as usize).ok_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err(
                "this loader's epochs have no length known ahead (packing, or mix_stop=\"never\")",
            )
        })
    }

    /// Move to `epoch`, from its start (stops a pass in progress). A mixture
    /// accepts only its current epoch (a no-op): its epochs follow from its
    /// sources.
    fn set_epoch(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = args::epoch)] epoch: u64,
    ) -> PyResult<()> {
        py.detach(|| {
            self.with_any(|l| match l {
                AnyLoader::Plain(l) => {
                    l.set_epoch(epoch);
                    Ok(())
                }
                AnyLoader::Mix(m) => m.set_epoch(epoch).map_err(loader_error),
            })
        })
    }

    /// The current epoch.
    #[getter]
    fn epoch(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| {
            self.with_any(|l| {
                Ok(match l {
                    AnyLoader::Plain(l) => l.epoch(),
                    AnyLoader::Mix(m) => m.epoch(),
                })
            })
        })
    }

    /// How the slabs were allocated: `"cuda"` (page-locked) or `"page-aligned"`.
    #[getter]
    fn pinning(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| {
            self.with_any(|l| {
                Ok(match l {
                    AnyLoader::Plain(l) => l.pinning(),
                    AnyLoader::Mix(m) => m.pinning(),
                }
                .name()
                .to_string())
            })
        })
    }

    /// Where the loader is: a small dict for `load_state_dict` (under 1 KB as
    /// JSON; a mixture's under 4 KB for 8 sources).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = py.detach(|| self.with_any(|l| Ok(l.state())))?;
        to_python(py, &state)
    }

    /// Continue exactly where `state_dict()` was taken. `state` may also be
    /// the list of every rank's `state_dict()` of a job with another world
    /// size (an elastic resume): the rest of the epoch is split over the new
    /// ranks. `allow_changed=True` (mixtures) starts sources whose dataset or
    /// weight changed afresh instead of refusing the state.
    #[pyo3(signature = (state, allow_changed=false))]
    fn load_state_dict(
        &self,
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        allow_changed: bool,
    ) -> PyResult<()> {
        let json = json_module(py)?;
        let texts: Vec<String> = if state.is_instance_of::<pyo3::types::PyList>()
            || state.is_instance_of::<pyo3::types::PyTuple>()
        {
            state
                .try_iter()?
                .map(|s| json.call_method1("dumps", (s?,))?.extract())
                .collect::<PyResult<_>>()?
        } else {
            vec![json.call_method1("dumps", (state,))?.extract()?]
        };
        if texts.is_empty() {
            return Err(bad_option("state", "an empty list of states"));
        }
        py.detach(|| self.with_any(|l| l.resume(&texts, allow_changed).map_err(loader_error)))
    }

    /// Change a mixture's weights (a dict of dataset to weight, or a list in
    /// the sources' order) from the next batch on; recorded in the state.
    fn set_weights(&self, py: Python<'_>, weights: &Bound<'_, PyAny>) -> PyResult<()> {
        let given: Vec<f64> = match weights.extract::<Vec<f64>>() {
            Ok(list) => list,
            Err(_) => {
                let map: std::collections::HashMap<String, f64> = weights
                    .extract()
                    .map_err(|_| bad_option("weights", "a dict of dataset to weight, or a list"))?;
                let AnyBuilder::Mix(_) = &self.builder else {
                    return Err(bad_option("weights", "only a mixture has weights"));
                };
                let urls = py.detach(|| {
                    self.with_any(|l| match l {
                        AnyLoader::Mix(m) => Ok(m.source_urls()),
                        AnyLoader::Plain(_) => Ok(Vec::new()),
                    })
                })?;
                if map.len() != urls.len() || urls.iter().any(|u| !map.contains_key(u)) {
                    return Err(bad_option(
                        "weights",
                        format!(
                            "name every source once: {:?}",
                            urls.iter()
                                .map(|u| shardfeed_format::redact::url(u))
                                .collect::<Vec<_>>()
                        ),
                    ));
                }
                urls.iter().map(|u| map[u]).collect()
            }
        };
        py.detach(|| {
            self.with_any(|l| match l {
                AnyLoader::Mix(m) => m.set_weights(&given).map_err(loader_error),
                AnyLoader::Plain(_) => Err(bad_option("weights", "only a mixture has weights")),
            })
        })
    }

    /// The counters in Prometheus's text exposition format (`shardfeed_*`,
    /// labelled with this loader's rank), to serve from a trainer's metrics
    /// endpoint; `shardfeed.metrics.LoaderCollector` registers it with
    /// `prometheus_client`.
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| {
            self.with_any(|l| {
                Ok(match l {
                    AnyLoader::Plain(l) => l.metrics_text(),
                    AnyLoader::Mix(m) => m.metrics_text(),
                })
            })
        })
    }

    /// Counters: rows, bytes, batches, time to first batch, wait and busy
    /// times (seconds), queue depths, retries, pinning and pool size. A
    /// mixture's: batches, rows, documents per source, packed and padding
    /// tokens, and each source's loader counters under `sources`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let value = py.detach(|| {
            self.with_any(|l| {
                Ok(match l {
                    AnyLoader::Plain(l) => serde_json::to_value(l.stats()),
                    AnyLoader::Mix(m) => serde_json::to_value(m.stats()),
                }
                .expect("stats serialize"))
            })
        })?;
        to_python(py, &value)
    }

    /// Stop every thread and release the pool. Batches still held stay valid.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut inner = self.lock()?;
            inner.closed = true;
            if let Some(mut l) = inner.loader.take() {
                l.stop();
            }
            Ok(())
        })
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// Owns one batch (and so its slab lease) for the arrays viewing it.
#[pyclass(module = "shardfeed._native", frozen)]
struct BatchOwner {
    batch: Batch,
}

/// One buffer of a batch, exposed through numpy's array interface. The numpy
/// array's `base`; keeps the batch's slab leased while it lives.
#[pyclass(name = "SlabView", module = "shardfeed._native", frozen)]
struct SlabView {
    owner: Py<BatchOwner>,
    address: usize,
    shape: Vec<usize>,
    typestr: &'static str,
}

#[pymethods]
impl SlabView {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", self.typestr)?;
        d.set_item("data", (self.address, false))?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    /// Address of the slab this buffer lies in.
    #[getter]
    fn slab_address(&self, py: Python<'_>) -> usize {
        self.owner.bind(py).get().batch.slab().as_ptr() as usize
    }

    /// Capacity of that slab in bytes.
    #[getter]
    fn slab_bytes(&self, py: Python<'_>) -> usize {
        self.owner.bind(py).get().batch.slab().capacity()
    }

    /// The batch's index in its epoch.
    #[getter]
    fn batch_index(&self, py: Python<'_>) -> u64 {
        self.owner.bind(py).get().batch.index()
    }
}

fn batch_dict(py: Python<'_>, batch: Batch) -> PyResult<Bound<'_, PyDict>> {
    static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let asarray = ASARRAY
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("numpy")?.getattr("asarray")?.unbind())
        })?
        .bind(py);
    let owner = Py::new(py, BatchOwner { batch })?;
    let dict = PyDict::new(py);
    let batch = &owner.get().batch;
    let base = batch.slab().as_ptr() as usize;
    let capacity = batch.slab().capacity();
    for column in batch.columns() {
        for (role, buffer) in column.buffers() {
            let key = if role == "values" {
                column.name.clone()
            } else {
                format!("{}.{role}", column.name)
            };
            // The arrays below read the slab unchecked: each buffer must lie
            // inside it (the collator lays them out so; checked here, where
            // the reads are made).
            let end = buffer
                .shape
                .iter()
                .try_fold(buffer.dtype.size(), |n, &d| n.checked_mul(d))
                .and_then(|n| n.checked_add(buffer.offset));
            if end.is_none_or(|end| end > capacity) {
                return Err(ShardfeedError::new_err(format!(
                    "buffer `{key}` of shape {:?} at offset {} lies outside its slab of {capacity} bytes",
                    buffer.shape, buffer.offset
                )));
            }
            let address = base + buffer.offset;
            let view = Bound::new(
                py,
                SlabView {
                    owner: owner.clone_ref(py),
                    address,
                    shape: buffer.shape.clone(),
                    typestr: buffer.dtype.numpy(),
                },
            )?;
            let array = match slab_array(address, &buffer.shape, buffer.dtype, &view) {
                Some(array) => array,
                None => asarray.call1((view,))?,
            };
            // Two columns' keys cannot meet here (a projection with `x` and
            // `x.offsets` is refused when the loader is built): a key met
            // twice is an error, never one array silently replacing another.
            if dict.contains(&key)? {
                return Err(ShardfeedError::new_err(format!(
                    "two buffers of the batch have the key `{key}`"
                )));
            }
            dict.set_item(key, array)?;
        }
    }
    Ok(dict)
}

/// A numpy array of `shape` values of `dtype` at `address` in a batch's
/// slab, whose base is `view` (which keeps the slab leased); made through
/// numpy's C API. `None` for half floats (no Rust type here) and for an
/// address not aligned for the type (never the case: the collator aligns
/// every buffer): `view`'s array interface serves those.
fn slab_array<'py>(
    address: usize,
    shape: &[usize],
    dtype: shardfeed_loader::DType,
    view: &Bound<'py, SlabView>,
) -> Option<Bound<'py, PyAny>> {
    use numpy::PyArray;
    use numpy::ndarray::{ArrayView, IxDyn};
    use shardfeed_loader::DType;
    macro_rules! borrow {
        ($t:ty) => {{
            if address % std::mem::align_of::<$t>() != 0 {
                return None;
            }
            // SAFETY: `shape`'s product of `$t` values at `address` lie inside
            // the batch's slab (checked by the caller), aligned (checked
            // above); the slab stays allocated and leased while `view`, the
            // array's base, lives; booleans are written as 0 or 1.
            let values = unsafe {
                ArrayView::<$t, IxDyn>::from_shape_ptr(IxDyn(shape), address as *const $t)
            };
            // SAFETY: as above: `view` keeps the memory valid for the array's life.
            Some(unsafe { PyArray::borrow_from_array(&values, view.clone().into_any()) }.into_any())
        }};
    }
    match dtype {
        DType::Bool => borrow!(bool),
        DType::I8 => borrow!(i8),
        DType::I16 => borrow!(i16),
        DType::I32 => borrow!(i32),
        DType::I64 => borrow!(i64),
        DType::U8 => borrow!(u8),
        DType::U16 => borrow!(u16),
        DType::U32 => borrow!(u32),
        DType::U64 => borrow!(u64),
        DType::F32 => borrow!(f32),
        DType::F64 => borrow!(f64),
        DType::F16 => None,
    }
}

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
fn shard<'py>(
    py: Python<'py>,
    inputs: Inputs,
    output: String,
    shard_size: Option<Size>,
    #[pyo3(from_py_with = args::opt_row_group_rows)] row_group_rows: Option<u64>,
    row_group_size: Option<Size>,
    #[pyo3(from_py_with = args::opt_zstd_level)] zstd_level: Option<i32>,
    shuffle: Option<bool>,
    #[pyo3(from_py_with = args::seed)] seed: u64,
    memory_budget: Option<Size>,
    #[pyo3(from_py_with = args::threads)] threads: usize,
    overwrite: bool,
    format: Option<String>,
    storage_options: Option<StorageOptions>,
    temp_dir: Option<PathBuf>,
    #[pyo3(from_py_with = args::opt_task_index)] task_index: Option<usize>,
    #[pyo3(from_py_with = args::opt_num_tasks)] num_tasks: Option<usize>,
    stage: &str,
    wait_timeout: f64,
    tokenizer: Option<PathBuf>,
    text_column: &str,
    tokens_column: &str,
    add_eos: bool,
    eos_token: Option<String>,
    keep_text: bool,
    strict: bool,
    #[pyo3(from_py_with = args::opt_max_columns)] max_columns: Option<u64>,
    follow_links: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let inputs = match inputs {
        Inputs::One(s) => vec![s],
        Inputs::Many(v) => v,
    };
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
                .with_wait_timeout(args::seconds(wait_timeout, "wait_timeout")?);
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
fn commit<'py>(
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

fn location(url: &str, storage_options: Option<StorageOptions>) -> PyResult<Location> {
    Location::parse_with_options(url, storage_pairs(storage_options)).map_err(format_error)
}

/// The dataset's summary, as `shardfeed inspect --json` prints it; with
/// `images=True` also the binary columns' image formats and sizes over the
/// first `sample` rows (0: all), under `"images"`.
#[pyfunction]
#[pyo3(signature = (url, *, storage_options=None, images=false, sample=10_000))]
fn inspect<'py>(
    py: Python<'py>,
    url: &str,
    storage_options: Option<StorageOptions>,
    images: bool,
    #[pyo3(from_py_with = args::sample)] sample: u64,
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
fn verify<'py>(
    py: Python<'py>,
    url: &str,
    #[pyo3(from_py_with = args::threads)] threads: usize,
    storage_options: Option<StorageOptions>,
) -> PyResult<Bound<'py, PyAny>> {
    let location = location(url, storage_options)?;
    let report = py
        .detach(|| shardfeed_loader::verify_dataset(&location, threads))
        .map_err(loader_error)?;
    let out = to_python(py, &report)?;
    out.set_item("ok", report.ok())?;
    Ok(out)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Freed memory is reused, never returned: the loader's budgets bound it.
    // SAFETY: sets an allocator option; valid at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    // Log records go to Python's `logging` (loggers named after the Rust
    // modules, e.g. `shardfeed_loader.loader`).
    pyo3_log::init();
    m.add_class::<PyLoader>()?;
    m.add_class::<SlabView>()?;
    m.add_function(wrap_pyfunction!(shard, m)?)?;
    m.add_function(wrap_pyfunction!(commit, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add("ShardfeedError", m.py().get_type::<ShardfeedError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
