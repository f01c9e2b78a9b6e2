"""Parquet files of a few row groups of hundreds of MB each (as pyarrow writes by default:
up to 1 Mi rows per row group), read in place through an index: shardfeed with the default
byte budget (the row groups are read in parts) and with a budget that holds them whole
(window=1), and the same files rewritten with an offset index (`write_page_index=True`,
read in parts), against pyarrow's iter_batches over the same files. Each run is a fresh process;
runs are interleaved; medians.

    python3 benches/large_row_groups.py --work /tmp/sf-large --mb 300 --files 2 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUN = r"""
import json, resource, sys, time
tool, index, files = sys.argv[1], sys.argv[2], sys.argv[3:]
t0 = time.perf_counter()
rows, first = 0, None
if tool == "pyarrow":
    import pyarrow.parquet as pq
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=256, columns=["tokens"]):
            rows += b.num_rows
            if first is None:
                first = time.perf_counter() - t0
else:
    import shardfeed
    options = {"byte_budget": 6 << 30, "window": 1} if tool == "whole" else {}
    with shardfeed.Loader(index, 256, columns=["tokens"], seed=1, drop_last=False, **options) as loader:
        parts = loader.state_dict().get("part_rows", 0)
        for b in loader:
            rows += len(b["tokens.offsets"]) - 1
            if first is None:
                first = time.perf_counter() - t0
elapsed = time.perf_counter() - t0
print(json.dumps({"rows": rows, "rows_s": rows / elapsed, "first_ms": first * 1e3,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make(work: Path, mb: int, files: int) -> list[Path]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = work / "src"
    paths = sorted(src.glob("*.parquet"))
    if len(paths) == files:
        return paths
    src.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = mb * (1 << 20) // (2048 * 4)
    for f in range(files):
        lengths = rng.integers(1024, 3072, rows)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        # Token ids of a 50k vocabulary, Zipf-like: snappy shrinks them a little, as real ones.
        values = (rng.zipf(1.2, int(offsets[-1])) % 50_000).astype(np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        table = pa.table({"id": np.arange(f * rows, (f + 1) * rows), "tokens": tokens})
        pq.write_table(table, src / f"part-{f}.parquet")  # pyarrow's defaults
    return sorted(src.glob("*.parquet"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/sf-large")
    ap.add_argument("--mb", type=int, default=300, help="uncompressed MB per file (one row group)")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.work)
    files = make(work, args.mb, args.files)
    import pyarrow.parquet as pq

    import shardfeed

    index = work / "index"
    if not (index / "manifest.json").exists():
        shardfeed.index(str(work / "src"), str(index))
    # The same rows with an offset index: page maps without reading the pages.
    with_index = work / "index_pi"
    if not (with_index / "manifest.json").exists():
        (work / "src_pi").mkdir(exist_ok=True)
        for f in files:
            pq.write_table(pq.read_table(f), work / "src_pi" / f.name, write_page_index=True)
        shardfeed.index(str(work / "src_pi"), str(with_index))
    groups = [pq.ParquetFile(f).metadata.row_group(0) for f in files]
    print(
        f"{len(files)} files, row groups of {groups[0].num_rows} rows, "
        f"{groups[0].total_byte_size / 2**20:.0f} MiB uncompressed, "
        f"{sum(f.stat().st_size for f in files) / 2**20:.0f} MiB on disk"
    )
    results: dict[str, list[dict]] = {"parts": [], "parts_pi": [], "whole": [], "pyarrow": []}
    for _ in range(args.repeat):
        for tool in results:
            for f in files:  # the page cache holds every file alike
                f.read_bytes()
            out = subprocess.run(
                [
                    sys.executable, "-c", RUN, tool,
                    str(with_index if tool == "parts_pi" else index), *map(str, files),
                ],
                capture_output=True, text=True, check=True,
            ).stdout
            results[tool].append(json.loads(out.strip().splitlines()[-1]))
            time.sleep(0.5)
    print("| reader | rows/s (one epoch) | vs pyarrow | first batch | peak RSS |")
    print("|---|---|---|---|---|")
    base = statistics.median(r["rows_s"] for r in results["pyarrow"])
    for tool, runs in results.items():
        rate = statistics.median(r["rows_s"] for r in runs)
        first = statistics.median(r["first_ms"] for r in runs)
        rss = statistics.median(r["rss_mib"] for r in runs)
        name = {
            "parts": "shardfeed, default budget (parts)",
            "parts_pi": "shardfeed, default budget (parts), files with an offset index",
            "whole": "shardfeed, 6 GiB budget, window=1 (whole row groups)",
            "pyarrow": "pyarrow iter_batches",
        }[tool]
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x | {first:.0f} ms | {rss:.0f} MiB |")


if __name__ == "__main__":
    main()
