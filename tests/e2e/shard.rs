//! `shardfeed shard`, `inspect` and `verify` on local files.

use std::path::Path;

use arrow_array::RecordBatch;
use parquet::basic::{BrotliLevel, Compression, Encoding, GzipLevel, ZstdLevel};
use shardfeed_fixtures::{FileFormat, Kind, batch, write_dataset};

use crate::support::*;

/// `shardfeed shard INPUTS... --output OUT EXTRA...` as arguments.
fn shard_args(inputs: &[String], out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec!["shard".into()];
    args.extend(inputs.iter().cloned());
    args.extend(["--output".to_string(), s(out)]);
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// Task `index` of 4 of a split run: `shard_args` plus the split options.
fn task_args(inputs: &[String], out: &Path, extra: &[&str], index: usize) -> Vec<String> {
    let mut args = shard_args(inputs, out, extra);
    args.extend(["--num-tasks", "4", "--task-index"].map(String::from));
    args.push(index.to_string());
    args
}

/// Shard `inputs` into `out` with small shards and row groups so that every
/// run exercises several of each.
fn shard_small(inputs: &[String], out: &Path, extra: &[&str]) -> Run {
    let mut args = shard_args(
        inputs,
        out,
        &["--shard-size", "32KiB", "--row-group-rows", "300", "--json"],
    );
    args.extend(extra.iter().map(|a| a.to_string()));
    shardfeed(&args)
}

fn generated(dir: &Path, kind: Kind, rows: u64, files: usize, format: FileFormat) -> Vec<String> {
    write_dataset(dir, kind, rows, files, 7, format)
        .unwrap()
        .iter()
        .map(|p| s(p))
        .collect()
}

#[test]
fn parquet_inputs_of_every_codec_round_trip_every_type() {
    let rows = 1000;
    let expected = batch(Kind::KitchenSink, 0, rows as usize, 7);
    for codec in [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::GZIP(GzipLevel::default()),
        Compression::LZ4_RAW,
        Compression::LZ4,
        Compression::BROTLI(BrotliLevel::default()),
        Compression::ZSTD(ZstdLevel::default()),
    ] {
        let tmp = tempdir();
        let inputs = generated(
            &tmp.path().join("in"),
            Kind::KitchenSink,
            rows,
            3,
            FileFormat::Parquet(codec),
        );
        let out = tmp.path().join("ds");
        let summary = shard_small(&inputs, &out, &[]).success().json();
        assert_eq!(summary["rows"], rows, "{codec:?}");
        let (manifest, shards) = read_dataset(&out);
        assert!(shards.len() > 1, "{codec:?}: expected several shards");
        assert_same_rows(&read_all(&out), &expected);
        assert_eq!(manifest.schema.fields(), expected.schema().fields());
    }
}

/// `(compressed, stored as is)` data pages of `column` in every shard of `ds`;
/// panics on a V1 data page.
fn data_pages(ds: &Path, column: &str) -> (usize, usize) {
    use parquet::column::page::Page;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let (mut compressed, mut raw) = (0, 0);
    for entry in manifest(ds).shards {
        let file = std::fs::File::open(ds.join(&entry.path)).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let leaf = reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .position(|c| c.path().parts()[0] == column)
            .unwrap();
        for rg in 0..reader.num_row_groups() {
            let row_group = reader.get_row_group(rg).unwrap();
            for page in row_group.get_column_page_reader(leaf).unwrap() {
                match page.unwrap() {
                    Page::DataPageV2 { is_compressed, .. } if is_compressed => compressed += 1,
                    Page::DataPageV2 { .. } => raw += 1,
                    Page::DataPage { .. } => panic!("{column}: a V1 data page"),
                    Page::DictionaryPage { .. } => {}
                }
            }
        }
    }
    (compressed, raw)
}

#[test]
fn data_pages_zstd_cannot_shrink_are_stored_as_they_are() {
    // V2 data pages, zstd-compressed unless zstd saves under 10% of a page
    // (random bytes): those are stored as they are, and readers skip a copy.
    let tmp = tempdir();
    let images = sharded(&tmp.path().join("images"), Kind::Images, 60, 8, 4 << 20);
    let (compressed, raw) = data_pages(Path::new(&images), "image");
    assert_eq!(compressed, 0, "random image bytes compressed");
    assert!(raw > 0);
    // (Row groups of 1000 rows: in row groups of 100 the dictionary holds
    // most ids and the keys barely compress.)
    let tokens = sharded(
        &tmp.path().join("tokens"),
        Kind::Tokens,
        2000,
        1000,
        4 << 20,
    );
    let (compressed, raw) = data_pages(Path::new(&tokens), "input_ids");
    assert!(compressed > 0, "zipf-like token ids not compressed");
    assert_eq!(raw, 0, "token id pages stored uncompressed");
}

#[test]
fn arrow_ipc_file_and_stream_inputs_round_trip() {
    let rows = 900;
    let expected = batch(Kind::KitchenSink, 0, rows as usize, 7);
    for format in [FileFormat::IpcFile, FileFormat::IpcStream] {
        let tmp = tempdir();
        let inputs = generated(&tmp.path().join("in"), Kind::KitchenSink, rows, 2, format);
        let out = tmp.path().join("ds");
        shard_small(&inputs, &out, &[]).success();
        assert_same_rows(&read_all(&out), &expected);
    }
}

/// Read JSON Lines or CSV inputs with the reference Arrow readers.
fn read_text_inputs(inputs: &[String], schema: arrow_schema::SchemaRef, csv: bool) -> RecordBatch {
    let mut batches = Vec::new();
    for input in inputs {
        let file = std::fs::File::open(input).unwrap();
        if csv {
            let reader = arrow_csv::ReaderBuilder::new(schema.clone())
                .with_header(true)
                .build(file)
                .unwrap();
            batches.extend(reader.map(|b| b.unwrap()));
        } else {
            let reader = arrow_json::ReaderBuilder::new(schema.clone())
                .build(std::io::BufReader::new(file))
                .unwrap();
            batches.extend(reader.map(|b| b.unwrap()));
        }
    }
    concat(&batches)
}

#[test]
fn json_lines_and_csv_inputs_round_trip_with_inferred_schemas() {
    for (format, csv) in [(FileFormat::JsonLines, false), (FileFormat::Csv, true)] {
        let tmp = tempdir();
        let inputs = generated(&tmp.path().join("in"), Kind::Text, 2000, 3, format);
        let out = tmp.path().join("ds");
        shard_small(&inputs, &out, &[]).success();
        let actual = read_all(&out);
        let expected = read_text_inputs(&inputs, actual.schema(), csv);
        assert_eq!(actual.num_rows(), 2000);
        assert_same_rows(&actual, &expected);
        // Ids survive inference as integers, in input order.
        assert_eq!(ids(&actual), (0..2000).collect::<Vec<i64>>());
    }
}

#[test]
fn json_lines_with_a_given_schema_keeps_it() {
    let tmp = tempdir();
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::Text,
        500,
        1,
        FileFormat::JsonLines,
    );
    let schema = Kind::Text.schema();
    let schema_file = tmp.path().join("schema.json");
    std::fs::write(&schema_file, serde_json::to_vec(schema.as_ref()).unwrap()).unwrap();
    let out = tmp.path().join("ds");
    shard_small(&inputs, &out, &["--schema", &s(&schema_file)]).success();
    assert_same_rows(&read_all(&out), &batch(Kind::Text, 0, 500, 7));
}

/// A folder input becomes one row per file, byte for byte; files compressed
/// already (here by their `.jpg` names) keep their bytes column
/// uncompressed and without a dictionary, other files get zstd.
#[test]
fn a_folder_of_files_becomes_one_row_per_file_with_labels() {
    let tmp = tempdir();
    let root = tmp.path().join("images");
    let files = shardfeed_fixtures::write_image_folder(&root, 120, 4, 3).unwrap();
    let jpegs = tmp.path().join("jpegs");
    for f in &files {
        let to = jpegs.join(f.strip_prefix(&root).unwrap().with_extension("jpg"));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(f, to).unwrap();
    }
    for (folder, ext, codec) in [
        (&root, "bin", Compression::ZSTD(ZstdLevel::default())),
        (&jpegs, "jpg", Compression::UNCOMPRESSED),
    ] {
        let out = tmp.path().join(format!("ds-{ext}"));
        // In input order (--no-shuffle): one row per file, in path order.
        shard_small(&[s(folder)], &out, &["--no-shuffle"]).success();
        let all = read_all(&out);
        assert_eq!(all.num_rows(), files.len());
        let col = |name: &str| all.column_by_name(name).unwrap().clone();
        let paths = col("path");
        let paths = paths
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap();
        let labels = col("label");
        let labels = labels
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap();
        let bytes = col("bytes");
        let bytes = bytes
            .as_any()
            .downcast_ref::<arrow_array::BinaryArray>()
            .unwrap();
        let mut sorted: Vec<_> = files
            .iter()
            .map(|p| p.strip_prefix(&root).unwrap().with_extension(ext))
            .collect();
        sorted.sort();
        for (i, rel) in sorted.iter().enumerate() {
            assert_eq!(paths.value(i), rel.to_str().unwrap());
            assert_eq!(labels.value(i), rel.parent().unwrap().to_str().unwrap());
            assert_eq!(
                bytes.value(i),
                std::fs::read(folder.join(rel)).unwrap().as_slice()
            );
        }
        let zstd = matches!(codec, Compression::ZSTD(_));
        assert_codecs(&out, &[("path", true), ("bytes", zstd)]);
    }
}

