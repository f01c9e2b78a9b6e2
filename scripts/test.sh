#!/usr/bin/env bash
# Run every test of the project. Installs the Python packages the tests use first.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
cargo test --workspace
