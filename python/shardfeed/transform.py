"""User transforms inside the loader: ``Loader(..., transform=fn)``.

``fn(batch, rng) -> batch`` runs on the loader's transform threads (``transform_threads``),
or in worker processes (``transform_processes``, spawned, fed through shared memory), after
collation and before the batch reaches the caller; results come back in plan order whatever
finished first. ``rng`` is a ``numpy.random.Generator`` seeded from (seed, epoch, rank, batch
index), so a transform's randomness is the same for any number of threads or processes and
after a resume. The state a loader saves is the state after the last batch it *delivered*
(batches transformed ahead of the caller are transformed again after a resume).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import pickle
import threading
import time
import traceback
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

import numpy as np
from numpy.random.bit_generator import ISpawnableSeedSequence

from . import _native
from ._native import ShardfeedError

Transform = Callable[[dict, np.random.Generator], dict]

#: Transform threads when ``transform_threads`` is left out: half the cores, at least one,
#: at most 8 (the loader's decode and collate threads need the rest).
DEFAULT_TRANSFORM_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))

# Native Loader parameters taken positionally, in order (for seed and rank).
_POSITIONAL = ["url", "batch_size", "columns", "shuffle", "seed", "epoch", "rank"]


# Mixed into a row's seed words (keeps them apart from a batch's).
_ROW_TAG = 0x5F7B


def rng_words(seed: int, epoch: int, rank: int, batch_index: int) -> list[int]:
    """What the generator a transform gets for one batch is seeded with."""
    return [seed & (2**64 - 1), epoch, rank, batch_index, 0x5F7A]


class _Seeded(ISpawnableSeedSequence):
    """``numpy.random.SeedSequence(words)`` as a ``PCG64`` is seeded from it, its state
    computed natively (numpy's own took 19 us a batch, a few percent of a fast pipeline's
    batch; this takes 1.5 us): the generator gives the numbers ``default_rng(words)`` gives.
    Anything else asked of it (``spawn``, ``entropy``, other sizes) goes to a real
    ``SeedSequence(words)``, made when first asked."""

    __slots__ = ("words", "state", "sequence")

    def __init__(self, words: list[int]):
        self.words = words
        self.state = np.array(_native._seed_state(words), dtype=np.uint64)
        self.sequence = None

    def _real(self) -> np.random.SeedSequence:
        if self.sequence is None:
            self.sequence = np.random.SeedSequence(self.words)
        return self.sequence

    def generate_state(self, n_words, dtype=np.uint32):
        if n_words == 4 and dtype is np.uint64:
            return self.state.copy()
        return self._real().generate_state(n_words, dtype)

    def spawn(self, n_children):
        return self._real().spawn(n_children)

    def __getattr__(self, name):
        # Only for what a SeedSequence has and this does not (copy and pickle look for
        # methods and slots before they are set: those are not asked of the sequence).
        if name.startswith("_") or name in _Seeded.__slots__:
            raise AttributeError(name)
        return getattr(self._real(), name)


def generator(words: list[int]) -> np.random.Generator:
    """``numpy.random.default_rng(words)``, made in a tenth of its time."""
    try:
        return np.random.Generator(np.random.PCG64(_Seeded(words)))
    except OverflowError:  # a word outside 0..2**64: numpy's own rules (and errors)
        return np.random.default_rng(words)


# The loader and batch a transform thread is running the function for (see `empty`).
_running = threading.local()


def empty(shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised array for a transform's output, like ``numpy.empty``.

    Called by a function running on the loader's transform threads, the array lies in a
    spare slab of the loader's pool (pinned when the pool is, and of a pool of larger slabs
    when it is larger than the loader's batches): returned by the function as it is, it
    reaches the caller with no copy. Each call takes a slab of its own: make the few large
    outputs this way. Elsewhere (outside a transform, in ``transform_processes`` workers),
    or when no slab is spare, it is ``numpy.empty``'s array, copied into a slab after the
    function returns as any other array it returns.
    """
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    dtype = np.dtype(dtype)
    running = getattr(_running, "batch", None)
    if running is not None and all(d >= 0 for d in shape):
        loader, index = running
        array = _native.Loader._empty(loader, list(shape), dtype.str, index)
        if array is not None:
            return array
    return np.empty(shape, dtype)


def _batch_index(batch: dict) -> int:
    for array in batch.values():
        base = getattr(array, "base", None)
        if isinstance(base, _native.SlabView):
            return base.batch_index
    raise ShardfeedError("a batch without its slab: cannot tell its index")


def _check_output(out: Any, index: int) -> dict:
    if not isinstance(out, dict):
        raise ShardfeedError(
            f"transform returned {type(out).__name__} for batch {index}, not a dict of arrays"
        )
    for key, value in out.items():
        if not isinstance(key, str) or not isinstance(value, np.ndarray):
            raise ShardfeedError(
                f"transform returned {key!r}: {type(value).__name__} for batch {index}: "
                "expected str keys and numpy arrays"
            )
        if value.dtype.hasobject:
            raise ShardfeedError(
                f"transform returned {key!r} of dtype object for batch {index}: "
                "expected numeric arrays"
            )
    return out


