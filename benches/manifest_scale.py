#!/usr/bin/env python3
"""Loader start-up on a huge manifest: time to first batch and memory with N shards.

Writes one real shard (shardfeed.shard), symlinks it N times under shards/ and writes a
manifest listing all N (a synthetic dataset of N shards x ROWS rows), then, in a fresh process,
builds a shuffled Loader and takes its first batch. Reports the manifest's size, the time to
the first batch and the process's peak RSS above its baseline after `import shardfeed`.

    pip install ./python && python3 benches/manifest_scale.py --shards 100000
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time

ROWS = 64

PROBE = r"""
import json, sys, time
import shardfeed
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
base = peak()
t = time.perf_counter()
loader = shardfeed.Loader(sys.argv[1], 32, seed=0, shuffle=True)
built = time.perf_counter() - t
batch = next(iter(loader))
first = time.perf_counter() - t
print(json.dumps({"build_s": built, "first_batch_s": first, "batches_per_epoch": len(loader),
                  "peak_rss_above_import_mb": (peak() - base) / 2**20, "rows": len(batch["id"])}))
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shards", type=int, default=100_000)
    p.add_argument("--work", default=None)
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="shardfeed-manifest-scale-")
    try:
        measure(args, work)
    finally:
        # A folder of its own is removed (100,000 links and a 13 MB manifest); --work is kept.
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def measure(args, work):
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    import shardfeed

    pq.write_table(pa.table({"id": np.arange(ROWS, dtype=np.int64), "x": np.ones(ROWS, np.float32)}),
                   os.path.join(work, "one.parquet"))
    seed = os.path.join(work, "seed")
    shardfeed.shard(os.path.join(work, "one.parquet"), seed, overwrite=True)
    manifest = json.load(open(os.path.join(seed, "manifest.json")))
    entry = manifest["shards"][0]
    ds = os.path.join(work, f"ds-{args.shards}")
    os.makedirs(os.path.join(ds, "shards"), exist_ok=True)
    shards = []
    t = time.perf_counter()
    for i in range(args.shards):
        path = f"shards/part-{i:07d}.parquet"
        target = os.path.join(ds, path)
        if not os.path.exists(target):
            os.symlink(os.path.join(seed, entry["path"]), target)
        shards.append(dict(entry, path=path))
    manifest.update(shards=shards, total_rows=ROWS * args.shards, total_bytes=entry["bytes"] * args.shards,
                    input_bytes=manifest["input_bytes"] * args.shards)
    with open(os.path.join(ds, "manifest.json"), "w") as f:
        json.dump(manifest, f, separators=(",", ":"))
    made = time.perf_counter() - t
    r = subprocess.run([sys.executable, "-c", PROBE, ds], check=True, capture_output=True, text=True)
    out = json.loads(r.stdout)
    out.update(shards=args.shards, manifest_mb=os.path.getsize(os.path.join(ds, "manifest.json")) / 2**20,
               setup_s=round(made, 1))
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
