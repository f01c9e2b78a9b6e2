//! The window permutation: a window's decoded segments materialised in its
//! shuffled order, column by column (fixed-width columns gathered, byte
//! columns copied, dictionary columns' dictionaries made one with their keys
//! checked, or looked up into plain values), on one or several threads.
//!
//! The one bound the collator's unchecked lookups trust, [`KeyBound`], is
//! made here and only here, by the code that checks every key it writes.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::ArrowDictionaryKeyType;
use arrow_array::{
    AnyDictionaryArray, Array, ArrayRef, DictionaryArray, PrimitiveArray, RecordBatch,
};
use arrow_buffer::ArrowNativeType;
use arrow_schema::{DataType, Schema};

use crate::error::{LoaderError, Result, Stage};

/// A bound on a permuted dictionary column's keys: no key of that column
/// (null slots' included) is above it. Made only by [`permute_keys`], which
/// checks every key it writes against its dictionary; the collator's
/// unchecked lookups rely on it, so nothing else can make one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyBound(usize);

impl KeyBound {
    /// The bound, as a key.
    pub(crate) fn get(self) -> usize {
        self.0
    }

    /// A bound taken on trust (tests of what the collator does with one).
    #[cfg(test)]
    pub(crate) fn assumed(bound: usize) -> Self {
        KeyBound(bound)
    }
}

/// Appends `map(key)` to `out` for every key of a dictionary's `keys` (u16
/// or i32), in row order, each checked against the dictionary's `len`
/// values: a null slot's key past them is given as 0, any other is an error.
#[inline(always)]
fn extend_keys<T>(
    keys: &dyn Array,
    len: usize,
    out: &mut Vec<T>,
    map: impl Fn(usize) -> T,
) -> std::result::Result<(), String> {
    use arrow_array::types::{Int32Type, UInt16Type};
    let checked = |key: usize, i: usize| -> std::result::Result<usize, String> {
        if key < len {
            Ok(key)
        } else if keys.is_null(i) {
            Ok(0)
        } else {
            Err(format!(
                "key {key} is outside its dictionary of {len} values"
            ))
        }
    };
    // Every key below `len` (one vectorised pass), or each one checked.
    match keys.data_type() {
        DataType::UInt16 => {
            let ks = keys.as_primitive::<UInt16Type>().values();
            if (ks.iter().fold(0u16, |m, &k| m.max(k)) as usize) < len {
                out.extend(ks.iter().map(|&k| map(k as usize)));
            } else {
                for (i, &k) in ks.iter().enumerate() {
                    out.push(map(checked(k as usize, i)?));
                }
            }
        }
        DataType::Int32 => {
            let ks = keys.as_primitive::<Int32Type>().values();
            // As unsigned: a negative key is out of range too.
            if (ks.iter().fold(0u32, |m, &k| m.max(k as u32)) as usize) < len {
                out.extend(ks.iter().map(|&k| map(k as usize)));
            } else {
                for (i, &k) in ks.iter().enumerate() {
                    out.push(map(checked(usize::try_from(k).unwrap_or(usize::MAX), i)?));
                }
            }
        }
        other => return Err(format!("dictionary keys of type {other}")),
    }
    Ok(())
}

/// A window's dictionary column with its dictionaries made one: its keys
/// in row order (not yet in the window's order), the one dictionary, a
/// bound on the keys (no key, null slots' included, is above it) and each
/// segment's null slots.
struct WindowKeys<T> {
    keys: Vec<T>,
    values: ArrayRef,
    bound: KeyBound,
    nulls: Vec<(Option<arrow_buffer::NullBuffer>, usize)>,
}

