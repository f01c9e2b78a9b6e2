//! The collator's kernels: row gathers of fixed-width columns, dictionary
//! lookups (with their unchecked reads, sound by the key bounds the shuffle
//! stage makes or that are found here), streamed copies into slabs.

use arrow_buffer::ArrowNativeType;
use arrow_buffer::NullBuffer;
use arrow_data::ArrayData;
use arrow_schema::DataType;

use super::{KeyBound, RowRefs};
use crate::batch::{Buffer, DType};

/// A source column's data, for one source batch.
#[derive(Clone, Debug)]
pub(crate) struct SourceColumn {
    pub(crate) data: ArrayData,
    /// For a dictionary column: a bound on its keys already established
    /// (see [`crate::gather::permute`]), so batches need not find their
    /// largest key again.
    pub(crate) key_bound: Option<KeyBound>,
}

impl SourceColumn {
    pub(crate) fn nulls(&self) -> Option<&NullBuffer> {
        self.data.nulls()
    }

    /// Bytes of a fixed-width buffer from the array's offset on.
    pub(crate) fn fixed(data: &ArrayData, width: usize) -> &[u8] {
        &data.buffers()[0].as_slice()[data.offset() * width..]
    }

    pub(crate) fn offsets(&self, large: bool, row: usize) -> (usize, usize) {
        let i = self.data.offset() + row;
        let raw = self.data.buffers()[0].as_slice();
        if large {
            let at = |k: usize| {
                i64::from_le_bytes(raw[k * 8..k * 8 + 8].try_into().expect("8 bytes")) as usize
            };
            (at(i), at(i + 1))
        } else {
            let at = |k: usize| {
                i32::from_le_bytes(raw[k * 4..k * 4 + 4].try_into().expect("4 bytes")) as usize
            };
            (at(i), at(i + 1))
        }
    }
}

pub(crate) fn row_valid(col: &SourceColumn, row: usize) -> bool {
    col.nulls().is_none_or(|n| n.is_valid(row))
}

impl SourceColumn {
    /// The bytes of row `row` of a binary or string column (offsets or
    /// views); empty for a null row.
    pub(crate) fn value_bytes(&self, large: bool, row: usize) -> &[u8] {
        if !row_valid(self, row) {
            return &[];
        }
        match self.data.data_type() {
            DataType::BinaryView | DataType::Utf8View => {
                let at = (self.data.offset() + row) * 16;
                let raw = &self.data.buffers()[0].as_slice()[at..at + 16];
                let view = u128::from_le_bytes(raw.try_into().expect("16 bytes"));
                let len = view as u32 as usize;
                if len <= 12 {
                    &raw[4..4 + len]
                } else {
                    let view = arrow_data::ByteView::from(view);
                    let data = self.data.buffers()[1 + view.buffer_index as usize].as_slice();
                    &data[view.offset as usize..view.offset as usize + len]
                }
            }
            _ => {
                let (a, b) = self.offsets(large, row);
                &self.data.buffers()[1].as_slice()[a..b]
            }
        }
    }

    /// The element range of a variable-length row; empty for a null row.
    pub(crate) fn span(&self, large: bool, row: usize) -> (usize, usize) {
        if row_valid(self, row) {
            self.offsets(large, row)
        } else {
            (0, 0)
        }
    }
}

/// Make the calling thread's streamed (non-temporal) stores visible before
/// what follows: [`lookup`] and [`stream_copy`] write slabs past the caches
/// and leave fencing to their callers, once per batch (and once per helper
/// thread's share) instead of once per column or per row: a fence waits for
/// every pending streamed line, and one per call cost more than the
/// streaming saved on small batches.
pub(crate) fn fence_streamed() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Copy `src` into `dst` (a slab), streaming copies of 256 bytes or more
/// past the caches (see [`lookup`]), with the widest stores the CPU has
/// (checked at run time): single-thread copies of 115 KB rows from a 342 MB
/// source on an Intel Xeon (2 vCPUs, AVX-512; `benches/stream_copy.rs`, five
/// runs) ran at 5.9-8.2 GB/s with 16-byte stores, 7.4-9.8 with 32-byte and
/// 8.9-10.6 with 64-byte (`memcpy`: 8.0-10.3), in that order in every run.
pub(crate) fn stream_copy(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= 256 {
        assert_eq!(dst.len(), src.len());
        // SAFETY: each runs only where the CPU has its instructions; the
        // lengths are equal (checked above).
        unsafe {
            if std::arch::is_x86_feature_detected!("avx512f") {
                streamed::copy_avx512(dst, src);
            } else if std::arch::is_x86_feature_detected!("avx2") {
                streamed::copy_avx2(dst, src);
            } else {
                streamed::copy_sse2(dst, src);
            }
        }
        return;
    }
    dst.copy_from_slice(src);
}

