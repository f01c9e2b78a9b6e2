//! `index`: a manifest over existing Parquet files, read where they lie.
//!
//! Only footers are read (one bounded range request per file, more only
//! for a footer larger than [`FOOTER_GUESS`]), concurrently; no byte of
//! data is copied. Each file is recorded under one of the index's bases
//! (the folders or prefixes it was found under) with what the loader needs
//! to plan without a listing or a HEAD, and a fingerprint (size, ETag and
//! version, or a local file's modification time, and the footer's CRC-32)
//! that the loader checks before it uses the file's bytes. With
//! `checksums`, every byte is read once more and the whole file's CRC-32
//! and each column chunk's XXH3-64 are recorded, so the loader verifies the
//! data as it does for the shards `shard` writes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::{Field, Schema};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use serde::Serialize;
use shardfeed_format::{
    ChunkChecksums, ChunkHash, Crc32, Fingerprint, IndexRecord, Location, Manifest, PageChecksums,
    ShardEntry, WriteOptions,
};

use crate::{PreprocessError, Result};

/// Bytes read from a file's end to find its footer: most footers fit, so
/// one request per file.
pub const FOOTER_GUESS: u64 = 64 << 10;
/// The largest footer accepted (a forged length must not size a read).
pub const MAX_FOOTER: u64 = 256 << 20;
/// Files read at once with `checksums` (each streams two 4 MiB pieces at a time).
pub const CHECKSUM_FILES: usize = 8;

/// How [`index`] runs.
#[derive(Clone, Debug)]
pub struct IndexOptions {
    /// Read every byte and record checksums (`--checksums`).
    pub checksums: bool,
    /// Add files not yet in an existing index, keeping its entries and
    /// their order (`--update`).
    pub update: bool,
    /// Replace an existing index or dataset manifest (`--overwrite`).
    pub overwrite: bool,
    /// Options for the inputs' object stores (credentials, endpoints).
    pub storage_options: Vec<(String, String)>,
    /// Files read at once.
    pub concurrency: usize,
}

impl Default for IndexOptions {
    fn default() -> Self {
        IndexOptions {
            checksums: false,
            update: false,
            overwrite: false,
            storage_options: Vec::new(),
            concurrency: 64,
        }
    }
}

/// What [`index`] wrote.
#[derive(Clone, Debug, Serialize)]
pub struct IndexSummary {
    /// The index's URL.
    pub index: String,
    /// Files in the index.
    pub files: usize,
    /// Files this run added (all of them, unless `update`).
    pub added: usize,
    /// Rows over all files.
    pub rows: u64,
    /// Bytes over all files.
    pub bytes: u64,
    /// Row groups over all files.
    pub row_groups: usize,
    /// The bases the files lie under.
    pub bases: Vec<String>,
    /// Whether the files' checksums are recorded.
    pub checksums: bool,
    /// With `update`: files the index lists that the inputs' listing no
    /// longer finds under their base (kept as they were indexed; the
    /// loader refuses them, or skips them under `on_error="skip"`).
    pub gone: Vec<String>,
    /// With `update`: files the index lists whose size or fingerprint
    /// (modification time, ETag) the listing finds changed (kept, and
    /// refused by the loader, as `gone`).
    pub changed: Vec<String>,
}

/// A file found under an input.
#[derive(Clone, Debug)]
struct Found {
    /// Its base's URL.
    base: String,
    /// Its path under the base.
    path: String,
    size: u64,
    fingerprint: Fingerprint,
}

/// A file read: its entry and what the index's totals take from it.
struct Indexed {
    entry: ShardEntry,
    url: String,
    schema: Schema,
    input_bytes: u64,
    codecs: Vec<String>,
}

fn index_error(file: impl Into<String>, reason: impl Into<String>) -> PreprocessError {
    PreprocessError::Index {
        file: file.into(),
        reason: reason.into(),
    }
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Whether a file found in a folder is one of a dataset's Parquet files:
/// `*.parquet` (or `.parq`, `.pq`), not hidden and not under a folder of
/// a writer's own (`_temporary`, `_delta_log`, `.cache`).
fn is_data_file(relative: &str) -> bool {
    let mut parts = relative.split('/').peekable();
    while let Some(part) = parts.next() {
        if part.starts_with('.') || part.starts_with('_') {
            return false;
        }
        if parts.peek().is_none() {
            let lower = part.to_ascii_lowercase();
            return [".parquet", ".parq", ".pq"]
                .iter()
                .any(|e| lower.ends_with(e));
        }
    }
    false
}

/// Split `input` at its first component with a glob character: the folder
/// before it and the pattern from it (`None` without one).
fn split_glob(input: &str) -> (&str, Option<&str>) {
    let mut at = 0;
    for part in input.split('/') {
        if is_glob(part) {
            let folder = input[..at].trim_end_matches('/');
            return (folder, Some(&input[at..]));
        }
        at += part.len() + 1;
    }
    (input, None)
}

fn glob_pattern(input: &str, pattern: &str) -> Result<glob::Pattern> {
    glob::Pattern::new(pattern).map_err(|e| PreprocessError::BadOption {
        option: "INPUTS",
        reason: format!("{input:?} is not a valid pattern: {e}"),
    })
}

const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: true,
};

