//! The own list decoder against parquet's reader: every list shape and
//! item type it takes.

use super::*;

/// Decode column 0 (a list of type `data_type`) of every row group of
/// `file` whose encodings the own decoders read, once for each row count
/// `wants(rows)` gives (whole, or a prefix), and hand `check` the row
/// group, the count asked, the array decoded and parquet's reader's rows.
/// Returns the row groups decoded and the rows of all of them.
fn each_row_group(
    file: &Bytes,
    arrow: &ArrowReaderMetadata,
    data_type: &DataType,
    wants: impl Fn(usize) -> Vec<usize>,
    mut check: impl FnMut(usize, usize, ArrayRef, ArrayRef),
) -> (usize, usize) {
    let expected = read_with_parquet(file);
    let metadata = arrow.metadata();
    let (mut decoded, mut at) = (0, 0);
    for rg in 0..metadata.num_row_groups() {
        let meta = metadata.row_group(rg);
        let n = meta.num_rows() as usize;
        if own_encodings(meta.column(0)) {
            for want in wants(n) {
                let got = decode_list_i32(
                    Arc::new(file.clone()),
                    meta.column(0),
                    (n, want),
                    data_type,
                    &LIMITS,
                )
                .unwrap();
                check(rg, want, got, expected.column(0).slice(at, want.min(n)));
            }
            decoded += 1;
        }
        at += n;
    }
    (decoded, at)
}

/// Lists with empty rows, long rows spanning pages, and dictionary,
/// fallback-to-plain and plain pages, V1 and V2: the own list decoder
/// gives parquet's reader's values and offsets.
#[test]
fn decoded_lists_equal_parquets_reader() {
    use arrow_array::{Array, ListArray, RecordBatch};
    use arrow_schema::{Field, Schema};
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::{WriterProperties, WriterVersion};

    let rows = 3000usize;
    let item = Arc::new(Field::new("item", DataType::Int32, false));
    let lists: Vec<Vec<i32>> = (0..rows)
        .map(|r| {
            // Empty rows, short rows, and now and then a 700-id row.
            let len = match r % 11 {
                0 => 0,
                5 => 700,
                k => k * 3,
            };
            (0..len)
                .map(|i| {
                    let v = (r * 31 + i * 7) as i32;
                    // Few distinct ids in the first half (dictionary), many after.
                    if r < rows / 2 { v % 50 } else { v * 7919 }
                })
                .collect()
        })
        .collect();
    let mut offsets = vec![0i32];
    for l in &lists {
        offsets.push(offsets.last().unwrap() + l.len() as i32);
    }
    let list = ListArray::try_new(
        item.clone(),
        arrow_buffer::OffsetBuffer::new(offsets.into()),
        Arc::new(Int32Array::from(lists.concat())),
        None,
    )
    .unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new(
        "ids",
        DataType::List(item),
        false,
    )]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(list)]).unwrap();
    for (dictionary, version) in [
        (true, WriterVersion::PARQUET_1_0),
        (true, WriterVersion::PARQUET_2_0),
        (false, WriterVersion::PARQUET_1_0),
    ] {
        let props = WriterProperties::builder()
            .set_dictionary_enabled(dictionary)
            .set_dictionary_page_size_limit(1024)
            .set_data_page_size_limit(2048)
            .set_write_batch_size(64)
            .set_writer_version(version)
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(1000))
            .build();
        let (file, arrow) = write_parquet(&batch, Some(props));
        let metadata = arrow.metadata().clone();
        let descr = metadata.file_metadata().schema_descr();
        assert_eq!(
            (
                descr.column(0).max_def_level(),
                descr.column(0).max_rep_level()
            ),
            (1, 1)
        );
        let expected = read_with_parquet(&file);
        let mut at = 0;
        let mut decoded = 0;
        for rg in 0..metadata.num_row_groups() {
            let meta = metadata.row_group(rg);
            let n = meta.num_rows() as usize;
            let chunk = meta.column(0);
            if own_encodings(chunk) {
                assert!(chunk.data_page_offset() > 0);
                let array = decode_list_i32(
                    Arc::new(file.clone()),
                    chunk,
                    (n, n),
                    batch.column(0).data_type(),
                    &LIMITS,
                )
                .unwrap();
                let want = expected.column(0).slice(at, n);
                let (got, want) = (array.as_list::<i32>(), want.as_list::<i32>());
                assert_eq!(got.len(), want.len());
                for r in 0..n {
                    assert_eq!(
                        got.value(r).to_data(),
                        want.value(r).to_data(),
                        "row {r} of row group {rg}, dictionary {dictionary}, {version:?}"
                    );
                }
                decoded += 1;
            } else {
                assert_eq!(version, WriterVersion::PARQUET_2_0);
            }
            at += n;
        }
        assert_eq!(at, rows);
        if version == WriterVersion::PARQUET_1_0 {
            assert_eq!(decoded, metadata.num_row_groups());
        }
    }
}

