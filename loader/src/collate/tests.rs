//! Tests of [`super`].

use std::sync::Arc;

use arrow_array::{ArrayRef, DictionaryArray};

use arrow_buffer::ArrowNativeType;
use arrow_schema::{DataType, Schema};

use crate::columns::plan_columns;
use crate::gather::permute;

use arrow_array::types::{Int32Type, UInt16Type};
use arrow_array::{Float64Array, Int32Array, Int64Array};
use arrow_schema::Field;

use super::*;

/// `i64` ids and `f64` values as a batch; `dictionary` stores both as
/// dictionaries whose values are in reverse order (keys reversed too).
/// `kind`: 0 plain, 1 dictionary with i32 keys, 2 with u16 keys.
fn batch(ids: &[i64], kind: u8) -> RecordBatch {
    let columns: Vec<ArrayRef> = if kind > 0 {
        let n = ids.len() as i32;
        let keys = Int32Array::from_iter_values((0..n).map(|i| n - 1 - i));
        let rev: Vec<i64> = ids.iter().rev().copied().collect();
        let id_values: ArrayRef = Arc::new(Int64Array::from(rev.clone()));
        let f_values: ArrayRef = Arc::new(Float64Array::from_iter_values(
            rev.iter().map(|&v| v as f64 * 0.5),
        ));
        if kind == 1 {
            vec![
                Arc::new(DictionaryArray::<Int32Type>::try_new(keys.clone(), id_values).unwrap()),
                Arc::new(DictionaryArray::<Int32Type>::try_new(keys, f_values).unwrap()),
            ]
        } else {
            let keys =
                arrow_array::UInt16Array::from_iter_values(keys.values().iter().map(|&k| k as u16));
            vec![
                Arc::new(DictionaryArray::<UInt16Type>::try_new(keys.clone(), id_values).unwrap()),
                Arc::new(DictionaryArray::<UInt16Type>::try_new(keys, f_values).unwrap()),
            ]
        }
    } else {
        vec![
            Arc::new(Int64Array::from(ids.to_vec())),
            Arc::new(Float64Array::from_iter_values(
                ids.iter().map(|&v| v as f64 * 0.5),
            )),
        ]
    };
    let fields: Vec<Field> = ["id", "f"]
        .iter()
        .zip(&columns)
        .map(|(n, c)| Field::new(*n, c.data_type().clone(), false))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// Collate every row of `sources` given by `rows` and read back the
/// `id` and `f` columns.
fn collate(sources: &[&RecordBatch], rows: &RowRefs) -> (Vec<i64>, Vec<f64>) {
    collate_bounded(sources, rows, &[])
}

/// [`collate`], with `key_bounds` given for every source (as the
/// collator gives a permuted window's).
fn collate_bounded(
    sources: &[&RecordBatch],
    rows: &RowRefs,
    key_bounds: &[Option<KeyBound>],
) -> (Vec<i64>, Vec<f64>) {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("f", DataType::Float64, false),
    ]);
    let plans = plan_columns(&schema, &["id".into(), "f".into()], None).unwrap();
    let made: Vec<Vec<SourceColumn>> = sources
        .iter()
        .map(|b| source_columns(&plans, b, key_bounds))
        .collect();
    let collation = Collation::from_sources(
        &plans,
        ListMode::Ragged,
        None,
        made.iter().map(Vec::as_slice),
    );
    let (columns, bytes) = collation.layout(rows);
    // u64 storage keeps the slab 8-byte aligned, like real slabs.
    let mut storage = vec![0u64; bytes.div_ceil(8)];
    // SAFETY: plain integers reinterpreted as bytes.
    let slab = unsafe { storage.align_to_mut::<u8>().1 };
    collation.write(rows, &columns, slab).unwrap();
    let read = |c: usize| -> Vec<u8> {
        let ColumnLayout::Dense { values } = &columns[c].layout else {
            panic!("dense")
        };
        slab[values.offset..values.offset + values.bytes()].to_vec()
    };
    let ids = read(0)
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let fs = read(1)
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (ids, fs)
}