/// The files under a local input: a file, a folder (its data files, in
/// path order) or a glob.
fn find_local(input: &str) -> Result<Vec<Found>> {
    let (folder, pattern) = split_glob(input);
    let folder = if folder.is_empty() { "." } else { folder };
    let folder = folder.strip_prefix("file://").unwrap_or(folder);
    let canonical = std::fs::canonicalize(folder).map_err(|_| PreprocessError::InputNotFound {
        path: PathBuf::from(folder),
    })?;
    let meta =
        std::fs::metadata(&canonical).map_err(|e| PreprocessError::io("read", &canonical, e))?;
    let (base, files): (PathBuf, Vec<PathBuf>) = if meta.is_file() {
        if pattern.is_some() {
            return Err(PreprocessError::NoMatch {
                pattern: input.to_string(),
            });
        }
        let parent = canonical.parent().unwrap_or(Path::new("/")).to_path_buf();
        (parent, vec![canonical.clone()])
    } else {
        let mut files = Vec::new();
        let matcher = pattern.map(|p| glob_pattern(input, p)).transpose()?;
        for entry in walkdir::WalkDir::new(&canonical).sort_by_file_name() {
            let entry = entry.map_err(|e| {
                let path = e.path().unwrap_or(&canonical).to_path_buf();
                PreprocessError::io("list", &path, e.into())
            })?;
            if !entry.file_type().is_file() {
                continue;
            }
            let relative = relative_of(&canonical, entry.path())?;
            let keep = match &matcher {
                Some(m) => m.matches_with(&relative, MATCH),
                None => is_data_file(&relative),
            };
            if keep {
                files.push(entry.path().to_path_buf());
            }
        }
        (canonical, files)
    };
    if files.is_empty() {
        return Err(PreprocessError::NoMatch {
            pattern: input.to_string(),
        });
    }
    let base_url = url::Url::from_directory_path(&base)
        .map_err(|()| index_error(base.display().to_string(), "not an absolute folder"))?
        .to_string();
    let base_url = base_url.trim_end_matches('/').to_string();
    files
        .into_iter()
        .map(|file| {
            let meta =
                std::fs::metadata(&file).map_err(|e| PreprocessError::io("read", &file, e))?;
            Ok(Found {
                base: base_url.clone(),
                path: relative_of(&base, &file)?,
                size: meta.len(),
                fingerprint: Fingerprint {
                    modified_ns: shardfeed_format::modified_ns(&meta),
                    ..Fingerprint::default()
                },
            })
        })
        .collect()
}

fn relative_of(base: &Path, file: &Path) -> Result<String> {
    let relative = file
        .strip_prefix(base)
        .map_err(|_| index_error(file.display().to_string(), "does not lie under its folder"))?;
    let parts: Option<Vec<&str>> = relative.iter().map(|p| p.to_str()).collect();
    parts
        .map(|p| p.join("/"))
        .ok_or_else(|| index_error(file.display().to_string(), "its name is not UTF-8"))
}

/// The files under a remote input: one object, a prefix (its data files,
/// in key order) or a glob over a prefix.
async fn find_remote(input: &str, storage: &[(String, String)]) -> Result<Vec<Found>> {
    let (folder, pattern) = split_glob(input);
    let folder = folder.trim_end_matches('/');
    let location = Location::parse_with_options(folder, storage.iter().cloned())?;
    let fingerprint = |meta: &object_store::ObjectMeta| Fingerprint {
        etag: meta.e_tag.clone(),
        version: meta.version.clone(),
        modified_ns: meta.last_modified.timestamp_nanos_opt(),
    };
    if pattern.is_none() {
        // One object? (Its folder is then the base.)
        let head = || location.store().head(location.prefix());
        match location.retry().run(head, || {}).await {
            Ok(meta) => {
                let (base, name) = folder.rsplit_once('/').unwrap_or(("", folder));
                return Ok(vec![Found {
                    base: base.to_string(),
                    path: name.to_string(),
                    size: meta.size,
                    fingerprint: fingerprint(&meta),
                }]);
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => {
                return Err(index_error(
                    input,
                    shardfeed_format::redact::text(&source.to_string()),
                ));
            }
        }
    }
    let matcher = pattern.map(|p| glob_pattern(input, p)).transpose()?;
    let mut objects = location.list("").await?;
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    let prefix = location.prefix().as_ref().to_string();
    let mut found = Vec::new();
    for meta in objects {
        if let Some(relative) = wanted(&prefix, meta.location.as_ref(), matcher.as_ref()) {
            found.push(Found {
                base: folder.to_string(),
                path: relative.to_string(),
                size: meta.size,
                fingerprint: fingerprint(&meta),
            });
        }
    }
    if found.is_empty() {
        return Err(PreprocessError::NoMatch {
            pattern: input.to_string(),
        });
    }
    Ok(found)
}

/// An answer of the Hub's API, read whole.
struct HubAnswer {
    status: reqwest::StatusCode,
    /// Its `Link` headers (the next page of a file list).
    links: Vec<String>,
    body: bytes::Bytes,
}

/// Why an answer of the Hub's API may be asked for again.
enum HubFailure {
    /// No answer, or one cut short.
    Http(reqwest::Error),
    /// A 429 or a 5xx.
    Busy(HubAnswer),
}

impl std::fmt::Display for HubFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HubFailure::Http(e) => {
                let text = shardfeed_format::redact::text(&e.to_string());
                f.write_str(&text)
            }
            HubFailure::Busy(answer) => write!(f, "the Hub answered HTTP {}", answer.status),
        }
    }
}

