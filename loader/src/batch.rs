//! Batches: typed column views over one leased slab.

use std::sync::Arc;

use crate::pinned::SlabLease;

/// The element type of a collated buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `bool`, one byte per value (0 or 1).
    Bool,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// IEEE half precision, as raw `u16` bits.
    F16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// The numpy type string, e.g. `"<i4"`.
    pub fn numpy(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }
}

/// Rust types a buffer can be viewed as.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(impl Element for $t { const DTYPE: DType = DType::$d; })*};
}
element!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64, f32 => F32, f64 => F64);

/// A typed buffer inside a batch's slab.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Element type.
    pub dtype: DType,
    /// Shape, e.g. `[batch]`, `[batch, n]`, `[values]` or `[batch + 1]`.
    pub shape: Vec<usize>,
    /// Byte offset in the slab (64-byte aligned).
    pub offset: usize,
}

impl Buffer {
    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes in the buffer.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype.size()
    }
}

/// How a column was collated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnLayout {
    /// Fixed width: `values` of shape `[batch]` or `[batch, n]` (fixed-size lists).
    Dense {
        /// The values.
        values: Buffer,
    },
    /// Variable-length lists as `values` (`[total]`) and `offsets` (`i64`,
    /// `[batch + 1]`, starting at 0): row `i` is `values[offsets[i]..offsets[i + 1]]`.
    Ragged {
        /// Concatenated list elements.
        values: Buffer,
        /// Row boundaries.
        offsets: Buffer,
    },
    /// Variable-length lists padded (or truncated) to `[batch, pad_to]`, with
    /// `lengths` (`i64`, `[batch]`) counting the real elements of each row.
    Padded {
        /// The padded values.
        values: Buffer,
        /// Elements per row, at most `pad_to`.
        lengths: Buffer,
    },
    /// Binary or string values (`u8`, `[total]`) with `offsets` (`i64`, `[batch + 1]`).
    Bytes {
        /// Concatenated bytes.
        values: Buffer,
        /// Row boundaries.
        offsets: Buffer,
        /// Whether the bytes are UTF-8 strings.
        utf8: bool,
    },
    /// Lists of binary or string items, or of lists of fixed-width values
    /// (`list<list<float32>>`): the items' values end to end (`u8` bytes for
    /// binary and strings, else the values' type; `[total]`), `offsets`
    /// (`i64`, `[batch + 1]`) into the items, and `value_offsets` (`i64`,
    /// `[items + 1]`) into the values: row `i`'s items are
    /// `offsets[i]..offsets[i + 1]`, item `j` is
    /// `values[value_offsets[j]..value_offsets[j + 1]]`. A null item reads as
    /// empty.
    ListBytes {
        /// Every item's values, end to end.
        values: Buffer,
        /// Row boundaries, in items.
        offsets: Buffer,
        /// Item boundaries, in values.
        value_offsets: Buffer,
        /// Whether the items are UTF-8 strings.
        utf8: bool,
    },
}

/// One collated column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// The column's name.
    pub name: String,
    /// Its buffers.
    pub layout: ColumnLayout,
    /// For nullable columns: `u8` `[batch]`, 1 where the row holds a value.
    pub validity: Option<Buffer>,
}

impl Column {
    /// Every buffer of the column with a role name: `values`, `offsets`,
    /// `lengths`, `validity`.
    pub fn buffers(&self) -> Vec<(&'static str, &Buffer)> {
        let mut out = match &self.layout {
            ColumnLayout::Dense { values } => vec![("values", values)],
            ColumnLayout::Ragged { values, offsets }
            | ColumnLayout::Bytes {
                values, offsets, ..
            } => {
                vec![("values", values), ("offsets", offsets)]
            }
            ColumnLayout::Padded { values, lengths } => {
                vec![("values", values), ("lengths", lengths)]
            }
            ColumnLayout::ListBytes {
                values,
                offsets,
                value_offsets,
                ..
            } => vec![
                ("values", values),
                ("offsets", offsets),
                ("value_offsets", value_offsets),
            ],
        };
        if let Some(v) = &self.validity {
            out.push(("validity", v));
        }
        out
    }
}

