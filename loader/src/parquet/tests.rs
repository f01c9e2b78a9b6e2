//! The own decoders against parquet's Arrow reader on files parquet's
//! writer makes, and damaged chunks.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, Int32Array, make_array};
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;

use super::binary::{bytes_leaf, decode_bytes};
use super::fixed::{decode_fixed, fixed_leaf};
use super::list::decode_list as decode_list_i32;
use super::{Limits, own_encodings};

const LIMITS: Limits = Limits { max_bytes: 1 << 30 };

/// `batch` written by parquet's Arrow writer with `props`, and its metadata.
fn write_parquet(
    batch: &arrow_array::RecordBatch,
    props: Option<parquet::file::properties::WriterProperties>,
) -> (Bytes, ArrowReaderMetadata) {
    let mut file = Vec::new();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(&mut file, batch.schema(), props).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
    let file = Bytes::from(file);
    let arrow = ArrowReaderMetadata::load(
        &file,
        parquet::arrow::arrow_reader::ArrowReaderOptions::default(),
    )
    .unwrap();
    (file, arrow)
}

/// Every row of `file`, as parquet's Arrow reader reads it.
fn read_with_parquet(file: &Bytes) -> arrow_array::RecordBatch {
    let batches: Vec<_> =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file.clone())
            .unwrap()
            .build()
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap();
    arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap()
}

#[test]
fn large_dictionaries_keep_i32_keys() {
    use arrow_array::{Array, Int64Array, RecordBatch};
    use parquet::file::properties::WriterProperties;

    for (distinct, key) in [(70_000i64, DataType::Int32), (1000, DataType::UInt16)] {
        let rows = 140_000usize;
        let values: Vec<i64> = (0..rows as i64).map(|i| (i * 7919) % distinct).collect();
        let batch = RecordBatch::try_from_iter([(
            "v",
            Arc::new(Int64Array::from(values.clone())) as ArrayRef,
        )])
        .unwrap();
        let props = WriterProperties::builder()
            .set_dictionary_page_size_limit(4 << 20)
            .build();
        let (file, arrow) = write_parquet(&batch, Some(props));
        let leaf = fixed_leaf(&arrow, 0).unwrap();
        let meta = arrow.metadata().row_group(0);
        assert_eq!(meta.num_rows() as usize, rows);
        let array = decode_fixed(
            Arc::new(file.clone()),
            meta.column(0),
            &leaf,
            rows,
            rows,
            &DataType::Int64,
            &LIMITS,
        )
        .unwrap();
        assert_eq!(
            array.data_type(),
            &DataType::Dictionary(Box::new(key.clone()), Box::new(DataType::Int64))
        );
        let d = array.as_any_dictionary();
        let plain = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
        let plain = plain.as_primitive::<arrow_array::types::Int64Type>();
        assert_eq!(plain.values(), &values[..]);
    }
}

/// Nullable chunks, with and without nulls, decode with their validity.
#[test]
fn nullable_chunks_decode_with_their_validity() {
    use arrow_array::{Int64Array, RecordBatch, StringArray};

    let with_nulls = Int64Array::from_iter((0..1000).map(|i| (i % 7 != 0).then_some(i)));
    let without = Int64Array::from_iter((0..1000).map(Some));
    let text = StringArray::from_iter((0..1000).map(|i| (i % 5 != 0).then(|| i.to_string())));
    let batch = RecordBatch::try_from_iter([
        ("with_nulls", Arc::new(with_nulls) as ArrayRef),
        ("without", Arc::new(without) as ArrayRef),
        ("text", Arc::new(text) as ArrayRef),
    ])
    .unwrap();
    let (file, arrow) = write_parquet(&batch, None);
    let meta = arrow.metadata().row_group(0);
    assert!(fixed_leaf(&arrow, 0).is_some() && fixed_leaf(&arrow, 1).is_some());
    assert!(own_encodings(meta.column(0)) && own_encodings(meta.column(1)));
    assert_eq!(bytes_leaf(&arrow, 2), Some((2, true)));
    assert!(own_encodings(meta.column(2)));
    let leaf = fixed_leaf(&arrow, 1).unwrap();
    let array = decode_fixed(
        Arc::new(file.clone()),
        meta.column(1),
        &leaf,
        1000,
        1000,
        &DataType::Int64,
        &LIMITS,
    )
    .unwrap();
    let d = array.as_any_dictionary();
    let plain = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
    assert_eq!(
        plain
            .as_primitive::<arrow_array::types::Int64Type>()
            .values(),
        &(0..1000).collect::<Vec<i64>>()[..]
    );
    // Fixed-width chunks with nulls decode with a validity bitmap.
    let leaf0 = fixed_leaf(&arrow, 0).unwrap();
    let array = decode_fixed(
        Arc::new(file.clone()),
        meta.column(0),
        &leaf0,
        1000,
        1000,
        &DataType::Int64,
        &LIMITS,
    )
    .unwrap();
    let d = array.as_any_dictionary();
    let plain = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
    assert_eq!(plain.to_data(), batch.column(0).to_data());
    // String chunks with nulls decode with a validity bitmap too.
    let array = decode_bytes(Arc::new(file), meta.column(2), (1000, 1000), true, &LIMITS).unwrap();
    let strings = array.as_string_view();
    let want = batch.column(2).as_string::<i32>();
    assert_eq!(strings.nulls(), want.nulls());
    for r in 0..1000 {
        assert_eq!(strings.is_valid(r), want.is_valid(r));
        if want.is_valid(r) {
            assert_eq!(strings.value(r), want.value(r));
        }
    }
}

