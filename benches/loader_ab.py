#!/usr/bin/env python3
"""Two builds of shardfeed on the same shards, interleaved: did a change cost throughput?

For each dataset (generated and sharded once, with --shard-bin's defaults, --bin-a's
unless given), run `shardfeed bench` (--epochs 3 unless given, 2 decode threads)
alternately with build A and build B, --repeat times,
and report the median steady rate (after epoch 1), the median first epoch (a fresh
process's, from before the loader is built), the median rate over all epochs including
start-up, the median CPU seconds (user + system) of a steady epoch, and the ratios
B/A, with pyarrow's iter_batches over the same files in the same
run for scale. `--datasets kind=path,...` runs on shards already made instead.
`--mix` adds a mixture of the token dataset and a second one half its size (weights
0.5/0.5, `bench --mix`, one mixture epoch), A and B interleaved the same way.

    python3 benches/loader_ab.py --bin-a /tmp/shardfeed-before --bin-b target/release/shardfeed \
        --work /tmp/shardfeed-ab --size 300MB --repeat 5
"""
import argparse, json, os, statistics, subprocess, sys, time

import pyarrow as pa
import pyarrow.parquet as pq

from interleave import dataset_files, settle_page_cache

BATCH = {"tokens": 64, "tabular": 4096, "images": 32}


def bench(binary, path, batch, epochs):
    r = subprocess.run([binary, "bench", path, "--batch-size", str(batch), "--threads", "2",
                        "--epochs", str(epochs), "--json"], check=True, capture_output=True, text=True)
    out = json.loads(r.stdout)
    out["first_epoch_rows_per_s"] = out["epoch_rows_per_s"][0]
    # CPU seconds (user + system) of the later epochs, on average: steadier
    # than a rate on a shared machine, and what a change on a CPU-bound
    # pipeline saves.
    cpu = [u + s for u, s in zip(out["epoch_user_s"], out["epoch_system_s"])]
    out["steady_cpu_s"] = statistics.mean(cpu[1:] or cpu)
    return out


