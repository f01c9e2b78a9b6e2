#!/usr/bin/env python3
"""User transforms: shardfeed's transform stage against a PyTorch DataLoader running the same
function over the same rows, 2 cores.

Data: 224x224x3 uint8 images as raw pixel bytes in a binary column (no decoding), sharded.
Functions (each sees the rows as an [n, 224, 224, 3] uint8 array):
  * numpy (releases the GIL): a random 192x192 crop per row, then float32 normalisation
    (its output, 28 MB a batch, copied into a pinned slab after it returns);
  * numpy-empty: the same, writing its output into `shardfeed.transform.empty`'s array
    (in a pinned slab already: no copy);
  * python (holds the GIL): a pure-Python loop over 3,000 values per row;
  * python-tokens (holds the GIL): masked-language-model masking in pure Python over rows of
    256 to 768 int32 tokens (a second set, `list<int32>`: 3.2% of the image rows' bytes, so
    the loader's own work is a small part of each batch's);
  * identity: the batch as it is (the stage's own cost, against no transform).
Runs: `transform_threads=1`, `=2`, `transform_processes=2`, and DataLoader(num_workers=2,
persistent_workers=True) over an IterableDataset that reads the shards' row groups with
pyarrow (split over the workers), batches 64 rows and applies the function. Rows/s of
epochs 2 on (workers and pools started in the first; at least 3 epochs and 2 s), medians of `--repeat` runs, each in a fresh process;
each run also prints its peak RSS, and its worker processes' (the sum of their peaks).

    pip install ./python && python3 benches/transform_peers.py --work /tmp/sf-transform
    python3 benches/transform_peers.py --alone   # the function alone, 1 and 2 threads
"""
import argparse, json, os, statistics, subprocess, sys, time

ROWS, SIDE, BATCH, EPOCHS = 2400, 224, 64, 3
# Each run's steady rate is measured over at least EPOCHS epochs and at least this many
# seconds (a fast run's 3 epochs of 37 batches took ~0.15 s: too short to time on a shared
# machine).
MIN_SECONDS = 2.0

RUN = r'''
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from transform_peers import FUNCTIONS, epoch_rate
ds, fn_name, mode = sys.argv[2], sys.argv[3], sys.argv[4]
print(json.dumps(epoch_rate(ds, FUNCTIONS[fn_name], mode)))
'''

MEAN = None


def pixels(batch):
    """The batch's rows as [n, 224, 224, 3] uint8 (a view)."""
    return batch["pixels"].reshape(-1, SIDE, SIDE, 3)


def crop_normalize(batch, rng):
    x = pixels(batch)
    n, c = len(x), 192
    out = np.empty((n, c, c, 3), dtype=np.float32)
    offsets = rng.integers(0, SIDE - c, size=(n, 2))
    for i, (dy, dx) in enumerate(offsets):
        np.subtract(x[i, dy:dy + c, dx:dx + c], 120.0, out=out[i], casting="unsafe")
        out[i] *= 1 / 58.0
    return {"image": out, "label": batch["label"]}


def crop_normalize_in_place(batch, rng):
    """`crop_normalize` writing its output where `shardfeed.transform.empty` places it: in a
    pinned slab, delivered with no copy (in DataLoader's workers, numpy.empty's array)."""
    import shardfeed.transform
    x = pixels(batch)
    n, c = len(x), 192
    out = shardfeed.transform.empty((n, c, c, 3), np.float32)
    offsets = rng.integers(0, SIDE - c, size=(n, 2))
    for i, (dy, dx) in enumerate(offsets):
        np.subtract(x[i, dy:dy + c, dx:dx + c], 120.0, out=out[i], casting="unsafe")
        out[i] *= 1 / 58.0
    return {"image": out, "label": batch["label"]}


def python_loop(batch, rng):
    x = pixels(batch).reshape(len(batch["label"]), -1)
    sums = np.empty(len(x), dtype=np.int64)
    for i in range(len(x)):
        s = 0
        for v in x[i, :3000].tolist():
            s += v * v
        sums[i] = s
    return {"sums": sums, "label": batch["label"]}


def python_mask(batch, rng):
    """15% of the tokens chosen; of those, 80% become the mask token, the rest stay; labels
    are the chosen tokens (-100 elsewhere), as a BERT-style collator makes them."""
    draws = rng.random(len(batch["tokens"])).tolist()
    masked, labels = [], []
    for token, draw in zip(batch["tokens"].tolist(), draws):
        if draw < 0.15:
            masked.append(MASK if draw < 0.12 else token)
            labels.append(token)
        else:
            masked.append(token)
            labels.append(-100)
    return {"input_ids": np.array(masked, np.int32), "labels": np.array(labels, np.int32),
            "offsets": batch["tokens.offsets"], "label": batch["label"]}


MASK = 103


def identity(batch, rng):
    return batch


