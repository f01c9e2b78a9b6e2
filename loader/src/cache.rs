//! A local cache of remote shards: whole files, streamed to disk in bounded
//! pieces under a unique temporary name, checked against the manifest's
//! size and checksum, then renamed into place; evicted
//! least-recently-used down to a byte limit that is the whole folder's,
//! whatever datasets share it. Several loader processes (one per rank, or
//! several jobs) may share one folder: readers only ever open complete
//! files, and a file evicted while mapped stays readable.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use shardfeed_format::permute::hash_words;
use shardfeed_format::{Crc32, ShardEntry};

/// The cache of one dataset, in a folder that others may share.
#[derive(Clone, Debug)]
pub(crate) struct ShardCache {
    /// The shared folder: the limit is its.
    root: PathBuf,
    /// This dataset's folder in it.
    dir: PathBuf,
    limit: u64,
}

fn is_temporary(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "tmp")
}

impl ShardCache {
    /// The cache for dataset `key` (its URL and manifest fingerprint) under `root`.
    pub(crate) fn new(root: &Path, key: &str, limit: u64) -> std::io::Result<Self> {
        let words: Vec<u64> = key.bytes().map(u64::from).collect();
        let dir = root.join(format!("{:016x}", hash_words(&words)));
        std::fs::create_dir_all(&dir)?;
        Ok(ShardCache {
            root: root.to_path_buf(),
            dir,
            limit,
        })
    }

    /// Where `entry` lives in the cache.
    pub(crate) fn path(&self, entry: &ShardEntry) -> PathBuf {
        match entry.base {
            // An index's files: one folder per base (two bases may hold
            // the same relative path).
            Some(base) => self.dir.join(format!("base-{base}")).join(&entry.path),
            None => self.dir.join(&entry.path),
        }
    }

    /// `entry`'s cached file, open, if it is there with the right size; marks
    /// it recently used. An open file stays readable even if evicted.
    pub(crate) fn open(&self, entry: &ShardEntry) -> Option<std::fs::File> {
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(self.path(entry))
            .ok()?;
        if file.metadata().ok()?.len() != entry.bytes {
            return None;
        }
        let _ = file.set_modified(SystemTime::now());
        Some(file)
    }

    /// Start writing `entry`'s file: its bytes go to a temporary file as
    /// they arrive ([`Pending::write`]), and are published when complete
    /// and checked ([`Pending::finish`]).
    pub(crate) fn begin(&self, entry: &ShardEntry) -> Result<Pending, String> {
        let path = self.path(entry);
        let parent = path.parent().expect("shard paths have a folder");
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cache folder {}: {e}", parent.display()))?;
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let temporary = parent.join(format!(
            ".{}.{}.{nanos}.tmp",
            path.file_name().expect("a file").to_string_lossy(),
            std::process::id()
        ));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&temporary)
            .map_err(|e| format!("cache file {}: {e}", temporary.display()))?;
        Ok(Pending {
            cache: self.clone(),
            entry: entry.clone(),
            file: Some(file),
            temporary,
            path,
            crc: crc32fast::Hasher::new(),
            written: 0,
        })
    }

    /// Delete least recently used files of the whole folder (every
    /// dataset's) until it fits its limit, keeping `keep`.
    fn evict(&self, keep: &Path) {
        let mut files = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    stack.push(path);
                } else if !is_temporary(&path) {
                    files.push((
                        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        meta.len(),
                        path,
                    ));
                }
            }
        }
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= self.limit {
                break;
            }
            if path != keep && std::fs::remove_file(&path).is_ok() {
                tracing::debug!(path = %path.display(), bytes = len, "evicted from the shard cache");
                total -= len;
            }
        }
    }
}

/// A shard's file being written into the cache.
pub(crate) struct Pending {
    cache: ShardCache,
    entry: ShardEntry,
    file: Option<std::fs::File>,
    temporary: PathBuf,
    path: PathBuf,
    crc: crc32fast::Hasher,
    written: u64,
}

impl Pending {
    /// The next `bytes` of the shard; more than the manifest's size is an
    /// error (nothing past it is kept).
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        use std::io::Write;
        let end = self.written.saturating_add(bytes.len() as u64);
        if end > self.entry.bytes {
            return Err(format!(
                "downloaded shard {} is longer than the manifest's {} bytes",
                self.entry.path, self.entry.bytes
            ));
        }
        let file = self.file.as_mut().expect("open until finished");
        file.write_all(bytes)
            .map_err(|e| format!("cache file {}: {e}", self.temporary.display()))?;
        self.crc.update(bytes);
        self.written = end;
        Ok(())
    }

    /// Check the file against the manifest's size and checksum, publish it
    /// and return it open (so that a concurrent eviction cannot take it away).
    pub(crate) fn finish(mut self) -> Result<std::fs::File, String> {
        let crc = Crc32(std::mem::take(&mut self.crc).finalize());
        if self.written != self.entry.bytes || self.entry.crc32.is_some_and(|c| c != crc) {
            return Err(format!(
                "downloaded shard {} does not match the manifest's size and checksum",
                self.entry.path
            ));
        }
        let file = self.file.take().expect("open until finished");
        std::fs::rename(&self.temporary, &self.path)
            .map_err(|e| format!("cache file {}: {e}", self.path.display()))?;
        self.cache.evict(&self.path);
        Ok(file)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Not finished (an error, a cancelled read): nothing is left behind.
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}