class Loader(_native.Loader):
    """:class:`shardfeed._native.Loader`, plus ``transform``, ``transform_threads`` and
    ``transform_processes`` (see the module :mod:`shardfeed.transform`). Without a transform
    it is the native loader itself."""

    def __new__(
        cls,
        *args: Any,
        transform: Transform | None = None,
        transform_threads: int | None = None,
        transform_processes: int | None = None,
        row_transform: Callable[[dict, np.random.Generator], dict] | None = None,
        filter: Callable[[dict], bool] | None = None,  # noqa: A002 - the option's name
        **kwargs: Any,
    ):
        if transform is None and row_transform is None and filter is None:
            if transform_threads is not None or transform_processes is not None:
                raise ValueError(
                    "invalid option transform_threads/transform_processes: no transform given"
                )
            return super().__new__(cls, *args, **kwargs)
        for name, fn in [("transform", transform), ("row_transform", row_transform),
                         ("filter", filter)]:
            if fn is not None and not callable(fn):
                raise ValueError(f"invalid option {name}: must be callable")
        if row_transform is not None or filter is not None:
            transform = _Rows(transform, row_transform, filter)
        if transform_threads is not None and transform_processes is not None:
            raise ValueError(
                "invalid option transform_processes: give transform_threads or "
                "transform_processes, not both"
            )
        for name, value in [("transform_threads", transform_threads),
                            ("transform_processes", transform_processes)]:
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"invalid option {name}: must be an int of at least 1")
        workers = transform_processes or transform_threads or DEFAULT_TRANSFORM_THREADS
        # Slabs for the outputs: those in flight (one more than the workers), the caller's,
        # and the pipeline's next.
        kwargs.setdefault("transform_slabs", 2 * (workers + 1))
        # A row transform's generators follow each row's origin (shard, row group, row).
        kwargs["_row_ids"] = row_transform is not None
        # Worker processes read the batches where they lie (slabs they can map).
        kwargs["_shared_slabs"] = transform_processes is not None
        obj = super().__new__(_TransformLoader, *args, **kwargs)
        named = dict(zip(_POSITIONAL, args)) | kwargs
        rank = named.get("rank")
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        obj._transform_setup(
            transform, transform_threads, transform_processes, int(named.get("seed", 0)), int(rank)
        )
        return obj


def _split(batch: dict) -> list[dict]:
    """A batch's rows: per column its value (a numpy scalar, or a view of the row's array or
    bytes; for a list of strings a list of bytes, for a list of lists a list of array views),
    or None where the column is null."""
    roles = (".offsets", ".value_offsets", ".lengths", ".validity")
    keys = [k for k in batch if not any(k.endswith(s) for s in roles)]
    n = min((len(batch[f"{k}.offsets"]) - 1 if f"{k}.offsets" in batch else len(batch[k]))
            for k in keys)
    rows: list[dict] = [{} for _ in range(n)]
    for key in keys:
        values, offsets = batch[key], batch.get(f"{key}.offsets")
        valid, lengths = batch.get(f"{key}.validity"), batch.get(f"{key}.lengths")
        items = batch.get(f"{key}.value_offsets")
        for i, row in enumerate(rows):
            if valid is not None and not valid[i]:
                row[key] = None
            elif items is not None:  # a list of strings (each item's bytes) or of lists
                row[key] = [values[items[j]:items[j + 1]] for j in range(offsets[i], offsets[i + 1])]
                if values.dtype == np.uint8:
                    row[key] = [item.tobytes() for item in row[key]]
            elif offsets is not None:
                row[key] = values[offsets[i]:offsets[i + 1]]
            elif lengths is not None:
                row[key] = values[i, :lengths[i]]
            else:
                row[key] = values[i]
    return rows


def _collate_lists(key: str, values: list, index: int, dtype=None) -> dict:
    """Rows of lists back into a batch's columns, as the loader lays them out: the items'
    values end to end under `key` (bytes for items of bytes or str, else the arrays' values),
    `key.offsets` (items a row) and `key.value_offsets` (values an item); a None row as an
    empty list and `key.validity`. Without items, values of `dtype` (the column's, when the
    rows came from one)."""
    items = [item for v in values if v is not None for item in v]
    if not items and dtype is not None:
        out = {
            key: np.empty(0, dtype=dtype),
            f"{key}.offsets": np.zeros(len(values) + 1, dtype=np.int64),
            f"{key}.value_offsets": np.zeros(1, dtype=np.int64),
        }
        if any(v is None for v in values):
            out[f"{key}.validity"] = np.array([v is not None for v in values], dtype=np.uint8)
        return out
    text = [isinstance(x, (bytes, bytearray, memoryview, str)) for x in items]
    if any(text) and not all(text):
        raise ShardfeedError(f"row_transform returned `{key}` as lists of bytes and of arrays "
                             f"in batch {index}")
    if all(text):
        raw = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in items]
        data = np.frombuffer(b"".join(raw), dtype=np.uint8)
        lengths = [len(x) for x in raw]
    else:
        arrays = [np.asarray(x) for x in items]
        if any(a.ndim != 1 or a.dtype.hasobject for a in arrays):
            raise ShardfeedError(f"row_transform returned `{key}` as lists of arrays in batch "
                                 f"{index}: each item is a 1-D numeric array")
        data = np.concatenate(arrays)
        lengths = [len(a) for a in arrays]
    out = {
        key: data,
        f"{key}.offsets": np.cumsum([0] + [0 if v is None else len(v) for v in values],
                                    dtype=np.int64),
        f"{key}.value_offsets": np.cumsum([0] + lengths, dtype=np.int64),
    }
    if any(v is None for v in values):
        out[f"{key}.validity"] = np.array([v is not None for v in values], dtype=np.uint8)
    return out


