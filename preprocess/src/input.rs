//! Inputs: resolving paths, folders and globs; detecting formats; probing
//! schemas; and opening each input as a stream of record batches.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::schema::types::ColumnPath;
use serde::Serialize;
use shardfeed_format::mapping::{FileChange, MappedFile};

pub use crate::input_format::InputFormat;
use crate::options::READ_BATCH_ROWS;
use crate::parquet_file::RowGroupFile;
use crate::{PreprocessError, Result, ShardOptions};

/// Target in-memory bytes of one batch read from an input.
pub(crate) const READ_BATCH_BYTES: u64 = 2 << 20;
/// Files of a folder input read as one unit of work.
const FILES_PER_UNIT: usize = 512;

/// One unit of reading work, in dataset order.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// A single file of a tabular format; for Parquet, optionally only some
    /// of its row groups (a task's part of the file).
    File {
        path: PathBuf,
        format: InputFormat,
        row_groups: Option<Vec<usize>>,
    },
    /// Some files of a folder input, read as one row each.
    Files {
        root: PathBuf,
        files: Vec<(String, i32)>,
        labels: Arc<Vec<String>>,
    },
}

impl Source {
    /// The path used in messages.
    pub(crate) fn display_path(&self) -> PathBuf {
        match self {
            Source::File { path, .. } => path.clone(),
            Source::Files { root, files, .. } => files
                .first()
                .map_or_else(|| root.clone(), |(f, _)| root.join(f)),
        }
    }
}

/// All inputs of a run, resolved and checked.
#[derive(Debug)]
pub(crate) struct Inputs {
    pub sources: Vec<Source>,
    pub schema: SchemaRef,
    /// Estimated uncompressed bytes of all inputs.
    pub estimated_bytes: u64,
    /// The inputs as given, for messages.
    pub given: Vec<String>,
    /// Files and folders of folder inputs left out.
    pub skipped: Vec<SkippedInput>,
}

/// The schema of folder inputs.
pub fn files_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("label", DataType::Utf8, false),
        Field::new("label_index", DataType::Int32, false),
        Field::new("bytes", DataType::Binary, false),
    ]))
}

/// File name extensions of formats that are compressed already: images,
/// audio, video and archives, which zstd does not shrink.
const COMPRESSED_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "png", "webp", "gif", "avif", "heic", "jxl", "mp3", "ogg", "opus", "flac",
    "m4a", "aac", "mp4", "webm", "mkv", "mov", "zip", "gz", "zst", "xz", "bz2", "7z",
];

impl Inputs {
    /// Whether the inputs are folders of files that are all compressed
    /// already (by their extensions), so their `bytes` column is stored
    /// as it is.
    pub(crate) fn files_compressed(&self) -> bool {
        !self.sources.is_empty()
            && self.sources.iter().all(|source| match source {
                Source::Files { files, .. } => files.iter().all(|(name, _)| {
                    Path::new(name)
                        .extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| {
                            COMPRESSED_EXTENSIONS
                                .iter()
                                .any(|c| e.eq_ignore_ascii_case(c))
                        })
                }),
                Source::File { .. } => false,
            })
    }
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// A file or folder of a folder input that was left out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedInput {
    /// Its path.
    pub path: String,
    /// Why it was left out.
    pub reason: String,
}

/// Files under `dir`, recursively (following symbolic links that stay in
/// the folder), as sorted relative paths; and what was left out: hidden
/// files and folders (`.DS_Store`, `.git/`), links that lead back to a
/// folder being walked (followed once, not again), links that leave the
/// folder (unless `follow_links`: a link to `/proc/self/environ` would make
/// the process's environment a row), and special files (FIFOs, sockets,
/// devices), which are never read.
fn walk(dir: &Path, follow_links: bool) -> Result<(Vec<PathBuf>, Vec<SkippedInput>)> {
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    let root = dir
        .canonicalize()
        .map_err(|e| PreprocessError::io("resolve", dir, e))?;
    let mut entries = walkdir::WalkDir::new(dir)
        .follow_links(true)
        .sort_by_file_name()
        .into_iter();
    while let Some(entry) = entries.next() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                let path = e.path().unwrap_or(dir).to_path_buf();
                if let Some(ancestor) = e.loop_ancestor() {
                    skipped.push(SkippedInput {
                        path: path.display().to_string(),
                        reason: format!("a link back to {}: not walked again", ancestor.display()),
                    });
                    continue;
                }
                let source = e
                    .into_io_error()
                    .unwrap_or_else(|| std::io::Error::other("cannot walk"));
                return Err(PreprocessError::io("list", path, source));
            }
        };
        if entry.depth() == 0 {
            continue;
        }
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden {
            skipped.push(SkippedInput {
                path: entry.path().display().to_string(),
                reason: "hidden".into(),
            });
            if entry.file_type().is_dir() {
                entries.skip_current_dir();
            }
            continue;
        }
        if entry.path_is_symlink() && !follow_links {
            let target = entry.path().canonicalize();
            if !target.as_ref().is_ok_and(|t| t.starts_with(&root)) {
                skipped.push(SkippedInput {
                    path: entry.path().display().to_string(),
                    reason: match target {
                        Ok(t) => format!(
                            "a link to {}, outside the input folder (--follow-links reads it)",
                            t.display()
                        ),
                        Err(e) => format!("a link that cannot be resolved: {e}"),
                    },
                });
                if entry.file_type().is_dir() {
                    entries.skip_current_dir();
                }
                continue;
            }
        }
        let kind = entry.file_type();
        if kind.is_file() {
            let rel = entry.path().strip_prefix(dir).unwrap_or(entry.path());
            files.push(rel.to_path_buf());
        } else if !kind.is_dir() {
            skipped.push(SkippedInput {
                path: entry.path().display().to_string(),
                reason: "not a regular file (a FIFO, socket or device): never read".into(),
            });
        }
    }
    files.sort();
    Ok((files, skipped))
}

/// Hadoop/Spark side files (`_SUCCESS`, `_committed_...`) are not data.
fn is_side_file(rel: &Path) -> bool {
    rel.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('_'))
}

