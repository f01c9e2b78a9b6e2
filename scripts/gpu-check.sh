#!/usr/bin/env bash
# GPU check (run on a machine with an NVIDIA GPU and driver): builds shardfeed,
# generates and shards a token dataset, then measures pinned vs pageable
# host-to-device copies and loader throughput with the copy overlapped.
# Prints JSON; record the figures in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/shardfeed-gpu-check}"
cargo build --release -p shardfeed-cli -p shardfeed-loader --example gpu_check
bin=target/release/shardfeed
if [ ! -f "$work/ds/manifest.json" ]; then
  "$bin" generate tokens --size 1GB --files 4 -o "$work/raw"
  "$bin" shard "$work/raw" -o "$work/ds" --overwrite
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
target/release/examples/gpu_check "$work/ds" 256
