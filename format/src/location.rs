//! Dataset locations: a URL or local path resolved to an object store and a prefix.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::{FormatError, MANIFEST_FILE, Manifest, Result};

/// A dataset (or input) location: an object store plus a path prefix in it.
///
/// Plain paths and `file://` URLs resolve to the local file system (and keep
/// their [`Location::local_root`] so writers can rename files into place);
/// `memory://` gives a fresh in-memory store (tests share one through
/// [`Location::from_store`]). Other schemes are passed to
/// [`object_store::parse_url_opts`] with the given options.
#[derive(Clone, Debug)]
pub struct Location {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
    local_root: Option<PathBuf>,
}

impl Location {
    /// Resolve `url` with no extra store options.
    pub fn parse(url: &str) -> Result<Self> {
        Self::parse_with_options(url, std::iter::empty::<(String, String)>())
    }

    /// Resolve `url`, passing `options` (e.g. credentials, endpoints) to the
    /// store's builder.
    pub fn parse_with_options<I, K, V>(url: &str, options: I) -> Result<Self>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let bad = |reason: String| FormatError::BadLocation {
            url: url.to_string(),
            reason,
        };
        if url.is_empty() {
            return Err(bad("empty".into()));
        }
        let scheme_end = url.find("://");
        match scheme_end.map(|i| &url[..i]) {
            None => Self::local(FsPath::new(url)),
            Some("file") => {
                let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
                let path = parsed
                    .to_file_path()
                    .map_err(|_| bad("not a local file URL".into()))?;
                Self::local(&path)
            }
            Some("memory") => {
                let prefix = Path::from(&url["memory://".len()..]);
                Ok(Self::from_store(Arc::new(InMemory::new()), prefix, url))
            }
            Some(scheme) => {
                let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
                // The cloud's standard environment variables first, explicit options over them.
                let options: Vec<(String, String)> = env_options(scheme)
                    .into_iter()
                    .chain(
                        options
                            .into_iter()
                            .map(|(k, v)| (k.as_ref().to_string(), v.into())),
                    )
                    .collect();
                let (store, prefix) = object_store::parse_url_opts(&parsed, options)
                    .map_err(|e| bad(e.to_string()))?;
                Ok(Self::from_store(Arc::from(store), prefix, url))
            }
        }
    }

    fn local(path: &FsPath) -> Result<Self> {
        let absolute = std::path::absolute(path).map_err(|source| FormatError::LocalPath {
            path: path.to_path_buf(),
            source,
        })?;
        let prefix = Path::from_absolute_path(&absolute).map_err(|e| FormatError::BadLocation {
            url: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(Location {
            store: Arc::new(LocalFileSystem::new()),
            prefix,
            url: absolute.display().to_string(),
            local_root: Some(absolute),
        })
    }

    /// A location in an existing store, e.g. one [`InMemory`] shared by a test.
    pub fn from_store(store: Arc<dyn ObjectStore>, prefix: Path, url: &str) -> Self {
        Location {
            store,
            prefix,
            url: url.trim_end_matches('/').to_string(),
            local_root: None,
        }
    }

    /// The same dataset read through a [`FaultyStore`](crate::fault::FaultyStore)
    /// that injects `faults` (as a remote store: local files are not mapped).
    pub fn with_faults(&self, faults: crate::fault::FaultConfig) -> Location {
        let store = Arc::new(crate::fault::FaultyStore::new(self.store.clone(), faults));
        Location::from_store(store, self.prefix.clone(), &self.url)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix of the dataset inside the store.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The URL (or absolute path) this location was made from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The root folder when the location is on the local file system.
    pub fn local_root(&self) -> Option<&FsPath> {
        self.local_root.as_deref()
    }

    /// The store path of `relative` (a `/`-separated path) under the prefix.
    pub fn child(&self, relative: &str) -> Path {
        relative
            .split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |p, part| p.clone().join(part))
    }

    /// The URL of `relative`, for messages.
    pub fn url_of(&self, relative: &str) -> String {
        format!("{}/{}", self.url.trim_end_matches('/'), relative)
    }

    /// Read and validate the dataset's manifest: one GET.
    pub async fn read_manifest(&self) -> Result<Manifest> {
        let url = self.url_of(MANIFEST_FILE);
        let bytes = self.read(MANIFEST_FILE).await?;
        Manifest::from_json(&bytes, &url)
    }

    /// Read the whole object at `relative`, retrying transient failures.
    pub async fn read(&self, relative: &str) -> Result<Bytes> {
        let path = self.child(relative);
        crate::RetryPolicy::default()
            .run(
                || async { self.store.get(&path).await?.bytes().await },
                || {},
            )
            .await
            .map_err(|source| FormatError::Store {
                op: "read",
                url: self.url_of(relative),
                source,
            })
    }

    /// Write `manifest` at the dataset root, refusing to replace an existing one.
    pub async fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        let url = self.url_of(MANIFEST_FILE);
        let payload = PutPayload::from(Bytes::from(manifest.to_json()));
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        self.store
            .put_opts(&self.child(MANIFEST_FILE), payload, opts)
            .await
            .map(|_| ())
            .map_err(|source| FormatError::Store {
                op: "write",
                url,
                source,
            })
    }

    /// Whether the dataset has a manifest.
    pub async fn has_manifest(&self) -> Result<bool> {
        self.exists(MANIFEST_FILE).await
    }

    /// Whether the object at `relative` exists: one HEAD.
    pub async fn exists(&self, relative: &str) -> Result<bool> {
        match self.store.head(&self.child(relative)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(source) => Err(self.store_error("check", relative, source)),
        }
    }

    /// Every object under the folder `relative`.
    pub async fn list(&self, relative: &str) -> Result<Vec<object_store::ObjectMeta>> {
        use futures::TryStreamExt;
        self.store
            .list(Some(&self.child(relative)))
            .try_collect()
            .await
            .map_err(|source| self.store_error("list", relative, source))
    }

    /// Write `bytes` to `relative`, replacing what is there.
    pub async fn put(&self, relative: &str, bytes: Vec<u8>) -> Result<()> {
        self.store
            .put(&self.child(relative), PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|source| self.store_error("write", relative, source))
    }

    /// Delete the object at `path` (as [`Location::list`] gives it); one
    /// already gone is not an error.
    pub async fn delete(&self, path: &Path) -> Result<()> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => {
                let relative = path
                    .as_ref()
                    .strip_prefix(self.prefix.as_ref())
                    .unwrap_or(path.as_ref())
                    .trim_start_matches('/');
                Err(self.store_error("delete", relative, source))
            }
        }
    }

    fn store_error(
        &self,
        op: &'static str,
        relative: &str,
        source: object_store::Error,
    ) -> FormatError {
        FormatError::Store {
            op,
            url: self.url_of(relative),
            source,
        }
    }
}