/// The dictionaries `dictionaries` (keys u16 or i32) as one, with keys of
/// type `K`: theirs concatenated, or `merged` (their distinct values, with
/// each dictionary's keys mapped into them: see [`deduplicated`]).
fn window_keys<K: ArrowDictionaryKeyType>(
    dictionaries: &[&dyn AnyDictionaryArray],
    merged: Option<Merged>,
) -> std::result::Result<WindowKeys<K::Native>, String> {
    // Keys of every batch, shifted to the concatenated dictionary or mapped
    // into the merged one. Each key is checked against its own dictionary by
    // `extend_keys` (a null slot's key past it is set to 0), so the
    // unchecked construction in `keyed` holds.
    let rows: usize = dictionaries.iter().map(|d| d.len()).sum();
    let values_total = match &merged {
        Some(m) => m.values.len(),
        None => dictionaries.iter().map(|d| d.values().len()).sum(),
    };
    if K::Native::from_usize(values_total.saturating_sub(1)).is_none() {
        return Err(format!(
            "{values_total} dictionary values do not fit the key type"
        ));
    }
    let mut keys: Vec<K::Native> = Vec::with_capacity(rows);
    // Every key is at most this.
    let mut bound = 0usize;
    let values = match merged {
        Some(Merged { values, remaps }) => {
            // A merged key is a key of the one dictionary they all are, or an
            // entry of its dictionary's map: below `values_total` (or 0 for a
            // null slot's key past an empty dictionary).
            bound = values_total.max(1) - 1;
            for (i, d) in dictionaries.iter().enumerate() {
                let len = d.values().len();
                match remaps.as_ref().and_then(|r| r.get(i)) {
                    None => extend_keys(d.keys(), len, &mut keys, K::Native::usize_as)?,
                    Some(remap) => extend_keys(d.keys(), len, &mut keys, |k| {
                        K::Native::usize_as(remap.get(k).copied().unwrap_or(0) as usize)
                    })?,
                }
            }
            values
        }
        None => {
            let mut shift = 0usize;
            // Every key of a dictionary of `len` values is below `len` after
            // the checks: at most `shift + len - 1` once shifted. An empty
            // dictionary's rows are all null (`extend_keys` refuses any
            // other key): their keys are 0, the window's first value (a
            // key past the window's values would make the collator's
            // lookups refuse the batch).
            for d in dictionaries {
                let len = d.values().len();
                if len == 0 {
                    extend_keys(d.keys(), 0, &mut keys, |_| K::Native::usize_as(0))?;
                } else {
                    bound = bound.max(shift + len - 1);
                    extend_keys(d.keys(), len, &mut keys, |k| K::Native::usize_as(k + shift))?;
                }
                shift += len;
            }
            if values_total == 0 && rows > 0 {
                // Every dictionary empty, every row null: one null value for
                // the keys (0) to point at.
                arrow_array::new_null_array(dictionaries[0].values().data_type(), 1)
            } else {
                let values: Vec<&dyn Array> =
                    dictionaries.iter().map(|d| d.values().as_ref()).collect();
                arrow_select::concat::concat(&values).map_err(|e| e.to_string())?
            }
        }
    };
    Ok(WindowKeys {
        keys,
        values,
        bound: KeyBound(bound),
        nulls: null_parts(dictionaries),
    })
}

/// Each dictionary's null slots (of its keys), and its length.
fn null_parts(
    dictionaries: &[&dyn AnyDictionaryArray],
) -> Vec<(Option<arrow_buffer::NullBuffer>, usize)> {
    dictionaries
        .iter()
        .map(|d| {
            let nulls = d.keys().logical_nulls().filter(|n| n.null_count() > 0);
            (nulls, d.len())
        })
        .collect()
}

/// `window`'s column with `permuted` as its keys (its own keys in `order`,
/// the row at each position).
fn keyed<K: ArrowDictionaryKeyType>(
    window: WindowKeys<K::Native>,
    permuted: Vec<K::Native>,
    order: &[u32],
) -> (ArrayRef, KeyBound) {
    // Null rows (their keys index their dictionary too) keep their nulls.
    let nulls = permuted_nulls(&window.nulls, order);
    // SAFETY: the keys, permuted, are `window_keys`'s: each checked by
    // `extend_keys` to lie inside its own dictionary (null slots set to 0,
    // inside it too), then shifted by the values before it in `values`, kept
    // (each dictionary is `values`) or mapped into the merged `values`; an
    // empty dictionary's 0, `values`' first (one null value if all are
    // empty); their length fits `K`.
    let array: ArrayRef = Arc::new(unsafe {
        DictionaryArray::<K>::new_unchecked(
            PrimitiveArray::<K>::new(permuted.into(), nulls),
            window.values,
        )
    });
    (array, window.bound)
}