def _layouts(batch: dict) -> dict:
    """Per column of a loader's batch: ("ragged" | "lists" | "dense" | "padded", its values'
    dtype, a row's shape when dense or padded, the padding value when padded)."""
    roles = (".offsets", ".value_offsets", ".lengths", ".validity")
    out = {}
    for key, values in batch.items():
        if any(key.endswith(r) for r in roles) or not isinstance(values, np.ndarray):
            continue
        if f"{key}.value_offsets" in batch:
            out[key] = ("lists", values.dtype, (), None)
        elif f"{key}.offsets" in batch:
            out[key] = ("ragged", values.dtype, (), None)
        elif f"{key}.lengths" in batch and values.ndim == 2:
            # The padding: what lies past a row's length (the loader's `pad_value`).
            lengths = batch[f"{key}.lengths"]
            short = np.flatnonzero(lengths < values.shape[1])
            pad = values[short[0], lengths[short[0]]] if len(short) else 0
            out[key] = ("padded", values.dtype, values.shape[1:], pad)
        else:
            out[key] = ("dense", values.dtype, values.shape[1:], None)
    return out


def _padded(key: str, layout: tuple, arrays: list) -> dict | None:
    """Rows (1-D arrays, or None) of a padded column padded again as the loader pads them;
    None when a row no longer fits."""
    _, dtype, (width,), pad = layout
    if any(a is not None and (a.ndim != 1 or len(a) > width or a.dtype != dtype)
           for a in arrays):
        return None
    values = np.full((len(arrays), width), pad, dtype=dtype)
    for i, a in enumerate(arrays):
        if a is not None:
            values[i, :len(a)] = a
    out = {key: values,
           f"{key}.lengths": np.array([0 if a is None else len(a) for a in arrays], np.int64)}
    if any(a is None for a in arrays):
        out[f"{key}.validity"] = np.array([a is not None for a in arrays], dtype=np.uint8)
    return out


def _nulls(key: str, layout: tuple, n: int) -> dict:
    """`n` null rows of a column laid out as `layout` (see `_layouts`)."""
    kind, dtype, shape, pad = layout
    out = {f"{key}.validity": np.zeros(n, dtype=np.uint8)}
    if kind == "dense":
        out[key] = np.zeros((n, *shape), dtype=dtype)
    elif kind == "padded":
        out[key] = np.full((n, *shape), pad, dtype=dtype)
        out[f"{key}.lengths"] = np.zeros(n, dtype=np.int64)
    else:
        out[key] = np.empty(0, dtype=dtype)
        out[f"{key}.offsets"] = np.zeros(n + 1, dtype=np.int64)
        if kind == "lists":
            out[f"{key}.value_offsets"] = np.zeros(1, dtype=np.int64)
    return out


def _collate(rows: list[dict], index: int, layouts: dict | None = None,
             nullable: frozenset = frozenset()) -> dict:
    """Rows back into a batch: per key, equal shapes stacked ([n, ...]); 1-D arrays of other
    lengths as values + `key.offsets`; `str` and `bytes` as bytes (UTF-8) + `key.offsets`;
    lists (of bytes, str or 1-D arrays) as :func:`_collate_lists` lays them out; a None
    anywhere as zeros (or empty) + `key.validity`. The columns of the batch the rows came
    from (`layouts`, see `_layouts`) keep their layout: a ragged one whose rows are still 1-D
    arrays of its dtype stays values + `key.offsets` whatever their lengths (equal ones too: a
    batch of one row), a None an empty row; one whose every row is None keeps its layout,
    all null. A key of `nullable` (with `key.validity` in that batch) keeps its
    `key.validity`, all ones when no row is None: a batch's keys do not depend on its rows."""
    layouts = layouts or {}
    out: dict[str, np.ndarray] = {}
    if not rows:
        return out
    for key in rows[0]:
        try:
            values = [row[key] for row in rows]
        except KeyError:
            raise ShardfeedError(f"row_transform returned rows with different keys in batch {index} "
                                 f"(`{key}` is missing from some)") from None
        layout = layouts.get(key)
        if layout is not None and all(v is None for v in values):
            out.update(_nulls(key, layout, len(values)))
            continue
        if layout is not None and layout[0] == "padded":
            padded = _padded(key, layout, [None if v is None else np.asarray(v) for v in values])
            if padded is not None:
                out.update(padded)
                continue
        if layout is not None and layout[0] == "ragged":
            arrays = [None if v is None else np.asarray(v) for v in values]
            present = [a for a in arrays if a is not None]
            if all(a.ndim == 1 and a.dtype == layout[1] for a in present):
                out[key] = np.concatenate(present)
                out[f"{key}.offsets"] = np.cumsum(
                    [0] + [0 if a is None else len(a) for a in arrays], dtype=np.int64)
                if len(present) < len(arrays):
                    out[f"{key}.validity"] = np.array([a is not None for a in arrays],
                                                      dtype=np.uint8)
                continue
        if any(isinstance(v, list) for v in values):
            dtype = layout[1] if layout is not None and layout[0] == "lists" else None
            out.update(_collate_lists(key, values, index, dtype))
            continue
        if all(v is None or isinstance(v, (bytes, bytearray, memoryview, str)) for v in values):
            # Strings and bytes as the loader lays out its own: bytes + offsets (numpy's
            # fixed-width `S` arrays would drop trailing zero bytes).
            raw = [v.encode("utf-8") if isinstance(v, str) else None if v is None else bytes(v)
                   for v in values]
            out[key] = np.frombuffer(b"".join(r for r in raw if r is not None), dtype=np.uint8)
            out[f"{key}.offsets"] = np.cumsum([0] + [0 if r is None else len(r) for r in raw],
                                              dtype=np.int64)
            if any(r is None for r in raw):
                out[f"{key}.validity"] = np.array([r is not None for r in raw], dtype=np.uint8)
            continue
        present = [np.asarray(v) for v in values if v is not None]
        if not present:
            raise ShardfeedError(f"row_transform returned only nulls for `{key}` in batch {index}")
        if any(p.dtype.hasobject for p in present):
            raise ShardfeedError(f"row_transform returned `{key}` of dtype object in batch {index}")
        arrays = [np.asarray(v) if v is not None else np.zeros_like(present[0]) for v in values]
        if all(a.shape == arrays[0].shape for a in arrays):
            out[key] = np.stack(arrays)
        elif all(a.ndim == 1 for a in arrays):
            out[key] = np.concatenate(arrays)
            out[f"{key}.offsets"] = np.cumsum([0] + [len(a) for a in arrays], dtype=np.int64)
        else:
            raise ShardfeedError(f"row_transform returned `{key}` of shapes {arrays[0].shape} and "
                                 f"{next(a.shape for a in arrays if a.shape != arrays[0].shape)} in "
                                 f"batch {index}: rows of one key are equal in shape, or 1-D")
        if len(present) < len(values):
            out[f"{key}.validity"] = np.array([v is not None for v in values], dtype=np.uint8)
    for key in nullable:
        if key in out and f"{key}.validity" not in out:
            out[f"{key}.validity"] = np.ones(len(rows), dtype=np.uint8)
    return out