/// Streaming copies by store width: the head up to the first aligned
/// store, then whole vectors, then the tail.
#[cfg(target_arch = "x86_64")]
mod streamed {
    use std::arch::x86_64::*;

    macro_rules! streamed_copy {
        ($name:ident, $feature:literal, $width:literal, $vector:ty, $load:ident, $store:ident) => {
            /// # Safety
            /// The CPU has the feature; `dst` and `src` are of equal length.
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn $name(dst: &mut [u8], src: &[u8]) {
                let head = dst.as_ptr().align_offset($width).min(dst.len());
                dst[..head].copy_from_slice(&src[..head]);
                let body = (dst.len() - head) / $width * $width;
                // SAFETY: `dst[head..head + body]` is aligned to the store and
                // both ranges lie inside their slices; unaligned loads read
                // `src` within bounds.
                unsafe {
                    let d = dst.as_mut_ptr().add(head) as *mut $vector;
                    let s = src.as_ptr().add(head) as *const $vector;
                    for i in 0..body / $width {
                        $store(d.add(i), $load(s.add(i)));
                    }
                }
                dst[head + body..].copy_from_slice(&src[head + body..]);
            }
        };
    }

    streamed_copy!(
        copy_sse2,
        "sse2",
        16,
        __m128i,
        _mm_loadu_si128,
        _mm_stream_si128
    );
    streamed_copy!(
        copy_avx2,
        "avx2",
        32,
        __m256i,
        _mm256_loadu_si256,
        _mm256_stream_si256
    );
    streamed_copy!(
        copy_avx512,
        "avx512f",
        64,
        __m512i,
        _mm512_loadu_si512,
        _mm512_stream_si512
    );
}

pub(crate) fn write_i64(slab: &mut [u8], buffer: &Buffer, values: &[i64]) {
    let out = &mut slab[buffer.offset..buffer.offset + values.len() * 8];
    for (o, v) in out.chunks_exact_mut(8).zip(values) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn pad_bytes(dtype: DType, value: f64) -> [u8; 8] {
    let mut out = [0u8; 8];
    let bytes: Vec<u8> = match dtype {
        DType::Bool => vec![(value != 0.0) as u8],
        DType::I8 => (value as i8).to_le_bytes().to_vec(),
        DType::I16 => (value as i16).to_le_bytes().to_vec(),
        DType::I32 => (value as i32).to_le_bytes().to_vec(),
        DType::I64 => (value as i64).to_le_bytes().to_vec(),
        DType::U8 => (value as u8).to_le_bytes().to_vec(),
        DType::U16 | DType::F16 => (value as u16).to_le_bytes().to_vec(),
        DType::U32 => (value as u32).to_le_bytes().to_vec(),
        DType::U64 => (value as u64).to_le_bytes().to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
    };
    out[..bytes.len()].copy_from_slice(&bytes);
    out
}

/// A dictionary's keys.
#[derive(Clone, Copy)]
pub(crate) enum KeySlice<'a> {
    U8(&'a [u8]),
    U16(&'a [u16]),
    I32(&'a [i32]),
}

impl KeySlice<'_> {
    /// The largest of the keys in `range`, reading an `i32` key as its
    /// `u32` bit pattern (a negative key is larger than any valid one): what
    /// [`lookup`] needs. One vectorised pass.
    pub(crate) fn max_index(&self, range: std::ops::Range<usize>) -> Option<usize> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: runs only where the CPU has AVX2 (checked above).
            return unsafe { self.max_index_avx2(range) };
        }
        self.max_index_portable(range)
    }

    /// [`KeySlice::max_index`] compiled for AVX2, whose unsigned maxima
    /// (`vpmaxud`, `vpmaxuw`) the baseline's SSE2 lacks.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn max_index_avx2(&self, range: std::ops::Range<usize>) -> Option<usize> {
        self.max_index_portable(range)
    }

    #[inline(always)]
    fn max_index_portable(&self, range: std::ops::Range<usize>) -> Option<usize> {
        match self {
            KeySlice::U8(k) => k[range].iter().copied().max().map(usize::from),
            KeySlice::U16(k) => k[range].iter().copied().max().map(usize::from),
            KeySlice::I32(k) => k[range].iter().map(|&k| k as u32).max().map(|m| m as usize),
        }
    }

    #[inline(always)]
    pub(crate) fn get(&self, row: usize) -> usize {
        match self {
            KeySlice::U8(k) => k[row] as usize,
            KeySlice::U16(k) => k[row] as usize,
            KeySlice::I32(k) => k[row] as usize,
        }
    }
}