/// A file of one `Int64` column `v` of 5000 rows in one row group, its
/// metadata and its column chunk's.
fn int64_chunk() -> (
    Bytes,
    ArrowReaderMetadata,
    parquet::file::metadata::ColumnChunkMetaData,
) {
    use arrow_array::{Int64Array, RecordBatch};
    let batch = RecordBatch::try_from_iter([(
        "v",
        Arc::new(Int64Array::from_iter_values(0..5000)) as ArrayRef,
    )])
    .unwrap();
    let (file, arrow) = write_parquet(&batch, None);
    let chunk = arrow.metadata().row_group(0).column(0).clone();
    (file, arrow, chunk)
}

/// The 5,000 `Int64` rows of `chunk` (column 0 of the file `arrow`
/// describes) decoded by the own decoder from the file's `bytes`.
fn decode_int64(
    bytes: Vec<u8>,
    arrow: &ArrowReaderMetadata,
    chunk: &parquet::file::metadata::ColumnChunkMetaData,
) -> parquet::errors::Result<ArrayRef> {
    let leaf = fixed_leaf(arrow, 0).unwrap();
    decode_fixed(
        Arc::new(Bytes::from(bytes)),
        chunk,
        &leaf,
        5000,
        5000,
        &DataType::Int64,
        &LIMITS,
    )
}

/// Truncated or scrambled column chunk bytes give errors, never a panic.
#[test]
fn damaged_page_headers_are_errors() {
    let (file, arrow, chunk) = int64_chunk();
    let (start, len) = chunk.byte_range();
    let (start, len) = (start as usize, len as usize);
    let decode = |bytes: Vec<u8>| decode_int64(bytes, &arrow, &chunk);
    assert!(decode(file.to_vec()).is_ok());
    let mut failures = 0;
    // Every byte of the chunk's first 64 (page headers) scrambled in turn,
    // and the chunk cut short at several places.
    for at in start..start + 64.min(len) {
        let mut bytes = file.to_vec();
        bytes[at] ^= 0x5a;
        failures += decode(bytes).is_err() as usize;
    }
    assert!(failures > 0);
    // The page reader alone, over a chunk cut short at several places.
    for cut in [1, 7, len / 2, len - 1] {
        let mut pages =
            super::page::ChunkPages::new(file.slice(start..start + cut), true, "v".into(), 1 << 30);
        let outcome = std::iter::from_fn(|| pages.next_page().transpose()).find(|p| p.is_err());
        assert!(outcome.is_some(), "cut at {cut}");
    }
}

/// A V1 page of a nullable column whose definition levels the header says
/// are PLAIN (one byte of the header changed from RLE) is refused naming
/// the encoding: read as RLE, they would give other values. (BIT_PACKED
/// levels send the column to parquet's reader.)
#[test]
fn definition_levels_in_another_encoding_are_refused() {
    use arrow_array::{Int64Array, RecordBatch};
    let values = Int64Array::from_iter((0..5000).map(|i| (i % 7 != 0).then_some(i)));
    let batch = RecordBatch::try_from_iter([("v", Arc::new(values) as ArrayRef)]).unwrap();
    let properties = parquet::file::properties::WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_compression(parquet::basic::Compression::UNCOMPRESSED)
        .build();
    let (file, arrow) = write_parquet(&batch, Some(properties));
    let chunk = arrow.metadata().row_group(0).column(0).clone();
    let decode = |bytes: Vec<u8>| decode_int64(bytes, &arrow, &chunk);
    assert!(decode(file.to_vec()).is_ok());
    // The first data page header's encoding (PLAIN), then its level
    // encodings (RLE, zigzag 6): the definition levels' made PLAIN.
    let (start, len) = chunk.byte_range();
    let (start, len) = (start as usize, len as usize);
    let at = file[start..start + len]
        .windows(6)
        .position(|w| w == [0x15, 0x00, 0x15, 0x06, 0x15, 0x06])
        .expect("a V1 data page header")
        + start;
    let mut bytes = file.to_vec();
    bytes[at + 3] = 0x00;
    let error = decode(bytes).unwrap_err().to_string();
    assert!(
        error.contains("definition levels encoded as PLAIN are not supported"),
        "{error}"
    );
}