/// The dictionaries `dictionaries` as one (see [`window_keys`]), with keys
/// of type `K` in `order` (indices into the concatenated rows), and a bound
/// on those keys.
fn permute_keys<K: ArrowDictionaryKeyType>(
    dictionaries: &[&dyn AnyDictionaryArray],
    order: &[u32],
    merged: Option<Merged>,
) -> std::result::Result<(ArrayRef, KeyBound), String> {
    let window = window_keys::<K>(dictionaries, merged)?;
    // `order` is a permutation of the window's rows (the plan's; `permute`
    // checked its length), so every index is in range; indexing checks it
    // anyway.
    let permuted: Vec<K::Native> = order.iter().map(|&g| window.keys[g as usize]).collect();
    Ok(keyed::<K>(window, permuted, order))
}

/// A window's dictionaries of one column merged into one of their distinct
/// values: see [`deduplicated`].
struct Merged {
    /// The distinct values, of the dictionaries' value type.
    values: ArrayRef,
    /// For each dictionary, its keys' places in `values`; `None` when every
    /// dictionary is `values` itself.
    remaps: Option<Vec<Vec<u8>>>,
}

/// The most distinct values a merged dictionary holds: its keys are one
/// byte.
const MERGED_MAX: usize = 1 << 8;

/// `dictionaries` (of one column) merged into one dictionary of their
/// distinct values, compared bit for bit, when there are at most
/// [`MERGED_MAX`] of them and the values are 1-, 2-, 4- or 8-byte
/// primitives, aligned to their width and without nulls; `None` otherwise.
///
/// A window's dictionaries of a low-cardinality column hold the same few
/// values again and again (each row group has its own dictionary: the 40-
/// column tabular set's floats have 100 values, 800 a window). Merged, the
/// column's keys are one byte, so four such columns are gathered as one
/// (see [`permute_bytes`]), and the collator's lookups use a dictionary an
/// eighth the size. `shard` writes such dictionaries sorted, so a window's
/// are most often one and the same, and its keys need no map: their values
/// are only compared (`perf` of 4 epochs of the tabular set: making the
/// window's keys took 8.7% of the samples with shards whose dictionaries
/// each list values in the order they came, 4.8% with sorted ones).
fn deduplicated(dictionaries: &[&dyn AnyDictionaryArray]) -> Option<Merged> {
    let value_type = dictionaries.first()?.values().data_type();
    match value_type.primitive_width()? {
        1 => merge::<u8>(dictionaries, value_type, 1),
        2 => merge::<u16>(dictionaries, value_type, 2),
        4 => merge::<u32>(dictionaries, value_type, 4),
        8 => merge::<u64>(dictionaries, value_type, 8),
        _ => None,
    }
}

/// [`deduplicated`], reading the values as `T` (`width` bytes).
fn merge<T: ArrowNativeType + std::hash::Hash + Eq>(
    dictionaries: &[&dyn AnyDictionaryArray],
    value_type: &DataType,
    width: usize,
) -> Option<Merged> {
    let mut all = Vec::with_capacity(dictionaries.len());
    for d in dictionaries {
        let v = d.values();
        // A dictionary of more values than a merged one holds (or of
        // another type, or nulls among its values) is not merged.
        if v.len() > MERGED_MAX
            || v.data_type() != value_type
            || v.null_count() > 0
            || !aligned(v.as_ref(), width)
        {
            return None;
        }
        all.push(scalar_values::<T>(v.as_ref())?);
    }
    // One and the same dictionary (bit for bit): it is the window's.
    if all.iter().all(|v| v[..] == all[0][..]) {
        return Some(Merged {
            values: dictionaries[0].values().clone(),
            remaps: None,
        });
    }
    let mut distinct: Vec<T> = Vec::new();
    let mut seen: std::collections::HashMap<T, u8> = std::collections::HashMap::new();
    let mut remaps = Vec::with_capacity(dictionaries.len());
    for values in &all {
        let mut remap = Vec::with_capacity(values.len());
        for &x in values.iter() {
            let key = match seen.entry(x) {
                std::collections::hash_map::Entry::Occupied(e) => *e.get(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let key = u8::try_from(distinct.len()).ok()?;
                    distinct.push(x);
                    *e.insert(key)
                }
            };
            remap.push(key);
        }
        remaps.push(remap);
    }
    let data = arrow_data::ArrayData::builder(value_type.clone())
        .len(distinct.len())
        .add_buffer(arrow_buffer::Buffer::from_vec(distinct))
        .build()
        .ok()?;
    Some(Merged {
        values: arrow_array::make_array(data),
        remaps: Some(remaps),
    })
}

