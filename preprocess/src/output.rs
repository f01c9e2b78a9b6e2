//! Preparing the output location and publishing shards into it.

use std::path::{Path, PathBuf};

use object_store::{ObjectStoreExt, WriteMultipart};
use shardfeed_format::{Location, MANIFEST_FILE, ShardEntry, TaskRecord, task_record_path};
use tokio::runtime::Handle;

use crate::writer::Publish;
use crate::{PreprocessError, Result};

/// Bytes per part of a multipart upload.
const UPLOAD_PART_BYTES: usize = 16 << 20;
/// Parts of one upload in flight at once.
const UPLOAD_CONCURRENCY: usize = 4;

/// Refuse to replace a dataset unless asked; when asked, remove its manifest
/// first so that no reader sees the old manifest over new shards.
pub(crate) fn prepare(location: &Location, overwrite: bool, runtime: &Handle) -> Result<()> {
    if runtime.block_on(location.has_manifest())? {
        if !overwrite {
            return Err(PreprocessError::DatasetExists {
                url: location.url().to_string(),
            });
        }
        // (Another task of a split run may have removed it first.)
        runtime.block_on(location.delete(&location.child(MANIFEST_FILE)))?;
    }
    Ok(())
}

/// A new temporary folder named `prefix...` in `temp_dir` (or the system's).
pub(crate) fn temp_folder(prefix: &str, temp_dir: Option<&Path>) -> Result<tempfile::TempDir> {
    let builder = tempfile::Builder::new().prefix(prefix).clone();
    match temp_dir {
        Some(dir) => builder.tempdir_in(dir),
        None => builder.tempdir(),
    }
    .map_err(|e| {
        PreprocessError::io(
            "create a temporary folder in",
            temp_dir.unwrap_or(Path::new("$TMPDIR")),
            e,
        )
    })
}

/// Whether `name` is a file shardfeed writes under `shards/` (final or staged).
fn is_ours(name: &str) -> bool {
    let name = name.trim_start_matches('.');
    (name.starts_with("part-") || name.starts_with("task-"))
        && (name.ends_with(".parquet") || name.ends_with(".tmp"))
}

/// Delete shard files (final or staged) under `shards/` that the new
/// manifest does not list, left by an earlier, interrupted or larger run.
/// Only for a writer that holds the dataset's lock: no other run's files
/// can be in progress.
pub(crate) fn remove_stale(
    location: &Location,
    keep: &[ShardEntry],
    runtime: &Handle,
) -> Result<()> {
    let keep: std::collections::HashSet<&str> = keep.iter().map(|s| s.path.as_str()).collect();
    if let Some(root) = location.local_root() {
        let dir = root.join("shards");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_ours(&name) && !keep.contains(format!("shards/{name}").as_str()) {
                std::fs::remove_file(entry.path())
                    .map_err(|e| PreprocessError::io("remove", entry.path(), e))?;
            }
        }
        return Ok(());
    }
    for meta in runtime.block_on(location.list("shards"))? {
        let name = meta.location.filename().unwrap_or_default().to_string();
        if is_ours(&name) && !keep.contains(format!("shards/{name}").as_str()) {
            runtime.block_on(location.delete(&meta.location))?;
        }
    }
    Ok(())
}

/// Delete what a split run left (`_tasks/`, `_scatter/`): a single run
/// with `--overwrite` replaces the whole dataset.
pub(crate) fn remove_split_run(location: &Location, runtime: &Handle) -> Result<()> {
    for folder in [shardfeed_format::TASKS_DIR, "_scatter"] {
        for meta in runtime.block_on(location.list(folder))? {
            runtime.block_on(location.delete(&meta.location))?;
        }
        if let Some(root) = location.local_root() {
            let _ = std::fs::remove_dir_all(root.join(folder));
        }
    }
    Ok(())
}

/// How files reach `location`: renamed into place on a local file system,
/// uploaded from a local staging folder (in `temp_dir`) to an object store.
/// Staged files carry `attempt`, so two runs never write the same one.
pub(crate) fn publisher(
    location: &Location,
    runtime: &Handle,
    temp_dir: Option<&Path>,
    attempt: &str,
) -> Result<Box<dyn Publish>> {
    Ok(match location.local_root() {
        Some(root) => Box::new(LocalPublish::new(root, attempt)?),
        None => Box::new(StorePublish::new(
            location.clone(),
            runtime.clone(),
            temp_dir,
        )?),
    })
}