/// A fixed-width source array: its values, or a dictionary's keys and values.
#[derive(Clone, Copy)]
pub(crate) enum Fixed<'a> {
    Plain(&'a [u8]),
    Dictionary {
        keys: KeySlice<'a>,
        values: &'a [u8],
        /// At least the largest key, where already known.
        bound: Option<usize>,
    },
}

impl<'a> Fixed<'a> {
    pub(crate) fn of(data: &'a ArrayData, width: usize, key_bound: Option<KeyBound>) -> Self {
        if let DataType::Dictionary(key, _) = data.data_type() {
            let raw = &data.buffers()[0];
            let keys = match key.as_ref() {
                // A permuted window's merged dictionaries (the shuffle stage's).
                DataType::UInt8 => KeySlice::U8(&raw.typed_data::<u8>()[data.offset()..]),
                DataType::UInt16 => KeySlice::U16(&raw.typed_data::<u16>()[data.offset()..]),
                DataType::Int32 => KeySlice::I32(&raw.typed_data::<i32>()[data.offset()..]),
                other => unreachable!("the loader makes u8, u16 or i32 keys, not {other}"),
            };
            Fixed::Dictionary {
                keys,
                values: SourceColumn::fixed(&data.child_data()[0], width),
                bound: key_bound.map(KeyBound::get),
            }
        } else {
            Fixed::Plain(SourceColumn::fixed(data, width))
        }
    }
}

/// A run of consecutive rows of one source: output rows `at..at + len` are
/// rows `first..first + len` of source `source`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Run {
    pub(crate) at: usize,
    pub(crate) source: u32,
    pub(crate) first: u32,
    pub(crate) len: usize,
}

/// The rows as a few runs of consecutive rows of one source each (slices of
/// permuted windows: one run, two where a batch crosses a window boundary),
/// or `None` when they are scattered (more than [`MAX_RUNS`] runs).
pub(crate) fn runs_of(rows: &RowRefs) -> Option<Vec<Run>> {
    const MAX_RUNS: usize = 4;
    let mut runs: Vec<Run> = Vec::new();
    for (i, &(source, row)) in rows.iter().enumerate() {
        if let Some(run) = runs.last_mut()
            && run.source == source
            && run.first as usize + run.len == row as usize
        {
            run.len += 1;
            continue;
        }
        if runs.len() == MAX_RUNS {
            return None;
        }
        runs.push(Run {
            at: i,
            source,
            first: row,
            len: 1,
        });
    }
    Some(runs)
}