/// The role names of a column's buffers other than its values: the
/// Python binding keys them `<column>.<role>` beside the values' `<column>`.
pub const BUFFER_ROLES: [&str; 4] = ["offsets", "value_offsets", "lengths", "validity"];

/// The first column of `names` whose name is the key of another's buffer
/// (`x.offsets` beside `x`): with both, one's array would replace the
/// other's in a batch dict. Returns (that name, the other column).
pub(crate) fn buffer_key_clash(names: &[String]) -> Option<(&str, &str)> {
    names.iter().find_map(|name| {
        let (column, role) = name.rsplit_once('.')?;
        (BUFFER_ROLES.contains(&role) && names.iter().any(|n| n == column))
            .then_some((name.as_str(), column))
    })
}

/// A batch of rows, collated into one slab of the pool. Dropping the batch
/// (and every clone of its slab handle) returns the slab.
pub struct Batch {
    pub(crate) lease: Arc<SlabLease>,
    pub(crate) rows: usize,
    pub(crate) columns: Vec<Column>,
    pub(crate) index: u64,
    pub(crate) held: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// Rows a user's filter dropped from it (counted when delivered).
    pub(crate) filtered: u64,
    /// Where each row comes from, when asked for
    /// ([`crate::LoaderBuilder::row_ids`]).
    pub(crate) row_ids: Option<Vec<crate::RowId>>,
    /// A mixture's source: the rows as they lie in the decoded row groups,
    /// in place of collated columns (see [`HandedOn`]).
    pub(crate) handoff: Option<Box<dyn HandedOn>>,
}

