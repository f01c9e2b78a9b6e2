//! Fault injection around any [`ObjectStore`], for tests and benchmarks:
//! transient failures at a seeded rate, permanent `403`s, added latency.
//!
//! Faults apply to reads (`get_opts`, which every range read goes through, and
//! `head`); writes and listings pass through unchanged.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use crate::permute::hash_words;

/// What to inject.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Fraction of reads (0 to 1) that fail with a transient error (a 503).
    pub transient_rate: f64,
    /// Every read fails with a permanent `403 Forbidden`.
    pub forbidden: bool,
    /// Latency added to every read.
    pub latency: Duration,
    /// Seed of the failure pattern.
    pub seed: u64,
}

/// An [`ObjectStore`] that injects faults into another one.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    config: FaultConfig,
    forbidden: AtomicBool,
    reads: AtomicU64,
    injected: AtomicU64,
}

impl FaultyStore {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, config: FaultConfig) -> Self {
        FaultyStore {
            inner,
            forbidden: AtomicBool::new(config.forbidden),
            config,
            reads: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }

    /// Start (or stop) failing every read with `403 Forbidden`.
    pub fn set_forbidden(&self, forbidden: bool) {
        self.forbidden.store(forbidden, Ordering::Relaxed);
    }

    /// Reads attempted so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    async fn before_read(&self, location: &Path) -> Result<()> {
        let n = self.reads.fetch_add(1, Ordering::Relaxed);
        if !self.config.latency.is_zero() {
            tokio::time::sleep(self.config.latency).await;
        }
        if self.forbidden.load(Ordering::Relaxed) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "403 Forbidden (injected)".into(),
            });
        }
        let draw = hash_words(&[self.config.seed, n]) as f64 / u64::MAX as f64;
        if draw < self.config.transient_rate {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(object_store::Error::Generic {
                store: "FaultyStore",
                source: "503 Service Unavailable (injected)".into(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.before_read(location).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.before_read(location).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