/// Copy one `width`-byte value per row, visiting rows in `order`; values of
/// dictionary sources are looked up as they are written. `runs`: the rows
/// as runs of consecutive rows (see [`runs_of`]), each copied or looked up
/// in one sweep.
pub(crate) fn gather_fixed(
    width: usize,
    cols: &[&SourceColumn],
    rows: &RowRefs,
    runs: Option<&[Run]>,
    order: &[u32],
    out: &mut [u8],
) -> std::result::Result<(), String> {
    // Inlined with constant widths below, so common element sizes get
    // fixed-size copies; other widths take the same loop with a runtime width.
    #[inline(always)]
    pub(crate) fn copy(
        w: usize,
        cols: &[&SourceColumn],
        rows: &RowRefs,
        runs: Option<&[Run]>,
        order: &[u32],
        out: &mut [u8],
    ) -> std::result::Result<(), String> {
        if let Some(runs) = runs {
            for run in runs {
                let range = run.first as usize..run.first as usize + run.len;
                let out = &mut out[run.at * w..(run.at + run.len) * w];
                let col = cols[run.source as usize];
                match Fixed::of(&col.data, w, col.key_bound) {
                    Fixed::Plain(values) => {
                        stream_copy(out, &values[range.start * w..range.end * w]);
                    }
                    Fixed::Dictionary {
                        keys,
                        values,
                        bound,
                    } => {
                        // A bound the shuffle stage established holds for
                        // every key of its window; one at or past the
                        // dictionary's end (never for a valid window) is not
                        // used, so such a batch fails exactly as before.
                        let max = match bound {
                            Some(b) if b < values.len() / w => Some(b),
                            _ => keys.max_index(range.clone()),
                        };
                        // SAFETY: `max` is at least the largest of these
                        // keys, as `lookup` needs it.
                        let done = match keys {
                            KeySlice::U8(k) => unsafe {
                                lookup_width(w, &k[range.clone()], max, values, out)?
                            },
                            KeySlice::U16(k) => unsafe {
                                lookup_width(w, &k[range.clone()], max, values, out)?
                            },
                            // SAFETY: as for the two above.
                            KeySlice::I32(k) => unsafe {
                                lookup_width(w, &k[range.clone()], max, values, out)?
                            },
                        };
                        if !done {
                            for (o, row) in out.chunks_exact_mut(w).zip(range) {
                                let at = keys.get(row) * w;
                                o.copy_from_slice(&values[at..at + w]);
                            }
                        }
                    }
                }
            }
            return Ok(());
        }
        let srcs: Vec<Fixed> = cols
            .iter()
            .map(|c| Fixed::of(&c.data, w, c.key_bound))
            .collect();
        for &i in order {
            let (s, r) = rows[i as usize];
            let to = i as usize * w;
            let from = match srcs[s as usize] {
                Fixed::Plain(values) => &values[r as usize * w..r as usize * w + w],
                Fixed::Dictionary { keys, values, .. } => {
                    let at = keys.get(r as usize) * w;
                    &values[at..at + w]
                }
            };
            out[to..to + w].copy_from_slice(from);
        }
        Ok(())
    }
    match width {
        1 => copy(1, cols, rows, runs, order, out),
        2 => copy(2, cols, rows, runs, order, out),
        4 => copy(4, cols, rows, runs, order, out),
        8 => copy(8, cols, rows, runs, order, out),
        w => copy(w, cols, rows, runs, order, out),
    }
}

/// [`lookup`] for values of `w` bytes; false (nothing written) for other
/// widths or unaligned buffers.
///
/// # Safety
///
/// As [`lookup`]'s.
#[inline(always)]
pub(crate) unsafe fn lookup_width<K: ArrowNativeType>(
    w: usize,
    keys: &[K],
    max: Option<usize>,
    values: &[u8],
    out: &mut [u8],
) -> std::result::Result<bool, String> {
    // SAFETY: the caller's promise about `max` is passed on.
    unsafe {
        match w {
            1 => lookup::<u8, K>(keys, max, values, out),
            2 => lookup::<u16, K>(keys, max, values, out),
            4 => lookup::<u32, K>(keys, max, values, out),
            8 => lookup::<u64, K>(keys, max, values, out),
            _ => Ok(false),
        }
    }
}

