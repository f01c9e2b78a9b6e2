//! Arguments of the Python API converted with the option's name in every
//! error: an integer of the wrong sign or size (`seed=-1`,
//! `batch_size=2**70`) is a `ValueError` naming the option, as every other
//! invalid option is, rather than an `OverflowError` naming none.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use shardfeed_format::size::parse_size;

use crate::errors::*;

/// An integer type an option converts to, with its range for messages.
pub(crate) trait Int: TryFrom<i128> + Copy {
    const MIN: i128;
    const MAX: i128;
}

macro_rules! int {
    ($($t:ty),*) => {
        $(impl Int for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
        })*
    };
}
int!(u8, i32, u64, usize);

/// `obj` as a `T`, the option `option`'s value.
pub(crate) fn int<T: Int>(obj: &Bound<'_, PyAny>, option: &str) -> PyResult<T> {
    let value: i128 = obj.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "invalid option {option}: must be an int, not {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "that".to_string(), |n| n.to_string())
        ))
    })?;
    T::try_from(value).map_err(|_| {
        bad_option(
            option,
            format!("{value} is out of range ({} to {})", T::MIN, T::MAX),
        )
    })
}

/// A finite, non-negative number of seconds, the option `option`'s value.
pub(crate) fn seconds(value: f64, option: &str) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(value)
        .map_err(|_| bad_option(option, format!("{value} is not a number of seconds")))
}

/// Converters for `#[pyo3(from_py_with = ...)]`, one per option: a
/// required one (`name`) and, where the option may be `None`, an optional
/// one.
macro_rules! options {
    ($($name:ident $(/ $opt:ident)? : $t:ty),* $(,)?) => {
        $(
            #[allow(dead_code)]
            pub(crate) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<$t> {
                int(obj, stringify!($name))
            }
            $(
                pub(crate) fn $opt(obj: &Bound<'_, PyAny>) -> PyResult<Option<$t>> {
                    if obj.is_none() {
                        Ok(None)
                    } else {
                        int(obj, stringify!($name)).map(Some)
                    }
                }
            )?
        )*
    };
}

options! {
    batch_size: usize,
    seed: u64,
    epoch: u64,
    rank / opt_rank: u64,
    world_size / opt_world_size: u64,
    pad_to / opt_pad_to: usize,
    prefetch / opt_prefetch: usize,
    threads / opt_threads: usize,
    window / opt_window: usize,
    io_concurrency / opt_io_concurrency: usize,
    max_skipped / opt_max_skipped: u64,
    pack_to / opt_pack_to: usize,
    eos_id / opt_eos_id: i32,
    pad_id: i32,
    pack_window / opt_pack_window: usize,
    max_segments / opt_max_segments: usize,
    read_batch / opt_read_batch: usize,
    max_image_pixels / opt_max_image_pixels: u64,
    decode_niceness / opt_decode_niceness: u8,
    row_group_rows / opt_row_group_rows: u64,
    zstd_level / opt_zstd_level: i32,
    task_index / opt_task_index: usize,
    num_tasks / opt_num_tasks: usize,
    sample: u64,
    max_columns / opt_max_columns: u64,
}

/// A size given as bytes (int) or as text such as `"128MiB"`.
#[derive(FromPyObject)]
pub(crate) enum Size {
    Bytes(i128),
    Text(String),
}

impl Size {
    pub(crate) fn bytes(&self, option: &str) -> PyResult<u64> {
        match self {
            Size::Bytes(b) => u64::try_from(*b)
                .map_err(|_| bad_option(option, format!("{b} bytes is out of range"))),
            Size::Text(t) => parse_size(t).map_err(|e| bad_option(option, e)),
        }
    }
}

/// One or several input paths.
#[derive(FromPyObject)]
pub(crate) enum Inputs {
    One(String),
    Many(Vec<String>),
}

impl Inputs {
    /// The paths, as a list.
    pub(crate) fn into_vec(self) -> Vec<String> {
        match self {
            Inputs::One(s) => vec![s],
            Inputs::Many(v) => v,
        }
    }
}

pub(crate) fn json_module(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static JSON: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    JSON.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("json")?.into_any().unbind())
    })
    .map(|m| m.bind(py))
}

/// A serde value as Python objects (through `json`).
pub(crate) fn to_python<'py>(
    py: Python<'py>,
    value: &impl serde::Serialize,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| ShardfeedError::new_err(e.to_string()))?;
    json_module(py)?.call_method1("loads", (text,))
}

/// Object store options as a dict or as (key, value) pairs.
#[derive(FromPyObject)]
pub(crate) enum StorageOptions {
    Map(std::collections::BTreeMap<String, String>),
    Pairs(Vec<(String, String)>),
}

pub(crate) fn storage_pairs(options: Option<StorageOptions>) -> Vec<(String, String)> {
    match options {
        None => Vec::new(),
        Some(StorageOptions::Map(m)) => m.into_iter().collect(),
        Some(StorageOptions::Pairs(p)) => p,
    }
}
