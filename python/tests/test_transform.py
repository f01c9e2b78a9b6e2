"""User transforms in the loader (`Loader(..., transform=fn)`): the same batches for any
number of threads or processes, after a resume and an elastic resume; randomness that differs
across batches and epochs; errors, dead workers and wrong outputs as clear errors, with no
shared memory left behind."""

from __future__ import annotations

import gc
import os
import signal
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

import shardfeed
from shardfeed.transform import _batch_index

ROWS = 3000


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("transform")
    raw = root / "raw"
    raw.mkdir()
    ids = np.arange(ROWS, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": (ids % 97).astype(np.float32)}), raw / "a.parquet",
                   row_group_size=250)
    out = str(root / "ds")
    shardfeed.shard(str(raw), out, row_group_rows=250)
    return out


# Module-level functions: worker processes import them by name.
def augment(batch, rng):
    """A random per-row scale and an id kept to check the rows."""
    return {"id": batch["id"].copy(), "y": batch["x"] * rng.uniform(0.5, 1.5, len(batch["x"]))}


def fails_on_one_row(batch, rng):
    if 1234 in batch["id"]:
        raise ZeroDivisionError("boom in the transform")
    return {"id": batch["id"].copy()}


def keep_all(row):
    return True


def same_row(row, rng):
    return row


def kills_itself(batch, rng):
    if 1234 in batch["id"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"id": batch["id"].copy()}


def where_read(batch, rng):
    """The ids, and whether the batch was read where it lies (a mapping of one of the loader's
    slabs, a memfd) rather than from a copy (a block in /dev/shm)."""
    address, mapping = batch["id"].ctypes.data, ""
    for line in open("/proc/self/maps"):
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= address < hi:
            mapping = " ".join(fields[5:])
    return {"id": batch["id"].copy(),
            "in_place": np.array(["memfd:shardfeed-slab" in mapping])}


# Set by a test (inherited by the workers it spawns, which import this module to load its
# functions): workers cannot map the loader's slabs, as where /proc/<pid>/fd is closed to them.
if os.environ.get("SHARDFEED_TEST_NO_SLAB_MAPS"):
    def _refuse(self, shared):
        raise PermissionError("mapping refused by the test")

    shardfeed.transform._Slabs.get = _refuse


def wrong_output(batch, rng):
    return [batch["id"]]


def object_output(batch, rng):
    return {"id": np.array([object()] * 3)}


def epoch(loader) -> list[dict]:
    return [{k: v.copy() for k, v in b.items()} for b in loader]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


def shm_left() -> list[str]:
    return [p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(f"sf{os.getpid()}x")]


def test_the_same_batches_for_any_threads_or_processes(dataset):
    runs = {}
    for name, options in [("threads=1", dict(transform_threads=1)), ("threads=2", dict(transform_threads=2)),
                          ("threads=4", dict(transform_threads=4)), ("processes=2", dict(transform_processes=2))]:
        with shardfeed.Loader(dataset, 64, seed=3, transform=augment, **options) as loader:
            runs[name] = epoch(loader)
            assert loader.stats()["transform"]["batches"] >= len(runs[name])
    first = runs["threads=1"]
    assert len(first) == ROWS // 64
    for name, batches in runs.items():
        assert same(batches, first), name
    # Every row once; the transform's randomness differs from row to row and batch to batch.
    ids = np.concatenate([b["id"] for b in first])
    assert len(np.unique(ids)) == len(ids) == ROWS // 64 * 64
    ratios = np.concatenate([b["y"] / np.maximum((b["id"] % 97), 1) for b in first])
    assert len(np.unique(np.round(ratios, 6))) > len(ratios) // 2
    assert shm_left() == []


def test_randomness_differs_across_epochs_and_repeats_for_the_same_epoch(dataset):
    loader = shardfeed.Loader(dataset, 64, seed=3, shuffle=False, transform=augment)
    zero, one = epoch(loader), epoch(loader)
    assert [b["id"].tolist() for b in zero] == [b["id"].tolist() for b in one]
    assert not np.allclose(zero[0]["y"], one[0]["y"])
    loader.set_epoch(0)
    assert same(epoch(loader), zero)
    loader.close()