/// The chunk metadata of leaf column `name` (a dotted path) in every row
/// group of every shard of `dataset`, in order.
fn column_chunks(dataset: &Path, name: &str) -> Vec<parquet::file::metadata::ColumnChunkMetaData> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let mut chunks = Vec::new();
    for shard in &manifest(dataset).shards {
        let file = std::fs::File::open(dataset.join(&shard.path)).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        for group in reader.metadata().row_groups() {
            let column = group
                .columns()
                .iter()
                .find(|c| c.column_path().string() == name)
                .unwrap_or_else(|| panic!("no column {name}"));
            chunks.push(column.clone());
        }
    }
    chunks
}

/// Every row group of every shard of `dataset` stores each named leaf
/// column with zstd or, if not, uncompressed and without a dictionary.
fn assert_codecs(dataset: &Path, expected: &[(&str, bool)]) {
    for &(name, zstd) in expected {
        for column in column_chunks(dataset, name) {
            let compression = column.compression();
            assert_eq!(
                matches!(compression, Compression::ZSTD(_)),
                zstd,
                "{name}: {compression}"
            );
            if !zstd {
                assert_eq!(compression, Compression::UNCOMPRESSED, "{name}");
                assert!(column.dictionary_page_offset().is_none(), "{name}");
            }
        }
    }
}

/// A Parquet input's binary columns that hold compressed images (JPEG, PNG,
/// WebP, GIF by their first bytes; top level, or in a struct as Hugging
/// Face stores `image: {bytes, path}`) are stored uncompressed, as are
/// large distinct values zstd cannot shrink (noise without a signature);
/// other binary columns keep zstd; large distinct values (binary or text)
/// get no dictionary page, short repeated strings keep theirs; every row
/// comes back byte for byte.
#[test]
fn image_columns_of_a_parquet_input_are_stored_as_they_are() {
    use arrow_array::{ArrayRef, BinaryArray, Int64Array, StringArray, StructArray};
    use arrow_schema::{DataType, Field};
    use std::sync::Arc;
    let tmp = tempdir();
    let n = 200usize;
    let mut g = 0x9E37_79B9_7F4A_7C15u64;
    let mut noise = |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                g ^= g << 13;
                g ^= g >> 7;
                g ^= g << 17;
                g as u8
            })
            .collect()
    };
    let signatures: [&[u8]; 4] = [
        b"\xFF\xD8\xFF\xE0",
        b"\x89PNG\r\n\x1a\n",
        b"RIFF\x10\x27\x00\x00WEBPVP8 ",
        b"GIF89a",
    ];
    let mut image = |i: usize| {
        let mut v = signatures[i % 4].to_vec();
        v.extend(noise(3000 + i * 7));
        v
    };
    let images: Vec<Vec<u8>> = (0..n).map(&mut image).collect();
    let nested: Vec<Vec<u8>> = (1..=n).map(&mut image).collect();
    // Not images: the same noise without a signature.
    let blobs: Vec<Vec<u8>> = (0..n).map(|i| image(i)[12..].to_vec()).collect();
    // Not images either, and compressible: serialised records.
    let records: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("record {i}: {}", "field=value; ".repeat(100 + i % 9)).into_bytes())
        .collect();
    let bin = |v: &[Vec<u8>]| -> ArrayRef {
        Arc::new(BinaryArray::from_iter_values(
            v.iter().map(|b| b.as_slice()),
        ))
    };
    let paths: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..n).map(|i| format!("img/{i}.jpg")),
    ));
    let hf = StructArray::from(vec![
        (
            Arc::new(Field::new("bytes", DataType::Binary, false)),
            bin(&nested),
        ),
        (Arc::new(Field::new("path", DataType::Utf8, false)), paths),
    ]);
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
        ),
        ("photo", bin(&images)),
        ("image", Arc::new(hf) as ArrayRef),
        ("blob", bin(&blobs)),
        ("record", bin(&records)),
        (
            "doc",
            Arc::new(StringArray::from_iter_values((0..n).map(|i| {
                format!("document {i}: ") + &"words and more words ".repeat(60 + i % 7)
            }))) as ArrayRef,
        ),
        (
            "tag",
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| format!("tag-{}", i % 5)),
            )) as ArrayRef,
        ),
    ])
    .unwrap();
    let input = tmp.path().join("in.parquet");
    write_parquet(&input, &batch);
    let out = tmp.path().join("ds");
    shard_small(&[s(&input)], &out, &[]).success();
    assert_same_rows(&read_all(&out), &batch);
    assert_codecs(
        &out,
        &[
            ("id", true),
            ("photo", false),
            ("image.bytes", false),
            ("image.path", true),
            ("blob", false),
            ("record", true),
            ("doc", true),
            ("tag", true),
        ],
    );
    let dictionary = |name: &str| -> Vec<bool> {
        column_chunks(&out, name)
            .iter()
            .map(|c| c.dictionary_page_offset().is_some())
            .collect()
    };
    for name in ["blob", "record", "doc"] {
        assert!(
            dictionary(name).iter().all(|d| !d),
            "{name} has a dictionary page"
        );
    }
    assert!(
        dictionary("tag").iter().all(|d| *d),
        "tag lost its dictionary"
    );
    // The documents still compress: their pages are zstd-compressed.
    assert!(data_pages(&out, "doc").0 > 0);
}

