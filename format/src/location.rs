//! Dataset locations: a URL or local path resolved to an object store and a prefix.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutMode, PutOptions, PutPayload,
};

use crate::{FormatError, MANIFEST_FILE, Manifest, Result, RetryPolicy};

/// A dataset (or input) location: an object store plus a path prefix in it.
///
/// Plain paths and `file://` URLs resolve to the local file system (and keep
/// their [`Location::local_root`] so writers can rename files into place);
/// relative paths, `..` included, are resolved against the current folder.
/// `memory://` gives a fresh in-memory store (tests share one through
/// [`Location::from_store`]). Other schemes (`s3://`, `gs://`, `az://`,
/// `abfss://`, `http(s)://`) get their store built here with the given
/// options over the cloud's environment variables; an unknown option key is
/// an error. A query string is only accepted on Azure URLs, as a SAS token.
///
/// Storage calls are retried by one layer only, this crate's
/// [`RetryPolicy`]: the object store clients' own retries are turned off.
/// The URL kept for messages hides passwords and query values.
#[derive(Clone, Debug)]
pub struct Location {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
    local_root: Option<PathBuf>,
    retry: RetryPolicy,
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
        let shown = crate::redact::url(url);
        let bad = |reason: String| FormatError::BadLocation {
            url: shown.clone(),
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
            Some("hf") => {
                let repo = HubRepo::parse(url).map_err(bad)?;
                let hub = Hub::new(options).map_err(bad)?;
                let store = hub.store().map_err(bad)?;
                let mut location = Self::from_store(store, Path::from(repo.resolve_prefix()), url);
                location.url = shown.trim_end_matches('/').to_string();
                Ok(location)
            }
            Some(scheme) => {
                let mut parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
                let (kind, prefix) = ObjectStoreScheme::parse(&parsed)
                    .map_err(|e| bad(crate::redact::text(&e.to_string())))?;
                // The cloud's standard environment variables first, then a
                // SAS token from the URL, explicit options over both.
                let mut all: Vec<(String, String)> = env_options(scheme);
                if let Some(query) = parsed.query().filter(|q| !q.is_empty()).map(str::to_string) {
                    if kind != ObjectStoreScheme::MicrosoftAzure {
                        return Err(bad(format!(
                            "a query string is only understood on Azure URLs (a SAS token); give {scheme}:// options with --storage-option KEY=VALUE instead"
                        )));
                    }
                    all.push(("azure_storage_sas_key".into(), query));
                    parsed.set_query(None);
                }
                all.extend(
                    options
                        .into_iter()
                        .map(|(k, v)| (k.as_ref().to_ascii_lowercase(), v.into())),
                );
                let store = build_store(&kind, &parsed, all).map_err(bad)?;
                let mut location = Self::from_store(store, prefix, url);
                location.url = shown.trim_end_matches('/').to_string();
                Ok(location)
            }
        }
    }

    fn local(path: &FsPath) -> Result<Self> {
        let absolute = resolve_local(path).map_err(|source| FormatError::LocalPath {
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
            retry: RetryPolicy::default(),
        })
    }

    /// A location in an existing store, e.g. one [`InMemory`] shared by a test.
    pub fn from_store(store: Arc<dyn ObjectStore>, prefix: Path, url: &str) -> Self {
        Location {
            store,
            prefix,
            url: crate::redact::url(url).trim_end_matches('/').to_string(),
            local_root: None,
            retry: RetryPolicy::default(),
        }
    }

    /// The same location, retrying storage calls by `policy`.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Location {
        self.retry = policy;
        self
    }

    /// How storage calls are retried.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The same dataset read through a [`FaultyStore`](crate::fault::FaultyStore)
    /// that injects `faults` (as a remote store: local files are not mapped).
    pub fn with_faults(&self, faults: crate::fault::FaultConfig) -> Location {
        let store = Arc::new(crate::fault::FaultyStore::new(self.store.clone(), faults));
        Location::from_store(store, self.prefix.clone(), &self.url).with_retry(self.retry.clone())
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix of the dataset inside the store.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The URL (or absolute path) this location was made from, with
    /// passwords and query values hidden.
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

    /// [`Location::read_manifest`], retried by `policy`.
    pub async fn read_manifest_with(&self, policy: &RetryPolicy) -> Result<Manifest> {
        self.clone()
            .with_retry(policy.clone())
            .read_manifest()
            .await
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
        self.retry
            .run(
                || async { self.store.get(&path).await?.bytes().await },
                || {},
            )
            .await
            .map_err(|source| self.store_error("read", relative, source))
    }

    /// Write `manifest` at the dataset root, refusing to replace an existing one.
    pub async fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        let url = self.url_of(MANIFEST_FILE);
        let payload = PutPayload::from(Bytes::from(manifest.to_json()));
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let path = self.child(MANIFEST_FILE);
        self.retry
            .run(
                || self.store.put_opts(&path, payload.clone(), opts.clone()),
                || {},
            )
            .await
            .map(|_| ())
            .map_err(|error| FormatError::Store {
                op: "write",
                url,
                error: crate::StoreError(error),
            })
    }

    /// Whether the dataset has a manifest.
    pub async fn has_manifest(&self) -> Result<bool> {
        self.exists(MANIFEST_FILE).await
    }

    /// Whether the object at `relative` exists: one HEAD.
    pub async fn exists(&self, relative: &str) -> Result<bool> {
        let path = self.child(relative);
        match self.retry.run(|| self.store.head(&path), || {}).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(source) => Err(self.store_error("check", relative, source)),
        }
    }

    /// Every object under the folder `relative`.
    pub async fn list(&self, relative: &str) -> Result<Vec<object_store::ObjectMeta>> {
        use futures::TryStreamExt;
        let path = self.child(relative);
        self.retry
            .run(|| self.store.list(Some(&path)).try_collect(), || {})
            .await
            .map_err(|source| self.store_error("list", relative, source))
    }

    /// Write `bytes` to `relative`, replacing what is there.
    pub async fn put(&self, relative: &str, bytes: Vec<u8>) -> Result<()> {
        let (path, payload) = (self.child(relative), PutPayload::from(bytes));
        self.retry
            .run(|| self.store.put(&path, payload.clone()), || {})
            .await
            .map(|_| ())
            .map_err(|source| self.store_error("write", relative, source))
    }

    /// Delete the object at `path` (as [`Location::list`] gives it); one
    /// already gone is not an error.
    pub async fn delete(&self, path: &Path) -> Result<()> {
        match self.retry.run(|| self.store.delete(path), || {}).await {
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
            error: crate::StoreError(source),
        }
    }
}