@pytest.mark.parametrize("mode", [dict(transform_threads=2), dict(transform_processes=2)])
def test_resume_mid_epoch_gives_the_same_batches(dataset, mode):
    with shardfeed.Loader(dataset, 64, seed=5, transform=augment, **mode) as loader:
        whole = epoch(loader)
    loader = shardfeed.Loader(dataset, 64, seed=5, transform=augment, **mode)
    it = iter(loader)
    head = [{k: v.copy() for k, v in next(it).items()} for _ in range(11)]
    state = loader.state_dict()
    loader.close()
    resumed = shardfeed.Loader(dataset, 64, seed=5, transform=augment, **mode)
    resumed.load_state_dict(state)
    rest = epoch(resumed)
    resumed.close()
    assert same(head + rest, whole)
    assert shm_left() == []


def test_elastic_resume_2_to_3_reads_every_row_once(dataset):
    seen, states = [], []
    for rank in range(2):
        loader = shardfeed.Loader(dataset, 50, seed=2, rank=rank, world_size=2, transform=augment)
        it = iter(loader)
        seen += [i for _ in range(6) for i in next(it)["id"].tolist()]
        states.append(loader.state_dict())
        loader.close()
    for rank in range(3):
        with shardfeed.Loader(dataset, 50, seed=2, rank=rank, world_size=3, transform=augment) as loader:
            loader.load_state_dict(states)
            seen += [i for b in loader for i in b["id"].tolist()]
    assert sorted(seen) == list(range(ROWS))


@pytest.mark.parametrize("mode", [dict(transform_threads=2), dict(transform_processes=2)])
def test_an_exception_names_the_batch_with_its_traceback(dataset, mode):
    loader = shardfeed.Loader(dataset, 64, seed=1, transform=fails_on_one_row, **mode)
    with pytest.raises(shardfeed.ShardfeedError, match=r"batch \d+") as err:
        for _ in loader:
            pass
    assert "ZeroDivisionError" in str(err.value) and "boom in the transform" in str(err.value)
    assert "fails_on_one_row" in str(err.value)  # the traceback
    loader.close()
    assert shm_left() == []


@pytest.mark.parametrize("mode", [dict(transform_threads=2), dict(transform_processes=2)])
def test_a_loader_dropped_without_close_is_freed_at_once(dataset, mode):
    """Its last reference gone, the loader is freed there (threads joined, workers ended,
    shared memory unlinked), not at the next garbage collection: nothing of the transform
    stage refers back to it."""
    loader = shardfeed.Loader(dataset, 64, seed=1, transform=augment, **mode)
    it = iter(loader)
    for _ in range(3):
        next(it)
    runner = loader._runner
    threads = list(getattr(getattr(runner, "pool", None), "_threads", ()))
    procs = list(getattr(runner, "procs", ()))
    assert threads or procs
    # The batches transformed ahead are done (a run in progress holds the loader until it
    # returns: the next test drops it then).
    for handle, _, _ in list(loader._pending):
        if hasattr(handle, "exception"):
            handle.exception()
    gone = weakref.ref(loader)
    gc.disable()
    try:
        del it, loader
        assert gone() is None
    finally:
        gc.enable()
    assert not any(t.is_alive() for t in threads)
    assert all(p.exitcode is not None for p in procs)
    assert shm_left() == []


def test_a_loader_dropped_while_its_transform_runs_is_freed_when_the_run_returns(dataset):
    """The last reference then goes on a transform thread, which closes the loader without
    waiting for itself."""
    started, release, freed = threading.Event(), threading.Event(), threading.Event()

    def blocks(batch, rng):
        if _batch_index(batch) == 2:
            started.set()
            release.wait()
        return batch

    loader = shardfeed.Loader(dataset, 64, seed=1, transform=blocks, transform_threads=2)
    threads = list(loader._runner.pool._threads)
    it = iter(loader)
    next(it)
    assert started.wait(60)
    weakref.finalize(loader, freed.set)
    gc.disable()
    try:
        del it, loader
        assert not freed.is_set()
        release.set()
        assert freed.wait(60)
    finally:
        gc.enable()
    for t in threads:
        t.join(60)
        assert not t.is_alive()