/// Shards on the local file system: written beside their final name, renamed
/// into place (atomic), so a killed run never leaves a partial shard under a
/// final name.
pub(crate) struct LocalPublish {
    root: PathBuf,
    attempt: String,
}

impl LocalPublish {
    pub(crate) fn new(root: &Path, attempt: &str) -> Result<Self> {
        let shards = root.join("shards");
        std::fs::create_dir_all(&shards)
            .map_err(|e| PreprocessError::io("create output folder", &shards, e))?;
        Ok(LocalPublish {
            root: root.to_path_buf(),
            attempt: attempt.to_string(),
        })
    }
}

impl Publish for LocalPublish {
    fn staging_path(&self, relative: &str) -> PathBuf {
        let final_path = self.root.join(relative);
        let name = final_path
            .file_name()
            .expect("shard paths name a file")
            .to_string_lossy();
        final_path.with_file_name(format!(".{name}.{}.tmp", self.attempt))
    }

    fn publish(&self, staged: &Path, relative: &str) -> Result<()> {
        let final_path = self.root.join(relative);
        if let Some(parent) = final_path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| PreprocessError::io("create folder", parent, e))?;
        }
        std::fs::rename(staged, &final_path)
            .map_err(|e| PreprocessError::io("rename into place", &final_path, e))
    }
}

/// Shards in an object store: staged in a local temporary folder, then sent
/// with a concurrent multipart upload (which becomes visible only when complete).
pub(crate) struct StorePublish {
    location: Location,
    staging: tempfile::TempDir,
    runtime: Handle,
}

impl StorePublish {
    pub(crate) fn new(
        location: Location,
        runtime: Handle,
        temp_dir: Option<&Path>,
    ) -> Result<Self> {
        let staging = temp_folder("shardfeed-stage", temp_dir)?;
        Ok(StorePublish {
            location,
            staging,
            runtime,
        })
    }

    /// Upload the staged shard as `relative`. A transient store failure
    /// (5xx, a reset connection) aborts the upload and starts it again from
    /// the staged file, up to the location's retry count (every attempt
    /// may take long, so no time bound applies between them).
    async fn upload(&self, staged: &Path, relative: &str) -> Result<()> {
        let attempt = || async {
            match self.upload_once(staged, relative).await {
                // The completion may have landed although its reply was lost
                // (aborting it then says NoSuchUpload, a 404): the object is
                // there, whole, or the upload starts again.
                Err(Failed::Finish(_)) if self.uploaded_whole(staged, relative).await => Ok(()),
                other => other,
            }
        };
        let again = |failed: &Failed| match failed {
            Failed::Store(e) => shardfeed_format::retry::is_transient(e),
            Failed::Finish(e) => {
                shardfeed_format::retry::is_transient(e)
                    || matches!(e, object_store::Error::NotFound { .. })
            }
            Failed::Local(_) => false,
        };
        let retry = self.location.retry();
        match retry.run_while(attempt, again, false, |_| {}).await {
            Ok(()) => Ok(()),
            Err(Failed::Local(e)) => Err(PreprocessError::io("read", staged, e)),
            Err(Failed::Store(error) | Failed::Finish(error)) => {
                Err(shardfeed_format::FormatError::Store {
                    op: "upload",
                    url: self.location.url_of(relative),
                    error: shardfeed_format::StoreError(error),
                }
                .into())
            }
        }
    }

