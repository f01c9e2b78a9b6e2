//! Tests of [`super`].

use super::*;
use arrow_array::Int64Array;
use arrow_array::types::{Int32Type, UInt16Type};

/// A window of two batches holding `values` as dictionaries (each half
/// its own dictionary of `distinct` values): permuting keys gives the
/// values in order, with i32 keys once the concatenation passes 2^16.
#[test]
fn permuted_dictionaries_keep_their_values_and_widen_keys() {
    for distinct in [70_000i64, 1000] {
        let rows = 140_000usize;
        let values: Vec<i64> = (0..rows as i64).map(|i| (i * 7919) % distinct).collect();
        let half = |range: std::ops::Range<usize>| -> RecordBatch {
            let dict = Int64Array::from_iter_values(0..distinct);
            let keys: Vec<i32> = values[range].iter().map(|&v| v as i32).collect();
            let array: ArrayRef = if distinct <= 1 << 16 {
                let keys: Vec<u16> = keys.iter().map(|&k| k as u16).collect();
                Arc::new(
                    DictionaryArray::<UInt16Type>::try_new(keys.into(), Arc::new(dict)).unwrap(),
                )
            } else {
                Arc::new(
                    DictionaryArray::<Int32Type>::try_new(keys.into(), Arc::new(dict)).unwrap(),
                )
            };
            RecordBatch::try_from_iter([("v", array)]).unwrap()
        };
        let order: Vec<u32> = (0..rows as u32)
            .map(|i| (i * 7 + 3) % rows as u32)
            .collect();
        let (permuted, bounds) = permute(
            vec![half(0..rows / 2), half(rows / 2..rows)],
            &order,
            0,
            2,
            usize::MAX,
        )
        .unwrap();
        let column = permuted.column(0);
        // Two dictionaries of `distinct` values each: no key above the
        // last value of the second.
        assert_eq!(bounds, [Some(KeyBound(2 * distinct as usize - 1))]);
        let expected_key = if 2 * distinct > 1 << 16 {
            DataType::Int32
        } else {
            DataType::UInt16
        };
        assert_eq!(
            column.data_type(),
            &DataType::Dictionary(Box::new(expected_key), Box::new(DataType::Int64))
        );
        let d = column.as_any_dictionary();
        let plain = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
        let plain = plain.as_primitive::<arrow_array::types::Int64Type>();
        for (i, &o) in order.iter().enumerate() {
            assert_eq!(plain.value(i), values[o as usize]);
        }
    }
}