def test_a_worker_killed_is_an_error_naming_the_batch(dataset):
    loader = shardfeed.Loader(dataset, 64, seed=1, transform=kills_itself, transform_processes=2)
    with pytest.raises(shardfeed.ShardfeedError, match=r"ended \(exit code -9\) while batch \d+"):
        for _ in loader:
            pass
    loader.close()
    assert shm_left() == []


@pytest.mark.parametrize("fn,says", [(wrong_output, "returned list"), (object_output, "dtype object")])
@pytest.mark.parametrize("mode", [dict(transform_threads=1), dict(transform_processes=1)])
def test_wrong_outputs_are_clear_errors(dataset, fn, says, mode):
    loader = shardfeed.Loader(dataset, 64, transform=fn, **mode)
    with pytest.raises(shardfeed.ShardfeedError, match=says):
        next(iter(loader))
    loader.close()
    assert shm_left() == []


def test_options_are_checked(dataset):
    with pytest.raises(ValueError, match="transform_threads"):
        shardfeed.Loader(dataset, 64, transform_threads=2)
    with pytest.raises(ValueError, match="not both"):
        shardfeed.Loader(dataset, 64, transform=augment, transform_threads=1, transform_processes=1)
    with pytest.raises(ValueError, match="picklable"):
        shardfeed.Loader(dataset, 64, transform=lambda b, r: b, transform_processes=1)
    with pytest.raises(ValueError, match="shardfeed.Loader"):
        shardfeed._native.Loader(dataset, 64, transform=augment)
    # Without a transform, the loader is the native one.
    assert type(shardfeed.Loader(dataset, 64)) is shardfeed.Loader


def test_stats_have_the_transform_stage(dataset):
    import time

    def slow(batch, rng):
        time.sleep(0.01)
        return batch

    with shardfeed.Loader(dataset, 64, transform=slow, transform_threads=1) as loader:
        batches = len(epoch(loader))
        stats = loader.stats()
    transform = stats["transform"]
    assert transform["batches"] == batches and transform["workers"] == 1
    assert 0 < stats["stages"]["transform"] <= 1
    # Every batch slept 10 ms (a lower bound, whatever the machine's load).
    assert transform["latency_ms"]["p50"] >= 10


def test_the_example_augments_images_and_masks_chat_tokens(tmp_path):
    """python/examples/transforms.py: torchvision's transforms on decoded images (threads),
    a chat template with masked labels on token rows (processes)."""
    import subprocess
    import sys

    pytest.importorskip("torchvision")
    from PIL import Image

    for i in range(40):
        folder = tmp_path / "photos" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (64 + i, 48), (i * 6, 90, 200 - i)).save(folder / f"{i}.jpg", quality=85)
    shardfeed.shard(str(tmp_path / "photos"), str(tmp_path / "img"))
    subprocess.run(["shardfeed", "generate", "tokens", "--rows", "400", "-o", str(tmp_path / "raw")],
                   check=True, capture_output=True)
    shardfeed.shard(str(tmp_path / "raw"), str(tmp_path / "tok"))
    examples = Path(__file__).resolve().parents[1] / "examples"
    # On the path while the example runs: its worker processes import it by name.
    sys.path.insert(0, str(examples))
    try:
        from transforms import IGNORE, main

        out = main(["--images", str(tmp_path / "img"), "--tokens", str(tmp_path / "tok"),
                    "--steps", "3"])
    finally:
        sys.path.remove(str(examples))
    images = out["images"]
    assert images["image"].shape == (32, 3, 96, 96) and images["image"].dtype == np.float32
    assert set(images["label"].tolist()) <= {0, 1}
    tokens = out["tokens"]
    assert tokens["input_ids"].shape == tokens["labels"].shape == (32, 256)
    # The prompt is masked out of the labels; the answer is learned.
    for ids, labels, mask in zip(tokens["input_ids"], tokens["labels"], tokens["attention_mask"]):
        assert ids[0] == 1 and labels[0] == IGNORE and (labels[mask == 1] != IGNORE).any()
    assert shm_left() == []