/// Nullable lists and nullable items (definition levels 2 and 3, as
/// pyarrow and Hugging Face datasets write token lists): null lists, empty
/// lists, null items, pages without any and pages with many, dictionary and
/// plain, V1 and V2, snappy (parquet's page reader) and zstd, whole row
/// groups and prefixes: the own list decoder gives parquet's reader's
/// arrays, validity included.
#[test]
fn nullable_lists_equal_parquets_reader() {
    use arrow_array::{Array, ListArray, RecordBatch};
    use arrow_buffer::NullBuffer;
    use arrow_schema::{Field, Schema};
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::{WriterProperties, WriterVersion};

    let rows = 4000usize;
    for (list_nullable, item_nullable) in [(true, true), (true, false), (false, true)] {
        let item = Arc::new(Field::new("item", DataType::Int32, item_nullable));
        let mut offsets = vec![0i32];
        let mut values: Vec<i32> = Vec::new();
        let mut item_valid: Vec<bool> = Vec::new();
        let mut list_valid: Vec<bool> = Vec::new();
        for r in 0..rows {
            // The first 1500 rows: no null and no empty list (the pages'
            // fast path); after them, every kind.
            let plain_part = r < 1500;
            let null_list = list_nullable && !plain_part && r % 13 == 4;
            let len = if null_list || (!plain_part && r % 7 == 0) {
                0
            } else if r % 17 == 5 {
                600
            } else {
                1 + r % 9
            };
            for i in 0..len {
                let v = (r * 31 + i * 7) as i32;
                values.push(if r % 2 == 0 { v % 40 } else { v * 7919 });
                item_valid.push(!(item_nullable && !plain_part && (r + i) % 5 == 1));
            }
            list_valid.push(!null_list);
            offsets.push(values.len() as i32);
        }
        let list = ListArray::try_new(
            item.clone(),
            arrow_buffer::OffsetBuffer::new(offsets.into()),
            Arc::new(Int32Array::new(
                values.into(),
                item_nullable.then(|| NullBuffer::from(item_valid)),
            )),
            list_nullable.then(|| NullBuffer::from(list_valid)),
        )
        .unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ids",
            DataType::List(item),
            list_nullable,
        )]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(list)]).unwrap();
        for (dictionary, version, compression) in [
            (true, WriterVersion::PARQUET_1_0, Compression::SNAPPY),
            (
                true,
                WriterVersion::PARQUET_2_0,
                Compression::ZSTD(ZstdLevel::default()),
            ),
            (
                false,
                WriterVersion::PARQUET_1_0,
                Compression::ZSTD(ZstdLevel::default()),
            ),
        ] {
            let props = WriterProperties::builder()
                .set_dictionary_enabled(dictionary)
                .set_data_page_size_limit(2048)
                .set_write_batch_size(64)
                .set_writer_version(version)
                .set_compression(compression)
                .set_max_row_group_row_count(Some(2000))
                .build();
            let (file, arrow) = write_parquet(&batch, Some(props));
            let metadata = arrow.metadata().clone();
            let expected_def = list_nullable as i16 + 1 + item_nullable as i16;
            assert_eq!(
                metadata
                    .file_metadata()
                    .schema_descr()
                    .column(0)
                    .max_def_level(),
                expected_def
            );
            assert_eq!(super::super::list::list_leaf(&arrow, 0), Some(0));
            let (decoded, at) = each_row_group(
                &file,
                &arrow,
                batch.column(0).data_type(),
                |n| vec![n, n / 3, 1],
                |rg, want, array, want_array| {
                    let rows_want = want_array.len();
                    let (got, want_list) = (array.as_list::<i32>(), want_array.as_list::<i32>());
                    assert_eq!(got.len(), rows_want);
                    let case = format!(
                        "list nullable {list_nullable}, item nullable {item_nullable}, dictionary {dictionary}, {version:?}, row group {rg}, want {want}"
                    );
                    for r in 0..rows_want {
                        assert_eq!(got.is_valid(r), want_list.is_valid(r), "row {r}: {case}");
                        if want_list.is_valid(r) {
                            let (g, w) = (got.value(r), want_list.value(r));
                            let (g, w) = (
                                g.as_primitive::<arrow_array::types::Int32Type>(),
                                w.as_primitive::<arrow_array::types::Int32Type>(),
                            );
                            assert_eq!(g.len(), w.len(), "row {r}: {case}");
                            for i in 0..w.len() {
                                assert_eq!(
                                    g.is_valid(i),
                                    w.is_valid(i),
                                    "row {r} item {i}: {case}"
                                );
                                if w.is_valid(i) {
                                    assert_eq!(g.value(i), w.value(i), "row {r} item {i}: {case}");
                                }
                            }
                        }
                    }
                },
            );
            assert_eq!(at, rows);
            // Only V2 pages may hold encodings the own decoders do not read.
            if decoded != metadata.num_row_groups() {
                assert_eq!(version, WriterVersion::PARQUET_2_0);
            }
            if version == WriterVersion::PARQUET_1_0 {
                assert_eq!(decoded, metadata.num_row_groups());
            }
        }
    }
}

