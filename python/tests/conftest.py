"""Datasets the Python tests share: written with pyarrow, sharded with shardfeed."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed

KINDS_ROWS = 3000
TOKENS_ROWS = 4096


def kinds_table(rows: int, seed: int = 0) -> pa.Table:
    """Every column kind the loader collates, with nulls where a column allows them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, rows)
    tokens = [rng.integers(0, 50_000, n, dtype=np.int32).tolist() for n in lengths]
    maybe = [None if i % 11 == 3 else int(v) for i, v in enumerate(rng.integers(-1000, 1000, rows))]
    words = [None if i % 7 == 2 else f"row-{i}-" + "x" * (i % 13) for i in range(rows)]
    blobs = [bytes(rng.integers(0, 256, i % 29, dtype=np.uint8)) for i in range(rows)]
    vecs = rng.random((rows, 4), dtype=np.float32)
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("f32", pa.float32(), nullable=False),
            pa.field("f64", pa.float64()),
            pa.field("maybe_i32", pa.int32()),
            pa.field("flag", pa.bool_()),
            pa.field("u16", pa.uint16()),
            pa.field("tokens", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
            pa.field("vec", pa.list_(pa.field("item", pa.float32(), nullable=False), 4), nullable=False),
            pa.field("text", pa.string()),
            pa.field("blob", pa.binary(), nullable=False),
        ]
    )
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "f32": pa.array(rng.random(rows, dtype=np.float32)),
            "f64": pa.array(rng.random(rows)),
            "maybe_i32": pa.array(maybe, type=pa.int32()),
            "flag": pa.array([bool(i % 3) for i in range(rows)]),
            "u16": pa.array(rng.integers(0, 65535, rows, dtype=np.uint16)),
            "tokens": pa.array(tokens, type=schema.field("tokens").type),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), 4),
            "text": pa.array(words, type=pa.string()),
            "blob": pa.array(blobs, type=pa.binary()),
        },
        schema=schema,
    )


def tokens_table(rows: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 64, rows)
    tokens = [rng.integers(0, 32_000, n, dtype=np.int32) for n in lengths]
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "label": pa.array(rng.integers(0, 2, rows).astype(np.float32)),
            "features": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(rows * 8, dtype=np.float32)), 8
            ),
            "tokens": pa.array([t.tolist() for t in tokens], type=pa.list_(pa.int32())),
        }
    )


def make_dataset(root: Path, table: pa.Table, files: int, **options) -> str:
    raw = root / "raw"
    raw.mkdir(parents=True)
    step = -(-table.num_rows // files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), raw / f"part-{i}.parquet", compression="snappy")
    out = root / "dataset"
    shardfeed.shard(str(raw), str(out), **options)
    return str(out)


@pytest.fixture
def ctrl_c():
    """Python's own Ctrl-C handler for the test, whatever the process inherited: a process
    started in the background of a shell without job control ignores SIGINT, and a test
    that sends one to end a wait would then wait for ever."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def kinds_dataset(tmp_path_factory) -> str:
    """3000 rows of every column kind, 2 shards, row groups of 250 rows."""
    root = tmp_path_factory.mktemp("kinds")
    return make_dataset(
        root, kinds_table(KINDS_ROWS), 3, row_group_rows=250, shard_size="96KiB"
    )


@pytest.fixture(scope="session")
def tokens_dataset(tmp_path_factory) -> str:
    """4096 rows (id, label, features[8], tokens), row groups of 128 rows."""
    root = tmp_path_factory.mktemp("tokens")
    return make_dataset(root, tokens_table(TOKENS_ROWS), 4, row_group_rows=128, shard_size="256KiB")


def shard_tables(dataset: str) -> pa.Table:
    """What pyarrow reads from the dataset's shard files (not through shardfeed)."""
    import json

    manifest = json.loads(Path(dataset, "manifest.json").read_text())
    return pa.concat_tables(pq.read_table(Path(dataset, s["path"])) for s in manifest["shards"])


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def s3_client(options: dict):
    """A boto3 client of the S3 server `options` (`moto_s3`'s storage options) point at."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=options["aws_endpoint"],
        aws_access_key_id=options["aws_access_key_id"],
        aws_secret_access_key=options["aws_secret_access_key"],
        region_name=options["aws_region"],
    )


@pytest.fixture(scope="session")
def moto_s3():
    """moto's S3 server on a free loopback port, with a bucket; yields storage options."""
    import socket
    import subprocess
    import time

    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        ["moto_server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="test-bucket")
        yield {
            "aws_endpoint": endpoint,
            "aws_allow_http": "true",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "aws_region": "us-east-1",
        }
    finally:
        server.kill()
        server.wait()
