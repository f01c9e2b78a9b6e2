#!/usr/bin/env bash
# The main job on a built-in default: generate a token dataset, shard it, verify it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -p shardfeed-cli -- demo "$@"