    /// Whether `relative` holds the staged file's bytes: its size, then
    /// (only on this rare path) its CRC-32 read back, as a shard of another
    /// run may lie there with the same size.
    async fn uploaded_whole(&self, staged: &Path, relative: &str) -> bool {
        use futures::TryStreamExt;
        let local = std::fs::File::open(staged).and_then(|file| {
            let size = file.metadata()?.len();
            Ok((size, shardfeed_format::Crc32::of_file(&file, size)?))
        });
        let Ok((size, crc)) = local else {
            return false;
        };
        let path = self.location.child(relative);
        let store = self.location.store();
        let head = || store.head(&path);
        let same_size =
            (self.location.retry().run(head, || {}).await).is_ok_and(|meta| meta.size == size);
        if !same_size {
            return false;
        }
        let read_back = || async {
            let mut hasher = crc32fast::Hasher::new();
            let mut stream = store.get(&path).await?.into_stream();
            while let Some(bytes) = stream.try_next().await? {
                hasher.update(&bytes);
            }
            Ok(hasher.finalize())
        };
        let remote = self.location.retry().run(read_back, || {}).await;
        remote.is_ok_and(|remote| remote == crc.0)
    }

    /// One attempt at [`StorePublish::upload`]; a failed multipart upload is
    /// aborted (so its parts do not stay in the store, billed).
    async fn upload_once(&self, staged: &Path, relative: &str) -> std::result::Result<(), Failed> {
        use tokio::io::AsyncReadExt;
        let upload = (self.location.store())
            .put_multipart(&self.location.child(relative))
            .await
            .map_err(Failed::Store)?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART_BYTES);
        let written = async {
            let mut file = tokio::fs::File::open(staged).await.map_err(Failed::Local)?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = file.read(&mut buf).await.map_err(Failed::Local)?;
                if n == 0 {
                    return Ok(());
                }
                (writer.wait_for_capacity(UPLOAD_CONCURRENCY).await).map_err(Failed::Store)?;
                writer.write(&buf[..n]);
            }
        }
        .await;
        match written {
            // (finish aborts the upload itself when it fails.)
            Ok(()) => writer.finish().await.map(|_| ()).map_err(Failed::Finish),
            Err(e) => {
                let _ = writer.abort().await;
                Err(e)
            }
        }
    }
}

/// Why an upload attempt failed.
enum Failed {
    /// The store refused or failed a request.
    Store(object_store::Error),
    /// Completing the upload failed: its parts, or the completion itself
    /// (whose reply may have been lost after it landed).
    Finish(object_store::Error),
    /// The staged file could not be read.
    Local(std::io::Error),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Store(e) | Failed::Finish(e) => e.fmt(f),
            Failed::Local(e) => e.fmt(f),
        }
    }
}

impl Publish for StorePublish {
    fn staging_path(&self, relative: &str) -> PathBuf {
        self.staging.path().join(relative.replace('/', "_"))
    }

    fn publish(&self, staged: &Path, relative: &str) -> Result<()> {
        let result = self.runtime.block_on(self.upload(staged, relative));
        let _ = std::fs::remove_file(staged);
        result
    }
}

/// Write this task's record (after its shards).
pub(crate) async fn write_record(location: &Location, record: &TaskRecord) -> Result<()> {
    let relative = task_record_path(record.task_index, record.num_tasks);
    let body = serde_json::to_vec_pretty(record).expect("a task record always serializes");
    Ok(location.put(&relative, body).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;
    use std::sync::Arc;

    /// After a completion whose reply was lost, only the staged bytes count
    /// as uploaded: an object of the same size with other bytes (a shard of
    /// an earlier run) is not taken for them.
    #[test]
    fn an_upload_is_found_whole_only_with_the_staged_bytes() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = Arc::new(InMemory::new());
        let location = Location::from_store(store.clone(), "ds".into(), "memory://ds");
        let publish = StorePublish::new(location, runtime.handle().clone(), None).unwrap();
        let staged = publish.staging_path("shards/part-0.parquet");
        std::fs::write(&staged, b"the staged shard's bytes").unwrap();
        let put = |bytes: &'static [u8]| {
            let path = object_store::path::Path::from("ds/shards/part-0.parquet");
            runtime
                .block_on(store.put(&path, PutPayload::from_static(bytes)))
                .unwrap();
        };
        let whole = || runtime.block_on(publish.uploaded_whole(&staged, "shards/part-0.parquet"));
        assert!(!whole(), "nothing there");
        put(b"an earlier run's bytes!!");
        assert!(!whole(), "same size, other bytes");
        put(b"the staged shard's bytes");
        assert!(whole());
        put(b"the staged shard's bytes and more");
        assert!(!whole(), "other size");
    }
}