/// The store for `url` (of kind `kind`), built from `options`, with the
/// client's own retries turned off. An option key the store does not know is
/// an error naming it (object_store would ignore it silently).
fn build_store(
    kind: &ObjectStoreScheme,
    url: &url::Url,
    options: Vec<(String, String)>,
) -> std::result::Result<Arc<dyn ObjectStore>, String> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    use object_store::http::HttpBuilder;
    use object_store::{ClientConfigKey, RetryConfig};
    let no_retry = RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    };
    let unknown = |key: &str| format!("unknown storage option {key:?} for this store");
    let err = |e: object_store::Error| crate::redact::text(&e.to_string());
    Ok(match kind {
        ObjectStoreScheme::AmazonS3 => {
            let mut b = AmazonS3Builder::new().with_url(url.as_str());
            for (k, v) in options {
                b = b.with_config(k.parse::<AmazonS3ConfigKey>().map_err(|_| unknown(&k))?, v);
            }
            Arc::new(b.with_retry(no_retry).build().map_err(err)?)
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            let mut b = GoogleCloudStorageBuilder::new().with_url(url.as_str());
            for (k, v) in options {
                b = b.with_config(k.parse::<GoogleConfigKey>().map_err(|_| unknown(&k))?, v);
            }
            Arc::new(b.with_retry(no_retry).build().map_err(err)?)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            let mut b = MicrosoftAzureBuilder::new().with_url(url.as_str());
            for (k, v) in options {
                b = b.with_config(k.parse::<AzureConfigKey>().map_err(|_| unknown(&k))?, v);
            }
            Arc::new(b.with_retry(no_retry).build().map_err(err)?)
        }
        ObjectStoreScheme::Http => {
            let mut b = HttpBuilder::new().with_url(&url[..url::Position::BeforePath]);
            for (k, v) in options {
                b = b.with_config(k.parse::<ClientConfigKey>().map_err(|_| unknown(&k))?, v);
            }
            Arc::new(b.with_retry(no_retry).build().map_err(err)?)
        }
        other => return Err(format!("{other:?} URLs are not supported here")),
    })
}

/// A Hugging Face Hub repository's files at one revision:
/// `hf://datasets/ORG/NAME[@REV][/PATH]` (also `models/` and `spaces/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubRepo {
    /// `datasets`, `models` or `spaces`.
    pub kind: String,
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision: a branch, tag or commit (`main` when not given).
    pub revision: String,
    /// The path in the repository (may be empty, or hold a glob).
    pub path: String,
}