/// A window's dictionaries that hold few distinct values between them
/// become one dictionary of those values with one-byte keys (1-, 4- and
/// 8-byte values, a time zone kept): the same dictionary in every
/// segment (as `shard` writes them) is kept as it is; others (the same
/// values in another order, an empty one whose slots are all null) are
/// merged. Once they hold more than 256 distinct values, the keys stay
/// two bytes wide. Either way the looked-up values are the window's, in
/// order, nulls kept.
#[test]
fn few_distinct_values_merge_into_one_byte_keys() {
    use arrow_array::{Float32Array, Int8Array, TimestampMillisecondArray};
    // Segment `s` of `rows` rows: dictionaries of the values `ids` (as
    // f32, i8 and UTC timestamps), every 13th row null (its key past
    // the dictionary on one row: never looked up).
    let segment = |ids: &[i64], rows: usize, s: usize| -> RecordBatch {
        let n = ids.len();
        let keys: Vec<u16> = (0..rows)
            .map(|i| match n {
                0 => 0,
                _ if i == 13 => n as u16 + 5,
                _ => ((i * 31 + s * 7) % n) as u16,
            })
            .collect();
        let valid: Vec<bool> = (0..rows).map(|i| n > 0 && i % 13 != 0).collect();
        let keys = arrow_array::UInt16Array::new(keys.into(), Some(valid.into()));
        let columns: [(&str, ArrayRef); 3] = [
            (
                "f32",
                Arc::new(Float32Array::from_iter_values(
                    ids.iter().map(|&v| v as f32 * 0.25),
                )),
            ),
            (
                "i8",
                Arc::new(Int8Array::from_iter_values(ids.iter().map(|&v| v as i8))),
            ),
            (
                "ts",
                Arc::new(
                    TimestampMillisecondArray::from_iter_values(ids.iter().copied())
                        .with_timezone("UTC"),
                ),
            ),
        ];
        RecordBatch::try_from_iter(columns.map(|(name, values)| {
            // SAFETY (test): every key past its dictionary is a null slot's.
            let d = unsafe { DictionaryArray::<UInt16Type>::new_unchecked(keys.clone(), values) };
            (name, Arc::new(d) as ArrayRef)
        }))
        .unwrap()
    };
    let forward: Vec<i64> = (0..100).collect();
    let backward: Vec<i64> = (0..100).rev().collect();
    let scattered: Vec<i64> = (0..100).map(|i| i * 37 % 100).collect();
    let disjoint: Vec<i64> = (100..220).collect();
    let mut two_byte_keys = 0;
    for (segments, kept) in [
        // One dictionary, in every segment: kept.
        (
            vec![
                segment(&forward, 1000, 0),
                segment(&forward, 700, 1),
                segment(&forward, 500, 3),
            ],
            true,
        ),
        (
            vec![
                segment(&forward, 1000, 0),
                segment(&backward, 700, 1),
                segment(&[], 40, 2),
                segment(&scattered, 500, 3),
            ],
            false,
        ),
        // 220 distinct values.
        (
            vec![
                segment(&forward, 1000, 0),
                segment(&disjoint, 700, 1),
                segment(&backward, 500, 2),
                segment(&(100..137).collect::<Vec<_>>(), 300, 3),
            ],
            false,
        ),
        // 257 (f32, timestamps: not merged), 256 (i8: `v as i8` wraps).
        (
            vec![
                segment(&forward, 1000, 0),
                segment(&disjoint, 700, 1),
                segment(&(220..257).collect::<Vec<_>>(), 300, 2),
            ],
            false,
        ),
    ] {
        let rows: usize = segments.iter().map(|b| b.num_rows()).sum();
        let order: Vec<u32> = (0..rows as u32)
            .map(|i| (i as u64 * 7919 % rows as u64) as u32)
            .collect();
        let (permuted, bounds) = permute(segments.clone(), &order, 0, 1, usize::MAX).unwrap();
        let indices = arrow_array::UInt32Array::from(order.clone());
        for (c, bound) in bounds.iter().enumerate() {
            // The column's distinct values, bit for bit.
            let dictionaries: Vec<ArrayRef> = segments
                .iter()
                .map(|b| b.column(c).as_any_dictionary().values().clone())
                .collect();
            let value_type = dictionaries[0].data_type();
            let width = value_type.primitive_width().unwrap();
            let distinct: std::collections::HashSet<Vec<u8>> = dictionaries
                .iter()
                .flat_map(|v| {
                    let data = v.to_data();
                    data.buffers()[0].as_slice()[..data.len() * width]
                        .chunks(width)
                        .map(|b| b.to_vec())
                        .collect::<Vec<_>>()
                })
                .collect();
            let column = permuted.column(c);
            let DataType::Dictionary(k, v) = column.data_type() else {
                panic!("column {c} is a dictionary");
            };
            assert_eq!(v.as_ref(), value_type);
            let d = column.as_any_dictionary();
            if distinct.len() <= 256 {
                assert_eq!(k.as_ref(), &DataType::UInt8);
                assert_eq!(d.values().len(), distinct.len());
                assert_eq!(*bound, Some(KeyBound(distinct.len() - 1)));
                if kept {
                    assert_eq!(d.values(), &dictionaries[0]);
                }
            } else {
                assert_eq!(k.as_ref(), &DataType::UInt16);
                assert_eq!(*bound, Some(KeyBound(d.values().len() - 1)));
                two_byte_keys += 1;
            }
            let got = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
            let plain: Vec<ArrayRef> = segments
                .iter()
                .map(|b| {
                    let d = b.column(c).as_any_dictionary();
                    arrow_select::take::take(d.values(), d.keys(), None).unwrap()
                })
                .collect();
            let plain: Vec<&dyn Array> = plain.iter().map(|a| a.as_ref()).collect();
            let all = arrow_select::concat::concat(&plain).unwrap();
            let expected = arrow_select::take::take(&all, &indices, None).unwrap();
            assert_eq!(got.as_ref(), expected.as_ref(), "column {c}");
            assert!(got.null_count() > rows / 13);
        }
    }
    assert_eq!(two_byte_keys, 2);
}