class _Rows:
    """`filter`, then `row_transform` on each row kept (with its own generator, seeded from
    (seed, epoch, the row's shard, row group and row) when the batch carries them as
    `_row_keys`, else spawned from the batch's), then `transform` on the batch they make.
    Picklable when its functions are."""

    def __init__(self, transform, row_transform, keep):
        self.transform, self.row_transform, self.keep = transform, row_transform, keep

    def __call__(self, batch: dict, rng: np.random.Generator) -> dict:
        keys = batch.pop("_row_keys", None)
        index = _batch_index(batch) if _has_slab(batch) else -1
        # The batch's columns keep their layouts and validity keys (see `_collate`).
        layouts = _layouts(batch)
        nullable = frozenset(k for k in batch if f"{k}.validity" in batch)
        rows = _split(batch)
        total = len(rows)
        positions = range(total)
        if self.keep is not None:
            kept, positions = [], []
            for i, row in enumerate(rows):
                try:
                    if self.keep(row):
                        kept.append(row)
                        positions.append(i)
                except Exception as e:
                    raise ShardfeedError(f"filter failed on row {i} of the batch: {e!r}") from e
            rows = kept
        if self.row_transform is not None:
            if keys is not None:
                rngs = [generator([int(w) for w in keys[i]] + [_ROW_TAG])
                        for i in positions]
            else:
                rngs = rng.spawn(len(rows))
            done = []
            for i, (row, row_rng) in enumerate(zip(rows, rngs)):
                try:
                    out = self.row_transform(row, row_rng)
                except Exception as e:
                    raise ShardfeedError(f"row_transform failed on row {i} of the batch: {e!r}") from e
                if not isinstance(out, dict):
                    raise ShardfeedError(f"row_transform returned {type(out).__name__}, not a dict")
                done.append(out)
            rows = done
        out = _collate(rows, index, layouts, nullable)
        out["_filtered"] = np.array([total - len(rows)], dtype=np.int64)
        if self.transform is not None and rows:
            filtered = out.pop("_filtered")
            out = _check_output(self.transform(out, rng), index)
            out["_filtered"] = filtered
        return out


def _has_slab(batch: dict) -> bool:
    return any(isinstance(getattr(a, "base", None), _native.SlabView) for a in batch.values())


class _Stage:
    """What the transform stage counts: busy time of the workers, the caller's wait on them,
    and per-batch latencies."""

    def __init__(self, workers: int):
        self.workers = workers
        self.lock = threading.Lock()
        self.busy_s = 0.0
        self.waited_s = 0.0
        self.latencies: collections.deque[float] = collections.deque(maxlen=4096)
        self.started = time.perf_counter()
        self.batches = 0
        self.filtered = 0
        self.pinned = 0
        self.unpinned = 0

    def ran(self, seconds: float) -> None:
        with self.lock:
            self.busy_s += seconds
            self.latencies.append(seconds)
            self.batches += 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            elapsed = max(time.perf_counter() - self.started, 1e-9)
            lat = sorted(self.latencies)

        def pct(p):
            return 1000 * lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

        return {
            "workers": self.workers,
            "batches": self.batches,
            "filtered_rows": self.filtered,
            "pinned_batches": self.pinned,
            "unpinned_batches": self.unpinned,
            "busy_fraction": min(1.0, self.busy_s / (elapsed * self.workers)),
            "caller_wait_fraction": min(1.0, self.waited_s / elapsed),
            "latency_ms": {"p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99),
                           "max": 1000 * lat[-1] if lat else 0.0},
        }