/// With the default shuffle, a folder's files are put in a seeded random
/// order before they are read (no external shuffle: nothing spilled): every
/// file once, bytes intact, the same order for the same seed, another for
/// another seed, and far from the sorted order.
#[test]
fn a_folder_input_is_shuffled_by_permuting_its_files() {
    let tmp = tempdir();
    let root = tmp.path().join("images");
    let files = shardfeed_fixtures::write_image_folder(&root, 300, 5, 3).unwrap();
    let order = |name: &str, extra: &[&str]| -> Vec<String> {
        let out = tmp.path().join(name);
        shard_small(&[s(&root)], &out, extra).success();
        let all = read_all(&out);
        let paths = all.column_by_name("path").unwrap().clone();
        let paths = paths
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap();
        let bytes = all.column_by_name("bytes").unwrap().clone();
        let bytes = bytes
            .as_any()
            .downcast_ref::<arrow_array::BinaryArray>()
            .unwrap();
        (0..all.num_rows())
            .map(|i| {
                let p = paths.value(i).to_string();
                assert_eq!(bytes.value(i), std::fs::read(root.join(&p)).unwrap());
                p
            })
            .collect()
    };
    // Nothing is spilled: a temporary folder that cannot be created is never
    // asked for (a tabular input's external shuffle fails on it, below).
    let a = order(
        "a",
        &["--seed", "1", "--temp-dir", "/nonexistent/shardfeed-tmp"],
    );
    let b = order("b", &["--seed", "1"]);
    let c = order("c", &["--seed", "2"]);
    assert_eq!(a, b);
    assert_ne!(a, c);
    let mut sorted = a.clone();
    sorted.sort();
    let mut want: Vec<String> = files
        .iter()
        .map(|p| {
            p.strip_prefix(&root)
                .unwrap()
                .to_str()
                .unwrap()
                .replace('\\', "/")
        })
        .collect();
    want.sort();
    assert_eq!(sorted, want, "every file once");
    // Far from input order: few neighbours in the output were neighbours
    // in the sorted input.
    let rank: std::collections::HashMap<&String, usize> =
        sorted.iter().enumerate().map(|(i, p)| (p, i)).collect();
    let adjacent = a
        .windows(2)
        .filter(|w| rank[&w[0]].abs_diff(rank[&w[1]]) == 1)
        .count();
    assert!(adjacent < 10, "{adjacent} of 299 neighbours kept");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("a/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["options"]["shuffle_seed"], 1);
    let table = tmp.path().join("table");
    let inputs = generated(
        &table,
        Kind::KitchenSink,
        500,
        2,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let failed = shard_small(
        &inputs,
        &tmp.path().join("d"),
        &["--temp-dir", "/nonexistent/shardfeed-tmp"],
    )
    .failure();
    assert!(
        failed.stderr.contains("cannot create a temporary folder"),
        "{}",
        failed.stderr
    );
}

/// Three snappy Parquet files of 600 generated text rows in `tmp/in`, and
/// those rows.
fn text_parquet_inputs(tmp: &Path) -> (std::path::PathBuf, RecordBatch) {
    let dir = tmp.join("in");
    generated(
        &dir,
        Kind::Text,
        600,
        3,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    (dir, batch(Kind::Text, 0, 600, 7))
}

#[test]
fn globs_and_folders_of_parquet_files_expand_in_sorted_order() {
    let tmp = tempdir();
    let (dir, expected) = text_parquet_inputs(tmp.path());
    std::fs::write(dir.join("_SUCCESS"), b"").unwrap();
    // In input order (--no-shuffle): rows as the inputs expand.
    let stored = |dir: &Path| concat(&read_dataset(dir).1);
    let by_glob = tmp.path().join("glob");
    shard_small(
        &[format!("{}/*.parquet", s(&dir))],
        &by_glob,
        &["--no-shuffle"],
    )
    .success();
    assert_same_rows(&stored(&by_glob), &expected);
    let by_folder = tmp.path().join("folder");
    shard_small(&[s(&dir)], &by_folder, &["--no-shuffle"]).success();
    assert_same_rows(&stored(&by_folder), &expected);
}

/// A shardfeed dataset given to `shard` again (its folder, or its manifest),
/// and a local index: their shards or indexed files are the inputs, in the
/// manifest's order, not its `manifest.json` read as JSON Lines (which
/// failed on the manifest's first line).
#[test]
fn a_dataset_or_an_index_given_to_shard_is_sharded_again() {
    let tmp = tempdir();
    let (dir, expected) = text_parquet_inputs(tmp.path());
    let stored = |dir: &Path| concat(&read_dataset(dir).1);
    let first = tmp.path().join("first");
    shard_small(&[s(&dir)], &first, &["--no-shuffle"]).success();
    let again = tmp.path().join("again");
    let smaller = [
        "--no-shuffle",
        "--shard-size",
        "8KiB",
        "--row-group-rows",
        "100",
    ];
    shardfeed(&shard_args(&[s(&first)], &again, &smaller)).success();
    assert_same_rows(&stored(&again), &expected);
    let by_manifest = tmp.path().join("by-manifest");
    let first_manifest = s(&first.join("manifest.json"));
    shard_small(&[first_manifest], &by_manifest, &["--no-shuffle"]).success();
    assert_same_rows(&stored(&by_manifest), &expected);
    let index = tmp.path().join("index");
    shardfeed(&["index", &s(&dir), "-o", &s(&index)]).success();
    let from_index = tmp.path().join("from-index");
    shard_small(&[s(&index)], &from_index, &["--no-shuffle"]).success();
    assert_same_rows(&stored(&from_index), &expected);
    // A manifest.json among other data that is not shardfeed's is data.
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("manifest.json"), "{\"id\": 1}\n{\"id\": 2}\n").unwrap();
    let out = tmp.path().join("other-out");
    shard_small(&[s(&other)], &out, &["--no-shuffle"]).success();
    assert_eq!(manifest(&out).total_rows, 2);
}

#[test]
fn pyarrow_reads_the_shards() {
    let tmp = tempdir();
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::KitchenSink,
        800,
        2,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let out = tmp.path().join("ds");
    shard_small(&inputs, &out, &[]).success();
    let script = r#"
import json, sys, pyarrow.parquet as pq
m = json.load(open(sys.argv[1] + "/manifest.json"))
ids, groups = [], 0
for shard in m["shards"]:
    f = pq.ParquetFile(sys.argv[1] + "/" + shard["path"])
    assert f.metadata.num_rows == shard["rows"], shard
    assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == shard["row_groups"]
    t = f.read()
    ids += t.column("id").to_pylist()
    groups += f.num_row_groups
    # Values pyarrow decodes itself: a nested list, a struct, a map, a zoned timestamp.
    assert str(t.schema.field("ts").type) == "timestamp[us, tz=Europe/Paris]", t.schema.field("ts").type
    assert str(t.schema.field("dec").type) == "decimal128(38, 4)"
print(json.dumps({"ids": ids, "groups": groups, "first_s": t.column("s").to_pylist()[:3]}))
"#;
    let output = python()
        .arg("-c")
        .arg(script)
        .arg(s(&out))
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "pyarrow (a standard reader) failed to read the shards; .ci/run installs it:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut got: Vec<i64> = result["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, (0..800).collect::<Vec<i64>>());
    assert_eq!(
        result["groups"].as_u64().unwrap() as usize,
        manifest(&out).row_group_count()
    );
}

#[test]
fn output_is_byte_identical_across_runs_and_thread_counts() {
    let tmp = tempdir();
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::Tokens,
        600,
        5,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    for shuffle in [false, true] {
        let mut snapshots = Vec::new();
        for threads in ["1", "3", "3"] {
            let out = tmp
                .path()
                .join(format!("ds-{shuffle}-{threads}-{}", snapshots.len()));
            let mut extra = vec![
                "--threads",
                threads,
                "--shard-size",
                "256KiB",
                "--row-group-rows",
                "50",
            ];
            if shuffle {
                extra.extend(["--shuffle", "--seed", "11", "--memory-budget", "16MiB"]);
            }
            shardfeed(&shard_args(&inputs, &out, &extra)).success();
            snapshots.push(snapshot(&out));
        }
        assert!(snapshots[0].len() > 3, "expected several shards");
        assert!(
            snapshots.windows(2).all(|w| w[0] == w[1]),
            "shuffle={shuffle}: outputs differ"
        );
    }
}

#[test]
fn verify_and_inspect_report_and_catch_corruption() {
    let tmp = tempdir();
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::Tokens,
        400,
        2,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let out = tmp.path().join("ds");
    shardfeed(&[
        "shard".to_string(),
        inputs[0].clone(),
        inputs[1].clone(),
        "-o".into(),
        s(&out),
        "--shard-size".into(),
        "512KiB".into(),
        "--row-group-rows".into(),
        "40".into(),
    ])
    .success();
    let verified = shardfeed(&["verify", &s(&out), "--json"]).success().json();
    assert_eq!(verified["rows"], 400);
    assert_eq!(verified["problems"].as_array().unwrap().len(), 0);
    let inspected = shardfeed(&["inspect", &s(&out), "--json"]).success().json();
    let m = manifest(&out);
    assert_eq!(inspected["rows"], 400);
    assert_eq!(inspected["shards"], m.shards.len());
    assert!(inspected["compression_ratio"].as_f64().unwrap() > 1.0);
    let text = shardfeed(&["inspect", &s(&out)]).success().stdout;
    assert!(text.contains("input_ids: List"), "{text}");

    // Flip one byte in the middle of the second shard: verify names it and fails.
    let victim = &m.shards[1];
    let path = out.join(&victim.path);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&path, &bytes).unwrap();
    let run = shardfeed(&["verify", &s(&out)]);
    assert!(!run.ok);
    assert!(run.stderr.contains(&victim.path), "{}", run.stderr);
    assert!(run.stderr.contains("row group"), "{}", run.stderr);
    assert!(!run.stderr.contains(&m.shards[0].path), "{}", run.stderr);
    // Verify streams each file: damage past the last row group's bytes (in
    // the page indexes, before the footer) is the file's checksum error.
    bytes[middle] ^= 0x5a;
    let last = bytes.len() - victim.footer_len as usize - 1;
    bytes[last] ^= 0x5a;
    std::fs::write(&path, &bytes).unwrap();
    let run = shardfeed(&["verify", &s(&out)]);
    assert!(!run.ok);
    assert!(run.stderr.contains(&victim.path), "{}", run.stderr);
    assert!(run.stderr.contains("checksum"), "{}", run.stderr);

    // A missing shard is named too.
    std::fs::remove_file(out.join(&m.shards[0].path)).unwrap();
    let run = shardfeed(&["verify", &s(&out)]);
    assert!(!run.ok);
    assert!(
        run.stderr.contains(&m.shards[0].path) && run.stderr.contains("missing"),
        "{}",
        run.stderr
    );
}

