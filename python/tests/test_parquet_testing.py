"""The files of apache/parquet-testing (vendored in tests/data/parquet-testing) read in place:
every file pyarrow reads is indexed and streamed, its columns of the kinds the loader
collates equal to pyarrow's values, every row once; the malformed files of `bad_data` are
clean errors, never a crash or a panic."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed

ROOT = Path(__file__).resolve().parents[2] / "tests" / "data" / "parquet-testing"
FILES = sorted((ROOT / "data").rglob("*.parquet"))
BAD = sorted((ROOT / "bad_data").glob("*.parquet"))

# Readable by pyarrow, not by shardfeed, and why (each is a clean error naming the file).
NOT_READ = {
    # parquet-rs's footer decoder refuses its Thrift (a list of i16 where i64 is expected).
    "dict-page-offset-zero.parquet": "index",
    # Its pages run past their column chunk: pyarrow reads past the chunk's end anyway.
    "nation.dict-malformed.parquet": "load",
}


def collated(t: pa.DataType) -> bool:
    """Whether the loader collates a column of type `t` (others are left out)."""
    def scalar(t):
        return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_temporal(t))
    if scalar(t) or pa.types.is_string(t) or pa.types.is_binary(t):
        return True
    if pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return True
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return True
    if nested(t):
        v = t.value_type.value_type
        return pa.types.is_integer(v) or pa.types.is_floating(v)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        v = t.value_type
        return pa.types.is_integer(v) or pa.types.is_floating(v)
    return False


def nested(t: pa.DataType) -> bool:
    """A list of lists."""
    def listed(x):
        return pa.types.is_list(x) or pa.types.is_large_list(x)
    return listed(t) and listed(t.value_type)


def reference(column: pa.ChunkedArray) -> list:
    """pyarrow's values as the loader hands them: temporal values as their integers, null
    items inside lists as zeros (a list's validity is the list's)."""
    t = column.type
    if nested(t):
        # A null inner list reads as empty, a null value as zero.
        return [None if r is None else
                [[] if inner is None else [0 if v is None else v for v in inner] for inner in r]
                for r in column.to_pylist()]
    if pa.types.is_decimal(t):
        # The unscaled integer (the loader hands the value's bytes).
        return [None if v is None else int(v.scaleb(t.scale)) for v in column.to_pylist()]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [None if r is None else [0 if v is None else v for v in r] for r in column.to_pylist()]
    if pa.types.is_temporal(t):
        width = pa.int64() if t.bit_width == 64 else pa.int32()
        column = column.cast(width)
    if pa.types.is_float16(t):
        return [None if v is None else float(v) for v in column.to_pylist()]
    return column.to_pylist()


def loaded(batch: dict, name: str, t: pa.DataType) -> list:
    valid = batch.get(f"{name}.validity")
    if pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        raw = [bytes(r) for r in batch[name]]
        if pa.types.is_decimal(t):
            raw = [int.from_bytes(r, "little", signed=True) for r in raw]
        return raw if valid is None else [r if v else None for r, v in zip(raw, valid.tolist())]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return shardfeed.strings(batch, name)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return shardfeed.strings(batch, name, encoding=None)
    if nested(t):
        rows = [[inner.tolist() for inner in r] for r in shardfeed.rows(batch, name)]
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        rows = [r.tolist() for r in shardfeed.rows(batch, name)]
    else:
        rows = batch[name].tolist()
    if valid is None:
        return rows
    return [r if v else None for r, v in zip(rows, valid.tolist())]


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_the_vendored_files_are_there():
    assert len(FILES) >= 50 and len(BAD) >= 5


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT / "data")))
def test_every_readable_file_streams_pyarrows_values(path, tmp_path):
    try:
        table = pq.read_table(path)
    except Exception:
        pytest.skip("pyarrow does not read it")
    index = str(tmp_path / "index")
    if NOT_READ.get(path.name) == "index":
        with pytest.raises(shardfeed.ShardfeedError, match=path.name):
            shardfeed.index(str(path), index)
        return
    summary = shardfeed.index(str(path), index)
    assert summary["rows"] == table.num_rows
    if table.num_rows == 0:
        return
    names = [f.name for f in table.schema if collated(f.type)]
    if not names:
        return
    loader_args = dict(columns=names, shuffle=False, drop_last=False)
    if NOT_READ.get(path.name) == "load":
        with pytest.raises(shardfeed.ShardfeedError, match=path.name):
            for _ in shardfeed.Loader(index, 7, **loader_args):
                pass
        return
    got = {name: [] for name in names}
    with shardfeed.Loader(index, 7, **loader_args) as loader:
        for batch in loader:
            for name in names:
                got[name].extend(loaded(batch, name, table.schema.field(name).type))
    physical = {c.name: c.physical_type for c in pq.ParquetFile(path).schema}
    for name in names:
        expected = reference(table.column(name))
        assert len(got[name]) == len(expected) == table.num_rows, name
        if physical.get(name) == "INT96":
            # INT96 timestamps out of the nanosecond range (years 1677 to 2262) wrap
            # differently in every reader: compared (in microseconds) where they fit.
            us = pq.read_table(path, columns=[name], coerce_int96_timestamp_unit="us")
            us = us.column(name).cast(pa.int64()).to_pylist()
            fits = [i for i, v in enumerate(us) if v is None or abs(v) < 2**63 // 1000]
            assert [got[name][i] for i in fits] == [None if us[i] is None else us[i] * 1000 for i in fits]
            continue
        # In file order without shuffling: row for row.
        assert same(got[name], expected), name
    # Shuffled, at world size 3: every row once (a column's values as a multiset, with the
    # padding rows accounted for).
    first = next((n for n in names if physical.get(n) != "INT96"), None)
    if first is None:
        return
    seen = []
    for rank in range(3):
        with shardfeed.Loader(index, 3, columns=[first], seed=1, rank=rank, world_size=3,
                              drop_last=False) as loader:
            for batch in loader:
                seen.extend(loaded(batch, first, table.schema.field(first).type))
    per_rank = -(-table.num_rows // 3)
    assert len(seen) == per_rank * 3
    key = repr
    expected = sorted(map(key, reference(table.column(first))))
    counted = sorted(map(key, seen))
    extra = list(counted)
    for v in expected:
        extra.remove(v)
    assert len(extra) == per_rank * 3 - table.num_rows


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_malformed_files_are_clean_errors(path, tmp_path):
    """Each is refused by `index` or by the loader with an error (never a panic): or, where
    the damage is in bytes the loader does not need, read."""
    index = str(tmp_path / "index")
    try:
        shardfeed.index(str(path), index)
    except (shardfeed.ShardfeedError, ValueError, OSError) as e:
        assert path.name in str(e)
        return
    try:
        with shardfeed.Loader(index, 5, shuffle=False, drop_last=False, on_error="fail") as loader:
            for _ in loader:
                pass
    except (shardfeed.ShardfeedError, ValueError, OSError):
        pass
