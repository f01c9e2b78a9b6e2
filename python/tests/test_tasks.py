"""Split shard runs from Python: shard_task + commit, locally and on Ray."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed
from conftest import kinds_table, shard_tables

TASKS = 4


def write_inputs(root: Path) -> list[str]:
    table = kinds_table(4000, seed=21)
    pq.write_table(table.slice(0, 3000), root / "big.parquet", row_group_size=250)
    pq.write_table(table.slice(3000), root / "small.parquet", row_group_size=1000)
    return [str(root / "big.parquet"), str(root / "small.parquet")]


def test_shard_task_and_commit(tmp_path):
    inputs = write_inputs(tmp_path)
    out = str(tmp_path / "ds")
    for i in (0, 2, 3):
        shardfeed.shard_task(inputs, out, i, TASKS, row_group_rows=200)
    with pytest.raises(shardfeed.ShardfeedError, match="task 1"):
        shardfeed.commit(out)
    summary = shardfeed.shard_task(inputs, out, 1, TASKS, row_group_rows=200)
    assert summary["rows"] > 0
    assert shardfeed.commit(out)["rows"] == 4000
    assert shardfeed.verify(out)["ok"]
    ids = sorted(shard_tables(out).column("id").to_pylist())
    assert ids == list(range(4000))


def test_ray_job_with_four_tasks_matches_a_single_run(tmp_path):
    ray = pytest.importorskip("ray")
    inputs = write_inputs(tmp_path)
    single = str(tmp_path / "single")
    shardfeed.shard(inputs, single, row_group_rows=200)
    out = str(tmp_path / "ray")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote
        def task(index: int) -> int:
            import shardfeed

            return shardfeed.shard_task(inputs, out, index, TASKS, row_group_rows=200, threads=1)["rows"]

        rows = ray.get([task.remote(i) for i in range(TASKS)])
    finally:
        ray.shutdown()
    assert sum(rows) == 4000 and all(r > 0 for r in rows), rows
    shardfeed.commit(out)
    assert shardfeed.verify(out)["ok"]
    a, b = shard_tables(single), shard_tables(out)
    key = lambda t: sorted(zip(t.column("id").to_pylist(), t.column("f32").to_pylist()))
    assert key(a) == key(b)
    assert a.sort_by("id").equals(b.sort_by("id"))