/// Lists of every integer item type Parquet stores as INT32 or INT64
/// (int8 to uint64), as `list` and `large_list` (how polars writes token
/// lists), required or nullable: the own list decoder gives parquet's
/// reader's arrays.
#[test]
fn integer_lists_and_large_lists_equal_parquets_reader() {
    use arrow_array::{Array, RecordBatch};
    use arrow_buffer::{Buffer, NullBuffer};
    use arrow_data::ArrayData;
    use arrow_schema::{Field, Schema};
    use parquet::file::properties::WriterProperties;

    let rows = 1500usize;
    for (item_type, width, large) in [
        (DataType::Int64, 8, false),
        (DataType::UInt64, 8, true),
        (DataType::UInt32, 4, false),
        (DataType::UInt16, 2, false),
        (DataType::Int16, 2, true),
        (DataType::Int8, 1, false),
        (DataType::UInt8, 1, false),
        (DataType::Int32, 4, true),
    ] {
        for nullable in [false, true] {
            let mut offsets = vec![0i64];
            let (mut bytes, mut item_valid, mut list_valid) = (Vec::new(), Vec::new(), Vec::new());
            for r in 0..rows {
                let null_list = nullable && r % 11 == 3;
                let len = if null_list || r % 7 == 0 {
                    0
                } else {
                    1 + r % 23
                };
                for i in 0..len {
                    let v = ((r * 31 + i * 7) % 100) as i64;
                    bytes.extend_from_slice(&v.to_le_bytes()[..width]);
                    item_valid.push(!(nullable && (r + i) % 5 == 1));
                }
                list_valid.push(!null_list);
                offsets.push(offsets.last().unwrap() + len as i64);
            }
            let n_items = *offsets.last().unwrap() as usize;
            let items = arrow_array::make_array(
                ArrayData::builder(item_type.clone())
                    .len(n_items)
                    .add_buffer(Buffer::from(bytes))
                    .nulls(nullable.then(|| NullBuffer::from(item_valid)))
                    .build()
                    .unwrap(),
            );
            let item = Arc::new(Field::new("item", item_type.clone(), nullable));
            let list_nulls = nullable.then(|| NullBuffer::from(list_valid));
            let (list, list_type): (ArrayRef, DataType) = if large {
                (
                    Arc::new(
                        arrow_array::LargeListArray::try_new(
                            item.clone(),
                            arrow_buffer::OffsetBuffer::new(offsets.into()),
                            items,
                            list_nulls,
                        )
                        .unwrap(),
                    ),
                    DataType::LargeList(item),
                )
            } else {
                let offsets: Vec<i32> = offsets.iter().map(|&o| o as i32).collect();
                (
                    Arc::new(
                        arrow_array::ListArray::try_new(
                            item.clone(),
                            arrow_buffer::OffsetBuffer::new(offsets.into()),
                            items,
                            list_nulls,
                        )
                        .unwrap(),
                    ),
                    DataType::List(item),
                )
            };
            let schema = Arc::new(Schema::new(vec![Field::new("ids", list_type, nullable)]));
            let batch = RecordBatch::try_new(schema, vec![list]).unwrap();
            for dictionary in [true, false] {
                let props = WriterProperties::builder()
                    .set_dictionary_enabled(dictionary)
                    .set_data_page_size_limit(1024)
                    .set_write_batch_size(64)
                    .set_max_row_group_row_count(Some(700))
                    .build();
                let (file, arrow) = write_parquet(&batch, Some(props));
                assert_eq!(
                    super::super::list::list_leaf(&arrow, 0),
                    Some(0),
                    "{item_type} large {large}"
                );
                let (decoded, at) = each_row_group(
                    &file,
                    &arrow,
                    batch.column(0).data_type(),
                    |n| vec![n],
                    |rg, _, got, want| {
                        assert_eq!(got.data_type(), want.data_type());
                        let case = format!(
                            "{item_type}, large {large}, nullable {nullable}, dictionary {dictionary}, row group {rg}"
                        );
                        for r in 0..want.len() {
                            assert_eq!(got.is_valid(r), want.is_valid(r), "row {r}: {case}");
                        }
                        assert_eq!(got.to_data(), want.to_data(), "{case}");
                    },
                );
                assert_eq!(decoded, arrow.metadata().num_row_groups());
                assert_eq!(at, rows);
            }
        }
    }
}
