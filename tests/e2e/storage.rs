//! Storage faults: transient failures are retried, permanent ones fail fast.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use shardfeed_fixtures::Kind;
use shardfeed_format::Location;
use shardfeed_format::fault::{FaultConfig, FaultyStore};
use shardfeed_loader::{Loader, RetryPolicy};

use crate::support::*;

/// A local dataset of `rows` text rows, and the same files in an in-memory
/// store behind a fault injector.
fn dataset_in_memory(
    dir: &Path,
    rows: u64,
    faults: FaultConfig,
) -> (String, Location, Arc<FaultyStore>) {
    let local = sharded(dir, Kind::Text, rows, 100, 8 << 10);
    let memory = in_memory(Path::new(&local), "ds");
    let faulty = Arc::new(FaultyStore::new(memory as Arc<dyn ObjectStore>, faults));
    let location = Location::from_store(
        faulty.clone(),
        object_store::path::Path::from("ds"),
        "memory://ds",
    );
    (local, location, faulty)
}

/// The local dataset `local` copied into a new in-memory store as `name`.
fn remote_named(local: &str, name: &str) -> Location {
    let memory = in_memory(Path::new(local), name);
    Location::from_store(
        memory as Arc<dyn ObjectStore>,
        object_store::path::Path::from(name),
        &format!("memory://{name}"),
    )
}

fn epoch_ids(mut loader: Loader) -> (Vec<i64>, shardfeed_loader::Stats) {
    let ids = (&mut loader)
        .flat_map(|b| b.unwrap().values::<i64>("id").unwrap().to_vec())
        .collect();
    (ids, loader.stats())
}

#[test]
fn transient_failures_are_retried_and_every_row_arrives_once() {
    let tmp = tempdir();
    let faults = FaultConfig {
        transient_rate: 0.1,
        seed: 4,
        ..Default::default()
    };
    let (local, remote, faulty) = dataset_in_memory(tmp.path(), 3000, faults);
    let build = |b: shardfeed_loader::LoaderBuilder| {
        b.batch_size(64)
            .seed(8)
            .window(2)
            .drop_last(false)
            .build()
            .unwrap()
    };
    let (expected, _) = epoch_ids(build(Loader::builder(&local)));
    let fast = RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        ..RetryPolicy::default()
    };
    let (got, stats) = epoch_ids(build(
        Loader::builder("memory://ds").location(remote).retry(fast),
    ));
    assert_eq!(got, expected, "the same batches as the local run");
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(sorted, (0..3000).collect::<Vec<i64>>());
    assert!(faulty.injected() > 0, "no fault was injected");
    assert!(
        stats.retries > 0 && stats.retries <= faulty.injected(),
        "retries {} injected {}",
        stats.retries,
        faulty.injected()
    );
}

#[test]
fn permanent_failures_fail_fast_naming_the_url() {
    let tmp = tempdir();
    let (_, remote, faulty) = dataset_in_memory(tmp.path(), 500, FaultConfig::default());
    let mut loader = Loader::builder("memory://ds")
        .location(remote.clone())
        .batch_size(50)
        .build()
        .unwrap();
    faulty.set_forbidden(true);
    let err = loader.find_map(|b| b.err()).expect("a 403 fails the epoch");
    // Failing fast means not retrying: a permanent error is never retried.
    assert_eq!(loader.stats().retries, 0, "a 403 was retried");
    let text = err.to_string();
    assert!(
        text.contains("memory://ds/shards/") && text.contains("403"),
        "{text}"
    );
    // At start-up too: the manifest read is refused at once (one request).
    let before = faulty.reads();
    let err = Loader::builder("memory://ds")
        .location(remote)
        .build()
        .unwrap_err();
    assert_eq!(faulty.reads() - before, 1, "the manifest read was retried");
    assert!(
        err.to_string().contains("memory://ds/manifest.json"),
        "{err}"
    );
}

fn dir_bytes(dir: &Path) -> u64 {
    snapshot(dir).iter().map(|(_, b)| b.len() as u64).sum()
}

#[test]
fn the_cache_serves_later_epochs_without_data_reads_and_stays_under_its_limit() {
    let tmp = tempdir();
    let (local, remote, faulty) = dataset_in_memory(tmp.path(), 3000, FaultConfig::default());
    let cache = tmp.path().join("cache");
    let build =
        |b: shardfeed_loader::LoaderBuilder| b.batch_size(64).seed(8).window(2).drop_last(false);
    let mut loader = build(
        Loader::builder("memory://ds")
            .location(remote.clone())
            .cache_dir(&cache),
    )
    .build()
    .unwrap();
    let first: Vec<i64> = (&mut loader)
        .flat_map(|b| b.unwrap().values::<i64>("id").unwrap().to_vec())
        .collect();
    let reads = faulty.reads();
    let second: Vec<i64> = (&mut loader)
        .flat_map(|b| b.unwrap().values::<i64>("id").unwrap().to_vec())
        .collect();
    assert_eq!(faulty.reads(), reads, "the second epoch read from storage");
    let (local_ids, _) = epoch_ids(build(Loader::builder(&local)).build().unwrap());
    assert_eq!(first, local_ids);
    assert_ne!(first, second, "epochs differ");
    drop(loader);
    // A new loader (a new run) reuses the cache: nothing but the manifest is read.
    let mut again = build(
        Loader::builder("memory://ds")
            .location(remote.clone())
            .cache_dir(&cache),
    )
    .build()
    .unwrap();
    let before = faulty.reads();
    assert_eq!((&mut again).count(), first.len().div_ceil(64));
    assert_eq!(faulty.reads(), before, "a cached run read shard data");
    let shards: u64 = manifest(Path::new(&local))
        .shards
        .iter()
        .map(|s| s.bytes)
        .sum();
    assert_eq!(
        dir_bytes(&cache),
        shards,
        "every shard cached once, no temporary left"
    );

    // Under a limit of about two shards, the cache evicts down to it.
    let small = tmp.path().join("small");
    let limit = 2 * manifest(Path::new(&local)).shards[0].bytes + 1;
    let limited = build(
        Loader::builder("memory://ds")
            .location(remote)
            .cache_dir(&small)
            .cache_limit(limit),
    )
    .build()
    .unwrap();
    let (ids, _) = epoch_ids(limited);
    assert_eq!(ids, local_ids);
    assert!(
        dir_bytes(&small) <= limit,
        "cache holds {} > {limit}",
        dir_bytes(&small)
    );
    // The limit is the folder's: a second dataset in the same folder (the
    // same shards under another name and manifest) shares it, and the
    // older dataset's copies are evicted for it.
    let second = build(
        Loader::builder("memory://another")
            .location(remote_named(&local, "another"))
            .cache_dir(&small)
            .cache_limit(limit),
    )
    .build()
    .unwrap();
    let (ids, _) = epoch_ids(second);
    assert_eq!(ids.len(), local_ids.len());
    let folders = std::fs::read_dir(&small).unwrap().count();
    assert_eq!(folders, 2, "one folder per dataset");
    assert!(
        dir_bytes(&small) <= limit,
        "two datasets' copies hold {} > {limit}",
        dir_bytes(&small)
    );
}
