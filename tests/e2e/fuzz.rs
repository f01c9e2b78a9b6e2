//! A bounded mutation test of `shard`'s input readers: valid files of every
//! supported format, mutated (bytes flipped, lengths patched to large or
//! negative values, cut short), are sharded in this process. Each run must
//! end in success or an error naming the input: never a panic (the test
//! would fail), never a hang (a run has a generous deadline).
//!
//! `SHARDFEED_FUZZ_CASES` sets the mutations per input (default 200: CI);
//! a long run is the same test with a larger number, and
//! `SHARDFEED_FUZZ_SEED` draws other mutations (default 0x5eed: CI).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use shardfeed_fixtures::{FileFormat, Kind};
use shardfeed_format::permute::SplitMix64;
use shardfeed_preprocess::ShardOptions;

use crate::support::*;

/// A run that has not ended after this long is taken for a hang (a run on
/// these inputs takes milliseconds).
const DEADLINE: Duration = Duration::from_secs(120);

fn cases() -> u64 {
    env_u64("SHARDFEED_FUZZ_CASES").unwrap_or(200)
}

/// A number from the environment variable `name`, if set and valid.
fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `bytes` mutated in one of several ways chosen by `g`.
fn mutate(bytes: &[u8], g: &mut SplitMix64) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let len = out.len() as u64;
    let at = |g: &mut SplitMix64| g.below(len.max(1)) as usize;
    match g.below(6) {
        // Flip a few bits.
        0 => {
            for _ in 0..1 + g.below(4) {
                let i = at(g);
                out[i] ^= 1 << g.below(8);
            }
        }
        // A 4-byte little-endian word (a length, an offset) set to an
        // extreme: large, negative, or just past a plausible bound.
        1 | 2 => {
            let i = at(g).min(out.len().saturating_sub(4));
            let value: u32 = match g.below(4) {
                0 => u32::MAX,
                1 => 0x7fff_fff0,
                2 => 0x8000_0000,
                _ => (len as u32).wrapping_add(g.below(4096) as u32),
            };
            if out.len() >= 4 {
                out[i..i + 4].copy_from_slice(&value.to_le_bytes());
            }
        }
        // An 8-byte word set to a large value.
        3 => {
            if out.len() >= 8 {
                let i = at(g).min(out.len() - 8);
                let value: u64 = [u64::MAX, 1 << 40, 1 << 62, len * 3][g.below(4) as usize];
                out[i..i + 8].copy_from_slice(&value.to_le_bytes());
            }
        }
        // Cut short.
        4 => out.truncate(at(g)),
        // A run of bytes overwritten with noise.
        _ => {
            let i = at(g);
            let n = (1 + g.below(64) as usize).min(out.len() - i);
            for b in &mut out[i..i + n] {
                *b = g.below(256) as u8;
            }
        }
    }
    out
}

/// Shard `input` (in this process) with a deadline; the outcome as text.
fn shard_with_deadline(input: &Path, out: &Path, shuffle: bool) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let (name, out) = (s(input), s(out));
    let input = name.clone();
    std::thread::spawn(move || {
        let mut options = ShardOptions::default()
            .with_threads(2)
            .with_memory_budget(64 << 20)
            .with_shard_size(64 << 10);
        if !shuffle {
            options = options.without_shuffle();
        }
        let result = shardfeed_preprocess::shard(&[input], &out, &options)
            .map(|_| ())
            .map_err(|e| e.to_string());
        let _ = tx.send(result);
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("shard hung on {name:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!("shard panicked on {name:?} (the panic is printed above)")
        }
    }
}

#[test]
fn mutated_inputs_of_every_format_end_in_success_or_an_error() {
    let tmp = tempdir();
    let inputs: Vec<(PathBuf, &str)> = [
        (Kind::KitchenSink, FileFormat::IpcFile, "ipc-file"),
        (Kind::KitchenSink, FileFormat::IpcStream, "ipc-stream"),
        (
            Kind::KitchenSink,
            FileFormat::Parquet(parquet::basic::Compression::SNAPPY),
            "parquet",
        ),
        (Kind::Text, FileFormat::Csv, "csv"),
        (Kind::Text, FileFormat::JsonLines, "jsonl"),
    ]
    .into_iter()
    .map(|(kind, format, name)| {
        let dir = tmp.path().join(name);
        let files = shardfeed_fixtures::write_dataset(&dir, kind, 40, 1, 3, format).unwrap();
        (files[0].clone(), name)
    })
    .collect();
    let cases = cases();
    let mut g = SplitMix64::new(env_u64("SHARDFEED_FUZZ_SEED").unwrap_or(0x5eed));
    let mut outcomes = Vec::new();
    for (original, name) in &inputs {
        let bytes = std::fs::read(original).unwrap();
        let (mut ok, mut failed) = (0u64, 0u64);
        for case in 0..cases {
            let mutated = mutate(&bytes, &mut g);
            let dir = tmp.path().join(format!("{name}-{case}"));
            std::fs::create_dir_all(&dir).unwrap();
            let input = dir.join(original.file_name().unwrap());
            std::fs::write(&input, &mutated).unwrap();
            match shard_with_deadline(&input, &dir.join("ds"), case % 4 == 0) {
                Ok(()) => ok += 1,
                Err(message) => {
                    // The error names what it was reading.
                    assert!(
                        message.contains(&s(&input)) || message.contains("ds"),
                        "{name} case {case}: the error names neither the input nor the dataset: {message}"
                    );
                    // Nothing published, no lock left behind.
                    let out = dir.join("ds");
                    assert!(!out.join("manifest.json").exists(), "{name} case {case}");
                    assert!(
                        !out.join(shardfeed_preprocess::LOCK_FILE).exists(),
                        "{name} case {case}: the lock was left"
                    );
                    failed += 1;
                }
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
        outcomes.push(format!("{name}: {ok} sharded, {failed} refused"));
    }
    eprintln!("{}", outcomes.join("; "));
}