/// The rows of a batch a mixture's source hands on uncollated, read where
/// they lie in the decoded row groups (the collator's handoff module).
pub(crate) trait HandedOn: Send + Sync {
    /// Row `row`'s values as bytes, their count, and its validity (1 or 0).
    fn row(&self, row: usize) -> Option<(&[u8], usize, u8)>;
    /// The values of row `row` as tokens (lists of integers).
    fn tokens(&self, row: usize) -> Option<crate::pack::Tokens<'_>>;
    /// Bytes the rows would take collated.
    fn bytes(&self) -> usize;
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("index", &self.index)
            .field("rows", &self.rows)
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(held) = &self.held {
            held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl Batch {
    /// A batch of dense buffers copied into `lease` (a slab from
    /// [`crate::Loader::spare_slab`]): each `(name, dtype, shape, bytes)`
    /// at a 64-byte aligned offset; its first dimension is the rows. An
    /// error when they do not fit the slab or a buffer's bytes are not its
    /// shape's.
    pub fn from_buffers(
        lease: SlabLease,
        index: u64,
        buffers: &[(&str, DType, &[usize], &[u8])],
    ) -> std::result::Result<Batch, String> {
        let mut lease = lease;
        let specs: Vec<(&str, DType, &[usize])> = buffers
            .iter()
            .map(|&(name, dtype, shape, _)| (name, dtype, shape))
            .collect();
        let (columns, rows) = Batch::lay_out(lease.capacity(), &specs)?;
        for (column, &(name, _, shape, bytes)) in columns.iter().zip(buffers) {
            let ColumnLayout::Dense { values } = &column.layout else {
                unreachable!("laid out dense");
            };
            if values.bytes() != bytes.len() {
                return Err(format!(
                    "`{name}`: {} bytes for shape {shape:?} of {:?}",
                    bytes.len(),
                    values.dtype
                ));
            }
            // Streamed past the caches: a transform's output (tens of MB
            // a batch) is read next by the copy to the device, not by
            // this thread.
            crate::gather::kernels::stream_copy(
                &mut lease.slab_mut().as_mut_slice()[values.offset..values.offset + bytes.len()],
                bytes,
            );
        }
        crate::gather::kernels::fence_streamed();
        Ok(Batch::of_lease(lease, index, rows, columns))
    }

    /// A batch of dense buffers laid out in `lease` as
    /// [`Batch::from_buffers`] lays them out, `(name, dtype, shape)` each,
    /// holding whatever the slab held: for a caller that writes them (a
    /// transform filling its outputs where they will be delivered).
    pub fn uninit(
        lease: SlabLease,
        index: u64,
        buffers: &[(&str, DType, &[usize])],
    ) -> std::result::Result<Batch, String> {
        let (columns, rows) = Batch::lay_out(lease.capacity(), buffers)?;
        Ok(Batch::of_lease(lease, index, rows, columns))
    }

    /// Dense columns for `buffers` in a slab of `capacity` bytes, each at a
    /// 64-byte aligned offset, and the rows (the first buffer's first
    /// dimension); an error when a shape overflows or they do not fit.
    fn lay_out(
        capacity: usize,
        buffers: &[(&str, DType, &[usize])],
    ) -> std::result::Result<(Vec<Column>, usize), String> {
        let mut columns = Vec::with_capacity(buffers.len());
        let mut at = 0usize;
        let mut rows = None;
        for &(name, dtype, shape) in buffers {
            let want = shape
                .iter()
                .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
                .ok_or_else(|| format!("`{name}`: shape {shape:?} overflows"))?;
            let end = at
                .checked_add(want)
                .filter(|&end| end <= capacity)
                .ok_or_else(|| format!("the buffers pass the slab's {capacity} bytes"))?;
            columns.push(Column {
                name: name.to_string(),
                layout: ColumnLayout::Dense {
                    values: Buffer {
                        dtype,
                        shape: shape.to_vec(),
                        offset: at,
                    },
                },
                validity: None,
            });
            rows.get_or_insert(shape.first().copied().unwrap_or(1));
            at = end.div_ceil(64) * 64;
        }
        Ok((columns, rows.unwrap_or(0)))
    }

    /// A batch made outside the pipeline, holding `lease`.
    fn of_lease(lease: SlabLease, index: u64, rows: usize, columns: Vec<Column>) -> Batch {
        Batch {
            lease: Arc::new(lease),
            rows,
            columns,
            index,
            held: None,
            filtered: 0,
            row_ids: None,
            handoff: None,
        }
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The batch's index in its epoch (for this rank).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Where each row comes from (shard, row group, row), in row order, for
    /// a loader built with [`crate::LoaderBuilder::row_ids`]; `None`
    /// otherwise (and for a mixture's batches).
    pub fn row_ids(&self) -> Option<&[crate::RowId]> {
        self.row_ids.as_deref()
    }

    /// The columns, in projection order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The slab behind the batch; keeping a clone keeps the slab leased.
    pub fn slab(&self) -> &Arc<SlabLease> {
        &self.lease
    }

    /// Row `row` of a ragged column whose buffers are `values` and
    /// `offsets`: its values' bytes and their count. A batch handed on
    /// uncollated ([`HandedOn`]) reads them where they lie.
    pub(crate) fn ragged_row(
        &self,
        values: &Buffer,
        offsets: &Buffer,
        row: usize,
    ) -> Option<(&[u8], usize)> {
        if let Some(handoff) = &self.handoff {
            return handoff.row(row).map(|(bytes, count, _)| (bytes, count));
        }
        let offsets = self.typed::<i64>(offsets)?;
        let a = usize::try_from(*offsets.get(row)?).ok()?;
        let z = usize::try_from(*offsets.get(row + 1)?).ok()?;
        let size = values.dtype.size();
        Some((
            self.bytes(values).get(a * size..z * size)?,
            z.checked_sub(a)?,
        ))
    }

    /// Row `row` of `column`'s validity: 1 where it holds a value (always,
    /// without a mask), 0 where it is null.
    pub(crate) fn valid_byte(&self, column: &Column, row: usize) -> u8 {
        if let Some(handoff) = &self.handoff {
            return handoff.row(row).map_or(1, |(_, _, valid)| valid);
        }
        column
            .validity
            .as_ref()
            .map_or(1, |v| self.typed::<u8>(v).expect("u8")[row])
    }

    /// The raw bytes of `buffer`.
    pub fn bytes(&self, buffer: &Buffer) -> &[u8] {
        &self.lease.slab().as_slice()[buffer.offset..buffer.offset + buffer.bytes()]
    }

    /// `buffer` viewed as `T`; `None` if the types differ.
    pub fn typed<T: Element>(&self, buffer: &Buffer) -> Option<&[T]> {
        if buffer.dtype != T::DTYPE && !(buffer.dtype == DType::Bool && T::DTYPE == DType::U8) {
            return None;
        }
        let bytes = self.bytes(buffer);
        // SAFETY: regions are 64-byte aligned in a page-aligned slab, hold
        // `len` initialised elements of `T`, and live as long as `self`.
        Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), buffer.len()) })
    }

    /// The values buffer of column `name` as `T`.
    pub fn values<T: Element>(&self, name: &str) -> Option<&[T]> {
        let column = self.column(name)?;
        let values = match &column.layout {
            ColumnLayout::Dense { values }
            | ColumnLayout::Ragged { values, .. }
            | ColumnLayout::Padded { values, .. }
            | ColumnLayout::Bytes { values, .. }
            | ColumnLayout::ListBytes { values, .. } => values,
        };
        self.typed(values)
    }

    /// The offsets of a ragged, bytes or list-of-bytes column (a list of
    /// bytes: into its items).
    pub fn offsets(&self, name: &str) -> Option<&[i64]> {
        match &self.column(name)?.layout {
            ColumnLayout::Ragged { offsets, .. }
            | ColumnLayout::Bytes { offsets, .. }
            | ColumnLayout::ListBytes { offsets, .. } => self.typed(offsets),
            _ => None,
        }
    }

    /// The item boundaries (in bytes) of a list-of-bytes column.
    pub fn value_offsets(&self, name: &str) -> Option<&[i64]> {
        match &self.column(name)?.layout {
            ColumnLayout::ListBytes { value_offsets, .. } => self.typed(value_offsets),
            _ => None,
        }
    }

    /// Each row's items of a list-of-bytes column (`list<string>`,
    /// `list<binary>`), in row order; `None` for a list of lists of wider
    /// values (see [`Batch::lists`]).
    pub fn binary_lists(&self, name: &str) -> Option<Vec<Vec<&[u8]>>> {
        self.lists::<u8>(name)
    }

    /// Each row's inner lists of a list of lists of `T` (`list<list<float32>>`
    /// as `T = f32`; `u8` for lists of strings or binary), in row order;
    /// `None` when the column is not one, or holds values of another type.
    pub fn lists<T: Element>(&self, name: &str) -> Option<Vec<Vec<&[T]>>> {
        let ColumnLayout::ListBytes { values, .. } = &self.column(name)?.layout else {
            return None;
        };
        let values = self.typed::<T>(values)?;
        let (rows, items) = (self.offsets(name)?, self.value_offsets(name)?);
        let item = |j: usize| -> Option<&[T]> {
            let (a, b) = (*items.get(j)?, *items.get(j + 1)?);
            values.get(usize::try_from(a).ok()?..usize::try_from(b).ok()?)
        };
        rows.windows(2)
            .map(|w| {
                let (a, b) = (usize::try_from(w[0]).ok()?, usize::try_from(w[1]).ok()?);
                (a..b).map(item).collect::<Option<Vec<_>>>()
            })
            .collect()
    }

    /// Each row's bytes of a binary or string column, in row order.
    pub fn binary(&self, name: &str) -> Option<impl Iterator<Item = &[u8]> + '_> {
        let ColumnLayout::Bytes {
            values, offsets, ..
        } = &self.column(name)?.layout
        else {
            return None;
        };
        let values = self.bytes(values);
        let offsets: &[i64] = self.typed(offsets)?;
        Some(
            offsets
                .windows(2)
                .map(move |w| values.get(w[0] as usize..w[1] as usize).unwrap_or_default()),
        )
    }

    /// The lengths of a padded column.
    pub fn lengths(&self, name: &str) -> Option<&[i64]> {
        match &self.column(name)?.layout {
            ColumnLayout::Padded { lengths, .. } => self.typed(lengths),
            _ => None,
        }
    }

    /// The validity mask of a nullable column.
    pub fn validity(&self, name: &str) -> Option<&[u8]> {
        self.column(name)?
            .validity
            .as_ref()
            .and_then(|v| self.typed(v))
    }
}