def test_a_mixtures_batches_go_through_the_transform(dataset, tmp_path):
    """The transform sees the mixture's blended batches (with their `source` column); the
    same for any number of threads; its outputs are pinned like a loader's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = tmp_path / "raw"
    raw.mkdir()
    ids = np.arange(10_000, 11_000, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": np.ones(len(ids), np.float32)}), raw / "b.parquet")
    other = str(tmp_path / "other")
    shardfeed.shard(str(raw), other, row_group_rows=100)

    def tag(batch, rng):
        return {"id": batch["id"].copy(), "source": batch["source"].copy(),
                "r": rng.random(len(batch["id"]))}

    runs = []
    for threads in (1, 3):
        with shardfeed.Loader({dataset: 0.5, other: 0.5}, 32, columns=["id"], seed=4,
                              transform=tag, transform_threads=threads) as mix:
            runs.append([{k: v.copy() for k, v in b.items()} for _, b in zip(range(12), mix)])
    assert same(runs[0], runs[1])
    sources = np.concatenate([b["source"] for b in runs[0]])
    assert set(sources.tolist()) == {0, 1}
    # Outputs land in the mixture's slab pool, as a loader's do.
    with shardfeed.Loader({dataset: 0.5, other: 0.5}, 32, columns=["id"], seed=4,
                          transform=tag) as mix:
        first = next(iter(mix))
        assert isinstance(first["r"].base, shardfeed.SlabView)
        assert mix.stats()["transform"]["pinned_batches"] >= 1
    ids = np.concatenate([b["id"] for b in runs[0]])
    assert ((ids >= 10_000) == (sources == 1)).all()


def keep_even(row):
    return int(row["id"]) % 2 == 0


def jitter_row(row, rng):
    return {"id": np.int64(row["id"]), "y": np.float32(row["x"] * rng.uniform(0.5, 1.5)),
            "ids": np.arange(int(row["id"]) % 5, dtype=np.int32)}


@pytest.mark.parametrize("mode", [dict(transform_threads=1), dict(transform_threads=3),
                                  dict(transform_processes=2)])
def test_filter_and_row_transform(dataset, mode):
    """Rows a filter drops are counted; every rank still gets its batches (smaller ones);
    per-row randomness is the same for any threads or processes."""
    runs = []
    for rank in range(2):
        with shardfeed.Loader(dataset, 64, seed=7, rank=rank, world_size=2, filter=keep_even,
                              row_transform=jitter_row, **mode) as loader:
            batches = epoch(loader)
            assert len(batches) == len(loader) == ROWS // 2 // 64
            assert loader.stats()["transform"]["filtered_rows"] == sum(64 - len(b["id"]) for b in batches)
        runs.append(batches)
    ids = np.concatenate([b["id"] for r in runs for b in r])
    assert (ids % 2 == 0).all() and len(np.unique(ids)) == len(ids)
    assert len(ids) > ROWS // 2 * 0.8
    for b in runs[0]:
        # Ragged per-row arrays come back as values + offsets.
        lengths = np.diff(b["ids.offsets"])
        assert (lengths == b["id"] % 5).all()
    reference = getattr(test_filter_and_row_transform, "reference", None)
    if reference is None:
        test_filter_and_row_transform.reference = runs
    else:
        assert all(same(a, b) for a, b in zip(runs, reference))


def tag_row(row, rng):
    """A row transform returning lists (each tag upper-cased, one more box), a string (None
    for some rows) and bytes ending in a zero byte."""
    i = int(row["id"])
    return {"id": np.int64(i),
            "tags": [t.upper() for t in row["tags"]] if row["tags"] is not None else None,
            "boxes": [*row["boxes"], np.array([rng.uniform()], dtype=np.float32)],
            "title": None if i % 3 == 0 else f"row {i} é",
            "blob": b"\x01\x00" * (i % 4)}


@pytest.mark.parametrize("mode", [dict(transform_threads=2), dict(transform_processes=2)])
def test_rows_with_lists_of_strings_and_of_lists_are_filtered_and_transformed(tmp_path, mode):
    """A filter and a row transform on rows holding a list of strings (with null rows) and a
    list of lists of float32: the lists come back laid out as the loader lays them out
    (values, `.offsets`, `.value_offsets`, `.validity`); strings and bytes the function
    returns as the loader's string columns (bytes + `.offsets`, trailing zero bytes kept)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    n = 600
    tags = [None if i % 7 == 1 else [f"t{i}-{k}" for k in range(i % 3)] for i in range(n)]
    boxes = [[[float(i)] * (k + 1) for k in range(i % 2)] for i in range(n)]
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({
        "id": pa.array(range(n), pa.int64()),
        "tags": pa.array(tags, pa.list_(pa.string())),
        "boxes": pa.array(boxes, pa.list_(pa.list_(pa.float32()))),
    }), tmp_path / "raw" / "a.parquet")
    ds = str(tmp_path / "ds")
    shardfeed.shard(str(tmp_path / "raw"), ds, row_group_rows=100)
    seen = []
    with shardfeed.Loader(ds, 32, seed=1, drop_last=False, filter=keep_even,
                          row_transform=tag_row, **mode) as loader:
        for b in loader:
            texts, rows = shardfeed.strings(b, "tags"), shardfeed.rows(b, "boxes")
            assert b["boxes"].dtype == np.float32
            for k, i in enumerate(b["id"].tolist()):
                assert i % 2 == 0
                want = None if tags[i] is None else [t.upper() for t in tags[i]]
                assert texts[k] == want, i
                got = [x.tolist() for x in rows[k]]
                assert got[:-1] == boxes[i] and len(got[-1]) == 1, i
                assert shardfeed.strings(b, "title")[k] == (None if i % 3 == 0 else f"row {i} é")
                assert shardfeed.strings(b, "blob", encoding=None)[k] == b"\x01\x00" * (i % 4)
                seen.append(i)
    assert sorted(seen) == list(range(0, n, 2))