/// Fixed-width columns shared out among threads (nullable, bool, fixed
/// lists, dictionaries, plain values, scattered and in runs) give the
/// same slab bytes as one thread writing them, and leave the other
/// columns' bytes to the serial loop.
#[test]
fn fixed_columns_written_on_several_threads_match_one_thread() {
    use arrow_array::{BooleanArray, FixedSizeListArray, StringArray};
    let n = 30_000usize;
    let part = |from: usize| -> RecordBatch {
        let ids = (from..from + n).map(|i| i as i64);
        let dict = Arc::new(Int64Array::from_iter_values(0..100));
        let keys: Vec<u16> = (from..from + n).map(|i| (i % 100) as u16).collect();
        let nullable: Int32Array = (from..from + n)
            .map(|i| (i % 7 != 0).then_some(i as i32))
            .collect();
        let flags = BooleanArray::from_iter((from..from + n).map(|i| Some(i % 3 == 0)));
        let pairs = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            2,
            Arc::new(arrow_array::Float32Array::from_iter_values(
                (from..from + n).flat_map(|i| [i as f32, -(i as f32)]),
            )),
            None,
        );
        let names = StringArray::from_iter_values((from..from + n).map(|i| format!("r{i}")));
        RecordBatch::try_from_iter_with_nullable([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(ids)) as ArrayRef,
                false,
            ),
            (
                "cat",
                Arc::new(DictionaryArray::<UInt16Type>::try_new(keys.into(), dict).unwrap()),
                false,
            ),
            ("maybe", Arc::new(nullable), true),
            ("flag", Arc::new(flags), false),
            ("pair", Arc::new(pairs), false),
            ("name", Arc::new(names), false),
        ])
        .unwrap()
    };
    let sources = [part(0), part(n)];
    let refs: Vec<&RecordBatch> = sources.iter().collect();
    let schema = Schema::new(
        sources[0]
            .schema()
            .fields()
            .iter()
            .map(|f| {
                let t = match f.data_type() {
                    DataType::Dictionary(_, v) => v.as_ref().clone(),
                    t => t.clone(),
                };
                f.as_ref().clone().with_data_type(t)
            })
            .collect::<Vec<_>>(),
    );
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let plans = plan_columns(&schema, &names, None).unwrap();
    let scattered: Vec<(u32, u32)> = (0..2 * n as u32)
        .map(|i| {
            let g = (i as u64 * 7919 % (2 * n) as u64) as u32;
            ((g / n as u32), g % n as u32)
        })
        .collect();
    let in_runs: Vec<(u32, u32)> = (100..n as u32)
        .map(|r| (0, r))
        .chain((0..n as u32 / 2).map(|r| (1, r)))
        .collect();
    for rows in [scattered, in_runs] {
        let write = |workers: usize| -> Vec<u8> {
            let collation =
                Collation::new(&plans, ListMode::Ragged, None, &refs).with_workers(workers);
            let (columns, bytes) = collation.layout(&rows);
            let mut storage = vec![0xabu64; bytes.div_ceil(8)];
            // SAFETY: plain integers reinterpreted as bytes.
            let slab = unsafe { storage.align_to_mut::<u8>().1 };
            collation.write(&rows, &columns, slab).unwrap();
            slab.to_vec()
        };
        let one = write(1);
        assert_eq!(write(3), one);
        // The values are the rows' (spot check: id and the nullable column).
        let collation = Collation::new(&plans, ListMode::Ragged, None, &refs);
        let (columns, _) = collation.layout(&rows);
        let ColumnLayout::Dense { values } = &columns[0].layout else {
            panic!("dense")
        };
        let (s, r) = rows[5];
        let id = i64::from_le_bytes(
            one[values.offset + 40..values.offset + 48]
                .try_into()
                .unwrap(),
        );
        assert_eq!(id, (s as usize * n + r as usize) as i64);
        let validity = columns[2].validity.as_ref().unwrap();
        let valid = one[validity.offset + 5];
        assert_eq!(valid == 1, !(s as usize * n + r as usize).is_multiple_of(7));
    }
}

