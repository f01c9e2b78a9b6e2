use arrow_schema::Schema;
use serde::{Deserialize, Serialize};

use crate::{Crc32, FormatError, Result};

/// The format name written in every manifest.
pub const FORMAT_NAME: &str = "shardfeed";
/// The manifest version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's file name at the dataset root.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The relative path of shard `index` of a single-task run.
pub fn shard_path(index: usize) -> String {
    format!("shards/part-{index:06}.parquet")
}

/// The relative path of shard `index` written by task `task` of a split run.
pub fn task_shard_path(task: usize, index: usize) -> String {
    format!("shards/task-{task:05}-part-{index:06}.parquet")
}

/// Refuse shard paths that are absolute, escape the dataset, or are not plain
/// relative paths with `/` separators.
pub fn validate_shard_path(path: &str) -> Result<()> {
    if path.contains(':') {
        return Err(FormatError::BadShardPath {
            path: path.to_string(),
            reason: "must be relative to the dataset",
        });
    }
    validate_index_path(path)
}

/// Refuse paths of an index's files that are absolute, escape their base, or
/// are not plain relative paths with `/` separators. Unlike a shard's path,
/// a `:` is allowed (files written by other tools have them, e.g. times in
/// partition folders): the path is only ever joined to its base, never read
/// as a URL.
pub fn validate_index_path(path: &str) -> Result<()> {
    let bad = |reason| {
        Err(FormatError::BadShardPath {
            path: path.to_string(),
            reason,
        })
    };
    if path.is_empty() {
        return bad("empty");
    }
    if path.starts_with('/') {
        return bad("must be relative to the dataset");
    }
    if path.contains('\\') {
        return bad("must use '/' separators");
    }
    if path
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return bad("must not contain empty, '.' or '..' components");
    }
    Ok(())
}

/// How a dataset's shards were written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteOptions {
    /// Always `"zstd"` for shards written by shardfeed.
    pub compression: String,
    /// The zstd level.
    pub zstd_level: i32,
    /// Target compressed bytes per shard.
    pub shard_size: u64,
    /// Rows per row group, when fixed by the user.
    pub row_group_rows: Option<u64>,
    /// Target uncompressed bytes per row group, when rows were not fixed.
    pub row_group_bytes: Option<u64>,
    /// Target for row groups once the rows averaged over 64 KiB (images,
    /// audio), where it differs from `row_group_bytes` (absent in manifests
    /// written before it, and where a size was set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub large_row_group_bytes: Option<u64>,
    /// Seed of the global row shuffle, if the rows were shuffled.
    pub shuffle_seed: Option<u64>,
    /// The tokenizer that turned a text column into token ids while
    /// sharding (`shard --tokenizer`), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerRecord>,
}

/// What `shard --tokenizer` recorded of its tokenizer: enough to tell which
/// file made the ids and to find the end-of-text id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerRecord {
    /// The tokenizer file's name (without its folder).
    pub file: String,
    /// SHA-256 of the file's bytes, in hex.
    pub sha256: String,
    /// Vocabulary size, added tokens included.
    pub vocab_size: u64,
    /// The end-of-text id, when the tokenizer marks one or `--eos-token` named it.
    pub eos_id: Option<u32>,
    /// Whether the end-of-text id was appended to every document.
    pub add_eos: bool,
    /// The text column that was tokenized.
    pub text_column: String,
    /// The column holding the ids (`list<int32>`, or `list<uint32>` for
    /// vocabularies past 2^31).
    pub tokens_column: String,
}

