//! Column chunks of fixed-width columns (integers and floats, nullable or
//! not) and of lists of them (token ids), dictionary-encoded here instead of
//! by parquet's writer.
//!
//! parquet's writer interns every value through a hash of its bytes (ahash
//! over a byte slice, then a probe that compares byte slices): a quarter of
//! `shard`'s CPU time on tabular data and on token lists. Here integers whose
//! chunk spans a narrow range are interned through a table indexed by value,
//! other values by their bit patterns in an open-addressing table with a
//! multiplicative hash; keys are bit-packed straight from their slice. The
//! chunk comes out as parquet's writer lays it out with the shards' writer
//! properties: a PLAIN dictionary page, then V2 `RLE_DICTIONARY` data pages
//! cut where parquet cuts them (`data_page_row_count_limit` rows, or its
//! estimate of the keys' size past `data_page_size_limit`, at row
//! boundaries), repetition and definition levels as parquet writes them,
//! each page stored compressed only where zstd shrinks it below the V2
//! ratio threshold, and chunk statistics and level histograms as parquet
//! computes them (bit patterns compared, so NaNs of one pattern are one
//! entry, as in parquet). Two choices differ from parquet's writer: a
//! skewed dictionary is written in order of use
//! ([`Dictionary::order_by_use`]), and each page's keys take the bits its
//! largest key needs ([`Chunk::data_page`]). A column whose dictionary would pass
//! `dictionary_page_size_limit` is left to parquet's writer, which falls
//! back to PLAIN pages. A flat integer column without nulls is written as
//! `DELTA_BINARY_PACKED` pages instead (`delta.rs`) where its deltas take
//! fewer bytes than the dictionary chunk, or its dictionary would pass the
//! limit. Tests in `encode.rs` compare chunks with parquet's.

use std::cell::RefCell;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, OffsetSizeTrait};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Field};
use bytes::Bytes;
use parquet::basic::{Compression, Encoding, PageType};
use parquet::column::page::{CompressedPage, Page};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescPtr;

use crate::delta::varint;
use crate::pages::{Written, write_pages};
use crate::sums::ChunkSums;

/// A column chunk encoded here, to be spliced into a row group as parquet's
/// own chunks are.
pub(crate) struct DictionaryChunk {
    parts: Vec<Bytes>,
    close: ColumnCloseResult,
    sums: ChunkSums,
}

impl DictionaryChunk {
    /// Bytes the chunk occupies in the file.
    pub(crate) fn bytes_written(&self) -> u64 {
        self.close.bytes_written
    }

    /// Its bytes and what parquet's writer needs to splice them.
    pub(crate) fn into_parts(self) -> (Vec<Bytes>, ColumnCloseResult, ChunkSums) {
        (self.parts, self.close, self.sums)
    }
}

/// A physical value of a fixed-width Parquet type.
trait Fixed: Copy {
    /// Whether NaNs are counted in statistics (floating point types).
    const FLOAT: bool;
    /// Whether it is an integer (INT32 or INT64 stored).
    const INTEGER: bool = !Self::FLOAT;
    /// Its bit pattern: what interning compares, as parquet compares bytes.
    fn bits(self) -> u64;
    /// Its PLAIN encoding.
    fn plain(self, out: &mut Vec<u8>);
    /// Whether `self` sorts after `other` in parquet's statistics order.
    fn greater(self, other: Self) -> bool;
    /// Whether it is a NaN (statistics skip NaNs while other values exist).
    fn is_nan(self) -> bool;
    /// The value as an integer (integer types only): a chunk whose values
    /// span a narrow range is interned by direct index.
    fn integer(self) -> Option<i64>;
    /// Its place in a direct table starting at `lo` (`usize::MAX` for
    /// values below `lo`, far above, or not integers).
    fn offset_from(self, lo: i64) -> usize;
    /// Chunk statistics of these values.
    fn statistics(
        min: Option<Self>,
        max: Option<Self>,
        nulls: u64,
        nans: Option<u64>,
    ) -> Statistics;
}