/// A permuted window's dictionary column whose dictionaries (concatenated)
/// hold at least this many bytes of values is looked up here, in the shuffle
/// stage, and handed on as plain values, not as keys. The collator works
/// through every projected column for each batch, so its lookups into large
/// dictionaries miss the cache; here one column is worked at a time, and
/// each segment's own dictionary stays cached while its keys are looked up.
/// Measured on the 40-column tabular set of docs/performance-notes.md (the window
/// dictionaries of its 12 int64 columns of 5,000-15,000 values a row group
/// hold 370-960 KB): 15% less CPU an epoch; its smaller dictionaries (the
/// float columns' 3 KB, 64 KB) gain nothing from it, as gathering plain
/// values moves more bytes than gathering 2-byte keys.
pub(crate) const LOOK_UP_ABOVE: usize = 256 << 10;

/// `dictionaries` (of one column, `values` values in all) looked up and put
/// in `order`, as a plain array of their value type, when their values are
/// 4- or 8-byte primitives, aligned to their width and without nulls, that
/// hold at least `above` bytes;
/// `None` otherwise (the keys are permuted instead). A key outside its
/// dictionary is an error unless its slot is null.
fn looked_up(
    dictionaries: &[&dyn AnyDictionaryArray],
    order: &[u32],
    values: usize,
    above: usize,
) -> std::result::Result<Option<ArrayRef>, String> {
    let Some(width) = look_up_width(dictionaries, values, above) else {
        return Ok(None);
    };
    let value_type = dictionaries[0].values().data_type();
    let rows: usize = dictionaries.iter().map(|d| d.len()).sum();
    let buffer = if width == 8 {
        look_up::<u64>(dictionaries, order, rows)?
    } else {
        look_up::<u32>(dictionaries, order, rows)?
    };
    let data = arrow_data::ArrayData::builder(value_type.clone())
        .len(rows)
        .add_buffer(buffer)
        .nulls(permuted_nulls(&null_parts(dictionaries), order))
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Some(arrow_array::make_array(data)))
}

/// The width (4 or 8 bytes) of the values of `dictionaries` (of one column,
/// `values` values in all) when [`looked_up`] looks them up: primitives of
/// that width, aligned to it and without nulls, that hold at least `above`
/// bytes; `None` otherwise.
fn look_up_width(
    dictionaries: &[&dyn AnyDictionaryArray],
    values: usize,
    above: usize,
) -> Option<usize> {
    let value_type = dictionaries.first()?.values().data_type();
    let width @ (4 | 8) = value_type.primitive_width()? else {
        return None;
    };
    let plain = dictionaries.iter().all(|d| {
        d.values().data_type() == value_type
            && d.values().null_count() == 0
            && aligned(d.values().as_ref(), width)
    });
    (plain && values.saturating_mul(width) >= above).then_some(width)
}

/// The values of `array` (a primitive array whose values are `T`-sized
/// and aligned to it: see [`aligned`]) as `T`s.
fn scalar_values<T: ArrowNativeType>(array: &dyn Array) -> Option<arrow_buffer::ScalarBuffer<T>> {
    let data = array.to_data();
    let buffer = data.buffers().first()?;
    Some(arrow_buffer::ScalarBuffer::new(
        buffer.clone(),
        data.offset(),
        data.len(),
    ))
}

/// Whether the values of `array` (a primitive array of `width`-byte
/// values) start at an address `width` aligns: not so for every type of
/// that width (a day-time interval is two 4-byte halves, 4-aligned), and
/// [`look_up`] reads them as `width`-byte integers.
fn aligned(array: &dyn Array, width: usize) -> bool {
    let data = array.to_data();
    data.buffers().first().is_some_and(|b| {
        (b.as_ptr() as usize)
            .wrapping_add(data.offset().wrapping_mul(width))
            .is_multiple_of(width)
    })
}