@pytest.mark.parametrize("mode", [dict(transform_threads=1), dict(transform_processes=2)])
def test_rows_handed_back_unchanged_collate_as_the_loader_does(tmp_path, mode):
    """A filter that keeps every row, or a row transform that returns it, gives the batches
    the loader gives without them: the same keys, dtypes and values, whatever the batch
    holds. Ragged columns stay values + `.offsets` when a batch's rows have equal lengths (a
    batch of one row), padded ones stay padded (`.lengths`, the pad value), a null list is an
    empty row (it was zeros as long as another row), `.validity` stays when no row of the
    batch is null, and a batch whose rows of a column are all null keeps that column's
    layout."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    n = 60
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({
        "id": pa.array(range(n), pa.int64()),
        "toks": pa.array([None if i % 4 == 1 else [i] * (3 + i % 2) for i in range(n)],
                         pa.list_(pa.int32())),
        "text": pa.array([None if i % 5 == 2 else "ab" for i in range(n)]),
        "boxes": pa.array([None if i % 3 == 0 else [[float(i)] * 2] for i in range(n)],
                          pa.list_(pa.list_(pa.float32()))),
        "x": pa.array([None if i % 6 == 5 else float(i) for i in range(n)], pa.float32()),
    }), tmp_path / "raw" / "a.parquet")
    ds = str(tmp_path / "ds")
    shardfeed.shard(str(tmp_path / "raw"), ds, row_group_rows=20)
    for batch_size, padded in ((1, {}), (5, {}), (5, dict(pad_to=4, pad_value=-1))):
        with shardfeed.Loader(ds, batch_size, seed=3, **padded) as loader:
            want = [{k: v.copy() for k, v in b.items()} for b in loader]
        for step in (dict(filter=keep_all), dict(row_transform=same_row)):
            with shardfeed.Loader(ds, batch_size, seed=3, **padded, **step, **mode) as loader:
                got = list(loader)
            assert len(got) == len(want) == n // batch_size
            for k, (g, w) in enumerate(zip(got, want)):
                assert sorted(g) == sorted(w), (batch_size, step, k)
                for key in w:
                    assert g[key].dtype == w[key].dtype, (batch_size, step, k, key)
                    assert np.array_equal(g[key], w[key]), (batch_size, step, k, key)


def row_draws(loader, batches=None) -> dict:
    """id -> the row transform's draw, over `batches` batches (all when None)."""
    out = {}
    for k, b in enumerate(loader):
        out.update(zip(b["id"].tolist(), b["y"].tolist()))
        if batches is not None and k + 1 == batches:
            break
    return out


