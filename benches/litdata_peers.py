#!/usr/bin/env python3
"""Streaming existing Parquet files in place: shardfeed (`shardfeed index`, then `bench`)
against LitData's Parquet indexing (`litdata.index_parquet_dataset`, then a shuffled
`StreamingDataset` with `ParquetLoader` through `StreamingDataLoader(num_workers=2)`), over the
same local files, 2 CPUs.

Each tool runs in a fresh process per repeat and makes `--epochs` passes; "first" is a fresh
process's first pass, "steady" the best later one (rows/s). LitData yields rows, collated
here into lists (its default collation cannot stack ragged token lists); its workers are
spawned (LitData refuses `fork` with its Polars-based Parquet reader) and persistent.

    pip install litdata==0.2.76
    python3 benches/litdata_peers.py --bin target/release/shardfeed \\
        --files tokens=/tmp/bx/src_tokens,tabular=/tmp/bx/src_tabular --repeat 3
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

BATCH = {"tokens": 64, "tabular": 4096}

LITDATA = r'''
import json, sys, time


def rows(items):
    return items


def main():
    import litdata as ld
    from litdata.streaming.item_loader import ParquetLoader
    src, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ds = ld.StreamingDataset(src, item_loader=ParquetLoader(), shuffle=True, seed=1)
    dl = ld.StreamingDataLoader(ds, batch_size=batch, num_workers=2, collate_fn=rows,
                                multiprocessing_context="spawn", persistent_workers=True)
    rates, n = [], 0
    for _ in range(epochs):
        t, n = time.perf_counter(), 0
        for items in dl:
            n += len(items)
        rates.append(n / (time.perf_counter() - t))
    print(json.dumps({"rates": rates, "rows": n}))


if __name__ == "__main__":
    main()
'''


def run_litdata(folder, batch, epochs):
    # A file, not `-c`: spawned workers import the main module by its path.
    script = os.path.join(os.path.dirname(folder), "litdata_run.py")
    with open(script, "w") as f:
        f.write(LITDATA)
    out = subprocess.run([sys.executable, script, folder, str(batch), str(epochs)],
                         check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {"first": got["rates"][0], "steady": max(got["rates"][1:]), "rows": got["rows"]}


def run_shardfeed(binary, index, batch, epochs):
    out = subprocess.run([binary, "bench", index, "--batch-size", str(batch), "--threads", "2",
                          "--epochs", str(epochs), "--json"], check=True, capture_output=True,
                         text=True)
    got = json.loads(out.stdout)
    rates = got["epoch_rows_per_s"]
    return {"first": rates[0], "steady": max(rates[1:])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--files", required=True, help="kind=folder,... of Parquet files")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    import litdata as ld
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for entry in args.files.split(","):
            kind, folder = entry.split("=", 1)
            # LitData writes its index.json into the folder: a copy of the files each.
            lit = os.path.join(work, f"{kind}-litdata")
            shutil.copytree(folder, lit)
            ld.index_parquet_dataset(lit)
            index = os.path.join(work, f"{kind}-index")
            subprocess.run([args.bin, "index", folder, "-o", index], check=True,
                           capture_output=True)
            for _ in range(args.repeat):
                for tool in ("shardfeed", "litdata"):
                    r = (run_shardfeed(args.bin, index, BATCH[kind], args.epochs)
                         if tool == "shardfeed" else run_litdata(lit, BATCH[kind], args.epochs))
                    results.setdefault((kind, tool), []).append(r)
                    print(json.dumps({"dataset": kind, "tool": tool, **r}), flush=True)
    print(f"\nrows/s, medians of {args.repeat} fresh processes (first pass; best later pass)")
    print("| data | shardfeed first / steady | LitData first / steady | ratio first / steady |")
    print("|---|---|---|---|")
    for kind in dict.fromkeys(k for k, _ in results):
        med = {t: {m: statistics.median(r[m] for r in results[(kind, t)]) for m in ("first", "steady")}
               for t in ("shardfeed", "litdata")}
        s, l = med["shardfeed"], med["litdata"]
        print(f"| {kind} | {s['first']:,.0f} / {s['steady']:,.0f} | {l['first']:,.0f} / {l['steady']:,.0f} "
              f"| {s['first'] / l['first']:.1f}x / {s['steady'] / l['steady']:.1f}x |")


if __name__ == "__main__":
    main()