class _Threads:
    """Transforms on a pool of threads (numpy and most C extensions release the GIL).

    A function whose recent runs took less than ``INLINE_S`` on average runs on the caller's
    thread instead, when its batch is delivered: handing a batch to a thread and back costs
    two thread wake-ups, more than such a function's run (an identity cost 5-10% of a
    collate-bound loader's rate through the threads, 2% on the caller's thread). Results are
    the same either way (each batch's generator is seeded from its index)."""

    INLINE_S = 50e-6
    THREAD_PREFIX = "shardfeed-transform"

    def __init__(self, fn: Transform, threads: int, stage: _Stage, loader):
        self.fn = fn
        self.stage = stage
        # Weak: a loader dropped without close() is freed (its threads joined, its slabs
        # returned) when its last reference goes, not at some later garbage collection.
        self.loader = weakref.ref(loader)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix=self.THREAD_PREFIX)
        self.depth = threads + 1
        # The mean time of the recent runs (None before the first).
        self.mean_s: float | None = None

    def _run(self, batch: dict, index: int, words: list[int]) -> dict:
        started = time.perf_counter()
        loader = self.loader()
        if loader is None:
            raise ShardfeedError(f"the loader was dropped while batch {index} was transformed")
        _running.batch = (loader, index)
        try:
            out = self.fn(batch, generator(words))
        finally:
            _running.batch = None
        ran = time.perf_counter() - started
        self.stage.ran(ran)
        out = loader._pin(_check_output(out, index), index)
        took = time.perf_counter() - started
        self.mean_s = took if self.mean_s is None else 0.875 * self.mean_s + 0.125 * took
        return out

    def submit(self, batch: dict, index: int, words: list[int]) -> Future | tuple:
        if self.mean_s is not None and self.mean_s < self.INLINE_S:
            return (batch, index, words)  # run by `result`, on the caller's thread
        return self.pool.submit(self._run, batch, index, words)

    def result(self, handle: Future | tuple, index: int) -> dict:
        try:
            if not isinstance(handle, Future):
                return self._run(*handle)
            # Waits of at most 50 ms: a signal (Ctrl-C) delivered to another thread runs its
            # handler in this one only when it comes back to the interpreter.
            while True:
                try:
                    return handle.result(timeout=0.05)
                except FutureTimeout:
                    continue
        except ShardfeedError as e:
            if f"batch {index}" in str(e):
                raise
            raise ShardfeedError(f"transform failed on batch {index}: {e}") from e
        except Exception as e:
            trace = "".join(traceback.format_exception(e))
            raise ShardfeedError(f"transform failed on batch {index}: {e!r}\n{trace}") from e

    def discard(self, handle: Future | tuple, index: int) -> None:
        """Forget a batch submitted and not delivered (its run, if one started, is waited for:
        the batch is the loader's again after)."""
        if isinstance(handle, Future):
            try:
                self.result(handle, index)
            except Exception:
                pass

    def close(self) -> None:
        # A loader whose last reference went on one of its own pool's threads (dropped by the
        # caller while that thread transformed a batch) is closed there: that thread cannot
        # wait for itself; it ends when its run returns.
        own = threading.current_thread().name.startswith(self.THREAD_PREFIX)
        self.pool.shutdown(wait=not own, cancel_futures=True)


def _slab_of(value) -> tuple | None:
    """`(SlabView.shared, offset)` for an array lying whole in a slab other processes can
    map, else None."""
    base = getattr(value, "base", None)
    if isinstance(base, _native.SlabView) and value.flags.c_contiguous:
        shared = base.shared
        if shared is not None:
            return shared, value.ctypes.data - base.slab_address
    return None


def _layout(batch: dict, share: bool = False) -> tuple[list, int, tuple | None]:
    """Where `batch`'s arrays are read: [(key, dtype, shape, offset, in_slab)], the bytes of
    the block those not read in place are copied into (0: none), and, with `share`, the slab
    (a `SlabView.shared`) the arrays read in place lie in: that of the first array lying in
    one."""
    layout, offset, slab = [], 0, None
    for key, value in batch.items():
        placed = _slab_of(value) if share else None
        if placed is not None and slab is None:
            slab = placed[0]
        if placed is not None and placed[0] == slab:
            layout.append((key, value.dtype.str, value.shape, placed[1], True))
        else:
            layout.append((key, value.dtype.str, value.shape, offset, False))
            offset += (value.nbytes + 63) // 64 * 64
    return layout, offset, slab


def _write(block, layout: list, batch: dict) -> None:
    for (key, dtype, shape, at, in_slab), value in zip(layout, batch.values()):
        if not in_slab:
            np.ndarray(shape, dtype=dtype, buffer=block.buf, offset=at)[...] = value


def _from_shared(block, layout, slab=None) -> dict:
    """The arrays `layout` places in `block` (a shared memory block) and in `slab` (a mapping
    of the loader's slab)."""
    return {key: np.ndarray(shape, dtype=dtype, buffer=slab if in_slab else block.buf,
                            offset=at)
            for key, dtype, shape, at, in_slab in layout}