@pytest.mark.parametrize("mode", [dict(transform_threads=2), dict(transform_processes=2)])
def test_a_rows_draws_follow_the_row_across_world_sizes_and_an_elastic_resume(dataset, mode):
    """Each row's generator is seeded from its origin (shard, row group, row): the same draw
    for a row at world size 1, 2 and 3, and after an elastic resume 2 -> 3."""
    with shardfeed.Loader(dataset, 50, seed=3, row_transform=jitter_row, **mode) as loader:
        whole = row_draws(loader)
    assert len(whole) == ROWS - ROWS % 50 and len(set(whole.values())) > ROWS * 0.9
    seen, states = {}, []
    for rank in range(2):
        with shardfeed.Loader(dataset, 50, seed=3, rank=rank, world_size=2,
                              row_transform=jitter_row, **mode) as loader:
            seen.update(row_draws(loader, 7))
            states.append(loader.state_dict())
    for rank in range(3):
        with shardfeed.Loader(dataset, 50, seed=3, rank=rank, world_size=3,
                              row_transform=jitter_row, **mode) as loader:
            loader.load_state_dict(states)
            part = row_draws(loader)
            assert not set(part) & set(seen)
            seen.update(part)
    assert len(seen) > ROWS * 0.9
    assert all(whole[i] == y for i, y in seen.items() if i in whole)
    assert sum(i in whole for i in seen) > ROWS * 0.9
    assert shm_left() == []


def test_row_errors_name_the_row(dataset):
    def bad(row, rng):
        if int(row["id"]) == 777:
            raise KeyError("no such thing")
        return {"id": np.int64(row["id"])}

    with pytest.raises(shardfeed.ShardfeedError, match=r"batch \d+.*row_transform failed on row \d+.*no such thing"):
        for _ in shardfeed.Loader(dataset, 64, seed=1, row_transform=bad):
            pass


@pytest.mark.parametrize("mode", [dict(transform_threads=1), dict(transform_processes=1)])
def test_ctrl_c_interrupts_a_wait_on_the_transform(dataset, mode, tmp_path, ctrl_c):
    """SIGINT while the caller waits on a transform that does not finish: KeyboardInterrupt
    from next(), and the loader still closes cleanly."""
    import threading

    started = tmp_path / "started"
    release = tmp_path / "release"
    loader = shardfeed.Loader(dataset, 64, transform=BlockUntil(str(started), str(release)), **mode)
    it = iter(loader)

    def interrupt():
        while not started.exists():
            threading.Event().wait(0.005)
        # To this thread, not the main one: the main thread must notice it in its wait.
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    sender = threading.Thread(target=interrupt)
    sender.start()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    sender.join()
    release.touch()
    loader.close()
    assert shm_left() == []


class BlockUntil:
    """A transform that marks it started, then waits for a file (across processes)."""

    def __init__(self, started: str, release: str):
        self.started, self.release = started, release

    def __call__(self, batch, rng):
        import time

        Path(self.started).touch()
        while not Path(self.release).exists():
            time.sleep(0.005)
        return {"id": batch["id"].copy()}


@pytest.mark.parametrize("mode", [dict(transform_threads=2), dict(transform_processes=1)])
def test_outputs_land_in_the_slab_pool_while_one_is_spare(dataset, mode):
    """A transform's outputs are copied into a slab of the loader's pool (pinned when it is):
    arrays over a SlabView with the batch's index. A caller holding every batch of the epoch
    takes the spare slabs; later outputs stay as they are, counted; the epoch completes."""
    with shardfeed.Loader(dataset, 64, seed=3, transform=augment, byte_budget="16MiB", **mode) as loader:
        held = list(loader)  # every batch kept: no slab comes back
        stats = loader.stats()["transform"]
    assert len(held) == ROWS // 64
    assert stats["pinned_batches"] + stats["unpinned_batches"] == len(held)
    assert stats["pinned_batches"] >= 1
    pinned = [(i, b) for i, b in enumerate(held) if isinstance(b["y"].base, shardfeed.SlabView)]
    assert len(pinned) == stats["pinned_batches"]
    for i, b in pinned:
        assert b["y"].base.batch_index == i and isinstance(b["id"].base, shardfeed.SlabView)
    # Pinned or not, the values are the transform's.
    with shardfeed.Loader(dataset, 64, seed=3, transform=augment, transform_threads=1) as loader:
        assert same([{k: v.copy() for k, v in b.items()} for b in held], epoch(loader))