/// The values of `dictionaries` (primitives of `T`'s width) at their keys,
/// in `order` (indices into their `rows` rows concatenated).
///
/// Where it holds no more memory than the other way (see [`LookUp`]), the
/// window's keys are gathered, a block at a time, and then looked up in the
/// dictionaries concatenated: the random reads are over the keys (4 or 2
/// bytes a row) and the dictionaries, not over a window of values (8 bytes a
/// row for 8-byte values). Otherwise each segment is looked up against its
/// own dictionary first (in row order), then the window of values gathered.
/// Scratch benchmark (4 segments of 287,356 rows, 8-byte values, Zen 3):
/// 2.3-11 ns a row the second way, 40-60% of that the first, for
/// dictionaries of 100 to 287,356 values each.
fn look_up<T: ArrowNativeType>(
    dictionaries: &[&dyn AnyDictionaryArray],
    order: &[u32],
    rows: usize,
) -> std::result::Result<arrow_buffer::Buffer, String> {
    use arrow_array::types::{Int32Type, UInt16Type};
    let values: usize = dictionaries.iter().map(|d| d.values().len().max(1)).sum();
    match LookUp::choose(values, rows, std::mem::size_of::<T>()) {
        LookUp::Keys16 => look_up_keys::<T, UInt16Type>(dictionaries, order),
        LookUp::Keys32 => look_up_keys::<T, Int32Type>(dictionaries, order),
        LookUp::Values => look_up_values::<T>(dictionaries, order, rows),
    }
}

/// How [`look_up`] puts a column's values in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LookUp {
    /// The keys gathered (as `u16`), then looked up.
    Keys16,
    /// The keys gathered (as `i32`), then looked up.
    Keys32,
    /// The values looked up in row order, then gathered.
    Values,
}

impl LookUp {
    /// The way for a window of `rows` rows whose dictionaries hold `values`
    /// values of `width` bytes (an empty dictionary counted as one): the
    /// keys' way where its keys and the dictionaries' copy take no more than
    /// the window of values the other way makes.
    fn choose(values: usize, rows: usize, width: usize) -> LookUp {
        let (key_width, way) = if values <= 1 << 16 {
            (2, LookUp::Keys16)
        } else if i32::try_from(values).is_ok() {
            (4, LookUp::Keys32)
        } else {
            return LookUp::Values;
        };
        let keys = rows.saturating_mul(key_width);
        let held = values.saturating_mul(width).saturating_add(keys);
        if held <= rows.saturating_mul(width) {
            way
        } else {
            LookUp::Values
        }
    }
}

/// [`look_up`] by the keys: the window's keys with its dictionaries made
/// one ([`window_keys`], which checks every key), gathered in `order` a
/// block at a time and looked up in the one dictionary.
fn look_up_keys<T: ArrowNativeType, K: ArrowDictionaryKeyType>(
    dictionaries: &[&dyn AnyDictionaryArray],
    order: &[u32],
) -> std::result::Result<arrow_buffer::Buffer, String> {
    /// Positions whose keys are gathered before they are looked up.
    const BLOCK: usize = 1024;
    let window = window_keys::<K>(dictionaries, None)?;
    // The dictionaries concatenated (a new buffer, or the one dictionary,
    // whose alignment `look_up_width` checked).
    let values =
        scalar_values::<T>(window.values.as_ref()).ok_or("dictionary values without a buffer")?;
    // `order` is a permutation of the window's rows (the plan's; `permute`
    // checked its length); indexing checks each index anyway, and a key
    // past the values (none is) would read as the default.
    let mut out: Vec<T> = Vec::with_capacity(order.len());
    let mut block = [K::Native::default(); BLOCK];
    for positions in order.chunks(BLOCK) {
        for (k, &g) in block.iter_mut().zip(positions) {
            *k = window.keys[g as usize];
        }
        out.extend(
            block[..positions.len()]
                .iter()
                .map(|k| values.get(k.as_usize()).copied().unwrap_or_default()),
        );
    }
    Ok(arrow_buffer::Buffer::from_vec(out))
}

