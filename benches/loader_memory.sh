#!/usr/bin/env bash
# Loader memory: peak RSS while streaming datasets ~12x and ~24x larger than the
# configured budget (the same configuration): memory follows the budget, not the data.
# Token datasets (compressed pages, decoded into the loader's buffers) and image
# datasets (pages stored uncompressed: the loader's arrays point into the mapped shards).
# Usage: benches/loader_memory.sh [work dir]   (uses target/release/shardfeed)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/shardfeed
work="${1:-/tmp/shardfeed-loader-memory}"
budget=48MiB
for kind in tokens:64 images:8; do
  name=${kind%%:*}
  batch=${kind##*:}
  for size in 600MB 1200MB; do
    ds="$work/$name-$size/ds"
    if [ ! -f "$ds/manifest.json" ]; then
      "$bin" generate "$name" --size "$size" --files 4 -o "$work/$name-$size/raw" > /dev/null
      "$bin" shard "$work/$name-$size/raw" -o "$ds" --overwrite > /dev/null
    fi
    "$bin" bench "$ds" --batch-size "$batch" --threads 2 --byte-budget "$budget" --window 2 --prefetch 2 --json |
      python3 -c "
import json, sys
r = json.load(sys.stdin); s = r['stats']
pool = s['slabs'] * s['slab_bytes']
print(json.dumps({'dataset': '$name $size', 'rows': r['rows'], 'byte_budget': 48 << 20, 'pool_bytes': pool,
                  'configured_bytes': (48 << 20) + pool, 'peak_rss_bytes': r['peak_rss_bytes'],
                  'peak_rss_mib': round(r['peak_rss_bytes'] / 2**20, 1), 'rows_per_s': round(r['rows_per_s'])}))
"
  done
done