fn expand_folder(
    dir: &Path,
    forced: Option<InputFormat>,
    follow_links: bool,
    sources: &mut Vec<Source>,
    skipped: &mut Vec<SkippedInput>,
) -> Result<()> {
    let (files, left_out) = walk(dir, follow_links)?;
    skipped.extend(left_out);
    let tabular = match forced {
        Some(InputFormat::Files) => false,
        Some(_) => true,
        None => files.iter().any(|f| InputFormat::from_path(f).is_some()),
    };
    if tabular {
        for rel in files {
            if is_side_file(&rel) {
                skipped.push(SkippedInput {
                    path: dir.join(&rel).display().to_string(),
                    reason: "a side file, not data".into(),
                });
                continue;
            }
            let path = dir.join(&rel);
            let format = match forced.or_else(|| InputFormat::from_path(&rel)) {
                Some(f) => f,
                None => return Err(PreprocessError::UnknownFormat { path }),
            };
            sources.push(Source::File {
                path,
                format,
                row_groups: None,
            });
        }
        return Ok(());
    }
    // ImageFolder: the label is the parent folder's name, indexed in sorted order.
    let label_of = |rel: &Path| {
        rel.parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut labels: Vec<String> = files.iter().map(|f| label_of(f)).collect();
    labels.sort();
    labels.dedup();
    let labels = Arc::new(labels);
    let rows: Vec<(String, i32)> = files
        .iter()
        .map(|f| {
            let label = label_of(f);
            let index = labels.binary_search(&label).expect("label was collected") as i32;
            (f.to_string_lossy().replace('\\', "/"), index)
        })
        .collect();
    for chunk in rows.chunks(FILES_PER_UNIT) {
        sources.push(Source::Files {
            root: dir.to_path_buf(),
            files: chunk.to_vec(),
            labels: labels.clone(),
        });
    }
    Ok(())
}

/// A global row shuffle for the cheapest case: every input is one folder's
/// files (one row each, as ImageFolder trees are). The files are put in a
/// seeded uniformly random order (Fisher-Yates) before anything is read, so
/// the rows come out as a global permutation without an external shuffle
/// (no spill of every image to disk and back). Returns whether it applied:
/// not for tabular inputs or several folders, which take the external
/// shuffle.
pub(crate) fn permute_files(inputs: &mut Inputs, seed: u64) -> bool {
    let mut root: Option<(&PathBuf, &Arc<Vec<String>>)> = None;
    for source in &inputs.sources {
        match source {
            Source::Files {
                root: r, labels, ..
            } => match root {
                None => root = Some((r, labels)),
                Some((first, _)) if first == r => {}
                Some(_) => return false,
            },
            Source::File { .. } => return false,
        }
    }
    let Some((root, labels)) = root.map(|(r, l)| (r.clone(), l.clone())) else {
        return false;
    };
    let mut rows: Vec<(String, i32)> = inputs
        .sources
        .drain(..)
        .flat_map(|s| match s {
            Source::Files { files, .. } => files,
            Source::File { .. } => unreachable!("checked above"),
        })
        .collect();
    shardfeed_format::permute::SplitMix64::new(shardfeed_format::permute::hash_words(&[
        seed,
        0x6669_6c65_7320_6f72,
    ]))
    .shuffle(&mut rows);
    inputs.sources = rows
        .chunks(FILES_PER_UNIT)
        .map(|chunk| Source::Files {
            root: root.clone(),
            files: chunk.to_vec(),
            labels: labels.clone(),
        })
        .collect();
    true
}

fn push_file(path: PathBuf, forced: Option<InputFormat>, sources: &mut Vec<Source>) -> Result<()> {
    let format = match forced.or_else(|| InputFormat::from_path(&path)) {
        Some(InputFormat::Files) | None => return Err(PreprocessError::UnknownFormat { path }),
        Some(f) => f,
    };
    sources.push(Source::File {
        path,
        format,
        row_groups: None,
    });
    Ok(())
}

/// Resolve the inputs into sources in a deterministic order, check that they
/// share one schema, and estimate their size.
pub(crate) fn resolve(given: &[String], options: &ShardOptions) -> Result<Inputs> {
    if given.is_empty() {
        return Err(PreprocessError::NoInputs);
    }
    let forced = options.format;
    let mut sources = Vec::new();
    let mut skipped = Vec::new();
    for input in given {
        let path = PathBuf::from(input);
        let manifest = if path.is_dir() {
            path.join(shardfeed_format::MANIFEST_FILE)
        } else {
            path.clone()
        };
        if matches!(forced, None | Some(InputFormat::Parquet))
            && manifest.file_name() == Some(shardfeed_format::MANIFEST_FILE.as_ref())
            && let Some(found) = shardfeed_dataset(&manifest)?
        {
            sources.extend(found);
        } else if path.is_dir() {
            expand_folder(
                &path,
                forced,
                options.follow_links,
                &mut sources,
                &mut skipped,
            )?;
        } else if path.is_file() {
            push_file(path, forced, &mut sources)?;
        } else if is_glob(input) {
            let mut matched: Vec<PathBuf> = glob::glob(input)
                .map_err(|e| PreprocessError::BadOption {
                    option: "INPUT",
                    reason: format!("bad pattern {input:?}: {e}"),
                })?
                .filter_map(|r| r.ok())
                .filter(|p| p.is_file())
                .collect();
            matched.sort();
            if matched.is_empty() {
                return Err(PreprocessError::NoMatch {
                    pattern: input.clone(),
                });
            }
            for p in matched {
                push_file(p, forced, &mut sources)?;
            }
        } else {
            return Err(PreprocessError::InputNotFound { path });
        }
    }
    if sources.is_empty() {
        return Err(PreprocessError::NoRows {
            inputs: given.join(", "),
        });
    }
    let (schema, estimated_bytes) = probe(&sources, options)?;
    Ok(Inputs {
        sources,
        schema,
        estimated_bytes,
        given: given.to_vec(),
        skipped,
    })
}

/// Manifests larger than this are not looked into (a 100,000-shard
/// dataset's is ~20 MiB).
const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// A shardfeed dataset or index given as an input (its folder or its
/// manifest): its shards, or the files it indexes, as Parquet inputs, so a
/// dataset can be sharded again (other shard sizes, another shuffle). `None`
/// when `manifest` is not a shardfeed manifest (a `manifest.json` among
/// other data is read as data).
fn shardfeed_dataset(manifest: &Path) -> Result<Option<Vec<Source>>> {
    #[derive(serde::Deserialize)]
    struct Probe {
        format: Option<serde_json::Value>,
    }
    if !manifest.is_file() || file_len(manifest) > MAX_MANIFEST_BYTES {
        return Ok(None);
    }
    let bytes = std::fs::read(manifest).map_err(|e| PreprocessError::io("read", manifest, e))?;
    let ours = serde_json::from_slice::<Probe>(&bytes)
        .is_ok_and(|p| p.format == Some(shardfeed_format::FORMAT_NAME.into()));
    if !ours {
        return Ok(None);
    }
    let url = manifest.display().to_string();
    let parsed = shardfeed_format::Manifest::from_json(&bytes, &url)?;
    let root = manifest.parent().unwrap_or(Path::new("."));
    let bases: Vec<PathBuf> = match &parsed.index {
        None => Vec::new(),
        Some(index) => (index.bases.iter())
            .map(|base| {
                url::Url::parse(base)
                    .ok()
                    .filter(|u| u.scheme() == "file")
                    .and_then(|u| u.to_file_path().ok())
                    .ok_or_else(|| PreprocessError::BadOption {
                        option: "INPUT",
                        reason: format!(
                            "{url} is an index of files under {}: give those files to `shard` \
                             (a remote index's files are read from their store)",
                            shardfeed_format::redact::url(base)
                        ),
                    })
            })
            .collect::<Result<_>>()?,
    };
    let sources = (parsed.shards.iter())
        .map(|shard| {
            let folder = match shard.base {
                Some(b) => &bases[b as usize],
                None => root,
            };
            Source::File {
                path: folder.join(&shard.path),
                format: InputFormat::Parquet,
                row_groups: None,
            }
        })
        .collect();
    Ok(Some(sources))
}

fn open_file(path: &Path) -> Result<File> {
    let file = File::open(path).map_err(|e| PreprocessError::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| PreprocessError::io("stat", path, e))?
        .len();
    if len == 0 {
        return Err(PreprocessError::EmptyFile {
            path: path.to_path_buf(),
        });
    }
    Ok(file)
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Infer the schema of all text inputs of `format` together, unless given.
fn text_schema(
    sources: &[Source],
    format: InputFormat,
    options: &ShardOptions,
) -> Result<Option<SchemaRef>> {
    if let Some(schema) = &options.schema {
        return Ok(Some(schema.clone()));
    }
    let mut merged: Option<(Schema, PathBuf)> = None;
    for source in sources {
        let Source::File {
            path, format: f, ..
        } = source
        else {
            continue;
        };
        if *f != format {
            continue;
        }
        // Lines past the bound on one value are refused while the schema is
        // inferred, as when the rows are read: inference holds a line whole
        // (and a JSON line as parsed values, many times its size).
        let max_line = options.max_value_bytes();
        let file = LineBound::new(open_file(path)?, max_line);
        let schema = guarded(path, || {
            Ok(match format {
                InputFormat::JsonLines => {
                    arrow_json::reader::infer_json_schema(BufReader::new(file), None)
                        .map_err(|e| json_error_location(path, max_line, e))?
                        .0
                }
                InputFormat::Csv => {
                    arrow_csv::reader::Format::default()
                        .with_header(true)
                        .infer_schema(file, None)
                        .map_err(|e| csv_error_location(path, e))?
                        .0
                }
                _ => unreachable!("only text formats are inferred"),
            })
        })?;
        check_columns(path, &schema, options)?;
        merged = Some(match merged {
            None => (schema, path.clone()),
            Some((acc, first)) => {
                let m = Schema::try_merge([acc, schema]).map_err(|e| {
                    PreprocessError::SchemaMismatch {
                        first: first.clone(),
                        other: path.clone(),
                        detail: e.to_string(),
                    }
                })?;
                (m, first)
            }
        });
    }
    Ok(merged.map(|(s, _)| Arc::new(s)))
}

/// Refuse `path`'s `schema` when Parquet cannot hold it (a malformed
/// input's decimal of precision 0: this input's error, not the encoder's
/// later) or when its columns (Parquet leaves) cost more than the memory
/// budget allows, naming the budget that would hold them.
fn check_columns(path: &Path, schema: &Schema, options: &ShardOptions) -> Result<()> {
    let max = options.effective_max_columns();
    let columns = parquet::arrow::ArrowSchemaConverter::new()
        .convert(schema)
        .map_err(|e| {
            PreprocessError::read(
                path,
                None,
                format!("its schema cannot be written as Parquet: {e}"),
            )
        })?
        .num_columns() as u64;
    if columns <= max {
        return Ok(());
    }
    let needed = columns
        .saturating_mul(crate::options::COLUMN_BYTES)
        .saturating_mul(2);
    Err(PreprocessError::read(
        path,
        None,
        format!(
            "it has {columns} columns; --memory-budget {} allows {max} (about {} each while shards are written): raise --memory-budget to at least {}, or set --max-columns (memory then grows past the budget by that much a column)",
            shardfeed_format::size::format_size(options.memory_budget),
            shardfeed_format::size::format_size(crate::options::COLUMN_BYTES),
            shardfeed_format::size::format_size(needed),
        ),
    ))
}

/// On an inference error, find the line it stops at: the first that is not
/// valid JSON, not an object, or whose types conflict with the lines before,
/// or one longer than `max_line` bytes.
fn json_error_location(
    path: &Path,
    max_line: u64,
    error: arrow_schema::ArrowError,
) -> PreprocessError {
    let Ok(file) = File::open(path) else {
        return PreprocessError::read(path, None, error);
    };
    // Infer again, a line at a time, to find the line the inference stops
    // at: one that is not JSON, not an object, or whose types conflict with
    // the lines before it (a field a list in one line, an object in another).
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    let mut number = 0u64;
    let mut found: Option<PreprocessError> = None;
    let at = |number: u64| Some(format!("line {number}"));
    let values = std::iter::from_fn(|| {
        loop {
            line.clear();
            let read = (&mut reader)
                .take(max_line.saturating_add(2))
                .read_until(b'\n', &mut line)
                .unwrap_or(0);
            if read == 0 {
                return None;
            }
            number += 1;
            let text = trim_line(&line);
            let stop = Some(Err(arrow_schema::ArrowError::JsonError(String::new())));
            if text.len() as u64 > max_line {
                found = Some(too_long(path, number, max_line));
                return stop;
            }
            if text.is_empty() {
                continue;
            }
            return match serde_json::from_slice::<serde_json::Value>(text) {
                Err(e) => {
                    found = Some(PreprocessError::read(path, at(number), e));
                    stop
                }
                Ok(v) if !v.is_object() => {
                    let kind = match v {
                        serde_json::Value::Array(_) => "an array",
                        serde_json::Value::String(_) => "a string",
                        serde_json::Value::Number(_) => "a number",
                        serde_json::Value::Bool(_) => "a boolean",
                        _ => "null",
                    };
                    let detail = format!("a JSON Lines record must be an object, not {kind}");
                    found = Some(PreprocessError::read(path, at(number), detail));
                    stop
                }
                Ok(v) => Some(Ok(v)),
            };
        }
    });
    let inferred = arrow_json::reader::infer_json_schema_from_iterator(values);
    match (found, inferred) {
        (Some(e), _) => e,
        (None, Err(e)) => PreprocessError::read(path, at(number), e),
        (None, Ok(_)) => PreprocessError::read(path, None, error),
    }
}

/// Name the line of the first CSV record of `path` whose field count
/// differs from its header's, or that is not UTF-8: the csv crate's
/// position (in `error`) counts one line short for every record after a
/// CRLF-terminated one. Fields are checked as they stream by (a field of any
/// length costs a fixed buffer); other errors keep `error`'s own words.
fn csv_error_location(path: &Path, error: arrow_schema::ArrowError) -> PreprocessError {
    match first_bad_record(path) {
        Ok(Some((line, detail))) => {
            PreprocessError::read(path, Some(format!("line {line}")), detail)
        }
        _ => PreprocessError::read(path, None, error),
    }
}

/// The line where the first record with another field count than the
/// header, or with a field that is not UTF-8, starts, and what is wrong.
fn first_bad_record(path: &Path) -> std::io::Result<Option<(u64, String)>> {
    use csv_core::ReadFieldResult;
    let mut file = File::open(path)?;
    let mut parser = csv_core::Reader::new();
    let mut input = vec![0u8; 1 << 16];
    // A field's bytes as they come, after the unfinished UTF-8 sequence (at
    // most 3 bytes) its previous piece ended with.
    let mut field = vec![0u8; 1 << 12];
    let mut tail = 0usize;
    let (mut len, mut pos) = (0usize, 0usize);
    // Newlines before the read position; the line the record starts on.
    let mut newlines = 0u64;
    let mut record_line = 1u64;
    let mut at_record_start = true;
    let mut fields = 0usize;
    let mut header: Option<usize> = None;
    loop {
        if pos == len {
            len = file.read(&mut input)?;
            pos = 0;
        }
        let chunk = &input[pos..len];
        if at_record_start {
            // Terminators and blank lines before a record are not part of it.
            let skip = chunk
                .iter()
                .position(|&b| b != b'\r' && b != b'\n')
                .unwrap_or(chunk.len());
            newlines += chunk[..skip].iter().filter(|&&b| b == b'\n').count() as u64;
            pos += skip;
            if pos < len {
                record_line = newlines + 1;
                at_record_start = false;
            } else if len > 0 {
                continue;
            }
        }
        let chunk = &input[pos..len];
        let (result, read, written) = parser.read_field(chunk, &mut field[tail..]);
        newlines += chunk[..read].iter().filter(|&&b| b == b'\n').count() as u64;
        pos += read;
        let end = match result {
            ReadFieldResult::InputEmpty | ReadFieldResult::OutputFull => None,
            ReadFieldResult::Field { record_end } => Some(record_end),
            ReadFieldResult::End => return Ok(None),
        };
        let filled = tail + written;
        tail = match std::str::from_utf8(&field[..filled]) {
            Ok(_) => 0,
            // A sequence cut at the piece's end continues in the next one.
            Err(e) if e.error_len().is_none() && end.is_none() => filled - e.valid_up_to(),
            Err(_) => {
                let detail = format!("field {} is not UTF-8", fields + 1);
                return Ok(Some((record_line, detail)));
            }
        };
        field.copy_within(filled - tail..filled, 0);
        if let Some(record_end) = end {
            fields += 1;
            if record_end {
                match header {
                    None => header = Some(fields),
                    Some(h) if h != fields => {
                        let plural = |n: usize| if n == 1 { "" } else { "s" };
                        let detail = format!(
                            "the record has {fields} field{}, the header {h}",
                            plural(fields)
                        );
                        return Ok(Some((record_line, detail)));
                    }
                    Some(_) => {}
                }
                fields = 0;
                at_record_start = true;
            }
        }
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    line.trim_ascii()
}

/// The schema of every source (the first one's, others must equal it) and
/// the estimated input bytes.
fn probe(sources: &[Source], options: &ShardOptions) -> Result<(SchemaRef, u64)> {
    let json = text_schema(sources, InputFormat::JsonLines, options)?;
    let csv = text_schema(sources, InputFormat::Csv, options)?;
    let mut first: Option<(SchemaRef, PathBuf)> = None;
    let mut bytes = 0u64;
    // Parquet's uncompressed sizes count encoded pages (dictionaries, bit
    // packing), often half the Arrow size: calibrate on one row group.
    let mut parquet_ratio: Option<f64> = None;
    for source in sources {
        let (schema, estimate) = guarded(&source.display_path(), || {
            Ok(match source {
                Source::File { path, format, .. } => match format {
                    InputFormat::Parquet => {
                        let builder = parquet_builder(path, &[])?.builder;
                        // Every Parquet input is probed here before any of
                        // its pages is read (the ratio below reads one row
                        // group).
                        check_pages(path, builder.metadata(), options.max_value_bytes())?;
                        let uncompressed: i64 = builder
                            .metadata()
                            .row_groups()
                            .iter()
                            .map(|rg| rg.total_byte_size())
                            .sum();
                        let schema = builder.schema().clone();
                        let ratio = match parquet_ratio {
                            Some(r) => r,
                            None => *parquet_ratio.insert(arrow_to_parquet_ratio(builder, path)?),
                        };
                        (schema, (uncompressed.max(0) as f64 * ratio) as u64)
                    }
                    InputFormat::Ipc => (ipc_schema(path)?, file_len(path)),
                    InputFormat::JsonLines => {
                        (json.clone().expect("inferred above"), file_len(path))
                    }
                    InputFormat::Csv => (csv.clone().expect("inferred above"), file_len(path)),
                    InputFormat::Files => unreachable!("folders become Source::Files"),
                },
                Source::Files { root, files, .. } => (
                    files_schema(),
                    files
                        .iter()
                        .map(|(f, _)| file_len(&root.join(f)) + 64)
                        .sum(),
                ),
            })
        })?;
        bytes += estimate;
        check_columns(&source.display_path(), &schema, options)?;
        if let Some(name) = shardfeed_format::duplicate_column(&schema) {
            return Err(PreprocessError::read(
                source.display_path(),
                None,
                format!(
                    "column {name:?} appears twice: a dataset's columns need distinct names (rename one)"
                ),
            ));
        }
        match &first {
            None => first = Some((schema, source.display_path())),
            Some((expected, first_path)) => {
                if let Some(detail) = schema_difference(expected, &schema) {
                    return Err(PreprocessError::SchemaMismatch {
                        first: first_path.clone(),
                        other: source.display_path(),
                        detail,
                    });
                }
            }
        }
    }
    let (schema, _) = first.expect("at least one source");
    Ok((schema, bytes))
}

/// A reader of one input file, made safe to drive on malformed bytes: it
/// ends at its first error (asked again, a reader may repeat the error
/// forever or panic), and a panic inside it (parquet's, arrow's IPC, CSV or
/// JSON readers, ours) is caught and becomes an error naming the file.
struct Guarded<I> {
    reader: I,
    path: PathBuf,
    done: bool,
}

impl<I> Guarded<I> {
    fn new(reader: I, path: PathBuf) -> Self {
        Guarded {
            reader,
            path,
            done: false,
        }
    }
}

impl<I: Iterator<Item = Result<RecordBatch>>> Iterator for Guarded<I> {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Result<RecordBatch>> {
        if self.done {
            return None;
        }
        let next = match shardfeed_format::panic::catch(|| self.reader.next()) {
            Ok(next) => next,
            Err(panic) => Some(Err(malformed(&self.path, &panic))),
        };
        if !matches!(next, Some(Ok(_))) {
            self.done = true;
        }
        next
    }
}

/// The error of a reader that panicked on `path`'s bytes.
fn malformed(path: &Path, panic: &str) -> PreprocessError {
    PreprocessError::read(
        path,
        None,
        format!("the reader failed on malformed data: {panic}"),
    )
}

/// Run `f`, which reads `path`; a panic in it is an error naming the file.
fn guarded<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    shardfeed_format::panic::catch(f).unwrap_or_else(|panic| Err(malformed(path, &panic)))
}

/// A Parquet reader of `path`. A file whose footer says it holds fewer rows
/// than its row groups do (old writers left the file-level count at 0) is
/// read by its row groups' counts: parquet's reader would read no row of it.
/// Its binary and string columns at `large` are read as views (see
/// [`ParquetInput`]).
fn parquet_builder(path: &Path, large: &[ColumnPath]) -> Result<ParquetInput> {
    use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
    use parquet::file::metadata::{FileMetaData, ParquetMetaData};
    let file = open_file(path)?;
    let err = |e| PreprocessError::read(path, None, e);
    let mut metadata =
        shardfeed_format::panic::catch(|| ArrowReaderMetadata::load(&file, Default::default()))
            .map_err(|panic| {
                PreprocessError::read(
                    path,
                    None,
                    format!("parquet's footer reader failed: {panic}"),
                )
            })?
            .map_err(err)?;
    let md = metadata.metadata().clone();
    let groups: i64 = md
        .row_groups()
        .iter()
        .map(|g| g.num_rows().max(0))
        .fold(0, i64::saturating_add);
    let viewed = crate::view::viewed_schema(metadata.schema(), large);
    let file_schema = viewed.as_ref().map(|_| metadata.schema().clone());
    let options = match viewed {
        Some(schema) => ArrowReaderOptions::new().with_schema(schema),
        None => ArrowReaderOptions::new(),
    };
    if md.file_metadata().num_rows() != groups {
        let f = md.file_metadata();
        let fixed = FileMetaData::new(
            f.version(),
            groups,
            f.created_by().map(str::to_string),
            f.key_value_metadata().cloned(),
            f.schema_descr_ptr(),
            f.column_orders().cloned(),
        );
        let fixed = ParquetMetaData::new(fixed, md.row_groups().to_vec());
        metadata = ArrowReaderMetadata::try_new(Arc::new(fixed), options).map_err(err)?;
    } else if file_schema.is_some() {
        metadata = ArrowReaderMetadata::try_new(md.clone(), options).map_err(err)?;
    }
    let file =
        RowGroupFile::new(file, &md, true).map_err(|e| PreprocessError::io("stat", path, e))?;
    Ok(ParquetInput {
        map_check: file.map_check(),
        builder: ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata),
        file_schema,
    })
}

/// The error of an input changed while it was read.
fn changed_error(path: &Path, change: FileChange) -> PreprocessError {
    let what = match change {
        FileChange::Truncated => "the file was truncated while it was read".to_string(),
        FileChange::Rewritten(len) => {
            format!("the file changed while it was read (now {len} bytes)")
        }
    };
    PreprocessError::read(path, None, what)
}

/// A Parquet input opened for reading.
struct ParquetInput {
    builder: ParquetRecordBatchReaderBuilder<RowGroupFile>,
    /// The file's own schema, where columns are read as views: each batch
    /// is turned back into it ([`crate::view::unview`]).
    file_schema: Option<SchemaRef>,
    /// The file's mapping, where it is read through one: checked after
    /// each batch, so that no batch made of a file changed under it (zeros
    /// past a truncation, another file's bytes) is handed on.
    map_check: Option<crate::parquet_file::MapCheck>,
}

/// Decoded bytes [`arrow_to_parquet_ratio`] measures at most.
const RATIO_SAMPLE_BYTES: u64 = 4 * READ_BATCH_BYTES;

/// Arrow bytes per Parquet uncompressed byte, measured on the first rows
/// of the first row group of `path` (batches of about [`READ_BATCH_BYTES`]
/// until [`RATIO_SAMPLE_BYTES`] are decoded, scaled to the row group's
/// rows): a writer's row group of 128 MB to 1 GB is not decoded whole on
/// the main thread before the readers start. A batch that fails to decode
/// fails the run here, naming the file (the reader keeps failing if asked
/// again, so its errors must never be skipped over).
fn arrow_to_parquet_ratio(
    builder: ParquetRecordBatchReaderBuilder<RowGroupFile>,
    path: &Path,
) -> Result<f64> {
    let Some(first) = builder.metadata().row_groups().first() else {
        return Ok(1.0);
    };
    let encoded = first.total_byte_size().max(1) as f64;
    let rows = first.num_rows().max(1) as u64;
    let per_row = (first.total_byte_size().max(1) as u64)
        .div_ceil(rows)
        .max(1);
    let batch_rows = (READ_BATCH_BYTES / per_row).clamp(1, 8192) as usize;
    let reader = builder
        .with_row_groups(vec![0])
        .with_batch_size(batch_rows)
        .build()
        .map_err(|e| PreprocessError::read(path, Some("row group 0".into()), e))?;
    let (mut decoded, mut read) = (0u64, 0u64);
    let reader = reader.map(|r| r.map_err(|e| PreprocessError::read(path, None, e)));
    for batch in Guarded::new(reader, path.to_path_buf()) {
        let batch = batch?;
        decoded += crate::measure::batch_bytes(&batch);
        read += batch.num_rows() as u64;
        if decoded >= RATIO_SAMPLE_BYTES {
            break;
        }
    }
    let whole = decoded as f64 * rows as f64 / read.max(1) as f64;
    Ok((whole / encoded).max(1.0))
}

/// The first difference between two schemas' fields, ignoring schema-level metadata.
pub(crate) fn schema_difference(expected: &Schema, found: &Schema) -> Option<String> {
    for (i, field) in expected.fields().iter().enumerate() {
        let Some(other) = found.fields().get(i) else {
            return Some(format!("field {i} `{}` is missing", field.name()));
        };
        if field.name() != other.name() {
            return Some(format!(
                "field {i} is `{}` in one and `{}` in the other",
                field.name(),
                other.name()
            ));
        }
        if field.data_type() != other.data_type() {
            return Some(format!(
                "field `{}` has type {} in one and {} in the other",
                field.name(),
                field.data_type(),
                other.data_type()
            ));
        }
        if field.is_nullable() != other.is_nullable() {
            return Some(format!(
                "field `{}` is nullable in only one of them",
                field.name()
            ));
        }
    }
    if found.fields().len() > expected.fields().len() {
        let extra = &found.fields()[expected.fields().len()];
        return Some(format!("field `{}` is extra", extra.name()));
    }
    None
}

fn is_ipc_file(file: &mut File) -> std::io::Result<bool> {
    let mut magic = [0u8; 6];
    let n = file.read(&mut magic)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(n == 6 && &magic == b"ARROW1")
}

fn ipc_schema(path: &Path) -> Result<SchemaRef> {
    let mut file = open_file(path)?;
    let is_file = is_ipc_file(&mut file).map_err(|e| PreprocessError::io("read", path, e))?;
    let schema = if is_file {
        arrow_ipc::reader::FileReader::try_new(file, None).map(|r| r.schema())
    } else {
        arrow_ipc::reader::StreamReader::try_new(BufReader::new(file), None).map(|r| r.schema())
    };
    schema.map_err(|e| PreprocessError::read(path, None, e))
}

/// Rows per batch of a text reader of `columns` columns: CSV's reader
/// sizes its field offsets as rows x columns up front (8,192 rows of 10,000
/// columns were 650 MB before a byte was read), JSON's tape grows the same
/// way; the batch is cut so that they stay near [`READ_BATCH_BYTES`].
fn text_batch_rows(columns: usize) -> usize {
    let per_row = (columns as u64).saturating_mul(16).max(1);
    (READ_BATCH_BYTES / per_row).clamp(1, READ_BATCH_ROWS as u64) as usize
}

/// The error of a line longer than `max` bytes.
fn too_long(path: &Path, line: u64, max: u64) -> PreprocessError {
    PreprocessError::read(
        path,
        Some(format!("line {line}")),
        format!(
            "the line is longer than {max} bytes, the most one value may hold (an eighth of --memory-budget): raise --memory-budget to at least 8 times the line's length to read it"
        ),
    )
}

/// A reader of a text file that fails on a line longer than `max` bytes
/// (CSV's reader holds a whole record): the error names where the line
/// starts, and the bytes past the bound are never handed on.
struct LineBound<R> {
    inner: R,
    max: u64,
    /// Bytes read so far, and where the current line started.
    read: u64,
    line_start: u64,
}

impl LineBound<File> {
    fn new(inner: File, max: u64) -> Self {
        LineBound {
            inner,
            max,
            read: 0,
            line_start: 0,
        }
    }
}

impl<R: Read> Read for LineBound<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let got = &buf[..n];
        let too_long = |start: u64| {
            std::io::Error::other(format!(
                "the line at byte {start} is longer than {} bytes, the most one value may hold (an eighth of --memory-budget): raise --memory-budget to at least 8 times the line's length to read it",
                self.max,
            ))
        };
        // Only the runs at the ends can be long unless the read is longer
        // than the bound itself: then every line is looked at.
        if n as u64 > self.max {
            let mut start = self.line_start;
            for (i, &b) in got.iter().enumerate() {
                let at = self.read + i as u64;
                if b == b'\n' {
                    start = at + 1;
                } else if at - start >= self.max {
                    return Err(too_long(start));
                }
            }
            self.line_start = start;
        } else {
            let first = got.iter().position(|&b| b == b'\n').unwrap_or(n);
            if self.read + first as u64 - self.line_start > self.max {
                return Err(too_long(self.line_start));
            }
            if let Some(last) = got.iter().rposition(|&b| b == b'\n') {
                self.line_start = self.read + last as u64 + 1;
            }
        }
        self.read += n as u64;
        if self.read - self.line_start > self.max {
            return Err(too_long(self.line_start));
        }
        Ok(n)
    }
}

