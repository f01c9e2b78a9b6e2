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


def test_ddp_four_ranks_exactly_once(tokens_dataset, tmp_path):
    ctx = mp.spawn(
        worker,
        args=(tokens_dataset, free_port(), str(tmp_path)),
        nprocs=WORLD,
        join=False,
    )
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the DDP job hung")
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    per_rank = TOKENS_ROWS // WORLD // BATCH
    for epoch in range(EPOCHS):
        counts = [len(r["epochs"][epoch]) for r in records]
        assert counts == [per_rank] * WORLD and all(r["len"] == per_rank for r in records)
        union = sorted(i for r in records for batch in r["epochs"][epoch] for i in batch)
        assert union == list(range(TOKENS_ROWS)), f"epoch {epoch}: not exactly once"
    assert records[0]["epochs"][0] != records[0]["epochs"][1]
