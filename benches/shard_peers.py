#!/usr/bin/env python3
"""Shard throughput and output size: shardfeed vs pyarrow write_dataset vs polars.

Each tool reads the same generated Parquet inputs and writes zstd level 3 Parquet
files of the same target size (the rows per file shardfeed's size target produced),
in one run, so the ratios compare like with like on this machine.

    python3 benches/shard_peers.py --bin target/release/shardfeed --size 1.5GB --work /tmp/bench

With `--repeat N` each tool runs N times per dataset, the tools' order rotated from one round to
the next, and the medians are compared (one run of a peer varies by up to a third on the
project's 2-core machines); each round's ratios are printed too.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, time

from interleave import warm_page_cache



def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def run_shardfeed(binary, inputs, out, shard_size):
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    # --no-shuffle: the peers keep input order, so this compares like with like
    # (benches/shard_shuffle_cost.py measures the default shuffle against it).
    r = subprocess.run([binary, "shard", inputs, "--output", out, "--shard-size", shard_size,
                        "--no-shuffle", "--json"],
                       check=True, capture_output=True, text=True)
    secs = time.perf_counter() - t
    summary = json.loads(r.stdout)
    m = json.load(open(os.path.join(out, "manifest.json")))
    # Peers get the same number of files and row groups: shardfeed's average sizes.
    groups = [g for s in m["shards"] for g in s["row_groups"]]
    rows_per_file = -(-m["total_rows"] // len(m["shards"]))
    rows_per_group = -(-m["total_rows"] // len(groups))
    return secs, du(out), summary, rows_per_file, rows_per_group


# Each peer writes in a fresh Python process (imports excluded from its time), as `shard` runs
# in a fresh process, rather than in the harness's process after the other peer's run and its
# own earlier rounds.
PEER_WRITE = r'''
import os, sys, time
tool, inputs, out, rows_per_file, rows_per_group = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if tool == "pyarrow":
    import pyarrow.dataset as ds
    t = time.perf_counter()
    fmt = ds.ParquetFileFormat()
    ds.write_dataset(ds.dataset(inputs, format="parquet"), out, format=fmt,
                     file_options=fmt.make_write_options(compression="zstd", compression_level=3),
                     max_rows_per_file=rows_per_file, max_rows_per_group=rows_per_group,
                     min_rows_per_group=rows_per_group, use_threads=True)
else:
    import polars as pl
    os.makedirs(out)
    t = time.perf_counter()
    df = pl.read_parquet(os.path.join(inputs, "*.parquet"))
    for i, start in enumerate(range(0, df.height, rows_per_file)):
        df.slice(start, rows_per_file).write_parquet(
            os.path.join(out, f"part-{i:05}.parquet"), compression="zstd", compression_level=3,
            row_group_size=rows_per_group)
print(time.perf_counter() - t)
'''


def run_peer(tool, inputs, out, rows_per_file, rows_per_group):
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([sys.executable, "-c", PEER_WRITE, tool, inputs, out, str(rows_per_file),
                        str(rows_per_group)], check=True, capture_output=True, text=True)
    return float(r.stdout.strip().splitlines()[-1]), du(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--size", default="1.5GB")
    p.add_argument("--work", default="/tmp/shardfeed-bench")
    p.add_argument("--shard-size", default="128MiB")
    p.add_argument("--kinds", default="tokens,tabular")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    results = []
    for kind in args.kinds.split(","):
        inputs = os.path.join(args.work, kind, "in")
        if not os.path.exists(inputs):
            subprocess.run([args.bin, "generate", kind, "--size", args.size, "--files", "8", "-o", inputs], check=True)
        out = {t: os.path.join(args.work, kind, t) for t in ("shardfeed", "pyarrow", "polars")}
        # shardfeed first: the peers get its rows per file and per row group.
        summary = rows_per_file = rows_per_group = None
        secs = {"shardfeed": [], "pyarrow": [], "polars": []}
        sizes = {}
        for i in range(args.repeat):
            # Rotated each round; shardfeed first in the first (see above).
            tools = ["shardfeed", "pyarrow", "polars"]
            for tool in tools[i % 3:] + tools[:i % 3]:
                # Warm the page cache so every tool reads from memory, and write back what the
                # tool before left dirty (300 MB of output), so no tool's run pays for another's
                # writeback on these 2 cores.
                warm_page_cache(os.path.join(inputs, f) for f in sorted(os.listdir(inputs)))
                shutil.rmtree(out[tool], ignore_errors=True)
                os.sync()
                if tool == "shardfeed":
                    t, sizes[tool], summary, rows_per_file, rows_per_group = run_shardfeed(
                        args.bin, inputs, out[tool], args.shard_size)
                else:
                    t, sizes[tool] = run_peer(tool, inputs, out[tool], rows_per_file, rows_per_group)
                secs[tool].append(t)
            if args.repeat > 1:
                mb = summary["input_bytes"] / 1e6
                print(json.dumps({"dataset": kind, "round": i + 1,
                                  **{f"{t}_mb_s": round(mb / secs[t][-1], 1) for t in secs},
                                  "vs_faster_peer": round(min(secs["pyarrow"][-1], secs["polars"][-1])
                                                          / secs["shardfeed"][-1], 2)}), flush=True)
        sf_s, pa_s, pl_s = (statistics.median(secs[t]) for t in ("shardfeed", "pyarrow", "polars"))
        sf_b, pa_b, pl_b = sizes["shardfeed"], sizes["pyarrow"], sizes["polars"]
        mb = summary["input_bytes"] / 1e6
        row = {
            "dataset": kind, "input_mb": round(mb), "rows": summary["rows"], "runs": args.repeat,
            "shardfeed_mb_s": round(mb / sf_s, 1), "pyarrow_mb_s": round(mb / pa_s, 1), "polars_mb_s": round(mb / pl_s, 1),
            "speedup_vs_pyarrow": round(pa_s / sf_s, 2), "speedup_vs_polars": round(pl_s / sf_s, 2),
            "shardfeed_bytes": sf_b, "pyarrow_bytes": pa_b, "polars_bytes": pl_b,
            "size_vs_pyarrow": round(sf_b / pa_b, 3), "size_vs_polars": round(sf_b / pl_b, 3),
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    print("\n| dataset | input MB | shardfeed MB/s | pyarrow MB/s | polars MB/s | vs pyarrow | vs polars | size vs pyarrow | size vs polars |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['dataset']} | {r['input_mb']} | {r['shardfeed_mb_s']} | {r['pyarrow_mb_s']} | {r['polars_mb_s']} | "
              f"{r['speedup_vs_pyarrow']}x | {r['speedup_vs_polars']}x | {r['size_vs_pyarrow']} | {r['size_vs_polars']} |")


if __name__ == "__main__":
    sys.exit(main())