/// Check the page headers of `path`'s column chunks before parquet's reader sizes its buffers by them: each page must
/// lie inside its chunk and decompress to at most `max_page` bytes (one
/// value's bound). parquet's reader zero-fills a buffer of the size a page
/// header claims, so a forged header (up to 2 GiB) would cost that much
/// memory before the read failed. Headers are read in place from a mapping
/// of the file (one small positioned read a page where it cannot be mapped).
fn check_pages(
    path: &Path,
    metadata: &parquet::file::metadata::ParquetMetaData,
    max_page: u64,
) -> Result<()> {
    let file = File::open(path).map_err(|e| PreprocessError::io("open", path, e))?;
    // Headers read in place from a mapping of the file: one `pread` a page
    // (23 K of them on the generator's 300 MB table) was a quarter of
    // `shard`'s single-threaded start.
    let len = file
        .metadata()
        .map_err(|e| PreprocessError::io("stat", path, e))?
        .len();
    let mapped = MappedFile::map(&file, len);
    let checked = check_headers(path, metadata, max_page, &file, mapped.as_ref());
    // Zeros read past a truncation are no headers to trust: a file changed
    // under its mapping is named as such, whatever its headers gave.
    match mapped.and_then(|m| m.changed(&file)) {
        Some(change) => Err(changed_error(path, change)),
        None => checked,
    }
}

