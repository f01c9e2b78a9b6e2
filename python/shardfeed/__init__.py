"""shardfeed: shard datasets into zstd Parquet, then stream them to GPUs.

``Loader`` streams a dataset written by ``shardfeed shard`` (or :func:`shard`)
as batches: ``dict[str, numpy.ndarray]`` whose arrays are zero-copy views of a
pooled slab, page-locked when a CUDA driver is present. Keys are column names
for values, and ``"<column>.offsets"`` (ragged lists, strings, binary),
``"<column>.lengths"`` (lists padded with ``pad_to``) and
``"<column>.validity"`` (nullable columns, 1 where the row has a value).
A projection holding both ``x`` and a column named ``x.offsets``,
``x.lengths`` or ``x.validity`` is refused with a ``ValueError`` (one key
would hide the other): leave one of them out of ``columns``.

    import shardfeed, torch
    loader = shardfeed.Loader("s3://bucket/tokens", batch_size=256,
                              columns=["input_ids"], pad_to=2048, seed=0)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            ids = torch.from_numpy(batch["input_ids"]).cuda(non_blocking=True)

Every array supports DLPack (``torch.from_dlpack``, ``jax.dlpack.from_dlpack``).
A batch's slab returns to the pool when the last array over it is gone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._native import (
    ShardfeedError,
    SlabView,
    __version__,
    commit,
    index,
    inspect,
    shard,
    verify,
)
from .transform import Loader

__all__ = [
    "Loader",
    "ShardfeedError",
    "SlabView",
    "__version__",
    "commit",
    "index",
    "inspect",
    "shard",
    "shard_task",
    "strings",
    "verify",
    "rows",
]


def shard_task(
    inputs: str | list[str],
    output: str,
    task_index: int,
    num_tasks: int,
    **options: Any,
) -> dict[str, Any]:
    """Run task ``task_index`` of ``num_tasks`` of a split shard run.

    As ``shardfeed shard --num-tasks N --task-index I``: shards a deterministic
    part of the inputs and writes a task record; call :func:`commit` once every
    task has finished. ``options`` are :func:`shard`'s. With ``shuffle=True``
    the tasks exchange rows through the output store: ``stage="both"`` (the
    default) needs every task running at once; otherwise run ``"scatter"`` on
    all tasks, then ``"gather"`` on all. Re-running a task is idempotent.
    """
    return shard(inputs, output, task_index=task_index, num_tasks=num_tasks, **options)


def strings(batch: dict[str, np.ndarray], column: str, encoding: str | None = "utf-8") -> list[Any]:
    """Decode a string or binary column of ``batch`` into Python objects.

    Returns ``str`` values (or ``bytes`` when ``encoding`` is None), with
    ``None`` for null rows; for a list of strings or binary (``list<string>``,
    its items in ``<column>.value_offsets``), a list of them per row. This
    copies; the arrays themselves do not.
    """
    values = batch[column]
    if values.dtype != np.uint8:
        raise ShardfeedError(f"`{column}` holds {values.dtype} values, not bytes: "
                             "split it with shardfeed.rows")
    offsets = batch[f"{column}.offsets"].tolist()
    items = batch.get(f"{column}.value_offsets")
    validity = batch.get(f"{column}.validity")
    raw = values.tobytes()

    def decode(a: int, b: int) -> Any:
        chunk = raw[a:b]
        return chunk.decode(encoding) if encoding else chunk

    out: list[Any] = []
    if items is not None:
        items = items.tolist()
    for i in range(len(offsets) - 1):
        if validity is not None and not validity[i]:
            out.append(None)
        elif items is None:
            out.append(decode(offsets[i], offsets[i + 1]))
        else:
            out.append([decode(items[j], items[j + 1]) for j in range(offsets[i], offsets[i + 1])])
    return out


def rows(batch: dict[str, np.ndarray], column: str) -> list[np.ndarray]:
    """Split a ragged list column of ``batch`` into one array per row (views, no copy); for a
    list of strings or binary, a list per row of each item's bytes (``uint8`` views); for a
    list of lists (``list<list<float32>>``), a list per row of each inner list's values."""
    values = batch[column]
    offsets = batch[f"{column}.offsets"].tolist()
    items = batch.get(f"{column}.value_offsets")
    if items is None:
        return [values[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    items = items.tolist()
    return [[values[items[j] : items[j + 1]] for j in range(offsets[i], offsets[i + 1])]
            for i in range(len(offsets) - 1)]