/// One-byte-key columns are gathered four at a time, whatever columns
/// come between them (plain ones, larger dictionaries): ten such
/// columns (two groups of four, one of two), each with its own values
/// and nulls, come out as each column's own values in order, with one
/// or several threads.
#[test]
fn one_byte_key_columns_are_gathered_four_at_a_time() {
    let segment = |range: std::ops::Range<usize>| -> RecordBatch {
        let columns: Vec<(String, ArrayRef)> = (0..12usize)
            .map(|c| {
                let values = range.clone().map(move |i| (i * (c + 3) + c) % 90);
                let array: ArrayRef = match c {
                    // Plain, and a dictionary of 5,000 values (two-byte keys).
                    4 => Arc::new(Int64Array::from_iter_values(values.map(|v| v as i64))),
                    7 => {
                        let dict = Arc::new(Int64Array::from_iter_values(0..5000));
                        let keys: Vec<u16> = range.clone().map(|i| (i % 5000) as u16).collect();
                        Arc::new(DictionaryArray::<UInt16Type>::try_new(keys.into(), dict).unwrap())
                    }
                    _ => {
                        // Column c's 90 values; every (c + 5)th row null.
                        let dict = Arc::new(Int64Array::from_iter_values(
                            (0..90).map(|v| v * 100 + c as i64),
                        ));
                        let keys = arrow_array::UInt16Array::from_iter(
                            range
                                .clone()
                                .zip(values)
                                .map(|(i, v)| (i % (c + 5) != 0).then_some(v as u16)),
                        );
                        Arc::new(DictionaryArray::<UInt16Type>::try_new(keys, dict).unwrap())
                    }
                };
                (format!("c{c}"), array)
            })
            .collect();
        RecordBatch::try_from_iter(columns).unwrap()
    };
    let rows = 20_000usize;
    let segments = vec![segment(0..9000), segment(9000..9001), segment(9001..rows)];
    let order: Vec<u32> = (0..rows as u64)
        .map(|i| (i * 7919 % rows as u64) as u32)
        .collect();
    let (one, bounds) = permute(segments.clone(), &order, 0, 1, LOOK_UP_ABOVE).unwrap();
    let indices = arrow_array::UInt32Array::from(order.clone());
    let mut one_byte = 0;
    for (c, bound) in bounds.iter().enumerate() {
        let column = one.column(c);
        let got = match column.as_any_dictionary_opt() {
            Some(d) => {
                if matches!(d.keys().data_type(), DataType::UInt8) {
                    one_byte += 1;
                    // Three dictionaries of the same 90 values: merged.
                    assert_eq!(d.values().len(), 90);
                    assert_eq!(*bound, Some(KeyBound(89)));
                }
                arrow_select::take::take(d.values(), d.keys(), None).unwrap()
            }
            None => column.clone(),
        };
        let plain: Vec<ArrayRef> = segments
            .iter()
            .map(|b| match b.column(c).as_any_dictionary_opt() {
                Some(d) => arrow_select::take::take(d.values(), d.keys(), None).unwrap(),
                None => b.column(c).clone(),
            })
            .collect();
        let plain: Vec<&dyn Array> = plain.iter().map(|a| a.as_ref()).collect();
        let all = arrow_select::concat::concat(&plain).unwrap();
        let expected = arrow_select::take::take(&all, &indices, None).unwrap();
        assert_eq!(got.as_ref(), expected.as_ref(), "column {c}");
    }
    assert_eq!(one_byte, 10);
    for workers in [2, 3] {
        assert_eq!(
            permute(segments.clone(), &order, 0, workers, LOOK_UP_ABOVE).unwrap(),
            (one.clone(), bounds.clone())
        );
    }
}