/// [`check_pages`] of the open `file`, its headers read from `mapped`
/// where it is mapped.
fn check_headers(
    path: &Path,
    metadata: &parquet::file::metadata::ParquetMetaData,
    max_page: u64,
    file: &File,
    mapped: Option<&MappedFile>,
) -> Result<()> {
    let mut buf = Vec::new();
    for (g, group) in metadata.row_groups().iter().enumerate() {
        for chunk in group.columns() {
            let bad = |reason: String| {
                PreprocessError::read(
                    path,
                    Some(format!(
                        "row group {g} column {}",
                        chunk.column_path().string()
                    )),
                    reason,
                )
            };
            let (start, len) = chunk.byte_range();
            let end = start
                .checked_add(len)
                .ok_or_else(|| bad("its byte range overflows".into()))?;
            let mut at = start;
            while at < end {
                let header = match mapped {
                    Some(mapped) => page_header_in(mapped, at, end),
                    None => page_header_at(file, at, end, &mut buf),
                }
                .map_err(|e| bad(format!("page at byte {at}: {e}")))?;
                let (uncompressed, compressed) = (header.0, header.1);
                if uncompressed < 0 || compressed < 0 {
                    return Err(bad(format!("page at byte {at} has a negative size")));
                }
                if uncompressed as u64 > max_page {
                    return Err(bad(format!(
                        "page at byte {at} decompresses to {uncompressed} bytes, more than one value may hold ({max_page} bytes, an eighth of --memory-budget)"
                    )));
                }
                at = at
                    .checked_add(header.2)
                    .and_then(|a| a.checked_add(compressed as u64))
                    .filter(|&a| a <= end)
                    .ok_or_else(|| bad(format!("page at byte {at} runs past its column chunk")))?;
            }
        }
    }
    Ok(())
}