/// The files of a Hugging Face Hub repository under `input`
/// (`hf://datasets/ORG/NAME[@REV]/PATH_GLOB`): the revision resolved to its
/// commit through the Hub's API (so a later push does not change what the
/// index reads), the files listed from the commit's tree.
async fn find_hf(input: &str, storage: &[(String, String)]) -> Result<Vec<Found>> {
    let repo = shardfeed_format::HubRepo::parse(input).map_err(|r| index_error(input, r))?;
    let hub =
        shardfeed_format::Hub::new(storage.iter().cloned()).map_err(|r| index_error(input, r))?;
    let name = format!("hf://{}/{}", repo.kind, repo.repo);
    let client = reqwest::Client::builder()
        // The API's answers come from the endpoint itself; a redirect
        // elsewhere is not followed (it would not get the token anyway).
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| index_error(&name, e.to_string()))?;
    // One API answer read whole; connection failures, a body cut short, 429
    // and 5xx answers are retried with backoff (the Hub rate-limits).
    let policy = shardfeed_format::RetryPolicy::default();
    let get = async |url: &str| -> std::result::Result<HubAnswer, String> {
        let attempt = || async {
            let mut request = client.get(url);
            if let Some(value) = hub.authorization() {
                request = request.header(reqwest::header::AUTHORIZATION, value);
            }
            let response = request.send().await.map_err(HubFailure::Http)?;
            let status = response.status();
            let links: Vec<String> = (response.headers().get_all(reqwest::header::LINK))
                .iter()
                .filter_map(|v| v.to_str().ok().map(str::to_string))
                .collect();
            let body = response.bytes().await.map_err(HubFailure::Http)?;
            let answer = HubAnswer {
                status,
                links,
                body,
            };
            match status.as_u16() == 429 || status.is_server_error() {
                true => Err(HubFailure::Busy(answer)),
                false => Ok(answer),
            }
        };
        let again = |failed: &HubFailure| match failed {
            HubFailure::Http(e) => !e.is_builder(),
            HubFailure::Busy(_) => true,
        };
        match policy.run_while(attempt, again, true, |_| {}).await {
            Ok(answer) | Err(HubFailure::Busy(answer)) => Ok(answer),
            Err(HubFailure::Http(e)) => {
                Err(shardfeed_format::redact::text(&e.without_url().to_string()))
            }
        }
    };
    let refused = |status: reqwest::StatusCode| {
        let why = match (status.as_u16(), hub.has_token()) {
            (401 | 403, false) => "the Hub asks for a token: set HF_TOKEN (or the hf_token storage option) to one that can read it".to_string(),
            (401 | 403, true) => "the Hub refused the token in HF_TOKEN (or hf_token) for it".to_string(),
            (404, false) => "not found on the Hub (a private or gated repository needs HF_TOKEN)".to_string(),
            (404, true) => format!("revision {:?} or the repository is not found on the Hub", repo.revision),
            (code, _) => format!("the Hub answered HTTP {code}"),
        };
        index_error(&name, why)
    };
    let api = format!("{}/api/{}/{}", hub.endpoint, repo.kind, repo.repo);
    let revision = format!("{api}/revision/{}", repo.revision_in_path());
    let response = get(&revision).await.map_err(|e| index_error(&name, e))?;
    if !response.status.is_success() {
        return Err(refused(response.status));
    }
    let info: serde_json::Value = serde_json::from_slice(&response.body)
        .map_err(|e| index_error(&name, format!("the Hub's answer is not JSON: {e}")))?;
    let sha = info
        .get("sha")
        .and_then(|s| s.as_str())
        .filter(|s| s.len() >= 7 && s.chars().all(|c| c.is_ascii_hexdigit()))
        .ok_or_else(|| index_error(&name, "the Hub's answer names no commit (sha)"))?
        .to_string();
    let (folder, pattern) = split_glob(&repo.path);
    let folder = folder.trim_matches('/');
    let matcher = pattern.map(|p| glob_pattern(input, p)).transpose()?;
    let mut next = Some(match folder.is_empty() {
        true => format!("{api}/tree/{sha}?recursive=true"),
        false => format!("{api}/tree/{sha}/{folder}?recursive=true"),
    });
    let base = repo.url_at(&sha, folder);
    let mut found = Vec::new();
    // Pages already asked for: a server that links a page again would
    // otherwise be listed forever.
    let mut asked = std::collections::HashSet::new();
    while let Some(url) = next.take() {
        if !asked.insert(url.clone()) {
            return Err(index_error(&name, "the Hub's file list links a page twice"));
        }
        let response = get(&url).await.map_err(|e| index_error(&name, e))?;
        if !response.status.is_success() {
            return Err(refused(response.status));
        }
        // Pages follow `Link: <...>; rel="next"`, only on the endpoint.
        next = (response.links.iter())
            .flat_map(|v| v.split(','))
            .find(|l| l.contains("rel=\"next\""))
            .and_then(|l| Some(l.split_once('<')?.1.split_once('>')?.0.to_string()))
            .filter(|u| u.starts_with(&format!("{}/", hub.endpoint)));
        let entries: Vec<serde_json::Value> = serde_json::from_slice(&response.body)
            .map_err(|e| index_error(&name, format!("the Hub's file list is not JSON: {e}")))?;
        for entry in entries {
            if entry.get("type").and_then(|t| t.as_str()) != Some("file") {
                continue;
            }
            let (Some(path), Some(size)) = (
                entry.get("path").and_then(|p| p.as_str()),
                entry.get("size").and_then(|s| s.as_u64()),
            ) else {
                continue;
            };
            if let Some(relative) = wanted(folder, path, matcher.as_ref()) {
                found.push(Found {
                    base: base.clone(),
                    path: relative.to_string(),
                    size,
                    // The commit pins the bytes: nothing else to check.
                    fingerprint: Fingerprint::default(),
                });
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    if found.is_empty() {
        return Err(PreprocessError::NoMatch {
            pattern: input.to_string(),
        });
    }
    Ok(found)
}

/// `key`'s path under `folder` (`""`: the root), if it lies there and is
/// wanted: matched by the input's glob, or a data file of a folder.
fn wanted<'a>(folder: &str, key: &'a str, matcher: Option<&glob::Pattern>) -> Option<&'a str> {
    let relative = match folder.is_empty() {
        true => key,
        false => key.strip_prefix(folder)?.strip_prefix('/')?,
    };
    let keep = match matcher {
        Some(m) => m.matches_with(relative, MATCH),
        None => is_data_file(relative),
    };
    keep.then_some(relative)
}

fn is_remote(input: &str) -> bool {
    input.contains("://") && !input.starts_with("file://")
}

/// Range reads of one file, only while it is the object that was found
/// (its ETag and version, where the store reports them).
struct Reader {
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    fingerprint: Fingerprint,
    url: String,
    /// Transient failures (5xx, resets, a body cut short) are retried.
    retry: shardfeed_format::RetryPolicy,
}