# A worker's answer when it cannot map the loader's slabs (the parent copies instead).
_UNMAPPABLE = "\0unmappable: "


class _Slabs:
    """The loader's slabs as a worker maps them (`/proc/<pid>/fd/<fd>`), kept mapped by id
    (a pool's slabs live as long as it does); at most 64, the oldest let go first."""

    def __init__(self):
        self.open: dict[tuple, Any] = {}

    def get(self, shared: tuple):
        import mmap

        pid, fd, slab_id, size = shared
        mapped = self.open.get((pid, slab_id))
        if mapped is None:
            with open(f"/proc/{pid}/fd/{fd}", "r+b") as f:
                mapped = mmap.mmap(f.fileno(), size)
            self.open[(pid, slab_id)] = mapped
            while len(self.open) > 64:
                oldest = next(iter(self.open))
                try:
                    self.open.pop(oldest).close()
                except BufferError:  # an array the function kept still views it
                    pass
        return mapped


class _Blocks:
    """Shared memory blocks opened by name, kept open (a block is mapped once per process,
    not once per batch: fresh mappings cost page faults and zeroed pages)."""

    def __init__(self):
        self.open: dict[str, Any] = {}

    def get(self, name: str, create_size: int = 0):
        from multiprocessing import shared_memory

        block = self.open.get(name)
        if block is None:
            block = (shared_memory.SharedMemory(name=name, create=True, size=create_size)
                     if create_size else shared_memory.SharedMemory(name=name))
            self.open[name] = block
        return block

    def close(self, name: str, unlink: bool = False) -> None:
        from multiprocessing import shared_memory

        block = self.open.pop(name, None)
        if block is not None:
            block.close()
        if unlink:
            try:
                if block is None:
                    block = shared_memory.SharedMemory(name=name)
                    block.close()
                block.unlink()
            except FileNotFoundError:
                pass


def _worker_main(fn_bytes: bytes, tasks, results) -> None:
    """A transform process: takes each task from the shared `tasks` queue, reads its batch where
    it lies in one of the loader's slabs (mapped once) and, for arrays outside it, from its
    slot's input block, runs the function, writes the output into the slot's output block (a
    new, larger one when it does not fit, named for the task), and says where on its own
    `results` pipe."""
    try:
        fn, unloadable = pickle.loads(fn_bytes), None
    except BaseException as e:  # noqa: BLE001 - every task reports it
        fn, unloadable = None, f"{e!r}\n{traceback.format_exc()}"
    blocks, slabs = _Blocks(), _Slabs()
    while True:
        task = tasks.get()
        if task is None:
            return
        task_id, index, rng_words, slab, in_name, layout, out_name, out_size, new_name = task
        if unloadable is not None:
            results.send((task_id, None, None, "the worker process cannot load the function (is "
                          f"its module importable there?): {unloadable}"))
            continue
        try:
            mapped = slabs.get(slab) if slab is not None else None
        except OSError as e:  # /proc/<pid>/fd closed to this process: the parent copies
            results.send((task_id, None, None, f"{_UNMAPPABLE}{e!r}"))
            continue
        except BaseException as e:  # noqa: BLE001 - reported, the worker goes on
            results.send((task_id, None, None, f"cannot map the loader's slab: {e!r}"))
            continue
        try:
            block = blocks.get(in_name) if in_name is not None else None
            batch = _from_shared(block, layout, mapped)
            out = _check_output(fn(batch, generator(rng_words)), index)
            del batch
            out_layout, size, _ = _layout(out)
            size = max(size, 1)
            if out_name is None or size > out_size:
                # Blocks are the parent's to unlink (the resource tracker is shared with
                # spawned workers: nothing leaks if the parent dies).
                out_name = new_name
                blocks.get(out_name, create_size=size)
            _write(blocks.get(out_name), out_layout, out)
            results.send((task_id, out_name, out_layout, None))
        except BaseException as e:  # noqa: BLE001 - reported to the parent with its traceback
            results.send((task_id, None, None, f"{e!r}\n{traceback.format_exc()}"))
        # Replaced blocks are unlinked by the parent; a worker's handle on them goes when
        # it has as many as there are slots.
        if len(blocks.open) > 64:
            for name in list(blocks.open)[:-32]:
                blocks.close(name)


class _Slot:
    """One batch in flight: its input block and output block (reused, grown as needed)."""

    def __init__(self):
        self.in_name: str | None = None
        self.in_size = 0
        self.out_name: str | None = None
        self.out_size = 0