/// [`page_header_at`], read from `mapped` in place.
fn page_header_in(
    mapped: &MappedFile,
    at: u64,
    end: u64,
) -> std::result::Result<(i32, i32, u64), String> {
    let bytes = usize::try_from(at)
        .ok()
        .zip(usize::try_from(end).ok())
        .and_then(|(at, end)| mapped.get(at..end))
        .ok_or_else(|| {
            format!(
                "its column chunk ends past the file's {} bytes",
                mapped.len()
            )
        })?;
    let mut thrift = shardfeed_format::thrift::Thrift::new(bytes);
    let h = thrift.page_header()?;
    Ok((h.uncompressed, h.compressed, thrift.at as u64))
}

/// The page header at byte `at` of `file` (ending before `end`): its
/// uncompressed and compressed sizes and its own length. Headers are read
/// in growing pieces (most take a few dozen bytes).
fn page_header_at(
    file: &File,
    at: u64,
    end: u64,
    buf: &mut Vec<u8>,
) -> std::result::Result<(i32, i32, u64), String> {
    use std::os::unix::fs::FileExt;
    let mut want = 4096u64;
    loop {
        let n = want.min(end - at) as usize;
        buf.resize(n, 0);
        file.read_exact_at(buf, at).map_err(|e| e.to_string())?;
        let mut thrift = shardfeed_format::thrift::Thrift::new(buf);
        match thrift.page_header() {
            Ok(h) => return Ok((h.uncompressed, h.compressed, thrift.at as u64)),
            Err(e) if n as u64 == end - at || want >= 16 << 20 => return Err(e),
            Err(_) => want *= 16,
        }
    }
}

