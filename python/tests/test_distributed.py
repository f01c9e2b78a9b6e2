"""torch.distributed (gloo), 4 processes: exactly once per epoch, DDP without a hang."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from conftest import TOKENS_ROWS  # noqa: E402

WORLD = 4
BATCH = 32
EPOCHS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, url: str, port: int, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from shardfeed.torch import IterableDataset

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ds = IterableDataset(url, BATCH, seed=11, columns=["id", "label", "features"])
        record = {"len": len(ds), "epochs": []}
        for epoch in range(EPOCHS):
            ds.set_epoch(epoch)
            ids = []
            for batch in DataLoader(ds, batch_size=None):
                opt.zero_grad()
                pred = model(batch["features"]).squeeze(1)
                loss = torch.nn.functional.mse_loss(pred, batch["label"])
                loss.backward()  # all-reduce: a rank with fewer steps would hang the others
                opt.step()
                ids.append(batch["id"].tolist())
            record["epochs"].append(ids)
        dist.barrier()
        Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


def spawn(fn, nprocs: int, args: tuple) -> None:
    """Run `fn(rank, *args)` in `nprocs` processes; a job past 240 s hung."""
    ctx = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the DDP job hung")


def test_ddp_four_ranks_exactly_once(tokens_dataset, tmp_path):
    spawn(worker, WORLD, (tokens_dataset, free_port(), str(tmp_path)))
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    per_rank = TOKENS_ROWS // WORLD // BATCH
    for epoch in range(EPOCHS):
        counts = [len(r["epochs"][epoch]) for r in records]
        assert counts == [per_rank] * WORLD and all(r["len"] == per_rank for r in records)
        union = sorted(i for r in records for batch in r["epochs"][epoch] for i in batch)
        assert union == list(range(TOKENS_ROWS)), f"epoch {epoch}: not exactly once"
    assert records[0]["epochs"][0] != records[0]["epochs"][1]


# A packed mixture under DDP, checkpointed on 4 ranks and resumed on 2 (elastic).
L = 32
STEPS = 12


def packed_worker(rank: int, world: int, sources: dict, port: int, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from shardfeed.torch import IterableDataset

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        model = DistributedDataParallel(torch.nn.Embedding(400_000_000 // 10**6 + 1, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        # mix_stop="never": packed batch counts depend on tokens, so a DDP job trains by steps.
        ds = IterableDataset(sources, 2, pack_to=L, eos_id=-1, seed=5, threads=1,
                             mix_stop="never")
        saved = Path(out, "states.json")
        if saved.exists():
            ds.load_state_dict(json.loads(saved.read_text()))
        tokens = []
        for _, batch in zip(range(STEPS), DataLoader(ds, batch_size=None)):
            ids = batch["input_ids"]
            real = (batch["segment_ids"] != 0) & (ids != -1)
            tokens += ids[real].tolist()
            opt.zero_grad()
            loss = model((ids.clamp(min=0) // 10**6).long()).mean()
            loss.backward()  # all-reduce each step: a rank short of batches would hang
            opt.step()
        Path(out, f"phase{world}-rank{rank}.json").write_text(
            json.dumps({"tokens": tokens, "state": ds.state_dict()})
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_job(world: int, sources: dict, out: Path) -> None:
    spawn(packed_worker, world, (world, sources, free_port(), str(out)))


def test_ddp_packed_mixture_resumes_on_another_world_size(tmp_path):
    from test_mixture import source_table
    from conftest import make_dataset

    sources = {}
    for s, (docs, w) in enumerate([(300, 0.7), (200, 0.3)]):
        url = make_dataset(tmp_path / f"s{s}", source_table(s, docs), 2, row_group_rows=16,
                           shard_size="32KiB")
        sources[url] = w
    run_job(4, sources, tmp_path)
    first = [json.loads((tmp_path / f"phase4-rank{r}.json").read_text()) for r in range(4)]
    (tmp_path / "states.json").write_text(json.dumps([f["state"] for f in first]))
    run_job(2, sources, tmp_path)
    second = [json.loads((tmp_path / f"phase2-rank{r}.json").read_text()) for r in range(2)]
    tokens = [t for rec in first + second for t in rec["tokens"]]
    assert len(tokens) > 4 * STEPS * L  # both phases ran
    assert len(set(tokens)) == len(tokens), "a token was read twice across the resize"
