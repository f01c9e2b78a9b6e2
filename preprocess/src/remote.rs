//! Inputs in object storage (`s3://`, `gs://`, `az://`, `http(s)://`): staged
//! in a local temporary folder, then read like local files. A glob in the
//! last path segments (`s3://bucket/raw/*.parquet`) filters the listing.

use std::path::Path;

use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use shardfeed_format::Location;
use tokio::io::AsyncWriteExt;
use tokio::runtime::Handle;

use crate::output::temp_folder;
use crate::{PreprocessError, Result, ShardOptions};

/// Whether `input` names an object store location rather than a local path.
pub(crate) fn is_remote(input: &str) -> bool {
    input
        .split_once("://")
        .is_some_and(|(scheme, _)| scheme != "file")
}

/// Download the remote inputs; returns the inputs with remote ones replaced by
/// local paths, and the folder holding them (deleted when dropped).
pub(crate) fn stage(
    given: &[String],
    options: &ShardOptions,
    runtime: &Handle,
) -> Result<(Vec<String>, Option<tempfile::TempDir>)> {
    if !given.iter().any(|g| is_remote(g)) {
        return Ok((given.to_vec(), None));
    }
    let staging = temp_folder("shardfeed-inputs", options.temp_dir.as_deref())?;
    let mut out = Vec::with_capacity(given.len());
    for (i, input) in given.iter().enumerate() {
        if !is_remote(input) {
            out.push(input.clone());
            continue;
        }
        let (base, pattern) = match input.find(['*', '?', '[']) {
            Some(at) => {
                let cut = input[..at].rfind('/').map_or(at, |s| s + 1);
                (&input[..cut], Some(&input[cut..]))
            }
            None => (input.as_str(), None),
        };
        let location = Location::parse_with_options(
            base.trim_end_matches('/'),
            options.storage_options.iter().cloned(),
        )?;
        let dir = staging.path().join(format!("input-{i:05}"));
        let fetched = runtime.block_on(download(&location, pattern, &dir))?;
        out.push(match fetched {
            Fetched::File(path) => path.display().to_string(),
            Fetched::Folder => dir.display().to_string(),
            Fetched::Nothing => {
                return Err(PreprocessError::NoMatch {
                    pattern: input.clone(),
                });
            }
        });
    }
    Ok((out, Some(staging)))
}

enum Fetched {
    File(std::path::PathBuf),
    Folder,
    Nothing,
}

async fn download(location: &Location, pattern: Option<&str>, dir: &Path) -> Result<Fetched> {
    let store = location.store();
    let store_err = |op: &'static str, source| {
        PreprocessError::Format(shardfeed_format::FormatError::Store {
            op,
            url: location.url().to_string(),
            error: shardfeed_format::StoreError(source),
        })
    };
    // Transient failures (5xx, resets, a body cut short) are retried; a
    // download starts again from the object's start.
    let policy = location.retry();
    let list = || store.list(Some(location.prefix())).try_collect::<Vec<_>>();
    let listed: Vec<object_store::ObjectMeta> =
        (policy.run(list, || {}).await).map_err(|e| store_err("list", e))?;
    let glob =
        pattern
            .map(glob::Pattern::new)
            .transpose()
            .map_err(|e| PreprocessError::BadOption {
                option: "INPUT",
                reason: format!("bad pattern: {e}"),
            })?;
    let prefix = location.prefix().as_ref();
    let mut wanted = Vec::new();
    for meta in listed {
        let key = meta.location.as_ref();
        let relative = key
            .strip_prefix(prefix)
            .unwrap_or(key)
            .trim_start_matches('/')
            .to_string();
        if relative.is_empty() || glob.as_ref().is_some_and(|g| !g.matches(&relative)) {
            continue;
        }
        wanted.push((meta.location, relative));
    }
    if wanted.is_empty() && glob.is_none() {
        // Not a prefix: a single object.
        if (policy.run(|| store.head(location.prefix()), || {}).await).is_ok() {
            let name = location.prefix().filename().unwrap_or("input").to_string();
            let path = dir.join(name);
            (policy
                .run(|| fetch(store.as_ref(), location.prefix(), &path), || {})
                .await)
                .map_err(|e| store_err("read", e))?;
            return Ok(Fetched::File(path));
        }
        return Ok(Fetched::Nothing);
    }
    if wanted.is_empty() {
        return Ok(Fetched::Nothing);
    }
    for (key, relative) in wanted {
        let path = dir.join(&relative);
        (policy
            .run(|| fetch(store.as_ref(), &key, &path), || {})
            .await)
            .map_err(|source| {
                PreprocessError::Format(shardfeed_format::FormatError::Store {
                    op: "read",
                    url: location.url_of(&relative),
                    error: shardfeed_format::StoreError(source),
                })
            })?;
    }
    Ok(Fetched::Folder)
}

/// Stream one object into `path`.
async fn fetch(
    store: &dyn ObjectStore,
    key: &object_store::path::Path,
    path: &Path,
) -> object_store::Result<()> {
    let io = |e: std::io::Error| object_store::Error::Generic {
        store: "staging",
        source: Box::new(e),
    };
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(io)?;
    }
    let mut file = tokio::fs::File::create(path).await.map_err(io)?;
    let mut stream = store.get(key).await?.into_stream();
    while let Some(chunk) = stream.try_next().await? {
        file.write_all(&chunk).await.map_err(io)?;
    }
    file.flush().await.map_err(io)?;
    Ok(())
}