/// One shard of a dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// Path relative to the dataset root, e.g. `shards/part-000000.parquet`.
    pub path: String,
    /// Rows in the shard.
    pub rows: u64,
    /// Size of the shard file in bytes.
    pub bytes: u64,
    /// Rows of each row group, in file order.
    pub row_groups: Vec<u64>,
    /// Length of the footer: the Thrift `FileMetaData`, its 4-byte length and
    /// the `PAR1` magic, i.e. the last `footer_len` bytes of the file.
    pub footer_len: u64,
    /// CRC-32 of the last `footer_len` bytes.
    pub footer_crc32: Crc32,
    /// CRC-32 of the whole file: always for shards `shard` wrote; for the
    /// files of an index only when it was made with `--checksums`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<Crc32>,
    /// For a file of an index: which of [`IndexRecord::bases`] `path` is
    /// relative to (absent for a dataset's own shards, which lie under the
    /// dataset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<u32>,
    /// For a file of an index: what identified it when it was indexed,
    /// checked again before its bytes are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<Fingerprint>,
    /// For a file of an index made with `--checksums`: its column chunks'
    /// checksums, encoded as `shard` writes them in a footer's
    /// `shardfeed.chunk_xxh3` entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_checksums: Option<String>,
    /// For a file of an index made with `--checksums`: the pages of its
    /// column chunks of more than one page (a chunk read in parts is checked
    /// page by page); in the manifest as [`crate::PageChecksums::encode`]
    /// writes them, parsed once when it is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_checksums: Option<crate::PageChecksums>,
}

/// What identified an indexed file when it was indexed (its size is the
/// entry's `bytes`, its footer's checksum `footer_crc32`): a file whose
/// fingerprint no longer matches was changed, and is not read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The store's ETag (object stores, and local files through
    /// `object_store`'s scheme of inode, size and time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// The store's object version, where the bucket keeps versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Last modification, in nanoseconds since the Unix epoch (local files'
    /// own precision; object stores report milliseconds or seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_ns: Option<i64>,
}

/// The type that holds values of both `a` and `b`, where an index may
/// widen one to the other: the same type, integers of one signedness to
/// the wider, `float32` to `float64`; `None` otherwise.
pub fn widest(
    a: &arrow_schema::DataType,
    b: &arrow_schema::DataType,
) -> Option<arrow_schema::DataType> {
    use arrow_schema::DataType as T;
    if a.equals_datatype(b) {
        return Some(a.clone());
    }
    let rank = |t: &T| -> Option<(u8, u8)> {
        Some(match t {
            T::Int8 => (0, 1),
            T::Int16 => (0, 2),
            T::Int32 => (0, 4),
            T::Int64 => (0, 8),
            T::UInt8 => (1, 1),
            T::UInt16 => (1, 2),
            T::UInt32 => (1, 4),
            T::UInt64 => (1, 8),
            T::Float32 => (2, 4),
            T::Float64 => (2, 8),
            _ => return None,
        })
    };
    let (ka, wa) = rank(a)?;
    let (kb, wb) = rank(b)?;
    (ka == kb).then(|| if wa >= wb { a.clone() } else { b.clone() })
}

/// Whether a file's column of type `from` reads as an index's `to`
/// ([`widest`] of the two is `to`).
pub fn widens_to(from: &arrow_schema::DataType, to: &arrow_schema::DataType) -> bool {
    widest(from, to).is_some_and(|w| w.equals_datatype(to))
}

/// A local file's modification time in nanoseconds since the Unix epoch,
/// as an index records it ([`Fingerprint::modified_ns`]).
pub fn modified_ns(meta: &std::fs::Metadata) -> Option<i64> {
    let modified = meta.modified().ok()?;
    let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_nanos()).ok()
}

/// What makes a manifest an index: the files it lists are existing Parquet
/// files read where they lie (`shardfeed index`), not shards written by
/// `shard`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexRecord {
    /// The URLs (or absolute local paths, as `file://` URLs) the files lie
    /// under; every entry's `path` is relative to one of them, so no file of
    /// an index can lie elsewhere.
    pub bases: Vec<String>,
    /// Whether every file's bytes were read at indexing and their
    /// checksums recorded (`--checksums`).
    pub checksums: bool,
}