def iter_batches(path, batch):
    files = dataset_files(path)
    t, rows = time.perf_counter(), 0
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch):
            rows += b.num_rows
    return rows / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin-a", required=True)
    p.add_argument("--bin-b", required=True)
    p.add_argument("--work", default="/tmp/shardfeed-ab")
    p.add_argument("--kinds", default="tokens,tabular,images")
    p.add_argument("--size", default="300MB")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--shard-bin", default=None,
                   help="the build that shards the datasets, with its defaults (default: --bin-a)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--datasets", default=None,
                   help="kind=path,...: shards already made (no --work, --size, --shard-bin)")
    p.add_argument("--mix", action="store_true",
                   help="also a mixture of two token datasets (bench --mix), A against B")
    args = p.parse_args()
    shard_bin = args.shard_bin or args.bin_a
    pa.set_cpu_count(2)
    pa.set_io_thread_count(2)
    rows = []
    given = dict(e.split("=", 1) for e in args.datasets.split(",")) if args.datasets else None
    for kind in (given or args.kinds.split(",")):
        batch = BATCH[kind]
        raw, path = os.path.join(args.work, kind, "raw"), os.path.join(args.work, kind, "ds")
        if given:
            path = given[kind]
        elif not os.path.exists(os.path.join(path, "manifest.json")):
            subprocess.run([args.bin_a, "generate", kind, "--size", args.size, "--files", "4", "-o", raw],
                           check=True, capture_output=True)
            subprocess.run([shard_bin, "shard", raw, "-o", path, "--overwrite"], check=True, capture_output=True)
        # Both builds meet the shards cached the same way, and as a dataset
        # just read from disk is (interleave.settle_page_cache).
        settle_page_cache(dataset_files(path))
        runs = {"a": [], "b": [], "pyarrow": []}
        for i in range(args.repeat):
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            for who in order:
                runs[who].append(bench(args.bin_a if who == "a" else args.bin_b, path, batch, args.epochs))
            runs["pyarrow"].append(iter_batches(path, batch))
        med = lambda who, key: statistics.median(r[key] for r in runs[who])
        row = {
            "dataset": kind,
            "a_steady_rows_s": round(med("a", "steady_rows_per_s")),
            "b_steady_rows_s": round(med("b", "steady_rows_per_s")),
            "b_over_a_steady": round(med("b", "steady_rows_per_s") / med("a", "steady_rows_per_s"), 3),
            "a_first_epoch_rows_s": round(med("a", "first_epoch_rows_per_s")),
            "b_first_epoch_rows_s": round(med("b", "first_epoch_rows_per_s")),
            "b_over_a_first_epoch": round(
                med("b", "first_epoch_rows_per_s") / med("a", "first_epoch_rows_per_s"), 3),
            "a_all_epochs_rows_s": round(med("a", "rows_per_s")),
            "b_all_epochs_rows_s": round(med("b", "rows_per_s")),
            "b_over_a_all_epochs": round(med("b", "rows_per_s") / med("a", "rows_per_s"), 3),
            "a_steady_epoch_cpu_s": round(med("a", "steady_cpu_s"), 3),
            "b_steady_epoch_cpu_s": round(med("b", "steady_cpu_s"), 3),
            "b_over_a_steady_epoch_cpu": round(med("b", "steady_cpu_s") / med("a", "steady_cpu_s"), 3),
            "b_peak_rss_mib": round(med("b", "peak_rss_bytes") / 2**20),
            "a_peak_rss_mib": round(med("a", "peak_rss_bytes") / 2**20),
            "pyarrow_iter_batches_rows_s": round(statistics.median(runs["pyarrow"])),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.mix:
        mixture(args, shard_bin)
    print("\n| dataset | A steady rows/s | B steady rows/s | B/A steady | A first epoch | B first epoch | B/A | A all epochs incl. start-up | B all epochs | B/A | CPU s a steady epoch A / B | B/A | peak RSS A / B | pyarrow iter_batches |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dataset']} | {r['a_steady_rows_s']} | {r['b_steady_rows_s']} | {r['b_over_a_steady']} | "
              f"{r['a_first_epoch_rows_s']} | {r['b_first_epoch_rows_s']} | {r['b_over_a_first_epoch']} | "
              f"{r['a_all_epochs_rows_s']} | {r['b_all_epochs_rows_s']} | {r['b_over_a_all_epochs']} | "
              f"{r['a_steady_epoch_cpu_s']} / {r['b_steady_epoch_cpu_s']} | {r['b_over_a_steady_epoch_cpu']} | "
              f"{r['a_peak_rss_mib']} / {r['b_peak_rss_mib']} MiB | {r['pyarrow_iter_batches_rows_s']} |")


def mixture(args, shard_bin):
    """A against B on a mixture of two token datasets: rows/s and peak RSS."""
    paths = []
    for name, size in (("tokens", args.size), ("tokens-half", None)):
        raw, path = os.path.join(args.work, name, "raw"), os.path.join(args.work, name, "ds")
        if not os.path.exists(os.path.join(path, "manifest.json")):
            half = size or f"{int(args.size.rstrip('MB')) // 2}MB"
            subprocess.run([args.bin_a, "generate", "tokens", "--size", half, "--files", "4", "-o", raw],
                           check=True, capture_output=True)
            subprocess.run([shard_bin, "shard", raw, "-o", path, "--overwrite"], check=True,
                           capture_output=True)
        settle_page_cache(dataset_files(path))
        paths.append(path)
    runs = {"a": [], "b": []}
    for i in range(args.repeat):
        for who in (("a", "b") if i % 2 == 0 else ("b", "a")):
            r = subprocess.run([args.bin_a if who == "a" else args.bin_b, "bench", paths[0], "--mix",
                                f"{paths[1]}=0.5", "--batch-size", str(BATCH["tokens"]), "--threads", "2",
                                "--json"], check=True, capture_output=True, text=True)
            runs[who].append(json.loads(r.stdout))
    med = lambda who, key: statistics.median(r[key] for r in runs[who])
    row = {"dataset": "mixture (tokens 0.5 + tokens-half 0.5)",
           "a_rows_s": round(med("a", "rows_per_s")), "b_rows_s": round(med("b", "rows_per_s")),
           "b_over_a": round(med("b", "rows_per_s") / med("a", "rows_per_s"), 3),
           "a_peak_rss_mib": round(med("a", "peak_rss_bytes") / 2**20),
           "b_peak_rss_mib": round(med("b", "peak_rss_bytes") / 2**20)}
    print(json.dumps(row), flush=True)
    print(f"| {row['dataset']} | rows/s A {row['a_rows_s']} | B {row['b_rows_s']} | B/A {row['b_over_a']} | "
          f"peak RSS A / B {row['a_peak_rss_mib']} / {row['b_peak_rss_mib']} MiB |")
    return None


if __name__ == "__main__":
    sys.exit(main())