#[test]
fn dictionary_and_plain_sources_collate_and_permute_to_the_same_values() {
    let parts = [
        (0..40).collect::<Vec<i64>>(),
        (40..70).collect(),
        (70..100).collect(),
    ];
    // Mixed: dictionary, plain, dictionary; all dictionaries (i32 keys,
    // u16 keys, both); all plain.
    for kinds in [[1, 0, 2], [1, 1, 1], [2, 2, 2], [2, 1, 2], [0, 0, 0]] {
        let batches: Vec<RecordBatch> = parts
            .iter()
            .zip(kinds)
            .map(|(ids, d)| batch(ids, d))
            .collect();
        let order: Vec<u32> = (0..100u32).map(|i| (i * 37 + 11) % 100).collect();
        let expected_ids: Vec<i64> = order.iter().map(|&o| o as i64).collect();
        let expected_fs: Vec<f64> = expected_ids.iter().map(|&v| v as f64 * 0.5).collect();

        // Gathered straight from the three sources.
        let refs: Vec<&RecordBatch> = batches.iter().collect();
        let rows: Vec<(u32, u32)> = order
            .iter()
            .map(|&o| match o {
                0..40 => (0, o),
                40..70 => (1, o - 40),
                _ => (2, o - 70),
            })
            .collect();
        assert_eq!(
            collate(&refs, &rows),
            (expected_ids.clone(), expected_fs.clone())
        );

        // Permuted into one batch first (the shuffle stage), then collated.
        let (permuted, bounds) =
            permute(batches.to_vec(), &order, 0, 1, crate::gather::LOOK_UP_ABOVE).unwrap();
        let all_dictionary = kinds.iter().all(|&k| k > 0);
        assert_eq!(
            matches!(permuted.column(0).data_type(), DataType::Dictionary(..)),
            all_dictionary
        );
        assert_eq!(bounds.iter().all(Option::is_some), all_dictionary);
        let rows: Vec<(u32, u32)> = (0..100).map(|i| (0, i)).collect();
        let expected = (expected_ids, expected_fs);
        assert_eq!(collate(&[&permuted], &rows), expected);
        // With the shuffle stage's key bounds (the largest key not
        // searched for), and with a bound past the dictionary (not
        // used): the same values.
        assert_eq!(collate_bounded(&[&permuted], &rows, &bounds), expected);
        let past = [
            Some(KeyBound::assumed(usize::MAX >> 1)),
            Some(KeyBound::assumed(100)),
        ];
        assert_eq!(collate_bounded(&[&permuted], &rows, &past), expected);

        // Runs of consecutive rows across sources (a batch crossing
        // window boundaries): swept run by run, as row by row.
        let runs: Vec<(u32, u32)> = (35..40)
            .map(|r| (0, r))
            .chain((0..30).map(|r| (1, r)))
            .chain((0..3).map(|r| (2, r)))
            .collect();
        assert_eq!(runs_of(&runs).map(|r| r.len()), Some(3));
        let expected_ids: Vec<i64> = (35..73).collect();
        let expected_fs: Vec<f64> = expected_ids.iter().map(|&v| v as f64 * 0.5).collect();
        assert_eq!(collate(&refs, &runs), (expected_ids, expected_fs));
    }
}

#[test]
fn runs_are_consecutive_rows_of_one_source_and_at_most_four() {
    let run = |at, source, first, len| Run {
        at,
        source,
        first,
        len,
    };
    assert_eq!(
        runs_of(&[(0, 5), (0, 6), (0, 7)]),
        Some(vec![run(0, 0, 5, 3)])
    );
    assert_eq!(
        runs_of(&[(0, 5), (0, 7), (1, 8), (1, 9)]),
        Some(vec![run(0, 0, 5, 1), run(1, 0, 7, 1), run(2, 1, 8, 2)])
    );
    assert_eq!(runs_of(&[(0, 4), (0, 3), (0, 2), (0, 1), (0, 0)]), None);
    assert_eq!(runs_of(&[]), Some(vec![]));
}

