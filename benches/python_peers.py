#!/usr/bin/env python3
"""Python-side iteration: shardfeed.Loader against torch's DataLoader over pyarrow, in one run.

On the same local zstd token shards (input_ids: list<int32>, 128-4096 ids per row), both hand the training
loop a dict of torch tensors per batch (id, input_ids values + offsets), shuffled:
  * shardfeed:  shardfeed.Loader(threads=2), arrays wrapped with torch.from_numpy (zero-copy);
  * DataLoader: torch.utils.data.DataLoader(num_workers=2) over an IterableDataset that reads
    shuffled row groups with pyarrow, shuffles their rows and collates tensors (what users write);
    persistent workers, timed on their second epoch (worker start-up not counted).
pyarrow uses 2 CPU threads. Best of --repeat interleaved runs.

    pip install ./python            # a release build
    python3 benches/python_peers.py --bin target/release/shardfeed --work /tmp/lbp
"""
import argparse, json, os, random, subprocess, sys, time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import shardfeed


def shards(path):
    m = json.load(open(os.path.join(path, "manifest.json")))
    return [os.path.join(path, s["path"]) for s in m["shards"]], m["total_rows"]


class ArrowRowGroups(IterableDataset):
    """Shuffled row groups, rows shuffled within each, collated to tensors: a typical user dataset."""

    def __init__(self, files, batch, seed=0):
        self.units = [(f, rg) for f in files for rg in range(pq.ParquetFile(f).num_row_groups)]
        self.batch, self.seed = batch, seed

    def __iter__(self):
        info = get_worker_info()
        units = list(self.units)
        random.Random(self.seed).shuffle(units)
        if info is not None:
            units = units[info.id :: info.num_workers]
        rng = np.random.default_rng(self.seed + (info.id if info else 0))
        files = {}
        for f, rg in units:
            pf = files.get(f) or files.setdefault(f, pq.ParquetFile(f))
            t = pf.read_row_group(rg)
            t = t.take(rng.permutation(t.num_rows))
            for start in range(0, t.num_rows, self.batch):
                part = t.slice(start, self.batch)
                tokens = part.column("input_ids").combine_chunks()
                offsets = tokens.offsets.to_numpy()
                yield {
                    "id": torch.from_numpy(part.column("id").to_numpy().copy()),
                    "input_ids": torch.from_numpy(tokens.values.to_numpy()),
                    "input_ids.offsets": torch.from_numpy((offsets - offsets[0]).astype(np.int64)),
                }


def consume(batches):
    t, rows, values = time.perf_counter(), 0, 0
    for b in batches:
        rows += len(b["id"])
        values += int(b["input_ids"].shape[0])
    return rows, values, time.perf_counter() - t


def run_shardfeed(path, batch):
    loader = shardfeed.Loader(path, batch, threads=2, seed=0)
    started = time.perf_counter()
    it = ({k: torch.from_numpy(v) for k, v in b.items()} for b in loader)
    rows, values, seconds = consume(it)
    return rows, values, time.perf_counter() - started


def run_dataloader(files, batch):
    # Persistent workers, timed on a second epoch: worker start-up is not counted.
    dl = DataLoader(ArrowRowGroups(files, batch), batch_size=None, num_workers=2, persistent_workers=True)
    consume(dl)
    return consume(dl)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--work", default="/tmp/shardfeed-python-bench")
    p.add_argument("--size", default="600MB")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    pa.set_cpu_count(2)
    pa.set_io_thread_count(2)
    torch.set_num_threads(1)
    raw, path = os.path.join(args.work, "tokens", "raw"), os.path.join(args.work, "tokens", "ds")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        subprocess.run([args.bin, "generate", "tokens", "--size", args.size, "--files", "4", "-o", raw], check=True)
        subprocess.run([args.bin, "shard", raw, "-o", path, "--overwrite"], check=True)
    files, total = shards(path)
    for f in files:  # warm the page cache for both
        open(f, "rb").read()
    sf, dl = [], []
    for _ in range(args.repeat):
        sf.append(run_shardfeed(path, args.batch))
        dl.append(run_dataloader(files, args.batch))
    best = lambda runs: max(runs, key=lambda r: r[0] / r[2])
    s, d = best(sf), best(dl)
    row = {
        "rows": total, "batch": args.batch,
        "shardfeed_rows_s": round(s[0] / s[2]), "dataloader_rows_s": round(d[0] / d[2]),
        "shardfeed_tokens_s": round(s[1] / s[2]), "dataloader_tokens_s": round(d[1] / d[2]),
        "ratio": round((s[0] / s[2]) / (d[0] / d[2]), 2),
        "runs_shardfeed_s": [round(r[2], 2) for r in sf], "runs_dataloader_s": [round(r[2], 2) for r in dl],
    }
    print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