/// `out[i] = values[keys[i]]` with `T`-sized values, given `max`, at least
/// the largest of `keys` as an index (`None` when there are none); false
/// (nothing written) when the buffers are not aligned for `T`, an error when
/// `max` is outside `values`.
///
/// # Safety
///
/// `max` must be at least the largest of `keys`, reading an `i32` key as its
/// `u32` bit pattern (so a negative key is larger than any valid one), and
/// `None` only when `keys` is empty: once it is below `values`' length, the
/// reads are unchecked.
pub(crate) unsafe fn lookup<T: Copy, K: ArrowNativeType>(
    keys: &[K],
    max: Option<usize>,
    values: &[u8],
    out: &mut [u8],
) -> std::result::Result<bool, String> {
    // SAFETY: `T` is a plain integer type, valid for any bytes; `align_to`
    // only yields whole, aligned `T`s in the middle slices.
    let (pre, values, _) = unsafe { values.align_to::<T>() };
    let (pre_out, out, _) = unsafe { out.align_to_mut::<T>() };
    if !pre.is_empty() || !pre_out.is_empty() || out.len() < keys.len() {
        return Ok(false);
    }
    // The unchecked reads below rely on every key indexing `values`: checked
    // here, beside them (`max` is computed over the keys by the caller,
    // where their type is known and the scan vectorises, or is a bound the
    // shuffle stage established for the whole window).
    debug_assert!(
        max.is_none_or(|m| m >= values.len()) || keys.iter().all(|k| k.as_usize() < values.len())
    );
    if let Some(max) = max
        && max >= values.len()
    {
        return Err(format!(
            "dictionary key {max} is outside its dictionary of {} values",
            values.len()
        ));
    }
    // A slab is written once and read later by a copy to the device (or by
    // the trainer), long after the caches have moved on: 4- and 8-byte values
    // are streamed past the caches instead of having each line of the slab
    // read in first (tabular data: -5% CPU time in side-by-side runs).
    #[cfg(target_arch = "x86_64")]
    if matches!(std::mem::size_of::<T>(), 4 | 8) {
        use std::arch::x86_64::{_mm_stream_si32, _mm_stream_si64};
        if std::arch::is_x86_feature_detected!("avx2") {
            let (n, o) = (values.len(), out.len());
            // SAFETY: AVX2 is present; `T` is a 4- or 8-byte plain integer
            // (`u32` or `u64`), so its slices are slices of that integer;
            // every key is below `values.len()` (checked above) and `out`
            // holds at least `keys.len()` values.
            unsafe {
                if std::mem::size_of::<T>() == 4 {
                    let values = std::slice::from_raw_parts(values.as_ptr() as *const u32, n);
                    let out = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u32, o);
                    stream_lookup_u32(keys, values, out);
                } else {
                    let values = std::slice::from_raw_parts(values.as_ptr() as *const u64, n);
                    let out = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u64, o);
                    stream_lookup_u64(keys, values, out);
                }
            }
            return Ok(true);
        }
        for (o, &k) in out.iter_mut().zip(keys) {
            // SAFETY: `k < values.len()` (checked above); `o` is aligned for
            // `T`, which is 4 or 8 bytes, so it is a valid i32 or i64 target.
            unsafe {
                let v = values.get_unchecked(k.as_usize()) as *const T;
                if std::mem::size_of::<T>() == 8 {
                    _mm_stream_si64(o as *mut T as *mut i64, *(v as *const i64));
                } else {
                    _mm_stream_si32(o as *mut T as *mut i32, *(v as *const i32));
                }
            }
        }
        // (Ordered before the batch is handed over by `fence_streamed`.)
        return Ok(true);
    }
    for (o, &k) in out.iter_mut().zip(keys) {
        // SAFETY: `k < values.len()` (checked above).
        *o = unsafe { *values.get_unchecked(k.as_usize()) };
    }
    Ok(true)
}