/// `Fixed` for `$t`; `$bits`, `$greater`, `$nan` and `$integer` are the
/// type's own parts, written with the value `$v` (and `$w` for the other of
/// a comparison).
macro_rules! fixed {
    ($t:ty, $float:expr, |$v:ident, $w:ident| bits: $bits:expr, greater: $greater:expr,
     nan: $nan:expr, integer: $integer:expr) => {
        impl Fixed for $t {
            const FLOAT: bool = $float;
            fn bits(self) -> u64 {
                let $v = self;
                $bits
            }
            fn plain(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn greater(self, other: Self) -> bool {
                let ($v, $w) = (self, other);
                $greater
            }
            fn is_nan(self) -> bool {
                // Unused where the answer is the type's (integers).
                #[allow(unused_variables)]
                let $v = self;
                $nan
            }
            fn integer(self) -> Option<i64> {
                // Unused where the answer is the type's (floats).
                #[allow(unused_variables)]
                let $v = self;
                $integer
            }
            fn offset_from(self, lo: i64) -> usize {
                // A value below `lo` wraps to a huge offset, past any table.
                self.integer()
                    .map_or(usize::MAX, |i| i.wrapping_sub(lo) as u64 as usize)
            }
            fn statistics(
                min: Option<Self>,
                max: Option<Self>,
                nulls: u64,
                nans: Option<u64>,
            ) -> Statistics {
                ValueStatistics::new(min, max, None, Some(nulls), false)
                    .with_nan_count(nans)
                    .with_backwards_compatible_min_max(true)
                    .into()
            }
        }
    };
}
fixed!(i32, false, |v, w| bits: v as u32 as u64, greater: v > w, nan: false, integer: Some(v as i64));
fixed!(i64, false, |v, w| bits: v as u64, greater: v > w, nan: false, integer: Some(v));
fixed!(f32, true, |v, w| bits: v.to_bits() as u64, greater: v.total_cmp(&w).is_gt(),
    nan: v.is_nan(), integer: None);
fixed!(f64, true, |v, w| bits: v.to_bits(), greater: v.total_cmp(&w).is_gt(),
    nan: v.is_nan(), integer: None);

/// Whether [`encode`] may take a column of `data_type` (numbers, or a list
/// of them); for others it always declines.
pub(crate) fn may_encode(data_type: &DataType) -> bool {
    let leaf = match data_type {
        DataType::List(item) | DataType::LargeList(item) => item.data_type(),
        other => other,
    };
    matches!(
        leaf,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
    )
}

/// Encode `array` (the column of a top-level field whose only Parquet leaf
/// is `descr`: a fixed-width column, or a list of one) here, or `None`
/// where parquet's writer should: a type or layout this module does not
/// write, no values, or a dictionary past the page size limit.
pub(crate) fn encode(
    field: &Field,
    array: &ArrayRef,
    descr: &ColumnDescPtr,
    props: &WriterProperties,
    v2_ratio: f64,
) -> Result<Option<DictionaryChunk>, ParquetError> {
    let path = descr.path();
    if !props.dictionary_enabled(path)
        || props.bloom_filter_properties(path).is_some()
        || props.encoding(path).is_some_and(|e| e != Encoding::PLAIN)
        || props.statistics_enabled(path) == EnabledStatistics::Page
    {
        return Ok(None);
    }
    let Compression::ZSTD(level) = props.compression(path) else {
        return Ok(None);
    };
    if !may_encode(array.data_type()) {
        return Ok(None);
    }
    let shape = match array.data_type() {
        DataType::List(item) => list_shape::<i32>(array, field, item),
        DataType::LargeList(item) => list_shape::<i64>(array, field, item),
        _ => Some((Shape::Flat(nulls_of(array.as_ref())), array)),
    };
    let Some((shape, values)) = shape else {
        return Ok(None);
    };
    // The levels parquet's schema gives the leaf must be the ones the shape
    // writes.
    let expected = match &shape {
        Shape::Flat(nulls) => {
            if descr.max_def_level() == 0 && nulls.is_some() {
                return Ok(None);
            }
            (descr.max_def_level() <= 1).then_some(0)
        }
        Shape::List {
            levels: (list, item),
            nulls,
            ..
        } => {
            if !list && nulls.is_some() {
                return Ok(None);
            }
            (descr.max_def_level() == 1 + *list as i16 + *item as i16).then_some(1)
        }
    };
    if expected != Some(descr.max_rep_level()) {
        return Ok(None);
    }
    let chunk = Chunk {
        descr,
        props,
        shape,
        level: level.compression_level(),
        v2_ratio,
    };
    match values.data_type() {
        DataType::Int8 => chunk.encode(
            &(values.as_primitive::<Int8Type>().values().iter())
                .map(|&v| v as i32)
                .collect::<Vec<_>>(),
        ),
        DataType::Int16 => chunk.encode(
            &(values.as_primitive::<Int16Type>().values().iter())
                .map(|&v| v as i32)
                .collect::<Vec<_>>(),
        ),
        DataType::Int32 => chunk.encode(values.as_primitive::<Int32Type>().values()),
        DataType::Int64 => chunk.encode(values.as_primitive::<Int64Type>().values()),
        DataType::Float32 => chunk.encode(values.as_primitive::<Float32Type>().values()),
        DataType::Float64 => chunk.encode(values.as_primitive::<Float64Type>().values()),
        _ => Ok(None),
    }
}

/// The nulls of `array`, `None` where it has none (a validity buffer with
/// every slot valid, as some kernels leave, included: such a column takes
/// the paths of columns without nulls).
fn nulls_of(array: &dyn Array) -> Option<NullBuffer> {
    array.logical_nulls().filter(|n| n.null_count() > 0)
}

/// A list column's shape and its values (`None`: an offset that is no
/// index).
fn list_shape<'a, O: OffsetSizeTrait>(
    array: &'a ArrayRef,
    field: &Field,
    item: &Field,
) -> Option<(Shape, &'a ArrayRef)> {
    let list = array.as_list::<O>();
    let offsets = (list.value_offsets().iter())
        .map(|o| o.to_usize())
        .collect::<Option<Vec<usize>>>()?;
    let shape = Shape::List {
        offsets,
        nulls: nulls_of(array.as_ref()),
        items: nulls_of(list.values().as_ref()),
        levels: (field.is_nullable(), item.is_nullable()),
    };
    Some((shape, list.values()))
}

/// How a chunk's values sit in its rows.
enum Shape {
    /// One value a row (`None`: no nulls).
    Flat(Option<NullBuffer>),
    /// A list of values a row: row `r`'s are `offsets[r]..offsets[r + 1]` of
    /// the values; null rows and null items where their buffers say so;
    /// `levels`: whether the list and the item add a definition level.
    List {
        offsets: Vec<usize>,
        nulls: Option<NullBuffer>,
        items: Option<NullBuffer>,
        levels: (bool, bool),
    },
}

/// One chunk's settings.
struct Chunk<'a> {
    descr: &'a ColumnDescPtr,
    props: &'a WriterProperties,
    shape: Shape,
    level: i32,
    v2_ratio: f64,
}

/// The distinct values of a chunk in order of first appearance, and a table
/// from bit pattern to position.
struct Dictionary<T> {
    values: Vec<T>,
    /// Position + 1 of the value in each slot (0: empty); a power of two long.
    slots: Vec<u32>,
    shift: u32,
    /// The last value interned and its key (runs skip the table).
    last: Option<(u64, u32)>,
    /// For integers within a narrow range: the smallest, and position + 1
    /// of each value from it (0: not seen), in place of `slots`.
    direct: Option<(i64, Vec<u32>)>,
}

impl<T: Fixed> Dictionary<T> {
    /// Slots of a new hashed table.
    const SLOTS: usize = 1 << 12;

    /// A dictionary for `values` (every value it will be asked to intern).
    fn new(values: &[T]) -> Self {
        // A table indexed by value costs its zeroing: worth it up to about as
        // many entries as values (and at most 1 Mi entries, 4 MiB).
        let direct = (values.iter().try_fold((i64::MAX, i64::MIN), |(lo, hi), v| {
            v.integer().map(|i| (lo.min(i), hi.max(i)))
        }))
        .and_then(|(lo, hi)| {
            let span = usize::try_from(hi.checked_sub(lo)?).ok()?.checked_add(1)?;
            (span <= values.len().max(Self::SLOTS) && span <= 1 << 20).then(|| (lo, vec![0; span]))
        });
        Dictionary {
            values: Vec::new(),
            slots: if direct.is_some() {
                Vec::new()
            } else {
                vec![0; Self::SLOTS]
            },
            shift: 64 - Self::SLOTS.trailing_zeros(),
            last: None,
            direct,
        }
    }

