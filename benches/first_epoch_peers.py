#!/usr/bin/env python3
"""A fresh process's first epoch and the steady epochs after it: shardfeed against pyarrow,
polars and a torch DataLoader, on the same shards, in one run.

Every tool runs in a new process per repeat and makes `--epochs` passes over every row:
  * shardfeed:  `shardfeed bench DS --epochs N` (shuffled, collated into slabs, 2 threads);
    its passes are the epochs' own rates (`epoch_rows_per_s`);
  * pyarrow:    `ParquetFile.iter_batches(batch_size)` over every shard, 2 CPU threads
    (no shuffle, no collation);
  * polars:     `scan_parquet(shards).collect_batches(chunk_size)`, `POLARS_MAX_THREADS=2`
    (no shuffle, no collation);
  * DataLoader: `torch.utils.data.DataLoader(num_workers=2, persistent_workers=True)` over an
    IterableDataset that reads shuffled row groups with pyarrow, shuffles their rows and
    collates numpy arrays into tensors; its first epoch includes starting the workers.
Passes are timed inside the process (imports and interpreter start-up excluded; shardfeed's
process start-up excluded too; its passes are `bench --json`'s `epoch_rows_per_s`). "first" is the first pass of a fresh process; "steady" the best
later pass. Medians over `--repeat` interleaved runs.

    python3 benches/first_epoch_peers.py --bin target/release/shardfeed \\
        --datasets tokens=/tmp/lbp4/tokens/ds,tabular=/tmp/lbp4/tabular/ds,images=/tmp/lbp4/images/ds
"""
import argparse, json, os, statistics, subprocess, sys, time

from interleave import dataset_files, interleaved, settle_page_cache, warm_page_cache

BATCH = {"tokens": 64, "tabular": 4096, "images": 32}

PEER = r'''
import json, os, sys, time
kind, tool, batch, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
files = sys.argv[5:]
times, rows = [], 0
if tool == "pyarrow":
    import pyarrow as pa, pyarrow.parquet as pq
    pa.set_cpu_count(2); pa.set_io_thread_count(2)
    for _ in range(epochs):
        t, rows = time.perf_counter(), 0
        for f in files:
            for b in pq.ParquetFile(f).iter_batches(batch_size=batch):
                rows += b.num_rows
        times.append(time.perf_counter() - t)
elif tool == "polars":
    import polars as pl
    for _ in range(epochs):
        t, rows = time.perf_counter(), 0
        for b in pl.scan_parquet(files).collect_batches(chunk_size=batch):
            rows += b.height
        times.append(time.perf_counter() - t)
else:
    import random, numpy as np, pyarrow as pa, pyarrow.parquet as pq, torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
    pa.set_cpu_count(1)
    groups = [(f, g) for f in files for g in range(pq.ParquetFile(f).metadata.num_row_groups)]

    def to_numpy(col):
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            col = col.combine_chunks()
            return {"values": col.values.to_numpy(zero_copy_only=False),
                    "offsets": col.offsets.to_numpy(zero_copy_only=False)}
        if pa.types.is_binary(col.type) or pa.types.is_string(col.type):
            return {"values": np.array(col.to_pylist(), dtype=object)}
        return col.to_numpy()

    class Rows(IterableDataset):
        def __init__(self):
            self.epoch = 0
        def __iter__(self):
            info = get_worker_info()
            order = list(groups)
            random.Random(self.epoch).shuffle(order)
            mine = order[info.id::info.num_workers] if info else order
            rng = random.Random(self.epoch * 1000 + (info.id if info else 0))
            for f, g in mine:
                table = pq.ParquetFile(f).read_row_group(g)
                idx = list(range(table.num_rows)); rng.shuffle(idx)
                table = table.take(pa.array(idx))
                for s in range(0, table.num_rows, batch):
                    part = table.slice(s, batch)
                    yield {n: to_numpy(part.column(n)) for n in part.column_names}, part.num_rows

    def collate(items):
        (cols, n), = items
        out = {}
        for k, v in cols.items():
            if isinstance(v, dict):
                out[k] = {kk: (torch.from_numpy(vv) if vv.dtype != object else vv) for kk, vv in v.items()}
            else:
                out[k] = torch.from_numpy(v) if v.dtype != object else v
        return out, n

    data = Rows()
    loader = DataLoader(data, batch_size=1, num_workers=2, persistent_workers=True, collate_fn=collate)
    for e in range(epochs):
        data.epoch = e
        t, rows = time.perf_counter(), 0
        for _, n in loader:
            rows += n
        times.append(time.perf_counter() - t)
print(json.dumps({"rows": rows, "times": times}))
'''


def shards(path):
    m = json.load(open(os.path.join(path, "manifest.json")))
    return dataset_files(path), m["total_rows"]