/// [`lookup`]'s streamed stores for 4-byte values, eight at a time in one
/// 32-byte store (a third less time than a store per value, on tabular
/// dictionaries), single stores up to the first 32-byte boundary and after
/// the last.
///
/// # Safety
///
/// AVX2 must be present; every key must be below `values.len()` and
/// `out.len()` at least `keys.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn stream_lookup_u32<K: ArrowNativeType>(
    keys: &[K],
    values: &[u32],
    out: &mut [u32],
) {
    use std::arch::x86_64::{__m256i, _mm_stream_si32, _mm256_set_epi32, _mm256_stream_si256};
    let n = keys.len();
    // SAFETY (all below): `i < n <= out.len()` and keys index `values`, as
    // the caller promises.
    let get = |i: usize| unsafe { *values.get_unchecked(keys.get_unchecked(i).as_usize()) as i32 };
    let head = out.as_ptr().align_offset(32).min(n);
    let p = out.as_mut_ptr();
    for i in 0..head {
        unsafe { _mm_stream_si32(p.add(i) as *mut i32, get(i)) };
    }
    let mut i = head;
    while i + 8 <= n {
        let v = _mm256_set_epi32(
            get(i + 7),
            get(i + 6),
            get(i + 5),
            get(i + 4),
            get(i + 3),
            get(i + 2),
            get(i + 1),
            get(i),
        );
        // SAFETY: `i + 8 <= n`; `p + i` is 32-byte aligned: `head` aligned
        // it, and steps are 32 bytes.
        unsafe { _mm256_stream_si256(p.add(i) as *mut __m256i, v) };
        i += 8;
    }
    for i in i..n {
        // SAFETY: `i < n <= out.len()`.
        unsafe { _mm_stream_si32(p.add(i) as *mut i32, get(i)) };
    }
}

/// [`stream_lookup_u32`] for 8-byte values, four at a time.
///
/// # Safety
///
/// As [`stream_lookup_u32`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn stream_lookup_u64<K: ArrowNativeType>(
    keys: &[K],
    values: &[u64],
    out: &mut [u64],
) {
    use std::arch::x86_64::{__m256i, _mm_stream_si64, _mm256_set_epi64x, _mm256_stream_si256};
    let n = keys.len();
    // SAFETY (all below): as in `stream_lookup_u32`.
    let get = |i: usize| unsafe { *values.get_unchecked(keys.get_unchecked(i).as_usize()) as i64 };
    let head = out.as_ptr().align_offset(32).min(n);
    let p = out.as_mut_ptr();
    for i in 0..head {
        unsafe { _mm_stream_si64(p.add(i) as *mut i64, get(i)) };
    }
    let mut i = head;
    while i + 4 <= n {
        let v = _mm256_set_epi64x(get(i + 3), get(i + 2), get(i + 1), get(i));
        // SAFETY: `i + 4 <= n`; `p + i` is 32-byte aligned as above.
        unsafe { _mm256_stream_si256(p.add(i) as *mut __m256i, v) };
        i += 4;
    }
    for i in i..n {
        // SAFETY: `i < n <= out.len()`.
        unsafe { _mm_stream_si64(p.add(i) as *mut i64, get(i)) };
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    /// Every store width this CPU has copies every byte, at any alignment
    /// of either side, and nothing around them.
    #[test]
    fn each_streamed_copy_copies_every_byte_at_any_alignment() {
        type Copy = unsafe fn(&mut [u8], &[u8]);
        let variants: [(&str, bool, Copy); 3] = [
            ("sse2", true, super::streamed::copy_sse2),
            (
                "avx2",
                std::arch::is_x86_feature_detected!("avx2"),
                super::streamed::copy_avx2,
            ),
            (
                "avx512f",
                std::arch::is_x86_feature_detected!("avx512f"),
                super::streamed::copy_avx512,
            ),
        ];
        let src: Vec<u8> = (0..9000u32).map(|i| (i * 31 % 251) as u8).collect();
        for (name, present, copy) in variants {
            if !present {
                continue;
            }
            for len in [0, 1, 63, 64, 65, 255, 256, 1000, 4099, 8191] {
                for shift in [0, 1, 15, 31, 33, 63] {
                    let from = &src[shift % 7..shift % 7 + len];
                    let mut dst = vec![0xeeu8; len + 130];
                    // SAFETY: the CPU has the feature; the lengths are equal.
                    unsafe { copy(&mut dst[shift..shift + len], from) };
                    assert_eq!(
                        &dst[shift..shift + len],
                        from,
                        "{name}, len {len}, shift {shift}"
                    );
                    assert!(
                        dst[..shift]
                            .iter()
                            .chain(&dst[shift + len..])
                            .all(|&b| b == 0xee)
                    );
                }
            }
        }
    }
}