    fn slot(&self, bits: u64) -> usize {
        (bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The key of `value`, added if new.
    fn intern(&mut self, value: T) -> u32 {
        let bits = value.bits();
        if let Some((b, key)) = self.last
            && b == bits
        {
            return key;
        }
        if let Some((lo, table)) = &mut self.direct
            && let Some(entry) = table.get_mut(value.offset_from(*lo))
        {
            let key = if *entry == 0 {
                self.values.push(value);
                *entry = self.values.len() as u32;
                *entry - 1
            } else {
                *entry - 1
            };
            self.last = Some((bits, key));
            return key;
        }
        if self.slots.is_empty() {
            // A value outside the direct table's range (none should be): the
            // hashed table from here on, holding every value so far.
            self.direct = None;
            self.resize(
                (self.values.len() * 2 + 1)
                    .next_power_of_two()
                    .max(Self::SLOTS),
            );
        }
        let key = self.hashed(value, bits);
        self.last = Some((bits, key));
        key
    }

    /// The key of `value` (of bit pattern `bits`) in the hashed table, added
    /// if new (the table grows past half full). Inlined into the bulk loop of
    /// [`Dictionary::intern_all_hashed`], where a call a value cost a third
    /// of the interning.
    #[inline(always)]
    fn hashed(&mut self, value: T, bits: u64) -> u32 {
        let mask = self.slots.len() - 1;
        let mut slot = self.slot(bits);
        loop {
            match self.slots[slot] {
                0 => break,
                entry if self.values[entry as usize - 1].bits() == bits => return entry - 1,
                _ => slot = (slot + 1) & mask,
            }
        }
        self.values.push(value);
        let key = self.values.len() as u32;
        self.slots[slot] = key;
        if self.values.len() * 2 > self.slots.len() {
            self.grow();
        }
        key - 1
    }

    /// The values in the order of their bit patterns, and the keys of
    /// `pages` changed to match: row groups that hold the same few values
    /// then have the same dictionary (see [`SORTED_MAX`]). Nothing is
    /// interned after.
    fn sort(&mut self, pages: &mut [PageBuilder]) {
        let mut by: Vec<u32> = (0..self.values.len() as u32).collect();
        by.sort_unstable_by_key(|&i| self.values[i as usize].bits());
        self.reorder(&by, pages);
    }

    /// Where the keys of `pages` are skewed (the most used sixteenth of the
    /// values named by at least a quarter of them, four times a uniform
    /// share), the values in the order of how many keys name them, most
    /// first (ties in the order they came), and the keys changed to match.
    /// The common values then get the small keys, so the high bits of most
    /// keys are zero, which zstd's entropy coding takes out: on token lists
    /// (a vocabulary of 50,257, Zipf-like use) the pages come out 7%
    /// smaller than in order of first appearance, and the loader's lookups
    /// of common values stay within the dictionary's first cache lines.
    /// Keys that are not skewed keep the order of first appearance, where a
    /// page before the dictionary's last values came may need a bit fewer
    /// ([`Chunk::data_page`]). Nothing is interned after.
    fn order_by_use(&mut self, pages: &mut [PageBuilder]) {
        let mut uses = vec![0u64; self.values.len()];
        for page in pages.iter() {
            for &key in &page.keys {
                // Keys index the values they were interned into.
                uses[key as usize] += 1;
            }
        }
        let mut by: Vec<u32> = (0..self.values.len() as u32).collect();
        // Stable: ties keep the order of first appearance.
        by.sort_by_key(|&i| std::cmp::Reverse(uses[i as usize]));
        let total: u64 = uses.iter().sum();
        let top: u64 = by[..by.len() / 16].iter().map(|&i| uses[i as usize]).sum();
        if top * 4 >= total {
            self.reorder(&by, pages);
        }
    }

    /// The values reordered so that `by[new]` is the old position of the
    /// value at `new`, and the keys of `pages` changed to match.
    fn reorder(&mut self, by: &[u32], pages: &mut [PageBuilder]) {
        let mut rank = vec![0u32; by.len()];
        for (new, &old) in by.iter().enumerate() {
            rank[old as usize] = new as u32;
        }
        self.values = by.iter().map(|&i| self.values[i as usize]).collect();
        for page in pages {
            for key in &mut page.keys {
                *key = rank[*key as usize];
            }
        }
        // The lookup tables hold the old keys.
        self.slots.clear();
        self.direct = None;
        self.last = None;
    }

    /// The keys of `values`, added to `keys` (values added where new).
    fn intern_all(&mut self, values: &[T], keys: &mut Vec<u32>) {
        keys.reserve(values.len());
        if let Some((lo, table)) = &mut self.direct {
            let lo = *lo;
            for (n, &v) in values.iter().enumerate() {
                // Integers only have a direct table; past its end (a wrapped
                // difference too) is the general path for the rest.
                let Some(entry) = table.get_mut(v.offset_from(lo)) else {
                    for &v in &values[n..] {
                        keys.push(self.intern(v));
                    }
                    return;
                };
                if *entry == 0 {
                    self.values.push(v);
                    *entry = self.values.len() as u32;
                }
                keys.push(*entry - 1);
            }
            self.last = None;
        } else if self.slots.is_empty() {
            keys.extend(values.iter().map(|&v| self.intern(v)));
        } else {
            self.intern_all_hashed(values, keys);
        }
    }

    /// [`Dictionary::intern`] over `values` through the hashed table, in one
    /// loop: the run check and the table's probe ([`Dictionary::hashed`])
    /// inline, no call a value.
    fn intern_all_hashed(&mut self, values: &[T], keys: &mut Vec<u32>) {
        let mut last = self.last;
        for &value in values {
            let bits = value.bits();
            if let Some((b, key)) = last
                && b == bits
            {
                keys.push(key);
                continue;
            }
            let key = self.hashed(value, bits);
            keys.push(key);
            last = Some((bits, key));
        }
        self.last = last;
    }

    fn grow(&mut self) {
        self.resize(self.slots.len() * 2);
    }

    /// A hashed table of `len` slots (a power of two) holding every value.
    fn resize(&mut self, len: usize) {
        self.slots = vec![0; len];
        self.shift = 64 - len.trailing_zeros();
        let mask = len - 1;
        for (i, v) in self.values.iter().enumerate() {
            let mut slot = self.slot(v.bits());
            while self.slots[slot] != 0 {
                slot = (slot + 1) & mask;
            }
            self.slots[slot] = i as u32 + 1;
        }
    }
}

/// Dictionaries of at most this many values are written sorted (by their
/// values' bit patterns) instead of in the order values first came: a
/// low-cardinality column's row groups then have the same dictionary, and
/// the loader's shuffle stage uses it as the window's, with one-byte keys,
/// instead of concatenating 8 of them (on the 40-column tabular set of
/// docs/performance-notes.md: 24 columns of 2 to 100 values). A larger dictionary is
/// ordered by use ([`Dictionary::order_by_use`]).
const SORTED_MAX: usize = 256;

/// A flat integer column's dictionary is checked against its deltas once it
/// holds this many values ([`Probe`]).
const PROBE_FROM: usize = 2048;

/// Values interned between checks of a flat integer column's dictionary.
const PROBE_ROWS: usize = 4096;

/// Whether a flat integer column's dictionary encoding is bound to be larger
/// than its deltas, checked as its values are interned: a high-cardinality
/// column gives the dictionary up after a part of its values instead of
/// interning and encoding them all to lose at the end (on the 40-column
/// table of docs/performance-notes.md, a quarter of `shard`'s time went to such columns).
///
/// What the chunk's dictionary encoding will at least hold, from what is
/// interned so far: a key for every one of its rows, at the bits the
/// dictionary's size already needs (its size only grows), stored at the
/// ratio this column's keys were stored at (bit-packed, then zstd where zstd
/// saves a tenth; measured once, on the first keys checked); and a dictionary
/// page of the values seen so far, each counted at the bytes a value takes
/// among the column's deltas (an estimate of what zstd makes of a value in
/// PLAIN). When that exceeds the deltas' size, the deltas are written. Each
/// check costs a few arithmetic operations; the one zstd call compresses at
/// most [`PROBE_ROWS`] keys.
#[derive(Default)]
struct Probe {
    /// Stored bytes per bit-packed byte of keys, once measured.
    key_ratio: Option<f64>,
}

impl Probe {
    fn loses<T: Fixed>(
        &mut self,
        chunk: &Chunk<'_>,
        values: &[T],
        keys: &[u32],
        rows: usize,
        delta: usize,
    ) -> Result<bool, ParquetError> {
        if keys.is_empty() || rows == 0 {
            return Ok(false);
        }
        let bits = bits_for(values.len().saturating_sub(1));
        let key_ratio = match self.key_ratio {
            Some(r) => r,
            None => {
                let sample = &keys[keys.len().saturating_sub(PROBE_ROWS)..];
                let mut packed = Vec::with_capacity(1 + sample.len() * 4);
                packed.push(bits);
                encode_keys(sample, bits, &mut packed);
                let zstd = compress(chunk.level, &packed)?.len();
                let stored = if chunk.keeps_compressed(zstd, packed.len()) {
                    zstd
                } else {
                    packed.len()
                };
                let r = stored as f64 / (sample.len() as f64 * f64::from(bits) / 8.0);
                *self.key_ratio.insert(r)
            }
        };
        let keys_bytes = rows as f64 * f64::from(bits) / 8.0 * key_ratio;
        let dictionary_bytes = values.len() as f64 * delta as f64 / rows as f64;
        Ok(keys_bytes + dictionary_bytes > delta as f64)
    }
}

/// Bits needed for values up to `max`.
fn bits_for(max: usize) -> u8 {
    (usize::BITS - max.leading_zeros()) as u8
}

thread_local! {
    /// One zstd context per encoder thread, at the level it was made for
    /// (parquet's writer makes one per column chunk).
    static ZSTD: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
}

/// `data` compressed at `level`.
pub(crate) fn compress(level: i32, data: &[u8]) -> Result<Vec<u8>, ParquetError> {
    ZSTD.with_borrow_mut(|slot| {
        if slot.as_ref().is_none_or(|(l, _)| *l != level) {
            let compressor = zstd::bulk::Compressor::new(level)
                .map_err(|e| ParquetError::External(Box::new(e)))?;
            *slot = Some((level, compressor));
        }
        let (_, compressor) = slot.as_mut().expect("set above");
        compressor
            .compress(data)
            .map_err(|e| ParquetError::External(Box::new(e)))
    })
}

/// One data page being filled: its levels, and the keys of its values.
struct PageBuilder {
    rows: usize,
    levels: usize,
    keys: Vec<u32>,
    def: Option<Hybrid>,
    rep: Option<Hybrid>,
    /// Levels below the maximum definition level (nulls and empty lists).
    nulls: usize,
}

impl Chunk<'_> {
    /// The chunk of `values`: dictionary encoded, or for a flat integer
    /// column without nulls `DELTA_BINARY_PACKED` where that is smaller (or
    /// the dictionary outgrows its limit); `None` where parquet's writer
    /// should write it.
    fn encode<T: Fixed>(&self, values: &[T]) -> Result<Option<DictionaryChunk>, ParquetError> {
        let flat = matches!(self.shape, Shape::Flat(None)) && T::INTEGER && !values.is_empty();
        let bits = if std::mem::size_of::<T>() == 8 {
            64
        } else {
            32
        };
        let get = |v: T| v.integer().unwrap_or_default();
        let delta = flat.then(|| crate::delta::size(values, get, bits));
        let dictionary = self.dictionary_pages(values, delta)?;
        let encoded = match (dictionary, delta) {
            (Some(d), None) => d,
            (Some(d), Some(delta)) if d.bytes() <= delta => d,
            // Smaller as deltas, or a dictionary past its limit (parquet's
            // writer would fall back to PLAIN).
            _ if flat => self.delta_pages(values, get, bits)?,
            _ => return Ok(None),
        };
        self.assemble(encoded).map(Some)
    }

    /// `values` as dictionary pages, or `None` (see [`Chunk::encode`]).
    /// With `delta`, the bytes of the chunk as deltas (a flat integer
    /// column): `None` too as soon as the dictionary is bound to be larger
    /// ([`Probe`]), before every value is interned.
    fn dictionary_pages<T: Fixed>(
        &self,
        values: &[T],
        delta: Option<usize>,
    ) -> Result<Option<Encoded>, ParquetError> {
        let (max_def, max_rep) = (self.descr.max_def_level(), self.descr.max_rep_level());
        let rows = match &self.shape {
            Shape::Flat(_) => values.len(),
            Shape::List { offsets, .. } => offsets.len().saturating_sub(1),
        };
        if rows == 0 {
            return Ok(None);
        }
        let width = std::mem::size_of::<T>().max(4);
        let limit = self.props.dictionary_page_size_limit() / width;
        let page_rows = self.props.data_page_row_count_limit().max(1);
        let page_bytes = self.props.data_page_size_limit();
        // The values the rows hold (a list's: its offsets' span).
        let span = match &self.shape {
            Shape::Flat(_) => Some(values),
            Shape::List { offsets, .. } => offsets
                .first()
                .zip(offsets.last())
                .and_then(|(&a, &b)| values.get(a..b)),
        };
        let Some(span) = span else {
            return Ok(None);
        };
        let mut dictionary = Dictionary::<T>::new(span);
        let mut nans = 0u64;
        let mut def_histogram = vec![0i64; max_def as usize + 1];
        let mut rep_histogram = vec![0i64; max_rep as usize + 1];
        let (mut levels_total, mut nulls_total) = (0usize, 0usize);
        // Data pages, made before the dictionary page that precedes them.
        let mut pages = Vec::new();
        // Finished pages, encoded once the dictionary has its final order
        // (sorted or by use): their keys, 4 bytes a value, are held until
        // the chunk's end.
        let mut waiting: Vec<PageBuilder> = Vec::new();
        let new_page = |capacity: usize| PageBuilder {
            rows: 0,
            levels: 0,
            keys: Vec::with_capacity(capacity),
            def: (max_def > 0).then(|| Hybrid::new(bits_for(max_def as usize))),
            rep: (max_rep > 0).then(|| Hybrid::new(bits_for(max_rep as usize))),
            nulls: 0,
        };
        let mut page = new_page(page_rows.min(rows));
        let mut probe = Probe::default();
        let mut r = 0;
        while r < rows {
            // Rows taken this step: one, or the rest of the page for a flat
            // column without nulls.
            let mut step = 1;
            match &self.shape {
                Shape::Flat(None) => {
                    step = (page_rows - page.rows).min(rows - r);
                    match delta {
                        Some(delta) => {
                            for slice in values[r..r + step].chunks(PROBE_ROWS) {
                                dictionary.intern_all(slice, &mut page.keys);
                                if dictionary.values.len() >= PROBE_FROM
                                    && probe.loses(
                                        self,
                                        &dictionary.values,
                                        &page.keys,
                                        rows,
                                        delta,
                                    )?
                                {
                                    return Ok(None);
                                }
                            }
                        }
                        None => dictionary.intern_all(&values[r..r + step], &mut page.keys),
                    }
                    page.levels += step;
                    if let Some(def) = &mut page.def {
                        def.push(1, step);
                    }
                }
                Shape::Flat(Some(nulls)) => {
                    page.levels += 1;
                    if nulls.is_valid(r) {
                        page.keys.push(dictionary.intern(values[r]));
                        if let Some(def) = &mut page.def {
                            def.push(1, 1);
                        }
                    } else {
                        page.nulls += 1;
                        if let Some(def) = &mut page.def {
                            def.push(0, 1);
                        }
                    }
                }
                Shape::List {
                    offsets,
                    nulls,
                    items,
                    levels: (list, _),
                } => {
                    let empty = *list as u32;
                    let (def, rep) = (
                        page.def.as_mut().expect("lists have levels"),
                        page.rep.as_mut().expect("lists have levels"),
                    );
                    let (start, end) = (offsets[r], offsets[r + 1]);
                    if end < start || end > values.len() {
                        return Ok(None);
                    }
                    if nulls.as_ref().is_some_and(|n| n.is_null(r)) {
                        def.push(0, 1);
                        rep.push(0, 1);
                        page.levels += 1;
                        page.nulls += 1;
                    } else if start == end {
                        def.push(empty, 1);
                        rep.push(0, 1);
                        page.levels += 1;
                        page.nulls += 1;
                    } else {
                        rep.push(0, 1);
                        rep.push(1, end - start - 1);
                        page.levels += end - start;
                        match items {
                            Some(items) if items.null_count() > 0 => {
                                for (i, &v) in values.iter().enumerate().take(end).skip(start) {
                                    if items.is_valid(i) {
                                        def.push(max_def as u32, 1);
                                        page.keys.push(dictionary.intern(v));
                                    } else {
                                        def.push(empty + 1, 1);
                                        page.nulls += 1;
                                    }
                                }
                            }
                            _ => {
                                def.push(max_def as u32, end - start);
                                dictionary.intern_all(&values[start..end], &mut page.keys);
                            }
                        }
                    }
                }
            }
            page.rows += step;
            r += step;
            if dictionary.values.len() > limit {
                return Ok(None);
            }
            // parquet's estimate of a dictionary page's size: every group of
            // 8 keys a bit-packed run of its own.
            let estimate = page.keys.len().div_ceil(8)
                * (1 + bits_for(dictionary.values.len().saturating_sub(1)) as usize);
            if page.rows >= page_rows || estimate >= page_bytes || r == rows {
                let capacity = page.keys.len();
                let full = std::mem::replace(&mut page, new_page(capacity));
                if T::FLOAT {
                    nans += (full.keys.iter())
                        .filter(|&&k| dictionary.values[k as usize].is_nan())
                        .count() as u64;
                }
                levels_total += full.levels;
                nulls_total += full.nulls;
                if let Some(def) = &full.def {
                    def.histogram(&mut def_histogram);
                }
                if let Some(rep) = &full.rep {
                    rep.histogram(&mut rep_histogram);
                }
                waiting.push(full);
            }
        }
        if dictionary.values.is_empty() {
            return Ok(None);
        }
        // Every page waits for the dictionary's final order: a dictionary
        // that never grew past `SORTED_MAX` values sorted, a larger one by
        // use; their keys with it.
        if dictionary.values.len() <= SORTED_MAX {
            dictionary.sort(&mut waiting);
        } else {
            dictionary.order_by_use(&mut waiting);
        }
        for page in waiting {
            pages.push(self.data_page(page)?);
        }

        let mut plain = Vec::with_capacity(dictionary.values.len() * width);
        for &v in &dictionary.values {
            v.plain(&mut plain);
        }
        let dictionary_page = CompressedPage::new(
            Page::DictionaryPage {
                buf: compress(self.level, &plain)?.into(),
                num_values: page_count(dictionary.values.len(), "dictionary values")?,
                encoding: self.props.dictionary_page_encoding(),
                is_sorted: false,
            },
            plain.len(),
        );

        let (min, max) = extremes(&dictionary.values);
        let statistics = T::statistics(min, max, nulls_total as u64, T::FLOAT.then_some(nans));
        let dictionary_encoding = self.props.dictionary_page_encoding();
        Ok(Some(Encoded {
            dictionary_page: Some(dictionary_page),
            pages,
            encodings: vec![
                dictionary_encoding,
                Encoding::RLE,
                self.props.dictionary_data_page_encoding(),
            ],
            data_encoding: self.props.dictionary_data_page_encoding(),
            statistics,
            rows,
            levels: levels_total,
            def_histogram,
            rep_histogram,
        }))
    }

    /// `values` (a flat integer column without nulls, `bits` wide, read by
    /// `get`) as V2 `DELTA_BINARY_PACKED` pages of at most
    /// `data_page_row_count_limit` rows, stored as they are: zstd shrinks
    /// the bit-packed deltas of columns that take them by 0-2% (the tabular
    /// set of docs/performance-notes.md), so trying it would cost `shard` time for
    /// nothing.
    fn delta_pages<T: Fixed>(
        &self,
        values: &[T],
        get: impl Fn(T) -> i64 + Copy,
        bits: u32,
    ) -> Result<Encoded, ParquetError> {
        let max_def = self.descr.max_def_level();
        let rows = values.len();
        // Deltas take at most 65 bits a value: pages stay under the byte limit.
        let page_rows = (self.props.data_page_row_count_limit())
            .min(self.props.data_page_size_limit() / 9)
            .max(crate::delta::BLOCK);
        let mut pages = Vec::with_capacity(rows.div_ceil(page_rows));
        let mut data = Vec::new();
        for page in values.chunks(page_rows) {
            let mut levels = Vec::new();
            if max_def > 0 {
                let mut def = Hybrid::new(bits_for(max_def as usize));
                def.push(1, page.len());
                def.finish(&mut levels);
            }
            data.clear();
            crate::delta::encode(page, get, bits, &mut data);
            pages.push(self.v2_page(
                &levels,
                &data,
                Encoding::DELTA_BINARY_PACKED,
                (page.len(), page.len(), 0),
                (levels.len(), 0),
                false,
            )?);
        }
        let (min, max) = extremes(values);
        Ok(Encoded {
            dictionary_page: None,
            pages,
            encodings: vec![Encoding::RLE, Encoding::DELTA_BINARY_PACKED],
            data_encoding: Encoding::DELTA_BINARY_PACKED,
            statistics: T::statistics(min, max, 0, None),
            rows,
            levels: rows,
            def_histogram: if max_def > 0 {
                vec![0, rows as i64]
            } else {
                vec![0]
            },
            rep_histogram: vec![0],
        })
    }

    /// The chunk of `encoded`'s pages, with the metadata parquet's writer
    /// gives such a chunk.
    fn assemble(&self, encoded: Encoded) -> Result<DictionaryChunk, ParquetError> {
        let Encoded {
            dictionary_page,
            pages,
            encodings,
            data_encoding,
            statistics,
            rows,
            levels: levels_total,
            def_histogram,
            rep_histogram,
        } = encoded;
        let (max_def, max_rep) = (self.descr.max_def_level(), self.descr.max_rep_level());
        let data_pages = pages.len();
        let Written {
            parts,
            dictionary_offset,
            data_offset,
            compressed,
            uncompressed,
        } = write_pages(dictionary_page, pages)?;

        let mut builder = ColumnChunkMetaData::builder(self.descr.clone())
            .set_compression(self.props.compression(self.descr.path()))
            .set_encodings(encodings.clone())
            .set_page_encoding_stats(
                (dictionary_offset.is_some().then_some(PageEncodingStats {
                    page_type: PageType::DICTIONARY_PAGE,
                    encoding: encodings[0],
                    count: 1,
                }))
                .into_iter()
                .chain([PageEncodingStats {
                    page_type: PageType::DATA_PAGE_V2,
                    encoding: data_encoding,
                    count: i32::try_from(data_pages).map_err(|_| {
                        ParquetError::General(format!("a column chunk of {data_pages} pages"))
                    })?,
                }])
                .collect(),
            )
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size(uncompressed as i64)
            .set_num_values(levels_total as i64)
            .set_data_page_offset(data_offset.unwrap_or(0) as i64)
            .set_dictionary_page_offset(dictionary_offset);
        if self.props.statistics_enabled(self.descr.path()) != EnabledStatistics::None {
            builder = builder
                .set_statistics(statistics)
                .set_definition_level_histogram((max_def > 0).then(|| def_histogram.into()))
                .set_repetition_level_histogram((max_rep > 0).then(|| rep_histogram.into()));
        }
        let metadata = builder.build()?;
        Ok(DictionaryChunk {
            sums: ChunkSums::of(&parts),
            close: ColumnCloseResult {
                bytes_written: parts.iter().map(|p| p.len() as u64).sum(),
                rows_written: rows as u64,
                metadata,
                bloom_filter: None,
                column_index: None,
                offset_index: None,
            },
            parts,
        })
    }

    /// `page` as a V2 data page: repetition then definition levels as they
    /// are, then the key width and the keys, compressed where that pays.
    /// The width is what the page's largest key needs, as parquet's writer
    /// gives a page the width of the dictionary so far: in a dictionary
    /// ordered by use, a page of common values needs fewer bits than the
    /// whole dictionary (readers take the width each page names).
    fn data_page(&self, page: PageBuilder) -> Result<CompressedPage, ParquetError> {
        let mut levels = Vec::new();
        if let Some(rep) = page.rep {
            rep.finish(&mut levels);
        }
        let rep_len = levels.len();
        if let Some(def) = page.def {
            def.finish(&mut levels);
        }
        let def_len = levels.len() - rep_len;
        let width = bits_for(page.keys.iter().copied().max().unwrap_or(0) as usize);
        // At most a header byte per group of 8 keys beyond their bits.
        let mut data = Vec::with_capacity(2 + page.keys.len().div_ceil(8) * (width as usize + 1));
        data.push(width);
        encode_keys(&page.keys, width, &mut data);
        self.v2_page(
            &levels,
            &data,
            self.props.dictionary_data_page_encoding(),
            (page.levels, page.rows, page.nulls),
            (def_len, rep_len),
            true,
        )
    }

    /// Whether a page of `uncompressed` bytes is stored as its `compressed`
    /// bytes: only where zstd shrinks it below the V2 ratio threshold.
    fn keeps_compressed(&self, compressed: usize, uncompressed: usize) -> bool {
        (compressed as f64) < uncompressed as f64 * self.v2_ratio
    }

    /// A V2 data page of `levels` (repetition then definition levels, of
    /// `def_len` and `rep_len` bytes) and the values `data`, stored
    /// compressed only where zstd shrinks the page below the V2 ratio
    /// threshold (without `try_zstd`, as it is); `values`, `rows` and
    /// `nulls` are the page's counts.
    fn v2_page(
        &self,
        levels: &[u8],
        data: &[u8],
        encoding: Encoding,
        (values, rows, nulls): (usize, usize, usize),
        (def_len, rep_len): (usize, usize),
        try_zstd: bool,
    ) -> Result<CompressedPage, ParquetError> {
        let uncompressed = levels.len() + data.len();
        let compressed = if try_zstd {
            compress(self.level, data)?
        } else {
            Vec::new()
        };
        let is_compressed = try_zstd && self.keeps_compressed(compressed.len(), uncompressed);
        let stored = if is_compressed { &compressed[..] } else { data };
        let mut buf = Vec::with_capacity(levels.len() + stored.len());
        buf.extend_from_slice(levels);
        buf.extend_from_slice(stored);
        let page = Page::DataPageV2 {
            buf: buf.into(),
            num_values: page_count(values, "values")?,
            encoding,
            num_nulls: page_count(nulls, "nulls")?,
            num_rows: page_count(rows, "rows")?,
            def_levels_byte_len: page_count(def_len, "definition level bytes")?,
            rep_levels_byte_len: page_count(rep_len, "repetition level bytes")?,
            is_compressed,
            statistics: None,
        };
        Ok(CompressedPage::new(page, uncompressed))
    }
}

/// A chunk's pages, and what its metadata needs.
struct Encoded {
    dictionary_page: Option<CompressedPage>,
    pages: Vec<CompressedPage>,
    /// The chunk's encodings as parquet lists them (a dictionary's first).
    encodings: Vec<Encoding>,
    data_encoding: Encoding,
    statistics: Statistics,
    rows: usize,
    /// Levels (values and nulls) in all.
    levels: usize,
    def_histogram: Vec<i64>,
    rep_histogram: Vec<i64>,
}

impl Encoded {
    /// Bytes of its pages as stored (headers aside).
    fn bytes(&self) -> usize {
        (self.pages.iter().map(|p| p.data().len())).sum::<usize>()
            + self.dictionary_page.as_ref().map_or(0, |p| p.data().len())
    }
}

/// The minimum and maximum of `values` as parquet's writer keeps them in
/// statistics: a NaN only while nothing else has been seen, otherwise the
/// order of [`Fixed::greater`].
fn extremes<T: Fixed>(values: &[T]) -> (Option<T>, Option<T>) {
    let extreme = |past: fn(T, T) -> bool| {
        values.iter().fold(None, |kept: Option<T>, &v| {
            Some(match kept {
                None => v,
                Some(k) if k.is_nan() != v.is_nan() => {
                    if k.is_nan() {
                        v
                    } else {
                        k
                    }
                }
                Some(k) if past(v, k) => v,
                Some(k) => k,
            })
        })
    };
    (extreme(|v, k| k.greater(v)), extreme(|v, k| v.greater(k)))
}

/// A page header's count, which Parquet stores in 32 bits.
pub(crate) fn page_count(n: usize, what: &str) -> Result<u32, ParquetError> {
    u32::try_from(n).map_err(|_| ParquetError::General(format!("a data page of {n} {what}")))
}

/// Runs of at least this many equal values are RLE runs.
const MIN_RUN: usize = 8;

/// Parquet's RLE / bit-packed hybrid encoding (no length prefix), fed runs
/// of equal values: runs of [`MIN_RUN`] or more as RLE runs, the rest
/// bit-packed in groups of 8 (the last group padded with zeros). Consecutive
/// runs of one value are merged first.
pub(crate) struct Hybrid {
    width: u8,
    out: Vec<u8>,
    /// Values waiting to be bit-packed.
    literals: Vec<u32>,
    /// The run being gathered.
    run: Option<(u32, usize)>,
    /// Count of each value pushed (levels' histograms), when small.
    counts: Vec<i64>,
}

impl Hybrid {
    pub(crate) fn new(width: u8) -> Self {
        Hybrid {
            width,
            out: Vec::new(),
            literals: Vec::new(),
            run: None,
            counts: vec![0; if width <= 4 { 1 << width } else { 0 }],
        }
    }

