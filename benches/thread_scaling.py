#!/usr/bin/env python3
"""Loader throughput against decode threads.

For each dataset and thread count, `shardfeed bench DS --threads T --epochs N --json` runs in a
fresh process, `--repeat` times, thread counts interleaved; the table gives the steady rate (the
best later epoch) as a median, its speed-up over one thread, the efficiency (speed-up / T: 1.0
is linear), the CPU time the process used per second of its run (how many cores it kept busy)
and the stage `bench` names as the bottleneck.

Thread counts default to 1, 2, 4, 8, 16 up to `nproc` (more threads than cores measures only
oversubscription). Kinds: tokens, tabular, images (raw bytes), decoded (images decoded in the
loader: `--decode-images image --image-size 224 --crop random_resized --flip`).

    python3 benches/thread_scaling.py --bin target/release/shardfeed --image-column bytes \\
        --datasets tokens=/tmp/lbp4/tokens/ds,tabular=/tmp/tab57/ds,decoded=/tmp/imgbench/ds
"""
import argparse, json, os, resource, statistics, subprocess, time

from interleave import dataset_files, interleaved, settle_page_cache

BATCH = {"tokens": 64, "tabular": 4096, "images": 32, "decoded": 256}


def extra(kind, image_column):
    if kind != "decoded":
        return []
    return ["--decode-images", image_column, "--image-size", "224", "--crop", "random_resized",
            "--flip"]


def run(binary, kind, ds, threads, epochs, image_column):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([binary, "bench", ds, "--batch-size", str(BATCH[kind]), "--threads",
                        str(threads), "--epochs", str(epochs), "--json", *extra(kind, image_column)],
                       check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = json.loads(r.stdout)
    # The best later epoch, as the peers' scripts count a steady pass.
    rates = out["epoch_rows_per_s"]
    return {"steady": max(rates[1:]) if len(rates) > 1 else rates[0], "cores": cpu / wall,
            "bottleneck": out.get("bottleneck") or "consumer"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--datasets", required=True, help="kind=path,... (tokens, tabular, images, decoded)")
    p.add_argument("--threads", default=None, help="comma-separated (default 1,2,4,8,16 up to nproc)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--image-column", default="image", help="the column `decoded` decodes")
    p.add_argument("--no-settle", action="store_true",
                   help="leave the shards' page cache as it is (by default each dataset is read "
                        "into the cache afresh first: interleave.settle_page_cache)")
    args = p.parse_args()
    if not args.no_settle:
        settle_page_cache(f for e in args.datasets.split(",")
                          for f in dataset_files(e.split("=", 1)[1]))
    nproc = os.cpu_count() or 1
    counts = ([int(t) for t in args.threads.split(",")] if args.threads
              else [t for t in (1, 2, 4, 8, 16) if t <= nproc])
    results = {}
    for kind, ds, t in interleaved(args.repeat, args.datasets, counts):
        r = run(args.bin, kind, ds, t, args.epochs, args.image_column)
        results.setdefault((kind, t), []).append(r)
        print(json.dumps({"dataset": kind, "threads": t, **r}), flush=True)
    print(f"\nsteady rows/s, medians of {args.repeat} fresh processes; nproc {nproc}")
    print("| dataset | threads | steady rows/s | speed-up | efficiency | cores busy | bottleneck |")
    print("|---|---|---|---|---|---|---|")
    for kind in dict.fromkeys(k for k, _ in results):
        base = None
        for t in counts:
            rs = results.get((kind, t))
            if not rs:
                continue
            steady = statistics.median(r["steady"] for r in rs)
            cores = statistics.median(r["cores"] for r in rs)
            neck = max(set(r["bottleneck"] for r in rs), key=[r["bottleneck"] for r in rs].count)
            base = base or (steady if t == counts[0] else None)
            up = steady / base if base else float("nan")
            print(f"| {kind} | {t} | {steady:,.0f} | {up:.2f}x | {up / (t / counts[0]):.2f} | "
                  f"{cores:.2f} | {neck} |")


if __name__ == "__main__":
    main()