/// [`look_up`] by the values: each segment looked up against its own
/// dictionary first (in row order, so that the dictionary stays cached),
/// then the window gathered.
fn look_up_values<T: ArrowNativeType>(
    dictionaries: &[&dyn AnyDictionaryArray],
    order: &[u32],
    rows: usize,
) -> std::result::Result<arrow_buffer::Buffer, String> {
    let mut all: Vec<T> = Vec::with_capacity(rows);
    for d in dictionaries {
        let values =
            scalar_values::<T>(d.values().as_ref()).ok_or("dictionary values without a buffer")?;
        // A null slot's key past the dictionary is given as 0: only an
        // empty dictionary has no value there, and its rows are all null.
        extend_keys(d.keys(), values.len(), &mut all, |k| {
            values.get(k).copied().unwrap_or_default()
        })?;
    }
    // `order` is a permutation of the window's rows (the plan's; `permute`
    // checked its length); indexing checks each index anyway.
    let permuted: Vec<T> = order.iter().map(|&g| all[g as usize]).collect();
    Ok(arrow_buffer::Buffer::from_vec(permuted))
}

/// The null slots of `parts` (each segment's null slots, if any, and its
/// length; concatenated) in `order`; `None` when none is null.
fn permuted_nulls(
    parts: &[(Option<arrow_buffer::NullBuffer>, usize)],
    order: &[u32],
) -> Option<arrow_buffer::NullBuffer> {
    parts.iter().any(|(n, _)| n.is_some()).then(|| {
        let rows = parts.iter().map(|(_, len)| len).sum();
        let mut all = arrow_buffer::BooleanBufferBuilder::new(rows);
        for (nulls, len) in parts {
            match nulls {
                Some(n) => all.append_buffer(n.inner()),
                None => all.append_n(*len, true),
            }
        }
        let all = all.finish();
        arrow_buffer::NullBuffer::new(arrow_buffer::BooleanBuffer::collect_bool(
            order.len(),
            |i| all.value(order[i] as usize),
        ))
    })
}

/// Put the rows of `batches` (concatenated) in `order` (indices into the
/// concatenation), column by column. Dictionary columns keep their
/// dictionaries (concatenated, or merged into one of at most 256 values
/// whose one-byte keys are gathered four columns at a time: see
/// [`one_byte`], [`permute_bytes`]) and only their keys are permuted, unless
/// their values are 4- or 8-byte primitives that hold at least
/// `look_up_above` bytes (see [`LOOK_UP_ABOVE`]): those are looked up and
/// made plain, as is a column whose batches mix dictionary and plain arrays. `window`
/// names the window in errors. Also gives, per column, a bound on a
/// dictionary column's keys (`None` for plain columns): the collator's
/// lookups need not find each batch's largest key. Columns are shared out among up to
/// `workers` threads (this one included): the shuffle stage is one thread,
/// and with many columns it would otherwise cap a loader given many cores.
pub(crate) fn permute(
    batches: Vec<RecordBatch>,
    order: &[u32],
    window: usize,
    workers: usize,
    look_up_above: usize,
) -> Result<(RecordBatch, Vec<Option<KeyBound>>)> {
    use arrow_array::UInt32Array;

    let err = |detail: String| {
        LoaderError::stage(
            Stage::Shuffle,
            None,
            None,
            format!("window {window}: {detail}"),
        )
    };
    let schema = batches
        .first()
        .ok_or_else(|| err("a window with rows has no batches".into()))?
        .schema();
    let n = schema.fields().len();
    // Every column of the window has these rows: the order must cover them.
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    if order.len() != rows {
        return Err(err(format!(
            "an order of {} rows for a window of {rows}",
            order.len()
        )));
    }
    // Column by column, each column's decoded arrays are let go as soon as
    // its permuted copy is made: the window is held about once while it is
    // permuted, not twice (tabular, 40 columns: the peak of the live heap
    // was a decoded and a permuted window together).
    let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::with_capacity(batches.len()); n];
    for batch in batches {
        for (arrays, array) in columns.iter_mut().zip(batch.columns()) {
            arrays.push(array.clone());
        }
    }
    // Built once, when a plain column first needs it (a copy of the order
    // per column cost more than some columns' gathers).
    let indices = std::sync::OnceLock::new();
    let indices = || indices.get_or_init(|| UInt32Array::from(order.to_vec()));
    // Dictionary columns whose keys fit one byte are put in order four at a
    // time (see `permute_bytes`), the others one by one.
    let mut work = Vec::with_capacity(n);
    let mut group = Vec::new();
    for (c, arrays) in columns.into_iter().enumerate() {
        match one_byte(&arrays, look_up_above) {
            Some(merged) => {
                group.push((c, arrays, merged));
                if group.len() == BYTE_GROUP {
                    work.push(Work::Bytes(std::mem::take(&mut group)));
                }
            }
            None => work.push(Work::Column(c, arrays)),
        }
    }
    if !group.is_empty() {
        work.push(Work::Bytes(group));
    }
    let run = |item: Work| -> std::result::Result<Vec<_>, String> {
        match item {
            Work::Column(c, arrays) => {
                let (array, bound) = permute_column(arrays, order, &indices, look_up_above)?;
                Ok(vec![(c, array, bound)])
            }
            Work::Bytes(columns) => permute_bytes(columns, order),
        }
    };
    // A thread per share of at least `MIN_SHARE` values: fewer would not pay
    // for starting it.
    const MIN_SHARE: usize = 1 << 20;
    let workers = workers.min((order.len() * n / MIN_SHARE).max(1));
    let results =
        shardfeed_format::share::share_out(work, workers, "shardfeed-shuffle", &run, &|| ());
    let mut permuted: Vec<Option<(ArrayRef, Option<KeyBound>)>> = vec![None; n];
    for (c, array, bound) in results
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(err)?
        .into_iter()
        .flatten()
    {
        permuted[c] = Some((array, bound));
    }
    let (columns, bounds): (Vec<ArrayRef>, Vec<Option<KeyBound>>) = permuted
        .into_iter()
        .map(|c| c.ok_or_else(|| err("a column was not put in order".into())))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let fields: Vec<arrow_schema::Field> = schema
        .fields()
        .iter()
        .zip(&columns)
        .map(|(f, c)| f.as_ref().clone().with_data_type(c.data_type().clone()))
        .collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| err(e.to_string()))?;
    Ok((batch, bounds))
}

