"""PyTorch integration: an ``IterableDataset`` over a shardfeed dataset.

    from shardfeed.torch import IterableDataset
    ds = IterableDataset("s3://bucket/tokens", batch_size=256, pad_to=2048)
    dl = torch.utils.data.DataLoader(ds, batch_size=None)   # the loader batches
    for epoch in range(3):
        ds.set_epoch(epoch)
        for batch in dl:
            ids = batch["input_ids"].to("cuda", non_blocking=True)

Batches are ``dict[str, torch.Tensor]``, zero-copy views of the loader's slab
(page-locked when CUDA is present, so ``non_blocking=True`` copies are truly
asynchronous). Rank and world size come from ``torch.distributed`` when it is
initialized, else from the arguments or the RANK / WORLD_SIZE environment
variables. The loader is already multithreaded: use ``num_workers=0``. With
``num_workers > 0`` each worker process builds its own loader over a disjoint
part of the data (rank * num_workers + worker id of world_size * num_workers),
and batches are copied between processes.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

from . import Loader

__all__ = ["IterableDataset", "to_tensors"]


def to_tensors(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Wrap each numpy array of a batch as a tensor without copying."""
    return {name: torch.from_numpy(array) for name, array in batch.items()}


class IterableDataset(torch.utils.data.IterableDataset):
    """Yields whole batches as dicts of tensors; pass ``batch_size=None`` to DataLoader.

    ``loader_options`` are :class:`shardfeed.Loader`'s keyword arguments
    (``columns``, ``shuffle``, ``seed``, ``pad_to``, ``prefetch``, ...).
    """

    def __init__(
        self,
        url: str | dict[str, float],
        batch_size: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        epoch: int = 0,
        **loader_options: Any,
    ) -> None:
        super().__init__()
        self.url = url
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.epoch = epoch
        self.loader_options = loader_options
        self._loader: Loader | None = None
        self._key: tuple[int, int] | None = None
        self._state: dict[str, Any] | list[dict[str, Any]] | None = None

    def _placement(self) -> tuple[int | None, int | None, tuple[int, int]]:
        rank, world = self.rank, self.world_size
        if rank is None and world is None and dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        info = get_worker_info()
        if info is None or info.num_workers <= 1:
            return rank, world, (os.getpid(), 0)
        base_rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
        base_world = world if world is not None else int(os.environ.get("WORLD_SIZE", "1"))
        return (
            base_rank * info.num_workers + info.id,
            base_world * info.num_workers,
            (os.getpid(), info.id),
        )

    def loader(self) -> Loader:
        """The shardfeed loader of this process (and worker), built on first use."""
        rank, world, key = self._placement()
        if self._loader is None or self._key != key:
            self._loader = Loader(
                self.url,
                self.batch_size,
                epoch=self.epoch,
                rank=rank,
                world_size=world,
                **self.loader_options,
            )
            self._key = key
            if self._state is not None:
                self._loader.load_state_dict(self._state)
                self._state = None
        return self._loader

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning on the next iteration."""
        self.epoch = epoch
        self._state = None
        if self._loader is not None:
            self._loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where iteration is (``num_workers=0``); pass to ``load_state_dict`` to resume."""
        return self.loader().state_dict()

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Resume from ``state`` on the next iteration; a list of every rank's
        states of a job with another world size resumes elastically."""
        if self._loader is not None:
            self._loader.load_state_dict(state)
            self.epoch = self._loader.epoch
        else:
            self._state = state
            first = state[0] if isinstance(state, list) else state
            self.epoch = int(first["epoch"])

    def __len__(self) -> int:
        return len(self.loader())

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        loader = self.loader()
        for batch in loader:
            yield to_tensors(batch)
        self.epoch = loader.epoch

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes build their own loader; a Loader is not picklable.
        state = self.__dict__.copy()
        state["_loader"] = None
        state["_key"] = None
        return state