impl HubRepo {
    /// Parse an `hf://` URL.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let rest = url
            .strip_prefix("hf://")
            .ok_or_else(|| "not an hf:// URL".to_string())?;
        let mut parts = rest.splitn(4, '/');
        let kind = parts.next().unwrap_or_default();
        if !["datasets", "models", "spaces"].contains(&kind) {
            return Err(format!(
                "expected hf://datasets/ORG/NAME[@REV]/PATH, not {kind:?} after hf://"
            ));
        }
        let org = parts.next().unwrap_or_default();
        let name_rev = parts.next().unwrap_or_default();
        let path = parts.next().unwrap_or_default().trim_end_matches('/');
        let (name, revision) = match name_rev.split_once('@') {
            // A revision with `/` (`refs/convert/parquet`) is written
            // percent-encoded, as the Hub's own URLs do.
            Some((name, rev)) => (name, rev.replace("%2F", "/").replace("%2f", "/")),
            None => (name_rev, "main".to_string()),
        };
        let plain = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !plain(org) || !plain(name) {
            return Err("expected hf://datasets/ORG/NAME[@REV]/PATH".into());
        }
        if revision.is_empty() || revision.split('/').any(|p| p.is_empty() || p == "..") {
            return Err(format!(
                "revision {revision:?} is not a branch, tag or commit"
            ));
        }
        if path.split('/').any(|p| p == "..") {
            return Err("the path must not hold '..'".into());
        }
        Ok(HubRepo {
            kind: kind.to_string(),
            repo: format!("{org}/{name}"),
            revision,
            path: path.to_string(),
        })
    }

    /// The revision as it goes in a URL path (`/` percent-encoded).
    pub fn revision_in_path(&self) -> String {
        self.revision.replace('/', "%2F")
    }

    /// The `hf://` URL of `path` (relative to [`HubRepo::path`]'s folder) at `revision`.
    pub fn url_at(&self, revision: &str, path: &str) -> String {
        let mut url = format!(
            "hf://{}/{}@{}",
            self.kind,
            self.repo,
            revision.replace('/', "%2F")
        );
        if !path.is_empty() {
            url.push('/');
            url.push_str(path);
        }
        url
    }

    /// The store path the files' bytes are read from, on the Hub's endpoint:
    /// `datasets/ORG/NAME/resolve/REV[/PATH]` (models have no `models/`).
    pub fn resolve_prefix(&self) -> String {
        let kind = match self.kind.as_str() {
            "models" => String::new(),
            kind => format!("{kind}/"),
        };
        let mut prefix = format!("{kind}{}/resolve/{}", self.repo, self.revision_in_path());
        if !self.path.is_empty() {
            prefix.push('/');
            prefix.push_str(&self.path);
        }
        prefix
    }
}

/// Where the Hub is and who the caller is: `hf_endpoint` (else `HF_ENDPOINT`,
/// else `https://huggingface.co`) and `hf_token` (else `HF_TOKEN`). The
/// token goes only to that endpoint: in the `Authorization` header of its
/// requests, marked sensitive (never logged); a redirect to another host
/// (the Hub's CDN) does not carry it.
#[derive(Clone)]
pub struct Hub {
    /// The endpoint, without a trailing `/`.
    pub endpoint: String,
    token: Option<String>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Hub {
    /// The Hub as `options` (`hf_endpoint`, `hf_token`) and the environment
    /// say; other options are refused.
    pub fn new<I, K, V>(options: I) -> std::result::Result<Self, String>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let mut endpoint = std::env::var("HF_ENDPOINT").ok();
        let mut token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        for (k, v) in options {
            match k.as_ref().to_ascii_lowercase().as_str() {
                "hf_endpoint" => endpoint = Some(v.into()),
                "hf_token" => token = Some(v.into()),
                // Options meant for the other stores of an index.
                key if key.starts_with("aws_")
                    || key.starts_with("google_")
                    || key.starts_with("azure_") => {}
                key => return Err(format!("unknown storage option {key:?} for hf://")),
            }
        }
        let endpoint = endpoint
            .unwrap_or_else(|| "https://huggingface.co".into())
            .trim_end_matches('/')
            .to_string();
        url::Url::parse(&endpoint).map_err(|e| format!("HF_ENDPOINT {endpoint:?}: {e}"))?;
        Ok(Hub { endpoint, token })
    }

    /// The `Authorization` header value, when a token is set.
    pub fn authorization(&self) -> Option<http::HeaderValue> {
        let token = self.token.as_ref()?;
        let mut value = http::HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    /// Whether a token is set.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// An HTTP store on the endpoint, sending the token.
    pub fn store(&self) -> std::result::Result<Arc<dyn ObjectStore>, String> {
        use object_store::http::HttpBuilder;
        use object_store::{ClientOptions, RetryConfig};
        let mut headers = http::HeaderMap::new();
        if let Some(value) = self.authorization() {
            headers.insert(http::header::AUTHORIZATION, value);
        }
        let client = ClientOptions::new()
            .with_allow_http(self.endpoint.starts_with("http://"))
            .with_default_headers(headers);
        let store = HttpBuilder::new()
            .with_url(&self.endpoint)
            .with_client_options(client)
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            })
            .build()
            .map_err(|e| crate::redact::text(&e.to_string()))?;
        Ok(Arc::new(store))
    }
}

/// `path` made absolute, with `.` and `..` resolved: against the real
/// folders for the part of the path that exists (so a `..` after a symbolic
/// link goes where the OS would), lexically for the rest.
fn resolve_local(path: &FsPath) -> std::io::Result<PathBuf> {
    use std::path::Component;
    let absolute = std::path::absolute(path)?;
    let mut out = PathBuf::new();
    let mut exists = true;
    for component in absolute.components() {
        match component {
            Component::Prefix(p) => out.push(p.as_os_str()),
            Component::RootDir => out.push(Component::RootDir.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => {
                out.push(name);
                if exists {
                    // Follow links as the OS would before a later `..`.
                    match std::fs::canonicalize(&out) {
                        Ok(real) => out = real,
                        Err(_) => exists = false,
                    }
                }
            }
        }
    }
    Ok(out)
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
