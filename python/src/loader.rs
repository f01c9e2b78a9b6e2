//! `shardfeed.Loader`: a plain loader or a mixture behind one Python class,
//! both driven through [`Feed`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// How long a transform thread waits for the loader to pin its outputs
/// before it leaves them where the function made them (counted as unpinned).
const PIN_PATIENCE: Duration = Duration::from_millis(20);

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use shardfeed_loader::{Feed, FeedBuilder, LoaderError, LoaderOptions};

use crate::args::*;
use crate::arrays::*;
use crate::errors::*;

/// Resume `feed` from states given as JSON texts: one, or every rank's.
fn resume(feed: &mut dyn Feed, texts: &[String], allow_changed: bool) -> Result<(), LoaderError> {
    let states = texts
        .iter()
        .map(|t| feed.parse_state(t))
        .collect::<Result<Vec<_>, _>>()?;
    feed.restore(&states, allow_changed)
}

/// When `current` refused `texts` and they were saved with another shuffle
/// window (or an index's parts) than it has, its window left to the byte
/// budget (which chose others here: another `byte_budget`, another machine's
/// default), `builder`'s loader rebuilt with the states' and resumed from
/// them; `None` otherwise.
fn rebuilt_for(
    builder: &FeedBuilder,
    current: &dyn Feed,
    texts: &[String],
    allow_changed: bool,
) -> Option<Result<Box<dyn Feed>, LoaderError>> {
    let states = texts
        .iter()
        .map(|t| current.parse_state(t))
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    let (mine, saved) = (current.save().orders(), states.first()?.orders());
    if mine.len() != saved.len() {
        return None;
    }
    // The first loader or source read in other windows than the state's.
    let ((mine_window, mine_parts), (window, part_rows)) = mine
        .iter()
        .zip(&saved)
        .find_map(|(a, b)| a.zip(*b).filter(|(a, b)| a != b))?;
    let adopted = builder.with_order_of(&states)?;
    let parts = |rows: u64| match rows {
        0 => String::new(),
        n => format!(", read in parts of {n} rows"),
    };
    Some(
        adopted
            .build()
            .map_err(|e| LoaderError::BadState {
                reason: format!(
                    "the state was saved with shuffle windows of {window} row groups{} (this loader chose {}{} from its byte_budget), and a loader with them cannot be built: {}",
                    parts(part_rows),
                    mine_window,
                    parts(mine_parts),
                    match e {
                        LoaderError::BadState { reason } => reason,
                        other => other.to_string(),
                    }
                ),
            })
            .and_then(|mut fresh| {
                resume(fresh.as_mut(), texts, allow_changed)?;
                Ok(fresh)
            }),
    )
}

/// A loader's state as `Loader._saved()` took it.
#[pyclass(name = "_SavedState", module = "shardfeed._native", frozen)]
pub(crate) struct SavedState(shardfeed_loader::FeedState);

#[pymethods]
impl SavedState {
    /// The state as `Loader.state_dict()` gives it.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.0)
    }
}

pub(crate) struct Inner {
    loader: Option<Box<dyn Feed>>,
    closed: bool,
}