/// The own reader's errors say what was wrong and where: a page cut short
/// names its column and where the page starts in its chunk; a column asked
/// to decode more than the budget names the column, count and limit; bytes
/// outside the fetched ranges name the range.
#[test]
fn decode_errors_are_typed_and_say_where() {
    use super::error::DecodeError;

    let typed = |e: parquet::errors::ParquetError| match e {
        parquet::errors::ParquetError::External(inner) => *inner
            .downcast::<DecodeError>()
            .unwrap_or_else(|e| panic!("not a DecodeError: {e}")),
        other => panic!("not a DecodeError: {other}"),
    };
    let (file, arrow, chunk) = int64_chunk();
    let (start, len) = chunk.byte_range();
    let (start, len) = (start as usize, len as usize);
    // The first page cut short: its header parses, its body overruns.
    let mut pages = super::page::ChunkPages::new(
        file.slice(start..start + len / 2),
        true,
        "v".into(),
        1 << 30,
    );
    let error = std::iter::from_fn(|| pages.next_page().transpose())
        .find_map(|p| p.err())
        .expect("a page overruns the cut");
    match typed(error) {
        DecodeError::Column { column, offset, .. } => {
            assert_eq!(column, "v");
            assert!(offset.is_some_and(|o| o < len / 2), "{offset:?}");
        }
        other => panic!("{other}"),
    }
    let leaf = fixed_leaf(&arrow, 0).unwrap();
    let small = Limits { max_bytes: 1000 };
    let error = decode_fixed(
        Arc::new(file.clone()),
        &chunk,
        &leaf,
        5000,
        5000,
        &DataType::Int64,
        &small,
    )
    .unwrap_err();
    match typed(error) {
        // The first page is refused before it is decompressed.
        DecodeError::Column {
            column,
            offset,
            what,
        } => {
            assert_eq!((column.as_str(), offset), ("v", Some(0)));
            assert!(what.contains("byte budget (1000 bytes)"), "{what}");
        }
        other => panic!("{other}"),
    }
    match typed(small.check(5000, 8, "v").unwrap_err()) {
        DecodeError::OverBudget {
            column,
            count,
            width,
            limit,
        } => assert_eq!((column.as_str(), count, width, limit), ("v", 5000, 8, 1000)),
        other => panic!("{other}"),
    }
    let sparse = super::SparseFile::new(file.len() as u64, vec![(0, file.slice(0..16))]);
    let error = parquet::file::reader::ChunkReader::get_bytes(&sparse, 100, 10).unwrap_err();
    match typed(error) {
        DecodeError::NotFetched { start, end } => assert_eq!((start, end), (100, 110)),
        other => panic!("{other}"),
    }
}

