#!/usr/bin/env python3
"""Data as users have it: the generator's token lists, 40-column table and ~115 KB blobs,
rewritten the way pyarrow and polars write Parquet by default, then read by each tool from
the files its own writer made (shardfeed from the shards `shardfeed shard` made of the
pyarrow-written files, with its defaults).

  * pyarrow: every field nullable (list items too: `list<int32>` as pyarrow, Hugging Face
    datasets and pandas exports make them), `pq.write_table` defaults (snappy, one row group
    per 1 Mi rows, dictionaries, V1 data pages);
  * polars: `pl.from_arrow(...).write_parquet(...)` defaults (zstd, `large_list`, its own row
    groups and pages).

Each kind is written as 4 files of the same rows by both. Then `first_epoch_peers.py` runs
shardfeed on the shards, pyarrow on pyarrow's files and polars on polars' files (its
`--own`), fresh processes, interleaved:

    python3 benches/peer_written.py --bin target/release/shardfeed --work /tmp/sf-peer --size 300MB
"""
import argparse, os, subprocess, sys

import pyarrow as pa
import pyarrow.parquet as pq

KINDS = ("tokens", "tabular", "images")
FILES = 4


def nullable(field: pa.Field) -> pa.Field:
    """`field` as pyarrow makes it from Python or pandas data: nullable, items too."""
    t = field.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = nullable(t.value_field)
        t = pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item)
    return pa.field(field.name, t, nullable=True)


def write(binary, work, kind, size):
    """The kind's files as pyarrow and as polars write them, and shardfeed's shards of the
    pyarrow-written ones. Returns (shards, pyarrow folder, polars folder)."""
    import polars as pl

    gen, by_pa, by_pl, ds = (os.path.join(work, f"{w}_{kind}") for w in ("gen", "pyarrow", "polars", "ds"))
    if os.path.exists(os.path.join(ds, "manifest.json")):
        return ds, by_pa, by_pl
    subprocess.run([binary, "generate", kind, "--size", size, "--files", str(FILES), "-o", gen],
                   check=True, capture_output=True)
    table = pq.read_table(gen)
    table = table.cast(pa.schema([nullable(f) for f in table.schema]))
    os.makedirs(by_pa, exist_ok=True)
    os.makedirs(by_pl, exist_ok=True)
    step = -(-table.num_rows // FILES)
    for i in range(FILES):
        part = table.slice(i * step, step)
        pq.write_table(part, os.path.join(by_pa, f"part-{i}.parquet"))
        pl.from_arrow(part).write_parquet(os.path.join(by_pl, f"part-{i}.parquet"))
    subprocess.run([binary, "shard", by_pa, "-o", ds], check=True, capture_output=True)
    return ds, by_pa, by_pl


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--work", default="/tmp/sf-peer")
    p.add_argument("--size", default="300MB")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-run", action="store_true", help="only write the data")
    args = p.parse_args()
    datasets, own = [], []
    for kind in args.kinds.split(","):
        ds, by_pa, by_pl = write(args.bin, args.work, kind, args.size)
        datasets.append(f"{kind}={ds}")
        own += [f"{kind}:pyarrow={by_pa}", f"{kind}:polars={by_pl}"]
    command = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_epoch_peers.py"),
               "--bin", args.bin, "--datasets", ",".join(datasets), "--own", ",".join(own),
               "--tools", "shardfeed,pyarrow,polars", "--repeat", str(args.repeat)]
    print(" ".join(command), flush=True)
    if not args.no_run:
        return subprocess.run(command).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
