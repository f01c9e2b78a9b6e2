#!/usr/bin/env bash
# Loader memory: peak RSS while streaming datasets ~12x and ~24x larger than the
# configured budget (the same configuration): memory follows the budget, not the data.
# Usage: benches/loader_memory.sh [work dir]   (uses target/release/shardfeed)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/shardfeed
work="${1:-/tmp/shardfeed-loader-memory}"
for size in 600MB 1200MB; do
  if [ ! -f "$work/$size/ds/manifest.json" ]; then
    "$bin" generate tokens --size "$size" --files 4 -o "$work/$size/raw" > /dev/null
    "$bin" shard "$work/$size/raw" -o "$work/$size/ds" --overwrite > /dev/null
  fi
done
budget=48MiB
for size in 600MB 1200MB; do
  "$bin" bench "$work/$size/ds" --batch-size 64 --threads 2 --byte-budget "$budget" --window 2 --prefetch 2 --json |
    python3 -c "
import json, sys
r = json.load(sys.stdin); s = r['stats']
pool = s['slabs'] * s['slab_bytes']
print(json.dumps({'dataset_arrow_bytes': None, 'rows': r['rows'], 'byte_budget': 48 << 20, 'pool_bytes': pool,
                  'configured_bytes': (48 << 20) + pool, 'peak_rss_bytes': r['peak_rss_bytes'],
                  'peak_rss_mib': round(r['peak_rss_bytes'] / 2**20, 1), 'rows_per_s': round(r['rows_per_s'])}))
" | sed "s/\"dataset_arrow_bytes\": null/\"dataset\": \"$size\"/"
done