/// A dataset's manifest: the only file a reader needs to plan an epoch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// [`FORMAT_VERSION`] when written by this build.
    pub format_version: u32,
    /// The shardfeed version that wrote the dataset.
    pub tool_version: String,
    /// The exact Arrow schema of every shard.
    pub schema: Schema,
    /// Total rows over all shards.
    pub total_rows: u64,
    /// Total bytes over all shards.
    pub total_bytes: u64,
    /// Uncompressed Arrow bytes of the input, as estimated while writing.
    pub input_bytes: u64,
    /// The options the shards were written with.
    pub options: WriteOptions,
    /// The shards, in order.
    pub shards: Vec<ShardEntry>,
    /// Token ids over all rows, for a dataset tokenized while sharding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    /// Present when this manifest is an index over existing files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexRecord>,
}

impl Manifest {
    /// A new manifest for `shards`, totals computed.
    pub fn new(
        schema: Schema,
        options: WriteOptions,
        shards: Vec<ShardEntry>,
        input_bytes: u64,
    ) -> Self {
        Manifest {
            format: FORMAT_NAME.to_string(),
            format_version: FORMAT_VERSION,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            schema,
            // Saturating: entries may come from files (task records);
            // `validate` refuses counts that overflow.
            total_rows: shards.iter().map(|s| s.rows).fold(0, u64::saturating_add),
            total_bytes: shards.iter().map(|s| s.bytes).fold(0, u64::saturating_add),
            input_bytes,
            options,
            shards,
            total_tokens: None,
            index: None,
        }
    }

    /// Serialize to JSON with a trailing newline: indented for people up to [`PRETTY_SHARDS`] shards; compact beyond
    /// (about 150 bytes per shard), so a million-shard manifest stays small.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = if self.shards.len() <= PRETTY_SHARDS {
            serde_json::to_vec_pretty(self)
        } else {
            serde_json::to_vec(self)
        }
        .expect("a manifest always serializes");
        out.push(b'\n');
        out
    }

    /// Parse and validate a manifest read from `url` (used in error messages).
    pub fn from_json(bytes: &[u8], url: &str) -> Result<Self> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|source| FormatError::ManifestParse {
                url: url.to_string(),
                source,
            })?;
        manifest.validate(url)?;
        Ok(manifest)
    }

    /// Check the manifest's invariants: format and version, shard paths,
    /// row counts that add up, sizes that can hold a footer.
    pub fn validate(&self, url: &str) -> Result<()> {
        if self.format != FORMAT_NAME || self.format_version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                url: url.to_string(),
                format: self.format.clone(),
                version: self.format_version,
                expected: FORMAT_NAME,
                expected_version: FORMAT_VERSION,
            });
        }
        let invalid = |reason: String| FormatError::ManifestInvalid {
            url: url.to_string(),
            reason,
        };
        if let Some(name) = duplicate_column(&self.schema) {
            return Err(invalid(format!(
                "the schema names column {name:?} twice: a reader could not tell the two apart"
            )));
        }
        if let Some(index) = &self.index {
            for base in &index.bases {
                validate_base(base).map_err(|reason| {
                    invalid(format!("base {:?}: {reason}", crate::redact::url(base)))
                })?;
            }
        }
        let bases = self.index.as_ref().map_or(0, |i| i.bases.len());
        let mut seen = std::collections::HashSet::with_capacity(self.shards.len());
        for shard in &self.shards {
            match (shard.base, &self.index) {
                (None, None) if shard.crc32.is_none() => {
                    return Err(invalid(format!("shard {} has no crc32", shard.path)));
                }
                (None, None) => {}
                (Some(b), Some(_)) if (b as usize) < bases => {}
                (Some(b), Some(_)) => {
                    return Err(invalid(format!(
                        "file {} names base {b}, the index records {bases}",
                        shard.path
                    )));
                }
                (None, Some(_)) => {
                    return Err(invalid(format!(
                        "file {} names no base: every file of an index lies under one",
                        shard.path
                    )));
                }
                (Some(_), None) => {
                    return Err(invalid(format!(
                        "shard {} names a base, which only files of an index do",
                        shard.path
                    )));
                }
            }
            match shard.base {
                None => validate_shard_path(&shard.path)?,
                Some(_) => validate_index_path(&shard.path)?,
            }
            if !seen.insert((shard.base, shard.path.as_str())) {
                return Err(invalid(format!("shard {} is listed twice", shard.path)));
            }
            let group_rows = shard
                .row_groups
                .iter()
                .try_fold(0u64, |acc, &r| acc.checked_add(r))
                .ok_or_else(|| invalid(format!("shard {}'s row counts overflow", shard.path)))?;
            if group_rows != shard.rows {
                return Err(invalid(format!(
                    "shard {} has {} rows but its row groups hold {group_rows}",
                    shard.path, shard.rows
                )));
            }
            if shard.footer_len < 8
                || shard
                    .footer_len
                    .checked_add(4)
                    .is_none_or(|end| end > shard.bytes)
            {
                return Err(invalid(format!(
                    "shard {} has footer_len {} for {} bytes",
                    shard.path, shard.footer_len, shard.bytes
                )));
            }
        }
        let rows = self
            .shards
            .iter()
            .try_fold(0u64, |acc, s| acc.checked_add(s.rows))
            .ok_or_else(|| invalid("the shards' row counts overflow".into()))?;
        if rows != self.total_rows {
            return Err(invalid(format!(
                "total_rows is {} but the shards hold {rows}",
                self.total_rows
            )));
        }
        Ok(())
    }

    /// Number of row groups over all shards.
    pub fn row_group_count(&self) -> usize {
        self.shards.iter().map(|s| s.row_groups.len()).sum()
    }

    /// The summary `shardfeed inspect` prints, for the dataset at `url`.
    pub fn summary<'a>(&'a self, url: &'a str) -> Summary<'a> {
        Summary {
            dataset: url,
            rows: self.total_rows,
            shards: self.shards.len(),
            row_groups: self.row_group_count(),
            bytes: self.total_bytes,
            input_bytes: self.input_bytes,
            compression_ratio: self.input_bytes as f64 / self.total_bytes.max(1) as f64,
            min_shard_bytes: self.shards.iter().map(|s| s.bytes).min().unwrap_or(0),
            max_shard_bytes: self.shards.iter().map(|s| s.bytes).max().unwrap_or(0),
            tool_version: &self.tool_version,
            shuffled: self.options.shuffle_seed.is_some(),
            tokens: self.total_tokens,
            options: &self.options,
            schema: &self.schema,
            index: self.index.as_ref(),
        }
    }
}

