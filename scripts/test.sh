#!/usr/bin/env bash
# Run every test of the project. Installs what the tests use first: Python
# packages (pyarrow, moto's S3 server, the GCS emulator, torch, jax, pytest) and
# azurite (npm), chromium (apt); then the Rust tests, then the Python package and its tests,
# then a fresh virtual environment's `pip install ./python` (package and command).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
npm_prefix="${SHARDFEED_NPM_PREFIX:-$HOME/.cache/shardfeed-npm}"
if [ ! -x "$npm_prefix/node_modules/.bin/azurite-blob" ]; then
  npm install --silent --no-audit --no-fund --prefix "$npm_prefix" azurite@3.37.0
fi
export SHARDFEED_AZURITE="$npm_prefix/node_modules/.bin/azurite-blob"
# Chromium (Debian's) renders `bench --report`'s page in a test.
if ! command -v "${SHARDFEED_CHROMIUM:-chromium}" >/dev/null 2>&1; then
  as_root=$([ "$(id -u)" = 0 ] || echo sudo)
  export DEBIAN_FRONTEND=noninteractive
  $as_root apt-get install -y -q chromium >/dev/null \
    || { $as_root apt-get update -q >/dev/null && $as_root apt-get install -y -q chromium >/dev/null; }
fi
# Property tests draw the same cases on every run of this script, so a failure here is
# reproducible and no run fails on cases the one before did not draw; `cargo test` alone
# draws new ones (and SHARDFEED_PROPTEST_CASES sets how many) to look further.
export PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261207}"
cargo test --workspace
# The Python package, built in the dev profile (it shares the test build's
# compiled crates; users' `pip install ./python` builds release).
MATURIN_PEP517_ARGS="--profile dev" python3 -m pip install --quiet --disable-pip-version-check \
  --force-reinstall --no-deps ./python
python3 -m pytest -q python/tests
# A fresh virtual environment, as a new user has: `pip install ./python` gives the package and
# the `shardfeed` command, and both work.
fresh="$(mktemp -d)"
python3 -m venv "$fresh/venv"
MATURIN_PEP517_ARGS="--profile dev" "$fresh/venv/bin/pip" install --quiet --disable-pip-version-check ./python
"$fresh/venv/bin/shardfeed" --help >/dev/null
"$fresh/venv/bin/shardfeed" demo --rows 2000 --dir "$fresh/demo" >/dev/null
(cd "$fresh" && "$fresh/venv/bin/python" -c "import shardfeed, sys; assert shardfeed.__version__; print('fresh venv: shardfeed', shardfeed.__version__)")
# The README's other install, `cargo install --path cli` (here in the dev profile, sharing the
# test build's crates): the same command at the same version.
cargo install --quiet --path cli --debug --locked --root "$fresh/cargo" --target-dir "${CARGO_TARGET_DIR:-target}"
want="shardfeed $("$fresh/venv/bin/python" -c "import shardfeed; print(shardfeed.__version__)")"
got="$("$fresh/cargo/bin/shardfeed" --version)"
[ "$got" = "$want" ] || { echo "cargo install gave '$got', pip gave '$want'"; exit 1; }
echo "cargo install: $got"
rm -rf "$fresh"