#[test]
fn decoded_row_groups_equal_parquets_reader() {
    use arrow_array::{
        Array, Float32Array, Float64Array, Int8Array, Int16Array, Int64Array, RecordBatch,
        UInt8Array, UInt16Array, UInt32Array, UInt64Array,
    };
    use arrow_schema::{Field, Schema};
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::{WriterProperties, WriterVersion};

    let rows = 5000usize;
    // Low-cardinality values for the first half, then distinct ones: the
    // dictionary fills up and later pages are plain.
    let v = |i: usize| if i < rows / 2 { i % 37 } else { i * 7919 };
    let columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(Int8Array::from_iter_values((0..rows).map(|i| v(i) as i8))),
        Arc::new(Int16Array::from_iter_values((0..rows).map(|i| v(i) as i16))),
        Arc::new(UInt8Array::from_iter_values((0..rows).map(|i| v(i) as u8))),
        Arc::new(UInt16Array::from_iter_values(
            (0..rows).map(|i| v(i) as u16),
        )),
        Arc::new(Int32Array::from_iter_values(
            (0..rows).map(|i| v(i) as i32 - 100),
        )),
        Arc::new(UInt32Array::from_iter_values(
            (0..rows).map(|i| u32::MAX - v(i) as u32),
        )),
        Arc::new(Int64Array::from_iter_values(
            (0..rows).map(|i| -(v(i) as i64) << 20),
        )),
        Arc::new(UInt64Array::from_iter_values(
            (0..rows).map(|i| u64::MAX - v(i) as u64),
        )),
        Arc::new(Float32Array::from_iter_values(
            (0..rows).map(|i| v(i) as f32 * 0.5),
        )),
        Arc::new(Float64Array::from_iter_values(
            (0..rows).map(|i| v(i) as f64 / 3.0),
        )),
    ];
    // Columns 1 and 5: nullable without nulls, as pandas writes them.
    // Columns 3, 7 and 9: nulls every 13th row and rows 3000..3200;
    // column 9 also the whole second row group (2500..5000).
    let columns: Vec<Arc<dyn Array>> = columns
        .into_iter()
        .enumerate()
        .map(|(c, array)| {
            if ![3, 7, 9].contains(&c) {
                return array;
            }
            let valid = arrow_buffer::NullBuffer::from_iter(
                (0..rows)
                    .map(|i| i % 13 != 0 && !(3000..3200).contains(&i) && !(c == 9 && i >= 2500)),
            );
            let data = array
                .to_data()
                .into_builder()
                .nulls(Some(valid))
                .build()
                .unwrap();
            make_array(data)
        })
        .collect();
    let fields: Vec<Field> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), i % 2 == 1))
        .collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    // zstd and uncompressed chunks are read by this crate's page reader,
    // snappy ones by parquet's.
    for (dictionary, version, codec) in [
        (
            true,
            WriterVersion::PARQUET_1_0,
            Compression::ZSTD(ZstdLevel::default()),
        ),
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
        (true, WriterVersion::PARQUET_1_0, Compression::UNCOMPRESSED),
        (true, WriterVersion::PARQUET_2_0, Compression::SNAPPY),
        (false, WriterVersion::PARQUET_2_0, Compression::UNCOMPRESSED),
    ] {
        let props = WriterProperties::builder()
            .set_dictionary_enabled(dictionary)
            .set_dictionary_page_size_limit(256)
            .set_data_page_row_count_limit(300)
            .set_write_batch_size(100)
            .set_writer_version(version)
            .set_compression(codec)
            .set_max_row_group_row_count(Some(2500))
            .build();
        let (file, arrow) = write_parquet(&batch, Some(props));
        let metadata = arrow.metadata().clone();
        let expected = read_with_parquet(&file);
        let mut kinds = Vec::new();
        let mut delta_chunks = 0;
        for root in 0..batch.num_columns() {
            let leaf = fixed_leaf(&arrow, root).expect("a fixed-width leaf");
            let mut at = 0;
            for rg in 0..metadata.num_row_groups() {
                let meta = metadata.row_group(rg);
                let chunk = meta.column(leaf.leaf);
                // V2 falls back to DELTA_BINARY_PACKED for integers (PLAIN
                // for floats): the own decoder's too.
                assert!(super::own_fixed_encodings(chunk, leaf.integer()));
                if chunk
                    .encodings()
                    .any(|e| e == parquet::basic::Encoding::DELTA_BINARY_PACKED)
                {
                    assert_eq!(version, WriterVersion::PARQUET_2_0);
                    delta_chunks += 1;
                }
                let n = meta.num_rows() as usize;
                let array = decode_fixed(
                    Arc::new(file.clone()),
                    chunk,
                    &leaf,
                    n,
                    n,
                    batch.column(root).data_type(),
                    &LIMITS,
                )
                .unwrap();
                kinds.push(matches!(array.data_type(), DataType::Dictionary(..)));
                let plain = match array.as_any_dictionary_opt() {
                    Some(d) => arrow_select::take::take(d.values(), d.keys(), None).unwrap(),
                    None => array.clone(),
                };
                assert_eq!(
                    plain.to_data(),
                    expected.column(root).slice(at, n).to_data(),
                    "column {root}, row group {rg}, dictionary {dictionary}, {version:?}, {codec}"
                );
                at += n;
            }
            assert_eq!(at, rows);
        }
        // Integer columns of V2 files fall back to (or are all) delta pages.
        assert_eq!(
            delta_chunks > 0,
            version == WriterVersion::PARQUET_2_0,
            "{version:?}, {codec}"
        );
        // Dictionary row groups (the first) stay dictionaries; fallen
        // back or plain ones do not.
        assert_eq!(kinds.iter().any(|&k| k), dictionary);
        assert!(!kinds.iter().all(|&k| k));
    }
}