/// A piece of a window's permutation: one column, or up to
/// [`BYTE_GROUP`] dictionary columns whose keys fit one byte (their index,
/// arrays and how their dictionaries become one; see [`one_byte`]).
enum Work {
    Column(usize, Vec<ArrayRef>),
    Bytes(Vec<(usize, Vec<ArrayRef>, Option<Merged>)>),
}

/// Dictionary columns whose keys are one byte are gathered this many at a
/// time, each row's keys as one 4-byte value.
const BYTE_GROUP: usize = 4;

/// How a column's arrays (one per segment) become a dictionary with
/// one-byte keys: `Some(None)` when their dictionaries concatenated hold at
/// most [`MERGED_MAX`] values, `Some(merged)` when they merge into one of
/// that many (see [`deduplicated`]); `None` for plain columns, larger
/// dictionaries, and any whose values may be looked up instead (see
/// [`looked_up`]: `permute_column` decides those).
fn one_byte(arrays: &[ArrayRef], look_up_above: usize) -> Option<Option<Merged>> {
    let dictionaries: Vec<&dyn AnyDictionaryArray> = arrays
        .iter()
        .map(|a| a.as_any_dictionary_opt())
        .collect::<Option<_>>()?;
    let values: usize = dictionaries.iter().map(|d| d.values().len()).sum();
    if look_up_width(&dictionaries, values, look_up_above).is_some() {
        return None;
    }
    if values <= MERGED_MAX {
        Some(None)
    } else {
        deduplicated(&dictionaries).map(Some)
    }
}