/// A stream of batches from one source.
pub(crate) type BatchIter = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// Open `source` as a stream of batches in `schema`: a panic of a reader on
/// malformed bytes, opening or reading, is an error naming the file.
///
/// A line of a text input longer than `max_value` bytes is refused naming
/// the file and the line, before it is held: one value must fit the budget.
/// The binary and string columns of a Parquet input at `large` (columns of
/// large values) are read as views of their pages and copied once
/// (`view.rs`); they come out in their own types all the same.
pub(crate) fn open(
    source: &Source,
    schema: &SchemaRef,
    max_value: u64,
    large: &[ColumnPath],
) -> Result<BatchIter> {
    let path = source.display_path();
    let batches = guarded(&path, || open_unguarded(source, schema, max_value, large))?;
    Ok(Box::new(Guarded::new(batches, path)))
}

fn open_unguarded(
    source: &Source,
    schema: &SchemaRef,
    max_value: u64,
    large: &[ColumnPath],
) -> Result<BatchIter> {
    match source {
        Source::File {
            path,
            format,
            row_groups,
        } => {
            let path = path.clone();
            match format {
                InputFormat::Parquet => {
                    let ParquetInput {
                        builder,
                        file_schema,
                        map_check,
                    } = parquet_builder(&path, large)?;
                    let meta = builder.metadata();
                    let rows = meta.file_metadata().num_rows().max(1) as u64;
                    let bytes: i64 = meta
                        .row_groups()
                        .iter()
                        .map(|rg| rg.total_byte_size())
                        .sum();
                    let per_row = (bytes.max(1) as u64).div_ceil(rows).max(1);
                    let batch_rows = (READ_BATCH_BYTES / per_row).clamp(1, 65536) as usize;
                    let mut builder = builder.with_batch_size(batch_rows);
                    if let Some(groups) = row_groups {
                        builder = builder.with_row_groups(groups.clone());
                    }
                    let reader = builder
                        .build()
                        .map_err(|e| PreprocessError::read(&path, None, e))?;
                    Ok(Box::new(reader.map(move |r| {
                        // A file changed under its mapping is reported as
                        // such, whatever its bytes made of the batch (zeros
                        // past a truncation read as a damaged page).
                        let changed = || map_check.as_ref().and_then(|m| m.changed());
                        let batch = match r {
                            Ok(batch) => batch,
                            Err(e) => {
                                return Err(match changed() {
                                    Some(change) => changed_error(&path, change),
                                    None => PreprocessError::read(&path, None, e),
                                });
                            }
                        };
                        if let Some(change) = changed() {
                            return Err(changed_error(&path, change));
                        }
                        match &file_schema {
                            Some(schema) => crate::view::unview(batch, schema)
                                .map_err(|e| PreprocessError::read(&path, None, e)),
                            None => Ok(batch),
                        }
                    })))
                }
                InputFormat::Ipc => {
                    let mut file = open_file(&path)?;
                    let is_file = is_ipc_file(&mut file)
                        .map_err(|e| PreprocessError::io("read", &path, e))?;
                    let p = path.clone();
                    let wrap =
                        move |r: std::result::Result<RecordBatch, arrow_schema::ArrowError>| {
                            r.map_err(|e| PreprocessError::read(&p, None, e))
                        };
                    if is_file {
                        let reader = arrow_ipc::reader::FileReader::try_new(file, None)
                            .map_err(|e| PreprocessError::read(&path, None, e))?;
                        Ok(Box::new(reader.map(wrap)))
                    } else {
                        let reader =
                            arrow_ipc::reader::StreamReader::try_new(BufReader::new(file), None)
                                .map_err(|e| PreprocessError::read(&path, None, e))?;
                        Ok(Box::new(reader.map(wrap)))
                    }
                }
                InputFormat::Csv => {
                    let file = LineBound::new(open_file(&path)?, max_value);
                    let reader = arrow_csv::ReaderBuilder::new(schema.clone())
                        .with_header(true)
                        .with_batch_size(text_batch_rows(schema.fields().len()))
                        .build(file)
                        .map_err(|e| PreprocessError::read(&path, None, e))?;
                    Ok(Box::new(reader.map(move |r| {
                        r.map_err(|e| PreprocessError::read(&path, None, e))
                    })))
                }
                InputFormat::JsonLines => {
                    Ok(Box::new(JsonLines::open(path, schema.clone(), max_value)?))
                }
                InputFormat::Files => unreachable!("folders become Source::Files"),
            }
        }
        Source::Files {
            root,
            files,
            labels,
        } => Ok(Box::new(FilesReader {
            max_value,
            root: root.clone(),
            files: files.clone().into_iter(),
            labels: labels.clone(),
            schema: schema.clone(),
        })),
    }
}

