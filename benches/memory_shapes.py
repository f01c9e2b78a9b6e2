#!/usr/bin/env python3
"""Peak resident memory of a Python process reading datasets of unusual shapes, against
`byte_budget`: 5 MB blobs (120 rows), 200,000-id token lists (600 rows) and a 301-column
float32 table (200,000 rows), each written by pyarrow and sharded with `shardfeed shard`
(defaults). Each run is a fresh process: it builds a shuffled `shardfeed.Loader`, reads three
epochs, and reports its peak RSS (`ru_maxrss`) and its RSS before the first batch.

    python3 benches/memory_shapes.py --bin target/release/shardfeed --work /tmp/sf-mem \
        --budgets 256MB,512MB --repeat 3
"""
import argparse, json, os, statistics, subprocess, sys

CHILD = r"""
import json, sys
import shardfeed
url, kw = sys.argv[1], json.loads(sys.argv[2])
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
loader = shardfeed.Loader(url, **kw)
base = rss()
for epoch in range(3):
    loader.set_epoch(epoch)
    for _ in loader:
        pass
# VmHWM, the process's own high-water mark (ru_maxrss carries the parent's over fork + exec).
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"base": base, "peak": hwm * 1024}))
"""

SHAPES = {
    # name: (batch size, writer)
    "blobs-5MB": 8,
    "token-lists-200k": 8,
    "table-301-float32": 512,
}


def write_inputs(work):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    for name in SHAPES:
        raw = os.path.join(work, "raw", name)
        if os.path.exists(raw):
            continue
        os.makedirs(raw)
        if name == "blobs-5MB":
            table = pa.table({"id": np.arange(120), "b": [rng.bytes(5_000_000) for _ in range(120)]})
            # One page per value: a page of 60 values would pass what shard admits per value.
            pq.write_table(table, os.path.join(raw, "a.parquet"), row_group_size=60,
                           data_page_size=1 << 20, write_batch_size=1)
        elif name == "token-lists-200k":
            ids = [rng.integers(0, 50_000, 200_000, dtype=np.int32) for _ in range(600)]
            pq.write_table(pa.table({"id": np.arange(600), "t": pa.array(ids, pa.list_(pa.int32()))}),
                           os.path.join(raw, "a.parquet"), row_group_size=300)
        else:
            cols = {f"c{i}": rng.random(200_000, dtype=np.float32) for i in range(300)}
            pq.write_table(pa.table(cols | {"id": np.arange(200_000)}),
                           os.path.join(raw, "a.parquet"), row_group_size=50_000)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--budgets", default="256MB,512MB")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    write_inputs(a.work)
    for name in SHAPES:
        ds = os.path.join(a.work, "ds", name)
        if not os.path.exists(os.path.join(ds, "manifest.json")):
            subprocess.run([a.bin, "shard", os.path.join(a.work, "raw", name), "-o", ds],
                           check=True, capture_output=True)
    print("| data | byte_budget | peak RSS (MiB) | RSS before the first batch | peak - before, / budget |")
    print("|---|---|---|---|---|")
    for name, batch in SHAPES.items():
        ds = os.path.join(a.work, "ds", name)
        for budget in a.budgets.split(","):
            runs = []
            for _ in range(a.repeat):
                r = subprocess.run([sys.executable, "-c", CHILD, ds,
                                    json.dumps({"batch_size": batch, "byte_budget": budget})],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(r.stderr)
                runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
            peaks = sorted(x["peak"] / 2**20 for x in runs)
            base = statistics.median(x["base"] / 2**20 for x in runs)
            size = float(budget.rstrip("MB")) * 1e6 / 2**20
            print(f"| {name} | {budget} | {statistics.median(peaks):.0f} ({peaks[0]:.0f}-{peaks[-1]:.0f}) "
                  f"| {base:.0f} | {(statistics.median(peaks) - base) / size:.2f} |", flush=True)


if __name__ == "__main__":
    main()
