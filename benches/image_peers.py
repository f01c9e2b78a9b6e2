#!/usr/bin/env python3
"""Images decoded in the loader against what users run today: a torchvision-style
`DataLoader(num_workers=N)` over an ImageFolder with PIL decode, `RandomResizedCrop(224)`,
`RandomHorizontalFlip` and `PILToTensor`, and against the JPEG decoder alone (the ceiling:
`shardfeed bench --decode-only`, the same bytes decoded to RGB on N threads, no crop, resize or
collation). `python` is the same loader used from Python as a trainer would
(`shardfeed.Loader(..., decode_images="bytes")`, each batch made a tensor with
`torch.from_numpy`): it needs the extension built in release mode (`pip install ./python`).

Each run is a fresh process over one epoch (images/s over the whole epoch, start-up
included); the tools run interleaved, --repeat times; medians.

    python3 benches/image_peers.py --bin target/release/shardfeed --work /tmp/shardfeed-images \
        --images 10000 --threads 2

The folder (100 classes of ~500x375 JPEGs at quality 90, from scikit-image's sample photographs,
cropped, resized and tinted per image) is made once with Pillow; `shard raw -o ds` shards it with
the defaults.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GEN = r'''
import os, sys, numpy as np, skimage.data as d
from PIL import Image
from concurrent.futures import ProcessPoolExecutor
root, n, classes = sys.argv[1], int(sys.argv[2]), 100
srcs = [d.astronaut(), d.chelsea(), d.coffee(), d.rocket(), d.cat(), d.immunohistochemistry(),
        d.hubble_deep_field()]
def make(i):
    rng = np.random.default_rng(i)
    s = srcs[i % len(srcs)]
    h, w = s.shape[:2]
    cw, ch = int(w * rng.uniform(0.5, 1)), int(h * rng.uniform(0.5, 1))
    x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
    im = Image.fromarray(s[y:y + ch, x:x + cw]).resize((500, 375) if i % 4 else (375, 500),
                                                       Image.BILINEAR)
    a = np.asarray(im).astype(np.int16) + rng.integers(-6, 7, size=(1, 1, 3))
    p = f"{root}/class{i * classes // n:03d}/img{i:05d}.jpg"
    os.makedirs(os.path.dirname(p), exist_ok=True)
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(p, quality=90)
with ProcessPoolExecutor(2) as ex:
    list(ex.map(make, range(n), chunksize=200))
'''

PYTHON = r'''
import sys, time, json, torch, shardfeed
ds, threads, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
loader = shardfeed.Loader(ds, batch, columns=["bytes", "label_index"], decode_images="bytes",
                          image_size=224, crop="random_resized", flip=True, threads=threads)
n, first = 0, None
for b in loader:
    x = torch.from_numpy(b["bytes"])
    if first is None:
        first = time.perf_counter() - t0
    n += x.shape[0]
s = time.perf_counter() - t0
print(json.dumps({"images": n, "seconds": s, "first_batch_s": first}))
'''

TORCH = r'''
import sys, time, json, torch, torchvision
from torchvision import transforms as T
root, workers, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
ds = torchvision.datasets.ImageFolder(root, transform=tf)
dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                 drop_last=True)
n, first = 0, None
for x, y in dl:
    if first is None:
        first = time.perf_counter() - t0
    n += x.shape[0]
s = time.perf_counter() - t0
print(json.dumps({"images": n, "seconds": s, "first_batch_s": first}))
'''


def run(cmd):
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return r.stdout


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--work", default="/tmp/shardfeed-images")
    p.add_argument("--images", type=int, default=10000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    raw = os.path.join(args.work, "raw")
    ds = os.path.join(args.work, "ds")
    if not os.path.exists(raw):
        subprocess.run([sys.executable, "-c", GEN, raw, str(args.images)], check=True)
    if not os.path.exists(os.path.join(ds, "manifest.json")):
        run([args.bin, "shard", raw, "-o", ds, "--threads", str(args.threads)])
    results = {"shardfeed": [], "python": [], "dataloader": [], "decode_only": []}
    for i in range(args.repeat):
        order = ["shardfeed", "python", "dataloader", "decode_only"]
        order = order[i % 4:] + order[:i % 4]
        for tool in order:
            if tool == "shardfeed":
                t = time.perf_counter()
                out = json.loads(run([args.bin, "bench", ds, "--columns", "bytes,label_index",
                                      "--decode-images", "bytes", "--image-size", "224",
                                      "--crop", "random_resized", "--flip", "--threads",
                                      str(args.threads), "--batch-size", str(args.batch_size),
                                      "--json"]))
                wall = time.perf_counter() - t
                results[tool].append({"images_per_s": out["rows"] / wall,
                                      "loop_images_per_s": out["rows_per_s"],
                                      "first_batch_ms": out["time_to_first_batch_ms"],
                                      "peak_rss_mib": (out["peak_rss_bytes"] or 0) / 2**20})
            elif tool == "python":
                out = json.loads(run([sys.executable, "-c", PYTHON, ds, str(args.threads),
                                      str(args.batch_size)]))
                results[tool].append({"images_per_s": out["images"] / out["seconds"],
                                      "first_batch_ms": out["first_batch_s"] * 1000})
            elif tool == "dataloader":
                out = json.loads(run([sys.executable, "-c", TORCH, raw, str(args.threads),
                                      str(args.batch_size)]))
                results[tool].append({"images_per_s": out["images"] / out["seconds"],
                                      "first_batch_ms": out["first_batch_s"] * 1000})
            else:
                out = json.loads(run([args.bin, "bench", ds, "--columns", "bytes",
                                      "--decode-images", "bytes", "--decode-only", "--threads",
                                      str(args.threads), "--json"]))
                results[tool].append({"images_per_s": out["images_per_s"]})
            print(tool, json.dumps(results[tool][-1]), flush=True)
    med = {k: statistics.median(r["images_per_s"] for r in v) for k, v in results.items()}
    print(f"\nimages/s, medians of {args.repeat} (fresh process, one epoch, {args.threads} threads):")
    for k, v in med.items():
        print(f"  {k:12s} {v:8.0f}   runs: {[round(r['images_per_s']) for r in results[k]]}")
    print(f"  shardfeed / DataLoader(num_workers={args.threads}): {med['shardfeed'] / med['dataloader']:.2f}x")
    print(f"  shardfeed from Python (shardfeed.Loader + torch.from_numpy) / DataLoader: "
          f"{med['python'] / med['dataloader']:.2f}x")
    print(f"  shardfeed / decode-only ceiling: {med['shardfeed'] / med['decode_only']:.2f}")
    first = statistics.median(r["first_batch_ms"] for r in results["shardfeed"])
    print(f"  shardfeed first batch {first:.0f} ms, peak RSS "
          f"{max(r['peak_rss_mib'] for r in results['shardfeed']):.0f} MiB")


if __name__ == "__main__":
    main()
