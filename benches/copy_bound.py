#!/usr/bin/env python3
"""A floor for any tool that reads a folder of input files and writes as many bytes: every file
read and its bytes written to a new file (8 MiB reads and writes, two threads, no Parquet),
from a warm page cache, with the previous run's output written back first (as
`shard_peers.py` times its tools). Prints the seconds of each run.

    python3 benches/copy_bound.py /tmp/sbench3/images/in --out /tmp/copy-bound --repeat 3
"""
import argparse, json, os, shutil, time
from concurrent.futures import ThreadPoolExecutor

from interleave import warm_page_cache


def main():
    p = argparse.ArgumentParser()
    p.add_argument("inputs")
    p.add_argument("--out", default="/tmp/copy-bound")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    files = sorted(os.path.join(args.inputs, f) for f in os.listdir(args.inputs))

    def copy(path):
        with open(path, "rb") as src, open(os.path.join(args.out, os.path.basename(path)), "wb") as dst:
            while chunk := src.read(8 << 20):
                dst.write(chunk)

    for _ in range(args.repeat):
        warm_page_cache(files)
        shutil.rmtree(args.out, ignore_errors=True)
        os.makedirs(args.out)
        os.sync()
        started = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(copy, files))
        print(json.dumps({"seconds": round(time.perf_counter() - started, 4),
                          "bytes": sum(os.path.getsize(f) for f in files)}))


if __name__ == "__main__":
    main()