impl Reader {
    async fn range(&self, range: std::ops::Range<u64>) -> Result<Bytes> {
        let options = GetOptions {
            if_match: self.fingerprint.etag.clone(),
            version: self.fingerprint.version.clone(),
            range: Some(range.into()),
            ..Default::default()
        };
        let got = || async {
            (self.store.get_opts(&self.path, options.clone()).await?)
                .bytes()
                .await
        };
        self.retry.run(got, || {}).await.map_err(|e| self.error(e))
    }

    fn error(&self, e: object_store::Error) -> PreprocessError {
        let reason = match e {
            object_store::Error::Precondition { .. } => {
                "it changed while it was indexed".to_string()
            }
            e => shardfeed_format::redact::text(&e.to_string()),
        };
        index_error(&self.url, reason)
    }
}

/// The footer of a file of `size` bytes: its bytes (metadata, length,
/// magic) and the decoded metadata.
async fn read_footer(reader: &Reader, size: u64) -> Result<(Bytes, ParquetMetaData)> {
    let not_parquet = |why: String| index_error(&reader.url, format!("not a Parquet file: {why}"));
    if size < 12 {
        return Err(not_parquet(format!("{size} bytes")));
    }
    let guess = size.min(FOOTER_GUESS);
    let tail = reader.range(size - guess..size).await?;
    if tail.len() as u64 != guess {
        return Err(index_error(&reader.url, "it was shorter than listed"));
    }
    let end = &tail[tail.len() - 8..];
    if &end[4..] == b"PARE" {
        return Err(not_parquet("its footer is encrypted".into()));
    }
    if &end[4..] != b"PAR1" {
        return Err(not_parquet("no PAR1 magic at its end".into()));
    }
    let metadata_len = u64::from(u32::from_le_bytes(end[..4].try_into().expect("4 bytes")));
    let footer_len = metadata_len + 8;
    if footer_len > MAX_FOOTER || footer_len + 4 > size {
        return Err(not_parquet(format!(
            "its footer claims {metadata_len} bytes of {size}"
        )));
    }
    let footer = if footer_len <= guess {
        tail.slice((guess - footer_len) as usize..)
    } else {
        reader.range(size - footer_len..size).await?
    };
    let bytes = footer.clone();
    let url = reader.url.clone();
    let metadata = tokio::task::spawn_blocking(move || {
        ParquetMetaDataReader::decode_metadata(&bytes[..bytes.len() - 8])
    })
    .await
    .map_err(|e| index_error(&url, e.to_string()))?
    .map_err(|e| not_parquet(e.to_string()))?;
    Ok((footer, metadata))
}

/// What [`read_checksums`] keeps between pieces of a file.
struct Hashing {
    /// (start, end, row group, column) of every column chunk, by start.
    chunks: Vec<(u64, u64, usize, usize)>,
    hashers: Vec<Option<shardfeed_format::checksum::ChunkHasher>>,
    /// Each chunk's pages, walked as its bytes pass.
    walkers: Vec<PageWalker>,
    sums: Vec<Vec<u64>>,
    crc: crc32fast::Hasher,
    /// Chunks begun and not yet ended, and the next to begin.
    active: Vec<usize>,
    next: usize,
}

impl Hashing {
    /// Hash `piece`, the file's bytes from `at`; an error says why a chunk's
    /// pages could not be walked.
    fn feed(&mut self, at: u64, piece: &[u8]) -> std::result::Result<(), String> {
        let end = at + piece.len() as u64;
        self.crc.update(piece);
        while self.next < self.chunks.len() && self.chunks[self.next].0 < end {
            self.active.push(self.next);
            self.next += 1;
        }
        let (chunks, hashers, sums) = (&self.chunks, &mut self.hashers, &mut self.sums);
        let walkers = &mut self.walkers;
        let mut failed = None;
        self.active.retain(|&k| {
            let (start, stop, i, j) = chunks[k];
            let (from, to) = (start.max(at), stop.min(end));
            if from < to {
                let bytes = &piece[(from - at) as usize..(to - at) as usize];
                hashers[k].as_mut().expect("hashing").update(bytes);
                if let Err(e) = walkers[k].feed(bytes) {
                    failed.get_or_insert(format!("column {j} of row group {i}: {e}"));
                }
            }
            if stop <= end {
                sums[i][j] = hashers[k].take().expect("hashing").finish().value;
                if let Err(e) = walkers[k].finish() {
                    failed.get_or_insert(format!("column {j} of row group {i}: {e}"));
                }
                return false;
            }
            true
        });
        failed.map_or(Ok(()), Err)
    }
}

/// The longest page header walked (page statistics can be long): the
/// loader reads no longer one either.
const MAX_PAGE_HEADER: usize = 1 << 20;

/// A page header at the start of `bytes`: the page's body length and the
/// header's.
fn parse_page_header(bytes: &[u8]) -> std::result::Result<(i32, usize), String> {
    let mut thrift = shardfeed_format::thrift::Thrift::new(bytes);
    thrift.page_header().map(|h| (h.compressed, thrift.at))
}

/// One column chunk's pages, walked as its bytes pass in pieces: each
/// page's length (header included) and checksum ([`PageChecksums::of`]).
struct PageWalker {
    /// Bytes of the chunk not yet walked.
    left: u64,
    /// Bytes of the current page left to hash, once its header is parsed.
    page_left: Option<u64>,
    /// The current page's bytes so far while its header is incomplete.
    carry: Vec<u8>,
    page_len: u64,
    hasher: Option<shardfeed_format::checksum::ChunkHasher>,
    pages: Vec<(u32, u32)>,
}

impl PageWalker {
    fn new(len: u64) -> Self {
        PageWalker {
            left: len,
            page_left: None,
            carry: Vec::new(),
            page_len: 0,
            hasher: None,
            pages: Vec::new(),
        }
    }

