"""Mixtures, packing and their state from Python: `Loader({url: weight, ...}, pack_to=L)`,
`state_dict()` / `load_state_dict()` (in a new process, and with another world size),
`set_weights`, and refusals that name what changed.

Token `t` of document `d` of source `s` is `(s + 1) * 10**8 + d * 1000 + t`, so every check
reads the packed batches alone."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import shardfeed
from conftest import make_dataset

L = 64
SIZES = (600, 300, 120)


def doc_len(s: int, d: int) -> int:
    return (d * 7919 + s * 104729) % (3 * L) + 1


def source_table(s: int, docs: int) -> pa.Table:
    tokens = [
        [(s + 1) * 10**8 + d * 1000 + t for t in range(doc_len(s, d))] for d in range(docs)
    ]
    return pa.table(
        {
            "id": pa.array(np.arange(docs, dtype=np.int64)),
            "input_ids": pa.array(tokens, type=pa.list_(pa.int32())),
        }
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, float]:
    urls = []
    for s, n in enumerate(SIZES):
        root = tmp_path_factory.mktemp(f"source{s}")
        urls.append(make_dataset(root, source_table(s, n), 2, row_group_rows=16, shard_size="32KiB"))
    return dict(zip(urls, (0.6, 0.3, 0.1)))


def decode(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = tokens.astype(np.int64)
    return t // 10**8 - 1, t % 10**8 // 1000, t % 1000


def check(batch: dict[str, np.ndarray]) -> None:
    """The packed buffers agree with each other and with the tokens."""
    ids, pos, seg = batch["input_ids"], batch["position_ids"], batch["segment_ids"]
    cu, src = batch["cu_seqlens"], batch["source"]
    assert ids.dtype == np.int32 and ids.shape[1] == L and pos.shape == ids.shape
    assert cu[0] == 0 and cu[-1] == ids.size and len(src) == len(cu) - 1
    flat_ids, flat_pos, flat_seg = ids.reshape(-1), pos.reshape(-1), seg.reshape(-1)
    for k in range(len(cu) - 1):
        a, z = int(cu[k]), int(cu[k + 1])
        assert a // L == (z - 1) // L, "a segment stays in its row"
        if flat_seg[a] == 0:
            assert src[k] == -1
            continue
        s, _, t = decode(flat_ids[a:z][flat_ids[a:z] != -1])
        assert (s == src[k]).all()
        assert (t == flat_pos[a:z][: len(t)]).all()


def documents(batches) -> dict[tuple[int, int], list[int]]:
    docs: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b in batches:
        keep = (b["segment_ids"] != 0) & (b["input_ids"] != -1)
        s, d, t = decode(b["input_ids"][keep])
        for key, off in zip(zip(s.tolist(), d.tolist()), t.tolist()):
            docs[key].append(off)
    return docs


def loader(sources, **options):
    base = dict(batch_size=4, pack_to=L, eos_id=-1, seed=3, threads=2, drop_last=False)
    base.update(options)
    return shardfeed.Loader(sources, **base)


def test_packed_mixture_has_every_token_of_every_document_once(sources):
    m = loader(sources, mix_stop="all_exhausted")
    batches = [{k: v.copy() for k, v in b.items()} for b in m]
    for b in batches:
        check(b)
    docs = documents(batches)
    for (s, d), offsets in docs.items():
        # all_exhausted repeats the smaller sources: a whole number of copies.
        n = doc_len(s, d)
        assert sorted(offsets) == sorted(list(range(n)) * (len(offsets) // n)), (s, d)
    for s, n in enumerate(SIZES):
        assert all((s, d) in docs for d in range(n)), f"source {s} was not read to its end"
    stats = m.stats()
    assert stats["tokens"] == sum(b["input_ids"].size for b in batches)
    with pytest.raises(TypeError):
        len(m)  # packed: the epoch's length depends on the tokens


def digest(batches) -> list[str]:
    return [
        hashlib.sha256(b"".join(np.ascontiguousarray(b[k]).tobytes() for k in sorted(b))).hexdigest()
        for b in batches
    ]


RESUME = """
import json, sys, hashlib
import numpy as np
import shardfeed
sources, options, state, n = json.loads(sys.stdin.read())
m = shardfeed.Loader(sources, **options)
m.load_state_dict(state)
for _ in range(n):
    b = next(m)
    print(hashlib.sha256(b"".join(np.ascontiguousarray(b[k]).tobytes() for k in sorted(b))).hexdigest())