/// Dictionary columns with null rows (key 0 there, as decoded) keep
/// their nulls through the shuffle stage and collate to a validity mask
/// with zeros in null rows.
#[test]
fn dictionary_nulls_survive_permutation_and_collation() {
    let part = |ids: std::ops::Range<i64>| -> RecordBatch {
        let n = ids.end - ids.start;
        let valid = arrow_buffer::NullBuffer::from_iter(ids.clone().map(|i| i % 3 != 0));
        let keys: Vec<u16> = ids
            .clone()
            .map(|i| {
                if i % 3 != 0 {
                    (i - ids.start) as u16
                } else {
                    0
                }
            })
            .collect();
        let keys = arrow_array::UInt16Array::new(keys.into(), Some(valid));
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(ids.clone()));
        assert_eq!(values.len() as i64, n);
        let array: ArrayRef =
            Arc::new(DictionaryArray::<UInt16Type>::try_new(keys, values).unwrap());
        RecordBatch::try_from_iter_with_nullable([("id", array, true)]).unwrap()
    };
    let batches = [part(0..40), part(40..100)];
    let order: Vec<u32> = (0..100u32).map(|i| (i * 37 + 11) % 100).collect();
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
    let plans = plan_columns(&schema, &["id".into()], None).unwrap();
    let read = |sources: &[&RecordBatch], rows: &[(u32, u32)]| -> (Vec<i64>, Vec<u8>) {
        let collation = Collation::new(&plans, ListMode::Ragged, None, sources);
        let (columns, bytes) = collation.layout(rows);
        let mut storage = vec![0xffu64; bytes.div_ceil(8)];
        // SAFETY: plain integers reinterpreted as bytes.
        let slab = unsafe { storage.align_to_mut::<u8>().1 };
        collation.write(rows, &columns, slab).unwrap();
        let ColumnLayout::Dense { values } = &columns[0].layout else {
            panic!("dense")
        };
        let validity = columns[0].validity.as_ref().unwrap();
        (
            slab[values.offset..values.offset + values.bytes()]
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            slab[validity.offset..validity.offset + rows.len()].to_vec(),
        )
    };
    let expected: (Vec<i64>, Vec<u8>) = (
        order
            .iter()
            .map(|&o| if o % 3 != 0 { o as i64 } else { 0 })
            .collect(),
        order.iter().map(|&o| (o % 3 != 0) as u8).collect(),
    );
    let rows: Vec<(u32, u32)> = order
        .iter()
        .map(|&o| if o < 40 { (0, o) } else { (1, o - 40) })
        .collect();
    assert_eq!(read(&[&batches[0], &batches[1]], &rows), expected);
    let (permuted, _) =
        permute(batches.to_vec(), &order, 0, 1, crate::gather::LOOK_UP_ABOVE).unwrap();
    let rows: Vec<(u32, u32)> = (0..100).map(|i| (0, i)).collect();
    assert_eq!(read(&[&permuted], &rows), expected);
}