#[test]
fn killing_shard_never_leaves_a_broken_dataset_and_a_rerun_completes() {
    let tmp = tempdir();
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::Tokens,
        3000,
        6,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let out = tmp.path().join("ds");
    // The shuffle's spill folders of the killed runs stay in the test's
    // folder, not in the system's temporary folder.
    let spill = tmp.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let args = shard_args(
        &inputs,
        &out,
        &[
            "--shard-size",
            "256KiB",
            "--row-group-rows",
            "64",
            "--threads",
            "2",
            "--temp-dir",
            &s(&spill),
        ],
    );
    // Killed (an abrupt exit, as SIGKILL) at points spread across a run:
    // mid-shard, after the first and the fourth shard, just before the
    // manifest. None leaves a manifest; each leaves its staging files.
    for point in [
        "shard-appended=exit@3",
        "shard-published=exit@0",
        "shard-appended=exit@20",
        "shard-published=exit@4",
        "manifest=exit@0",
    ] {
        let run = Run::from_command(bin().args(&args).env("SHARDFEED_FAILPOINTS", point));
        assert_eq!(run.code, Some(137), "{point}: {}", run.stderr);
        assert!(!out.join("manifest.json").exists(), "{point}");
        assert!(
            out.join("_shardfeed.lock").exists(),
            "{point}: the lock stays"
        );
    }
    // A panic inside an encoder thread (parquet's writer or the dictionary
    // encoder) is that row group's error, not a crash of the process.
    let run = Run::from_command(
        bin()
            .args(&args)
            .env("SHARDFEED_FAILPOINTS", "encode=panic@2"),
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("row group 2") && run.stderr.contains("the encoder panicked"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("RUST_BACKTRACE"), "{}", run.stderr);
    // The interrupted output holds no manifest; the same command completes it,
    // and removes its own spill folder (the killed runs could not).
    assert!(!out.join("manifest.json").exists());
    let before = std::fs::read_dir(&spill).unwrap().count();
    shardfeed(&args).success();
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), before);
    shardfeed(&["verify", &s(&out)]).success();
    let all = read_all(&out);
    assert_eq!(ids(&all), (0..3000).collect::<Vec<i64>>());
    // No leftovers from the killed runs: every file under shards/ is listed.
    let listed: std::collections::HashSet<String> = manifest(&out)
        .shards
        .iter()
        .map(|s| s.path.clone())
        .collect();
    for entry in std::fs::read_dir(out.join("shards")).unwrap() {
        let name = format!("shards/{}", entry.unwrap().file_name().to_string_lossy());
        assert!(listed.contains(&name), "stale file {name}");
    }
}