"""


@pytest.mark.parametrize("pack_mode", ["split", "fit"])
def test_resume_in_a_new_process_continues_exactly(sources, pack_mode):
    options = dict(batch_size=4, pack_to=L, eos_id=-1, seed=3, threads=2, mix_stop="never",
                   pack_mode=pack_mode, pack_window=40)
    reference = shardfeed.Loader(sources, **options)
    whole = digest(next(reference) for _ in range(30))
    first = shardfeed.Loader(sources, **options)
    head = digest(next(first) for _ in range(11))
    state = first.state_dict()
    assert len(json.dumps(state)) < 4096
    out = subprocess.run(
        [sys.executable, "-c", RESUME],
        input=json.dumps([sources, options, state, 19]),
        capture_output=True, text=True, check=True,
        cwd=Path(__file__).parent,
    )
    assert head + out.stdout.split() == whole


def test_elastic_resume_from_every_rank_state(sources):
    old, new = 2, 3
    seen = []
    states = []
    for rank in range(old):
        m = loader(sources, rank=rank, world_size=old)
        seen += [{k: v.copy() for k, v in next(m).items()} for _ in range(15)]
        states.append(m.state_dict())
    for rank in range(new):
        m = loader(sources, rank=rank, world_size=new)
        m.load_state_dict(states)
        seen += [{k: v.copy() for k, v in b.items()} for b in m]
    tokens = np.concatenate([b["input_ids"][(b["segment_ids"] != 0) & (b["input_ids"] != -1)]
                             for b in seen])
    assert len(np.unique(tokens)) == len(tokens), "a token was read twice"
    docs = documents(seen)
    partial = [k for k, v in docs.items() if len(v) != doc_len(*k)]
    assert len(partial) <= 2 * old, partial


def test_set_weights_and_refused_states_name_what_changed(sources, tmp_path):
    urls = list(sources)
    unpacked = shardfeed.Loader(sources, batch_size=50, seed=1, threads=2, mix_stop="never")
    first = next(unpacked)
    assert first["source"].dtype == np.int32 and set(first) >= {"id", "input_ids", "source"}
    unpacked.set_weights({urls[0]: 0.0, urls[1]: 1.0, urls[2]: 0.0})
    assert (next(unpacked)["source"] == 1).all()
    state = unpacked.state_dict()
    assert state["weights"] == [0.0, 1.0, 0.0]

    other = make_dataset(tmp_path, source_table(2, 50), 1, row_group_rows=16)
    changed = {urls[0]: 0.6, urls[1]: 0.3, other: 0.1}
    m = shardfeed.Loader(changed, batch_size=50, seed=1, threads=2, mix_stop="never")
    with pytest.raises(ValueError, match="source 2"):
        m.load_state_dict(state)
    m.load_state_dict(state, allow_changed=True)  # the changed source starts afresh
    reweighted = {urls[0]: 0.5, urls[1]: 0.4, urls[2]: 0.1}
    m = shardfeed.Loader(reweighted, batch_size=50, seed=1, threads=2, mix_stop="never")
    with pytest.raises(ValueError, match="weight 0.6 in the state but 0.5"):
        m.load_state_dict(state)


def test_a_state_saved_with_other_shuffle_windows_resumes_with_them_or_is_refused(sources):
    """A mixture's sources are read in the windows the state was saved with: a mixture whose
    windows were left to the byte budget is rebuilt with them (the same batches follow); one
    given other windows is refused, naming them (its order would differ)."""

    def mixture(**options):
        return shardfeed.Loader(sources, batch_size=20, seed=2, threads=2, mix_stop="never", **options)

    saved = mixture(window=2)
    for _ in range(5):
        next(saved)
    state = saved.state_dict()
    assert [s["window"] for s in state["sources"]] == [2, 2, 2]
    expected = [next(saved)["input_ids"].tolist() for _ in range(4)]

    chosen = mixture()  # windows left to the byte budget: the default's 8 shared by weight
    assert [s["window"] for s in chosen.state_dict()["sources"]] == [5, 2, 2]
    chosen.load_state_dict(state)
    assert [next(chosen)["input_ids"].tolist() for _ in range(4)] == expected
    assert [s["window"] for s in chosen.state_dict()["sources"]] == [2, 2, 2]

    with pytest.raises(ValueError, match="shuffle windows of 2 row groups when the state was saved but 3 here"):
        mixture(window=3).load_state_dict(state)

    # Each source's own window: a reweighted mixture (whose windows would be 4, 3, 2)
    # goes on with the saved 5, 2, 2, every unchanged source where it was.
    default = mixture()
    for _ in range(5):
        next(default)
    state = default.state_dict()
    reweighted = {url: w for url, w in zip(sources, (0.5, 0.35, 0.15))}
    m = shardfeed.Loader(reweighted, batch_size=20, seed=2, threads=2, mix_stop="never")
    assert [s["window"] for s in m.state_dict()["sources"]] == [4, 3, 2]
    m.load_state_dict(state, allow_changed=True)
    assert [s["window"] for s in m.state_dict()["sources"]] == [5, 2, 2]
    assert m.state_dict()["draw"]["sources"] == state["draw"]["sources"]

    # A state saved before windows were recorded was read in windows of 8.
    eight = mixture(window=8)
    for _ in range(5):
        next(eight)
    old = eight.state_dict()
    expected = [next(eight)["input_ids"].tolist() for _ in range(4)]
    for s in old["sources"]:
        del s["window"], s["part_rows"]
    chosen = mixture()
    chosen.load_state_dict(old)
    assert [next(chosen)["input_ids"].tolist() for _ in range(4)] == expected


def test_a_single_dataset_packs_and_torch_takes_mixtures(sources):
    url = next(iter(sources))
    single = shardfeed.Loader(url, batch_size=2, pack_to=L, drop_last=False, threads=2)
    batches = [{k: v.copy() for k, v in b.items()} for b in single]
    assert (np.concatenate([b["source"] for b in batches]) <= 0).all()
    docs = documents(batches)
    assert len(docs) == SIZES[0] and all(len(v) == doc_len(*k) for k, v in docs.items())

    torch = pytest.importorskip("torch")
    from shardfeed.torch import IterableDataset

    ds = IterableDataset(sources, batch_size=2, pack_to=L, threads=2, mix_stop="never")
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=None)))
    assert batch["input_ids"].shape == (2, L) and batch["input_ids"].dtype == torch.int32


JAX_EXAMPLE = """
import json, sys
import numpy as np
import jax
sys.path.insert(0, sys.argv[2])
from jax_pretrain import global_batches, step
import shardfeed
sources, length = json.loads(sys.argv[1])
batches = global_batches(sources, 4, length, eos_id=-1, threads=2, seed=1)
first = next(batches)
assert first["input_ids"].shape == (4 * jax.process_count(), length)
reference = shardfeed.Loader(sources, batch_size=4, pack_to=length, eos_id=-1, seed=1,
                             threads=2, mix_stop="never")
