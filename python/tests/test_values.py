"""Values equal pyarrow's reading of the shards; arrays are views of the slab."""

from __future__ import annotations

import numpy as np
import pytest

import shardfeed
from conftest import KINDS_ROWS, rss_bytes, shard_tables


@pytest.fixture(scope="module")
def reference(kinds_dataset):
    table = shard_tables(kinds_dataset)
    assert table.num_rows == KINDS_ROWS
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    index = {row_id: i for i, row_id in enumerate(columns["id"])}
    return columns, index


def check_batch(batch, columns, index, pad_to=None, pad_value=0):
    rows = [index[i] for i in batch["id"].tolist()]
    n = len(rows)
    assert batch["f32"].dtype == np.float32 and batch["f32"].shape == (n,)
    assert batch["f32"].tolist() == [columns["f32"][r] for r in rows]
    assert batch["u16"].dtype == np.uint16
    assert batch["u16"].tolist() == [columns["u16"][r] for r in rows]
    # Nullable columns: a validity mask, values compared where valid.
    for name, dtype in [("f64", np.float64), ("maybe_i32", np.int32), ("flag", np.bool_)]:
        values, valid = batch[name], batch[f"{name}.validity"]
        assert values.dtype == dtype and valid.shape == (n,)
        expected = [columns[name][r] for r in rows]
        assert valid.tolist() == [int(v is not None) for v in expected]
        got = values.tolist()
        assert [g for g, e in zip(got, expected) if e is not None] == [e for e in expected if e is not None]
    # Fixed-size list: dense [batch, 4].
    assert batch["vec"].shape == (n, 4)
    assert batch["vec"].tolist() == [columns["vec"][r] for r in rows]
    # Strings and binary: values + offsets.
    assert shardfeed.strings(batch, "text") == [columns["text"][r] for r in rows]
    assert shardfeed.strings(batch, "blob", encoding=None) == [columns["blob"][r] for r in rows]
    # list<int32>: ragged, or padded with lengths.
    expected = [columns["tokens"][r] for r in rows]
    if pad_to is None:
        assert batch["tokens"].dtype == np.int32
        assert batch["tokens.offsets"].shape == (n + 1,)
        assert [r.tolist() for r in shardfeed.rows(batch, "tokens")] == expected
    else:
        assert batch["tokens"].shape == (n, pad_to)
        assert batch["tokens.lengths"].tolist() == [min(len(e), pad_to) for e in expected]
        for row, e in zip(batch["tokens"].tolist(), expected):
            kept = e[:pad_to]
            assert row == kept + [pad_value] * (pad_to - len(kept))
    return rows


@pytest.mark.parametrize("pad_to,mapped_reads", [(None, True), (16, True), (None, False)])
def test_every_column_kind_equals_pyarrow(kinds_dataset, reference, pad_to, mapped_reads):
    """Whether strings, binary and list chunks are read through a mapping
    of the shard (the default) or copied out with pread."""
    columns, index = reference
    seen = []
    with shardfeed.Loader(
        kinds_dataset, 64, seed=3, drop_last=False, pad_to=pad_to, pad_value=-1, mapped_reads=mapped_reads
    ) as loader:
        for batch in loader:
            seen.extend(check_batch(batch, columns, index, pad_to, -1 if pad_to else 0))
        assert (loader.stats()["mapped_bytes"] > 0) == mapped_reads
    assert sorted(seen) == list(range(KINDS_ROWS))


def test_projection_returns_only_those_columns(kinds_dataset, reference):
    columns, index = reference
    loader = shardfeed.Loader(kinds_dataset, 100, columns=["id", "text"], shuffle=False)
    batch = next(iter(loader))
    assert set(batch) == {"id", "text", "text.offsets", "text.validity"}
    ids = batch["id"].tolist()
    # Rows come as stored (shard shuffles them): each id with its own text.
    assert len(set(ids)) == 100
    assert shardfeed.strings(batch, "text") == [columns["text"][index[i]] for i in ids]


def test_arrays_are_views_of_their_slab(kinds_dataset):
    import torch

    loader = shardfeed.Loader(kinds_dataset, 64, seed=0, prefetch=2)
    slabs = set()
    for i, batch in enumerate(loader):
        owners = {id(a.base) for a in batch.values()}
        for name, array in batch.items():
            view = array.base
            assert isinstance(view, shardfeed.SlabView), name
            start = view.slab_address
            assert start <= array.ctypes.data
            assert array.ctypes.data + array.nbytes <= start + view.slab_bytes, name
            assert array.flags.writeable and not array.flags.owndata
            slabs.add(start)
        assert len({a.base.slab_address for a in batch.values()}) == 1
        assert len(owners) == len(batch)
        # DLPack: torch shares the memory.
        assert torch.from_dlpack(batch["f32"]).data_ptr() == batch["f32"].ctypes.data
        if i == 20:
            break
    # The pool is fixed: 21 batches cycled through a handful of slabs.
    assert len(slabs) <= loader.stats()["slabs"]