    /// `count` values `value` (below `1 << width`).
    pub(crate) fn push(&mut self, value: u32, count: usize) {
        if count == 0 {
            return;
        }
        if let Some(c) = self.counts.get_mut(value as usize) {
            *c += count as i64;
        }
        match &mut self.run {
            Some((v, n)) if *v == value => *n += count,
            _ => {
                if let Some((v, n)) = self.run.replace((value, count)) {
                    self.emit(v, n);
                }
            }
        }
    }

    fn emit(&mut self, value: u32, count: usize) {
        if count < MIN_RUN {
            self.literals.extend(std::iter::repeat_n(value, count));
            return;
        }
        // Literals before the run fill their last group from the run.
        let pad = (8 - self.literals.len() % 8) % 8;
        let mut rest = count;
        if !self.literals.is_empty() {
            self.literals.extend(std::iter::repeat_n(value, pad));
            bit_pack(&self.literals, self.width, &mut self.out);
            self.literals.clear();
            rest -= pad;
        }
        if rest >= MIN_RUN {
            rle_run(value, rest, self.width, &mut self.out);
        } else {
            self.literals.extend(std::iter::repeat_n(value, rest));
        }
    }

    /// Add each value's count to `histogram` (levels: small values).
    pub(crate) fn histogram(&self, histogram: &mut [i64]) {
        for (h, c) in histogram.iter_mut().zip(&self.counts) {
            *h += c;
        }
    }