/// Dictionary columns (see [`one_byte`]) in `order`, with one-byte keys,
/// gathered together: each row's keys packed into one value, so that a row
/// is one random read for up to four columns, not one for each (the
/// gathers of a window of 256 Ki rows cost about the same per read whatever
/// its width; scratch benchmark, 24 such columns: 10-11.5 ms a window
/// against 13-22 ms column by column, docs/performance-notes.md).
fn permute_bytes(
    columns: Vec<(usize, Vec<ArrayRef>, Option<Merged>)>,
    order: &[u32],
) -> std::result::Result<Vec<(usize, ArrayRef, Option<KeyBound>)>, String> {
    use arrow_array::types::UInt8Type;

    let mut windows = Vec::with_capacity(columns.len());
    for (c, arrays, merged) in columns {
        let dictionaries: Vec<&dyn AnyDictionaryArray> = arrays
            .iter()
            .map(|a| a.as_any_dictionary_opt().ok_or("a dictionary column"))
            .collect::<std::result::Result<_, _>>()?;
        windows.push((c, window_keys::<UInt8Type>(&dictionaries, merged)?));
    }
    let keys: Vec<&[u8]> = windows.iter().map(|(_, w)| &w.keys[..]).collect();
    let permuted = gather_bytes(&keys, order);
    Ok(windows
        .into_iter()
        .zip(permuted)
        .map(|((c, window), permuted)| {
            let (array, bound) = keyed::<UInt8Type>(window, permuted, order);
            (c, array, Some(bound))
        })
        .collect())
}

/// Each of `columns` (up to 4, as long as `order`) in `order`, gathered
/// together: packed into 4-byte values, gathered, unpacked.
fn gather_bytes(columns: &[&[u8]], order: &[u32]) -> Vec<Vec<u8>> {
    debug_assert!(columns.len() <= 4);
    if let [one] = columns {
        return vec![order.iter().map(|&g| one[g as usize]).collect()];
    }
    let mut packed = vec![0u32; order.len()];
    for (j, column) in columns.iter().enumerate() {
        let shift = 8 * j as u32;
        for (p, &k) in packed.iter_mut().zip(column.iter()) {
            *p |= (k as u32) << shift;
        }
    }
    // `order` is a permutation of the window's rows (the plan's; `permute`
    // checked its length, as long as each column), so every index is in
    // range; indexing checks it anyway.
    let gathered: Vec<u32> = order.iter().map(|&g| packed[g as usize]).collect();
    drop(packed);
    (0..columns.len())
        .map(|j| {
            let shift = 8 * j as u32;
            gathered.iter().map(|&p| (p >> shift) as u8).collect()
        })
        .collect()
}

/// A column (one array per batch of the window, consumed) that
/// [`one_byte`] leaves, in `order`, and its keys' bound if it stays a
/// dictionary (see [`permute`]); `indices` gives `order` as an array.
fn permute_column<'a>(
    arrays: Vec<ArrayRef>,
    order: &[u32],
    indices: &impl Fn() -> &'a arrow_array::UInt32Array,
    look_up_above: usize,
) -> std::result::Result<(ArrayRef, Option<KeyBound>), String> {
    use arrow_array::types::{Int32Type, UInt16Type};

    let dictionaries: Option<Vec<&dyn AnyDictionaryArray>> =
        arrays.iter().map(|a| a.as_any_dictionary_opt()).collect();
    if let Some(dictionaries) = dictionaries {
        let values: usize = dictionaries.iter().map(|d| d.values().len()).sum();
        if let Some(array) = looked_up(&dictionaries, order, values, look_up_above)? {
            return Ok((array, None));
        }
        // The narrowest keys that hold the window's dictionaries
        // concatenated (those that fit one byte are `permute_bytes`'s).
        let (array, bound) = if values <= 1 << 16 {
            permute_keys::<UInt16Type>(&dictionaries, order, None)?
        } else {
            permute_keys::<Int32Type>(&dictionaries, order, None)?
        };
        return Ok((array, Some(bound)));
    }
    let plain: Vec<ArrayRef> = arrays
        .into_iter()
        .map(|a| match a.as_any_dictionary_opt() {
            Some(d) => arrow_select::take::take(d.values(), d.keys(), None),
            None => Ok(a),
        })
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let all = {
        let refs: Vec<&dyn Array> = plain.iter().map(|a| a.as_ref()).collect();
        arrow_select::concat::concat(&refs).map_err(|e| e.to_string())?
    };
    // The decoded arrays go before the gather allocates the permuted copy.
    drop(plain);
    let array = arrow_select::take::take(&all, indices(), None).map_err(|e| e.to_string())?;
    Ok((array, None))
}

#[cfg(test)]
mod tests;