def test_arrays_handed_back_stay_in_their_slab(dataset):
    """An identity transform (or any column handed back as it came) copies nothing: the
    arrays delivered are the input batch's own views of its slab."""
    seen = []

    def identity(batch, rng):
        seen.append({k: v.__array_interface__["data"][0] for k, v in batch.items()})
        return batch

    with shardfeed.Loader(dataset, 64, seed=1, transform=identity, transform_threads=1) as loader:
        got, in_slab = [], True
        for b in loader:  # each batch dropped in turn, as a plain loader's
            got.append({k: v.__array_interface__["data"][0] for k, v in b.items()})
            in_slab &= all(isinstance(v.base, shardfeed.SlabView) for v in b.values())
        stats = loader.stats()["transform"]
    assert len(got) == ROWS // 64 and got == seen and in_slab
    assert stats["pinned_batches"] == len(got) and stats["unpinned_batches"] == 0


def widen(batch, rng):
    """Outputs of 128 KiB a batch: larger than the slabs of these batches of 64 rows (the
    smallest, 64 KiB), as float32 images made from uint8 pixels are 4x their input."""
    return {"id": batch["id"].copy(),
            "wide": np.repeat(batch["x"][:, None], 256, axis=1).astype(np.float64)}


def widen_in_place(batch, rng):
    """`widen`, writing its output where `shardfeed.transform.empty` placed it (the ids
    handed back as they came: no copy at all)."""
    wide = shardfeed.transform.empty((len(batch["x"]), 256), np.float64)
    wide[:] = batch["x"][:, None]
    return {"id": batch["id"], "wide": wide}


def test_outputs_larger_than_the_batches_land_in_larger_slabs(dataset):
    """Outputs larger than the pool's slabs go to slabs of a second pool sized to them,
    pinned as the pool is (every batch here: the caller drops each in turn)."""
    with shardfeed.Loader(dataset, 64, seed=3, transform=widen, transform_threads=2) as loader:
        got = []
        for b in loader:
            base = b["wide"].base
            assert isinstance(base, shardfeed.SlabView)
            assert base.slab_bytes >= b["wide"].nbytes > 64 << 10
            got.append((b["id"].copy(), base.batch_index))
            assert np.array_equal(b["wide"][:, 5], b["id"] % 97)
        stats = loader.stats()["transform"]
    assert stats["pinned_batches"] == len(got) == ROWS // 64
    assert [i for _, i in got] == list(range(len(got)))
    ids = np.concatenate([ids for ids, _ in got])
    assert len(np.unique(ids)) == len(ids) == len(got) * 64 and ids.max() < ROWS


@pytest.mark.parametrize("mode", [dict(transform_threads=1), dict(transform_threads=2),
                                  dict(transform_processes=1)])