/// A line's number and its byte range in a chunk.
type LineSpan = (u64, std::ops::Range<usize>);

/// JSON Lines, decoded in chunks of lines so that errors name the line.
struct JsonLines {
    path: PathBuf,
    reader: BufReader<File>,
    schema: SchemaRef,
    decoder: arrow_json::reader::Decoder,
    line_number: u64,
    line: Vec<u8>,
    /// Lines per chunk (fewer for many columns: see [`text_batch_rows`]).
    batch_rows: usize,
    /// The longest line read.
    max_line: u64,
}

impl JsonLines {
    fn open(path: PathBuf, schema: SchemaRef, max_line: u64) -> Result<Self> {
        let reader = BufReader::with_capacity(1 << 20, open_file(&path)?);
        let batch_rows = text_batch_rows(schema.fields().len());
        let decoder = Self::decoder(&schema, batch_rows)
            .map_err(|e| PreprocessError::read(&path, None, e))?;
        Ok(JsonLines {
            path,
            reader,
            schema,
            decoder,
            line_number: 0,
            line: Vec::new(),
            batch_rows,
            max_line,
        })
    }

    fn decoder(
        schema: &SchemaRef,
        batch_rows: usize,
    ) -> std::result::Result<arrow_json::reader::Decoder, arrow_schema::ArrowError> {
        // Strict: a field missing from the schema is an error, never silently dropped.
        arrow_json::ReaderBuilder::new(schema.clone())
            .with_batch_size(batch_rows + 1)
            .with_strict_mode(true)
            .build_decoder()
    }

    /// Read up to a batch of non-blank lines (and about [`READ_BATCH_BYTES`]):
    /// the bytes and each line's number.
    fn read_chunk(&mut self) -> Result<(Vec<u8>, Vec<LineSpan>)> {
        let mut chunk = Vec::new();
        let mut lines = Vec::new();
        while lines.len() < self.batch_rows && (chunk.len() as u64) < READ_BATCH_BYTES {
            self.line.clear();
            let n = (&mut self.reader)
                .take(self.max_line.saturating_add(2))
                .read_until(b'\n', &mut self.line)
                .map_err(|e| PreprocessError::io("read", &self.path, e))?;
            if n == 0 {
                break;
            }
            self.line_number += 1;
            if trim_line(&self.line).len() as u64 > self.max_line {
                return Err(too_long(&self.path, self.line_number, self.max_line));
            }
            let text = trim_line(&self.line);
            if text.is_empty() {
                continue;
            }
            let start = chunk.len();
            chunk.extend_from_slice(text);
            lines.push((self.line_number, start..chunk.len()));
            chunk.push(b'\n');
        }
        Ok((chunk, lines))
    }

    /// Find which line of a failed chunk is at fault.
    fn locate(
        &self,
        chunk: &[u8],
        lines: &[(u64, std::ops::Range<usize>)],
        error: arrow_schema::ArrowError,
    ) -> PreprocessError {
        for (number, range) in lines {
            let text = &chunk[range.clone()];
            if let Err(e) = serde_json::from_slice::<serde_json::Value>(text) {
                return PreprocessError::read(&self.path, Some(format!("line {number}")), e);
            }
            let decoded = Self::decoder(&self.schema, 1).and_then(|mut d| {
                d.decode(text)?;
                d.flush()
            });
            if let Err(e) = decoded {
                return PreprocessError::read(&self.path, Some(format!("line {number}")), e);
            }
        }
        let location = lines
            .first()
            .map(|(first, _)| format!("lines {first}..={}", lines.last().map_or(*first, |l| l.0)));
        PreprocessError::read(&self.path, location, error)
    }
}

impl Iterator for JsonLines {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        let (chunk, lines) = match self.read_chunk() {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        if lines.is_empty() {
            return None;
        }
        let decoded = self
            .decoder
            .decode(&chunk)
            .and_then(|_| self.decoder.flush());
        match decoded {
            Ok(Some(batch)) => Some(Ok(batch)),
            Ok(None) => None,
            Err(e) => {
                let err = self.locate(&chunk, &lines, e);
                Some(Err(err))
            }
        }
    }
}

/// Rows of a folder input: one per file.
struct FilesReader {
    root: PathBuf,
    files: std::vec::IntoIter<(String, i32)>,
    labels: Arc<Vec<String>>,
    schema: SchemaRef,
    /// The largest file read (see [`ShardOptions::max_value_bytes`]).
    max_value: u64,
}

impl Iterator for FilesReader {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        let mut paths = Vec::new();
        let mut labels = Vec::new();
        let mut indices = Vec::new();
        // The files' bytes are read straight into the column's buffer: one
        // copy of each, never more than `max_value` of one file.
        let mut values: Vec<u8> = Vec::new();
        let mut offsets: Vec<i32> = vec![0];
        for (rel, label) in self.files.by_ref() {
            let full = self.root.join(&rel);
            let read = File::open(&full).and_then(|f| {
                f.take(self.max_value.saturating_add(1))
                    .read_to_end(&mut values)
            });
            let n = match read {
                Ok(n) => n as u64,
                Err(e) => return Some(Err(PreprocessError::io("read", full, e))),
            };
            if n > self.max_value {
                let size = std::fs::metadata(&full).map_or(n, |m| m.len().max(n));
                return Some(Err(PreprocessError::read(
                    full,
                    None,
                    format!(
                        "the file is larger than {} bytes, the most one value may hold (an eighth of --memory-budget): raise --memory-budget to at least {} to read it",
                        self.max_value,
                        shardfeed_format::size::format_size(size.saturating_mul(8))
                    ),
                )));
            }
            let Ok(end) = i32::try_from(values.len()) else {
                return Some(Err(PreprocessError::read(
                    full,
                    None,
                    "a batch of files would hold more than 2 GiB",
                )));
            };
            offsets.push(end);
            paths.push(rel);
            labels.push(self.labels[label as usize].clone());
            indices.push(label);
            if values.len() as u64 >= READ_BATCH_BYTES || paths.len() >= 1024 {
                break;
            }
        }
        if paths.is_empty() {
            return None;
        }
        let contents = BinaryArray::new(
            arrow_buffer::OffsetBuffer::new(offsets.into()),
            arrow_buffer::Buffer::from_vec(values),
            None,
        );
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(paths)),
            Arc::new(StringArray::from(labels)),
            Arc::new(Int32Array::from(indices)),
            Arc::new(contents),
        ];
        Some(
            RecordBatch::try_new(self.schema.clone(), columns)
                .map_err(|e| PreprocessError::read(&self.root, None, e)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::first_bad_record;

    fn scan(bytes: &[u8]) -> Option<(u64, String)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.csv");
        std::fs::write(&path, bytes).unwrap();
        first_bad_record(&path).unwrap()
    }

    #[test]
    fn bad_records_are_found_across_the_scanners_buffers() {
        // A quoted field of 100,000 two-byte characters (cut between the
        // bytes of one at many buffer ends) spanning lines is valid UTF-8.
        let long = "\u{e9}\n".repeat(50_000);
        let ok = format!("a,b\r\n1,\"{long}\"\r\n\r\n2,3\r\n");
        assert_eq!(scan(ok.as_bytes()), None);
        let lines = 2 + 50_000 + 1;
        // Then a record with one field, on the line after the blank one.
        let ragged = format!("{ok}4\r\n");
        let line = lines + 2;
        assert_eq!(
            scan(ragged.as_bytes()),
            Some((line, "the record has 1 field, the header 2".into()))
        );
        // A long field ending in a cut sequence is not UTF-8.
        let mut cut = format!("a,b\n1,\"{long}").into_bytes();
        cut.extend_from_slice(b"\xc3\"\n");
        assert_eq!(scan(&cut), Some((2, "field 2 is not UTF-8".into())));
        assert_eq!(scan(b"a,b\n1,2\n"), None);
    }
}