class _Processes:
    """Transforms in spawned worker processes, batches through shared memory (no array is
    pickled): the workers map the loader's slabs and read each batch where it lies (the batch
    is held until its result comes), arrays outside them are copied into a block; the output
    comes back in a block and is copied once into a slab. Each batch in flight has a slot whose
    blocks are reused from batch to batch."""

    def __init__(self, fn: Transform, processes: int, stage: _Stage, pin):
        # Weak, as `_Threads.loader` is.
        self.pin = weakref.WeakMethod(pin)
        try:
            fn_bytes = pickle.dumps(fn)
        except Exception as e:
            raise ValueError(
                f"invalid option transform: transform_processes needs a picklable function "
                f"(defined at a module's top level): {e}"
            ) from e
        ctx = multiprocessing.get_context("spawn")
        self.stage = stage
        # Tasks go on one queue the workers share (a SimpleQueue writes to its pipe on the
        # caller's thread: no feeder thread to contend for the GIL with on every batch), and
        # each worker answers on a pipe of its own, waited on with the workers' sentinels (a
        # worker that dies is seen at once).
        self.tasks = ctx.SimpleQueue()
        self.readers, self.procs = [], []
        for i in range(processes):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker_main, args=(fn_bytes, self.tasks, writer),
                               daemon=True, name=f"shardfeed-transform-{i}")
            proc.start()
            # The worker holds the only writing end: its death reads as the end of the pipe.
            writer.close()
            self.readers.append(reader)
            self.procs.append(proc)
        self.depth = processes + 1
        # Whether the workers can map the loader's slabs (until one says it cannot).
        self.share = True
        self.prefix = f"sf{os.getpid()}x{id(self) & 0xFFFFFF:x}"
        self.blocks = _Blocks()
        self.slots = [_Slot() for _ in range(self.depth + 1)]
        self.free = list(range(len(self.slots)))
        self.next_id = 0
        self.running: dict[int, tuple[int, float]] = {}  # task id -> (slot, started)
        self.done: dict[int, tuple] = {}

    def submit(self, batch: dict, index: int, words: list[int]) -> int:
        task_id = self.next_id
        self.next_id += 1
        slot_id = self.free.pop()
        self.running[task_id] = (slot_id, time.perf_counter(), batch, index, words)
        self._send(task_id)
        return task_id

    def _send(self, task_id: int) -> None:
        """Put task `task_id` on the queue: its batch read in place where it lies in a slab
        the workers can map, the rest copied into its slot's input block."""
        slot_id, _, batch, index, words = self.running[task_id]
        slot = self.slots[slot_id]
        layout, size, slab = _layout(batch, self.share)
        in_name = None
        if size:
            if size > slot.in_size:
                if slot.in_name is not None:
                    self.blocks.close(slot.in_name, unlink=True)
                slot.in_name, slot.in_size = f"{self.prefix}i{task_id}", size
                self.blocks.get(slot.in_name, create_size=size)
            in_name = slot.in_name
            _write(self.blocks.get(in_name), layout, batch)
        if slab is None:
            # Nothing read in place: the batch need not be held.
            self.running[task_id] = (slot_id, self.running[task_id][1], None, index, words)
        self.tasks.put((task_id, index, words, slab, in_name, layout, slot.out_name,
                        slot.out_size, f"{self.prefix}o{task_id}"))

    def _release(self, task_id: int) -> None:
        slot_id = self.running.pop(task_id)[0]
        self.free.append(slot_id)

    def result(self, task_id: int, index: int) -> dict:
        from multiprocessing.connection import wait as wait_for

        while task_id not in self.done:
            # A bounded wait, so that Ctrl-C is seen between waits whatever the platform.
            ready = wait_for(self.readers + [p.sentinel for p in self.procs], timeout=0.1)
            answered = False
            for reader in self.readers:
                if reader in ready:
                    try:
                        got = reader.recv()
                    except (EOFError, OSError):
                        continue  # the worker is gone: its sentinel says so
                    self.done[got[0]] = got
                    answered = True
            dead = [p for p in self.procs if p.sentinel in ready]
            if dead and not answered and task_id not in self.done:
                dead[0].join(timeout=1)
                raise ShardfeedError(
                    f"transform process {dead[0].name} ended (exit code {dead[0].exitcode}) "
                    f"while batch {index} was being transformed"
                )
        _, out_name, layout, error = self.done.pop(task_id)
        if error is not None and error.startswith(_UNMAPPABLE):
            # This worker cannot map the loader's slabs: copy this batch and the next.
            self.share = False
            self._send(task_id)
            return self.result(task_id, index)
        slot = self.slots[self.running[task_id][0]]
        self.stage.ran(time.perf_counter() - self.running[task_id][1])
        if out_name is not None and out_name != slot.out_name:
            # The worker made a larger output block for this slot.
            if slot.out_name is not None:
                self.blocks.close(slot.out_name, unlink=True)
            slot.out_name = out_name
            slot.out_size = self.blocks.get(out_name).size
        self._release(task_id)
        if error is not None:
            raise ShardfeedError(f"transform failed on batch {index} (in a worker process): {error}")
        views = _from_shared(self.blocks.get(out_name), layout)
        pin = self.pin()
        if pin is None:
            raise ShardfeedError(f"the loader was dropped while batch {index} was transformed")
        pinned = pin(views, index, copy=False)
        return pinned if pinned is not views else {k: v.copy() for k, v in views.items()}

    def discard(self, task_id: int, index: int) -> None:
        """Forget a batch submitted and not delivered (waiting for its worker's answer, so
        that its slot and blocks are free again)."""
        try:
            self.result(task_id, index)
        except Exception:
            pass

    def close(self) -> None:
        for _ in self.procs:
            try:
                self.tasks.put(None)
            except Exception:
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.exitcode is None:
                p.kill()
                p.join()
        for slot in self.slots:
            for name in (slot.in_name, slot.out_name):
                if name is not None:
                    self.blocks.close(name, unlink=True)
        # Output blocks a worker made for a batch whose result never came.
        for task_id in list(self.running):
            self.blocks.close(f"{self.prefix}o{task_id}", unlink=True)
        for name in list(self.blocks.open):
            self.blocks.close(name, unlink=True)
        self.tasks.close()
        for reader in self.readers:
            reader.close()
        # The batches held for tasks that never finished go back to the pool.
        self.running.clear()