assert (np.asarray(first["input_ids"]) == next(reference)["input_ids"]).all()
assert int(step(next(batches))) > 0
print("ok")
"""


def test_the_jax_example_builds_global_batches(sources):
    # In a child: JAX's threads in this process would make later fork()s unsafe.
    pytest.importorskip("jax")
    examples = str(Path(__file__).parents[1] / "examples")
    out = subprocess.run(
        [sys.executable, "-c", JAX_EXAMPLE, json.dumps([sources, L]), examples],
        capture_output=True, text=True, cwd=Path(__file__).parent,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_mixtures_metrics_are_one_family_each_with_a_source_label(sources):
    parser = pytest.importorskip("prometheus_client.parser")
    m = loader(sources, mix_stop="never")
    for _ in range(5):
        next(m)
    families = list(parser.text_string_to_metric_families(m.metrics_text()))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "every family once"
    rows = next(f for f in families if f.name == "shardfeed_rows")
    assert sorted(s.labels["source"] for s in rows.samples) == ["0", "1", "2"]
    assert all(s.labels["rank"] == "0" for s in rows.samples)


def test_a_slow_mixture_warns_and_traces_each_source(sources, monkeypatch, caplog, tmp_path):
    import logging

    # Each row group's decode takes 20 ms longer (a failpoint): the trainer waits on decode.
    monkeypatch.setenv("SHARDFEED_FAILPOINTS", "decode=slow:20")
    caplog.set_level(logging.WARNING)
    trace = tmp_path / "run.json"
    m = loader(sources, threads=1, slow_warning=(0.05, 5), mix_stop="never", trace=str(trace))
    for _ in range(30):
        next(m)
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("shardfeed_loader")]
    assert any("waited for data" in w and "source 0: decode" in w for w in warnings), warnings
    m.close()
    # One trace file per source, beside the path given.
    for i in range(3):
        events = json.loads((tmp_path / f"run.source{i}.json").read_text())
        assert any(e.get("name") == "decode" for e in events)