/// Columns shared out among threads come out as one thread makes them,
/// for dictionary and plain columns alike.
#[test]
fn columns_permuted_on_several_threads_match_one_thread() {
    let rows = 300_000usize;
    let half = |range: std::ops::Range<usize>| -> RecordBatch {
        let columns: Vec<(String, ArrayRef)> = (0..7)
            .map(|c| {
                let values = range.clone().map(|i| (i * (c + 3)) as i64 % 5000);
                let array: ArrayRef = if c % 2 == 0 {
                    let dict = Arc::new(Int64Array::from_iter_values(0..5000));
                    let keys: Vec<u16> = values.map(|v| v as u16).collect();
                    Arc::new(DictionaryArray::<UInt16Type>::try_new(keys.into(), dict).unwrap())
                } else {
                    Arc::new(Int64Array::from_iter_values(values))
                };
                (format!("c{c}"), array)
            })
            .collect();
        RecordBatch::try_from_iter(columns).unwrap()
    };
    let batches = [half(0..rows / 3), half(rows / 3..rows)];
    let order: Vec<u32> = (0..rows as u32)
        .map(|i| (i as u64 * 7919 % rows as u64) as u32)
        .collect();
    let one = permute(batches.to_vec(), &order, 0, 1, LOOK_UP_ABOVE).unwrap();
    for workers in [2, 3] {
        assert_eq!(
            permute(batches.to_vec(), &order, 0, workers, LOOK_UP_ABOVE).unwrap(),
            one
        );
    }
    let c1 = one
        .0
        .column(1)
        .as_primitive::<arrow_array::types::Int64Type>();
    assert_eq!(c1.value(5), (order[5] as i64 * 4) % 5000);
}

/// A key outside its dictionary (a forged array built unchecked) is an
/// error naming the window, not a dictionary whose lookups read past it.
#[test]
fn keys_outside_their_dictionary_are_refused() {
    let dict = Arc::new(Int64Array::from_iter_values(0..3));
    // SAFETY (test): deliberately invalid, to check permute's own check;
    // the array is only read by `permute`, which checks keys first.
    let forged =
        unsafe { DictionaryArray::<UInt16Type>::new_unchecked(vec![0u16, 1, 7].into(), dict) };
    let batch = RecordBatch::try_from_iter([("v", Arc::new(forged) as ArrayRef)]).unwrap();
    // Keys permuted, or values looked up: refused either way.
    for above in [usize::MAX, 0] {
        let err = permute(vec![batch.clone()], &[2, 1, 0], 4, 1, above)
            .unwrap_err()
            .to_string();
        assert!(err.contains("window 4") && err.contains("key 7"), "{err}");
    }
    // A null slot's key is never looked up: out of range, it is no error.
    let keys = arrow_array::UInt16Array::new(
        vec![0u16, 9, 2].into(),
        Some(arrow_buffer::NullBuffer::from(vec![true, false, true])),
    );
    // SAFETY (test): the one key past the dictionary is a null slot's.
    let nullable = unsafe {
        DictionaryArray::<UInt16Type>::new_unchecked(
            keys,
            Arc::new(Int64Array::from_iter_values(0..3)),
        )
    };
    let batch = RecordBatch::try_from_iter([("v", Arc::new(nullable) as ArrayRef)]).unwrap();
    let (looked_up, bounds) = permute(vec![batch], &[2, 1, 0], 4, 1, 0).unwrap();
    assert_eq!(bounds, [None]);
    assert_eq!(
        looked_up.column(0).as_ref(),
        &Int64Array::from(vec![Some(2), None, Some(0)]) as &dyn Array
    );
}