/// Binary and string values, inline (up to 12 bytes) and not, from
/// dictionary, fallback-to-plain and plain pages, V1 and V2: the views
/// over decoded pages hold parquet's reader's values.
#[test]
fn decoded_bytes_equal_parquets_reader() {
    use arrow_array::{Array, BinaryArray, RecordBatch, StringArray};
    use arrow_schema::{Field, Schema};
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::{WriterProperties, WriterVersion};

    let rows = 2000usize;
    let text: Vec<String> = (0..rows)
        .map(|r| {
            // Few distinct short strings first (dictionary), then distinct
            // ones of up to 60 bytes, some of them not ASCII.
            if r < rows / 2 {
                format!("s{}", r % 9)
            } else {
                format!("{r}-é-{}", "x".repeat(r % 50))
            }
        })
        .collect();
    let blobs: Vec<Vec<u8>> = text.iter().map(|t| t.as_bytes().repeat(2)).collect();
    let columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(StringArray::from(text.clone())),
        // Nulls every 7th row and rows 1200..1500.
        Arc::new(BinaryArray::from_iter(blobs.iter().enumerate().map(
            |(i, b)| (i % 7 != 0 && !(1200..1500).contains(&i)).then_some(b.as_slice()),
        ))),
    ];
    let fields = vec![
        Field::new("text", DataType::Utf8, false),
        Field::new("blob", DataType::Binary, true),
    ];
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    for (dictionary, version) in [
        (true, WriterVersion::PARQUET_1_0),
        (true, WriterVersion::PARQUET_2_0),
        (false, WriterVersion::PARQUET_1_0),
    ] {
        let props = WriterProperties::builder()
            .set_dictionary_enabled(dictionary)
            .set_dictionary_page_size_limit(512)
            .set_data_page_size_limit(1024)
            .set_write_batch_size(50)
            .set_writer_version(version)
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(700))
            .build();
        let (file, arrow) = write_parquet(&batch, Some(props));
        let metadata = arrow.metadata().clone();
        let mut decoded = 0;
        for root in 0..2 {
            let (leaf, utf8) = bytes_leaf(&arrow, root).expect("a byte array leaf");
            assert_eq!(utf8, root == 0);
            let mut at = 0;
            for rg in 0..metadata.num_row_groups() {
                let meta = metadata.row_group(rg);
                let n = meta.num_rows() as usize;
                let chunk = meta.column(leaf);
                if own_encodings(chunk) {
                    let array =
                        decode_bytes(Arc::new(file.clone()), chunk, (n, n), utf8, &LIMITS).unwrap();
                    assert_eq!(array.len(), n);
                    for r in 0..n {
                        let i = at + r;
                        let null = !utf8 && (i % 7 == 0 || (1200..1500).contains(&i));
                        assert_eq!(array.is_null(r), null, "row {i} of column {root}");
                        if null {
                            continue;
                        }
                        let got: &[u8] = if utf8 {
                            array.as_string_view().value(r).as_bytes()
                        } else {
                            array.as_binary_view().value(r)
                        };
                        let want: &[u8] = if utf8 {
                            text[at + r].as_bytes()
                        } else {
                            &blobs[at + r]
                        };
                        assert_eq!(got, want, "row {} of column {root}", at + r);
                    }
                    decoded += 1;
                } else {
                    assert_eq!(version, WriterVersion::PARQUET_2_0);
                }
                at += n;
            }
            assert_eq!(at, rows);
        }
        if version == WriterVersion::PARQUET_1_0 {
            assert_eq!(decoded, 2 * metadata.num_row_groups());
        }
        // The reader agrees with the source data (the comparison above is
        // against the values written).
        let read = read_with_parquet(&file);
        assert_eq!(read, batch);
    }
}

/// Cases of the property tests: `SHARDFEED_PROPTEST_CASES`, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("SHARDFEED_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A column shape the own decoders handle.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Fixed(u8),
    List,
    Bytes(bool),
}

/// A table to write: column shapes (with nullability), rows, how many
/// distinct values, how many nulls (per mille), and the data's seed.
#[derive(Clone, Debug)]
struct Table {
    columns: Vec<(Shape, bool)>,
    rows: usize,
    distinct: u64,
    nulls: u64,
    seed: u64,
}

/// How parquet's writer writes it.
#[derive(Clone, Debug)]
struct Writer {
    v2: bool,
    dictionary: bool,
    dictionary_limit: usize,
    page_bytes: usize,
    page_rows: usize,
    codec: u8,
    group_rows: usize,
}