import numpy as np  # noqa: E402

FUNCTIONS = {"numpy": crop_normalize, "numpy-empty": crop_normalize_in_place,
             "python": python_loop, "python-tokens": python_mask, "identity": identity}
# The set each function reads, and its columns.
SETS = {"python-tokens": "tokens"}
COLUMNS = {"ds": ["pixels", "label"], "tokens": ["tokens", "label"]}


def sharded(work, name, rows_per_group, table):
    """`work/name`: the table `table()` makes, written with pyarrow and sharded (made once)."""
    import pyarrow.parquet as pq
    import shardfeed
    raw, ds = os.path.join(work, f"raw-{name}"), os.path.join(work, name)
    if os.path.exists(os.path.join(ds, "manifest.json")):
        return ds
    os.makedirs(raw, exist_ok=True)
    pq.write_table(table(), os.path.join(raw, f"{name}.parquet"), row_group_size=rows_per_group)
    shardfeed.shard(raw, ds, row_group_rows=rows_per_group)
    return ds


def make(work):
    """224x224x3 uint8 pixels as raw bytes, 2,400 rows."""
    import pyarrow as pa

    def table():
        rows = np.random.default_rng(0).integers(0, 256, size=(ROWS, SIDE * SIDE * 3), dtype=np.uint8)
        return pa.table({"pixels": pa.array([r.tobytes() for r in rows], pa.binary()),
                         "label": pa.array(np.arange(ROWS) % 10, pa.int32())})
    return sharded(work, "ds", 100, table)


def make_tokens(work):
    """Rows of 256 to 768 int32 tokens (`list<int32>`), 2,400 rows."""
    import pyarrow as pa

    def table():
        rng = np.random.default_rng(1)
        tokens = [rng.integers(1000, 30000, size=n, dtype=np.int32)
                  for n in rng.integers(256, 769, size=ROWS)]
        return pa.table({"tokens": pa.array(tokens, pa.list_(pa.int32())),
                         "label": pa.array(np.arange(ROWS) % 10, pa.int32())})
    return sharded(work, "tokens", 400, table)