/// Dictionaries whose values reach the bound come out as plain arrays of
/// their value type (4- and 8-byte primitives, a timestamp with its time
/// zone included), equal to the permuted keys looked up, nulls kept;
/// 2-byte values, and dictionaries below the bound, stay keys.
#[test]
fn large_dictionaries_are_looked_up_into_plain_values() {
    use arrow_array::{Float32Array, Int16Array, Int32Array, TimestampMillisecondArray};
    let segment = |range: std::ops::Range<usize>, wide: bool| -> RecordBatch {
        let keys: Vec<Option<usize>> = range
            .clone()
            .map(|i| (i % 11 != 0).then_some(i * 31 % 3000))
            .collect();
        let array = |values: ArrayRef| -> ArrayRef {
            if wide {
                let keys = Int32Array::from_iter(keys.iter().map(|k| k.map(|k| k as i32)));
                Arc::new(DictionaryArray::<Int32Type>::try_new(keys, values).unwrap())
            } else {
                let keys =
                    arrow_array::UInt16Array::from_iter(keys.iter().map(|k| k.map(|k| k as u16)));
                Arc::new(DictionaryArray::<UInt16Type>::try_new(keys, values).unwrap())
            }
        };
        let shift = range.start as i64;
        let columns: [(&str, ArrayRef); 4] = [
            (
                "i64",
                Arc::new(Int64Array::from_iter_values(
                    (0..3000).map(|v| v * 7 + shift),
                )),
            ),
            (
                "f32",
                Arc::new(Float32Array::from_iter_values(
                    (0..3000).map(|v| v as f32 * 0.5 + shift as f32),
                )),
            ),
            (
                "ts",
                Arc::new(
                    TimestampMillisecondArray::from_iter_values((0..3000).map(|v| v - shift))
                        .with_timezone("UTC"),
                ),
            ),
            (
                "i16",
                Arc::new(Int16Array::from_iter_values((0..3000).map(|v| v as i16))),
            ),
        ];
        RecordBatch::try_from_iter(columns.map(|(name, values)| (name, array(values)))).unwrap()
    };
    let rows = 50_000usize;
    let batches = [
        segment(0..20_000, false),
        segment(20_000..35_000, true),
        segment(35_000..rows, false),
    ];
    let order: Vec<u32> = (0..rows as u32)
        .map(|i| (i as u64 * 7919 % rows as u64) as u32)
        .collect();
    let (keys, key_bounds) = permute(batches.to_vec(), &order, 0, 1, usize::MAX).unwrap();
    // 9,000 values of 4 bytes: 36,000 bytes, the bound.
    let (values, value_bounds) = permute(batches.to_vec(), &order, 0, 2, 36_000).unwrap();
    assert!(key_bounds.iter().all(|b| b.is_some()));
    assert_eq!(value_bounds[..3], [None, None, None]);
    assert!(value_bounds[3].is_some());
    for c in 0..4 {
        let (k, v) = (keys.column(c), values.column(c));
        let d = k.as_any_dictionary();
        let expected = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
        if c < 3 {
            assert_eq!(v.data_type(), d.values().data_type());
            assert_eq!(v.as_ref(), expected.as_ref(), "column {c}");
            assert_eq!(v.null_count(), rows.div_ceil(11));
        } else {
            assert_eq!(v.as_ref(), k.as_ref(), "2-byte values stay keys");
        }
    }
    // One byte below the bound: keys.
    let (below, _) = permute(batches.to_vec(), &order, 0, 1, 36_001).unwrap();
    assert!(matches!(
        below.column(1).data_type(),
        DataType::Dictionary(..)
    ));
    assert!(!matches!(
        below.column(0).data_type(),
        DataType::Dictionary(..)
    ));
}