def run_shardfeed(binary, ds, batch, epochs):
    r = subprocess.run([binary, "bench", ds, "--batch-size", str(batch), "--threads", "2",
                        "--epochs", str(epochs), "--json"], check=True, capture_output=True, text=True)
    out = json.loads(r.stdout)
    # Each epoch's own rate, as the peers' passes are timed: the first, and
    # the best later one.
    rates = out["epoch_rows_per_s"]
    return {"first": rates[0], "steady": max(rates[1:]),
            "first_batch_ms": out["time_to_first_batch_ms"], "peak_rss_mib": out["peak_rss_bytes"] / 2**20}


def parquet_files(folder):
    """The Parquet files under `folder`, in order."""
    import glob
    return sorted(glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True))


def own_files(folder):
    """The Parquet files a peer wrote under `folder`, and their rows."""
    import pyarrow.parquet as pq
    files = parquet_files(folder)
    return files, sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def run_peer(tool, kind, ds, batch, epochs, own=None):
    files, total = shards(ds)
    if own:
        # The peer reads the files its own writer made of the same rows.
        files, own_total = own_files(own)
        if own_total != total:
            raise SystemExit(f"{own} holds {own_total} rows, {ds} {total}")
    env = dict(os.environ, POLARS_MAX_THREADS="2", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", PEER, kind, tool, str(batch), str(epochs), *files],
                       check=True, capture_output=True, text=True, env=env)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if out["rows"] != total:
        raise SystemExit(f"{tool} read {out['rows']} rows of {ds}, not {total}")
    rates = [total / t for t in out["times"]]
    return {"first": rates[0], "steady": max(rates[1:])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--datasets", required=True,
                   help="kind=path,... (kinds: tokens, tabular, images; a label kind-NAME "
                        "compares two datasets of one kind)")
    p.add_argument("--tools", default="shardfeed,pyarrow,polars,dataloader")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--own", default="",
                   help="kind:tool=folder,...: that peer reads the Parquet files its own writer "
                        "made of the same rows (e.g. benches/shard_peers.py's outputs), not "
                        "shardfeed's shards")
    p.add_argument("--no-warm", action="store_true",
                   help="do not read every tool's files into the page cache afresh first (by "
                        "default none of the tools meets a cold page cache, which the first "
                        "process of a run would pay for, and all meet their files cached alike: "
                        "interleave.settle_page_cache), nor read each run's files through "
                        "before it (interleave.warm_page_cache)")
    p.add_argument("--idle", type=float, default=0.0,
                   help="seconds to wait before each process (0: back to back). On a VM whose "
                        "host takes back the guest's free memory after a moment (free page "
                        "reporting), a process started right after another reuses the memory "
                        "that one freed and its first pass is cheap; after 3 s every tool's "
                        "first pass meets memory the host must fault in again, as a trainer "
                        "starting on a machine idle for a while does")
    args = p.parse_args()
    tools = args.tools.split(",")
    own = dict(e.split("=", 1) for e in args.own.split(",") if e)
    if not args.no_warm:
        folders = [shards(e.split("=", 1)[1])[0] for e in args.datasets.split(",")]
        folders += [own_files(f)[0] for f in own.values()]
        settle_page_cache(f for group in folders for f in group)
    results = {}
    for kind, ds, tool in interleaved(args.repeat, args.datasets, tools):
        base = kind.split("-")[0]
        batch = BATCH[base]
        if not args.no_warm:
            # Each run meets its files cached, whatever was evicted since.
            mine = own.get(f"{kind}:{tool}")
            warm_page_cache(parquet_files(mine) if mine else dataset_files(ds))
        time.sleep(args.idle)
        r = (run_shardfeed(args.bin, ds, batch, args.epochs) if tool == "shardfeed"
             else run_peer(tool, base, ds, batch, args.epochs, own.get(f"{kind}:{tool}")))
        results.setdefault((kind, tool), []).append(r)
        print(json.dumps({"dataset": kind, "tool": tool, **r}), flush=True)
    print("\nrows/s, medians of", args.repeat, "fresh processes (first pass; best later pass)")
    print("| dataset | tool | first epoch | steady | shardfeed first / tool first | shardfeed steady / tool steady |")
    print("|---|---|---|---|---|---|")
    kinds = list(dict.fromkeys(k for k, _ in results))
    for kind in kinds:
        med = {t: {m: statistics.median(r[m] for r in results[(kind, t)]) for m in ("first", "steady")}
               for t in tools if (kind, t) in results}
        sf = med.get("shardfeed")
        for t, m in med.items():
            ratio = (f"{sf['first'] / m['first']:.2f}x | {sf['steady'] / m['steady']:.2f}x"
                     if sf and t != "shardfeed" else " | ")
            print(f"| {kind} | {t} | {m['first']:,.0f} | {m['steady']:,.0f} | {ratio} |")
        if sf:
            fb = statistics.median(r["first_batch_ms"] for r in results[(kind, "shardfeed")])
            rss = max(r["peak_rss_mib"] for r in results[(kind, "shardfeed")])
            print(f"| {kind} | shardfeed first batch {fb:.0f} ms, peak RSS {rss:.0f} MiB, "
                  f"first epoch / steady {sf['first'] / sf['steady']:.2f} | | | | |")


if __name__ == "__main__":
    sys.exit(main())