#[test]
fn bad_inputs_fail_cleanly_naming_the_file_and_leave_no_manifest() {
    let tmp = tempdir();
    let dir = tmp.path();
    let out = dir.join("ds");
    let check = |inputs: Vec<String>, extra: &[&str], expect: &[&str]| {
        let run = shardfeed(&shard_args(&inputs, &out, extra)).failure();
        for needle in expect {
            assert!(
                run.stderr.contains(needle),
                "expected {needle:?} in:\n{}",
                run.stderr
            );
        }
        assert!(!out.join("manifest.json").exists());
    };

    // A malformed JSON line: named with its line number.
    let good = dir.join("good.jsonl");
    std::fs::write(&good, "{\"a\": 1}\n{\"a\": 2}\n").unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"a\": 1}\n{\"a\": 2}\n{\"a\": 3\n{\"a\": 4}\n").unwrap();
    check(vec![s(&good), s(&bad)], &[], &["bad.jsonl", "line 3"]);

    // A truncated Parquet file.
    let pq = generated(
        &dir.join("pq"),
        Kind::Text,
        100,
        1,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let bytes = std::fs::read(&pq[0]).unwrap();
    let truncated = dir.join("truncated.parquet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    check(
        vec![pq[0].clone(), s(&truncated)],
        &[],
        &["truncated.parquet"],
    );

    // A CSV row with the wrong number of fields.
    let csv = dir.join("rows.csv");
    std::fs::write(&csv, "a,b,c\n1,2,3\n4,5\n6,7,8\n").unwrap();
    check(vec![s(&csv)], &[], &["rows.csv", "line 3"]);
    // The same with CRLF line ends, blank lines and a quoted field across
    // two lines before it: still the line the record starts on.
    std::fs::write(&csv, "a,b,c\r\n1,\"x\r\ny\",3\r\n\r\n4,5\r\n6,7,8\r\n").unwrap();
    check(
        vec![s(&csv)],
        &[],
        &["rows.csv", "line 5", "2 fields, the header 3"],
    );
    // A field that is not UTF-8 (after a multi-byte character cut by
    // nothing): named by its line and field.
    let mut bytes = "a,b\r\n\"x\u{e9}\r\n\u{e9}\",1\r\n".as_bytes().to_vec();
    bytes.extend_from_slice(b"2,\xff\r\n");
    std::fs::write(&csv, bytes).unwrap();
    check(
        vec![s(&csv)],
        &[],
        &["rows.csv", "line 4", "field 2 is not UTF-8"],
    );
    // A JSON line that is valid JSON but not an object: named by its line.
    std::fs::write(&bad, "{\"a\": 1}\n\n[1, 2]\n").unwrap();
    check(vec![s(&bad)], &[], &["bad.jsonl", "line 3", "not an array"]);
    // A field a list in one line and an object in a later one: that line.
    std::fs::write(&bad, "{\"a\": [1]}\n{\"a\": [2]}\n{\"a\": {\"b\": 1}}\n").unwrap();
    check(vec![s(&bad)], &[], &["bad.jsonl", "line 3", "json type"]);

    // A missing input.
    check(
        vec![s(&dir.join("nope.parquet"))],
        &[],
        &["nope.parquet", "does not exist"],
    );

    // An unwritable output (a path under a regular file).
    let blocker = dir.join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let run = shardfeed(&["shard", &pq[0], "--output", &s(&blocker.join("ds"))]).failure();
    assert!(run.stderr.contains(&s(&blocker)), "{}", run.stderr);

    // An empty input: a zero-byte file, and a file with a header but no rows.
    let empty = dir.join("empty.csv");
    std::fs::write(&empty, b"").unwrap();
    check(vec![s(&empty)], &[], &["empty.csv", "empty"]);
    let header_only = dir.join("header.csv");
    std::fs::write(&header_only, "a,b\n").unwrap();
    check(vec![s(&header_only)], &[], &["header.csv", "no rows"]);

    // Two inputs whose schemas differ: both named, with the first differing field.
    let other = generated(
        &dir.join("other"),
        Kind::Tabular,
        10,
        1,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    check(
        vec![pq[0].clone(), other[0].clone()],
        &[],
        &[&pq[0], &other[0], "field"],
    );

    // An existing dataset without --overwrite; with it, the run replaces it.
    shardfeed(&["shard", &pq[0], "--output", &s(&out)]).success();
    let run = shardfeed(&["shard", &pq[0], "--output", &s(&out)]).failure();
    assert!(run.stderr.contains("--overwrite"), "{}", run.stderr);
    shardfeed(&["shard", &pq[0], "--output", &s(&out), "--overwrite"]).success();
    shardfeed(&["verify", &s(&out)]).success();

    // A bad option is named.
    let run = shardfeed(&[
        "shard",
        &pq[0],
        "--output",
        &s(&dir.join("x")),
        "--zstd-level",
        "40",
    ])
    .failure();
    assert!(run.stderr.contains("--zstd-level"), "{}", run.stderr);
}

/// Run a shuffled shard of `rows` token rows under `budget`; returns (summary, dataset dir).
fn shuffled_run(dir: &Path, rows: u64, budget: &str) -> (serde_json::Value, std::path::PathBuf) {
    let inputs = generated(
        &dir.join(format!("in-{rows}")),
        Kind::Tokens,
        rows,
        4,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let out = dir.join(format!("ds-{rows}"));
    let args = shard_args(
        &inputs,
        &out,
        &[
            "--shuffle",
            "--seed",
            "5",
            "--memory-budget",
            budget,
            "--shard-size",
            "4MiB",
            "--json",
        ],
    );
    (shardfeed(&args).success().json(), out)
}

#[test]
fn shuffle_larger_than_the_memory_budget_is_a_mixing_permutation_in_bounded_memory() {
    let tmp = tempdir();
    let budget = 16u64 << 20;
    // ~68 MB of tokens in 4 files against a 16 MiB budget.
    let rows = 8000u64;
    let (summary, out) = shuffled_run(tmp.path(), rows, "16MiB");
    let input_bytes = summary["input_bytes"].as_u64().unwrap();
    assert!(
        input_bytes >= 4 * budget,
        "input {input_bytes} is not 4x the budget"
    );
    let (_, shards) = read_dataset(&out);
    assert!(shards.len() >= 4);
    let mut all: Vec<i64> = shards.iter().flat_map(ids).collect();
    assert_ne!(all, (0..rows as i64).collect::<Vec<_>>(), "not shuffled");
    all.sort();
    assert_eq!(
        all,
        (0..rows as i64).collect::<Vec<_>>(),
        "not a permutation"
    );
    // Input file f holds ids [f*rows/4, (f+1)*rows/4): every shard mixes all four.
    for (i, shard) in shards.iter().enumerate() {
        let mut files: Vec<i64> = ids(shard).iter().map(|id| id * 4 / rows as i64).collect();
        files.sort();
        files.dedup();
        assert_eq!(
            files,
            vec![0, 1, 2, 3],
            "shard {i} mixes only files {files:?}"
        );
    }
    // Memory is set by the budget, not by the input: four times more input
    // (16x the budget) leaves the peak nearly where it was (more buckets add
    // their pending parts, 32 KiB each at least: +25-32 MiB measured, for
    // ~195 MiB more input). The process itself (binary, runtime, allocator
    // caches, reader batches) adds a constant.
    let (bigger, _) = shuffled_run(tmp.path(), 4 * rows, "16MiB");
    let peak = summary["peak_rss_bytes"].as_u64().unwrap();
    let peak_bigger = bigger["peak_rss_bytes"].as_u64().unwrap();
    let more_input = bigger["input_bytes"].as_u64().unwrap() - input_bytes;
    eprintln!(
        "shuffle under a {} MiB budget: peak RSS {} MiB for {} MiB of input, {} MiB for {} MiB",
        budget >> 20,
        peak >> 20,
        input_bytes >> 20,
        peak_bigger >> 20,
        bigger["input_bytes"].as_u64().unwrap() >> 20
    );
    assert!(
        peak_bigger < peak + more_input / 4,
        "peak grew with the input: {peak} -> {peak_bigger} for {more_input} more bytes"
    );
    assert!(peak < budget + (256 << 20), "peak RSS {} MiB", peak >> 20);
}

#[test]
fn split_runs_commit_to_the_same_rows_and_refuse_while_a_task_is_missing() {
    let tmp = tempdir();
    // One big Parquet file (8 row groups of 4096 rows) and one Arrow IPC file:
    // the big file must spread across tasks by row group.
    let big = generated(
        &tmp.path().join("in"),
        Kind::Tabular,
        32_768,
        1,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let small = generated(
        &tmp.path().join("in2"),
        Kind::Tabular,
        500,
        1,
        FileFormat::IpcFile,
    );
    let mut inputs = big.clone();
    inputs.extend(small);
    let single = tmp.path().join("single");
    let extra = ["--shard-size", "1MiB", "--row-group-rows", "2000"];
    shardfeed(&shard_args(&inputs, &single, &extra)).success();

    let split = tmp.path().join("split");
    let task = |i: usize| {
        let mut args = task_args(&inputs, &split, &extra, i);
        args.push("--json".into());
        args
    };
    let mut task_rows = Vec::new();
    for i in [0, 1, 3] {
        task_rows.push(
            shardfeed(&task(i)).success().json()["rows"]
                .as_u64()
                .unwrap(),
        );
    }
    assert!(!split.join("manifest.json").exists());
    let refused = shardfeed(&["commit", &s(&split)]).failure();
    assert!(
        refused.stderr.contains("1 of 4 tasks have not finished")
            && refused.stderr.contains("task 2"),
        "{}",
        refused.stderr
    );
    assert!(!split.join("manifest.json").exists());

    // Task 2 killed mid-way (an abrupt exit after its second row group):
    // still refused; its re-run completes the dataset.
    let killed = Run::from_command(
        bin()
            .args(task(2))
            .env("SHARDFEED_FAILPOINTS", "shard-appended=exit@1"),
    );
    assert_eq!(killed.code, Some(137), "{}", killed.stderr);
    assert!(!split.join("_tasks/task-00002-of-00004.json").exists());
    shardfeed(&["commit", &s(&split)]).failure();
    task_rows.push(
        shardfeed(&task(2)).success().json()["rows"]
            .as_u64()
            .unwrap(),
    );
    assert!(
        task_rows.iter().all(|&r| r > 0),
        "every task got rows: {task_rows:?}"
    );
    let committed = shardfeed(&["commit", &s(&split), "--json"])
        .success()
        .json();
    assert_eq!(committed["tasks"], 4);
    assert_eq!(committed["rows"].as_u64(), Some(32_768 + 500));
    shardfeed(&["verify", &s(&split)]).success();
    // Committing again is a no-op.
    let again = shardfeed(&["commit", &s(&split), "--json"])
        .success()
        .json();
    assert_eq!(again["already_committed"], true);

    // The same multiset of rows as the single-process run (rows keyed by
    // their first float and two int columns, random values).
    let keys = |dir: &Path| {
        let all = read_all(dir);
        let col = |name: &str| all.column_by_name(name).expect(name).clone();
        let (f0, c0, c1) = (col("f0"), col("c0"), col("c1"));
        let f0 = f0
            .as_any()
            .downcast_ref::<arrow_array::Float32Array>()
            .unwrap();
        let c0 = c0
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        let c1 = c1
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        let mut keys: Vec<(u32, i64, i64)> = (0..all.num_rows())
            .map(|i| (f0.value(i).to_bits(), c0.value(i), c1.value(i)))
            .collect();
        keys.sort_unstable();
        keys
    };
    assert_eq!(keys(&single), keys(&split));
    // Every file under shards/ is listed by the manifest (no leftovers).
    let listed: std::collections::HashSet<String> = manifest(&split)
        .shards
        .iter()
        .map(|s| s.path.clone())
        .collect();
    for entry in std::fs::read_dir(split.join("shards")).unwrap() {
        let name = format!("shards/{}", entry.unwrap().file_name().to_string_lossy());
        assert!(listed.contains(&name), "stale {name}");
    }

    // Bad splits are refused naming the option.
    let bad = task_args(&inputs, &tmp.path().join("x"), &[], 4);
    let err = shardfeed(&bad).failure();
    assert!(err.stderr.contains("--task-index"), "{}", err.stderr);
}

#[test]
fn shuffled_split_runs_give_one_permutation_mixing_every_input() {
    let tmp = tempdir();
    let rows = 8000;
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::Text,
        rows,
        4,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let per_file = rows as i64 / 4;
    let out = tmp.path().join("ds");
    let stage_args = |i: usize, stage: &str| {
        let shuffle = [
            "--shard-size",
            "64KiB",
            "--row-group-rows",
            "250",
            "--shuffle",
            "--seed",
            "3",
            "--stage",
            stage,
        ];
        task_args(&inputs, &out, &shuffle, i)
    };
    // Gathering before every task scattered is refused, naming the missing ones.
    shardfeed(&stage_args(0, "scatter")).success();
    let refused = shardfeed(&stage_args(0, "gather")).failure();
    assert!(
        refused.stderr.contains("cannot gather task 0's rows")
            && refused.stderr.contains("task 1, 2, 3"),
        "{}",
        refused.stderr
    );
    // All four tasks at once, each scattering then gathering.
    let children: Vec<_> = (0..4)
        .map(|i| {
            bin()
                .args(stage_args(i, "both"))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    shardfeed(&["commit", &s(&out)]).success();
    shardfeed(&["verify", &s(&out)]).success();
    assert!(
        !out.join("_scatter").exists(),
        "scattered rows are removed at commit"
    );

    // One permutation of every row, in no input order.
    let (m, batches) = read_dataset(&out);
    let mut all: Vec<i64> = batches.iter().flat_map(ids).collect();
    assert_ne!(all, (0..rows as i64).collect::<Vec<_>>());
    let sequence = all.clone();
    all.sort_unstable();
    assert_eq!(all, (0..rows as i64).collect::<Vec<_>>());
    // Every shard mixes rows of all four inputs.
    let mut at = 0;
    for shard in &m.shards {
        let part = &sequence[at..at + shard.rows as usize];
        at += shard.rows as usize;
        let files: std::collections::BTreeSet<i64> = part.iter().map(|id| id / per_file).collect();
        assert_eq!(
            files.len(),
            4,
            "{} holds rows of inputs {files:?}",
            shard.path
        );
    }
    assert_eq!(m.options.shuffle_seed, Some(3));
}

/// Wait until `path` exists (a child process reached a point), for at most a
/// minute: an event, not a timing assumption.
fn wait_for(path: &Path, child: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the child ended ({status}) before {} appeared",
                path.display()
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Fault 5: a second `shard` into a folder a run is writing is refused
/// (naming the first run) and changes nothing; once the first is killed, a
/// re-run takes over its lock and completes the dataset.
#[test]
fn a_second_writer_is_refused_and_a_killed_writers_lock_is_taken_over() {
    let tmp = tempdir();
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::Tokens,
        3000,
        6,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let out = tmp.path().join("ds");
    // The killed run's spill folder stays in the test's folder.
    let args = shard_args(
        &inputs,
        &out,
        &[
            "--shard-size",
            "256KiB",
            "--row-group-rows",
            "64",
            "--temp-dir",
            &s(tmp.path()),
        ],
    );
    // The first run stops (alive) after publishing its second shard.
    let mut first = bin()
        .args(&args)
        .env("SHARDFEED_FAILPOINTS", "shard-published=block@1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&out.join("shards/part-000001.parquet"), &mut first);
    let before = snapshot(&out.join("shards"));
    let refused = shardfeed(&args).failure();
    assert!(
        refused.stderr.contains("is being written by `shard` run")
            && refused.stderr.contains(&format!("process {}", first.id())),
        "{}",
        refused.stderr
    );
    assert_eq!(
        snapshot(&out.join("shards")),
        before,
        "the refused run touched the shards"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    shardfeed(&args).success();
    shardfeed(&["verify", &s(&out)]).success();
    assert_eq!(ids(&read_all(&out)), (0..3000).collect::<Vec<i64>>());
    assert!(!out.join("_shardfeed.lock").exists());
}

/// Fault 5: two attempts of one split task (a retried task whose first
/// attempt still lives) stage into files of their own: the second neither
/// overwrites nor removes the first's, and the committed dataset verifies.
#[test]
fn attempts_of_one_task_never_share_a_file() {
    let tmp = tempdir();
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::Tokens,
        2000,
        4,
        FileFormat::Parquet(Compression::SNAPPY),
    );
    let out = tmp.path().join("ds");
    // Shards of several row groups: attempt A blocks inside its first shard.
    let extra = ["--shard-size", "1MiB", "--row-group-rows", "50"];
    let task = |i: usize| task_args(&inputs, &out, &extra, i);
    // Attempt A of task 1 stays alive mid-shard (after 3 row groups of its
    // first shard, whose staging file therefore stays).
    let mut a = bin()
        .args(task(1))
        .env("SHARDFEED_FAILPOINTS", "shard-appended=block@2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let staged = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir.join("shards"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".tmp"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while staged(&out).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "attempt A staged nothing"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let a_files = staged(&out);
    // Attempt B of task 1 runs to its end meanwhile, then the other tasks.
    shardfeed(&task(1)).success();
    for name in &a_files {
        assert!(
            out.join("shards").join(name).exists(),
            "B removed A's {name}"
        );
    }
    a.kill().unwrap();
    a.wait().unwrap();
    for i in [0, 2, 3] {
        shardfeed(&task(i)).success();
    }
    shardfeed(&["commit", &s(&out)]).success();
    shardfeed(&["verify", &s(&out)]).success();
    let mut all = ids(&read_all(&out));
    all.sort();
    assert_eq!(all, (0..2000).collect::<Vec<i64>>());
    assert!(staged(&out).is_empty(), "commit leaves no staging files");
}

/// Fault 5: after `--overwrite` with other inputs, the previous run's task
/// records are never committed with the new run's.
#[test]
fn task_records_of_another_run_are_never_committed() {
    let tmp = tempdir();
    let inputs_in = |dir: &str, rows: u64| {
        generated(
            &tmp.path().join(dir),
            Kind::Tokens,
            rows,
            2,
            FileFormat::Parquet(Compression::SNAPPY),
        )
    };
    let old = inputs_in("old", 400);
    let new = inputs_in("new", 600);
    let out = tmp.path().join("ds");
    let extra = ["--shard-size", "1MiB", "--row-group-rows", "50"];
    let task = |inputs: &[String], i: usize, more: &[&str]| {
        let mut args = shard_args(inputs, &out, &[&extra[..], more].concat());
        args.extend(["--num-tasks", "2", "--task-index"].map(String::from));
        args.push(i.to_string());
        args
    };
    for i in 0..2 {
        shardfeed(&task(&old, i, &[])).success();
    }
    shardfeed(&["commit", &s(&out)]).success();
    // Task 0 of a new run, without --overwrite: refused (the dataset exists).
    shardfeed(&task(&new, 0, &[])).failure();
    // With --overwrite: task 0 replaces the old run's records...
    shardfeed(&task(&new, 0, &["--overwrite"])).success();
    // ...so commit refuses until the new run's task 1 is there, instead of
    // committing the old task 1 with the new task 0.
    let refused = shardfeed(&["commit", &s(&out)]).failure();
    assert!(refused.stderr.contains("task 1"), "{}", refused.stderr);
    shardfeed(&task(&new, 1, &[])).success();
    shardfeed(&["commit", &s(&out)]).success();
    shardfeed(&["verify", &s(&out)]).success();
    assert_eq!(manifest(&out).total_rows, 600);
    // A task record of another run planted among this run's: refused by name.
    let record = out.join("_tasks/task-00001-of-00002.json");
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    value["run_id"] = "someone-else".into();
    std::fs::write(&record, serde_json::to_vec(&value).unwrap()).unwrap();
    std::fs::remove_file(out.join("manifest.json")).unwrap();
    let refused = shardfeed(&["commit", &s(&out)]).failure();
    assert!(
        refused.stderr.contains("different runs") && refused.stderr.contains("task 1"),
        "{}",
        refused.stderr
    );
}

/// Fault 11: malformed Parquet inputs (the malformations of the public
/// parquet-testing corpus, made here) end in an error naming the file,
/// without a hang or a panic, or in a correct round trip.
#[test]
fn malformed_parquet_inputs_fail_cleanly_or_round_trip() {
    use crate::forge::{self, Chunk, plain_chunk};
    let tmp = tempdir();
    let int64s = |n: i64| -> Vec<u8> { (0..n).flat_map(|v| v.to_le_bytes()).collect() };
    let required = "message m { required int64 v; }";
    let list = "message m { required group ids (LIST) { repeated group list { required int32 element; } } }";
    let list_page = |levels: i32, rep: &[u8], values: i32| {
        let mut body = forge::levels(rep);
        body.extend(forge::levels(&forge::rle_run(levels as u64, 1, 1)));
        body.extend((0..values).flat_map(|v| v.to_le_bytes()));
        forge::data_page(levels, forge::PLAIN, &body)
    };
    let broken: Vec<(&str, Vec<u8>)> = vec![
        // ARROW-RS-GH-6229-DICTHEADER: a dictionary page of -5 values.
        ("negative-dictionary", {
            let dict = forge::dictionary_page(-5, &int64s(2));
            let mut keys = vec![1u8];
            keys.extend(forge::rle_run(4, 1, 1));
            let mut pages = dict.clone();
            pages.extend(forge::data_page(4, forge::RLE_DICTIONARY, &keys));
            forge::parquet_file(
                required,
                4,
                vec![Chunk {
                    pages,
                    num_values: 4,
                    data_offset: dict.len(),
                    dictionary: true,
                    encodings: vec![Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY],
                }],
            )
        }),
        // ARROW-GH-41321 / 43605: dictionary keys of bit width 254.
        ("bit-width-254", {
            let dict = forge::dictionary_page(2, &int64s(2));
            let mut pages = dict.clone();
            pages.extend(forge::data_page(
                4,
                forge::RLE_DICTIONARY,
                &[254, 8, 1, 0, 0, 0],
            ));
            forge::parquet_file(
                required,
                4,
                vec![Chunk {
                    pages,
                    num_values: 4,
                    data_offset: dict.len(),
                    dictionary: true,
                    encodings: vec![Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY],
                }],
            )
        }),
        // ARROW-RS-GH-6229-LEVELS: fewer repetition levels than values.
        ("short-levels", {
            let page = list_page(6, &forge::rle_run(2, 0, 1), 6);
            forge::parquet_file(list, 3, vec![plain_chunk(page, 6)])
        }),
        // ARROW-GH-45185: repetition levels starting with 1.
        ("first-level-continues", {
            let page = list_page(4, &forge::rle_run(4, 1, 1), 4);
            forge::parquet_file(list, 1, vec![plain_chunk(page, 4)])
        }),
        // ARROW-GH-47662: a required column's page shorter than its values.
        ("short-plain-page", {
            let page = forge::data_page(10, forge::PLAIN, &int64s(6));
            forge::parquet_file(required, 10, vec![plain_chunk(page, 10)])
        }),
        // ARROW-GH-41317: two columns of different lengths in one row group.
        ("uneven-columns", {
            let a = forge::data_page(5, forge::PLAIN, &int64s(5));
            let b = forge::data_page(3, forge::PLAIN, &int64s(3));
            forge::parquet_file(
                "message m { required int64 a; required int64 b; }",
                5,
                vec![plain_chunk(a, 5), plain_chunk(b, 3)],
            )
        }),
        // nation.dict-malformed: a page header cut short.
        ("truncated-header", {
            let page = forge::data_page(5, forge::PLAIN, &int64s(5));
            forge::parquet_file(required, 5, vec![plain_chunk(page[..3].to_vec(), 5)])
        }),
        // PARQUET-1481: a footer whose schema type is out of range.
        ("bad-schema-type", {
            let page = forge::data_page(5, forge::PLAIN, &int64s(5));
            let mut file = forge::parquet_file(required, 5, vec![plain_chunk(page, 5)]);
            let footer_len =
                u32::from_le_bytes(file[file.len() - 8..file.len() - 4].try_into().unwrap())
                    as usize;
            let start = file.len() - 8 - footer_len;
            // The INT64 leaf's physical type (zigzag 2 = 0x04) becomes -7 (0x0d).
            let at = file[start..]
                .windows(2)
                .position(|w| w == [0x15, 0x04])
                .unwrap()
                + start
                + 1;
            file[at] = 0x0d;
            file
        }),
    ];
    for (name, bytes) in &broken {
        let input = tmp.path().join(format!("{name}.parquet"));
        std::fs::write(&input, bytes).unwrap();
        let out = tmp.path().join(format!("{name}-out"));
        let run = shardfeed(&["shard", &s(&input), "--output", &s(&out)]).failure();
        assert!(run.stderr.contains(&s(&input)), "{name}: {}", run.stderr);
        assert!(!out.join("manifest.json").exists(), "{name}");
    }
    // repeated_no_annotation: a footer claiming 0 rows for the file while
    // its row group holds 3: every row comes through.
    let page = forge::data_page(3, forge::PLAIN, &int64s(3));
    let file = forge::parquet_file_claiming(required, 3, 0, vec![plain_chunk(page, 3)]);
    let input = tmp.path().join("undercounted.parquet");
    std::fs::write(&input, file).unwrap();
    let out = tmp.path().join("undercounted-out");
    shardfeed(&["shard", &s(&input), "--output", &s(&out), "--no-shuffle"]).success();
    let rows = read_all(&out);
    assert_eq!(
        rows.column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap()
            .values(),
        &[0, 1, 2]
    );
}

/// ImageFolder trees as users have them: hidden files (`.DS_Store`) and
/// folders are left out, a symbolic link to a folder is followed once (a link
/// back up the tree is not walked again), and the summary says what was
/// left out.
#[test]
fn folder_inputs_skip_hidden_files_follow_links_and_say_what_they_left_out() {
    let tmp = tempdir();
    let root = tmp.path().join("images");
    let files = shardfeed_fixtures::write_image_folder(&root, 30, 3, 5).unwrap();
    let elsewhere = tmp.path().join("more");
    shardfeed_fixtures::write_image_folder(&elsewhere, 6, 1, 9).unwrap();
    let class = std::fs::read_dir(&elsewhere)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::os::unix::fs::symlink(&class, root.join("linked")).unwrap();
    std::os::unix::fs::symlink(&root, root.join("linked-back")).unwrap();
    std::fs::write(root.join(".DS_Store"), b"finder").unwrap();
    let first_class = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .min()
        .unwrap();
    std::fs::write(first_class.join(".DS_Store"), b"finder").unwrap();
    std::fs::create_dir_all(root.join(".cache")).unwrap();
    std::fs::write(root.join(".cache/thumb.bin"), b"x").unwrap();
    // A link to a file outside the tree (the process environment, with its
    // credentials) and a FIFO (a read would block for ever).
    std::os::unix::fs::symlink("/proc/self/environ", first_class.join("environ.jpg")).unwrap();
    let fifo = first_class.join("pipe.jpg");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // By default links that leave the folder are skipped and listed; special
    // files are never read.
    let inside = tmp.path().join("inside");
    let run = shard_small(&[s(&root)], &inside, &[]).success();
    let summary = run.json();
    assert_eq!(summary["rows"], files.len() as u64, "{summary}");
    let listed = summary["skipped_inputs"].to_string();
    for (name, reason) in [
        ("linked", "outside the input folder"),
        ("environ.jpg", "outside the input folder"),
        ("pipe.jpg", "not a regular file"),
    ] {
        assert!(
            summary["skipped_inputs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["path"].as_str().unwrap().ends_with(name)
                    && s["reason"].as_str().unwrap().contains(reason)),
            "{name}: {listed}"
        );
    }
    std::fs::remove_file(first_class.join("environ.jpg")).unwrap();
    // --follow-links reads what they lead to.
    let out = tmp.path().join("ds");
    let run = shard_small(&[s(&root)], &out, &["--follow-links"]).success();
    let summary = run.json();
    assert_eq!(summary["rows"], (files.len() + 6) as u64, "{summary}");
    let skipped: Vec<(String, String)> = summary["skipped_inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["path"].as_str().unwrap().to_string(),
                s["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let find = |suffix: &str| skipped.iter().find(|(p, _)| p.ends_with(suffix));
    assert_eq!(
        find("/.DS_Store").map(|(_, r)| r.as_str()),
        Some("hidden"),
        "{skipped:?}"
    );
    assert_eq!(
        skipped
            .iter()
            .filter(|(p, _)| p.ends_with(".DS_Store"))
            .count(),
        2
    );
    assert!(find("/.cache").is_some(), "{skipped:?}");
    assert!(
        find("linked-back").is_some_and(|(_, r)| r.contains("link back")),
        "{skipped:?}"
    );
    let labels = read_all(&out);
    let labels = labels
        .column_by_name("label")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow_array::StringArray>()
        .unwrap()
        .iter()
        .flatten()
        .filter(|l| *l == "linked")
        .count();
    assert_eq!(labels, 6);
}

/// Rows averaging over 64 KiB (images) get row groups of 4 MiB by default,
/// others 8 MiB; a row group size that is set applies to every row.
#[test]
fn large_rows_get_smaller_row_groups_unless_a_size_is_set() {
    use arrow_array::{ArrayRef, BinaryArray, Int64Array};
    use shardfeed_preprocess::ShardOptions;
    let tmp = tempdir();
    // Rows per row group of `value`-byte rows sharded with `options`.
    let groups = |name: &str, rows: i64, value: usize, options: ShardOptions| -> Vec<u64> {
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                std::sync::Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
            ),
            (
                "bytes",
                std::sync::Arc::new(BinaryArray::from_iter_values(
                    (0..rows).map(|i| vec![(i % 251) as u8; value]),
                )),
            ),
        ])
        .unwrap();
        let input = tmp.path().join(format!("{name}.parquet"));
        write_parquet(&input, &batch);
        let out = tmp.path().join(name);
        shardfeed_preprocess::shard(&[s(&input)], &s(&out), &options).unwrap();
        let (manifest, batches) = read_dataset(&out);
        let mut ids = ids(&concat(&batches));
        ids.sort_unstable();
        assert_eq!(ids, (0..rows).collect::<Vec<_>>());
        // The manifest records the large-row target where it applies.
        let large = options.large_row_group_bytes.map(|_| 2u64 << 20);
        assert_eq!(manifest.options.large_row_group_bytes, large, "{name}");
        manifest
            .shards
            .iter()
            .flat_map(|s| s.row_groups.clone())
            .collect()
    };
    // A row is its value, an offset and an id: 100,012 bytes; 2 MiB holds
    // 20.97 of them, 8 MiB 83.9 (a row group closes at the row that reaches
    // its target).
    let large = groups("large", 300, 100_000, ShardOptions::default());
    assert!(large.len() > 2);
    assert!(
        large[..large.len() - 1].iter().all(|&r| r == 21),
        "{large:?}"
    );
    let set = groups(
        "set",
        300,
        100_000,
        ShardOptions::default().with_row_group_bytes(8 << 20),
    );
    assert!(set[..set.len() - 1].iter().all(|&r| r == 84), "{set:?}");
    // 1,012-byte rows: 8 MiB row groups of 8,290 rows (8,289.1 reach it).
    let small = groups("small", 20_000, 1000, ShardOptions::default());
    assert!(
        small[..small.len() - 1].iter().all(|&r| r == 8290),
        "{small:?}"
    );
}

/// Column names and options are checked before anything is written: a
/// duplicate column (a CSV header `a,a`) is refused naming the file and the
/// column, and so is a manifest that names a column twice (`verify`);
/// `--threads` past its bound is an error, not an abort; a split run's
/// `--seed` without `--shuffle` is refused at once (it would start the
/// cross-task shuffle and wait for the other tasks), and a large split
/// without `--shuffle` is not refused for a `--shuffle` limit.
#[test]
fn column_names_and_options_are_checked_before_anything_is_written() {
    let tmp = tempdir();
    let csv = tmp.path().join("dup.csv");
    std::fs::write(&csv, "a,b,a\n1,2,3\n4,5,6\n").unwrap();
    let out = tmp.path().join("ds");
    let e = shardfeed(&shard_args(&[s(&csv)], &out, &[]))
        .failure()
        .stderr;
    assert!(
        e.contains("dup.csv") && e.contains("\"a\" appears twice"),
        "{e}"
    );
    assert!(!out.exists() || !out.join("manifest.json").exists());

    let good = tmp.path().join("good.csv");
    std::fs::write(&good, "a,b\n1,2\n3,4\n").unwrap();
    shardfeed(&shard_args(&[s(&good)], &out, &[])).success();
    // A manifest edited to name a column twice is refused by its readers.
    let path = out.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let fields = manifest["schema"]["fields"].as_array_mut().unwrap();
    let first = fields[0].clone();
    fields[1] = first;
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let e = shardfeed(&["verify", &s(&out)]).failure().stderr;
    assert!(e.contains("names column \"a\" twice"), "{e}");

    let other = tmp.path().join("other");
    let e = shardfeed(&shard_args(&[s(&good)], &other, &["--threads", "100000"]))
        .failure()
        .stderr;
    assert!(e.contains("--threads") && e.contains("100000"), "{e}");
    assert!(!other.join(shardfeed_preprocess::LOCK_FILE).exists());

    let split = |extra: &[&str]| {
        let mut args = shard_args(&[s(&good)], &other, &["--task-index", "0"]);
        args.extend(extra.iter().map(|a| a.to_string()));
        shardfeed(&args)
    };
    let e = split(&["--num-tasks", "2", "--seed", "7"]).failure().stderr;
    assert!(e.contains("--seed") && e.contains("--shuffle"), "{e}");
    let run = split(&["--num-tasks", "5000"]);
    assert!(!run.stderr.contains("--shuffle"), "{}", run.stderr);
}

/// `commit` checks the manifest the task records describe as its readers
/// would, before it reads a shard or writes anything: a record that lists
/// another task's shard (a shard listed twice) or row counts that overflow
/// is refused, no manifest is written, no shard is deleted, and the run
/// commits once the records are right again.
#[test]
fn commit_refuses_forged_task_records_and_deletes_nothing() {
    let tmp = tempdir();
    let inputs = generated(
        &tmp.path().join("in"),
        Kind::Text,
        800,
        4,
        FileFormat::Parquet(parquet::basic::Compression::SNAPPY),
    );
    let out = tmp.path().join("ds");
    for task in 0..4 {
        shardfeed(&task_args(&inputs, &out, &["--shard-size", "16KiB"], task)).success();
    }
    let record = |i: usize| out.join(shardfeed_format::task_record_path(i, 4));
    let original = std::fs::read(record(1)).unwrap();
    let shards_before = std::fs::read_dir(out.join("shards")).unwrap().count();
    let forge = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut value: serde_json::Value = serde_json::from_slice(&original).unwrap();
        edit(&mut value);
        std::fs::write(record(1), serde_json::to_vec(&value).unwrap()).unwrap();
    };
    let task0: serde_json::Value =
        serde_json::from_slice(&std::fs::read(record(0)).unwrap()).unwrap();
    let stolen = task0["shards"][0].clone();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: [(&str, Edit); 2] = [
        (
            "listed twice",
            Box::new(move |v| v["shards"].as_array_mut().unwrap().push(stolen.clone())),
        ),
        (
            "overflow",
            Box::new(|v| {
                let shard = &mut v["shards"][0];
                shard["rows"] = u64::MAX.into();
                shard["row_groups"] = serde_json::json!([u64::MAX]);
            }),
        ),
    ];
    for (want, edit) in &cases {
        forge(edit.as_ref());
        let e = shardfeed(&["commit", &s(&out)]).failure().stderr;
        assert!(e.contains(want), "{want}: {e}");
        assert!(
            !out.join("manifest.json").exists(),
            "{want}: a manifest was written"
        );
        assert_eq!(
            std::fs::read_dir(out.join("shards")).unwrap().count(),
            shards_before,
            "{want}: a shard was deleted"
        );
    }
    std::fs::write(record(1), &original).unwrap();
    shardfeed(&["commit", &s(&out)]).success();
    assert_eq!(read_all(&out).num_rows(), 800);
}

/// `shard`'s memory follows `--memory-budget` whatever the input's shape:
/// many columns are refused (naming the budget they need) unless
/// `--max-columns` allows them, and then cost their documented share, not
/// a reader's rows x columns; a value (a JSON line, a CSV field, a file of
/// a folder) larger than an eighth of the budget is refused naming where it
/// is, before it is held. Peak RSS is the child process's.
#[test]
fn inputs_of_any_shape_are_held_within_the_memory_budget() {
    let tmp = tempdir();
    let budget = 64u64 << 20;
    let wide = |path: &Path, columns: usize, rows: usize| {
        let mut text = (0..columns)
            .map(|c| format!("c{c}"))
            .collect::<Vec<_>>()
            .join(",");
        text.push('\n');
        for r in 0..rows {
            let row: Vec<String> = (0..columns).map(|c| (r * c).to_string()).collect();
            text.push_str(&row.join(","));
            text.push('\n');
        }
        std::fs::write(path, text).unwrap();
    };
    let csv = tmp.path().join("wide.csv");
    wide(&csv, 2000, 3);
    let out = tmp.path().join("wide");
    let e = shardfeed(&shard_args(&[s(&csv)], &out, &["--memory-budget", "64MiB"]))
        .failure()
        .stderr;
    assert!(
        e.contains("wide.csv") && e.contains("2000 columns") && e.contains("--max-columns"),
        "{e}"
    );
    let run = shardfeed(&shard_args(
        &[s(&csv)],
        &out,
        &[
            "--memory-budget",
            "64MiB",
            "--max-columns",
            "2000",
            "--json",
        ],
    ))
    .success();
    let peak = run.json()["peak_rss_bytes"].as_u64().unwrap();
    // The budget, the columns' documented cost, and the process itself.
    let bound = budget + 2000 * shardfeed_preprocess::COLUMN_BYTES + (96 << 20);
    assert!(
        peak < bound,
        "peak RSS {} MB, bound {} MB",
        peak >> 20,
        bound >> 20
    );
    // Many distinct JSON keys are as many columns: refused at once.
    let keys = tmp.path().join("keys.jsonl");
    let lines: String = (0..5000).map(|i| format!("{{\"k{i}\": {i}}}\n")).collect();
    std::fs::write(&keys, lines).unwrap();
    let e = shardfeed(&shard_args(
        &[s(&keys)],
        &tmp.path().join("keys"),
        &["--memory-budget", "64MiB"],
    ))
    .failure()
    .stderr;
    assert!(
        e.contains("keys.jsonl") && e.contains("5000 columns"),
        "{e}"
    );
    // One value past an eighth of the budget (8 MiB): a JSON line, a CSV
    // field, a file of a folder.
    let big = "x".repeat(9 << 20);
    let json = tmp.path().join("big.jsonl");
    std::fs::write(&json, format!("{{\"a\": \"b\"}}\n{{\"a\": \"{big}\"}}\n")).unwrap();
    // Refused while the schema is inferred, before the line is parsed (a
    // JSON array is many times its size as parsed values).
    let array = tmp.path().join("array.jsonl");
    let ones = "1,".repeat(9 << 19);
    std::fs::write(&array, format!("{{\"a\": 1}}\n[{ones}1]\n")).unwrap();
    let csv = tmp.path().join("big.csv");
    std::fs::write(&csv, format!("a\nb\n{big}\n")).unwrap();
    let folder = tmp.path().join("files");
    std::fs::create_dir_all(folder.join("x")).unwrap();
    std::fs::write(folder.join("x/small.bin"), b"small").unwrap();
    std::fs::write(folder.join("x/big.bin"), big.as_bytes()).unwrap();
    for (input, place) in [
        (&json, "line 2"),
        (&array, "line 2"),
        (&csv, "at byte 4"),
        (&folder, "big.bin"),
    ] {
        let out = tmp.path().join("big-out");
        let run = shardfeed(&shard_args(
            &[s(input)],
            &out,
            &["--memory-budget", "64MiB"],
        ))
        .failure();
        assert!(
            run.stderr.contains(place) && run.stderr.contains("--memory-budget"),
            "{}: {}",
            input.display(),
            run.stderr
        );
        assert!(!out.join("manifest.json").exists());
    }
}

/// A Parquet input whose page header claims more bytes than one value may
/// hold (here 1 GiB for a page of 8 bytes) is refused naming the file, the
/// row group, the column and the page, before parquet's reader sizes a
/// buffer by the claim; a page that runs past its column chunk too.
#[test]
fn parquet_pages_claiming_more_than_a_value_may_hold_are_refused() {
    use crate::forge::{Thrift, parquet_file, plain_chunk};
    let tmp = tempdir();
    let body = 7i64.to_le_bytes();
    for (claimed, compressed, want) in [
        (
            1i32 << 30,
            body.len() as i32,
            "decompresses to 1073741824 bytes",
        ),
        (body.len() as i32, 1 << 20, "runs past its column chunk"),
    ] {
        let mut t = Thrift::in_struct();
        t.i32(1, 0)
            .i32(2, claimed)
            .i32(3, compressed)
            .begin(5)
            .i32(1, 1)
            .i32(2, 0)
            .i32(3, 3)
            .i32(4, 3)
            .end()
            .end();
        let mut page = t.out;
        page.extend_from_slice(&body);
        let file = parquet_file(
            "message m { required int64 v; }",
            1,
            vec![plain_chunk(page, 1)],
        );
        let input = tmp.path().join(format!("forged-{claimed}.parquet"));
        std::fs::write(&input, file).unwrap();
        let out = tmp.path().join("out");
        let e = shardfeed(&shard_args(
            &[s(&input)],
            &out,
            &["--memory-budget", "64MiB"],
        ))
        .failure()
        .stderr;
        assert!(
            e.contains("forged-") && e.contains("row group 0 column v") && e.contains(want),
            "{e}"
        );
        assert!(!out.join("manifest.json").exists());
    }
}