/// Dictionary lookups into a slab give `values[key]` for every key, at
/// any alignment of the output and any length, for 4- and 8-byte values
/// and both key types (the 32-byte streamed stores included), and touch
/// nothing around the output.
#[test]
fn lookups_write_every_value_at_any_alignment() {
    fn check<T: Copy + PartialEq + std::fmt::Debug + Default, K: ArrowNativeType>(
        values: &[T],
        keys: &[K],
    ) {
        let bytes = std::mem::size_of::<T>();
        // SAFETY: plain integers viewed as bytes.
        let raw = unsafe {
            std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
        };
        let max = keys.iter().map(|k| k.as_usize()).max();
        for len in [0, 1, 3, 7, 8, 9, 31, 64, 100] {
            for shift in 0..9 {
                let mut out = vec![T::default(); len + 20];
                // SAFETY: as above; `max` is the largest of these keys.
                let done = unsafe {
                    let o = std::slice::from_raw_parts_mut(
                        out.as_mut_ptr().add(shift) as *mut u8,
                        len * bytes,
                    );
                    lookup::<T, K>(&keys[..len], max, raw, o).unwrap()
                };
                fence_streamed();
                assert!(done);
                for i in 0..len {
                    assert_eq!(out[shift + i], values[keys[i].as_usize()], "len {len}");
                }
                assert!(out[..shift].iter().all(|v| *v == T::default()));
                assert!(out[shift + len..].iter().all(|v| *v == T::default()));
            }
        }
    }
    let keys16: Vec<u16> = (0..100u16).map(|i| (i * 37 + 5) % 50).collect();
    let keys32: Vec<i32> = keys16.iter().map(|&k| k as i32).collect();
    let v32: Vec<u32> = (0..50u32).map(|i| i.wrapping_mul(2654435761) | 1).collect();
    let v64: Vec<u64> = (0..50u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        .collect();
    check(&v32, &keys16);
    check(&v32, &keys32);
    check(&v64, &keys16);
    check(&v64, &keys32);
}

#[test]
fn stream_copy_copies_every_byte_at_any_alignment() {
    let src: Vec<u8> = (0..5000u32).map(|i| (i * 31 % 251) as u8).collect();
    for len in [0, 1, 15, 255, 256, 257, 1000, 4096, 4099] {
        for dst_shift in 0..17 {
            for src_shift in [0, 1, 7] {
                let mut dst = vec![0xeeu8; len + 40];
                let from = &src[src_shift..src_shift + len];
                stream_copy(&mut dst[dst_shift..dst_shift + len], from);
                assert_eq!(&dst[dst_shift..dst_shift + len], from, "len {len}");
                assert!(dst[..dst_shift].iter().all(|&b| b == 0xee));
                assert!(dst[dst_shift + len..].iter().all(|&b| b == 0xee));
            }
        }
    }
}

#[test]
fn view_sources_collate_like_offset_sources() {
    use arrow_array::{StringArray, StringViewArray};
    let words: Vec<String> = (0..50)
        .map(|i| format!("{i}{}", "-long-".repeat(i % 5)))
        .collect();
    let schema = Schema::new(vec![Field::new("w", DataType::Utf8, false)]);
    let plans = plan_columns(&schema, &["w".into()], None).unwrap();
    let rows: Vec<(u32, u32)> = (0..50u32).map(|i| (i % 2, (i * 7) % 50)).collect();
    let read = |sources: &[&RecordBatch]| -> Vec<String> {
        let collation = Collation::new(&plans, ListMode::Ragged, None, sources);
        collated_bytes(&collation, &rows)
            .into_iter()
            .map(|v| String::from_utf8(v).unwrap())
            .collect()
    };
    let batch_of =
        |array: ArrayRef| RecordBatch::try_from_iter_with_nullable([("w", array, false)]).unwrap();
    let views = batch_of(Arc::new(StringViewArray::from_iter_values(&words)));
    let plain = batch_of(Arc::new(StringArray::from(words.clone())));
    let expected: Vec<String> = rows
        .iter()
        .map(|(_, r)| words[*r as usize].clone())
        .collect();
    assert_eq!(read(&[&views, &plain]), expected);
    assert_eq!(read(&[&plain, &views]), expected);
}

/// The key check of a slab write: the largest key (a negative i32 one
/// counting as larger than any valid key) decides, and a key outside the
/// dictionary is an error, never a read past it. (Forged arrays cannot be
/// built here: arrow's `force_validate` refuses them.)
#[test]
fn keys_outside_their_dictionary_are_refused_when_gathered() {
    let values: Vec<u64> = vec![10, 11, 12];
    // SAFETY (test): u64 is plain bytes.
    let values = unsafe { values.as_slice().align_to::<u8>().1 };
    let mut out = vec![0u64; 3];
    let mut gather = |keys: KeySlice| {
        let max = keys.max_index(0..3);
        // SAFETY: `max` comes from `max_index` of the same keys.
        let bytes = unsafe { out.as_mut_slice().align_to_mut::<u8>().1 };
        match keys {
            KeySlice::U8(k) => unsafe { lookup_width(8, k, max, values, bytes) },
            KeySlice::U16(k) => unsafe { lookup_width(8, k, max, values, bytes) },
            KeySlice::I32(k) => unsafe { lookup_width(8, k, max, values, bytes) },
        }
    };
    for keys in [
        KeySlice::U8(&[3, 1, 0]),
        KeySlice::U16(&[0, 1, 7]),
        KeySlice::I32(&[0, -1, 2]),
    ] {
        let err = gather(keys).unwrap_err();
        assert!(err.contains("outside its dictionary"), "{err}");
    }
    assert_eq!(gather(KeySlice::U8(&[1, 2, 0])), Ok(true));
    assert_eq!(gather(KeySlice::U16(&[2, 1, 0])), Ok(true));
    assert_eq!(out, vec![12, 11, 10]);
    assert_eq!(
        KeySlice::I32(&[0, -1]).max_index(0..2),
        Some(u32::MAX as usize)
    );
    assert_eq!(KeySlice::U16(&[]).max_index(0..0), None);
}

/// The largest key of a range, whichever width and however the vector loop
/// (AVX2 where the CPU has it) cuts the range: a key's maximum anywhere in
/// it, negative `i32` keys the largest.
#[test]
fn max_index_finds_the_largest_key_anywhere_in_the_range() {
    for len in 0..80usize {
        for at in 0..len {
            for start in [0, at.min(3), at] {
                let u8s: Vec<u8> = (0..len)
                    .map(|i| if i == at { 200 } else { (i % 7) as u8 })
                    .collect();
                let u16s: Vec<u16> = (0..len)
                    .map(|i| if i == at { 60_000 } else { (i % 9) as u16 })
                    .collect();
                let i32s: Vec<i32> = (0..len)
                    .map(|i| if i == at { -2 } else { (i % 11) as i32 })
                    .collect();
                assert_eq!(
                    KeySlice::U8(&u8s).max_index(start..len),
                    Some(200),
                    "{len} {at}"
                );
                assert_eq!(KeySlice::U16(&u16s).max_index(start..len), Some(60_000));
                assert_eq!(
                    KeySlice::I32(&i32s).max_index(start..len),
                    Some((-2i32) as u32 as usize)
                );
            }
        }
    }
}

#[test]
fn large_binary_columns_copied_by_several_threads_land_whole_and_in_order() {
    use arrow_array::BinaryArray;
    // Values of 0 to ~300 KiB: several MiB per batch, so the copy is shared.
    let values: Vec<Vec<u8>> = (0..40u32)
        .map(|i| (0..(i * 7919 % 300_000)).map(|b| (b ^ i) as u8).collect())
        .collect();
    let schema = Schema::new(vec![Field::new("b", DataType::Binary, false)]);
    let plans = plan_columns(&schema, &["b".into()], None).unwrap();
    let batch = RecordBatch::try_from_iter_with_nullable([(
        "b",
        Arc::new(BinaryArray::from_iter_values(&values)) as ArrayRef,
        false,
    )])
    .unwrap();
    let rows: Vec<(u32, u32)> = (0..40u32).map(|i| (0, (i * 13) % 40)).collect();
    for workers in [1, 2, 3, 8] {
        let collation =
            Collation::new(&plans, ListMode::Ragged, None, &[&batch]).with_copy_workers(workers);
        for (i, got) in collated_bytes(&collation, &rows).iter().enumerate() {
            let want = &values[rows[i].1 as usize];
            assert!(got == want, "row {i}, {workers} workers");
        }
    }
}

/// `rows` collated into a slab: each row's bytes of the (binary) first column.
fn collated_bytes(collation: &Collation<'_>, rows: &[(u32, u32)]) -> Vec<Vec<u8>> {
    let (columns, bytes) = collation.layout(rows);
    let mut storage = vec![0u64; bytes.div_ceil(8)];
    // SAFETY: plain integers reinterpreted as bytes.
    let slab = unsafe { storage.align_to_mut::<u8>().1 };
    collation.write(rows, &columns, slab).unwrap();
    let ColumnLayout::Bytes {
        values, offsets, ..
    } = &columns[0].layout
    else {
        panic!("bytes")
    };
    let offs: Vec<usize> = slab[offsets.offset..offsets.offset + offsets.bytes()]
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as usize)
        .collect();
    offs.windows(2)
        .map(|w| slab[values.offset + w[0]..values.offset + w[1]].to_vec())
        .collect()
}
