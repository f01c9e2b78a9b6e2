//! A local cache of remote shards: whole files, written atomically (a unique
//! temporary name, then a rename), checked against the manifest's size and
//! checksum, evicted least-recently-used down to a byte limit. Several loader
//! processes (one per rank) may share one folder: readers only ever open
//! complete files, and a file evicted while mapped stays readable.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use shardfeed_format::permute::hash_words;
use shardfeed_format::{Crc32, ShardEntry};

/// The cache of one dataset.
#[derive(Clone, Debug)]
pub(crate) struct ShardCache {
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
        Ok(ShardCache { dir, limit })
    }

    /// Where `entry` lives in the cache.
    pub(crate) fn path(&self, entry: &ShardEntry) -> PathBuf {
        self.dir.join(&entry.path)
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

    /// Check `bytes` against the manifest, then publish them as `entry`'s
    /// file; returns it open (so that a concurrent eviction cannot take it away).
    pub(crate) fn insert(&self, entry: &ShardEntry, bytes: &[u8]) -> Result<std::fs::File, String> {
        if bytes.len() as u64 != entry.bytes || Crc32::of(bytes) != entry.crc32 {
            return Err(format!(
                "downloaded shard {} does not match the manifest's size and checksum",
                entry.path
            ));
        }
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
        let write = || -> std::io::Result<std::fs::File> {
            use std::io::Write;
            let mut file = std::fs::File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&temporary)?;
            file.write_all(bytes)?;
            file.flush()?;
            std::fs::rename(&temporary, &path)?;
            Ok(file)
        };
        let file = write().map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            format!("cache file {}: {e}", path.display())
        })?;
        self.evict(&path);
        Ok(file)
    }

    /// Delete least recently used files until the cache fits its limit,
    /// keeping `keep`.
    fn evict(&self, keep: &Path) {
        let mut files = Vec::new();
        let mut stack = vec![self.dir.clone()];
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