/// Streams a shardfeed dataset (or a weighted mixture of several) as
/// batches: `dict[str, numpy.ndarray]` whose arrays are zero-copy views of
/// one pooled (pinned when CUDA is present) slab. Iterating yields the
/// current epoch's batches for this rank; the next iteration continues with
/// the following epoch unless `set_epoch` is called.
#[pyclass(name = "Loader", module = "shardfeed._native", frozen, subclass)]
pub(crate) struct PyLoader {
    /// Everything `Loader(...)` was given, kept to rebuild the loader in a
    /// forked child.
    builder: FeedBuilder,
    /// The process that built `inner`'s threads; another pid means we are a
    /// forked child whose copy of the loader has no threads.
    pid: AtomicU32,
    inner: Mutex<Inner>,
    /// The origin (shard, row group, row) of each row of the batch last
    /// yielded, when built with `_row_ids` (see `_row_ids()`).
    row_ids: Mutex<Option<Vec<u32>>>,
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
                // join or drop them here. Continue where the parent was
                // (with its window, which a resume may have taken from a
                // state).
                let saved = old.save();
                let state = saved.to_json();
                std::mem::forget(old);
                let builder = self.builder.with_order_of(&[saved]);
                let mut fresh = builder
                    .as_ref()
                    .unwrap_or(&self.builder)
                    .build()
                    .map_err(loader_error)?;
                resume(fresh.as_mut(), &[state], false).map_err(loader_error)?;
                inner.loader = Some(fresh);
            }
            self.pid.store(me, Ordering::SeqCst);
            return Ok(inner);
        }
        self.inner
            .lock()
            .map_err(|_| ShardfeedError::new_err("the loader is unusable after a panic"))
    }

    /// [`PyLoader::lock`], waiting at most `patience` for another thread's
    /// hold to end: `None` past it. For a transform thread pinning its
    /// outputs: the caller's thread holds the loader while its `next()`
    /// waits for a batch, which may wait for a slab that this very
    /// transform's input holds until the transform returns.
    fn lock_within(&self, patience: Duration) -> PyResult<Option<MutexGuard<'_, Inner>>> {
        if self.pid.load(Ordering::SeqCst) != std::process::id() {
            return self.lock().map(Some);
        }
        let until = Instant::now() + patience;
        loop {
            match self.inner.try_lock() {
                Ok(inner) => return Ok(Some(inner)),
                Err(TryLockError::Poisoned(_)) => {
                    return Err(ShardfeedError::new_err(
                        "the loader is unusable after a panic",
                    ));
                }
                Err(TryLockError::WouldBlock) if Instant::now() >= until => return Ok(None),
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }

    fn with_any<T>(&self, f: impl FnOnce(&mut dyn Feed) -> PyResult<T>) -> PyResult<T> {
        open_loader(self.lock()?, f)
    }
}

/// `f` on the loader `inner` holds, unless it was closed.
fn open_loader<T>(
    mut inner: MutexGuard<'_, Inner>,
    f: impl FnOnce(&mut dyn Feed) -> PyResult<T>,
) -> PyResult<T> {
    f(open_feed(&mut inner)?.as_mut())
}

/// The loader `inner` holds, unless it was closed.
fn open_feed(inner: &mut Inner) -> PyResult<&mut Box<dyn Feed>> {
    if inner.closed {
        return Err(ShardfeedError::new_err("the loader is closed"));
    }
    Ok(inner.loader.as_mut().expect("open loaders hold one"))
}

