"""The Python surface: shard/inspect/verify, errors, lifetimes, signals, the GIL, fork."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed
from conftest import KINDS_ROWS, TOKENS_ROWS, kinds_table, make_dataset, tokens_table


def ids(batches):
    return [b["id"].tolist() for b in batches]


def test_shard_inspect_verify_mirror_the_cli(tmp_path):
    table = kinds_table(1000, seed=9)
    pq.write_table(table, tmp_path / "in.parquet")
    summary = shardfeed.shard(
        [str(tmp_path / "in.parquet")],
        str(tmp_path / "ds"),
        shard_size="64KiB",
        row_group_rows=100,
        shuffle=True,
        seed=5,
    )
    assert summary["rows"] == 1000 and summary["shuffled"] and summary["shards"] >= 2
    info = shardfeed.inspect(str(tmp_path / "ds"))
    assert info["rows"] == 1000 and info["shards"] == summary["shards"]
    assert info["row_groups"] == 10
    assert [f["name"] for f in info["schema"]["fields"]] == table.column_names
    report = shardfeed.verify(str(tmp_path / "ds"))
    assert report["ok"] and report["rows"] == 1000 and report["problems"] == []
    # Existing output without overwrite: refused, nothing lost.
    with pytest.raises(FileExistsError, match="ds"):
        shardfeed.shard(str(tmp_path / "in.parquet"), str(tmp_path / "ds"))
    assert shardfeed.verify(str(tmp_path / "ds"))["ok"]
    # A damaged shard is reported, not raised.
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    victim = tmp_path / "ds" / manifest["shards"][0]["path"]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    report = shardfeed.verify(str(tmp_path / "ds"))
    assert not report["ok"]
    assert report["problems"][0]["shard"] == manifest["shards"][0]["path"]


def test_errors_map_to_python_exceptions(tmp_path, kinds_dataset):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        shardfeed.Loader(str(tmp_path / "missing"), 8)
    with pytest.raises(ValueError, match="batch_size"):
        shardfeed.Loader(kinds_dataset, 0)
    with pytest.raises(ValueError, match="no column named `nope`"):
        shardfeed.Loader(kinds_dataset, 8, columns=["id", "nope"])
    with pytest.raises(ValueError, match="rank"):
        shardfeed.Loader(kinds_dataset, 8, rank=4, world_size=4)
    with pytest.raises(ValueError, match="pinning"):
        shardfeed.Loader(kinds_dataset, 8, pinning="sometimes")
    with pytest.raises(ValueError, match="decode_niceness"):
        shardfeed.Loader(kinds_dataset, 8, decode_niceness=20)
    with pytest.raises(ValueError, match="shard_size"):
        shardfeed.shard(kinds_dataset, str(tmp_path / "x"), shard_size="lots")
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        shardfeed.shard(str(tmp_path / "nothing-here.parquet"), str(tmp_path / "x"))
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": 2\n')
    with pytest.raises(shardfeed.ShardfeedError, match=r"bad.jsonl.*line 2"):
        shardfeed.shard(str(tmp_path / "bad.jsonl"), str(tmp_path / "y"))
    assert not (tmp_path / "y" / "manifest.json").exists()
    assert issubclass(shardfeed.ShardfeedError, Exception)


def test_missing_and_corrupt_shards_name_the_shard(tmp_path):
    pq.write_table(kinds_table(600, seed=2), tmp_path / "in.parquet")
    ds = tmp_path / "ds"
    shardfeed.shard(str(tmp_path / "in.parquet"), str(ds), row_group_rows=100, shard_size="32KiB")
    shards = json.loads((ds / "manifest.json").read_text())["shards"]
    first = ds / shards[0]["path"]
    data = bytearray(first.read_bytes())
    data[len(data) // 3] ^= 0x55
    first.write_bytes(bytes(data))
    with pytest.raises(shardfeed.ShardfeedError, match=shards[0]["path"] + ".*row group"):
        for _ in shardfeed.Loader(str(ds), 50, shuffle=False):
            pass
    first.unlink()
    with pytest.raises(FileNotFoundError, match=shards[0]["path"]):
        for _ in shardfeed.Loader(str(ds), 50, shuffle=False):
            pass


def test_len_epochs_and_state(tokens_dataset):
    loader = shardfeed.Loader(tokens_dataset, 100, seed=4)
    assert len(loader) == TOKENS_ROWS // 100
    first = ids(loader)
    assert len(first) == len(loader) and loader.epoch == 1
    second = ids(loader)  # iterating again runs the next epoch
    assert second != first  # a new order (and a different dropped remainder)
    assert len(set(sum(second, []))) == len(loader) * 100
    loader.set_epoch(0)
    assert ids(loader) == first
    state = loader.state_dict()
    assert len(json.dumps(state)) < 1024
    other = shardfeed.Loader(tokens_dataset, 100, seed=5)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_holding_a_batch_past_the_next_is_safe(tokens_dataset):
    loader = shardfeed.Loader(tokens_dataset, 64, seed=0, prefetch=1, columns=["id", "tokens"])
    it = iter(loader)
    first = next(it)
    kept = first["tokens"]  # only one array of the batch survives
    snapshot = kept.copy()
    offsets = first["tokens.offsets"].copy()
    del first
    for _ in range(30):
        next(it)
    assert (kept == snapshot).all(), "a held array was overwritten by a later batch"
    assert offsets[-1] == len(kept)


def test_holding_every_slab_raises_a_clear_error(tokens_dataset):
    loader = shardfeed.Loader(tokens_dataset, 64, seed=0, prefetch=2)
    it = iter(loader)
    held = []
    with pytest.raises(shardfeed.ShardfeedError, match="slabs of the pool are held"):
        for _ in range(len(loader)):
            held.append(next(it))
    slabs = loader.stats()["slabs"]
    assert len(held) == slabs
    # Let go: the pass continues where it was.
    last = held[-1]["id"].base.batch_index
    held.clear()
    assert next(it)["id"].base.batch_index == last + 1


def test_close_and_context_manager(tokens_dataset):
    with shardfeed.Loader(tokens_dataset, 64) as loader:
        batch = next(iter(loader))
    with pytest.raises(shardfeed.ShardfeedError, match="closed"):
        next(iter(loader))
    assert batch["id"].shape == (64,)  # held batches outlive the loader


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")
def test_ctrl_c_interrupts_a_wait(tokens_dataset, monkeypatch, ctrl_c):
    # The fetch stage blocks until the loader is closed (a failpoint): the
    # first next() waits for sure, whenever the signal comes.
    monkeypatch.setenv("SHARDFEED_FAILPOINTS", "fetch=block")
    loader = shardfeed.Loader(tokens_dataset, 64, seed=0)
    monkeypatch.delenv("SHARDFEED_FAILPOINTS")
    with pytest.raises(KeyboardInterrupt):
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        next(iter(loader))
    # The interrupt ended a wait inside next(), and the loader still closes:
    # the stuck fetch is cancelled and every thread joined.
    assert loader.stats()["wait_ms"] > 0
    loader.close()


@pytest.mark.parametrize("as_list", [False, True])
def test_a_single_rank_jobs_state_resumes_on_three_ranks(tokens_dataset, as_list):
    """A job trained on one rank resumed on three: its one state (as it is, or in a list) is
    every rank's state of that job, so each new rank takes a share of what is left and the
    two runs read every row once (it was refused: "the state has world_size 1 but this
    loader has 3"). One state of a larger job is refused, asking for all its ranks'."""
    seen = []
    with shardfeed.Loader(tokens_dataset, 64, seed=4) as loader:
        it = iter(loader)
        for _ in range(17):
            seen += next(it)["id"].tolist()
        state = loader.state_dict()
    for rank in range(3):
        with shardfeed.Loader(tokens_dataset, 64, seed=4, rank=rank, world_size=3) as loader:
            loader.load_state_dict([state] if as_list else state)
            seen += [i for batch in loader for i in batch["id"].tolist()]
    # Every row once, but the few the three new ranks' shares and batches drop.
    assert len(seen) == len(set(seen))
    assert TOKENS_ROWS - len(seen) < 3 * 64
    with shardfeed.Loader(tokens_dataset, 64, seed=4, rank=0, world_size=2) as loader:
        next(iter(loader))
        one_of_two = loader.state_dict()
    with shardfeed.Loader(tokens_dataset, 64, seed=4, rank=0, world_size=3) as loader:
        with pytest.raises(ValueError, match="all ranks"):
            loader.load_state_dict(one_of_two)


def test_a_state_resumes_under_another_byte_budget(tmp_path):
    """A dataset written in input order gets shuffle windows sized from `byte_budget` (20 row
    groups at 2 MB here, 81 at 8 MB). A job resumed with another budget (or on a machine that
    chose another) continues with the window its state was saved with: the same batches as the
    uninterrupted run, single rank and elastically (it was refused: "the state has window 20
    but this loader has 81"). A budget that cannot hold the saved windows, or a window given
    that differs, is refused naming them."""
    ds = make_dataset(tmp_path, tokens_table(6000), 2, row_group_rows=100, shuffle=False)
    ids = lambda batches: [b["id"].tolist() for b in batches]  # noqa: E731
    with shardfeed.Loader(ds, 32, seed=2, byte_budget="2MB") as small:
        assert small.state_dict()["window"] == 20
        it = iter(small)
        for _ in range(40):
            next(it)
        state = small.state_dict()
        rest = ids(it)
    with shardfeed.Loader(ds, 32, seed=2, byte_budget="8MB") as large:
        assert large.state_dict()["window"] == 81
        large.load_state_dict(state)
        # A forked child rebuilds the loader with the state's window too.
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(write_fd, json.dumps(ids(large)).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as f:
            child = f.read()
        assert os.waitpid(pid, 0)[1] == 0
        assert json.loads(child) == rest
        assert ids(large) == rest
        assert large.state_dict()["window"] == 20
    seen = []
    for rank in range(2):
        with shardfeed.Loader(ds, 32, seed=2, byte_budget="8MB", rank=rank, world_size=2) as r:
            r.load_state_dict([state])
            seen += [i for batch in ids(r) for i in batch]
    assert len(seen) == len(set(seen)) and set(seen) <= {i for b in rest for i in b}
    assert len({i for b in rest for i in b}) - len(seen) < 2 * 32
    with shardfeed.Loader(ds, 32, seed=2, byte_budget="8MB") as large:
        next(iter(large))
        wide = large.state_dict()
    with shardfeed.Loader(ds, 32, seed=2, byte_budget="2MB") as small:
        with pytest.raises(ValueError, match=r"windows of 81 row groups.*byte_budget"):
            small.load_state_dict(wide)
    with shardfeed.Loader(ds, 32, seed=2, byte_budget="8MB", window=30) as given:
        with pytest.raises(ValueError, match="has window 81 but this loader has 30.*window 81"):
            given.load_state_dict(wide)


def test_a_loader_dropped_while_its_threads_log_is_joined(tokens_dataset):
    """A loader let go by Python (no `close()`) while one of its threads logs: the
    second row group's decode blocks until the loader stops (a failpoint), then
    logs a warning, which Python's `logging` takes the GIL to emit. Dropping the
    loader joins its threads without the GIL, or this would never end (it did:
    found with on_error="skip" warnings of damaged row groups). The drop waits
    for the stage's own word that it is blocked (not for time to pass)."""
    import subprocess

    code = f"""
import logging, os, sys, threading
logging.basicConfig(stream=sys.stderr)
blocked = threading.Event()

class Blocked(logging.Handler):
    def emit(self, record):
        if "blocked by a failpoint" in record.getMessage():
            blocked.set()

logging.getLogger().addHandler(Blocked())
os.environ["SHARDFEED_FAILPOINTS"] = "decode=block@1"
import shardfeed
loader = shardfeed.Loader({tokens_dataset!r}, 64, shuffle=False, window=1)
first = next(iter(loader))
# The second row group's decode is under way and blocked: the stop releases it.
assert blocked.wait(100), "the decode stage never reached its failpoint"
del loader
print("dropped", len(first["id"]), flush=True)
"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("dropping the loader did not end: its threads were joined under the GIL")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["dropped", "64"]
    # The decode thread did log while the loader was dropped.
    assert "blocking failpoint was released" in out.stderr


def test_gil_is_released_while_waiting_and_sharding(tmp_path, tokens_dataset):
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    thread = threading.Thread(target=count)
    thread.start()
    try:
        loader = shardfeed.Loader(tokens_dataset, 64, inject_latency_ms=300)
        next(iter(loader))  # at least 2 x 300 ms waiting (manifest, then data)
        waiting_ticks = ticks
        table = pa.concat_tables([kinds_table(3000, seed=s) for s in range(4)])
        pq.write_table(table, tmp_path / "big.parquet")
        before = ticks
        shardfeed.shard(str(tmp_path / "big.parquet"), str(tmp_path / "ds"), shuffle=True, threads=1)
        sharding_ticks = ticks - before
    finally:
        stop.set()
        thread.join()
    assert waiting_ticks > 100, waiting_ticks
    assert sharding_ticks > 10, sharding_ticks


def test_forked_child_uses_its_own_loader(kinds_dataset):
    parent = shardfeed.Loader(kinds_dataset, 100, seed=8)
    it = iter(parent)
    head = [next(it)["id"].tolist() for _ in range(3)]
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: continue the inherited loader, and build a new one
        try:
            rest = [b["id"].tolist() for b in parent]
            fresh = [b["id"].tolist() for b in shardfeed.Loader(kinds_dataset, 100, seed=8)]
            os.write(write_fd, json.dumps({"rest": rest, "fresh": fresh}).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        child = json.loads(f.read())
    _, status = os.waitpid(pid, 0)
    assert status == 0
    rest = [b["id"].tolist() for b in parent]
    assert child["rest"] == rest
    assert child["fresh"] == head + rest
    assert sorted(sum(head + rest, [])) == sorted(set(sum(head + rest, [])))
    assert len(sum(head + rest, [])) == (KINDS_ROWS // 100) * 100


def test_a_state_from_another_dataset_is_refused(tokens_dataset, kinds_dataset):
    loader = shardfeed.Loader(tokens_dataset, 64, seed=0)
    next(iter(loader))
    state = loader.state_dict()
    other = shardfeed.Loader(kinds_dataset, 64, seed=0)
    with pytest.raises(ValueError, match="another dataset"):
        other.load_state_dict(state)
    reseeded = shardfeed.Loader(tokens_dataset, 64, seed=1)
    with pytest.raises(ValueError, match="seed"):
        reseeded.load_state_dict(state)


def test_on_error_skip_leaves_out_a_damaged_row_group(tmp_path, tokens_dataset, caplog):
    caplog.set_level(logging.WARNING)
    import json
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(tokens_dataset, ds)
    shard = ds / json.loads((ds / "manifest.json").read_text())["shards"][0]["path"]
    meta = pq.ParquetFile(shard).metadata
    rows = meta.row_group(1).num_rows
    start = meta.row_group(1).column(0).data_page_offset
    data = bytearray(shard.read_bytes())
    data[start + 8] ^= 0x55
    shard.write_bytes(bytes(data))
    with pytest.raises(shardfeed.ShardfeedError, match="row group 1"):
        for _ in shardfeed.Loader(str(ds), 64, seed=0):
            pass
    loader = shardfeed.Loader(str(ds), 64, seed=0, on_error="skip", max_skipped=1)
    seen = sum(len(b["id"]) for b in loader)
    assert len(loader) * 64 - seen <= rows
    skipped = loader.stats()["skipped"]
    assert [(s["shard"], s["row_group"]) for s in skipped] == [(shard.relative_to(ds).as_posix(), 1)]
    # The skip reached Python's logging as a warning.
    assert any(
        r.levelno == logging.WARNING and "skipping a damaged row group" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    with pytest.raises(ValueError, match="on_error"):
        shardfeed.Loader(str(ds), 64, on_error="ignore")


def test_metrics_text_parses_and_equals_stats(tokens_dataset):
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from shardfeed.metrics import LoaderCollector

    loader = shardfeed.Loader(tokens_dataset, 100, seed=1, rank=0, world_size=1)
    for _ in loader:
        pass
    # The metrics first: the next epoch's decoding runs ahead in the background, so stage
    # latency counts may only have grown by the time stats() is read.
    families = {f.name: f for f in text_string_to_metric_families(loader.metrics_text())}
    stats = loader.stats()
    value = lambda name: families[name].samples[0].value  # noqa: E731
    assert value("shardfeed_rows") == stats["rows"] == len(loader) * 100
    assert value("shardfeed_batches") == stats["batches"]
    assert value("shardfeed_bytes") == stats["bytes"]
    assert families["shardfeed_rows"].samples[0].labels == {"rank": "0"}
    wait = families["shardfeed_wait_seconds"]
    count = [s for s in wait.samples if s.name.endswith("_count")][0].value
    assert count == stats["wait"]["count"] >= stats["batches"]
    buckets = [s.value for s in wait.samples if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets) and buckets[-1] == count
    # Each stage's latency histogram, labelled by stage.
    stage = families["shardfeed_stage_seconds"]
    decode_count = [
        s.value for s in stage.samples if s.name.endswith("_count") and s.labels["stage"] == "decode"
    ]
    assert len(decode_count) == 1 and 0 < decode_count[0] <= stats["stage_latency"]["decode"]["count"]
    # Percentiles and stages in stats().
    w = stats["wait"]
    assert 0 <= w["p50_ms"] <= w["p95_ms"] <= w["p99_ms"] <= w["max_ms"]
    assert set(stats["stages"]) == {"fetch", "decode", "shuffle", "collate"}
    assert stats["bottleneck"] in {"trainer", "fetch", "decode", "shuffle", "collate"}
    # The prometheus_client collector serves the same families.
    registry = prometheus_client.CollectorRegistry()
    registry.register(LoaderCollector(loader))
    exposed = prometheus_client.generate_latest(registry).decode()
    assert f'shardfeed_rows_total{{rank="0"}} {float(stats["rows"])}' in exposed


def test_trace_file_is_written_when_the_loader_closes(tmp_path, tokens_dataset):
    path = tmp_path / "trace.json"
    loader = shardfeed.Loader(tokens_dataset, 100, seed=1, trace=str(path))
    batches = sum(1 for _ in loader)
    loader.close()
    del loader
    import gc

    gc.collect()
    events = json.load(open(path))
    waits = [e for e in events if e.get("ph") == "X" and e["name"] == "wait"]
    assert len(waits) >= batches
    assert {"decode", "collate batch"} <= {e["name"] for e in events if e.get("ph") == "X"}


def test_a_slow_stage_is_named_in_a_logging_warning(tokens_dataset, monkeypatch, caplog):
    # Each row group's decode takes 20 ms longer (a failpoint): the trainer waits on decode.
    monkeypatch.setenv("SHARDFEED_FAILPOINTS", "decode=slow:20")
    caplog.set_level(logging.WARNING)
    loader = shardfeed.Loader(tokens_dataset, 100, seed=0, threads=1, slow_warning=(0.05, 5))
    for _ in loader:
        pass
    warnings = [r for r in caplog.records if r.name.startswith("shardfeed_loader")]
    assert any("the decode stage is the bottleneck" in r.getMessage() for r in warnings), [
        r.getMessage() for r in caplog.records
    ]
    assert loader.stats()["bottleneck"] == "decode"
    # Once per epoch at most, and not at all when turned off.
    assert sum("bottleneck" in r.getMessage() for r in warnings) == 1
    caplog.clear()
    quiet = shardfeed.Loader(tokens_dataset, 100, seed=0, threads=1, slow_warning=None)
    for _ in quiet:
        pass
    assert not [r for r in caplog.records if "bottleneck" in r.getMessage()]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("seed", -1),
        ("batch_size", 2**70),
        ("epoch", -3),
        ("world_size", -2),
        ("threads", -1),
        ("prefetch", 2**64),
        ("decode_niceness", 300),
        ("byte_budget", -5),
        ("pad_id", 2**40),
    ],
)
def test_integer_options_out_of_range_raise_value_error_naming_them(kinds_dataset, option, value):
    options = {"batch_size": 8, option: value}
    with pytest.raises(ValueError, match=f"invalid option {option}"):
        shardfeed.Loader(kinds_dataset, **options)


def test_shard_options_out_of_range_raise_value_error_naming_them(tmp_path):
    pq.write_table(kinds_table(50, seed=2), tmp_path / "in.parquet")
    for option, value in [("seed", -1), ("threads", -2), ("row_group_rows", 2**65)]:
        with pytest.raises(ValueError, match=f"invalid option {option}"):
            shardfeed.shard(str(tmp_path / "in.parquet"), str(tmp_path / "ds"), **{option: value})
    with pytest.raises(ValueError, match="invalid option wait_timeout"):
        shardfeed.shard(
            str(tmp_path / "in.parquet"),
            str(tmp_path / "ds"),
            task_index=0,
            num_tasks=2,
            shuffle=True,
            wait_timeout=float("nan"),
        )
    # A split run's seed without shuffle=True would start the cross-task
    # shuffle and wait for the other tasks: refused at once.
    with pytest.raises(ValueError, match="invalid option seed"):
        shardfeed.shard(
            str(tmp_path / "in.parquet"), str(tmp_path / "ds"), task_index=0, num_tasks=2, seed=7
        )
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_a_column_named_like_another_columns_buffer_is_refused(tmp_path):
    table = pa.table(
        {
            "id": pa.array(range(40), pa.int64()),
            "s": pa.array([f"row {i}" for i in range(40)]),
            "s.offsets": pa.array(range(40), pa.int64()),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    shardfeed.shard(str(tmp_path / "in.parquet"), str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=r"s\.offsets"):
        shardfeed.Loader(str(tmp_path / "ds"), 8)
    batch = next(iter(shardfeed.Loader(str(tmp_path / "ds"), 8, columns=["id", "s.offsets"])))
    assert batch["s.offsets"].tolist() == batch["id"].tolist()