/// Check a base URL of an index: an absolute `file://` URL or a URL of an
/// object store, with no credentials or query in it (an index is a file
/// users share; secrets belong in storage options).
pub fn validate_base(base: &str) -> std::result::Result<(), String> {
    if base.starts_with("hf://") {
        crate::HubRepo::parse(base)?;
        if base.contains(['*', '?', '[']) {
            return Err("holds a glob".into());
        }
        return Ok(());
    }
    let parsed = url::Url::parse(base).map_err(|e| format!("not a URL ({e})"))?;
    match parsed.scheme() {
        "file" | "s3" | "s3a" | "gs" | "az" | "azure" | "abfs" | "abfss" | "http" | "https"
        | "memory" => {}
        other => return Err(format!("scheme {other:?} is not one shardfeed reads")),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("holds credentials".into());
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err("holds a query or fragment".into());
    }
    if parsed.path().split('/').any(|p| p == "..") {
        return Err("holds a '..' component".into());
    }
    Ok(())
}

/// Manifests with at most this many shards are written indented.
pub const PRETTY_SHARDS: usize = 1000;

/// Folder (under the dataset) of the task records of a split run.
pub const TASKS_DIR: &str = "_tasks";

/// The first top-level column name that `schema` holds more than once.
pub fn duplicate_column(schema: &Schema) -> Option<&str> {
    let mut seen = std::collections::HashSet::with_capacity(schema.fields().len());
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .find(|name| !seen.insert(*name))
}

/// The relative path of the record of task `index` of `count`.
pub fn task_record_path(index: usize, count: usize) -> String {
    format!("{TASKS_DIR}/task-{index:05}-of-{count:05}.json")
}