fn table_strategy() -> impl proptest::strategy::Strategy<Value = Table> {
    use proptest::prelude::*;
    let shape = prop_oneof![
        (0u8..10).prop_map(Shape::Fixed),
        Just(Shape::List),
        any::<bool>().prop_map(Shape::Bytes),
    ];
    (
        proptest::collection::vec((shape, any::<bool>()), 1..4),
        1usize..700,
        prop_oneof![Just(3u64), Just(40), Just(u64::MAX)],
        prop_oneof![Just(0u64), 0u64..500],
        any::<u64>(),
    )
        .prop_map(|(columns, rows, distinct, nulls, seed)| Table {
            columns,
            rows,
            distinct,
            nulls,
            seed,
        })
}

fn writer_strategy() -> impl proptest::strategy::Strategy<Value = Writer> {
    use proptest::prelude::*;
    (
        any::<bool>(),
        prop_oneof![Just(true), Just(true), Just(false)],
        prop_oneof![Just(64usize), Just(1024), Just(1 << 20)],
        prop_oneof![Just(256usize), Just(4096), Just(1 << 20)],
        prop_oneof![Just(17usize), Just(200), Just(20_000)],
        0u8..3,
        prop_oneof![Just(50usize), Just(333), Just(1000)],
    )
        .prop_map(
            |(v2, dictionary, dictionary_limit, page_bytes, page_rows, codec, group_rows)| Writer {
                v2,
                dictionary,
                dictionary_limit,
                page_bytes,
                page_rows,
                codec,
                group_rows,
            },
        )
}