/// Values of a width their type does not align them to (day-time
/// intervals: two 4-byte halves) stay keys instead of being read as
/// 8-byte integers.
#[test]
fn values_not_aligned_to_their_width_stay_keys() {
    use arrow_array::IntervalDayTimeArray;
    use arrow_buffer::{Buffer, IntervalDayTime, ScalarBuffer};
    let n = 100usize;
    let halves: Vec<u32> = (0..2 * n as u32 + 1).collect();
    let raw = Buffer::from_vec(halves);
    // Start the values 4 bytes past an 8-byte boundary.
    let skip = if (raw.as_ptr() as usize).is_multiple_of(8) {
        4
    } else {
        0
    };
    let raw = raw.slice_with_length(skip, 8 * n);
    assert_eq!(raw.as_ptr() as usize % 8, 4);
    let values: ScalarBuffer<IntervalDayTime> = ScalarBuffer::new(raw, 0, n);
    let values = Arc::new(IntervalDayTimeArray::new(values, None));
    let keys = arrow_array::UInt16Array::from_iter_values((0..n as u16).rev());
    let dict = DictionaryArray::<UInt16Type>::try_new(keys, values).unwrap();
    let batch = RecordBatch::try_from_iter([("v", Arc::new(dict) as ArrayRef)]).unwrap();
    let order: Vec<u32> = (0..n as u32).map(|i| i * 7 % n as u32).collect();
    let (permuted, bounds) = permute(vec![batch.clone()], &order, 0, 1, 0).unwrap();
    assert!(bounds[0].is_some(), "kept as keys");
    let d = permuted.column(0).as_any_dictionary();
    let got = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
    let source = batch.column(0).as_any_dictionary();
    let all = arrow_select::take::take(source.values(), source.keys(), None).unwrap();
    let indices = arrow_array::UInt32Array::from(order);
    let expected = arrow_select::take::take(&all, &indices, None).unwrap();
    assert_eq!(got.as_ref(), expected.as_ref());
}

/// Every way `look_up` puts a window's values in order (keys gathered as
/// `u16` or `u32`, or values gathered: chosen by the dictionaries' size
/// against the rows) gives the values arrow's `take` gives, nulls kept,
/// including a segment whose dictionary is empty and whose rows are null.
#[test]
fn every_way_of_looking_up_gives_the_values_in_order() {
    use arrow_array::UInt32Array;
    // (rows a segment, values a dictionary, the way expected)
    let shapes = [
        (20_000usize, 3_000usize, LookUp::Keys16),
        (100_000, 30_000, LookUp::Keys32),
        (20_000, 20_000, LookUp::Values),
    ];
    for (rows, distinct, way) in shapes {
        let segment = |s: usize| -> ArrayRef {
            let keys: Vec<Option<i32>> = (0..rows)
                .map(|i| (i % 13 != 5).then_some(((i * 7919 + s) % distinct) as i32))
                .collect();
            let values =
                Int64Array::from_iter_values((0..distinct as i64).map(|v| v * 3 - s as i64));
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys.into(), Arc::new(values)).unwrap())
        };
        let empty: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                arrow_array::Int32Array::new_null(7),
                Arc::new(Int64Array::from(Vec::<i64>::new())),
            )
            .unwrap(),
        );
        let arrays = [segment(1), empty, segment(2), segment(3)];
        let total: usize = arrays.iter().map(|a| a.len()).sum();
        let values: usize = arrays
            .iter()
            .map(|a| a.as_any_dictionary().values().len().max(1))
            .sum();
        assert_eq!(
            LookUp::choose(values, total, 8),
            way,
            "{rows} rows, {distinct} values"
        );
        let order: Vec<u32> = (0..total as u64)
            .map(|i| (i * 104_729 % total as u64) as u32)
            .collect();
        let batches: Vec<RecordBatch> = arrays
            .iter()
            .map(|a| RecordBatch::try_from_iter([("v", a.clone())]).unwrap())
            .collect();
        let (looked_up, bounds) = permute(batches, &order, 0, 1, 0).unwrap();
        assert_eq!(bounds, [None]);
        let plain: Vec<ArrayRef> = arrays
            .iter()
            .map(|a| {
                let d = a.as_any_dictionary();
                arrow_select::take::take(d.values(), d.keys(), None).unwrap()
            })
            .collect();
        let refs: Vec<&dyn Array> = plain.iter().map(|a| a.as_ref()).collect();
        let all = arrow_select::concat::concat(&refs).unwrap();
        let expected = arrow_select::take::take(&all, &UInt32Array::from(order), None).unwrap();
        assert_eq!(looked_up.column(0).as_ref(), expected.as_ref(), "{way:?}");
        assert_eq!(looked_up.column(0).null_count(), expected.null_count());
    }
}