def test_empty_places_an_output_where_it_is_delivered(dataset, mode):
    """`shardfeed.transform.empty` in a transform on the loader's threads gives an array in a
    spare slab: delivered with no copy (the address the function wrote is the caller's). In
    worker processes and outside a transform it is numpy.empty's; the values are the same."""
    written = {}

    def record(batch, rng):
        out = widen_in_place(batch, rng)
        written[int(batch["id"][0])] = out["wide"].__array_interface__["data"][0]
        return out

    fn = widen_in_place if "transform_processes" in mode else record
    with shardfeed.Loader(dataset, 64, seed=3, transform=fn, **mode) as loader:
        got = epoch(loader)
        addresses = []
        for b in loader:
            addresses.append((int(b["id"][0]), b["wide"].__array_interface__["data"][0]))
        stats = loader.stats()["transform"]
    with shardfeed.Loader(dataset, 64, seed=3, transform=widen, transform_threads=1) as loader:
        assert same(got, epoch(loader))
    assert stats["pinned_batches"] == 2 * (ROWS // 64)
    if "transform_threads" in mode:
        assert all(written[first] == address for first, address in addresses)
    plain = shardfeed.transform.empty((3, 2), np.int32)
    assert plain.shape == (3, 2) and plain.dtype == np.int32 and plain.base is None


def test_worker_processes_read_batches_where_they_lie(dataset, monkeypatch):
    """With transform_processes the workers map the loader's slabs and read each batch in place
    (no copy into shared memory); where they cannot, the batch is copied and the results are
    the same."""
    with shardfeed.Loader(dataset, 64, seed=3, transform=where_read, transform_threads=1) as loader:
        expected = [b["id"].copy() for b in loader]
    with shardfeed.Loader(dataset, 64, seed=3, transform=where_read,
                          transform_processes=2) as loader:
        got = epoch(loader)
    assert [b["id"].tolist() for b in got] == [ids.tolist() for ids in expected]
    assert all(b["in_place"][0] for b in got)
    monkeypatch.setenv("SHARDFEED_TEST_NO_SLAB_MAPS", "1")
    with shardfeed.Loader(dataset, 64, seed=3, transform=where_read,
                          transform_processes=2) as loader:
        got = epoch(loader)
        assert loader._runner.share is False
    assert [b["id"].tolist() for b in got] == [ids.tolist() for ids in expected]
    assert not any(b["in_place"][0] for b in got)
    assert shm_left() == []


def test_a_batch_generator_is_numpys_default_rng_of_its_words():
    from shardfeed.transform import generator

    r = np.random.default_rng(3)
    edges = [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
    for case in range(400):
        words = [int(w) for w in r.integers(0, 2**63, size=int(r.integers(0, 9)), dtype=np.uint64)]
        words = [edges[int(r.integers(0, len(edges)))] if r.random() < 0.3 else w for w in words]
        ours, numpys = generator(words), np.random.default_rng(words)
        assert (ours.integers(0, 2**62, 16) == numpys.integers(0, 2**62, 16)).all(), words
        # What is asked of the seed sequence beyond a PCG64's state is numpy's own.
        assert [g.random() for g in ours.spawn(3)] == [g.random() for g in numpys.spawn(3)]
        assert [g.random() for g in ours.spawn(2)] == [g.random() for g in numpys.spawn(2)]
        seq = ours.bit_generator.seed_seq
        assert (seq.generate_state(3) == np.random.SeedSequence(words).generate_state(3)).all()
        assert seq.entropy == np.random.SeedSequence(words).entropy
    # A generator a function keeps can be copied and pickled (to a worker, a checkpoint).
    import copy
    import pickle

    words = [7, 0, 0, 3, 0x5F7A]
    for again in (pickle.loads(pickle.dumps(generator(words))), copy.deepcopy(generator(words))):
        assert (again.integers(0, 2**62, 8) == np.random.default_rng(words).integers(0, 2**62, 8)).all()


def test_fast_functions_run_on_the_callers_thread_with_the_same_results(dataset, monkeypatch):
    import threading

    from shardfeed import transform as T

    ran_on = []

    def jitter(batch, rng):
        ran_on.append(threading.get_ident())
        return {"id": batch["id"], "noise": rng.random(len(batch["id"]))}

    def run(inline_s):
        monkeypatch.setattr(T._Threads, "INLINE_S", inline_s)
        ran_on.clear()
        with shardfeed.Loader(dataset, 32, seed=5, transform=jitter, transform_threads=2) as loader:
            out = [(b["id"].copy(), b["noise"].copy()) for b in loader]
        return out, list(ran_on)

    me = threading.get_ident()
    threaded, threads = run(0.0)  # never on the caller's thread
    inline, callers = run(3600.0)  # on it once a run has been timed
    assert me not in threads
    # The batches handed to the threads before the first run ended: at most the threads + 1.
    assert callers.count(me) >= len(callers) - 3 and callers[-1] == me
    assert len(threaded) == len(inline) > 2
    for (a_id, a_noise), (b_id, b_noise) in zip(threaded, inline):
        assert (a_id == b_id).all() and (a_noise == b_noise).all()