/// The Arrow batch of `table`: every value a function of (seed, column, row).
fn build(table: &Table) -> arrow_array::RecordBatch {
    use arrow_array::*;
    use arrow_schema::{Field, Schema};
    let mix = |c: usize, r: usize, k: u64| {
        shardfeed_format::permute::hash_words(&[table.seed, c as u64, r as u64, k])
    };
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    for (c, &(shape, nullable)) in table.columns.iter().enumerate() {
        let valid = |r: usize| !nullable || mix(c, r, 1) % 1000 >= table.nulls;
        let value = |r: usize| {
            let v = mix(c, r, 2);
            if table.distinct == u64::MAX {
                v
            } else {
                v % table.distinct
            }
        };
        let rows = 0..table.rows;
        let array: ArrayRef = match shape {
            Shape::Fixed(k) => {
                let nulls = arrow_buffer::NullBuffer::from_iter(rows.clone().map(valid));
                let plain: ArrayRef = match k {
                    0 => Arc::new(Int8Array::from_iter_values(
                        rows.clone().map(|r| value(r) as i8),
                    )),
                    1 => Arc::new(Int16Array::from_iter_values(
                        rows.clone().map(|r| value(r) as i16),
                    )),
                    2 => Arc::new(Int32Array::from_iter_values(
                        rows.clone().map(|r| value(r) as i32),
                    )),
                    3 => Arc::new(Int64Array::from_iter_values(
                        rows.clone().map(|r| value(r) as i64),
                    )),
                    4 => Arc::new(UInt8Array::from_iter_values(
                        rows.clone().map(|r| value(r) as u8),
                    )),
                    5 => Arc::new(UInt16Array::from_iter_values(
                        rows.clone().map(|r| value(r) as u16),
                    )),
                    6 => Arc::new(UInt32Array::from_iter_values(
                        rows.clone().map(|r| value(r) as u32),
                    )),
                    7 => Arc::new(UInt64Array::from_iter_values(rows.clone().map(value))),
                    8 => Arc::new(Float32Array::from_iter_values(
                        rows.clone().map(|r| (value(r) % 100_000) as f32 * 0.25),
                    )),
                    _ => Arc::new(Float64Array::from_iter_values(
                        rows.clone().map(|r| value(r) as f64 / 7.0),
                    )),
                };
                if nullable {
                    make_array(
                        plain
                            .to_data()
                            .into_builder()
                            .nulls(Some(nulls))
                            .build()
                            .unwrap(),
                    )
                } else {
                    plain
                }
            }
            Shape::List => {
                // Nullable: null lists where the row is not valid, and a null
                // item now and then (definition levels up to 3).
                let item = Arc::new(Field::new("item", DataType::Int32, nullable));
                let mut offsets = vec![0i32];
                let (mut values, mut items_valid) = (Vec::new(), Vec::new());
                for r in rows.clone() {
                    let len = if valid(r) {
                        (mix(c, r, 3) % 12) as usize
                    } else {
                        0
                    };
                    values.extend((0..len).map(|i| (value(r) as i32).wrapping_add(i as i32)));
                    items_valid.extend((0..len).map(|i| !nullable || mix(c, r + i, 4) % 9 != 0));
                    offsets.push(values.len() as i32);
                }
                Arc::new(
                    ListArray::try_new(
                        item,
                        arrow_buffer::OffsetBuffer::new(offsets.into()),
                        Arc::new(Int32Array::new(
                            values.into(),
                            nullable.then(|| arrow_buffer::NullBuffer::from(items_valid)),
                        )),
                        nullable
                            .then(|| arrow_buffer::NullBuffer::from_iter(rows.clone().map(valid))),
                    )
                    .unwrap(),
                )
            }
            Shape::Bytes(utf8) => {
                let text = |r: usize| format!("{}-{}", value(r), "é".repeat(r % 9));
                let values = rows.clone().map(|r| valid(r).then(|| text(r)));
                if utf8 {
                    Arc::new(StringArray::from_iter(values))
                } else {
                    Arc::new(BinaryArray::from_iter(
                        values.map(|v| v.map(String::into_bytes)),
                    ))
                }
            }
        };
        fields.push(Field::new(
            format!("c{c}"),
            array.data_type().clone(),
            nullable,
        ));
        arrays.push(array);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

fn properties(w: &Writer) -> parquet::file::properties::WriterProperties {
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::{WriterProperties, WriterVersion};
    WriterProperties::builder()
        .set_writer_version(if w.v2 {
            WriterVersion::PARQUET_2_0
        } else {
            WriterVersion::PARQUET_1_0
        })
        .set_dictionary_enabled(w.dictionary)
        .set_dictionary_page_size_limit(w.dictionary_limit)
        .set_data_page_size_limit(w.page_bytes)
        .set_data_page_row_count_limit(w.page_rows)
        .set_write_batch_size(64)
        .set_compression(match w.codec {
            0 => Compression::UNCOMPRESSED,
            1 => Compression::ZSTD(ZstdLevel::default()),
            _ => Compression::SNAPPY,
        })
        .set_max_row_group_row_count(Some(w.group_rows))
        .build()
}

/// `array` in a form both readers' outputs share: dictionaries looked up,
/// views as offset arrays.
fn plain(array: &ArrayRef) -> ArrayRef {
    use arrow_array::{BinaryArray, StringArray};
    if let Some(d) = array.as_any_dictionary_opt() {
        return arrow_select::take::take(d.values(), d.keys(), None).unwrap();
    }
    match array.data_type() {
        DataType::BinaryView => Arc::new(BinaryArray::from_iter(array.as_binary_view().iter())),
        DataType::Utf8View => Arc::new(StringArray::from_iter(array.as_string_view().iter())),
        _ => array.clone(),
    }
}

/// Every row group of `file` through the own entry point and through
/// parquet's reader: the same values, or the own decoder's error when
/// `may_fail`; with `prefix`, only that fraction of each row group's first
/// rows is asked of the own entry point. Returns the paths taken.
fn compare(
    file: &Bytes,
    may_fail: bool,
    prefix: Option<f64>,
) -> std::result::Result<super::DecodePaths, String> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let arrow = ArrowReaderMetadata::load(file, Default::default()).map_err(|e| e.to_string())?;
    let roots: Vec<usize> = (0..arrow.schema().fields().len()).collect();
    let mut paths = super::DecodePaths::default();
    for rg in 0..arrow.metadata().num_row_groups() {
        let rows = arrow.metadata().row_group(rg).num_rows() as usize;
        let want = prefix.map(|f| ((rows as f64 * f) as usize).max(1));
        let ours =
            super::decode_row_group(Arc::new(file.clone()), &arrow, rg, &roots, want, &LIMITS);
        let ours = match ours {
            Ok((batches, p)) => {
                paths.add(&p);
                batches
            }
            Err(e) if may_fail => return Err(e.to_string()),
            Err(e) => panic!("row group {rg}: {e}"),
        };
        for batch in &ours {
            for column in batch.columns() {
                column.to_data().validate_full().expect("a valid array");
            }
        }
        // parquet's own reader may panic on mutated bytes: that is its
        // business (the own entry point turns such panics into errors).
        let theirs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ParquetRecordBatchReaderBuilder::new_with_metadata(file.clone(), arrow.clone())
                .with_row_groups(vec![rg])
                .build()
                .map(|r| r.collect::<std::result::Result<Vec<_>, _>>())
        }));
        let theirs: Vec<_> = match theirs {
            // (On corrupt levels its row count can even depend on its batch
            // size: a count other than the footer's is a refusal too.)
            Ok(Ok(Ok(batches)))
                if !may_fail || batches.iter().map(|b| b.num_rows()).sum::<usize>() == rows =>
            {
                batches
            }
            // parquet's reader refuses the bytes: nothing to compare with.
            _ if may_fail => continue,
            _ => panic!("parquet's reader failed on unmutated bytes"),
        };
        let ours_rows: usize = ours.iter().map(|b| b.num_rows()).sum();
        let theirs: Vec<_> = match want {
            Some(want) => super::prefix(theirs, want),
            None => theirs,
        };
        let theirs_rows: usize = theirs.iter().map(|b| b.num_rows()).sum();
        assert_eq!(ours_rows, theirs_rows, "row group {rg}");
        for c in 0..roots.len() {
            let column = |batches: &[arrow_array::RecordBatch]| {
                let parts: Vec<ArrayRef> = batches.iter().map(|b| plain(b.column(c))).collect();
                let parts: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                arrow_select::concat::concat(&parts).unwrap()
            };
            assert_eq!(
                column(&ours).to_data(),
                column(&theirs).to_data(),
                "row group {rg}, column {c}"
            );
        }
    }
    Ok(paths)
}