#[cfg(test)]
mod view_tests {
    use std::sync::Arc;

    use arrow_array::builder::{BinaryBuilder, LargeStringBuilder, StringBuilder};
    use arrow_array::{ArrayRef, Int64Array, LargeBinaryArray, RecordBatch, StructArray};
    use arrow_schema::{DataType, Field, Fields};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    use parquet::schema::types::ColumnPath;

    use super::{InputFormat, Source, open};

    /// Columns of large values, nullable and not, of every offset width, at
    /// the top level and in a struct (as Hugging Face stores an `image`),
    /// with nulls, empty values and multi-byte characters, beside columns
    /// read as before.
    fn batch(rows: usize) -> RecordBatch {
        let mut next = 0x2545_F491_4F6C_DD1Du64;
        let mut random = move || {
            next ^= next << 13;
            next ^= next >> 7;
            next ^= next << 17;
            next
        };
        let mut blobs = BinaryBuilder::new();
        let mut docs = StringBuilder::new();
        let mut large_docs = LargeStringBuilder::new();
        let mut paths = StringBuilder::new();
        let mut bytes = BinaryBuilder::new();
        let mut large = Vec::new();
        for i in 0..rows {
            let len = (random() % 3000) as usize;
            let blob: Vec<u8> = (0..len).map(|_| random() as u8).collect();
            match i % 11 {
                3 => blobs.append_null(),
                5 => blobs.append_value(b""),
                // A value repeated: parquet's writer puts it in its dictionary.
                7 => blobs.append_value(b"the same value each time"),
                _ => blobs.append_value(&blob),
            }
            let doc = format!("{i} \u{e9}t\u{e9} \u{1f600} {}", "mot ".repeat(len / 8));
            if i % 13 == 4 {
                docs.append_null();
            } else {
                docs.append_value(&doc);
            }
            large_docs.append_value(&doc);
            paths.append_value(format!("img/{i}.jpg"));
            bytes.append_value(&blob[..len / 2]);
            large.push(blob);
        }
        let image = StructArray::new(
            Fields::from(vec![
                Field::new("bytes", DataType::Binary, false),
                Field::new("path", DataType::Utf8, false),
            ]),
            vec![Arc::new(bytes.finish()), Arc::new(paths.finish())],
            None,
        );
        RecordBatch::try_from_iter_with_nullable([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
                false,
            ),
            ("blob", Arc::new(blobs.finish()), true),
            (
                "large_blob",
                Arc::new(LargeBinaryArray::from_iter_values(large.iter())),
                false,
            ),
            ("doc", Arc::new(docs.finish()), true),
            ("large_doc", Arc::new(large_docs.finish()), false),
            ("image", Arc::new(image), false),
        ])
        .unwrap()
    }

    /// Reading the columns of large values as views gives the batches
    /// parquet's reader gives: the same types, schema and values, through
    /// dictionary and `PLAIN` pages, V1 and V2, several row groups.
    #[test]
    fn large_values_read_as_views_equal_the_values_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let written = batch(700);
        let large: Vec<ColumnPath> = ["blob", "large_blob", "doc", "large_doc"]
            .into_iter()
            .map(ColumnPath::from)
            .chain([ColumnPath::new(vec!["image".into(), "bytes".into()])])
            .collect();
        for (k, v2) in [(0, false), (1, true)] {
            let path = dir.path().join(format!("in{k}.parquet"));
            let props = WriterProperties::builder()
                .set_writer_version(if v2 {
                    parquet::file::properties::WriterVersion::PARQUET_2_0
                } else {
                    parquet::file::properties::WriterVersion::PARQUET_1_0
                })
                // Dictionaries that fill up (PLAIN pages after them), small
                // pages and several row groups.
                .set_dictionary_page_size_limit(64 << 10)
                .set_data_page_size_limit(32 << 10)
                .set_max_row_group_row_count(Some(300))
                .build();
            let mut writer = ArrowWriter::try_new(
                std::fs::File::create(&path).unwrap(),
                written.schema(),
                Some(props),
            )
            .unwrap();
            writer.write(&written).unwrap();
            writer.close().unwrap();
            let source = Source::File {
                path,
                format: InputFormat::Parquet,
                row_groups: None,
            };
            let read = |large: &[ColumnPath]| -> Vec<RecordBatch> {
                open(&source, &written.schema(), u64::MAX, large)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap()
            };
            let (whole, viewed) = (read(&[]), read(&large));
            assert!(whole.len() > 1);
            assert_eq!(viewed, whole);
            let all = arrow_select::concat::concat_batches(&written.schema(), &viewed).unwrap();
            assert_eq!(all.columns(), written.columns());
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod changed_tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::{InputFormat, Source, open};

    /// A Parquet file of 20,000 rows of 1 KiB values in row groups of 2,000
    /// (several batches), its modification time far in the past.
    fn written(path: &std::path::Path) -> RecordBatch {
        let rows = 20_000i64;
        let ids = Int64Array::from_iter_values(0..rows);
        let values = BinaryArray::from_iter_values((0..rows).map(|i| vec![(i % 251) as u8; 1024]));
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(ids) as ArrayRef),
            ("value", Arc::new(values) as ArrayRef),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(2000))
            .set_dictionary_enabled(false)
            .build();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_times(std::fs::FileTimes::new().set_modified(old))
            .unwrap();
        batch
    }

    /// An input truncated (past the next batch's pages: through a mapping,
    /// their touch raises `SIGBUS`), or written in place, while `shard`
    /// reads it: the next batch is an error naming the file and the change,
    /// never a crash or a batch of other bytes; an input left alone reads
    /// whole.
    #[test]
    fn an_input_changed_while_it_is_read_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        for change in ["none", "truncated", "written"] {
            let path = dir.path().join(format!("{change}.parquet"));
            let whole = written(&path);
            let source = Source::File {
                path: path.clone(),
                format: InputFormat::Parquet,
                row_groups: None,
            };
            let mut batches = open(&source, &whole.schema(), u64::MAX, &[]).unwrap();
            let first = batches.next().unwrap().unwrap();
            assert!(first.num_rows() < whole.num_rows());
            let len = std::fs::metadata(&path).unwrap().len();
            match change {
                "truncated" => std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(len / 10)
                    .unwrap(),
                "written" => {
                    use std::os::unix::fs::FileExt;
                    let f = std::fs::File::options().write(true).open(&path).unwrap();
                    f.write_all_at(&[0xAB; 4096], len / 2).unwrap();
                }
                _ => {}
            }
            let rest: Vec<_> = batches.collect();
            if change == "none" {
                let mut all = vec![first];
                all.extend(rest.into_iter().map(Result::unwrap));
                let all = arrow_select::concat::concat_batches(&whole.schema(), &all).unwrap();
                assert_eq!(all, whole);
                continue;
            }
            let error = rest
                .iter()
                .find_map(|r| r.as_ref().err())
                .unwrap_or_else(|| panic!("{change}: no error"))
                .to_string();
            assert!(
                error.contains(&format!("{change}.parquet")) && error.contains("while it was read"),
                "{error}"
            );
            // Every batch before the error holds the rows written.
            let good: Vec<RecordBatch> = std::iter::once(first)
                .chain(rest.into_iter().map_while(Result::ok))
                .collect();
            let good = arrow_select::concat::concat_batches(&whole.schema(), &good).unwrap();
            assert_eq!(good, whole.slice(0, good.num_rows()), "{change}");
        }
    }
}