    /// Append the encoding to `out`.
    pub(crate) fn finish(mut self, out: &mut Vec<u8>) {
        if let Some((v, n)) = self.run.take() {
            self.emit(v, n);
        }
        if !self.literals.is_empty() {
            bit_pack(&self.literals, self.width, &mut self.out);
        }
        out.extend_from_slice(&self.out);
    }
}

/// `keys` in the hybrid encoding, as [`Hybrid`] writes them, straight from
/// the slice (keys are mostly literals: no copy into a literal buffer).
fn encode_keys(keys: &[u32], width: u8, out: &mut Vec<u8>) {
    let n = keys.len();
    // Start of the literals not written yet.
    let mut literal = 0;
    let mut i = 0;
    while i < n {
        let k = keys[i];
        let mut j = i + 1;
        while j < n && keys[j] == k {
            j += 1;
        }
        if j - i >= MIN_RUN {
            // Literals before the run fill their last group from the run.
            let pad = (8 - (i - literal) % 8) % 8;
            let pad = if i > literal { pad } else { 0 };
            if i > literal {
                bit_pack(&keys[literal..i + pad], width, out);
            }
            if j - i - pad >= MIN_RUN {
                rle_run(k, j - i - pad, width, out);
                literal = j;
            } else {
                literal = i + pad;
            }
        }
        i = j;
    }
    if literal < n {
        bit_pack(&keys[literal..], width, out);
    }
}

fn rle_run(value: u32, count: usize, width: u8, out: &mut Vec<u8>) {
    varint((count as u64) << 1, out);
    out.extend_from_slice(&value.to_le_bytes()[..(width as usize).div_ceil(8)]);
}

/// One bit-packed run of `values`, padded with zeros to a multiple of 8.
fn bit_pack(values: &[u32], width: u8, out: &mut Vec<u8>) {
    let groups = values.len().div_ceil(8);
    varint(((groups as u64) << 1) | 1, out);
    let start = out.len();
    out.resize(start + groups * width as usize, 0);
    let packed = &mut out[start..];
    // Whole groups of 8 values at once for widths up to 16 (a u128 each),
    // the last (padded) group and wider values a value at a time.
    macro_rules! widths {
        ($($w:literal)*) => {
            match width {
                $($w => pack_groups::<$w>(values, packed),)*
                _ => 0,
            }
        };
    }
    let done = widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
    pack_values(
        &values[done * 8..],
        width,
        &mut packed[done * width as usize..],
    );
}

/// Pack the whole groups of 8 of `values` (`W` bits each) into `packed`;
/// returns how many groups.
fn pack_groups<const W: usize>(values: &[u32], packed: &mut [u8]) -> usize {
    let groups = values.chunks_exact(8);
    let count = groups.len();
    for (group, out) in groups.zip(packed.chunks_exact_mut(W)) {
        let mut acc = 0u128;
        for (i, &v) in group.iter().enumerate() {
            acc |= (v as u128) << (i * W);
        }
        out.copy_from_slice(&acc.to_le_bytes()[..W]);
    }
    count
}

/// Pack `values` (`width` bits each) into `packed` (zeroed, large enough),
/// a value at a time.
fn pack_values(values: &[u32], width: u8, packed: &mut [u8]) {
    let width = width as u32;
    let mut at = 0;
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &v in values {
        acc |= (v as u64) << bits;
        bits += width;
        while bits >= 32 {
            packed[at..at + 4].copy_from_slice(&(acc as u32).to_le_bytes());
            at += 4;
            acc >>= 32;
            bits -= 32;
        }
    }
    while bits > 0 {
        packed[at] = acc as u8;
        at += 1;
        acc >>= 8;
        bits = bits.saturating_sub(8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs, literals, padding and widths 0 to 32 decode to the values.
    #[test]
    fn hybrid_runs_decode_to_their_values() {
        for width in [0u8, 1, 3, 8, 13, 15, 16, 17, 31, 32] {
            let max = if width == 0 {
                0
            } else {
                u32::MAX >> (32 - width)
            };
            let mut values = Vec::new();
            for i in 0..3000u32 {
                let v = match i % 300 {
                    0..=40 => max,
                    41..=45 => 1.min(max),
                    _ => i.wrapping_mul(2_654_435_761) & max,
                };
                values.push(v);
            }
            for len in [0, 1, 7, 8, 9, 41, 48, 49, 3000] {
                let mut out = Vec::new();
                let mut hybrid = Hybrid::new(width);
                for &v in &values[..len] {
                    hybrid.push(v, 1);
                }
                hybrid.finish(&mut out);
                assert_eq!(
                    decode_hybrid(&out, width, len),
                    &values[..len],
                    "width {width} len {len}"
                );
            }
        }
    }

    /// Integers interned through the direct table get the keys the hashed
    /// table gives, values outside its range included (it turns into the
    /// hashed table).
    #[test]
    fn direct_and_hashed_interning_agree() {
        let values: Vec<i64> = (0..20_000).map(|i| (i * 7919) % 3000 - 1500).collect();
        let mut direct = Dictionary::new(&values);
        assert!(direct.direct.is_some());
        let mut hashed = Dictionary::<i64>::new(&[]);
        assert!(hashed.direct.is_none());
        let asked: Vec<i64> = values
            .iter()
            .copied()
            .chain([1 << 40, -5000, 7, 1 << 40])
            .collect();
        let keys: Vec<u32> = asked.iter().map(|&v| direct.intern(v)).collect();
        assert!(direct.direct.is_none(), "out of range: hashed from then on");
        let expected: Vec<u32> = asked.iter().map(|&v| hashed.intern(v)).collect();
        assert_eq!(keys, expected);
        assert_eq!(direct.values, hashed.values);
        // The same through `intern_all`, from a fresh direct table.
        let mut all = Dictionary::new(&values);
        let mut bulk = Vec::new();
        all.intern_all(&asked, &mut bulk);
        assert_eq!(bulk, expected);
        assert!(all.direct.is_none());
        for (&k, &v) in keys.iter().zip(&asked) {
            assert_eq!(direct.values[k as usize], v);
        }
    }

    /// Floats interned in bulk through the hashed table (runs, repeats,
    /// zeros of both signs, NaNs, and enough distinct values to grow the
    /// table several times, in pieces as the encoder hands them) get the
    /// keys and values that interning one at a time gives.
    #[test]
    fn bulk_and_single_hashed_interning_agree() {
        let mut values: Vec<f32> = (0..40_000u32)
            .map(|i| match i % 97 {
                0..=9 => 1.5,
                10 => -0.0,
                11 => 0.0,
                12 => f32::NAN,
                _ => (i.wrapping_mul(2_654_435_761) % 9_000) as f32 / 4.0,
            })
            .collect();
        values.extend(std::iter::repeat_n(3.25f32, 500));
        let mut single = Dictionary::<f32>::new(&values);
        assert!(single.direct.is_none());
        let expected: Vec<u32> = values.iter().map(|&v| single.intern(v)).collect();
        let mut bulk = Dictionary::<f32>::new(&values);
        let mut keys = Vec::new();
        for piece in values.chunks(4_096) {
            bulk.intern_all(piece, &mut keys);
        }
        assert_eq!(keys, expected);
        let bits = |d: &Dictionary<f32>| d.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&bulk), bits(&single));
        assert!(
            bulk.slots.len() > Dictionary::<f32>::SLOTS,
            "the table grew"
        );
    }

    /// A plain reading of the hybrid encoding (the specification's).
    fn decode_hybrid(mut data: &[u8], width: u8, n: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let varint = |data: &mut &[u8]| {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let b = data[0];
                *data = &data[1..];
                v |= ((b & 0x7f) as u64) << shift;
                shift += 7;
                if b < 0x80 {
                    return v;
                }
            }
        };
        while out.len() < n {
            let header = varint(&mut data);
            if header & 1 == 0 {
                let bytes = (width as usize).div_ceil(8);
                let mut le = [0u8; 4];
                le[..bytes].copy_from_slice(&data[..bytes]);
                data = &data[bytes..];
                out.extend(std::iter::repeat_n(
                    u32::from_le_bytes(le),
                    (header >> 1) as usize,
                ));
            } else {
                let count = (header >> 1) as usize * 8;
                let bytes = count * width as usize / 8;
                for k in 0..count {
                    let mut v = 0u64;
                    for b in 0..width as usize {
                        let bit = k * width as usize + b;
                        v |= (((data[bit / 8] >> (bit % 8)) & 1) as u64) << b;
                    }
                    out.push(v as u32);
                }
                data = &data[bytes..];
            }
        }
        assert!(data.is_empty(), "{} bytes left", data.len());
        out.truncate(n);
        out
    }
}