impl Drop for PyLoader {
    fn drop(&mut self) {
        let Ok(inner) = self.inner.get_mut() else {
            return;
        };
        let Some(loader) = inner.loader.take() else {
            return;
        };
        if self.pid.load(Ordering::SeqCst) != std::process::id() {
            // A forked child's copy: the threads to join live in the parent.
            std::mem::forget(loader);
            return;
        }
        // Dropped by Python's deallocation, with the GIL held: the loader's
        // threads are joined without it, since a thread that logs (a skipped
        // row group, a retried read) waits for the GIL to hand its record to
        // Python's `logging`, and would never be joined.
        Python::attach(|py| py.detach(move || drop(loader)));
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
        transform=None, transform_threads=None, transform_processes=None, row_transform=None,
        filter=None, transform_slabs=0, _row_ids=false, _shared_slabs=false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::args::batch_size)] batch_size: usize,
        columns: Option<Vec<String>>,
        shuffle: bool,
        #[pyo3(from_py_with = crate::args::seed)] seed: u64,
        #[pyo3(from_py_with = crate::args::epoch)] epoch: u64,
        #[pyo3(from_py_with = crate::args::opt_rank)] rank: Option<u64>,
        #[pyo3(from_py_with = crate::args::opt_world_size)] world_size: Option<u64>,
        drop_last: bool,
        #[pyo3(from_py_with = crate::args::opt_pad_to)] pad_to: Option<usize>,
        pad_value: f64,
        #[pyo3(from_py_with = crate::args::opt_prefetch)] prefetch: Option<usize>,
        #[pyo3(from_py_with = crate::args::opt_threads)] threads: Option<usize>,
        storage_options: Option<StorageOptions>,
        cache_dir: Option<PathBuf>,
        cache_limit: Option<Size>,
        #[pyo3(from_py_with = crate::args::opt_window)] window: Option<usize>,
        byte_budget: Option<Size>,
        pinning: &str,
        #[pyo3(from_py_with = crate::args::opt_io_concurrency)] io_concurrency: Option<usize>,
        inject_latency_ms: Option<f64>,
        inject_failure_rate: Option<f64>,
        on_error: &str,
        #[pyo3(from_py_with = crate::args::opt_max_skipped)] max_skipped: Option<u64>,
        trace: Option<PathBuf>,
        slow_warning: Option<(f64, u64)>,
        #[pyo3(from_py_with = crate::args::opt_pack_to)] pack_to: Option<usize>,
        pack_mode: &str,
        pack_column: Option<String>,
        #[pyo3(from_py_with = crate::args::opt_eos_id)] eos_id: Option<i32>,
        #[pyo3(from_py_with = crate::args::pad_id)] pad_id: i32,
        #[pyo3(from_py_with = crate::args::opt_pack_window)] pack_window: Option<usize>,
        #[pyo3(from_py_with = crate::args::opt_max_segments)] max_segments: Option<usize>,
        mix_stop: &str,
        #[pyo3(from_py_with = crate::args::opt_read_batch)] read_batch: Option<usize>,
        decode_images: Option<&Bound<'_, PyAny>>,
        image_size: Option<&Bound<'_, PyAny>>,
        crop: &str,
        scale: (f64, f64),
        ratio: (f64, f64),
        flip: bool,
        channels_first: bool,
        #[pyo3(from_py_with = crate::args::opt_max_image_pixels)] max_image_pixels: Option<u64>,
        #[pyo3(from_py_with = crate::args::opt_decode_niceness)] decode_niceness: Option<u8>,
        mapped_reads: bool,
        transform: Option<&Bound<'_, PyAny>>,
        transform_threads: Option<&Bound<'_, PyAny>>,
        transform_processes: Option<&Bound<'_, PyAny>>,
        row_transform: Option<&Bound<'_, PyAny>>,
        filter: Option<&Bound<'_, PyAny>>,
        transform_slabs: usize,
        _row_ids: bool,
        _shared_slabs: bool,
    ) -> PyResult<Self> {
        // Transforms run in `shardfeed.Loader` (python/shardfeed/transform.py),
        // which takes these three before it builds this class.
        let given = [
            transform,
            transform_threads,
            transform_processes,
            row_transform,
            filter,
        ];
        if given.iter().any(Option::is_some) {
            return Err(bad_option(
                "transform",
                "user transforms run in shardfeed.Loader, not shardfeed._native.Loader",
            ));
        }
        // A str is one dataset; a dict maps datasets to weights (in the
        // dict's order).
        let (sources, mixture) = match url.extract::<String>() {
            Ok(one) => (vec![(one, 1.0)], false),
            Err(_) => {
                if url
                    .extract::<std::collections::BTreeMap<String, f64>>()
                    .is_err()
                {
                    return Err(bad_option(
                        "url",
                        "must be a str, or a dict of str to weight",
                    ));
                }
                let pairs = url
                    .call_method0("items")?
                    .try_iter()?
                    .map(|item| item?.extract::<(String, f64)>())
                    .collect::<PyResult<Vec<_>>>()?;
                (pairs, true)
            }
        };
        let decode_images = match decode_images {
            None => None,
            Some(columns) => Some(match columns.extract::<String>() {
                Ok(one) => vec![one],
                Err(_) => columns.extract().map_err(|_| {
                    bad_option("decode_images", "must be a column name or a list of them")
                })?,
            }),
        };
        let image_size = match image_size {
            None => None,
            Some(size) => Some(match size.extract::<u32>() {
                Ok(side) => (side, side),
                Err(_) => size.extract::<(u32, u32)>().map_err(|_| {
                    bad_option("image_size", "must be an int or a (height, width) pair")
                })?,
            }),
        };
        let defaults = LoaderOptions::default();
        let options = LoaderOptions {
            sources,
            mixture,
            batch_size,
            columns,
            shuffle,
            seed,
            epoch,
            rank,
            world_size,
            drop_last,
            pad_to,
            pad_value,
            prefetch,
            transform_slabs,
            threads: threads.unwrap_or(defaults.threads),
            storage_options: storage_pairs(storage_options),
            cache_dir,
            cache_limit: cache_limit.map(|l| l.bytes("cache_limit")).transpose()?,
            window,
            byte_budget: match byte_budget {
                Some(b) => b.bytes("byte_budget")?,
                None => defaults.byte_budget,
            },
            pinning: pinning.to_string(),
            io_concurrency,
            inject_latency_ms,
            inject_failure_rate,
            on_error: on_error.to_string(),
            max_skipped: max_skipped.unwrap_or(defaults.max_skipped),
            trace,
            slow_warning,
            mapped_reads,
            decode_niceness,
            decode_images,
            image_size,
            crop: crop.to_string(),
            scale,
            ratio,
            flip,
            channels_first,
            max_image_pixels,
            mix_stop: mix_stop.to_string(),
            read_batch,
            pack_to,
            pack_mode: pack_mode.to_string(),
            pack_column,
            eos_id,
            pad_id,
            pack_window,
            max_segments,
        };
        let builder = match options.feed_builder().map_err(loader_error)? {
            // A row transform's generators follow each row's origin; worker
            // processes read batches from slabs they can map.
            FeedBuilder::Loader(b) => {
                FeedBuilder::Loader(b.row_ids(_row_ids).shared_slabs(_shared_slabs))
            }
            FeedBuilder::Mixture(m) if _shared_slabs => {
                FeedBuilder::Mixture(m.configure(|b| b.shared_slabs(true)))
            }
            other => other,
        };
        let loader = py.detach(|| builder.build()).map_err(loader_error)?;
        Ok(PyLoader {
            builder,
            row_ids: Mutex::new(None),
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
                Ok(loader.next_batch(&mut || {
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
            Some(Ok(batch)) => {
                let ids = batch.row_ids().map(|ids| {
                    ids.iter()
                        .flat_map(|r| [r.shard, r.row_group, r.row])
                        .collect()
                });
                *self.row_ids.lock().unwrap_or_else(|p| p.into_inner()) = ids;
                batch_dict(py, batch).map(Some)
            }
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
        let len = py.detach(|| self.with_any(|l| Ok(l.batches_per_epoch())))?;
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
        #[pyo3(from_py_with = crate::args::epoch)] epoch: u64,
    ) -> PyResult<()> {
        py.detach(|| self.with_any(|l| l.go_to_epoch(epoch).map_err(loader_error)))
    }

    /// The current epoch.
    #[getter]
    fn epoch(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.with_any(|l| Ok(l.epoch())))
    }

    /// How the slabs were allocated: `"cuda"` (page-locked) or `"page-aligned"`.
    #[getter]
    fn pinning(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.with_any(|l| Ok(l.pinning().name().to_string())))
    }

    /// The origin of each row of the batch last yielded, as a `[rows, 3]`
    /// uint32 array of (shard, row group, row); `None` unless built with
    /// `_row_ids=True` (and for a mixture).
    fn _row_ids<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(flat) = self
            .row_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Ok(None);
        };
        let rows = flat.len() / 3;
        use numpy::PyArrayMethods;
        let array = numpy::PyArray1::from_vec(py, flat);
        Ok(Some(array.reshape([rows, 3])?.into_any()))
    }

    /// A transform's outputs copied into a spare slab of the pool (pinned
    /// when the pool is), as a batch of index `index`: `arrays` is a list of
    /// (key, C-contiguous numeric numpy array) sharing their first
    /// dimension. `None` when no slab is spare without taking the
    /// pipeline's last, when the arrays do not fit one, when the loader is
    /// a mixture, for a type a slab does not hold, or when the loader stays
    /// busy past [`PIN_PATIENCE`] (then they stay as they are).
    fn _pin<'py>(
        &self,
        py: Python<'py>,
        arrays: Vec<(String, Bound<'py, PyAny>)>,
        index: u64,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        // (key, dtype, shape, address, bytes) of each array, from numpy's
        // array interface; the arrays stay referenced by `arrays` meanwhile.
        let mut parts = Vec::with_capacity(arrays.len());
        for (key, array) in &arrays {
            let interface = array.getattr("__array_interface__")?;
            if !interface.get_item("strides")?.is_none() {
                return Ok(None);
            }
            let typestr: String = interface.get_item("typestr")?.extract()?;
            let Some(dtype) = crate::arrays::dtype_of(&typestr) else {
                return Ok(None);
            };
            let shape: Vec<usize> = interface.get_item("shape")?.extract()?;
            let (address, _): (usize, bool) = interface.get_item("data")?.extract()?;
            let nbytes: usize = array.getattr("nbytes")?.extract()?;
            parts.push((key.clone(), dtype, shape, address, nbytes));
        }
        // The slab the arrays need, each at a 64-byte aligned offset.
        let needed = parts
            .iter()
            .try_fold(0usize, |at, part| {
                at.checked_next_multiple_of(64)?.checked_add(part.4)
            })
            .unwrap_or(usize::MAX);
        // The copy runs without the GIL: a transform's output is tens of MB a
        // batch, and the other transform threads' Python code would wait
        // for it.
        let batch = py.detach(|| -> PyResult<Option<shardfeed_loader::Batch>> {
            let lease = match self.lock_within(PIN_PATIENCE)? {
                Some(inner) => {
                    open_loader(inner, |l| l.spare_slab_for(needed).map_err(loader_error))?
                }
                None => None,
            };
            let Some(lease) = lease else {
                return Ok(None);
            };
            let buffers: Vec<(&str, shardfeed_loader::DType, &[usize], &[u8])> = parts
                .iter()
                .map(|(key, dtype, shape, address, nbytes)| {
                    // SAFETY: `nbytes` bytes at `address` are the data of a
                    // C-contiguous array (no strides) held alive by `arrays`
                    // for this call (its references keep numpy from resizing
                    // it); they are only read.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(*address as *const u8, *nbytes) };
                    (key.as_str(), *dtype, shape.as_slice(), bytes)
                })
                .collect();
            Ok(shardfeed_loader::Batch::from_buffers(lease, index, &buffers).ok())
        })?;
        let Some(batch) = batch else {
            return Ok(None);
        };
        crate::arrays::batch_dict(py, batch).map(Some)
    }

    /// An array of `shape` and numpy type string `typestr` (such as
    /// `"<f4"`) for batch `index`'s transform to fill, lying alone in a
    /// spare slab of the pool (of the pool of larger slabs when it is larger
    /// than the batches'), its contents whatever the slab held; `None` when
    /// no slab is spare or the type is not one a batch can hold.
    fn _empty<'py>(
        &self,
        py: Python<'py>,
        shape: Vec<usize>,
        typestr: &str,
        index: u64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(dtype) = crate::arrays::dtype_of(typestr) else {
            return Ok(None);
        };
        let Some(bytes) = shape
            .iter()
            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        else {
            return Ok(None);
        };
        let lease = py.detach(|| match self.lock_within(PIN_PATIENCE)? {
            Some(inner) => open_loader(inner, |l| l.spare_slab_for(bytes).map_err(loader_error)),
            None => Ok(None),
        })?;
        let Some(lease) = lease else {
            return Ok(None);
        };
        let Ok(batch) = shardfeed_loader::Batch::uninit(lease, index, &[("out", dtype, &shape)])
        else {
            return Ok(None);
        };
        crate::arrays::batch_dict(py, batch)?.get_item("out")
    }

    /// Where the loader is: a small dict for `load_state_dict` (under 1 KB as
    /// JSON; a mixture's under 4 KB for 8 sources).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = py.detach(|| self.with_any(|l| Ok(l.save())))?;
        to_python(py, &state)
    }

    /// Where the loader is, kept as it is until asked for as a dict
    /// (`SavedState.to_dict()`): the transform stage takes one per batch and
    /// converts only the one `state_dict()` is asked for.
    fn _saved(&self, py: Python<'_>) -> PyResult<SavedState> {
        Ok(SavedState(py.detach(|| self.with_any(|l| Ok(l.save())))?))
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
        py.detach(|| {
            let mut inner = self.lock()?;
            let loader = open_feed(&mut inner)?;
            let Err(refused) = resume(loader.as_mut(), &texts, allow_changed) else {
                return Ok(());
            };
            match rebuilt_for(&self.builder, loader.as_ref(), &texts, allow_changed) {
                Some(Ok(fresh)) => {
                    // The old loader's threads are joined as it drops.
                    inner.loader = Some(fresh);
                    Ok(())
                }
                Some(Err(e)) => Err(loader_error(e)),
                None => Err(loader_error(refused)),
            }
        })
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
                let urls = py.detach(|| {
                    self.with_any(|l| match l.as_mixture() {
                        Some(m) => Ok(m.source_urls()),
                        None => Err(bad_option("weights", "only a mixture has weights")),
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
            self.with_any(|l| match l.as_mixture() {
                Some(m) => m.set_weights(&given).map_err(loader_error),
                None => Err(bad_option("weights", "only a mixture has weights")),
            })
        })
    }

    /// The counters in Prometheus's text exposition format (`shardfeed_*`,
    /// labelled with this loader's rank), to serve from a trainer's metrics
    /// endpoint; `shardfeed.metrics.LoaderCollector` registers it with
    /// `prometheus_client`.
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.with_any(|l| Ok(l.metrics_text())))
    }

    /// Counters: rows, bytes, batches, time to first batch, wait and busy
    /// times (seconds), queue depths, retries, pinning and pool size. A
    /// mixture's: batches, rows, documents per source, packed and padding
    /// tokens, and each source's loader counters under `sources`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let value = py.detach(|| {
            self.with_any(|l| Ok(serde_json::to_value(l.feed_stats()).expect("stats serialize")))
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
