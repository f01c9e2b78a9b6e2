//! Helpers that keep each test a few lines: run the binary, read a dataset back.

#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use shardfeed_format::Manifest;

/// The `shardfeed` binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardfeed"))
}

/// The outcome of one run of the binary.
pub struct Run {
    pub ok: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Run `command` to its end.
    pub fn from_command(command: &mut Command) -> Run {
        Run::from(command.output().expect("run shardfeed"))
    }

    /// The outcome of a process that has ended.
    pub fn from_output(output: Output) -> Run {
        Run::from(output)
    }

    fn from(output: Output) -> Run {
        Run {
            ok: output.status.success(),
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Panic with the output unless the run succeeded.
    pub fn success(self) -> Run {
        assert!(
            self.ok,
            "shardfeed failed ({:?})\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// Panic unless the run failed cleanly (non-zero exit, an error line, no panic).
    pub fn failure(self) -> Run {
        assert!(
            !self.ok,
            "shardfeed succeeded but should have failed\nstdout:\n{}",
            self.stdout
        );
        assert_eq!(
            self.code,
            Some(1),
            "unexpected exit: {:?}\n{}",
            self.code,
            self.stderr
        );
        assert!(
            !self.stderr.contains("panicked"),
            "panicked:\n{}",
            self.stderr
        );
        assert!(
            self.stderr.contains("error"),
            "no error message:\n{}",
            self.stderr
        );
        self
    }

    /// The stdout parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", self.stdout))
    }
}

/// Run `shardfeed ARGS...`.
pub fn shardfeed<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    Run::from(bin().args(args).output().expect("run shardfeed"))
}

/// `p` as a string argument.
pub fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A fresh temporary folder.
/// Write `batch` as a Parquet file at `path` (parquet's default writer).
pub fn write_parquet(path: &Path, batch: &RecordBatch) {
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None)
            .unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("shardfeed-test")
        .tempdir()
        .expect("temp dir")
}

/// The manifest of the dataset at `dir`.
pub fn manifest(dir: &Path) -> Manifest {
    let bytes = std::fs::read(dir.join("manifest.json")).expect("manifest exists");
    Manifest::from_json(&bytes, &s(dir)).expect("manifest valid")
}

/// Read a dataset back with the plain Parquet reader, checking the manifest
/// against the files: sizes, rows, row groups. Returns one batch per shard.
pub fn read_dataset(dir: &Path) -> (Manifest, Vec<RecordBatch>) {
    let manifest = manifest(dir);
    let mut out = Vec::new();
    for shard in &manifest.shards {
        let path = dir.join(&shard.path);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            shard.bytes,
            "{}",
            shard.path
        );
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
        let groups: Vec<u64> = builder
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows() as u64)
            .collect();
        assert_eq!(groups, shard.row_groups, "{}", shard.path);
        let schema = builder.schema().clone();
        let batches: Vec<RecordBatch> = builder.build().unwrap().map(|b| b.unwrap()).collect();
        let batch = arrow_select::concat::concat_batches(&schema, &batches).unwrap();
        assert_eq!(batch.num_rows() as u64, shard.rows, "{}", shard.path);
        out.push(batch);
    }
    let total: u64 = out.iter().map(|b| b.num_rows() as u64).sum();
    assert_eq!(total, manifest.total_rows);
    (manifest, out)
}

/// All rows of a dataset as one batch: in `id` order when it has an `id`
/// column (`shard` shuffles rows unless told not to), else as stored.
pub fn read_all(dir: &Path) -> RecordBatch {
    let (_, batches) = read_dataset(dir);
    let all = concat(&batches);
    let Some(ids) = all
        .column_by_name("id")
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
    else {
        return all;
    };
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    order.sort_by_key(|&i| ids.value(i as usize));
    let order = arrow_array::UInt32Array::from(order);
    let columns = all
        .columns()
        .iter()
        .map(|c| arrow_select::take::take(c, &order, None).unwrap())
        .collect();
    RecordBatch::try_new(all.schema(), columns).unwrap()
}

/// Concatenate batches of one schema.
pub fn concat(batches: &[RecordBatch]) -> RecordBatch {
    let schema: SchemaRef = batches[0].schema();
    arrow_select::concat::concat_batches(&schema, batches).unwrap()
}

/// Assert two batches hold the same fields and values (schema metadata aside).
pub fn assert_same_rows(actual: &RecordBatch, expected: &RecordBatch) {
    assert_eq!(actual.num_rows(), expected.num_rows(), "row counts differ");
    assert_eq!(
        actual.schema().fields(),
        expected.schema().fields(),
        "fields differ"
    );
    for (i, (a, e)) in actual.columns().iter().zip(expected.columns()).enumerate() {
        let a: &ArrayRef = a;
        if a.to_data() != e.to_data() {
            // Find the first differing row for the message.
            let row = (0..a.len()).find(|&r| a.slice(r, 1).to_data() != e.slice(r, 1).to_data());
            panic!(
                "column {} differs (first at row {row:?})",
                expected.schema().field(i).name()
            );
        }
    }
}

/// The `id` column of a batch.
pub fn ids(batch: &RecordBatch) -> Vec<i64> {
    let col = batch.column_by_name("id").expect("id column");
    col.as_any()
        .downcast_ref::<Int64Array>()
        .expect("int64 ids")
        .values()
        .to_vec()
}

/// Every file under `dir` (relative path, bytes), sorted.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// Whether pyarrow can be imported by `python3`.
pub fn python() -> Command {
    Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
}

/// Shard `rows` generated rows of `kind` (3 Parquet files, seed 7) into
/// `dir/ds` with the given row group rows and shard size; returns its path.
pub fn sharded(
    dir: &Path,
    kind: shardfeed_fixtures::Kind,
    rows: u64,
    row_group_rows: u64,
    shard_size: u64,
) -> String {
    let inputs: Vec<String> = shardfeed_fixtures::write_dataset(
        &dir.join("in"),
        kind,
        rows,
        3,
        7,
        shardfeed_fixtures::FileFormat::Parquet(parquet::basic::Compression::SNAPPY),
    )
    .unwrap()
    .iter()
    .map(|p| s(p))
    .collect();
    let out = dir.join("ds");
    let options = shardfeed_preprocess::ShardOptions::default()
        .with_row_group_rows(row_group_rows)
        .with_shard_size(shard_size);
    shardfeed_preprocess::shard(&inputs, &s(&out), &options).unwrap();
    s(&out)
}

/// Copy every file under `dir` into a new in-memory store under `prefix`.
pub fn in_memory(dir: &Path, prefix: &str) -> std::sync::Arc<object_store::memory::InMemory> {
    use object_store::ObjectStoreExt;
    let memory = std::sync::Arc::new(object_store::memory::InMemory::new());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (relative, bytes) in snapshot(dir) {
        let path = object_store::path::Path::from(format!("{prefix}/{}", relative.display()));
        runtime.block_on(memory.put(&path, bytes.into())).unwrap();
    }
    memory
}