/// Options for `scheme`'s store from the environment (`AWS_*`, `GOOGLE_*`,
/// `AZURE_*`), as each cloud's own tools read them.
fn env_options(scheme: &str) -> Vec<(String, String)> {
    use object_store::aws::AmazonS3ConfigKey;
    use object_store::azure::AzureConfigKey;
    use object_store::gcp::GoogleConfigKey;
    let known = |key: &str| match scheme {
        "s3" | "s3a" => key.starts_with("aws_") && key.parse::<AmazonS3ConfigKey>().is_ok(),
        "gs" => key.starts_with("google_") && key.parse::<GoogleConfigKey>().is_ok(),
        "az" | "adl" | "azure" | "abfs" | "abfss" => {
            key.starts_with("azure_") && key.parse::<AzureConfigKey>().is_ok()
        }
        _ => false,
    };
    std::env::vars()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .filter(|(k, _)| known(k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_and_children() {
        let dir = std::env::temp_dir();
        let loc = Location::parse(dir.to_str().unwrap()).unwrap();
        assert_eq!(loc.local_root(), Some(dir.as_path()));
        let child = loc.child("shards/part-000000.parquet");
        assert!(child.as_ref().ends_with("shards/part-000000.parquet"));
        let mem = Location::parse("memory://ds").unwrap();
        assert_eq!(mem.child("manifest.json").as_ref(), "ds/manifest.json");
        assert!(Location::parse("").is_err());
    }
}
