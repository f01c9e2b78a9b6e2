#!/usr/bin/env python3
"""Shard throughput and output size: shardfeed vs pyarrow write_dataset vs polars.

Each tool reads the same generated Parquet inputs and writes zstd level 3 Parquet
files of the same target size (the rows per file shardfeed's size target produced),
in one run, so the ratios compare like with like on this machine.

    python3 benches/shard_peers.py --bin target/release/shardfeed --size 1.5GB --work /tmp/bench
"""
import argparse, json, os, shutil, subprocess, sys, time

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import polars as pl


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


def run_pyarrow(inputs, out, rows_per_file, rows_per_group):
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    fmt = ds.ParquetFileFormat()
    ds.write_dataset(ds.dataset(inputs, format="parquet"), out, format=fmt,
                     file_options=fmt.make_write_options(compression="zstd", compression_level=3),
                     max_rows_per_file=rows_per_file, max_rows_per_group=rows_per_group,
                     min_rows_per_group=rows_per_group, use_threads=True)
    return time.perf_counter() - t, du(out)


def run_polars(inputs, out, rows_per_file, rows_per_group):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    t = time.perf_counter()
    df = pl.read_parquet(os.path.join(inputs, "*.parquet"))
    for i, start in enumerate(range(0, df.height, rows_per_file)):
        df.slice(start, rows_per_file).write_parquet(
            os.path.join(out, f"part-{i:05}.parquet"), compression="zstd", compression_level=3,
            row_group_size=rows_per_group)
    return time.perf_counter() - t, du(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--size", default="1.5GB")
    p.add_argument("--work", default="/tmp/shardfeed-bench")
    p.add_argument("--shard-size", default="128MiB")
    p.add_argument("--kinds", default="tokens,tabular")
    args = p.parse_args()
    results = []
    for kind in args.kinds.split(","):
        inputs = os.path.join(args.work, kind, "in")
        if not os.path.exists(inputs):
            subprocess.run([args.bin, "generate", kind, "--size", args.size, "--files", "8", "-o", inputs], check=True)
        # Warm the page cache so every tool reads from memory.
        du(inputs); [open(os.path.join(inputs, f), "rb").read() for f in os.listdir(inputs)]
        sf_s, sf_b, summary, rows_per_file, rows_per_group = run_shardfeed(
            args.bin, inputs, os.path.join(args.work, kind, "shardfeed"), args.shard_size)
        pa_s, pa_b = run_pyarrow(inputs, os.path.join(args.work, kind, "pyarrow"), rows_per_file, rows_per_group)
        pl_s, pl_b = run_polars(inputs, os.path.join(args.work, kind, "polars"), rows_per_file, rows_per_group)
        mb = summary["input_bytes"] / 1e6
        row = {
            "dataset": kind, "input_mb": round(mb), "rows": summary["rows"],
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