class Peer:
    """The DataLoader's dataset: the shards' row groups, split over the workers, 64-row
    batches of numpy arrays through the function."""

    def __init__(self, ds, fn):
        import torch
        self.ds, self.fn = ds, fn
        self.base = torch.utils.data.IterableDataset

    def __iter__(self):
        import json as j, pyarrow.parquet as pq, torch
        info = torch.utils.data.get_worker_info()
        wid, workers = (info.id, info.num_workers) if info else (0, 1)
        manifest = j.load(open(os.path.join(self.ds, "manifest.json")))
        groups = [(s["path"], g) for s in manifest["shards"] for g in range(len(s["row_groups"]))]
        for k, (path, g) in enumerate(groups[wid::workers]):  # noqa: B007
            table = pq.ParquetFile(os.path.join(self.ds, path)).read_row_group(g)
            label = table.column("label").to_numpy()
            if "tokens" in table.column_names:
                col = table.column("tokens").combine_chunks()
                offsets = col.offsets.to_numpy().astype(np.int64)
                values = col.values.to_numpy()
                for at in range(0, len(table) - BATCH + 1, BATCH):
                    ends = offsets[at:at + BATCH + 1]
                    batch = {"tokens": values[ends[0]:ends[-1]], "tokens.offsets": ends - ends[0],
                             "label": label[at:at + BATCH]}
                    yield self.fn(batch, np.random.default_rng([wid, k, at]))
                continue
            col = table.column("pixels").combine_chunks()
            offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset:col.offset + len(col) + 1]
            flat = np.frombuffer(col.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
            flat = flat.reshape(len(table), -1)
            for at in range(0, len(table) - BATCH + 1, BATCH):
                batch = {"pixels": flat[at:at + BATCH], "label": label[at:at + BATCH]}
                yield self.fn(batch, np.random.default_rng([wid, k, at]))


def peak_mib(pid="self"):
    """A process's peak resident memory (VmHWM), MiB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def epoch_rate(ds, fn, mode):
    """Rows/s of the second epoch, and the peak RSS of this process and of the workers."""
    if mode == "dataloader":
        import torch

        class Dataset(torch.utils.data.IterableDataset):
            def __init__(self):
                self.peer = Peer(ds, fn)

            def __iter__(self):
                return iter(self.peer)

        torch.set_num_threads(1)
        loader = torch.utils.data.DataLoader(Dataset(), batch_size=None, num_workers=2,
                                             persistent_workers=True)
    else:
        import shardfeed
        options = {"none": {}, "threads1": dict(transform=fn, transform_threads=1),
                   "threads2": dict(transform=fn, transform_threads=2),
                   "processes2": dict(transform=fn, transform_processes=2)}[mode]
        loader = shardfeed.Loader(ds, BATCH, columns=COLUMNS[os.path.basename(ds)], threads=2, seed=1,
                                  **options)
    # The first epoch starts workers and pools; the next EPOCHS are the steady rate.
    for batch in loader:
        pass
    started, rows, epochs = time.perf_counter(), 0, 0
    while epochs < EPOCHS or time.perf_counter() - started < MIN_SECONDS:
        for batch in loader:
            rows += len(batch["label"])
        epochs += 1
    rate = rows / (time.perf_counter() - started)
    workers = [p.pid for p in getattr(getattr(loader, "_runner", None), "procs", [])]
    if mode == "dataloader":
        workers = [w.pid for w in getattr(loader, "_iterator", None)._workers] if getattr(
            loader, "_iterator", None) is not None else []
    return {"rows_per_s": rate, "peak_rss_mib": peak_mib(),
            "workers_peak_rss_mib": sum(peak_mib(pid) for pid in workers)}


def alone(repeat):
    """The numpy function with no loader: rows/s on 1 and 2 Python threads over one in-memory
    batch (how far a second thread can take it on this machine at best)."""
    import threading
    x = np.random.default_rng(0).integers(0, 256, size=(BATCH, SIDE * SIDE * 3), dtype=np.uint8)
    batch = {"pixels": x, "label": np.zeros(BATCH, np.int32)}

    def work(n):
        rng = np.random.default_rng(1)
        for _ in range(n):
            crop_normalize(batch, rng)

    for _ in range(repeat):
        rates = {}
        for threads in (1, 2):
            ts = [threading.Thread(target=work, args=(40,)) for _ in range(threads)]
            t = time.perf_counter()
            for th in ts:
                th.start()
            for th in ts:
                th.join()
            rates[threads] = threads * 40 * BATCH / (time.perf_counter() - t)
        print(f"numpy function alone: 1 thread {rates[1]:,.0f} rows/s, 2 threads {rates[2]:,.0f} "
              f"({rates[2] / rates[1]:.2f}x)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="/tmp/sf-transform")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", help="these functions (comma-separated) and no transform")
    p.add_argument("--alone", action="store_true",
                   help="only time the numpy function with no loader, on 1 and 2 threads")
    args = p.parse_args()
    if args.alone:
        return alone(args.repeat)
    sets = {"ds": make(args.work), "tokens": make_tokens(args.work)}
    here = os.path.dirname(os.path.abspath(__file__))
    # The identity right after no transform: the pair compared runs back to back.
    plan = [("numpy", "none"), ("identity", "threads2")]
    plan += [("numpy", m) for m in ("threads1", "threads2", "dataloader")]
    plan += [("numpy-empty", m) for m in ("threads1", "threads2")]
    plan += [("python", m) for m in ("threads1", "processes2", "dataloader")]
    plan += [("python-tokens", m) for m in ("threads1", "processes2", "dataloader")]
    if args.only:
        keep = args.only.split(",")
        plan = [(fn, m) for fn, m in plan if fn in keep or (fn, m) == ("numpy", "none")]
    results = {}
    for _ in range(args.repeat):
        for fn, mode in plan:
            out = subprocess.run([sys.executable, "-c", RUN, here, sets[SETS.get(fn, "ds")], fn, mode], check=True,
                                 capture_output=True, text=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            rate = got["rows_per_s"]
            results.setdefault((fn, mode), []).append(rate)
            print(json.dumps({"function": fn, "mode": mode, "rows_per_s": round(rate),
                              "peak_rss_mib": round(got["peak_rss_mib"]),
                              "workers_peak_rss_mib": round(got["workers_peak_rss_mib"])}),
                  flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nrows/s from epoch 2 on (at least {EPOCHS} epochs and {MIN_SECONDS:g} s), "
          f"medians of {args.repeat}")
    print("| function | run | rows/s | vs transform_threads=1 | vs DataLoader(num_workers=2) |")
    print("|---|---|---|---|---|")
    for fn, mode in plan:
        if fn == "identity":
            continue
        rate = med[(fn, mode)]
        base = med.get((fn, "threads1"))
        peer = med.get((fn, "dataloader")) or med.get((fn.split("-")[0], "dataloader"))
        print(f"| {fn} | {mode} | {rate:,.0f} | {rate / base:.2f}x |" if base else f"| {fn} | {mode} | {rate:,.0f} | |",
              f" {rate / peer:.2f}x |" if peer else " |")
    if ("identity", "threads2") in results:
        # Each repeat's identity against the no-transform run just before it.
        pairs = [i / n for i, n in zip(results[("identity", "threads2")], results[("numpy", "none")])]
        print(f"| identity | threads2 vs no transform, run back to back | "
              f"{med[('identity', 'threads2')]:,.0f} | median of the pairs {statistics.median(pairs):.2f}x "
              f"({min(pairs):.2f}-{max(pairs):.2f}x) | |")


if __name__ == "__main__":
    main()
