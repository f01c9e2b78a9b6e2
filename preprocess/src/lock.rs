//! One writer at a time, and a name for each run.
//!
//! A single `shard` run and `commit` hold a create-only marker,
//! `_shardfeed.lock`, at the dataset root while they write: a second writer
//! is refused with an error naming the holder, so it can neither replace the
//! first one's files nor clean them up as stale. The tasks of a split run
//! run side by side by design: they take no lock, but refuse to start while
//! one is held. A marker left by a killed run on this machine (its process is
//! gone) is taken over; one from another machine must be removed by hand.
//!
//! Every run also gets a [`run_id`], unique per process, that names its
//! staging files: two attempts never write the same file.

use serde::{Deserialize, Serialize};
use shardfeed_format::Location;
use shardfeed_format::permute::hash_words;
use tokio::runtime::Handle;

use crate::{PreprocessError, Result};

/// The marker's file name at the dataset root.
pub const LOCK_FILE: &str = "_shardfeed.lock";

/// A name unique to this process's run: 16 hex digits.
pub(crate) fn run_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:016x}",
        hash_words(&[
            std::process::id() as u64,
            nanos,
            NEXT.fetch_add(1, Ordering::Relaxed)
        ])
    )
}

/// This machine's name.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Whether process `pid` of this machine is alive (unknown: assumed alive).
fn alive(pid: u32) -> bool {
    if !std::path::Path::new("/proc/self").exists() {
        return true;
    }
    std::path::Path::new("/proc").join(pid.to_string()).exists()
}

/// Who holds a lock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Holder {
    command: String,
    run_id: String,
    host: String,
    pid: u32,
    /// Seconds since the Unix epoch.
    started: u64,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` run {} (process {} on {}, started at unix time {})",
            self.command, self.run_id, self.pid, self.host, self.started
        )
    }
}

/// A held lock; released when dropped.
pub(crate) struct Lock {
    location: Location,
    handle: Handle,
    held: bool,
}

async fn create(
    location: &Location,
    holder: &Holder,
) -> std::result::Result<(), object_store::Error> {
    use object_store::{PutMode, PutOptions, PutPayload};
    let body = serde_json::to_vec_pretty(holder).expect("a lock record serializes");
    location
        .store()
        .put_opts(
            &location.child(LOCK_FILE),
            PutPayload::from(body),
            PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            },
        )
        .await
        .map(|_| ())
}

impl Lock {
    /// Take the lock of `location` for `command` (run `run_id`), or name
    /// the run that holds it.
    pub(crate) fn acquire(
        location: &Location,
        handle: &Handle,
        command: &str,
        run_id: &str,
    ) -> Result<Lock> {
        let holder = Holder {
            command: command.into(),
            run_id: run_id.into(),
            host: host(),
            pid: std::process::id(),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        if let Some(root) = location.local_root() {
            std::fs::create_dir_all(root)
                .map_err(|e| PreprocessError::io("create output folder", root, e))?;
        }
        let held = || Lock {
            location: location.clone(),
            handle: handle.clone(),
            held: true,
        };
        for _ in 0..2 {
            // Transient failures are retried; a retry may find the lock a
            // lost reply created: ours (see below).
            let attempt = location.retry().run(|| create(location, &holder), || {});
            match handle.block_on(attempt) {
                Ok(()) => return Ok(held()),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => {
                    return Err(shardfeed_format::FormatError::Store {
                        op: "lock",
                        url: location.url_of(LOCK_FILE),
                        error: shardfeed_format::StoreError(e),
                    }
                    .into());
                }
            }
            let Some(other) = handle.block_on(read_holder(location))? else {
                // Released meanwhile: try again.
                continue;
            };
            if other == holder {
                return Ok(held());
            }
            if other.host == holder.host && !alive(other.pid) {
                // A run on this machine that died: its files are ours to
                // replace (a re-run completes the dataset).
                tracing::warn!("taking over the lock of {other}, whose process is gone");
                handle.block_on(location.delete(&location.child(LOCK_FILE)))?;
                continue;
            }
            return Err(locked(location, &other));
        }
        let other = handle.block_on(read_holder(location))?;
        Err(PreprocessError::Locked {
            url: location.url().to_string(),
            holder: other.map_or_else(|| "another writer".into(), |h| h.to_string()),
        })
    }

    /// Release the lock.
    pub(crate) fn release(mut self) -> Result<()> {
        self.held = false;
        self.handle
            .block_on(self.location.delete(&self.location.child(LOCK_FILE)))?;
        Ok(())
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if self.held {
            // On an error path: release as well as we can.
            let _ = self
                .handle
                .block_on(self.location.delete(&self.location.child(LOCK_FILE)));
        }
    }
}

fn locked(location: &Location, holder: &Holder) -> PreprocessError {
    PreprocessError::Locked {
        url: location.url().to_string(),
        holder: holder.to_string(),
    }
}

async fn read_holder(location: &Location) -> Result<Option<Holder>> {
    match location.read(LOCK_FILE).await {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).unwrap_or(Holder {
            command: "?".into(),
            run_id: "?".into(),
            host: "?".into(),
            pid: 0,
            started: 0,
        }))),
        Err(shardfeed_format::FormatError::Store { error, .. })
            if matches!(error.inner(), object_store::Error::NotFound { .. }) =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Refuse to start a task of a split run while a single run or a commit
/// holds the dataset's lock.
pub(crate) fn check_unlocked(location: &Location, handle: &Handle) -> Result<()> {
    match handle.block_on(read_holder(location))? {
        Some(holder) if holder.host != host() || alive(holder.pid) => {
            Err(locked(location, &holder))
        }
        _ => Ok(()),
    }
}