def test_jax_takes_arrays_through_dlpack(kinds_dataset):
    jax = pytest.importorskip("jax")
    batch = next(iter(shardfeed.Loader(kinds_dataset, 32, seed=1)))
    x = jax.dlpack.from_dlpack(batch["vec"])
    assert x.shape == (32, 4)
    np.testing.assert_array_equal(np.asarray(x), batch["vec"])


def test_rss_stays_flat_over_1000_batches(tokens_dataset):
    loader = shardfeed.Loader(tokens_dataset, 32, seed=0, pad_to=64)
    it = iter(loader)
    total = 0

    def pull(n):
        nonlocal total
        for _ in range(n):
            try:
                batch = next(it)
            except StopIteration:  # end of an epoch: the next one starts
                batch = next(it)
            assert batch["tokens"].shape == (32, 64)
            total += int(batch["tokens.lengths"].sum())

    pull(200)
    warm = rss_bytes()
    pull(800)
    grown = rss_bytes() - warm
    assert total > 0
    assert grown < 16 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 800 batches"


def test_pyarrow_written_token_lists_take_the_own_decoder(tmp_path):
    """Token lists as pyarrow writes them by default (a nullable list of
    nullable int32, snappy): every row as written, null lists empty with
    validity 0, and every list chunk decoded by the own list decoder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    rows = []
    for i in range(5000):
        if i % 97 == 3:
            rows.append(None)
        else:
            rows.append(rng.integers(0, 50_000, int(rng.integers(0, 60)), dtype=np.int32).tolist())
    table = pa.table({"id": pa.array(range(5000), pa.int64()), "ids": pa.array(rows, pa.list_(pa.int32()))})
    assert table.schema.field("ids").nullable and table.schema.field("ids").type.value_field.nullable
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=1000)
    out = str(tmp_path / "ds")
    shardfeed.shard([str(tmp_path / "in.parquet")], out, row_group_rows=500)
    seen = {}
    with shardfeed.Loader(out, 128, seed=1, drop_last=False) as loader:
        for batch in loader:
            ids = batch["id"].tolist()
            got = [r.tolist() for r in shardfeed.rows(batch, "ids")]
            valid = batch["ids.validity"].tolist() if "ids.validity" in batch else [1] * len(ids)
            for i, g, v in zip(ids, got, valid):
                seen[i] = None if not v else g
        paths = loader.stats()["decode_paths"]
    assert seen == {i: r for i, r in enumerate(rows)}
    assert paths["parquet"] == 0 and paths["own_list"] > 0, paths


def test_polars_written_token_lists_take_the_own_decoder(tmp_path):
    """Token lists as polars writes them (`large_list`, int32 and int64
    items): every row as written, and no list chunk through parquet's
    reader."""
    import polars as pl

    rng = np.random.default_rng(5)
    lists32 = [rng.integers(0, 50_000, int(rng.integers(0, 40))).tolist() for _ in range(3000)]
    lists64 = [[v * 3_000_000_000 for v in row] for row in lists32]
    df = pl.DataFrame(
        {
            "id": pl.Series(range(3000), dtype=pl.Int64),
            "ids32": pl.Series(lists32, dtype=pl.List(pl.Int32)),
            "ids64": pl.Series(lists64, dtype=pl.List(pl.Int64)),
        }
    )
    df.write_parquet(tmp_path / "in.parquet", row_group_size=1000)
    out = str(tmp_path / "ds")
    shardfeed.shard([str(tmp_path / "in.parquet")], out, row_group_rows=500)
    seen = {}
    with shardfeed.Loader(out, 100, seed=2, drop_last=False) as loader:
        for batch in loader:
            rows32 = [r.tolist() for r in shardfeed.rows(batch, "ids32")]
            rows64 = [r.tolist() for r in shardfeed.rows(batch, "ids64")]
            for i, a, b in zip(batch["id"].tolist(), rows32, rows64):
                seen[i] = (a, b)
        paths = loader.stats()["decode_paths"]
    assert seen == {i: (a, b) for i, (a, b) in enumerate(zip(lists32, lists64))}
    assert paths["parquet"] == 0 and paths["own_list"] > 0, paths