/// What one task of a split run wrote: its shards, in order, and what
/// `commit` checks before it writes the manifest. Written after the shards.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// This task, from 0.
    pub task_index: usize,
    /// Tasks in the run.
    pub num_tasks: usize,
    /// The schema every task must share.
    pub schema: Schema,
    /// The options the shards were written with.
    pub options: WriteOptions,
    /// The shards this task wrote.
    pub shards: Vec<ShardEntry>,
    /// Uncompressed Arrow bytes of the task's rows.
    pub input_bytes: u64,
    /// The shardfeed version that wrote them.
    pub tool_version: String,
    /// The split run this task belongs to: every task of one run has the
    /// same (`--run-id`, or a fingerprint of the inputs and options);
    /// `commit` refuses records of mixed runs.
    #[serde(default)]
    pub run_id: String,
    /// Token ids this task wrote, for a run with a tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// A dataset's summary: what `shardfeed inspect --json` prints.
#[derive(Debug, Serialize)]
pub struct Summary<'a> {
    /// The dataset's URL.
    pub dataset: &'a str,
    /// Rows over all shards.
    pub rows: u64,
    /// Shard files.
    pub shards: usize,
    /// Row groups over all shards.
    pub row_groups: usize,
    /// Bytes of all shards.
    pub bytes: u64,
    /// Uncompressed Arrow bytes of the rows.
    pub input_bytes: u64,
    /// `input_bytes / bytes`.
    pub compression_ratio: f64,
    /// The smallest shard's size.
    pub min_shard_bytes: u64,
    /// The largest shard's size.
    pub max_shard_bytes: u64,
    /// The shardfeed version that wrote the dataset.
    pub tool_version: &'a str,
    /// Whether rows were shuffled globally at shard time (else they are in
    /// input order, and the loader mixes only within its windows).
    pub shuffled: bool,
    /// Token ids over all rows, for a dataset tokenized while sharding (its
    /// tokenizer is in `options.tokenizer`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// The options it was written with.
    pub options: &'a WriteOptions,
    /// The dataset's Arrow schema.
    pub schema: &'a arrow_schema::Schema,
    /// For an index: the bases its files lie under, and whether their
    /// checksums were recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<&'a IndexRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{DataType, Field};

    fn sample() -> Manifest {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "tokens",
                DataType::List(std::sync::Arc::new(Field::new(
                    "item",
                    DataType::Int32,
                    true,
                ))),
                true,
            ),
        ]);
        let shard = |i: usize, rows: Vec<u64>| ShardEntry {
            path: shard_path(i),
            rows: rows.iter().sum(),
            bytes: 1000,
            row_groups: rows,
            footer_len: 200,
            footer_crc32: Crc32(1),
            crc32: Some(Crc32(2)),
            base: None,
            fingerprint: None,
            chunk_checksums: None,
            page_checksums: None,
        };
        Manifest::new(
            schema,
            WriteOptions {
                compression: "zstd".into(),
                zstd_level: 3,
                shard_size: 128 << 20,
                row_group_rows: Some(4),
                row_group_bytes: None,
                large_row_group_bytes: None,
                shuffle_seed: None,
                tokenizer: None,
            },
            vec![shard(0, vec![4, 4]), shard(1, vec![3])],
            5000,
        )
    }

    #[test]
    fn manifest_round_trips_exactly() {
        let m = sample();
        let back = Manifest::from_json(&m.to_json(), "mem").unwrap();
        assert_eq!(back, m);
        assert_eq!(back.total_rows, 11);
        assert_eq!(back.row_group_count(), 3);
    }

    #[test]
    fn rejects_escaping_paths_and_bad_counts() {
        for bad in [
            "/etc/passwd",
            "../x.parquet",
            "a//b",
            "shards/./x",
            "s3://b/x",
            "a\\b",
            "",
        ] {
            assert!(validate_shard_path(bad).is_err(), "{bad} accepted");
        }
        let mut m = sample();
        m.shards[0].path = "../../secret".into();
        let err = Manifest::from_json(&m.to_json(), "mem://ds/manifest.json").unwrap_err();
        assert!(err.to_string().contains("../../secret"), "{err}");

        let mut m = sample();
        m.shards[1].rows = 9;
        let err = Manifest::from_json(&m.to_json(), "mem").unwrap_err();
        assert!(err.to_string().contains("part-000001"), "{err}");

        let mut m = sample();
        m.shards[0].footer_len = u64::MAX - 2;
        let err = Manifest::from_json(&m.to_json(), "mem").unwrap_err();
        assert!(err.to_string().contains("footer_len"), "{err}");

        let mut m = sample();
        m.shards[0].row_groups = vec![u64::MAX, 2];
        assert!(Manifest::from_json(&m.to_json(), "mem").is_err());

        let mut m = sample();
        m.format_version = 99;
        assert!(matches!(
            Manifest::from_json(&m.to_json(), "mem"),
            Err(FormatError::UnsupportedVersion { version: 99, .. })
        ));
    }

    fn sample_index() -> Manifest {
        let mut m = sample();
        m.index = Some(IndexRecord {
            bases: vec!["file:///data/a".into(), "s3://bucket/raw".into()],
            checksums: false,
        });
        for (i, shard) in m.shards.iter_mut().enumerate() {
            shard.base = Some(i as u32);
            shard.crc32 = None;
            shard.path = format!("year=2024/time=12:00/part-{i}.parquet");
            shard.fingerprint = Some(Fingerprint {
                etag: Some("\"abc\"".into()),
                version: None,
                modified_ns: Some(1),
            });
        }
        m
    }

    #[test]
    fn an_index_round_trips_and_its_files_stay_under_their_bases() {
        let m = sample_index();
        let back = Manifest::from_json(&m.to_json(), "mem").unwrap();
        assert_eq!(back, m);
        let refused = |edit: &dyn Fn(&mut Manifest), says: &str| {
            let mut m = sample_index();
            edit(&mut m);
            let err = Manifest::from_json(&m.to_json(), "mem").unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        };
        refused(&|m| m.shards[0].path = "../escape.parquet".into(), "escape");
        refused(&|m| m.shards[0].path = "/etc/passwd".into(), "passwd");
        refused(&|m| m.shards[0].base = Some(2), "names base 2");
        refused(&|m| m.shards[0].base = None, "names no base");
        refused(
            &|m| m.index.as_mut().unwrap().bases[1] = "https://u:hunter2@h/x".into(),
            "credentials",
        );
        refused(
            &|m| m.index.as_mut().unwrap().bases[1] = "s3://b/x?sig=hunter2".into(),
            "query",
        );
        refused(
            &|m| m.index.as_mut().unwrap().bases[1] = "ftp://h/x".into(),
            "scheme",
        );
        refused(
            &|m| m.index.as_mut().unwrap().bases[1] = "relative/path".into(),
            "not a URL",
        );
        // A shard of a dataset (no index) names no base and has a checksum.
        let mut m = sample();
        m.shards[0].base = Some(0);
        assert!(Manifest::from_json(&m.to_json(), "mem").is_err());
        let mut m = sample();
        m.shards[0].crc32 = None;
        assert!(Manifest::from_json(&m.to_json(), "mem").is_err());
    }

    #[test]
    fn indexes_widen_integers_of_one_signedness_and_floats_only() {
        use arrow_schema::DataType as T;
        assert_eq!(widest(&T::Int32, &T::Int64), Some(T::Int64));
        assert_eq!(widest(&T::Int64, &T::Int8), Some(T::Int64));
        assert_eq!(widest(&T::UInt16, &T::UInt32), Some(T::UInt32));
        assert_eq!(widest(&T::Float32, &T::Float64), Some(T::Float64));
        assert_eq!(widest(&T::Utf8, &T::Utf8), Some(T::Utf8));
        assert_eq!(widest(&T::UInt32, &T::Int64), None);
        assert_eq!(widest(&T::Int32, &T::Float64), None);
        assert_eq!(widest(&T::Utf8, &T::LargeUtf8), None);
        assert!(widens_to(&T::Int16, &T::Int64) && !widens_to(&T::Int64, &T::Int16));
    }
}
