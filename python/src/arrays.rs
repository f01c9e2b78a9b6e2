//! Batches as numpy arrays over their slab: views that keep the slab
//! leased, made through numpy's C API (or its array interface).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use shardfeed_loader::Batch;

use crate::errors::*;

/// Owns one batch (and so its slab lease) for the arrays viewing it.
#[pyclass(module = "shardfeed._native", frozen)]
pub(crate) struct BatchOwner {
    batch: Batch,
}

/// One buffer of a batch, exposed through numpy's array interface. The numpy
/// array's `base`; keeps the batch's slab leased while it lives.
#[pyclass(name = "SlabView", module = "shardfeed._native", frozen)]
pub(crate) struct SlabView {
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

    /// Where another process of this user can map the slab, for a loader
    /// built with `_shared_slabs=True`: `(pid, fd, slab id, slab bytes)`,
    /// the file being `/proc/<pid>/fd/<fd>` and the id unique to the slab in
    /// this process; `None` for other slabs.
    #[getter]
    fn shared(&self, py: Python<'_>) -> Option<(u32, i32, u64, usize)> {
        let slab = self.owner.bind(py).get().batch.slab();
        slab.shared()
            .map(|(fd, id)| (std::process::id(), fd, id, slab.capacity()))
    }

    /// The batch's index in its epoch.
    #[getter]
    fn batch_index(&self, py: Python<'_>) -> u64 {
        self.owner.bind(py).get().batch.index()
    }
}

/// The dtype a batch's buffer has for numpy's type string `typestr` (as
/// `__array_interface__` gives it, such as `"<f4"`); `None` for the others.
pub(crate) fn dtype_of(typestr: &str) -> Option<shardfeed_loader::DType> {
    use shardfeed_loader::DType;
    const DTYPES: [DType; 12] = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::F32,
        DType::F64,
    ];
    DTYPES.into_iter().find(|d| d.numpy() == typestr)
}

pub(crate) fn batch_dict(py: Python<'_>, batch: Batch) -> PyResult<Bound<'_, PyDict>> {
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
pub(crate) fn slab_array<'py>(
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
