"""Split shard runs from Python: shard_task + commit, locally and on Ray."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed
from conftest import kinds_table, s3_client, shard_tables

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


@pytest.mark.parametrize("where", ["local", "s3"])
def test_ray_job_with_four_tasks(tmp_path, where, request):
    """4 Ray tasks, plain and with the global shuffle, against a single-process run."""
    ray = pytest.importorskip("ray")
    inputs = write_inputs(tmp_path)
    single = str(tmp_path / "single")
    shardfeed.shard(inputs, single, row_group_rows=200)
    expected = shard_tables(single).sort_by("id")
    options = request.getfixturevalue("moto_s3") if where == "s3" else None
    base = "s3://test-bucket/" + tmp_path.name if where == "s3" else str(tmp_path)

    # num_cpus=4: the shuffled tasks wait for each other's scatter, so all run at once.
    ray.init(num_cpus=TASKS, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote
        def task(index: int, out: str, shuffle: bool) -> int:
            import shardfeed

            summary = shardfeed.shard_task(
                inputs, out, index, TASKS, row_group_rows=200, threads=1, shuffle=shuffle,
                seed=1, storage_options=options,
            )
            return summary["rows"]

        results = {}
        for shuffle in (False, True):
            out = f"{base}/ray-{'shuffled' if shuffle else 'plain'}"
            rows = ray.get([task.remote(i, out, shuffle) for i in range(TASKS)])
            assert sum(rows) == 4000 and all(r > 0 for r in rows), rows
            results[shuffle] = out
    finally:
        ray.shutdown()

    for shuffle, out in results.items():
        assert shardfeed.commit(out, storage_options=options)["rows"] == 4000
        assert shardfeed.verify(out, storage_options=options)["ok"]
        ids = [
            b["id"].tolist()
            for b in shardfeed.Loader(out, 4000, shuffle=False, columns=["id"], storage_options=options)
        ][0]
        assert sorted(ids) == list(range(4000))
        if shuffle:
            # One permutation: no long run of consecutive input ids survives.
            runs = sum(1 for a, b in zip(ids, ids[1:]) if b == a + 1)
            assert runs < 40, runs
        if where == "local":
            got = shard_tables(out).sort_by("id")
            assert got.equals(expected)
            if shuffle:
                # Every shard mixes rows of both inputs (big: ids < 3000, small: the rest).
                import json as _json

                manifest = _json.loads((Path(out) / "manifest.json").read_text())
                assert len(manifest["shards"]) >= TASKS
                for entry in manifest["shards"]:
                    shard_ids = pq.read_table(Path(out) / entry["path"], columns=["id"]).column("id")
                    sources = {i >= 3000 for i in shard_ids.to_pylist()}
                    assert sources == {False, True}, entry["path"]


def test_shard_to_a_flaky_store_uploads_again(tmp_path, moto_s3):
    """A 503 on the dataset's lock and a lock whose reply is cut short after it landed, a 503 on
    a shard's part, a reset before its upload completes, a completion whose reply is cut short
    after it landed (its abort then says NoSuchUpload), and a 503 on the manifest: the dataset
    is whole, every row once (the first of them failed the run before)."""
    from fault_proxy import Fault, FaultProxy

    inputs = write_inputs(tmp_path)
    proxy = FaultProxy.before(
        moto_s3,
        [
            Fault("PUT", "_shardfeed.lock", "503"),
            Fault("PUT", "_shardfeed.lock", "cut"),
            Fault("PUT", "partNumber=", "503"),
            Fault("POST", "uploadId=", "reset"),
            Fault("POST", "uploadId=", "cut"),
            Fault("PUT", "manifest.json", "503"),
        ],
    )
    out = "s3://test-bucket/" + tmp_path.name + "/flaky"
    try:
        flaky = proxy.options(moto_s3)
        summary = shardfeed.shard(inputs, out, row_group_rows=200, storage_options=flaky)
        injected = sorted(a for _, _, a in proxy.injected)
        assert injected == ["503", "503", "503", "cut", "cut", "reset"], proxy.injected
    finally:
        proxy.close()
    assert summary["rows"] == 4000
    assert shardfeed.verify(out, storage_options=moto_s3)["ok"]
    ids = []
    with shardfeed.Loader(out, 128, drop_last=False, storage_options=moto_s3) as loader:
        for batch in loader:
            ids.extend(batch["id"].tolist())
    assert sorted(ids) == list(range(4000))


def test_remote_inputs_and_verify_survive_a_flaky_store(tmp_path, moto_s3):
    """`shard` of S3 inputs and `verify` of an S3 dataset through a store that answers 503,
    resets a listing and cuts bodies short: retried (a download again, verify's stream from
    where it broke); every row once (each failed on its first fault before)."""
    from fault_proxy import Fault, FaultProxy

    inputs = write_inputs(tmp_path)
    s3 = s3_client(moto_s3)
    raw = f"{tmp_path.name}/raw"
    for path in inputs:
        s3.upload_file(path, "test-bucket", f"{raw}/{Path(path).name}")
    proxy = FaultProxy.before(
        moto_s3,
        [
            Fault("GET", "list-type", "reset"),
            Fault("GET", "raw/big.parquet", "503"),
            Fault("GET", "raw/small.parquet", "cut"),
            Fault("GET", "remote/shards/", "cut", times=2),
            Fault("GET", "remote/shards/", "503"),
        ],
    )
    out = f"s3://test-bucket/{tmp_path.name}/remote"
    local = str(tmp_path / "from-s3")
    try:
        flaky = proxy.options(moto_s3)
        shardfeed.shard(f"s3://test-bucket/{raw}", local, row_group_rows=200, storage_options=flaky)
        shardfeed.shard(local, out, storage_options=moto_s3)
        report = shardfeed.verify(out, storage_options=flaky)
        assert sorted(a for _, _, a in proxy.injected) == ["503", "503", "cut", "cut", "cut", "reset"], proxy.injected
    finally:
        proxy.close()
    assert report["ok"] and report["rows"] == 4000, report
    assert sorted(shard_tables(local).column("id").to_pylist()) == list(range(4000))