/// The keys' way is taken only where it holds no more than the values'
/// way, with keys as narrow as the dictionaries allow.
#[test]
fn the_way_of_looking_up_holds_no_more_than_the_values() {
    // 1,000 rows of 8-byte values: 8,000 bytes the values' way.
    assert_eq!(LookUp::choose(100, 1_000, 8), LookUp::Keys16);
    assert_eq!(LookUp::choose(750, 1_000, 8), LookUp::Keys16); // 6,000 + 2,000
    assert_eq!(LookUp::choose(751, 1_000, 8), LookUp::Values);
    assert_eq!(LookUp::choose(1 << 16, 1 << 20, 8), LookUp::Keys16);
    assert_eq!(LookUp::choose((1 << 16) + 1, 1 << 20, 8), LookUp::Keys32);
    // 4-byte values: 2-byte keys and a dictionary of at most half the rows.
    assert_eq!(LookUp::choose(500, 1_000, 4), LookUp::Keys16);
    assert_eq!(LookUp::choose(501, 1_000, 4), LookUp::Values);
    assert_eq!(LookUp::choose(1 << 17, 1 << 20, 4), LookUp::Values);
    assert_eq!(LookUp::choose(usize::MAX, usize::MAX, 8), LookUp::Values);
}

/// A segment whose dictionary is empty (its rows all null), last in its
/// window: its keys and the window's key bound stay inside the window's
/// dictionary (the collator's lookups use the bound unchecked where it is
/// inside, and search the keys otherwise).
#[test]
fn an_empty_dictionary_last_in_a_window_keeps_keys_inside() {
    let full: ArrayRef = Arc::new(
        DictionaryArray::<UInt16Type>::try_new(
            vec![2u16, 0, 1].into(),
            Arc::new(arrow_array::Int32Array::from(vec![10, 20, 30])),
        )
        .unwrap(),
    );
    let empty: ArrayRef = Arc::new(
        DictionaryArray::<UInt16Type>::try_new(
            arrow_array::UInt16Array::new_null(2),
            Arc::new(arrow_array::Int32Array::from(Vec::<i32>::new())),
        )
        .unwrap(),
    );
    let batches: Vec<RecordBatch> = [full, empty]
        .into_iter()
        .map(|a| RecordBatch::try_from_iter_with_nullable([("v", a, true)]).unwrap())
        .collect();
    let (permuted, bounds) = permute(batches, &[4, 0, 3, 1, 2], 0, 1, usize::MAX).unwrap();
    let d = permuted.column(0).as_any_dictionary();
    assert_eq!(d.values().len(), 3);
    assert!(bounds[0].is_some_and(|b| b.get() < 3), "{bounds:?}");
    let keys = d.keys().to_data();
    let keys: &[u8] = keys.buffers()[0].typed_data();
    assert!(keys.iter().all(|&k| k < 3), "{keys:?}");
    assert_eq!(
        arrow_select::take::take(d.values(), d.keys(), None)
            .unwrap()
            .as_ref(),
        &arrow_array::Int32Array::from(vec![None, Some(30), None, Some(10), Some(20)])
            as &dyn Array
    );
}

/// A window whose dictionaries are all empty (every row null) keeps its
/// keys inside a dictionary of one null value.
#[test]
fn a_window_of_empty_dictionaries_keeps_keys_inside() {
    let empty = |rows: usize| -> RecordBatch {
        let array: ArrayRef = Arc::new(
            DictionaryArray::<UInt16Type>::try_new(
                arrow_array::UInt16Array::new_null(rows),
                Arc::new(arrow_array::Int32Array::from(Vec::<i32>::new())),
            )
            .unwrap(),
        );
        RecordBatch::try_from_iter_with_nullable([("v", array, true)]).unwrap()
    };
    let (permuted, bounds) =
        permute(vec![empty(2), empty(3)], &[4, 0, 3, 1, 2], 0, 1, usize::MAX).unwrap();
    let d = permuted.column(0).as_any_dictionary();
    assert_eq!(d.values().len(), 1);
    assert_eq!(bounds, [Some(KeyBound(0))]);
    assert_eq!(d.keys().null_count(), 5);
    let keys = d.keys().to_data();
    assert!(keys.buffers()[0].typed_data::<u8>().iter().all(|&k| k == 0));
}