class _TransformLoader(Loader):
    """A loader whose batches go through a user transform (built by :class:`Loader`)."""

    def _transform_setup(self, fn, threads, processes, seed, rank) -> None:
        self._fn = fn
        self._row_keys = isinstance(fn, _Rows) and fn.row_transform is not None
        self._seed = seed
        self._rank = rank
        workers = processes or threads or DEFAULT_TRANSFORM_THREADS
        self._stage = _Stage(workers)
        self._runner = (_Processes(fn, processes, self._stage, self._pin) if processes
                        else _Threads(fn, workers, self._stage, self))
        self._pending: collections.deque = collections.deque()
        self._exhausted = False
        self._delivered_state = _native.Loader.state_dict(self)
        self._closed = False

    def _pin(self, out: dict, index: int, copy: bool = True) -> dict:
        """`out` copied once into a spare slab of the loader's pool (pinned when the pool is),
        so `torch.from_numpy(...).cuda(non_blocking=True)` stays an asynchronous copy; `out`
        itself when no slab is spare or a slab cannot hold it (counted). Arrays that already
        lie in a slab (the input's columns handed back, or contiguous slices of them) stay
        where they are: an identity transform copies nothing."""
        del copy
        in_slab = {k for k, v in out.items()
                   if isinstance(getattr(v, "base", None), _native.SlabView) and v.flags.c_contiguous}
        items = [(k, np.ascontiguousarray(v)) for k, v in out.items() if k not in in_slab]
        pinned = None
        if not items:
            pinned = out
        elif all(v.dtype.kind in "biuf" for _, v in items):
            try:
                copied = _native.Loader._pin(self, items, index)
                if copied is not None:
                    pinned = {k: out[k] if k in in_slab else copied[k] for k in out}
            except ShardfeedError:
                pinned = None
        with self._stage.lock:
            if pinned is None:
                self._stage.unpinned += 1
            else:
                self._stage.pinned += 1
        return out if pinned is None else pinned

    # Iteration: batches pulled from the native loader ahead of the caller, transformed by
    # the workers, delivered in order.
    def __iter__(self):
        return self

    def __next__(self) -> dict:
        while not self._exhausted and len(self._pending) < self._runner.depth:
            try:
                batch = _native.Loader.__next__(self)
            except StopIteration:
                self._exhausted = True
                self._end_state = _native.Loader._saved(self)
                break
            index = _batch_index(batch)
            if self._row_keys:
                ids = _native.Loader._row_ids(self)
                if ids is not None:
                    n = len(ids)
                    batch["_row_keys"] = np.column_stack([
                        np.full(n, self._seed & (2**64 - 1), np.uint64),
                        np.full(n, self.epoch, np.uint64), ids.astype(np.uint64)])
            state = _native.Loader._saved(self)
            words = rng_words(self._seed, self.epoch, self._rank, index)
            self._pending.append((self._runner.submit(batch, index, words), index, state))
        if not self._pending:
            self._exhausted = False
            self._delivered_state = self._end_state
            raise StopIteration
        handle, index, state = self._pending.popleft()
        waited = time.perf_counter()
        try:
            out = self._runner.result(handle, index)
        except ShardfeedError:
            self._abandon()
            raise
        except Exception as e:
            self._abandon()
            raise ShardfeedError(
                f"transform failed on batch {index}: {e!r}\n{traceback.format_exc()}"
            ) from e
        finally:
            self._stage.waited_s += time.perf_counter() - waited
        self._delivered_state = state
        dropped = out.pop("_filtered", None)
        if dropped is not None:
            with self._stage.lock:
                self._stage.filtered += int(dropped[0])
        return out

    def _abandon(self) -> None:
        """Forget the batches transformed ahead (after an error, a new epoch or a resume)."""
        while self._pending:
            handle, index, _ = self._pending.popleft()
            self._runner.discard(handle, index)
        self._exhausted = False

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: after the last batch delivered to the caller."""
        state = self._delivered_state
        if isinstance(state, _native._SavedState):  # taken as it is per batch, made a dict once
            state = self._delivered_state = state.to_dict()
        return state

    def load_state_dict(self, state, allow_changed: bool = False) -> None:
        self._abandon()
        _native.Loader.load_state_dict(self, state, allow_changed)
        self._delivered_state = _native.Loader.state_dict(self)

    def set_epoch(self, epoch: int) -> None:
        self._abandon()
        _native.Loader.set_epoch(self, epoch)
        self._delivered_state = _native.Loader.state_dict(self)

    def stats(self) -> dict[str, Any]:
        out = _native.Loader.stats(self)
        transform = self._stage.stats()
        out["transform"] = transform
        out.setdefault("stages", {})["transform"] = transform["busy_fraction"]
        # The caller waits on the transform more than on the rest of the pipeline: it is
        # the bottleneck.
        if transform["caller_wait_fraction"] > out.get("wait_fraction", 0.0):
            out["bottleneck"] = "transform"
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._abandon()
            finally:
                self._runner.close()
        _native.Loader.close(self)

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._closed = True
                self._runner.close()
        except Exception:
            pass
