#!/usr/bin/env python3
"""Shuffle quality per batch on a class-sorted ImageFolder (CLASSES x PER_CLASS files of
30-50 KB of random bytes): distinct classes per batch of 64 with shardfeed.Loader(shuffle=True),
against a random sample's expectation C(1 - (1 - 1/C)^B), for a dataset sharded with the
defaults (shuffled) and with --no-shuffle (default loader, then a 4 GiB byte budget).
Needs the Python package (pip install ./python).

    python3 benches/mixing_quality.py --bin target/release/shardfeed --classes 1000 --per-class 30
"""
import argparse, json, os, subprocess, sys

import numpy as np

import shardfeed


def write_folder(root, classes, per_class, seed=0):
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = os.path.join(root, f"c{c:04d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            n = int(rng.integers(30_000, 50_000))
            with open(os.path.join(folder, f"{i:05d}.bin"), "wb") as f:
                f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())


def distinct(url, batch, epochs=2, **options):
    loader = shardfeed.Loader(url, batch, columns=["label_index"], seed=1, **options)
    every, early = [], []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for i, b in enumerate(loader):
            k = len(np.unique(b["label_index"]))
            every.append(k)
            if i < 5:
                early.append(k)
    return float(np.mean(every)), float(np.mean(early)), loader.stats()["mixing"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--work", default="/tmp/shardfeed-mixing")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--per-class", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    root = os.path.join(args.work, f"images-{args.classes}x{args.per_class}")
    if not os.path.exists(root):
        write_folder(root, args.classes, args.per_class)
    expected = args.classes * (1 - (1 - 1 / args.classes) ** args.batch)
    rows = []
    for name, extra in (("shuffled", []), ("ordered", ["--no-shuffle"])):
        out = os.path.join(args.work, f"{name}-{args.classes}x{args.per_class}")
        if not os.path.exists(os.path.join(out, "manifest.json")):
            subprocess.run([args.bin, "shard", root, "-o", out, *extra], check=True, capture_output=True)
        cases = [("defaults", {})] if name == "shuffled" else [("defaults", {}), ("byte_budget 4GiB", {"byte_budget": "4GiB"})]
        for case, options in cases:
            mean, early, mixing = distinct(out, args.batch, **options)
            row = {"shard": name, "loader": case, "distinct_per_batch": round(mean, 1),
                   "first_five": round(early, 1), "random_sample": round(expected, 1),
                   "share": round(mean / expected, 3), "share_first_five": round(early / expected, 3),
                   "window_row_groups": mixing["window_row_groups"],
                   "row_groups_per_batch": round(mixing["row_groups_per_batch"], 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{args.classes} classes x {args.per_class} files, batches of {args.batch}")
    print("| shard | loader | distinct classes / batch | first 5 batches | random sample | share | first 5 share | window (row groups) | row groups / batch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shard']} | {r['loader']} | {r['distinct_per_batch']} | {r['first_five']} | {r['random_sample']} | "
              f"{100 * r['share']:.0f}% | {100 * r['share_first_five']:.0f}% | {r['window_row_groups']} | {r['row_groups_per_batch']} |")


if __name__ == "__main__":
    sys.exit(main())