    /// Walk the chunk's next `bytes`.
    fn feed(&mut self, mut bytes: &[u8]) -> std::result::Result<(), String> {
        while !bytes.is_empty() {
            match self.page_left {
                Some(n) => {
                    let take = (n as usize).min(bytes.len());
                    self.hasher.as_mut().expect("a page").update(&bytes[..take]);
                    bytes = &bytes[take..];
                    self.left -= take as u64;
                    if n == take as u64 {
                        self.end_page()?;
                    } else {
                        self.page_left = Some(n - take as u64);
                    }
                }
                None => {
                    // The page's header: parsed from this piece, or from the
                    // bytes held of the page and this piece's first ones.
                    let held = self.carry.len();
                    let parsed = if held == 0 {
                        parse_page_header(bytes)
                    } else {
                        let room = (MAX_PAGE_HEADER - held).min(bytes.len());
                        self.carry.extend_from_slice(&bytes[..room]);
                        let parsed = parse_page_header(&self.carry);
                        self.carry.truncate(held);
                        parsed
                    };
                    let (body, header) = match parsed {
                        Ok(p) => p,
                        Err(e) => {
                            let page = held as u64 + self.left;
                            if ((held + bytes.len()) as u64) < page.min(MAX_PAGE_HEADER as u64) {
                                // The piece ended inside the header.
                                self.carry.extend_from_slice(bytes);
                                self.left -= bytes.len() as u64;
                                return Ok(());
                            }
                            return Err(format!("a page header cannot be read ({e})"));
                        }
                    };
                    let body =
                        u64::try_from(body).map_err(|_| format!("a page of {body} bytes"))?;
                    self.page_len = (header as u64)
                        .checked_add(body)
                        .filter(|&l| l <= held as u64 + self.left)
                        .ok_or("a page overruns its column chunk")?;
                    // Past what was held: the held bytes alone did not parse.
                    let from_piece = header
                        .checked_sub(held)
                        .filter(|&n| n <= bytes.len())
                        .ok_or("a page header cannot be read")?;
                    let mut hasher = ChunkHash::Xxh3.hasher();
                    hasher.update(&self.carry);
                    hasher.update(&bytes[..from_piece]);
                    self.carry.clear();
                    self.hasher = Some(hasher);
                    bytes = &bytes[from_piece..];
                    self.left -= from_piece as u64;
                    self.page_left = Some(body);
                    if body == 0 {
                        self.end_page()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The current page is hashed whole.
    fn end_page(&mut self) -> std::result::Result<(), String> {
        let sum = self.hasher.take().expect("a page").finish().value as u32;
        let len = u32::try_from(self.page_len)
            .map_err(|_| format!("a page of {} bytes", self.page_len))?;
        self.pages.push((len, sum));
        self.page_left = None;
        Ok(())
    }

    /// The chunk's end: its pages must end with it.
    fn finish(&mut self) -> std::result::Result<(), String> {
        if self.left != 0 || self.page_left.is_some() || !self.carry.is_empty() {
            return Err("its pages do not end where the chunk does".into());
        }
        Ok(())
    }
}

/// Every byte of a file read once: its CRC-32 and each column chunk's
/// XXH3-64 (over the chunk's byte range, as the loader checks it). Pieces
/// are hashed on the blocking pool (not the runtime's threads, which go on
/// reading), the next piece read while one is hashed.
async fn read_checksums(
    reader: &Reader,
    size: u64,
    metadata: &ParquetMetaData,
) -> Result<(Crc32, ChunkChecksums, PageChecksums)> {
    let mut chunks: Vec<(u64, u64, usize, usize)> = Vec::new();
    for (i, rg) in metadata.row_groups().iter().enumerate() {
        for (j, c) in rg.columns().iter().enumerate() {
            let (start, len) = c.byte_range();
            chunks.push((start, start.saturating_add(len), i, j));
        }
    }
    chunks.sort();
    // Each chunk's pages are walked as its bytes pass (holding at most one
    // page header across pieces): chunks that share bytes are refused, as no
    // writer makes them.
    if let Some(w) = chunks.windows(2).find(|w| w[1].0 < w[0].1) {
        let ((_, _, i, j), (_, _, k, l)) = ((w[0]), (w[1]));
        return Err(index_error(
            &reader.url,
            format!("column {j} of row group {i} and column {l} of row group {k} share bytes"),
        ));
    }
    let mut hashing = Hashing {
        hashers: chunks
            .iter()
            .map(|_| Some(ChunkHash::Xxh3.hasher()))
            .collect(),
        walkers: chunks
            .iter()
            .map(|&(start, stop, _, _)| PageWalker::new(stop - start))
            .collect(),
        chunks,
        sums: metadata
            .row_groups()
            .iter()
            .map(|rg| vec![0; rg.num_columns()])
            .collect(),
        crc: crc32fast::Hasher::new(),
        active: Vec::new(),
        next: 0,
    };
    // Two pieces of a file in flight: one read while the other is hashed.
    const PIECE: u64 = 4 << 20;
    let read = |at: u64| async move {
        let piece = reader.range(at..size.min(at + PIECE)).await?;
        if piece.is_empty() {
            return Err(index_error(&reader.url, "it was shorter than listed"));
        }
        Ok(piece)
    };
    let mut at = 0u64;
    let mut piece = match size {
        0 => None,
        _ => Some(read(0).await?),
    };
    while let Some(bytes) = piece.take() {
        let end = at + bytes.len() as u64;
        let hashed = tokio::task::spawn_blocking(move || {
            let fed = hashing.feed(at, &bytes);
            (hashing, fed)
        });
        let (hashed, next) = tokio::join!(hashed, async {
            match end < size {
                true => read(end).await.map(Some),
                false => Ok(None),
            }
        });
        let fed;
        (hashing, fed) =
            hashed.map_err(|e| index_error(&reader.url, format!("hashing failed: {e}")))?;
        fed.map_err(|e| index_error(&reader.url, e))?;
        piece = next?;
        at = end;
    }
    let Hashing {
        chunks,
        sums,
        crc,
        active,
        next,
        walkers,
        ..
    } = hashing;
    if let Some(&k) = active.first().or(chunks.get(next).map(|_| &next)) {
        let (start, stop, i, j) = chunks[k];
        return Err(index_error(
            &reader.url,
            format!("column {j} of row group {i} at {start}..{stop} lies outside the file"),
        ));
    }
    // Pages of chunks of more than one page, in row group and column order.
    let mut pages: Vec<_> = chunks
        .iter()
        .zip(walkers)
        .filter(|(_, w)| w.pages.len() > 1)
        .map(|(&(_, _, i, j), w)| (i as u32, j as u32, w.pages))
        .collect();
    pages.sort_by_key(|&(i, j, _)| (i, j));
    Ok((
        Crc32(crc.finalize()),
        ChunkChecksums {
            hash: ChunkHash::Xxh3,
            sums,
        },
        PageChecksums { chunks: pages },
    ))
}

/// Read one file's footer (and its checksums, when asked) into its entry.
async fn index_file(found: Found, base: u32, place: &Location, checksums: bool) -> Result<Indexed> {
    let url = format!("{}/{}", found.base, found.path);
    let reader = Reader {
        store: place.store().clone(),
        path: place.child(&found.path),
        fingerprint: found.fingerprint.clone(),
        url: url.clone(),
        retry: place.retry().clone(),
    };
    let (footer, metadata) = read_footer(&reader, found.size).await?;
    let footer_len = footer.len() as u64;
    let data_end = found.size - footer_len;
    for (i, rg) in metadata.row_groups().iter().enumerate() {
        if rg.num_rows() < 0 {
            return Err(index_error(
                &url,
                format!("row group {i} has a negative row count"),
            ));
        }
        for (j, c) in rg.columns().iter().enumerate() {
            let (start, len) = c.byte_range();
            if start.checked_add(len).is_none_or(|end| end > data_end) {
                return Err(index_error(
                    &url,
                    format!(
                        "column {j} of row group {i} at {start}+{len} lies outside the file's data"
                    ),
                ));
            }
        }
    }
    let (crc32, chunk_checksums, page_checksums) = match checksums {
        true => {
            let (crc, sums, pages) = read_checksums(&reader, found.size, &metadata).await?;
            let pages = (!pages.chunks.is_empty()).then_some(pages);
            (Some(crc), Some(sums.encode()), pages)
        }
        false => (None, None, None),
    };
    let metadata = Arc::new(metadata);
    let arrow = ArrowReaderMetadata::try_new(metadata.clone(), ArrowReaderOptions::new())
        .map_err(|e| index_error(&url, format!("its schema has no Arrow form: {e}")))?;
    let row_groups: Vec<u64> = metadata
        .row_groups()
        .iter()
        .map(|rg| rg.num_rows() as u64)
        .collect();
    let mut codecs: Vec<String> = metadata
        .row_groups()
        .iter()
        .flat_map(|rg| {
            rg.columns()
                .iter()
                .map(|c| codec_name(c.compression()).to_string())
        })
        .collect();
    codecs.sort();
    codecs.dedup();
    let input_bytes = metadata
        .row_groups()
        .iter()
        .map(|rg| rg.total_byte_size().max(0) as u64)
        .fold(0, u64::saturating_add);
    Ok(Indexed {
        entry: ShardEntry {
            path: found.path,
            rows: row_groups.iter().fold(0, |a, &r| a.saturating_add(r)),
            bytes: found.size,
            row_groups,
            footer_len,
            footer_crc32: Crc32::of(&footer),
            crc32,
            base: Some(base),
            fingerprint: Some(found.fingerprint),
            chunk_checksums,
            page_checksums,
        },
        url,
        schema: arrow.schema().as_ref().clone(),
        input_bytes,
        codecs,
    })
}

fn codec_name(codec: parquet::basic::Compression) -> &'static str {
    use parquet::basic::Compression as C;
    match codec {
        C::UNCOMPRESSED => "uncompressed",
        C::SNAPPY => "snappy",
        C::GZIP(_) => "gzip",
        C::LZO => "lzo",
        C::BROTLI(_) => "brotli",
        C::LZ4 => "lz4",
        C::ZSTD(_) => "zstd",
        C::LZ4_RAW => "lz4_raw",
    }
}

/// Fold `other`'s schema (of file `url`) into `schema`: the same columns in
/// the same order with the same types; a column is nullable where any file
/// has it nullable.
fn widen(schema: &mut Schema, first: &str, other: &Schema, url: &str) -> Result<()> {
    let mismatch = |detail: String| {
        index_error(
            url,
            format!("its schema differs from the index's (first file {first}): {detail}"),
        )
    };
    if schema.fields().len() != other.fields().len() {
        return Err(mismatch(format!(
            "{} columns, not {}",
            other.fields().len(),
            schema.fields().len()
        )));
    }
    let mut fields: Vec<Field> = Vec::with_capacity(other.fields().len());
    for (a, b) in schema.fields().iter().zip(other.fields()) {
        if a.name() != b.name() {
            return Err(mismatch(format!(
                "column `{}` where the index has `{}`",
                b.name(),
                a.name()
            )));
        }
        let Some(widest) = shardfeed_format::widest(a.data_type(), b.data_type()) else {
            return Err(mismatch(format!(
                "column `{}` is {}, the index's is {} (files of one index share their types, \
                 or integers of one signedness and floats of different widths)",
                a.name(),
                b.data_type(),
                a.data_type()
            )));
        };
        fields.push(
            a.as_ref()
                .clone()
                .with_data_type(widest)
                .with_nullable(a.is_nullable() || b.is_nullable()),
        );
    }
    *schema = Schema::new(fields);
    Ok(())
}

/// Write an index at `output` over the Parquet files under `inputs` (local
/// paths, folders, globs, or object store URLs and prefixes).
pub fn index(inputs: &[String], output: &str, options: &IndexOptions) -> Result<IndexSummary> {
    if inputs.is_empty() {
        return Err(PreprocessError::NoInputs);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|e| PreprocessError::io("start the I/O runtime for", Path::new(output), e))?;
    runtime.block_on(index_async(inputs, output, options))
}

async fn index_async(
    inputs: &[String],
    output: &str,
    options: &IndexOptions,
) -> Result<IndexSummary> {
    let out = Location::parse_with_options(output, options.storage_options.iter().cloned())?;
    // What is there already: an index to add to, or something not to replace.
    let existing = match out.has_manifest().await? {
        false => None,
        true if options.update => {
            let manifest = out.read_manifest().await?;
            if manifest.index.is_none() {
                return Err(PreprocessError::BadOption {
                    option: "--update",
                    reason: format!("{} is a dataset of shards, not an index", out.url()),
                });
            }
            Some(manifest)
        }
        true if options.overwrite => None,
        true => {
            return Err(PreprocessError::DatasetExists {
                url: out.url().to_string(),
            });
        }
    };
    let checksums = match &existing {
        Some(m) => {
            let had = m.index.as_ref().is_some_and(|i| i.checksums);
            if options.checksums && !had {
                return Err(PreprocessError::BadOption {
                    option: "--checksums",
                    reason: "the index was made without checksums: index again without --update to add them".into(),
                });
            }
            had
        }
        None => options.checksums,
    };
    let mut found = Vec::new();
    for input in inputs {
        found.extend(if input.starts_with("hf://") {
            find_hf(input, &options.storage_options).await?
        } else if is_remote(input) {
            find_remote(input, &options.storage_options).await?
        } else {
            find_local(input)?
        });
    }
    // Bases in order of first use, after the existing index's.
    let mut bases: Vec<String> = existing
        .as_ref()
        .and_then(|m| m.index.as_ref())
        .map_or_else(Vec::new, |i| i.bases.clone());
    let (gone, changed) = match &existing {
        // A glob lists only the files it matches: what it leaves out is not
        // gone.
        Some(m) => {
            let globbed = inputs.iter().any(|i| i.contains(['*', '?', '[']));
            stale(m, &bases, &found, !globbed)
        }
        None => (Vec::new(), Vec::new()),
    };
    let mut known: std::collections::HashSet<(String, String)> = existing
        .as_ref()
        .map(|m| {
            m.shards
                .iter()
                .filter_map(|s| Some((bases.get(s.base? as usize)?.clone(), s.path.clone())))
                .collect()
        })
        .unwrap_or_default();
    found.retain(|f| known.insert((f.base.clone(), f.path.clone())));
    let mut base_of: HashMap<String, u32> = bases
        .iter()
        .enumerate()
        .map(|(i, b)| (b.clone(), i as u32))
        .collect();
    let mut places: Vec<Option<Location>> = vec![None; bases.len()];
    let mut jobs = Vec::with_capacity(found.len());
    for f in found {
        shardfeed_format::validate_index_path(&f.path)?;
        let b = match base_of.get(&f.base) {
            Some(&b) => b,
            None => {
                shardfeed_format::validate_base(&f.base).map_err(|reason| {
                    index_error(shardfeed_format::redact::url(&f.base), reason)
                })?;
                bases.push(f.base.clone());
                places.push(None);
                base_of.insert(f.base.clone(), (bases.len() - 1) as u32);
                (bases.len() - 1) as u32
            }
        };
        if places[b as usize].is_none() {
            let place = match f.base.starts_with("file://") {
                true => Location::parse(&f.base)?,
                false => {
                    Location::parse_with_options(&f.base, options.storage_options.iter().cloned())?
                }
            };
            places[b as usize] = Some(place);
        }
        jobs.push((f, b));
    }
    let places: Vec<Option<Location>> = places;
    let indexed = futures::stream::iter(jobs)
        .map(|(f, b)| {
            let place = places[b as usize].clone().expect("a place for every base");
            async move { index_file(f, b, &place, checksums).await }
        })
        // Checksumming streams whole files, two 4 MiB pieces each at a
        // time: at most 8 files at once bounds that to 64 MiB.
        .buffered(match checksums {
            true => options.concurrency.clamp(1, CHECKSUM_FILES),
            false => options.concurrency.max(1),
        });
    let mut indexed = std::pin::pin!(indexed);

    // The index so far (an existing one's, or empty); each file is folded
    // in as it comes, so only its entry stays in memory.
    let (mut schema, mut first, mut shards, mut input_bytes, mut codecs) = match existing {
        Some(m) => {
            let first = m
                .shards
                .first()
                .and_then(|s| Some(format!("{}/{}", bases.get(s.base? as usize)?, s.path)))
                .unwrap_or_default();
            let codecs: Vec<String> = m
                .options
                .compression
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            (Some(m.schema), first, m.shards, m.input_bytes, codecs)
        }
        None => (None, String::new(), Vec::new(), 0, Vec::new()),
    };
    let mut added = 0usize;
    while let Some(file) = indexed.try_next().await? {
        let schema = schema.get_or_insert_with(|| {
            first = file.url.clone();
            Schema::new(file.schema.fields().clone())
        });
        widen(schema, &first, &file.schema, &file.url)?;
        input_bytes = input_bytes.saturating_add(file.input_bytes);
        for codec in file.codecs {
            if !codecs.contains(&codec) {
                codecs.push(codec);
            }
        }
        shards.push(file.entry);
        added += 1;
    }
    let Some(schema) = schema else {
        return Err(PreprocessError::NoRows {
            inputs: inputs.join(", "),
        });
    };
    if let Some(name) = shardfeed_format::duplicate_column(&schema) {
        return Err(index_error(
            first,
            format!("the schema names column {name:?} twice"),
        ));
    }
    codecs.sort();
    codecs.dedup();
    let write = WriteOptions {
        compression: codecs.join(","),
        zstd_level: 0,
        shard_size: 0,
        row_group_rows: None,
        row_group_bytes: None,
        large_row_group_bytes: None,
        shuffle_seed: None,
        tokenizer: None,
    };
    let mut manifest = Manifest::new(schema, write, shards, input_bytes);
    manifest.index = Some(IndexRecord {
        bases: bases.clone(),
        checksums,
    });
    manifest.validate(out.url())?;
    if out.has_manifest().await? {
        // `--update` or `--overwrite`: replaced in one write.
        out.put(shardfeed_format::MANIFEST_FILE, manifest.to_json())
            .await?;
    } else {
        out.write_manifest(&manifest).await?;
    }
    Ok(IndexSummary {
        index: out.url().to_string(),
        files: manifest.shards.len(),
        added,
        rows: manifest.total_rows,
        bytes: manifest.total_bytes,
        row_groups: manifest.row_group_count(),
        bases,
        checksums,
        gone,
        changed,
    })
}

/// The files of index `m` (bases `bases`) that `found`, a listing of some
/// of its bases, no longer finds (when `whole`: the listing is of whole
/// folders or prefixes, not globs), and those it finds changed (size, or a
/// fingerprint both sides have: modification time, ETag), as redacted
/// URLs; each named in a warning. Files under bases not listed are not
/// judged.
fn stale(
    m: &Manifest,
    bases: &[String],
    found: &[Found],
    whole: bool,
) -> (Vec<String>, Vec<String>) {
    let listed: HashMap<(&str, &str), &Found> = found
        .iter()
        .map(|f| ((f.base.as_str(), f.path.as_str()), f))
        .collect();
    let listed_bases: std::collections::HashSet<&str> =
        found.iter().map(|f| f.base.as_str()).collect();
    let (mut gone, mut changed) = (Vec::new(), Vec::new());
    for s in &m.shards {
        let Some(base) = s.base.and_then(|b| bases.get(b as usize)) else {
            continue;
        };
        if !listed_bases.contains(base.as_str()) {
            continue;
        }
        let url =
            shardfeed_format::redact::url(&format!("{}/{}", base.trim_end_matches('/'), s.path));
        match listed.get(&(base.as_str(), s.path.as_str())) {
            None if whole => gone.push(url),
            None => {}
            Some(f) => {
                let was = s.fingerprint.as_ref();
                let differs =
                    |a: Option<&String>, b: Option<&String>| a.zip(b).is_some_and(|(a, b)| a != b);
                if f.size != s.bytes
                    || was
                        .and_then(|w| w.modified_ns)
                        .zip(f.fingerprint.modified_ns)
                        .is_some_and(|(a, b)| a != b)
                    || differs(
                        was.and_then(|w| w.etag.as_ref()),
                        f.fingerprint.etag.as_ref(),
                    )
                {
                    changed.push(url);
                }
            }
        }
    }
    for url in &gone {
        tracing::warn!(
            "{url} is in the index but no longer found: kept as it was indexed, a loader will refuse it; index again with --overwrite to drop it"
        );
    }
    for url in &changed {
        tracing::warn!(
            "{url} changed since it was indexed: kept as it was indexed, a loader will refuse it; index again with --overwrite to read it anew"
        );
    }
    (gone, changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_walked_the_same_whatever_pieces_the_bytes_come_in() {
        use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
        use parquet::file::properties::WriterProperties;
        let n = 20_000i64;
        let text: Vec<String> = (0..n)
            .map(|i| format!("row {i} ").repeat((i % 5) as usize))
            .collect();
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                std::sync::Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
            ),
            (
                "text",
                std::sync::Arc::new(StringArray::from(text)) as ArrayRef,
            ),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_data_page_size_limit(2048)
            .set_write_batch_size(256)
            .build();
        let mut file = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let meta = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&bytes::Bytes::from(file.clone()))
            .unwrap();
        for c in meta.row_group(0).columns() {
            let (start, len) = c.byte_range();
            let chunk = &file[start as usize..(start + len) as usize];
            let walk = |piece: usize| {
                let mut w = PageWalker::new(len);
                for bytes in chunk.chunks(piece) {
                    w.feed(bytes).unwrap();
                }
                w.finish().unwrap();
                w.pages
            };
            let whole = walk(chunk.len());
            assert!(whole.len() > 10, "many pages");
            // Each page's length and checksum, tiling the chunk.
            let mut at = 0usize;
            for &(l, sum) in &whole {
                assert_eq!(PageChecksums::of(&chunk[at..at + l as usize]), sum);
                at += l as usize;
            }
            assert_eq!(at, chunk.len());
            for piece in [1, 7, 100, 2049] {
                assert_eq!(walk(piece), whole, "pieces of {piece} bytes");
            }
        }
        // A chunk cut short, or with a page that overruns it, is refused.
        let (start, len) = meta.row_group(0).column(0).byte_range();
        let chunk = &file[start as usize..(start + len) as usize];
        let mut w = PageWalker::new(len + 10);
        w.feed(chunk).unwrap();
        assert!(w.finish().is_err());
        let mut w = PageWalker::new(len - 10);
        assert!(
            w.feed(&chunk[..len as usize - 10])
                .and_then(|()| w.finish())
                .is_err()
        );
    }

    #[test]
    fn globs_split_at_their_first_pattern_component() {
        assert_eq!(
            split_glob("s3://b/data/*.parquet"),
            ("s3://b/data", Some("*.parquet"))
        );
        assert_eq!(split_glob("/d/x/**/y?.pq"), ("/d/x", Some("**/y?.pq")));
        assert_eq!(split_glob("/d/x"), ("/d/x", None));
    }

    #[test]
    fn folders_hold_data_files_not_writers_leftovers() {
        assert!(is_data_file("part-0.parquet"));
        assert!(is_data_file("year=2024/part-0.snappy.parquet"));
        assert!(!is_data_file("_SUCCESS"));
        assert!(!is_data_file("_temporary/0/part-0.parquet"));
        assert!(!is_data_file(".hidden.parquet"));
        assert!(!is_data_file("notes.txt"));
    }
}