/// `table` written as `writer` says, with `mutations` (where in the column
/// chunks' bytes, how, what value) applied, through [`compare`]: `Err` when
/// either side panicked or their values differ.
fn mutated_compare(
    table: &Table,
    writer: &Writer,
    mutations: &[(f64, u8, u8)],
) -> std::thread::Result<()> {
    let batch = build(table);
    let (file, arrow) = write_parquet(&batch, Some(properties(writer)));
    // The byte range of the row groups' column chunks.
    let metadata = arrow.metadata();
    let start = metadata.row_group(0).column(0).byte_range().0 as usize;
    let last = metadata.row_group(metadata.num_row_groups() - 1);
    let (s, l) = last.column(last.num_columns() - 1).byte_range();
    let end = (s + l) as usize;
    let mut bytes = file.to_vec();
    for &(at, how, value) in mutations {
        let at = start + ((end - start) as f64 * at) as usize;
        match how {
            0 => bytes[at] ^= 1 << (value % 8),
            1 => bytes[at] = value,
            2 => bytes[at] = 0xff,
            _ => bytes[at] = bytes[at].wrapping_add(1),
        }
    }
    let mutated = Bytes::from(bytes);
    std::panic::catch_unwind(|| compare(&mutated, true, None)).map(|_| ())
}

/// A mutated delta-packed page found by the property test below: the own
/// decoders give parquet's reader's values (or refuse the page).
#[test]
fn a_mutated_delta_page_gives_an_error_or_the_same_values() {
    let table = Table {
        columns: vec![(Shape::Bytes(false), true), (Shape::Fixed(4), true)],
        rows: 46,
        distinct: u64::MAX,
        nulls: 0,
        seed: 3956146754266629892,
    };
    let writer = Writer {
        v2: true,
        dictionary: true,
        dictionary_limit: 64,
        page_bytes: 256,
        page_rows: 17,
        codec: 0,
        group_rows: 50,
    };
    assert!(mutated_compare(&table, &writer, &[(0.9689341851144311, 3, 0)]).is_ok());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: cases(256), ..Default::default() })]

    /// The own decoders give parquet's reader's values for random tables of
    /// the supported shapes, written with random writer settings (V1/V2
    /// pages, page and row group sizes, dictionaries on, off and falling
    /// back, three codecs), whole row groups or their first rows; V1 files
    /// take the own path for every column, V2 files for fixed-width ones.
    #[test]
    fn own_decoders_equal_parquets_reader_on_random_tables(
        table in table_strategy(),
        writer in writer_strategy(),
        prefix in proptest::option::of(0.0f64..1.0),
    ) {
        let batch = build(&table);
        let (file, _) = write_parquet(&batch, Some(properties(&writer)));
        let paths = compare(&file, false, prefix).unwrap();
        // Fixed-width columns take it under V2 too (their fallback is
        // DELTA_BINARY_PACKED or PLAIN).
        if !writer.v2 || table.columns.iter().all(|(s, _)| matches!(s, Shape::Fixed(_))) {
            proptest::prop_assert_eq!(paths.parquet, 0, "{:?}", paths);
        }
    }

    /// Bytes of a column chunk's page headers and pages flipped or rewritten:
    /// the own decoders give an error or valid arrays equal to what parquet's
    /// reader makes of the same bytes; never a panic, a hang or an invalid
    /// array (under arrow's force_validate).
    #[test]
    fn mutated_pages_give_errors_or_the_same_values(
        table in table_strategy(),
        writer in writer_strategy(),
        mutations in proptest::collection::vec((0.0f64..1.0, 0u8..4, proptest::prelude::any::<u8>()), 1..4),
    ) {
        proptest::prop_assert!(mutated_compare(&table, &writer, &mutations).is_ok(), "a panic on mutated bytes");
    }
}

mod lists;
